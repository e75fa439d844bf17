//! The handler path never allocates: a global allocator aborts the process if
//! it is called while the current thread is inside an osprey signal handler.
//! The profiler runs at a high rate over threads that allocate constantly,
//! with a priming-signal storm on top, while a library is loaded and
//! unloaded (unwind tables republished), with wall-time sampling on (running
//! threads' wall time recorded by their sampling handlers). A negative
//! control checks the guard.
//!
//! The guarded allocator is wrapped in `osprey::alloc::Sampling` and
//! allocation profiling samples every 4 KiB: the sampled-allocation path
//! (stack walk, storage, ring, live set; it marks the thread as in a
//! handler like the signal handlers do) aborts the test if it allocates.
//! The threads also call the interposers' entry (`Hooks::crossed`, what
//! the allocation library calls) with blocks of their own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::time::{Duration, Instant};

struct Guarded;

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        check();
        // SAFETY: the caller's GlobalAlloc contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        check();
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        check();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

fn check() {
    if osprey::internals::signal::in_handler() {
        let msg = b"FATAL: allocation inside an osprey signal handler\n";
        // SAFETY: write(2) of a static buffer, then abort.
        unsafe {
            libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
            libc::abort();
        }
    }
}

#[global_allocator]
static A: osprey::alloc::Sampling<Guarded> = osprey::alloc::Sampling::new(Guarded);

#[test]
fn handlers_never_allocate() {
    let dir = std::env::temp_dir().join(format!("osprey-noalloc-{}", std::process::id()));
    let p = osprey::Profiler::builder()
        .out_dir(&dir)
        .hz(5000)
        .wall(true)
        .wall_hz(1000)
        .alloc(true)
        .alloc_interval(4096)
        .start()
        .unwrap();
    let sampled_before = osprey::internals::alloc::ALLOC.sampled.load(std::sync::atomic::Ordering::Relaxed);
    let end = Instant::now() + Duration::from_secs(2);
    let hs: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                let mut v: Vec<Vec<u8>> = Vec::new();
                let mut n = 0u64;
                while Instant::now() < end {
                    v.push(vec![1u8; 64 + (n as usize % 512)]);
                    if n % 64 == 0 {
                        let block = v.last_mut().map_or(std::ptr::null_mut(), |b| b.as_mut_ptr());
                        // SAFETY: a live block of this thread's, freed later through `Sampling`.
                        unsafe { (osprey::internals::alloc::HOOKS.crossed)(block, 64) };
                    }
                    if v.len() > 1000 {
                        v.clear();
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let prime = osprey::internals::signal::STATE.prime_signal.load(std::sync::atomic::Ordering::Relaxed);
    let libz = c"libz.so.1";
    while Instant::now() < end {
        // Load and unload a library: the collector republishes the unwind
        // tables (and frees the old set) while handlers walk with them.
        // SAFETY: dlopen/dlclose of a plain C library with no constructors we rely on.
        unsafe {
            let h = libc::dlopen(libz.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if !h.is_null() {
                libc::dlclose(h);
            }
        }
        for t in osprey::internals::threads::list_threads().unwrap() {
            osprey::internals::signal::sys::tgkill(osprey::internals::signal::sys::getpid(), t, prime);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    for h in hs {
        assert!(h.join().unwrap() > 0);
    }
    let stats = osprey::internals::agent::stats();
    drop(p);
    assert!(stats.signals > 1000, "too few samples to mean anything: {stats:?}");
    assert!(stats.primed > 100, "too few priming signals: {stats:?}");
    let sampled = osprey::internals::alloc::ALLOC.sampled.load(std::sync::atomic::Ordering::Relaxed) - sampled_before;
    assert!(sampled > 1000, "too few sampled allocations to mean anything: {sampled}");
    // The CFI path is the one tested: walks through libc's frameless malloc
    // reach the threads' start.
    assert!(stats.cfi_walks * 10 >= stats.signals * 9, "CFI walks: {stats:?}");
    assert!(stats.cfi_complete * 2 >= stats.cfi_walks, "CFI walks that reach the thread start: {stats:?}");
    // The wall path of the handler ran: pending running time recorded.
    let wall = osprey::internals::signal::STATE.wall_records.load(std::sync::atomic::Ordering::Relaxed);
    assert!(wall > 100, "wall records pushed by handlers: {wall}");
}

/// The guard works: an allocation while marked in-handler aborts (checked in a forked child).
#[test]
fn guard_catches_allocation_in_handler() {
    let reg = osprey::internals::registry::Registry::get_or_init(Default::default()).unwrap();
    // SAFETY: the child only sleeps and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let d = reg.handler_depth(osprey::internals::signal::sys::gettid()).unwrap();
        d.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let b = std::hint::black_box(Box::new([0u8; 64]));
        drop(b);
        // SAFETY: ends the forked child.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGABRT, "guard did not fire");
}

/// The termination handlers (SIGTERM, and a SIGIO the process sends itself,
/// both with the default disposition) do not allocate either: a copy of this
/// test binary samples allocating threads at 5 kHz and one of them gets the
/// signal, often inside `malloc` holding its arena's lock; the process must
/// die of that signal (the guard would make it SIGABRT) after writing its
/// last profile.
#[test]
fn termination_handler_never_allocates() {
    const CHILD: &str = "OSPREY_NOALLOC_TERM_CHILD";
    const SIGNAL: &str = "OSPREY_NOALLOC_TERM_SIGNAL";
    if let Some(dir) = std::env::var_os(CHILD) {
        let sig: libc::c_int = std::env::var(SIGNAL).unwrap().parse().unwrap();
        let _p = osprey::Profiler::builder().out_dir(&dir).hz(5000).period(Duration::from_secs(60)).start().unwrap();
        let worker_tid = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let tid = worker_tid.clone();
                std::thread::spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tid.store(unsafe { libc::gettid() }, std::sync::atomic::Ordering::Relaxed);
                    let mut v: Vec<Vec<u8>> = Vec::new();
                    loop {
                        // Above the thread cache's sizes: each call takes the arena lock.
                        v.push(Vec::<u8>::with_capacity(2048));
                        if v.len() > 1000 {
                            v.clear();
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        // To a thread that spends its time in malloc and free: the handler
        // then often runs where that thread holds its arena's lock.
        let tid = worker_tid.load(std::sync::atomic::Ordering::Relaxed);
        assert_ne!(tid, 0, "no worker started");
        // SAFETY: signalling a live thread of this very process.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) };
        std::thread::sleep(Duration::from_secs(30));
        drop(workers);
        unreachable!("signal {sig} did not end the process");
    }
    use std::os::unix::process::ExitStatusExt;
    for sig in [libc::SIGTERM, libc::SIGIO] {
        let dir = std::env::temp_dir().join(format!("osprey-noalloc-term-{}-{sig}", std::process::id()));
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "termination_handler_never_allocates", "--nocapture"])
            .env(CHILD, &dir)
            .env(SIGNAL, sig.to_string())
            .status()
            .unwrap();
        assert_eq!(st.signal(), Some(sig), "signal {sig}: {st:?}");
        let written =
            std::fs::read_dir(&dir).unwrap().flatten().any(|e| e.path().to_string_lossy().ends_with(".pb.gz"));
        assert!(written, "signal {sig}: no last profile in {}", dir.display());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
