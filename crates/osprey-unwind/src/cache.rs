//! Compiled tables kept on disk by build id, so that a process does not
//! compile again what another one already did. Compiling is most of what
//! starting the agent costs: a `sh` spends about 3 ms of its 4.9 ms on
//! libc's tables, and a shell script starts many `sh`.
//!
//! - Where: `$OSPREY_UNWIND_CACHE` (`off` disables the cache), else
//!   `$XDG_CACHE_HOME/osprey/unwind`, else `$HOME/.cache/osprey/unwind`. The
//!   directory is made mode 0700 and used only if it is a directory (not a
//!   symlink) owned by this user.
//! - Key: the module's GNU build id, and whether a separate debug file was
//!   found for it (its `.debug_frame` adds rows). A module without a build id
//!   is compiled each time.
//! - Files are written whole to a temporary name and renamed, so a reader
//!   sees a whole file or none; a file that does not check out (magic,
//!   lengths, checksum, every entry's rule in the palette, pages in order)
//!   is compiled again and replaced. The table lookups the handler makes
//!   are bounds-checked either way.
//! - Size: what the tables take in memory (about 0.9 MiB per MiB of
//!   `.eh_frame`: 133 KiB for libc), once per distinct library build.

use crate::compile::{compile_elf, debug_file_path, Compiled};
use crate::error::{Error, Result};
use crate::mapped::Mapped;
use crate::table::Table;
use object::Object;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File format: this magic (with its version), then little-endian fields.
const MAGIC: &[u8; 16] = b"osprey-unwind-v2";

/// A usable cache directory.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    /// The cache at its usual place (see the module docs), if it can be used.
    pub fn open_default() -> Option<Cache> {
        let var = |k| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let dir = match var("OSPREY_UNWIND_CACHE") {
            Some(d) if d.as_os_str() == "off" => return None,
            Some(d) => d,
            None => var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?.join("osprey/unwind"),
        };
        Cache::open(&dir)
    }

    /// The cache in `dir` (created mode 0700), if it is a directory of ours.
    pub fn open(dir: &Path) -> Option<Cache> {
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
        let m = std::fs::symlink_metadata(dir).ok()?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        (m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0).then(|| Cache { dir: dir.to_path_buf() })
    }

    /// [`crate::compile::compile_file`] through the cache.
    pub fn compile_file(&self, path: &Path, debug_root: Option<&Path>) -> Result<Compiled> {
        let data = Mapped::open(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let id = object::File::parse(data.bytes()).ok().and_then(|f| f.build_id().ok().flatten().map(<[u8]>::to_vec));
        let Some(id) = id else { return compile_elf(path, data.bytes(), debug_root) };
        let debug = debug_root.and_then(|r| debug_file_path(r, &id)).filter(|p| p.is_file());
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let file = self.dir.join(format!("{hex}{}.tbl", if debug.is_some() { "-d" } else { "" }));
        if let Some((table, largest_fde)) = std::fs::read(&file).ok().and_then(|b| decode(&b)) {
            return Ok(Compiled { table, build_id: Some(id), largest_fde, debug_file: debug, ..Compiled::default() });
        }
        let c = compile_elf(path, data.bytes(), debug_root)?;
        // Unique per process and call: two threads may write the same entry.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = file.with_extension(format!("{}-{seq}.tmp", std::process::id()));
        if std::fs::write(&tmp, encode(&c.table, c.largest_fde)).is_ok() && std::fs::rename(&tmp, &file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        Ok(c)
    }
}

/// FNV-1a over 8-byte words (the tail byte by byte): a damage check, not a
/// cryptographic one, at a word per multiply (tables reach 400 KiB and are
/// checked at every process start).
fn fnv(bytes: &[u8]) -> u64 {
    let step = |h: u64, v: u64| (h ^ v).wrapping_mul(0x0100_0000_01b3);
    let words = bytes.chunks_exact(8);
    let tail = words.remainder().iter().map(|&b| u64::from(b));
    words
        .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
        .chain(tail)
        .fold(0xcbf2_9ce4_8422_2325, step)
}

fn encode(t: &Table, largest_fde: Option<(u64, u64)>) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    let (lo, hi) = largest_fde.unwrap_or((0, 0));
    for v in [t.base, lo, hi] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for a in [&t.entries, &t.pages, &t.palette] {
        b.extend_from_slice(&(a.len() as u32).to_le_bytes());
    }
    for a in [&t.entries, &t.pages, &t.palette] {
        a.iter().for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
    }
    let sum = fnv(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// The table in `b`, if `b` is a whole, consistent file.
fn decode(b: &[u8]) -> Option<(Table, Option<(u64, u64)>)> {
    let (body, sum) = b.split_at_checked(b.len().checked_sub(8)?)?;
    if fnv(body) != u64::from_le_bytes(sum.try_into().ok()?) || body.get(..16)? != MAGIC {
        return None;
    }
    let mut at = 16;
    let mut take = |n: usize| {
        let s = body.get(at..at + n);
        at += n;
        s
    };
    let u64_at = |s: Option<&[u8]>| Some(u64::from_le_bytes(s?.try_into().ok()?));
    let (base, lo, hi) = (u64_at(take(8))?, u64_at(take(8))?, u64_at(take(8))?);
    let mut lens = [0usize; 3];
    for l in &mut lens {
        *l = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    }
    let mut arrays: Vec<Arc<[u32]>> = Vec::with_capacity(3);
    for l in lens {
        let raw = take(l.checked_mul(4)?)?;
        arrays.push(raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
    }
    if at != body.len() {
        return None;
    }
    let palette = arrays.pop()?;
    let pages = arrays.pop()?;
    let entries = arrays.pop()?;
    let ordered = pages.windows(2).all(|w| w[0] <= w[1]) && pages.last().is_none_or(|&p| p as usize <= entries.len());
    let in_palette = entries.iter().all(|&e| ((e & crate::table::INDEX_MASK) as usize) < palette.len());
    if !ordered || !in_palette {
        return None;
    }
    let fde = (hi > lo).then_some((lo, hi));
    Some((Table { base, entries, pages, palette }, fde))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("osprey-unwind-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// libc through the cache: compiled and stored the first time, read back
    /// the same the second time; a damaged file is compiled again.
    #[test]
    fn round_trip_and_damage() {
        let libc =
            crate::loaded::loaded().1.into_iter().find(|l| l.path.to_string_lossy().contains("libc.so")).unwrap();
        let d = dir("rt");
        let cache = Cache::open(&d).expect("cache dir");
        let first = cache.compile_file(&libc.path, None).unwrap();
        let stored: Vec<PathBuf> = std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()).collect();
        assert_eq!(stored.len(), 1, "{stored:?}");
        let again = cache.compile_file(&libc.path, None).unwrap();
        assert_eq!(first.eh_fdes > 0, again.eh_fdes == 0, "the second came from the file");
        assert_eq!(first.table.iter().collect::<Vec<_>>(), again.table.iter().collect::<Vec<_>>());
        assert_eq!(first.largest_fde, again.largest_fde);
        // Flip a byte in the middle: the checksum refuses it.
        let mut b = std::fs::read(&stored[0]).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x55;
        std::fs::write(&stored[0], &b).unwrap();
        assert!(decode(&b).is_none());
        let third = cache.compile_file(&libc.path, None).unwrap();
        assert!(third.eh_fdes > 0, "compiled again");
        assert!(decode(&std::fs::read(&stored[0]).unwrap()).is_some(), "and replaced");
        // Truncated: refused.
        assert!(decode(&b[..b.len() - 1]).is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Threads writing the same entry at once: every one gets the same
    /// table, and the file left is whole (each writes its own temporary).
    #[test]
    fn concurrent_writers() {
        let libc =
            crate::loaded::loaded().1.into_iter().find(|l| l.path.to_string_lossy().contains("libc.so")).unwrap();
        let d = dir("conc");
        let cache = Cache::open(&d).unwrap();
        let tables: Vec<Vec<(u64, crate::Rule)>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| cache.compile_file(&libc.path, None).unwrap().table.iter().collect()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(tables.windows(2).all(|w| w[0] == w[1]));
        let files: Vec<PathBuf> = std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()).collect();
        assert_eq!(files.len(), 1, "no temporary left: {files:?}");
        assert!(decode(&std::fs::read(&files[0]).unwrap()).is_some());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_not_ours_is_not_used() {
        let d = dir("perm");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(Cache::open(&d).is_none(), "world-writable");
        let link = dir("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(Cache::open(&link).is_none(), "a symlink");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }
}
