//! Signals for a program osprey runs as its child (CPython under `osprey
//! exec`): SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to
//! osprey are passed on to the child, which decides what they mean; osprey
//! goes on sampling until the child exits, writes the last profile, and
//! exits with the child's status.
//!
//! A signal the kernel sent to the whole foreground process group (Ctrl-C,
//! Ctrl-\ at a terminal: `si_code == SI_KERNEL`) already reached the child,
//! which is in the same group: it is not sent a second time.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signals passed on.
pub const FORWARDED: [i32; 6] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2];

static CHILD: AtomicI32 = AtomicI32::new(0);

/// From now on, the [`FORWARDED`] signals osprey receives go to `child`.
pub fn to_child(child: i32) {
    CHILD.store(child, Ordering::SeqCst);
    for sig in FORWARDED {
        // SAFETY: installs a handler that only loads an atomic and calls kill(2),
        // both async-signal-safe; kill does not change errno on success, and
        // the handler saves and restores it anyway.
        unsafe {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, core::ptr::null_mut());
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    // SAFETY: errno of this thread, read and restored around kill(2); `info`
    // is the siginfo of this SA_SIGINFO handler.
    unsafe {
        let errno = *libc::__errno_location();
        let from_kernel = !info.is_null() && (*info).si_code == libc::SI_KERNEL;
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 && !from_kernel {
            libc::kill(child, sig);
        }
        *libc::__errno_location() = errno;
    }
}
