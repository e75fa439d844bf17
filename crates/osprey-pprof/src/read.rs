//! Reading pprof files back (ours or anyone's): gzip or raw protobuf.

use super::pprof::Profile;
use flate2::read::GzDecoder;
use prost::Message;
use std::io::{self, Read};
use std::path::Path;

/// Decodes the pprof file at `path`, gunzipping it if it starts with the gzip magic.
pub fn read_profile(path: &Path) -> io::Result<Profile> {
    decode(&std::fs::read(path)?)
}

/// Decodes pprof `bytes`, gzip-compressed or not.
pub fn decode(bytes: &[u8]) -> io::Result<Profile> {
    let raw;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(bytes).read_to_end(&mut out)?;
        raw = out;
        &raw[..]
    } else {
        bytes
    };
    Profile::decode(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
