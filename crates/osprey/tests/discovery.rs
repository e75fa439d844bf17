//! Discovery path: threads nobody announced are found and primed
//! within the stated latency — one made by libc's own `pthread_create`
//! looked up with `dlsym`, and one made by a raw `clone` that makes no libc
//! call at all.

use osprey::internals::record::Origin;
use osprey::internals::registry::Registry;
use osprey::internals::signal::sys;
use osprey_testkit::run::serial;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// Stated bound on how long a new thread runs unprimed: scan interval (10 ms)
/// plus signal delivery, with a wide margin for a loaded 2-core machine.
const LATENCY_BOUND: Duration = Duration::from_millis(250);

static STARTED_NS: AtomicU64 = AtomicU64::new(0);
static TID: AtomicI32 = AtomicI32::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

fn reset() {
    STARTED_NS.store(0, SeqCst);
    TID.store(0, SeqCst);
    STOP.store(false, SeqCst);
}

/// Waits for the thread in TID to be registered; returns how long it ran unprimed.
fn unprimed_for() -> Duration {
    let reg = Registry::get().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while TID.load(SeqCst) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_micros(200));
    }
    let tid = TID.load(SeqCst);
    assert_ne!(tid, 0, "thread never started");
    loop {
        if let Some((_, rec)) = reg.lookup(tid) {
            assert_eq!(rec.origin(), Some(Origin::Discovery));
            let ns = rec.registered_ns.load(Relaxed).saturating_sub(STARTED_NS.load(SeqCst));
            return Duration::from_nanos(ns);
        }
        assert!(Instant::now() < end, "thread {tid} was never primed");
        std::thread::sleep(Duration::from_micros(200));
    }
}

extern "C" fn pthread_body(_: *mut libc::c_void) -> *mut libc::c_void {
    STARTED_NS.store(sys::monotonic_ns(), SeqCst);
    TID.store(sys::gettid(), SeqCst);
    while !STOP.load(Relaxed) {
        std::hint::spin_loop();
    }
    std::ptr::null_mut()
}

type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
    *mut libc::c_void,
) -> libc::c_int;

#[test]
fn finds_thread_from_dlsym_pthread_create() {
    let _s = serial();
    reset();
    let dir = osprey_testkit::tempdir("out");
    let p = osprey::Profiler::builder().out_dir(&dir).start().unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        reset();
        // SAFETY: looks up the next pthread_create, which has this signature.
        let create: PthreadCreate = unsafe {
            let libc_handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            assert!(!libc_handle.is_null());
            let f = libc::dlsym(libc_handle, c"pthread_create".as_ptr());
            assert!(!f.is_null());
            std::mem::transmute::<*mut libc::c_void, PthreadCreate>(f)
        };
        let mut th: libc::pthread_t = 0;
        // SAFETY: valid out pointer and start routine.
        assert_eq!(unsafe { create(&mut th, std::ptr::null(), pthread_body, std::ptr::null_mut()) }, 0);
        let lat = unprimed_for();
        worst = worst.max(lat);
        STOP.store(true, SeqCst);
        // SAFETY: joins the thread created above.
        unsafe { libc::pthread_join(th, std::ptr::null_mut()) };
    }
    eprintln!("dlsym pthread_create: worst unprimed time {worst:?}");
    assert!(worst <= LATENCY_BOUND, "unprimed for {worst:?}");
    drop(p);
}

/// Body of the raw clone thread: no libc, only raw syscalls.
extern "C" fn clone_body(_: *mut libc::c_void) -> libc::c_int {
    STARTED_NS.store(raw_monotonic_ns(), SeqCst);
    TID.store(sys::gettid(), SeqCst);
    let mut x = 0u64;
    while !STOP.load(Relaxed) {
        x = std::hint::black_box(x.wrapping_add(1));
    }
    // SAFETY: plain libc calls on values owned by this test.
    unsafe {
        std::arch::asm!("syscall", in("rax") libc::SYS_exit, in("rdi") 0, options(noreturn));
    }
}

fn raw_monotonic_ns() -> u64 {
    let mut ts = [0i64; 2];
    let r: i64;
    // SAFETY: plain libc calls on values owned by this test.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") libc::SYS_clock_gettime => r,
            in("rdi") libc::CLOCK_MONOTONIC, in("rsi") ts.as_mut_ptr(), out("rcx") _, out("r11") _);
    }
    assert_eq!(r, 0);
    ts[0] as u64 * 1_000_000_000 + ts[1] as u64
}

#[test]
fn finds_raw_clone_thread() {
    let _s = serial();
    reset();
    let dir = osprey_testkit::tempdir("out");
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).start().unwrap();
    const STACK: usize = 1 << 20;
    let stack = osprey::internals::mmap::map_zeroed(STACK).unwrap();
    let flags = libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM;
    // SAFETY: the child runs `clone_body` on its own mapped stack and shares nothing it may free.
    let tid = unsafe { libc::clone(clone_body, stack.add(STACK) as *mut libc::c_void, flags, std::ptr::null_mut()) };
    assert!(tid > 0, "clone failed");
    let lat = unprimed_for();
    eprintln!("raw clone: unprimed for {lat:?}");
    // Let it be sampled for a while: the handler must cope with a thread without TLS.
    std::thread::sleep(Duration::from_millis(300));
    let reg = Registry::get().unwrap();
    let (_, rec) = reg.lookup(tid).expect("still registered");
    assert!(rec.stack_hi.load(Relaxed) > stack as usize, "stack bounds not learned");
    let samples = rec.samples.load(Relaxed);
    STOP.store(true, SeqCst);
    let task = format!("/proc/self/task/{tid}");
    let end = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&task).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(p);
    assert!(lat <= LATENCY_BOUND, "unprimed for {lat:?}");
    assert!(samples > 0, "raw clone thread was registered but never sampled");
}
