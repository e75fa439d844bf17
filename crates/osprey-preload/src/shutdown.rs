//! `abort` and `_exit`, interposed: the profile so far is written (waiting
//! at most `osprey::internals::shutdown::FLUSH_WAIT`, and for `_exit` the
//! backends' exit wait too, as `exit` does) before libc's own runs.
//! Nothing is done in a process the agent does not belong to (a `vfork`
//! child calling `_exit` shares our memory, and must not touch the agent).
//! libc's functions are looked up at load time, never in these paths.

use osprey::internals::shutdown::{flush_at_exit, flush_bounded};
use std::sync::atomic::{AtomicUsize, Ordering::*};

static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);
static REAL_ABORT: AtomicUsize = AtomicUsize::new(0);

/// Finds libc's `_exit` and `abort` (from the library constructor).
pub fn resolve() {
    // SAFETY: looking up the next definitions of two libc symbols.
    unsafe {
        REAL_EXIT.store(libc::dlsym(libc::RTLD_NEXT, c"_exit".as_ptr()) as usize, Release);
        REAL_ABORT.store(libc::dlsym(libc::RTLD_NEXT, c"abort".as_ptr()) as usize, Release);
    }
}

/// Interposed `_exit`: last profile (bounded, and delivered as at `exit`),
/// then libc's `_exit`.
///
/// # Safety
/// Same contract as libc's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: libc::c_int) -> ! {
    flush_at_exit();
    let f = REAL_EXIT.load(Acquire);
    if f != 0 {
        // SAFETY: `f` is libc's `_exit`.
        let f: extern "C" fn(libc::c_int) -> ! = unsafe { core::mem::transmute::<usize, _>(f) };
        f(status);
    }
    loop {
        // SAFETY: exit_group never returns.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// Interposed `abort`: last profile (bounded), then libc's `abort`.
///
/// # Safety
/// Same contract as libc's `abort`.
#[no_mangle]
pub unsafe extern "C" fn abort() -> ! {
    flush_bounded();
    let f = REAL_ABORT.load(Acquire);
    if f != 0 {
        // SAFETY: `f` is libc's `abort`.
        let f: extern "C" fn() -> ! = unsafe { core::mem::transmute::<usize, _>(f) };
        f();
    }
    loop {
        // SAFETY: raising SIGABRT with its default action, as abort does.
        unsafe {
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            libc::raise(libc::SIGABRT);
        }
    }
}
