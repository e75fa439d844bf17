//! Exact CPU clocks of another process's threads: a perf `task-clock`
//! counter per thread, up to date when read (the kernel's other CPU clocks
//! lag up to a scheduler tick; see docs/design/python-walk.md, "CPU
//! charges").

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter follows this thread's own CPU clock.
    #[test]
    fn follows_own_thread() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let Ok(c) = TaskClock::open(tid) else { return }; // perf unavailable here
        let cpu = || {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: valid out pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec * 1_000_000_000 + ts.tv_nsec
        };
        let (a, cpu_a) = (c.read().unwrap(), cpu());
        while cpu() - cpu_a < 20_000_000 {
            std::hint::black_box(0);
        }
        let b = c.read().unwrap();
        assert!(b - a >= 15_000_000, "{a} -> {b} over 20 ms of this thread's CPU time");
    }
}
