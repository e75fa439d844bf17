//! Raw Linux system calls, clocks and the errno guard.
//!
//! Everything here may be called from a signal handler: no allocation, no
//! locks, no panics, and no libc wrapper that can write `errno` (the raw
//! `syscall` instruction lives in `arch/`).

use super::arch::{raw_syscall0, raw_syscall3, raw_syscall4, timer_overrun};

/// `gettid(2)` without libc: safe on threads that have no valid TLS (raw `clone`).
#[inline(always)]
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { raw_syscall0(libc::SYS_gettid) as i32 }
}

/// `getpid(2)` without libc.
#[inline(always)]
pub fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { raw_syscall0(libc::SYS_getpid) as i32 }
}

/// `tgkill(2)`; returns 0 or a negative errno. Never touches `errno`.
#[inline]
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> i64 {
    // SAFETY: tgkill takes plain integers.
    unsafe { raw_syscall3(libc::SYS_tgkill, pid as usize, tid as usize, sig as usize) as i64 }
}

/// Dequeues up to `max` instances of signal `sig` pending for the calling
/// thread, which must block it (a handler does, for its own signal);
/// returns the clock periods they stand for (a timer's overruns included).
/// A sampling handler slower than the period finds the signals that came
/// meanwhile and folds them into its sample, instead of returning into the
/// next one: at any rate the thread keeps running between handlers, and a
/// perf clock's queue of signals cannot grow. Never touches `errno`.
#[inline(never)]
pub fn take_pending(sig: i32, max: u32) -> u64 {
    if !(1..=64).contains(&sig) {
        return 0;
    }
    let set: u64 = 1 << (sig - 1);
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let mut info = [0u64; 16]; // a siginfo_t, 128 bytes
    let mut periods = 0;
    for _ in 0..max {
        // SAFETY: rt_sigtimedwait(set, info, timeout, sizeof set) with
        // pointers to locals of the stated sizes; a zero timeout never waits.
        let r = unsafe {
            raw_syscall4(
                libc::SYS_rt_sigtimedwait,
                &set as *const u64 as usize,
                info.as_mut_ptr() as usize,
                &zero as *const libc::timespec as usize,
                8,
            )
        };
        if r != sig as usize {
            break;
        }
        // SAFETY: `info` was filled by the kernel as a siginfo_t.
        periods += 1 + u64::from(unsafe { timer_overrun(info.as_ptr().cast()) });
    }
    periods
}

/// `CLOCK_MONOTONIC` in nanoseconds (async-signal-safe per POSIX; vDSO, no errno on success).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; CLOCK_MONOTONIC always exists, so errno is never written.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; the clock always exists, so errno is never written.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME` in nanoseconds since the epoch.
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Saves `errno` on creation and restores it on drop. Every signal handler
/// entry point holds one.
pub struct ErrnoGuard(i32);

impl ErrnoGuard {
    #[inline(always)]
    /// Saves the calling thread's `errno`.
    pub fn save() -> Self {
        // SAFETY: __errno_location is async-signal-safe and always returns a valid pointer.
        ErrnoGuard(unsafe { *libc::__errno_location() })
    }
}

impl Drop for ErrnoGuard {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn raw_ids_match_libc() {
        // SAFETY: plain id queries.
        assert_eq!(super::gettid(), unsafe { libc::gettid() });
        // SAFETY: as above.
        assert_eq!(super::getpid(), unsafe { libc::getpid() });
    }
}
