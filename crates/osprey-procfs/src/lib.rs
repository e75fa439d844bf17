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
//! `read*` convenience functions allocate, for the buffer they return.

pub mod cgroup;
pub mod maps;
pub mod stat;

use std::path::PathBuf;

/// `/proc/<pid>` for `pid > 0`, `/proc/self` otherwise.
pub fn proc_dir(pid: i32) -> PathBuf {
    if pid > 0 {
        PathBuf::from(format!("/proc/{pid}"))
    } else {
        PathBuf::from("/proc/self")
    }
}
