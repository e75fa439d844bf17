//! [`Error`]: why a profile could not be read or summarized. Writing files
//! reports plain `std::io::Error`s.

use std::fmt;

/// Why a profile could not be read or summarized.
#[derive(Debug)]
pub enum Error {
    /// Reading or gunzipping a file failed.
    Io {
        /// The file, or what was being read.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The bytes are not a pprof protobuf.
    Decode {
        /// The file, or what was being decoded.
        what: String,
        /// The decoder's error.
        source: prost::DecodeError,
    },
    /// The bytes decode but do not make a profile (empty, inconsistent).
    Invalid {
        /// The file, or what was being decoded.
        what: String,
        /// What is wrong, in a few words.
        why: String,
    },
    /// Nothing to summarize.
    NoProfiles,
    /// The profile declares no sample type.
    NoSampleTypes,
    /// The sample type asked for is not in the profile.
    UnknownSampleType {
        /// The name or index asked for.
        asked: String,
        /// The profile's sample types.
        have: Vec<String>,
    },
    /// One of several merged profiles lacks the chosen sample type.
    MissingSampleType(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            Error::Decode { what, source } => write!(f, "{what}: not a pprof profile ({source})"),
            Error::Invalid { what, why } => write!(f, "{what}: {why}"),
            Error::NoProfiles => f.write_str("no profiles"),
            Error::NoSampleTypes => f.write_str("profile has no sample types"),
            Error::UnknownSampleType { asked, have } => write!(f, "no sample type {asked:?}; have {have:?}"),
            Error::MissingSampleType(t) => write!(f, "a profile lacks sample type {t:?}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Decode { source, .. } => Some(source),
            _ => None,
        }
    }
}
