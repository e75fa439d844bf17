//! [`Error`]: everything that can keep the agent from starting or answering.

use std::fmt;

/// Why the agent could not do what was asked. Profiling failures never reach
/// the profiled program as panics: the agent reports one of these and stays off.
#[derive(Debug)]
pub enum Error {
    /// A configuration value is malformed or out of range. `field` is the
    /// [`crate::Config`] field (`hz`, `period`, ...) or, for values read from
    /// the environment, the variable (`OSPREY_HZ`).
    Config {
        /// Which setting.
        field: &'static str,
        /// What is wrong with it, for a person.
        reason: String,
    },
    /// A system call or file operation failed.
    Io {
        /// What the agent was doing.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Every real-time signal already has a handler in this process.
    NoFreeSignal {
        /// `sampling` or `priming`.
        purpose: &'static str,
    },
    /// A profiler already runs in this process.
    AlreadyRunning,
    /// No profiler runs in this process.
    NotRunning,
}

impl Error {
    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Error {
        Error::Config { field, reason: reason.into() }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { what: what.into(), source }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { field, reason } => write!(f, "{field}: {reason}"),
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            Error::NoFreeSignal { purpose } => write!(f, "no free real-time signal for {purpose}"),
            Error::AlreadyRunning => f.write_str("a profiler is already running in this process"),
            Error::NotRunning => f.write_str("the profiler is not running"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
