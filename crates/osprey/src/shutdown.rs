//! The last profile when the process ends abruptly.
//!
//! - SIGINT, SIGTERM, SIGHUP whose disposition is the default when the agent
//!   starts: osprey installs `signal::shutdown::on_terminate`, which asks the
//!   collector thread for a profile, waits for it at most one second, then
//!   lets the signal kill the process as it would have (same exit status).
//!   A program that installs its own handler later simply replaces it, and
//!   the last profile is written at `exit` as usual; at stop, a disposition
//!   is only restored if it is still osprey's.
//! - `abort` and `_exit` (interposed by the preload library) call
//!   `crate::profiler::flush_bounded`.
//!
//! The collector serves the request itself (no thread of its own: a
//! process of a profiled tree pays for each thread it starts). It blocks
//! these signals (like every asynchronous signal, see
//! `crate::threads::spawn_bare`), so the handler never runs on the
//! thread it waits for.

use crate::fork_lock::ForkLock;
use crate::signal::shutdown::{futex_wake, on_sigio, on_terminate, FLUSH_WAIT_NS, SHUTDOWN};
use crate::signal::sys;
use std::sync::atomic::Ordering::*;
use std::time::Duration;

/// The termination signals osprey writes a last profile for.
pub const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// `requested` value once the agent stopped: nothing is asked any more.
const RETIRE: u32 = u32::MAX;

/// Dispositions replaced by osprey: (signal, previous).
static REPLACED: ForkLock<Vec<(i32, libc::sigaction)>> = ForkLock::new(Vec::new());

/// Installs the termination handler for each of [`SIGNALS`] whose
/// disposition is the default (never over the program's handler or SIG_IGN),
/// and makes this process's collector the one that serves its requests.
pub(crate) fn install() {
    let mut replaced = REPLACED.lock();
    // SIGIO over SIG_DFL: a perf clock's signal that found the queue full
    // arrives as SIGIO, which must not end the program (`on_sigio`).
    // SAFETY: querying then setting a disposition with valid structs.
    unsafe {
        let mut old: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(libc::SIGIO, core::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = on_sigio as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGIO, &sa, core::ptr::null_mut()) == 0 {
                replaced.push((libc::SIGIO, old));
            }
        }
    }
    for sig in SIGNALS {
        // SAFETY: querying then setting a disposition with valid structs.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = on_terminate as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            for s in SIGNALS {
                libc::sigaddset(&mut sa.sa_mask, s);
            }
            if libc::sigaction(sig, &sa, core::ptr::null_mut()) == 0 {
                replaced.push((sig, old));
            }
        }
    }
    drop(replaced);
    arm();
}

/// Makes this process's collector serve termination requests (also in a
/// forked child, whose collector is a new thread).
pub(crate) fn arm() {
    SHUTDOWN.requested.store(0, SeqCst);
    SHUTDOWN.done.store(0, SeqCst);
    SHUTDOWN.owner_pid.store(sys::getpid(), SeqCst);
}

/// The termination signal whose profile the collector owes, if any: asked
/// by the handler in this process, not yet written.
pub(crate) fn pending_request() -> Option<u32> {
    let sig = SHUTDOWN.requested.load(Acquire);
    let owed = sig != 0 && sig != RETIRE && SHUTDOWN.done.load(Acquire) == 0;
    (owed && SHUTDOWN.owner_pid.load(Acquire) == sys::getpid()).then_some(sig)
}

/// The profile a termination request asked for is written: the handler
/// waiting for it goes on.
pub(crate) fn request_served() {
    SHUTDOWN.done.store(1, Release);
    futex_wake(&SHUTDOWN.done);
}

/// At stop: the program's dispositions come back where osprey's handler is
/// still installed, and a handler still waiting goes on.
pub(crate) fn uninstall() {
    for (sig, previous) in REPLACED.lock().drain(..) {
        // SAFETY: querying, then restoring the saved disposition.
        unsafe {
            let mut cur: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut cur) == 0 && is_ours(cur.sa_sigaction) {
                libc::sigaction(sig, &previous, core::ptr::null_mut());
            }
        }
    }
    let _ = SHUTDOWN.requested.compare_exchange(0, RETIRE, SeqCst, SeqCst);
    SHUTDOWN.done.store(1, SeqCst);
    futex_wake(&SHUTDOWN.done);
}

/// How long the `abort`/`_exit` paths wait for the profile
/// (`crate::profiler::flush_bounded`).
pub const FLUSH_WAIT: Duration = Duration::from_nanos(FLUSH_WAIT_NS);

/// What the program is told about a disposition: osprey's termination and
/// SIGIO handlers are only ever installed over `SIG_DFL`, so where `handler` is one,
/// the program sees `SIG_DFL` (its view of its dispositions is unchanged).
/// Lock-free, async-signal-safe: `sigaction` may be called from handlers.
pub fn disguised(handler: usize) -> usize {
    if is_ours(handler) {
        libc::SIG_DFL
    } else {
        handler
    }
}

/// osprey's handlers that stand in for `SIG_DFL`.
fn is_ours(handler: usize) -> bool {
    handler == on_terminate as *const () as usize || handler == on_sigio as *const () as usize
}
