//! osprey's signal dispositions: choosing two free real-time signals,
//! installing the handlers of [`crate::signal`], and restoring what was there.
//! Agent side: reads `/proc`, allocates, sleeps.

/// A handler installed by osprey, with what it replaced.
pub struct Installed {
    pub signal: i32,
    previous: libc::sigaction,
    handler: usize,
}

/// Picks a real-time signal with no handler, starting the search at `SIGRTMIN + from`.
pub fn free_rt_signal(from: i32, skip: &[i32]) -> Option<i32> {
    let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    ((lo + from)..=hi).chain(lo..(lo + from).min(hi)).find(|&s| {
        if skip.contains(&s) {
            return false;
        }
        // SAFETY: querying a disposition with a null new action.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            libc::sigaction(s, core::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
        }
    })
}

/// Installs `handler` for `signal` (SA_SIGINFO | SA_RESTART; the signal,
/// and the termination signals of `signal::shutdown::HELD`, are blocked
/// while its handler runs).
pub(crate) fn install(
    signal: i32,
    handler: unsafe extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
) -> std::io::Result<Installed> {
    // SAFETY: plain sigaction with a valid handler.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        for s in crate::signal::shutdown::HELD {
            libc::sigaddset(&mut sa.sa_mask, s);
        }
        let mut previous: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(signal, &sa, &mut previous) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Installed { signal, previous, handler: handler as usize })
    }
}

impl Installed {
    /// Restores the previous disposition unless the signal is still pending
    /// somewhere in the process (restoring SIG_DFL then would kill the
    /// process: the default action of a real-time signal is to terminate).
    /// Returns whether it restored; if not, osprey's handler stays installed
    /// and does nothing once sampling is off.
    /// A disposition that is no longer osprey's (the program installed its
    /// own) is left alone.
    pub fn restore(&self) -> bool {
        if !is_ours(self.signal, self.handler) {
            return true;
        }
        for _ in 0..5 {
            if !signal_pending_anywhere(self.signal) {
                // SAFETY: restoring the disposition saved at install time.
                unsafe { libc::sigaction(self.signal, &self.previous, core::ptr::null_mut()) };
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        false
    }
}

/// Whether `signal` is pending for the process or any of its threads.
pub fn signal_pending_anywhere(signal: i32) -> bool {
    if !(1..=64).contains(&signal) {
        return false;
    }
    let bit = 1u64 << (signal - 1);
    let pending = |path: &std::path::Path| -> bool {
        osprey_procfs::read_file(path)
            .map(|s| {
                String::from_utf8_lossy(&s).lines().any(|l| {
                    (l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
                        && u64::from_str_radix(l[7..].trim(), 16).is_ok_and(|m| m & bit != 0)
                })
            })
            .unwrap_or(false)
    };
    let Ok(tids) = crate::threads::list_threads() else { return false };
    tids.iter().any(|t| pending(std::path::Path::new(&format!("/proc/self/task/{t}/status"))))
}

/// Whether `signal`'s handler is `handler`.
fn is_ours(signal: i32, handler: usize) -> bool {
    // SAFETY: querying a disposition with a null new action.
    unsafe {
        let mut cur: libc::sigaction = core::mem::zeroed();
        libc::sigaction(signal, core::ptr::null(), &mut cur) == 0 && cur.sa_sigaction == handler
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn nothing(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

    /// A termination signal arriving in an osprey handler would wait for a
    /// collector that waits for that handler's put: it is held back.
    #[test]
    fn handlers_hold_back_the_termination_signals() {
        let sig = libc::SIGRTMAX() - 3;
        let installed = install(sig, nothing).unwrap();
        // SAFETY: querying a disposition with a null new action.
        let mask = unsafe {
            let mut cur: libc::sigaction = core::mem::zeroed();
            assert_eq!(libc::sigaction(sig, core::ptr::null(), &mut cur), 0);
            cur.sa_mask
        };
        for s in crate::signal::shutdown::HELD {
            // SAFETY: a valid set and signal number.
            assert_eq!(unsafe { libc::sigismember(&mask, s) }, 1, "signal {s} not held back");
        }
        assert!(installed.restore());
    }
}
