//! The last profile when the process ends abruptly.
//!
//! - SIGINT, SIGTERM, SIGHUP whose disposition is the default when the agent
//!   starts: osprey installs `signal::shutdown::on_terminate`, which asks the
//!   shutdown thread for a profile, waits for it at most one second, then
//!   lets the signal kill the process as it would have (same exit status).
//!   A program that installs its own handler later simply replaces it, and
//!   the last profile is written at `exit` as usual; at stop, a disposition
//!   is only restored if it is still osprey's.
//! - `abort` and `_exit` (interposed by the preload library) call
//!   `crate::profiler::flush_bounded`.
//!
//! The shutdown thread and the collector block these signals (like every
//! asynchronous signal, see `crate::threads::spawn_internal`), so the
//! handler never runs on a thread it waits for.

use crate::signal::shutdown::{futex_wait, futex_wake, on_sigio, on_terminate, FLUSH_WAIT_NS, SHUTDOWN};
use crate::signal::sys;
use std::sync::atomic::Ordering::*;
use std::sync::Mutex;
use std::time::Duration;

/// The termination signals osprey writes a last profile for.
pub const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// `requested` value that tells the shutdown thread to exit without writing.
const RETIRE: u32 = u32::MAX;

/// Dispositions replaced by osprey: (signal, previous).
static REPLACED: Mutex<Vec<(i32, libc::sigaction)>> = Mutex::new(Vec::new());

/// Installs the termination handler for each of [`SIGNALS`] whose
/// disposition is the default (never over the program's handler or SIG_IGN),
/// and starts the shutdown thread, which calls `flush` when asked.
pub(crate) fn install(flush: fn()) -> std::io::Result<()> {
    let mut replaced = REPLACED.lock().unwrap_or_else(|e| e.into_inner());
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
    start_thread(flush)
}

/// Starts the shutdown thread of this process (also in a forked child).
pub(crate) fn start_thread(flush: fn()) -> std::io::Result<()> {
    SHUTDOWN.requested.store(0, SeqCst);
    SHUTDOWN.done.store(0, SeqCst);
    SHUTDOWN.owner_pid.store(sys::getpid(), SeqCst);
    crate::threads::spawn_internal("osprey-shutdown", move || loop {
        match SHUTDOWN.requested.load(Acquire) {
            0 => futex_wait(&SHUTDOWN.requested, 0, 0),
            RETIRE => return,
            _ => {
                flush();
                SHUTDOWN.done.store(1, Release);
                futex_wake(&SHUTDOWN.done);
                return;
            }
        }
    })?;
    Ok(())
}

/// At stop: the program's dispositions come back where osprey's handler is
/// still installed, and the shutdown thread exits.
pub(crate) fn uninstall() {
    for (sig, previous) in REPLACED.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        // SAFETY: querying, then restoring the saved disposition.
        unsafe {
            let mut cur: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut cur) == 0 && is_ours(cur.sa_sigaction) {
                libc::sigaction(sig, &previous, core::ptr::null_mut());
            }
        }
    }
    SHUTDOWN.done.store(1, SeqCst);
    if SHUTDOWN.requested.compare_exchange(0, RETIRE, SeqCst, SeqCst).is_ok() {
        futex_wake(&SHUTDOWN.requested);
    }
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
