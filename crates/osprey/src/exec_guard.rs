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
//! [`exec_failed`] restarts the thread's clock. Before the exec, the profile
//! so far is written (waiting at most `shutdown::FLUSH_WAIT`): the new image
//! starts with nothing of the old one.
//!
//! Only the process the agent runs in does this: in a `vfork` or raw `clone`
//! child (another pid) the calling task has no osprey clock and nothing
//! pending from osprey, so [`prepare`] does nothing there.

use crate::cpu_clock;
use crate::ownership::owns_process;
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
    if !owns_process() || !STATE.enabled.load(Acquire) {
        return ExecPrep::Nothing;
    }
    // Registered before signals are blocked here: registration takes a
    // blocked sampling signal for the thread's own choice (a thread that is
    // then never sampled, nor charged its remainder below).
    let registered = threads::register_current();
    let blocked = SignalBlock::all();
    // Paused, not closed: a record without a clock would be re-armed by discovery.
    let stopped = match registered {
        Some((_, rec)) if cpu_clock::set_running(rec, false) => ExecPrep::ClockStopped,
        _ => ExecPrep::Nothing,
    };
    blocked.discard_pending();
    // What the thread used since its last sample is this image's: charged
    // here, as at exit (the new image counts from its own start). After the
    // clock stopped and its pending sample went: nothing is charged twice.
    threads::charge_current_remainder();
    drop(blocked);
    // The image is about to be replaced: write what it sampled so far
    // (bounded, like the termination paths), or it would be lost.
    profiler::flush_within(crate::shutdown::FLUSH_WAIT);
    stopped
}

/// After an exec call that failed: the calling thread's clock runs again.
/// `errno` is left as the failed call set it.
pub fn exec_failed(prep: ExecPrep) {
    if prep != ExecPrep::ClockStopped || !owns_process() {
        return;
    }
    let _errno = sys::ErrnoGuard::save();
    let _blocked = SignalBlock::all();
    if let Some((_, rec)) = Registry::get().and_then(|r| r.lookup(sys::gettid())) {
        cpu_clock::set_running(rec, true);
    }
}
