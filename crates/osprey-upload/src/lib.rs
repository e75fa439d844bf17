//! osprey-upload: continuous delivery of osprey's profiles to Datadog,
//! Grafana Pyroscope and OTLP collectors.
//!
//! The caller (the agent's collector thread, the Python sampler's loop)
//! encodes each period's profile to pprof as it does for files, then
//! [`Uploader::submit`]s it: that never blocks. One thread per backend takes
//! profiles off a bounded queue, encodes them in the backend's wire format
//! and POSTs them, retrying on connection errors, 5xx and 429.
//!
//! | file | what |
//! |---|---|
//! | [`delivery`] | [`Delivery`]: file and/or upload of each period's profile, in one call |
//! | [`config`] | flags, `OSPREY_*` and ecosystem variables -> [`UploadConfig`] |
//! | [`queue`] | the bounded queue of one backend: oldest dropped and counted when full |
//! | [`worker`] | [`Uploader`]: the backend threads, retries, logging, shutdown |
//! | [`http`] | one POST with ureq (rustls, proxies from the environment) |
//! | [`datadog`] | `POST /profiling/v1/input` multipart |
//! | [`pyroscope`] | `POST /ingest?name=...&format=pprof` |
//! | [`otlp`] | pprof -> `ExportProfilesServiceRequest` (profiles v1development) |
//! | [`report`] | [`RunReport`]: what a process sampled and delivered, for the `osprey exec` that started it |
//! | [`deployment`] | [`Deployment`]: container id and Kubernetes pod of the profiled process, per backend |
//! | [`provenance`] | `code-provenance.json`: binaries and libraries, Python distributions |

pub mod config;
pub mod datadog;
pub mod delivery;
pub mod deployment;
mod error;
pub mod http;
pub mod otlp;
pub mod provenance;
pub mod pyroscope;
pub mod queue;
pub mod report;
pub mod worker;

pub use config::{Backend, Endpoint, Flags, UploadConfig};
pub use delivery::Delivery;
pub use deployment::Deployment;
pub use error::Error;
pub use report::RunReport;
pub use worker::{BackendStats, Spawner, Uploader};

/// The pprof label with a sample's wall-clock time (ns since the Unix
/// epoch), as Datadog names it; OTLP gets it as the sample's timestamp.
pub const TIMESTAMP_LABEL: &str = osprey_pprof::TIMESTAMP_LABEL;

/// What runs in the profiled process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// C, C++, Rust...: `family` "native".
    Native,
    /// CPython: `family` "python".
    Python,
}

impl Language {
    /// `native` or `python`.
    pub fn name(self) -> &'static str {
        match self {
            Language::Native => "native",
            Language::Python => "python",
        }
    }
}

/// Facts about the profiled process, fixed while it runs.
#[derive(Clone, Debug)]
pub struct Meta {
    /// One per process, also in the pprof comments (traces link to profiles by it).
    pub runtime_id: String,
    /// The profiled process.
    pub pid: i32,
    /// What it runs.
    pub language: Language,
    /// The machine's host name.
    pub host: String,
    /// Its container and Kubernetes pod, read from its `/proc` files.
    pub deployment: Deployment,
}

impl Meta {
    /// Facts of process `pid`, the host name and its deployment read now.
    pub fn new(runtime_id: impl Into<String>, pid: i32, language: Language) -> Meta {
        Meta { runtime_id: runtime_id.into(), pid, language, host: hostname(), deployment: Deployment::of(pid) }
    }

    /// For a process whose profiles only go to a spool that `osprey exec`
    /// merges: neither host nor deployment is read, the merge adds the
    /// tree's (no backend of its own needs them).
    pub fn in_spool(runtime_id: impl Into<String>, pid: i32, language: Language) -> Meta {
        Meta { runtime_id: runtime_id.into(), pid, language, host: String::new(), deployment: Deployment::default() }
    }
}

/// One period's profile, as submitted.
#[derive(Debug)]
pub struct Item {
    /// Encoded pprof `Profile`, not compressed.
    pub pprof: Vec<u8>,
    /// Wall-clock span covered, ns since the Unix epoch; `start` is the
    /// previous submitted profile's `end` (contiguous uploads).
    pub start_ns: i64,
    /// End of the span covered.
    pub end_ns: i64,
    /// 0, 1, 2... in submission order.
    pub seq: u64,
    /// The process it profiles, when not the uploader's own (one uploader
    /// for the processes of a tree, `Uploader::submit_for`).
    pub meta: Option<std::sync::Arc<Meta>>,
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A new random runtime id (UUID v4 text) from the kernel's random source.
pub fn new_runtime_id() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        b = (t ^ ((std::process::id() as u128) << 64)).to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// RFC 3339 UTC with nanoseconds: `2026-11-23T10:00:00.123456789Z`.
pub fn rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let s = osprey_pprof::file::utc_stamp(secs); // yyyymmddTHHMMSSZ
    format!("{}-{}-{}T{}:{}:{}.{frac:09}Z", &s[..4], &s[4..6], &s[6..8], &s[9..11], &s[11..13], &s[13..15])
}

/// Appends `comments` to an encoded profile's comments (the upload
/// counters of the previous periods, for instance).
pub fn add_comments(profile: &mut osprey_pprof::pprof::Profile, comments: &[String]) {
    for c in comments {
        let i = profile.string_table.len() as i64;
        profile.string_table.push(c.clone());
        profile.comment.push(i);
    }
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(bytes.len() / 4), flate2::Compression::fast());
    let _ = gz.write_all(bytes);
    gz.finish().unwrap_or_default()
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// The request that delivers `item` to `backend`.
pub(crate) fn encode_for(
    backend: Backend,
    endpoint: &Endpoint,
    item: &Item,
    s: &worker::Shared,
) -> Result<http::Request, Error> {
    let meta = item.meta.as_deref().unwrap_or(&s.meta);
    match backend {
        Backend::Datadog => {
            // The uploader's process's code (a tree's: its command's).
            let prov = s.provenance.get_or_init(|| provenance::code_provenance(s.meta.pid, s.meta.language));
            Ok(datadog::request(endpoint, item, &s.cfg, meta, prov))
        }
        Backend::Pyroscope => pyroscope::request(endpoint, item, &s.cfg, &meta.deployment),
        Backend::Otlp => otlp::request(endpoint, item, &s.cfg, meta),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(rfc3339(1_700_000_000_000_000_001), "2023-11-14T22:13:20.000000001Z");
        let id = new_runtime_id();
        assert_eq!(id.len(), 36);
        assert_ne!(id, new_runtime_id());
    }
}
