//! Stopping one thread of the target for a moment: `PTRACE_SEIZE` +
//! `PTRACE_INTERRUPT`, read what is needed, detach.
//!
//! The host comes first:
//! - a signal that arrives while the thread is being stopped (the stop is
//!   then a signal-delivery stop) is handed back at detach, never
//!   swallowed;
//! - waiting takes only this thread's stop (`WSTOPPED`, never `WEXITED`),
//!   so the exit of a process that is osprey's child (`osprey exec`) stays
//!   for its parent thread to reap; a traced thread that died while stopped
//!   is reaped here unless it is such a child's main thread, so it never
//!   lingers as a zombie holding up its process's exit;
//! - a thread that does not stop within [`STOP_TIMEOUT`] (in the kernel,
//!   uninterruptibly) is detached and skipped.

use std::io;
use std::mem::MaybeUninit;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a thread is waited for to stop.
pub const STOP_TIMEOUT: Duration = Duration::from_millis(200);

/// `(PTRACE_EVENT_STOP << 8) | SIGTRAP`: the `si_code` of a stop caused by
/// `PTRACE_INTERRUPT` (a signal-delivery stop has the signal's own code).
const INTERRUPT_CODE: i32 = (libc::PTRACE_EVENT_STOP << 8) | libc::SIGTRAP;

/// A thread stopped by [`Stopped::new`]; resumed (detached) on drop.
pub struct Stopped {
    tid: i32,
    /// Signal to hand back at detach (a signal-delivery stop).
    pending: i32,
    /// Leave an exit of this thread to its parent (it is the main thread of
    /// a child of this process).
    leave_exit: bool,
}

impl Stopped {
    /// Stops thread `tid`. `leave_exit`: see [`Stopped`]'s field.
    pub fn new(tid: i32, leave_exit: bool) -> io::Result<Stopped> {
        Stopped::seize_then(tid, leave_exit, || {})
    }

    /// [`Stopped::new`], running `between` after the seize and before the
    /// interrupt (where a signal may arrive: tests).
    fn seize_then(tid: i32, leave_exit: bool, between: impl FnOnce()) -> io::Result<Stopped> {
        // SAFETY: ptrace on a thread id with no pointer arguments.
        if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut s = Stopped { tid, pending: 0, leave_exit };
        between();
        // SAFETY: as above.
        if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) } != 0 {
            return Err(io::Error::last_os_error());
        }
        s.wait_stop()?;
        // A signal-delivery stop is told from the interrupt's by its siginfo
        // (a group stop has none: nothing to hand back).
        let mut si = MaybeUninit::<libc::siginfo_t>::zeroed();
        // SAFETY: `si` is a siginfo_t buffer the kernel fills.
        if unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, si.as_mut_ptr()) } == 0 {
            // SAFETY: filled by the successful call.
            let si = unsafe { si.assume_init() };
            if si.si_code != INTERRUPT_CODE {
                s.pending = si.si_signo;
            }
        }
        Ok(s)
    }

    fn wait_stop(&self) -> io::Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        // WSTOPPED only: an exit is never consumed here (see the module docs).
        while poll(self.tid, libc::WSTOPPED)?.is_none() {
            if start.elapsed() > STOP_TIMEOUT {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "thread did not stop"));
            }
            // A running thread stops within microseconds: yield first, then sleep.
            spins += 1;
            if spins < 50 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        Ok(())
    }

    /// The stopped thread's registers.
    pub fn regs(&self) -> io::Result<libc::user_regs_struct> {
        // SAFETY: an owned register struct large enough for PTRACE_GETREGS.
        unsafe {
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            if libc::ptrace(libc::PTRACE_GETREGS, self.tid, 0usize, &mut regs as *mut _ as usize) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(regs)
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !finish(self.tid, self.pending, self.leave_exit) {
            LINGERING.lock().unwrap_or_else(|p| p.into_inner()).push((self.tid, self.pending, self.leave_exit));
        }
    }
}

/// Threads seized but not yet detached: they had not stopped in time, or
/// died while traced and their exit was not yet reported. `(tid, signal to
/// hand back, leave_exit)`.
static LINGERING: Mutex<Vec<(i32, i32, bool)>> = Mutex::new(Vec::new());

/// Detaches what [`Stopped`] could not detach at once (called once per
/// sampling pass): a thread that stops later is detached then, a dead one
/// reaped.
pub fn settle() {
    let mut l = LINGERING.lock().unwrap_or_else(|p| p.into_inner());
    l.retain(|&(tid, sig, leave)| !finish(tid, sig, leave));
}

/// Ends the tracing of `tid`; false if it must be tried again later.
fn finish(tid: i32, sig: i32, leave_exit: bool) -> bool {
    let detach = || {
        // SAFETY: detaching our tracee, handing back a pending signal.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) == 0 }
    };
    if detach() {
        return true;
    }
    // Not stopped (yet), or dead. An exit is taken only when it is not a
    // child's to report to its parent.
    let exited = if leave_exit { 0 } else { libc::WEXITED };
    match poll(tid, libc::WSTOPPED | exited) {
        // ECHILD: no longer traced by this thread (gone, or released).
        Err(_) => true,
        Ok(None) => leave_exit && !super::process::process_alive(tid),
        Ok(Some(info)) => match info.si_code {
            libc::CLD_EXITED | libc::CLD_KILLED | libc::CLD_DUMPED => true,
            _ => detach(),
        },
    }
}

/// One `waitid` without blocking for this thread's own tracee `tid`
/// (`flags`: which events to take): the event, if one was waiting.
fn poll(tid: i32, flags: libc::c_int) -> io::Result<Option<libc::siginfo_t>> {
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    let flags = flags | libc::WNOHANG | libc::__WALL | libc::__WNOTHREAD;
    // SAFETY: a valid siginfo buffer for the kernel to fill.
    if unsafe { libc::waitid(libc::P_PID, tid as libc::id_t, info.as_mut_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-filled, or filled by waitid.
    let info = unsafe { info.assume_init() };
    // SAFETY: reading the pid of a (zeroed or filled) SIGCHLD siginfo.
    Ok((unsafe { info.si_pid() } == tid).then_some(info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static GOT: AtomicU32 = AtomicU32::new(0);

    extern "C" fn count(_: libc::c_int) {
        GOT.fetch_add(1, Ordering::SeqCst);
    }

    /// A signal the thread takes between the seize and the interrupt stops
    /// it as a signal-delivery stop: the signal is handed back at detach
    /// (the child's handler runs and it exits 0) instead of swallowed (it
    /// would spin until it gives up and exits 3).
    #[test]
    fn a_signal_arriving_during_the_stop_is_delivered() {
        // SAFETY: the child only calls async-signal-safe functions and spins.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: installing a handler that only touches an atomic; _exit.
            unsafe {
                libc::signal(libc::SIGUSR1, count as *const () as libc::sighandler_t);
                let start = libc::time(std::ptr::null_mut());
                while GOT.load(Ordering::SeqCst) == 0 {
                    if libc::time(std::ptr::null_mut()) - start > 5 {
                        libc::_exit(3);
                    }
                }
                libc::_exit(0);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        let stopped = Stopped::seize_then(child, true, || {
            // SAFETY: kill(2) on our child.
            unsafe { libc::kill(child, libc::SIGUSR1) };
            std::thread::sleep(Duration::from_millis(50));
        })
        .expect("stop the child");
        assert_eq!(stopped.pending, libc::SIGUSR1, "the stop was the signal's");
        drop(stopped);
        let mut status = 0;
        // SAFETY: waiting for our child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    }
}
