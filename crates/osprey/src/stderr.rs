//! osprey's one-line messages, on the file the program's stderr named when
//! the agent started.
//!
//! Programs close or reuse descriptor 2 (`xz` closes it before `exit`, where
//! the agent's last lines are written; daemons `dup2` a log file onto it).
//! So [`open`] keeps a copy of it (close-on-exec) at the top of the
//! descriptor table every process starts with ([`COPY_BASE`]), and [`say`]
//! writes a line only to a
//! descriptor that still names that file (same device and inode): the copy,
//! or descriptor 2 when the program closed the copy. Otherwise the line is
//! dropped: osprey never writes into a file the program opened.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};

/// The lowest number the copy of descriptor 2 takes: the last slot of the
/// table the kernel embeds in every process (64 descriptors). Higher, the
/// table grows (128 KiB at 16384 descriptors), and every `fork` of the
/// process copies it: a profiled shell pays that at each command it starts.
const COPY_BASE: i32 = 63;

/// The copy of descriptor 2, or -1.
static COPY: AtomicI32 = AtomicI32::new(-1);
/// `dev`, `ino` of the file descriptor 2 named at [`open`]; 0 before.
static DEV: AtomicU64 = AtomicU64::new(0);
static INO: AtomicU64 = AtomicU64::new(0);

/// Writes one line of osprey's (see [`say`](crate::internals::stderr::say)).
#[macro_export]
#[doc(hidden)]
macro_rules! say {
    ($($arg:tt)*) => { $crate::internals::stderr::say(format_args!($($arg)*)) };
}

/// Remembers the file descriptor 2 names now and keeps a copy of it.
/// Idempotent; a later call (a new agent after `fork`) keeps the copy.
pub fn open() {
    let Some((dev, ino)) = identity(2) else { return };
    if COPY.load(Acquire) >= 0 {
        return;
    }
    DEV.store(dev, Relaxed);
    INO.store(ino, Relaxed);
    // SAFETY: duplicating descriptor 2 into a new number of our own.
    let copy = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, COPY_BASE.min(crate::cpu_clock::high_fd_base())) };
    if copy >= 0 && COPY.compare_exchange(-1, copy, AcqRel, Acquire).is_err() {
        // SAFETY: the copy just made is ours.
        unsafe { libc::close(copy) };
    }
}

/// Writes one line (the text, then `\n`) where [`open`] found stderr.
pub fn say(args: std::fmt::Arguments<'_>) {
    let mut line = args.to_string();
    line.push('\n');
    let Some(fd) = target() else { return };
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing our own buffer to a descriptor naming the file we were given.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// The descriptor to write to, if one still names the remembered file.
fn target() -> Option<i32> {
    let want = (DEV.load(Relaxed), INO.load(Relaxed));
    if want == (0, 0) {
        return Some(2); // not opened: the program has not run yet
    }
    let copy = COPY.load(Acquire);
    [copy, 2].into_iter().find(|&fd| fd >= 0 && identity(fd) == Some(want))
}

fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat fills `st`; a closed descriptor gives EBADF.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_file_not_the_number() {
        // Run in a child: descriptor 2 of the test process stays as it is.
        let dir = std::env::temp_dir().join(format!("osprey-stderr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (log, data) = (dir.join("log"), dir.join("data"));
        let c = |p: &std::path::Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        let (log_c, data_c) = (c(&log), c(&data));
        // SAFETY: fork; the child makes descriptor calls and exits with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: plain descriptor calls in the child.
            unsafe {
                let l = libc::open(log_c.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
                libc::dup2(l, 2);
                libc::close(l);
                open();
                say(format_args!("first"));
                libc::close(2); // the program closes its stderr ...
                say(format_args!("after close"));
                // ... and opens a file of its own, which gets number 2.
                let d = libc::open(data_c.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
                let copy = COPY.load(Relaxed);
                libc::close(copy); // and closes the agent's copy (close_range)
                say(format_args!("after both"));
                libc::_exit(if d == 2 { 0 } else { 3 });
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(libc::WEXITSTATUS(status), 0);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "first\nafter close\n");
        assert_eq!(std::fs::read_to_string(&data).unwrap(), "", "a line went into the program's file");
        let _ = std::fs::remove_dir_all(dir);
    }
}
