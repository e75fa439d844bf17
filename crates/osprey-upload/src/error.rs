//! The crate's error type.

use std::fmt;
use std::path::PathBuf;

/// What can go wrong in osprey-upload. Each message is one line.
#[derive(Debug)]
pub enum Error {
    /// A flag or variable at fault (what [`UploadConfig::resolve`](crate::UploadConfig::resolve)
    /// rejects): one line naming it.
    Config(String),
    /// A profile handed for delivery does not decode as pprof.
    Decode(prost::DecodeError),
    /// A PEM file cannot be read.
    ReadPem(PathBuf, std::io::Error),
    /// A PEM file holds no certificate.
    NoCertificate(PathBuf),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => f.write_str(e),
            Error::Decode(e) => write!(f, "decoding the pprof: {e}"),
            Error::ReadPem(path, e) => write!(f, "cannot read {}: {e}", path.display()),
            Error::NoCertificate(path) => write!(f, "no PEM certificate in {}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(_) => None,
            Error::Decode(e) => Some(e),
            Error::ReadPem(_, e) => Some(e),
            Error::NoCertificate(_) => None,
        }
    }
}

impl From<prost::DecodeError> for Error {
    fn from(e: prost::DecodeError) -> Error {
        Error::Decode(e)
    }
}
