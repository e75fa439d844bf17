//! The one parser of each `/proc` file osprey reads, shared by every crate.
//!
//! - [`maps`]: lines of `/proc/PID/maps` as borrowed [`maps::Entry`]s (the
//!   path keeps interior spaces; `" (deleted)"` becomes a flag).
//! - [`stat`]: `/proc/PID/stat` and `/proc/PID/task/TID/stat` as a borrowed
//!   [`stat::Stat`] (the command name runs to the *last* `)`), with its
//!   fields numbered as in proc(5).
//! - [`cgroup`]: `/proc/PID/cgroup` as a [`cgroup::Placement`]: the
//!   container id and Kubernetes pod uid its paths name.
//!
//! Invariants: parsing borrows its input and never allocates or panics;
//! malformed input gives `None` (an iterator skips the line). Only the
//! `read*` convenience functions allocate, for the buffer they return
//! ([`read_file`]).

pub mod cgroup;
pub mod maps;
pub mod stat;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What `/proc` files are read with first: most fit (`maps` of a small
/// program, `environ`, `stat`, `cgroup`, `comm`).
const FIRST_READ: usize = 4096;

/// The contents of a `/proc` file. `/proc` files report size 0, so
/// `std::fs::read` (and `File::read_to_end`) would ask their size (`statx`,
/// `lseek`) and read from 32 bytes up, doubling; this reads [`FIRST_READ`]
/// bytes first: open, one or two reads, close.
///
/// The descriptor is a raw one, held for microseconds and closed without a
/// check: the profiled program may close every descriptor at any time
/// (`close_range`, daemonizing), and a `File` closed under it aborts a
/// debug build (std's check of the descriptor at drop).
pub fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let (mut buf, mut len) = (vec![0u8; FIRST_READ], 0);
    let read = loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        // SAFETY: writes at most the buffer's free length, at its free part.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n == 0 {
            break Ok(());
        } else if n > 0 {
            len += n as usize;
        } else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                break Err(e);
            }
        }
    };
    // SAFETY: the descriptor opened above; an error (closed meanwhile) is moot.
    unsafe { libc::close(fd) };
    read?;
    buf.truncate(len);
    Ok(buf)
}

/// `/proc/<pid>` for `pid > 0`, `/proc/self` otherwise.
pub fn proc_dir(pid: i32) -> PathBuf {
    if pid > 0 {
        PathBuf::from(format!("/proc/{pid}"))
    } else {
        PathBuf::from("/proc/self")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads as `std::fs::read` does, past the first buffer too.
    #[test]
    fn read_file_reads_whole_files() {
        for p in ["/proc/self/maps", "/proc/self/environ", "/proc/self/stat", "/proc/self/comm", "/proc/cpuinfo"] {
            // Files that change between two reads (`stat`'s times) keep their length class.
            if p.ends_with("stat") {
                let ours = read_file(Path::new(p)).unwrap();
                assert!(!ours.is_empty() && ours.ends_with(b"\n"));
                continue;
            }
            // `maps` changes as other tests map memory, `cpuinfo` with the
            // clock rates: equal in one of three pairs of reads.
            let pair = || (read_file(Path::new(p)).unwrap(), std::fs::read(p).unwrap());
            let pairs: Vec<_> = (0..3).map(|_| pair()).collect();
            assert!(pairs.iter().any(|(ours, theirs)| ours == theirs), "{p} read differently 3 times");
        }
        assert!(read_file(Path::new("/proc/self/no such file")).is_err());
        // Past the first read: a file of 2.5 times its size.
        let big = std::env::temp_dir().join(format!("osprey-procfs-read-{}", std::process::id()));
        let data: Vec<u8> = (0..FIRST_READ * 5 / 2).map(|i| i as u8).collect();
        std::fs::write(&big, &data).unwrap();
        let ours = read_file(&big);
        let _ = std::fs::remove_file(&big);
        assert_eq!(ours.unwrap(), data);
    }
}
