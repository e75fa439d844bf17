//! Making `execve` safe while sampling.
//!
//! A sampling or priming signal still pending when `execve` succeeds reaches
//! the new program, which has no handler for it: the default action of a
//! real-time signal kills it. [`prepare`] runs just before the real exec
//! call: it stops the calling thread's CPU clock, makes sure the thread is
//! registered (discovery never primes a registered thread), and takes every
//! pending osprey signal off the thread with signals blocked; then it puts
//! the program's signal mask back exactly as it was. Other threads' clocks
//! signal only their own threads, which `execve` ends. If the exec fails,
//! [`exec_failed`] restarts the thread's clock.
//!
//! Only the process the agent runs in does this: in a `vfork` or raw `clone`
//! child (another pid) the calling task has no osprey clock and nothing
//! pending from osprey, so [`prepare`] does nothing there.

use crate::cpu_clock;
use crate::profiler;
use crate::registry::Registry;
use crate::signal::{sys, STATE};
use crate::threads::{self, SignalBlock};
use std::sync::atomic::Ordering::*;

/// What [`prepare`] did, for [`exec_failed`] to undo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecPrep {
    /// Nothing to undo (no agent in this process, or sampling off).
    Nothing,
    /// The calling thread's CPU clock was paused.
    ClockStopped,
}

/// Before an exec call: no osprey signal can be pending on, or arrive at,
/// the calling thread once this returns. The signal mask is unchanged.
/// Not async-signal-safe (an exec from a signal handler of a profiled
/// program takes the same path as from anywhere else).
pub fn prepare() -> ExecPrep {
    if !profiler::owns_process() || !STATE.enabled.load(Acquire) {
        return ExecPrep::Nothing;
    }
    let blocked = SignalBlock::all();
    // Paused, not closed: a record without a clock would be re-armed by discovery.
    let stopped = match threads::register_current() {
        Some((_, rec)) if cpu_clock::set_running(rec, false) => ExecPrep::ClockStopped,
        _ => ExecPrep::Nothing,
    };
    drain_pending();
    drop(blocked);
    stopped
}

/// After an exec call that failed: the calling thread's clock runs again.
/// `errno` is left as the failed call set it.
pub fn exec_failed(prep: ExecPrep) {
    if prep != ExecPrep::ClockStopped || !profiler::owns_process() {
        return;
    }
    let _errno = sys::ErrnoGuard::save();
    let _blocked = SignalBlock::all();
    if let Some((_, rec)) = Registry::get().and_then(|r| r.lookup(sys::gettid())) {
        cpu_clock::set_running(rec, true);
    }
}

/// Accepts (and discards) every instance of osprey's signals pending on the
/// calling thread or the process; they must be blocked.
fn drain_pending() {
    let sigs = [STATE.sample_signal.load(Relaxed), STATE.prime_signal.load(Relaxed)];
    // SAFETY: sigset manipulation on a stack value, and sigtimedwait with a
    // zero timeout on signals the caller blocked: it returns at once.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in sigs.into_iter().filter(|&s| s > 0) {
            libc::sigaddset(&mut set, s);
        }
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // Real-time signals queue: one call takes one instance. Bounded in
        // case the kernel keeps one coming (it cannot: the clock is closed).
        for _ in 0..4096 {
            if libc::sigtimedwait(&set, core::ptr::null_mut(), &zero) < 0 {
                break;
            }
        }
    }
}
