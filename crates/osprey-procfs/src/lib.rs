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

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// What `/proc` files are read with first: most fit (`maps` of a small
/// program, `environ`, `stat`, `cgroup`, `comm`).
const FIRST_READ: usize = 4096;

/// The contents of a `/proc` file. `/proc` files report size 0, so
/// `std::fs::read` (and `File::read_to_end`) would ask their size (`statx`,
/// `lseek`) and read from 32 bytes up, doubling; this reads [`FIRST_READ`]
/// bytes first: open, one or two reads, close.
pub fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let (mut buf, mut len) = (vec![0u8; FIRST_READ], 0);
    loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
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
            let (ours, theirs) = (read_file(Path::new(p)).unwrap(), std::fs::read(p).unwrap());
            // Files that change between two reads (`stat`'s times) keep their length class.
            if p.ends_with("stat") {
                assert!(!ours.is_empty() && ours.ends_with(b"\n"));
            } else {
                assert_eq!(ours, theirs, "{p}");
            }
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
