//! CPU clocks of another process's threads, two per thread:
//! - [`TaskClock`], a perf `task-clock` counter, up to date when read (it
//!   tells whether the thread ran during a stack read), but it also counts
//!   time stolen from a virtual CPU while the thread was current;
//! - [`RunTime`], the scheduler's account (the thread's own CPU clock), which
//!   leaves steal out but lags a running thread by up to a tick.
//!
//! See docs/design/python-walk.md, "CPU charges".

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `perf_event_attr` flag bits.
const EXCLUDE_KERNEL: u64 = 1 << 5;
const EXCLUDE_HV: u64 = 1 << 6;
/// PERF_ATTR_SIZE_VER0: every kernel with perf accepts it.
const ATTR_SIZE: usize = 64;

/// A `task-clock` counter on one thread: nanoseconds on CPU since it was
/// opened. `exclude_kernel` only keeps the open within
/// `perf_event_paranoid` 2 for unprivileged users; a counting task-clock
/// still counts the thread's time in the kernel.
pub struct TaskClock {
    fd: OwnedFd,
}

impl TaskClock {
    pub fn open(tid: i32) -> io::Result<TaskClock> {
        let mut attr = [0u8; ATTR_SIZE];
        attr[0..4].copy_from_slice(&PERF_TYPE_SOFTWARE.to_ne_bytes());
        attr[4..8].copy_from_slice(&(ATTR_SIZE as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&PERF_COUNT_SW_TASK_CLOCK.to_ne_bytes());
        attr[40..48].copy_from_slice(&(EXCLUDE_KERNEL | EXCLUDE_HV).to_ne_bytes());
        // SAFETY: attr is a valid perf_event_attr of the size it declares.
        let fd =
            unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), tid, -1i32, -1i32, PERF_FLAG_FD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new fd that nothing else owns.
        Ok(TaskClock { fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
    }

    /// Nanoseconds the thread has been on a CPU since [`TaskClock::open`].
    pub fn read(&self) -> io::Result<u64> {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v`.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        if n != 8 {
            return Err(if n < 0 { io::Error::last_os_error() } else { io::ErrorKind::UnexpectedEof.into() });
        }
        Ok(v)
    }
}

/// A thread's CPU time as the scheduler accounts it: the first field of
/// `/proc/PID/task/TID/schedstat`, what the thread's CPU clock
/// (`CLOCK_THREAD_CPUTIME_ID`) reads inside the process. Per-thread CPU
/// totals come from it, so that steal time is not charged to the program.
pub struct RunTime {
    file: File,
}

impl RunTime {
    pub fn open(pid: i32, tid: i32) -> io::Result<RunTime> {
        Ok(RunTime { file: File::open(format!("/proc/{pid}/task/{tid}/schedstat"))? })
    }

    /// Nanoseconds the thread has run since it started, as of the scheduler's
    /// last update of it.
    pub fn read(&self) -> io::Result<u64> {
        let mut buf = [0u8; 80];
        let n = self.file.read_at(&mut buf, 0)?;
        let text = std::str::from_utf8(&buf[..n]).map_err(|_| io::ErrorKind::InvalidData)?;
        text.split_whitespace().next().and_then(|f| f.parse().ok()).ok_or_else(|| io::ErrorKind::InvalidData.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter follows this thread's own CPU clock.
    #[test]
    fn follows_own_thread() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let Ok(c) = TaskClock::open(tid) else { return }; // perf unavailable here
        let a = c.read().unwrap();
        osprey_testkit::run::burn_cpu(std::time::Duration::from_millis(20));
        let b = c.read().unwrap();
        assert!(b - a >= 15_000_000, "{a} -> {b} over 20 ms of this thread's CPU time");
    }

    /// The run time is the thread's own CPU clock, as of its last update
    /// (a `clock_gettime` of its own clock updates it).
    #[test]
    fn run_time_is_the_threads_cpu_clock() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let r = RunTime::open(std::process::id() as i32, tid).unwrap();
        osprey_testkit::run::burn_cpu(std::time::Duration::from_millis(20));
        let own = osprey_testkit::run::thread_cpu().as_nanos() as u64;
        let run = r.read().unwrap();
        assert!(run.abs_diff(own) < 5_000_000, "run time {run} ns, own clock {own} ns");
    }
}
