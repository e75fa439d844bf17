//! The crate's error type.

use std::fmt;
use std::io;

/// What went wrong opening or reading a sampler.
#[derive(Debug)]
pub enum Error {
    /// `perf_event_open` was refused for lack of privilege (`EACCES`,
    /// `EPERM`).
    Permission {
        /// The thread the event was for.
        tid: u32,
        /// `kernel.perf_event_paranoid` when it was refused, if readable.
        paranoid: Option<i32>,
        /// The refusal.
        source: io::Error,
    },
    /// The kernel has no such event (`ENOENT`, `EOPNOTSUPP`, `ENODEV`,
    /// `ENOSYS`: perf events not built in, or the software clock missing).
    Unsupported {
        /// The refusal.
        source: io::Error,
    },
    /// The thread does not exist (`ESRCH`): it exited, or never was.
    NoSuchThread {
        /// The thread asked for.
        tid: u32,
    },
    /// `/proc/<pid>/task` cannot be listed: no such process (or not
    /// visible from this PID namespace).
    NoSuchProcess {
        /// The process asked for.
        pid: u32,
    },
    /// The configuration cannot be used (the reason says which value).
    Config(&'static str),
    /// Any other failure of a system call.
    Io {
        /// What was being done (`perf_event_open`, `mmap`, ...).
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// The crate's `Result`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Classifies an error of `perf_event_open` for thread `tid`.
    pub(crate) fn open(tid: u32, source: io::Error) -> Error {
        match source.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => Error::Permission { tid, paranoid: crate::sys::paranoid(), source },
            Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV | libc::ENOSYS) => Error::Unsupported { source },
            Some(libc::ESRCH) => Error::NoSuchThread { tid },
            _ => Error::Io { what: "perf_event_open", source },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Permission { tid, paranoid, source } => {
                write!(f, "perf_event_open for thread {tid} refused ({source}): ")?;
                match paranoid {
                    Some(p) => write!(f, "kernel.perf_event_paranoid is {p}")?,
                    None => write!(f, "kernel.perf_event_paranoid could not be read")?,
                }
                write!(
                    f,
                    "; allow it with `sysctl kernel.perf_event_paranoid=1`, or run with CAP_PERFMON \
                     (and CAP_SYS_PTRACE for another user's process)"
                )
            }
            Error::Unsupported { source } => write!(
                f,
                "perf_event_open: this kernel has no per-thread software CPU clock event ({source}); \
                 is CONFIG_PERF_EVENTS set, or is perf_event_open filtered by seccomp?"
            ),
            Error::NoSuchThread { tid } => write!(f, "thread {tid} does not exist (it may have exited)"),
            Error::NoSuchProcess { pid } => write!(f, "process {pid} does not exist (no /proc/{pid}/task)"),
            Error::Config(why) => write!(f, "invalid sampler configuration: {why}"),
            Error::Io { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Permission { source, .. } | Error::Unsupported { source } | Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_setting_and_the_fix() {
        let e = Error::open(7, io::Error::from_raw_os_error(libc::EACCES));
        let text = e.to_string();
        assert!(matches!(e, Error::Permission { tid: 7, .. }), "{e:?}");
        assert!(text.contains("kernel.perf_event_paranoid is ") || text.contains("could not be read"), "{text}");
        assert!(text.contains("sysctl kernel.perf_event_paranoid=1") && text.contains("CAP_PERFMON"), "{text}");
        assert!(matches!(Error::open(7, io::Error::from_raw_os_error(libc::ESRCH)), Error::NoSuchThread { tid: 7 }));
        assert!(matches!(Error::open(7, io::Error::from_raw_os_error(libc::ENOENT)), Error::Unsupported { .. }));
    }
}
