//! The termination handler: SIGINT, SIGTERM or SIGHUP arriving while their
//! disposition was the default (osprey installs [`on_terminate`] only then).
//!
//! It asks for the profile so far (sets [`SHUTDOWN`]`.requested` and wakes
//! the agent's collector thread with a futex), waits for `done` at most
//! [`FLUSH_WAIT_NS`], puts back the default disposition and sends the signal
//! to its own thread again: the signal is blocked while the handler runs, so
//! it is delivered, and kills the process, as the handler returns. The exit
//! status is the one the program would have had without osprey.
//!
//! The thread it interrupts may hold a malloc arena's lock: the collector
//! serving the request takes no other thread's arena lock on purpose (no
//! `malloc_trim`). It can still share an arena with that thread when the
//! program has more threads than glibc has arenas; the wait's bound holds.
//!
//! In a process the agent does not belong to (a raw `clone` child) it does
//! not wait. Stack: a few words of locals, no frame array.

use super::handler::DepthGuard;
use super::sys::{self, ErrnoGuard};
use crate::registry::Registry;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering::*};

/// The signals whose handlers ([`on_terminate`], [`on_sigio`]) wait for the
/// collector: blocked while an osprey signal handler or the sampled-allocation
/// path runs. The collector's rotation waits for that thread's put in flight,
/// which cannot end under a handler that waits: the last profile would be
/// lost after the whole [`FLUSH_WAIT_NS`].
pub const HELD: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGIO];

/// How long the handler waits for the profile to be written.
pub const FLUSH_WAIT_NS: u64 = 1_000_000_000;

/// What the termination handler and the agent's collector thread share.
///
/// Invariant: `requested` goes from 0 to a signal number once per process
/// (the handler's CAS); `done` goes from 0 to 1 after the profile asked for
/// was written (or could not be). `wake` is bumped by whoever posts work
/// for the collector (this handler, flush and stop requests) before waking
/// it: the collector sleeps on it with the value it read before looking
/// for work, so no request is missed. All three are futex words.
pub struct ShutdownState {
    /// 0, or the signal that asked for the last profile.
    pub requested: AtomicU32,
    /// 1 once the profile asked for is written.
    pub done: AtomicU32,
    /// The process whose agent serves the request (0: none).
    pub owner_pid: AtomicI32,
    /// The collector's wake-up sequence (see above).
    pub wake: AtomicU32,
}

/// The process's one shutdown state.
pub static SHUTDOWN: ShutdownState = ShutdownState {
    requested: AtomicU32::new(0),
    done: AtomicU32::new(0),
    owner_pid: AtomicI32::new(0),
    wake: AtomicU32::new(0),
};

/// `futex(FUTEX_WAIT)` on `word` while it holds `expected`, for at most
/// `timeout_ns` (0: no limit). Returns on wake, timeout, signal or mismatch.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    let tsp = if timeout_ns == 0 { core::ptr::null() } else { &ts as *const libc::timespec };
    // SAFETY: futex on a valid, aligned u32 that lives for the process; the
    // raw system call wrapper may write errno, which every caller in a
    // handler saves and restores.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, tsp)
    };
}

/// `futex(FUTEX_WAKE)`: wakes every waiter on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
}

/// The termination handler (see the module documentation).
///
/// # Safety
/// Installed with `SA_SIGINFO` for SIGINT, SIGTERM or SIGHUP.
pub(crate) unsafe extern "C" fn on_terminate(sig: libc::c_int, _info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    let me = sys::gettid();
    let _depth = Registry::get().map(|reg| DepthGuard::enter(reg, me));
    let pid = sys::getpid();
    if SHUTDOWN.owner_pid.load(Acquire) == pid {
        if SHUTDOWN.requested.compare_exchange(0, sig as u32, AcqRel, Acquire).is_ok() {
            SHUTDOWN.wake.fetch_add(1, Release);
            futex_wake(&SHUTDOWN.wake);
        }
        let deadline = sys::monotonic_ns().saturating_add(FLUSH_WAIT_NS);
        while SHUTDOWN.done.load(Acquire) == 0 {
            let now = sys::monotonic_ns();
            if now >= deadline {
                break;
            }
            futex_wait(&SHUTDOWN.done, 0, deadline - now);
        }
    }
    // SAFETY: sigaction(2) is async-signal-safe; SIG_DFL with an empty mask.
    unsafe {
        let mut dfl: libc::sigaction = core::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, core::ptr::null_mut());
    }
    sys::tgkill(pid, me, sig);
}

/// SIGIOs taken by [`on_sigio`].
pub static SIGIO_DROPPED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// SIGIO, installed only over `SIG_DFL`: the kernel sends it in place of a
/// perf clock's real-time signal when the user's queue of pending signals is
/// full (heavy load at high rates), and its default action would kill the
/// program. That fallback comes from the kernel (`SI_KERNEL`) and is counted
/// and dropped (one atomic add: async-signal-safe). A SIGIO a process sent
/// (`kill`, `raise`, `sigqueue`) ends the program as `SIG_DFL` would, after
/// the last profile, through [`on_terminate`].
///
/// # Safety
/// Installed with `SA_SIGINFO` for SIGIO.
pub(crate) unsafe extern "C" fn on_sigio(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo.
    let code = if info.is_null() { libc::SI_KERNEL } else { unsafe { (*info).si_code } };
    if code != libc::SI_KERNEL {
        // SAFETY: the same contract, for the signal that arrived.
        return unsafe { on_terminate(sig, info, uc) };
    }
    SIGIO_DROPPED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
}
