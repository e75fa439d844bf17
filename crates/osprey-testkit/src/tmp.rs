//! Unique temporary names and directories.
//!
//! A name holds the test binary, the tag, the process id, a per-process
//! counter and the wall clock in nanoseconds: unique across the tests of one
//! binary running in parallel, across binaries, and across runs. The
//! directories are left in the system's temporary directory, as the tests
//! always did (a test that wants it removes its own).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The running test binary's name, without cargo's hash suffix.
fn binary_name() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe.as_deref().and_then(|e| e.file_stem()).map(|s| s.to_string_lossy().into_owned());
    let stem = stem.unwrap_or_else(|| "test".into());
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => stem,
    }
}

/// `osprey-<binary>-<tag>-<pid>-<seq>-<ns>`: a name no other call returns.
pub fn unique_name(tag: &str) -> String {
    let ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("osprey-{}-{tag}-{}-{}-{ns}", binary_name(), std::process::id(), SEQ.fetch_add(1, Relaxed))
}

/// A new, empty directory under the system's temporary directory, named
/// by [`unique_name`].
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(unique_name(tag));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    d
}
