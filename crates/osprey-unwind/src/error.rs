//! The crate's one error type (off the signal path only: the unwinder itself
//! never fails, it reports a truncated [`crate::Walk`]).

use std::fmt;
use std::path::PathBuf;

/// Why a module's unwind tables could not be built.
#[derive(Debug)]
pub enum Error {
    /// Reading the ELF file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The ELF file could not be parsed.
    Elf {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: object::read::Error,
    },
    /// The call frame information could not be parsed.
    Cfi {
        /// The file.
        path: PathBuf,
        /// The CFI parser's error.
        source: gimli::Error,
    },
    /// The module spans more than 4 GiB of addresses (table offsets are 32-bit).
    TooLarge {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Elf { path, source } => write!(f, "{}: ELF: {source}", path.display()),
            Error::Cfi { path, source } => write!(f, "{}: CFI: {source}", path.display()),
            Error::TooLarge { path } => write!(f, "{}: module spans more than 4 GiB", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Elf { source, .. } => Some(source),
            Error::Cfi { source, .. } => Some(source),
            Error::TooLarge { .. } => None,
        }
    }
}

/// A result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
