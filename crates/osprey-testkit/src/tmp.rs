//! Unique temporary names and directories.
//!
//! A name holds the test binary, the tag, the process id, a per-process
//! counter and the wall clock in nanoseconds: unique across the tests of one
//! binary running in parallel, across binaries, and across runs.
//!
//! A directory made by [`tempdir`] (or a path given to [`remove_at_exit`])
//! is removed when the test process exits, unless `OSPREY_KEEP_TMP=1`
//! keeps them to look at a failure.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, Once, TryLockError};
use std::time::{SystemTime, UNIX_EPOCH};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The paths to remove at exit, and the process that noted them.
static MADE: Mutex<(u32, Vec<PathBuf>)> = Mutex::new((0, Vec::new()));

/// Removes [`MADE`] at exit, in the process that made them only: a forked
/// child that calls `exit` must not take its parent's directories. A
/// thread still holding the lock at exit leaves them: exit never waits.
extern "C" fn remove_made() {
    let made = match MADE.try_lock() {
        Ok(made) => made,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return,
    };
    if made.0 != std::process::id() {
        return;
    }
    for p in &made.1 {
        // Neither call follows a symbolic link out of the path.
        let _ = match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
            _ => std::fs::remove_file(p),
        };
    }
}

/// Notes `d`, a file or directory, for removal when this process exits
/// (unless `OSPREY_KEEP_TMP=1`).
pub fn remove_at_exit(d: &std::path::Path) {
    static REGISTER: Once = Once::new();
    if std::env::var_os("OSPREY_KEEP_TMP").is_some_and(|v| v == "1") {
        return;
    }
    REGISTER.call_once(|| {
        // SAFETY: `remove_made` is an `extern "C" fn()` that does not unwind.
        unsafe { libc::atexit(remove_made) };
    });
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    made.0 = std::process::id();
    made.1.push(d.to_path_buf());
}

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
/// by [`unique_name`], removed when the process exits.
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(unique_name(tag));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    remove_at_exit(&d);
    d
}
