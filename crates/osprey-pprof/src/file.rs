//! Profile files: naming, gzip, atomic publication.
//!
//! Invariants: a file named `osprey-<pid>-<UTC yyyymmddTHHMMSSZ>-<seq>.pb.gz`
//! is always complete (it is written under a dot-prefixed temporary name in
//! the same directory, synced, then hard-linked
//! under its name); `seq` comes from a process-wide counter, so two writes
//! in the same second get different names, and an existing file is never
//! replaced (an `exec`ed image of the same pid counts from 0 again).

use flate2::write::GzEncoder;
use flate2::Compression;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static SEQ: AtomicU64 = AtomicU64::new(0);
/// Numbers the temporary files of one process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// File name for a profile of `pid` written at `unix_secs`, with sequence `seq`.
pub fn file_name(pid: i32, unix_secs: i64, seq: u64) -> String {
    format!("osprey-{pid}-{}-{seq}.pb.gz", utc_stamp(unix_secs))
}

/// `yyyymmddTHHMMSSZ` for seconds since the Unix epoch (proleptic Gregorian, UTC).
pub fn utc_stamp(unix_secs: i64) -> String {
    let (days, secs) = (unix_secs.div_euclid(86_400), unix_secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Days since 1970-01-01 -> (year, month, day), by 400-year eras.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `p` encoded and gzipped: the bytes of a `.pb.gz` file.
pub fn gzip_profile(p: &crate::pprof::Profile) -> io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&prost::Message::encode_to_vec(p))?;
    gz.finish()
}

/// Gzips `bytes` into a new profile file of `pid` in `dir` (created if missing).
pub fn publish(dir: &Path, pid: i32, bytes: &[u8]) -> io::Result<PathBuf> {
    Pending::create(dir)?.publish(pid, bytes)
}

/// A profile file being written: its hidden temporary file is created (and
/// the compressor set up) before the profile is encoded, so that a profiler
/// measuring its own CPU late counts that part of the cost too.
pub struct Pending {
    dir: PathBuf,
    tmp: PathBuf,
    gz: Option<GzEncoder<fs::File>>,
}

impl Pending {
    /// Creates `dir` if missing and a hidden temporary file in it.
    pub fn create(dir: &Path) -> io::Result<Pending> {
        fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".osprey-{}-{}.tmp", std::process::id(), TMP_SEQ.fetch_add(1, Ordering::Relaxed)));
        let gz = GzEncoder::new(fs::File::create(&tmp)?, Compression::default());
        Ok(Pending { dir: dir.to_path_buf(), tmp, gz: Some(gz) })
    }

    /// Writes `bytes` gzipped, syncs, and links the file under the name of
    /// a profile of `pid` written now.
    pub fn publish(mut self, pid: i32, bytes: &[u8]) -> io::Result<PathBuf> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let name = file_name(pid, now, SEQ.fetch_add(1, Ordering::Relaxed));
        let Some(mut gz) = self.gz.take() else { return Err(io::Error::other("profile file already published")) };
        gz.write_all(bytes)?;
        gz.finish()?.sync_all()?;
        link_unique(&self.tmp, &self.dir, pid, now, name)
    }
}

impl Drop for Pending {
    /// The temporary name goes, published or not.
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Publishes `tmp` under `name`, or under the next free sequence number:
/// a process that `exec`s starts its counter again at 0 under the same pid,
/// and a hard link (unlike a rename) never replaces an existing profile.
fn link_unique(tmp: &Path, dir: &Path, pid: i32, now: i64, mut name: String) -> io::Result<PathBuf> {
    loop {
        let path = dir.join(&name);
        match fs::hard_link(tmp, &path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                name = file_name(pid, now, SEQ.fetch_add(1, Ordering::Relaxed));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_utc() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_700_000_000), "20231114T221320Z");
        assert_eq!(file_name(42, 1_700_000_000, 3), "osprey-42-20231114T221320Z-3.pb.gz");
    }

    /// Files appear complete, under distinct names, with nothing else left
    /// in the directory (no temporary name), and are readable by others.
    #[test]
    fn publishes_whole_files_only() {
        use std::io::Read;
        let dir = std::env::temp_dir().join(format!("osprey-publish-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = publish(&dir, 7, b"first").unwrap();
        let b = publish(&dir, 7, b"second").unwrap();
        assert_ne!(a, b);
        let mut names: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        let mut want = vec![a.clone(), b];
        want.sort();
        assert_eq!(names, want);
        let mut text = String::new();
        flate2::read::GzDecoder::new(fs::File::open(&a).unwrap()).read_to_string(&mut text).unwrap();
        assert_eq!(text, "first");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&a).unwrap().permissions().mode() & 0o004, 0o004 & !umask_now());
        fs::remove_dir_all(&dir).unwrap();
    }

    fn umask_now() -> u32 {
        // SAFETY: umask only swaps the process's mask; it is put back at once.
        unsafe {
            let m = libc::umask(0o022);
            libc::umask(m);
            m as u32
        }
    }
}
