//! Reading pprof files back (ours or anyone's): gzip or raw protobuf,
//! refused with the reason when empty, truncated or not a consistent pprof
//! ([`check::validate`](crate::check::validate)).

use super::pprof::Profile;
use crate::Error;
use flate2::read::GzDecoder;
use prost::Message;
use std::io::Read;
use std::path::Path;

/// Largest profile file read (osprey's are kilobytes to a few MiB).
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// Largest decompressed profile accepted (a gzip stream can inflate a lot).
pub const MAX_INFLATED_BYTES: u64 = 1 << 30;

/// Decodes the pprof file at `path`, gunzipping it if it starts with the gzip magic.
pub fn read_profile(path: &Path) -> Result<Profile, Error> {
    let what = || path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|source| Error::Io { what: what(), source })?;
    if !meta.is_file() {
        let source = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
        return Err(Error::Io { what: what(), source });
    }
    if meta.len() > MAX_FILE_BYTES {
        let why = format!("{} bytes, more than a profile can be ({MAX_FILE_BYTES})", meta.len());
        return Err(Error::Io { what: what(), source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why) });
    }
    let bytes = std::fs::read(path).map_err(|source| Error::Io { what: what(), source })?;
    decode(&bytes).map_err(|e| match e {
        Error::Io { source, .. } => Error::Io { what: what(), source },
        Error::Decode { source, .. } => Error::Decode { what: what(), source },
        Error::Invalid { why, .. } => Error::Invalid { what: what(), why },
        e => e,
    })
}

/// Decodes pprof `bytes`, gzip-compressed or not, and checks that they make
/// a profile (an empty input does not).
pub fn decode(bytes: &[u8]) -> Result<Profile, Error> {
    let invalid = |why: String| Error::Invalid { what: "profile bytes".into(), why };
    if bytes.is_empty() {
        return Err(invalid("empty file".into()));
    }
    let raw;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(bytes)
            .take(MAX_INFLATED_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| invalid(format!("truncated or corrupt gzip stream ({e})")))?;
        if out.len() as u64 > MAX_INFLATED_BYTES {
            let why = format!("inflates past {MAX_INFLATED_BYTES} bytes");
            return Err(Error::Io {
                what: "gzip stream".into(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
            });
        }
        raw = out;
        &raw[..]
    } else {
        bytes
    };
    let p = Profile::decode(bytes).map_err(|source| Error::Decode { what: "profile bytes".into(), source })?;
    crate::check::validate(&p).map_err(|why| invalid(format!("not a pprof profile: {why}")))?;
    Ok(p)
}
