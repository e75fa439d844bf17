//! The crate's one error type.

use std::fmt;
use std::io;

/// Why a target could not be opened or sampled.
#[derive(Debug)]
pub enum Error {
    /// The process does not run CPython.
    NotCpython(String),
    /// A CPython version or build osprey cannot read.
    Unsupported(String),
    /// Not allowed to read the process (ptrace / `process_vm_readv` refused).
    Permission(String),
    /// No process with this pid (it may have exited).
    NoProcess(i32),
    /// Any other I/O error.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotCpython(m) => write!(f, "not a CPython process: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported Python: {m}"),
            Error::Permission(m) => write!(f, "permission denied: {m}"),
            Error::NoProcess(pid) => write!(f, "no process with pid {pid} (it may have exited)"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
