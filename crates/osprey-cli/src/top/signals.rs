//! `osprey top`'s signals: SIGINT, SIGTERM and SIGHUP end the view (the
//! terminal restored, a command waited for) instead of killing osprey. One
//! that a process sent to osprey alone (`kill`, a supervisor), not the
//! terminal to the whole foreground group, is passed on to the command by
//! [`relay`], so that it ends as it would have without osprey.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Set by the handler: the view stops.
static STOP: AtomicBool = AtomicBool::new(false);
/// The last signal a process sent to osprey, not yet relayed (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

const HANDLED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP.store(true, Ordering::SeqCst);
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    // SI_USER, SI_QUEUE, SI_TKILL are <= 0: sent by a process; SI_KERNEL (the
    // terminal, a hangup) is > 0 and reached the command's group as well.
    if !info.is_null() && unsafe { (*info).si_code } <= 0 {
        PENDING.store(sig, Ordering::SeqCst);
    }
}

/// Installs the handler (async-signal-safe: atomic stores only); returns
/// the flag it sets, which also stops the samplers.
pub fn install() -> &'static AtomicBool {
    for sig in HANDLED {
        // SAFETY: a zeroed sigaction with a valid SA_SIGINFO handler.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    &STOP
}

/// Sends `pid` the signal a process sent to osprey, if any.
pub fn relay(pid: i32) {
    let sig = PENDING.swap(0, Ordering::SeqCst);
    if sig != 0 {
        // SAFETY: plain kill of our own child (not yet reaped).
        unsafe { libc::kill(pid, sig) };
    }
}
