//! osprey's own threads (the collector, upload threads) never take a
//! signal meant for the program: a process-directed signal is handled on a
//! thread of the program even when its main thread blocks it, and osprey's
//! threads are never profiled as the program's.

use osprey::internals::signal::sys::gettid;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::*};
use std::time::Duration;

static HANDLED: AtomicUsize = AtomicUsize::new(0);
/// Tid of a thread that ran the handler and was not the expected one (0: none).
static WRONG: AtomicI32 = AtomicI32::new(0);
static EXPECTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    let me = gettid();
    if me != EXPECTED.load(SeqCst) {
        WRONG.store(me, SeqCst);
    }
    HANDLED.fetch_add(1, SeqCst);
}

fn set_usr1_mask(how: libc::c_int) {
    // SAFETY: sigset manipulation on stack values.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(how, &set, core::ptr::null_mut());
    }
}

/// In a forked child (one thread, as a program's main thread): the agent
/// starts, the main thread blocks SIGUSR1 and one program thread accepts it;
/// 300 `kill(getpid(), SIGUSR1)` are all handled on that thread. Before
/// osprey's threads blocked every asynchronous signal, the kernel handed some
/// of them to the collector or the shutdown thread (a shell's trap was lost
/// that way).
#[test]
fn process_directed_signals_reach_a_program_thread() {
    let dir = std::env::temp_dir().join(format!("osprey-own-threads-{}", std::process::id()));
    // SAFETY: the child runs its checks and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(|| {
            let p = osprey::Profiler::builder().out_dir(&dir).hz(100).start().unwrap();
            // SAFETY: installing a handler that only touches atomics.
            unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
            set_usr1_mask(libc::SIG_BLOCK);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            let t = std::thread::spawn(move || {
                set_usr1_mask(libc::SIG_UNBLOCK);
                EXPECTED.store(gettid(), SeqCst);
                while !s.load(SeqCst) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
            while EXPECTED.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            for i in 0..300 {
                // SAFETY: signalling our own process.
                unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
                while HANDLED.load(SeqCst) <= i {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            stop.store(true, SeqCst);
            t.join().unwrap();
            assert_eq!(WRONG.load(SeqCst), 0, "a SIGUSR1 was handled on a thread not of the program");
            // osprey's threads are its own: none is in the registry.
            let reg = osprey::internals::registry::Registry::get().unwrap();
            let mut names = vec![];
            reg.for_each_active(|_, r| {
                let tid = r.tid.load(Relaxed);
                names.push(osprey::internals::threads::thread_name(tid));
            });
            assert!(names.iter().all(|n| !n.starts_with("osprey-")), "registered: {names:?}");
            p.stop();
        });
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(if ok.is_ok() { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status:#x}");
}
