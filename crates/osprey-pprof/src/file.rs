//! Profile files: naming, gzip, atomic publication.
//!
//! Invariants: a file named `osprey-<pid>-<UTC yyyymmddTHHMMSSZ>-<seq>.pb.gz`
//! is always complete (it is written under a dot-prefixed temporary name in
//! the same directory, synced, then renamed); `seq` comes from a process-wide
//! counter, so two writes in the same second get different names.

use flate2::write::GzEncoder;
use flate2::Compression;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static SEQ: AtomicU64 = AtomicU64::new(0);

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

/// Gzips `bytes` into a new profile file of `pid` in `dir` (created if missing).
pub fn publish(dir: &Path, pid: i32, bytes: &[u8]) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let name = file_name(pid, now, SEQ.fetch_add(1, Ordering::Relaxed));
    let (tmp, path) = (dir.join(format!(".{name}.tmp")), dir.join(&name));
    let result = write_gzip(&tmp, bytes).and_then(|()| fs::rename(&tmp, &path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

fn write_gzip(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut gz = GzEncoder::new(fs::File::create(path)?, Compression::default());
    gz.write_all(bytes)?;
    gz.finish()?.sync_all()
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
}
