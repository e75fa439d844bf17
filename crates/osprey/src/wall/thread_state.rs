//! The thread state a wall sample carries ([`crate::record::SampleRecord::state`])
//! and its label text.
//!
//! Encoding (u16): 0 none (CPU samples), [`RUNNING`], [`SLEEPING`] (blocked
//! outside a known system call), or [`SYSCALL`]` | nr` for a thread waiting
//! in system call `nr`.

/// The thread was on a CPU or runnable (the value the sampling handler
/// writes, which may not import this module).
pub const RUNNING: u16 = crate::signal::WALL_RUNNING;
/// The thread was blocked, not in a system call osprey could name.
pub const SLEEPING: u16 = 2;
/// Flag: the low 15 bits are the number of the system call the thread waits in.
pub const SYSCALL: u16 = 0x8000;

/// The state of a thread waiting in system call `nr`.
pub fn in_syscall(nr: i64) -> u16 {
    match u16::try_from(nr) {
        Ok(n) if n < SYSCALL => SYSCALL | n,
        _ => SLEEPING,
    }
}

/// The `state` label of an encoded state: `running`, `sleeping`, or the
/// system call's name (`futex`, `read`, `epoll_wait`, `syscall 435` when
/// osprey has no name for it). `None` for 0.
pub fn label(state: u16) -> Option<String> {
    match state {
        0 => None,
        RUNNING => Some("running".into()),
        s if s & SYSCALL != 0 => {
            let nr = i64::from(s & !SYSCALL);
            Some(syscall_name(nr).map_or_else(|| format!("syscall {nr}"), str::to_string))
        }
        _ => Some("sleeping".into()),
    }
}

/// The name of x86_64 system call `nr`, for the calls threads wait in.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    NAMES.iter().find(|(n, _)| *n == nr).map(|(_, name)| *name)
}

const NAMES: &[(i64, &str)] = &[
    (libc::SYS_read, "read"),
    (libc::SYS_write, "write"),
    (libc::SYS_open, "open"),
    (libc::SYS_openat, "openat"),
    (libc::SYS_close, "close"),
    (libc::SYS_poll, "poll"),
    (libc::SYS_ppoll, "ppoll"),
    (libc::SYS_select, "select"),
    (libc::SYS_pselect6, "pselect6"),
    (libc::SYS_pread64, "pread64"),
    (libc::SYS_pwrite64, "pwrite64"),
    (libc::SYS_readv, "readv"),
    (libc::SYS_writev, "writev"),
    (libc::SYS_preadv, "preadv"),
    (libc::SYS_preadv2, "preadv2"),
    (libc::SYS_pwritev, "pwritev"),
    (libc::SYS_sched_yield, "sched_yield"),
    (libc::SYS_msync, "msync"),
    (libc::SYS_pause, "pause"),
    (libc::SYS_nanosleep, "nanosleep"),
    (libc::SYS_clock_nanosleep, "clock_nanosleep"),
    (libc::SYS_sendfile, "sendfile"),
    (libc::SYS_connect, "connect"),
    (libc::SYS_accept, "accept"),
    (libc::SYS_accept4, "accept4"),
    (libc::SYS_sendto, "sendto"),
    (libc::SYS_recvfrom, "recvfrom"),
    (libc::SYS_sendmsg, "sendmsg"),
    (libc::SYS_recvmsg, "recvmsg"),
    (libc::SYS_sendmmsg, "sendmmsg"),
    (libc::SYS_recvmmsg, "recvmmsg"),
    (libc::SYS_wait4, "wait4"),
    (libc::SYS_waitid, "waitid"),
    (libc::SYS_msgrcv, "msgrcv"),
    (libc::SYS_msgsnd, "msgsnd"),
    (libc::SYS_semop, "semop"),
    (libc::SYS_semtimedop, "semtimedop"),
    (libc::SYS_flock, "flock"),
    (libc::SYS_fcntl, "fcntl"),
    (libc::SYS_fsync, "fsync"),
    (libc::SYS_fdatasync, "fdatasync"),
    (libc::SYS_sync_file_range, "sync_file_range"),
    (libc::SYS_rt_sigsuspend, "rt_sigsuspend"),
    (libc::SYS_rt_sigtimedwait, "rt_sigtimedwait"),
    (libc::SYS_futex, "futex"),
    (libc::SYS_futex_waitv, "futex_waitv"),
    (libc::SYS_epoll_wait, "epoll_wait"),
    (libc::SYS_epoll_pwait, "epoll_pwait"),
    (libc::SYS_epoll_pwait2, "epoll_pwait2"),
    (libc::SYS_io_getevents, "io_getevents"),
    (333, "io_pgetevents"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_mq_timedreceive, "mq_timedreceive"),
    (libc::SYS_mq_timedsend, "mq_timedsend"),
    (libc::SYS_ioctl, "ioctl"),
    (libc::SYS_getrandom, "getrandom"),
    (libc::SYS_mmap, "mmap"),
    (libc::SYS_munmap, "munmap"),
    (libc::SYS_mprotect, "mprotect"),
    (libc::SYS_madvise, "madvise"),
    (libc::SYS_brk, "brk"),
    (libc::SYS_execve, "execve"),
    (libc::SYS_fork, "fork"),
    (libc::SYS_vfork, "vfork"),
    (libc::SYS_clone, "clone"),
    (libc::SYS_clone3, "clone3"),
    (libc::SYS_exit_group, "exit_group"),
    (libc::SYS_sigaltstack, "sigaltstack"),
    (libc::SYS_splice, "splice"),
    (libc::SYS_tee, "tee"),
    (libc::SYS_inotify_init1, "inotify_init1"),
    (libc::SYS_statx, "statx"),
    (libc::SYS_newfstatat, "newfstatat"),
    (libc::SYS_getdents64, "getdents64"),
    (libc::SYS_unlinkat, "unlinkat"),
    (libc::SYS_renameat2, "renameat2"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(label(0), None);
        assert_eq!(label(RUNNING).as_deref(), Some("running"));
        assert_eq!(label(SLEEPING).as_deref(), Some("sleeping"));
        assert_eq!(label(in_syscall(libc::SYS_futex)).as_deref(), Some("futex"));
        assert_eq!(label(in_syscall(libc::SYS_epoll_wait)).as_deref(), Some("epoll_wait"));
        assert_eq!(label(in_syscall(999)).as_deref(), Some("syscall 999"));
        assert_eq!(in_syscall(-1), SLEEPING);
    }
}
