//! The parts journal of a spool: one append-only file into which every
//! process of an `osprey exec --children` tree appends its profiles, so a
//! short process creates no file of its own (an inode and two directory
//! entries each, most of what writing a part cost).
//!
//! A record is its kind's magic, the payload's length and CRC-32
//! (little-endian u32s), then the payload (an encoded, uncompressed profile,
//! or a process's run report), written with
//! one `write` to a descriptor opened `O_APPEND`: records of different
//! writers never interleave. A writer killed mid-write leaves a torn record,
//! which the reader skips (it resynchronises on the next magic).
//!
//! Sealing, the reader's side: the journal is renamed aside
//! ([`seal`]), read under an exclusive `flock`, and deleted under that lock
//! once its records are safe elsewhere. A writer appends under a shared
//! lock and, once it holds it, checks that its file still has a name: one
//! opened just before the rename may write into the sealed file until the
//! reader locks it (those records are read), never after it was read and
//! deleted (the writer sees no link left and opens the journal anew).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The journal's name in its spool.
pub const NAME: &str = "parts.journal";
/// What sealed journals' names end with.
pub const SEALED_SUFFIX: &str = ".sealed";
const MAGIC_LEN: usize = 8;
const HEADER: usize = MAGIC_LEN + 8;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An encoded profile (pprof protobuf, not gzipped).
    Profile,
    /// A process's run report (`osprey_upload::RunReport`'s record text).
    Report,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Profile, Kind::Report];

    fn magic(self) -> &'static [u8; MAGIC_LEN] {
        match self {
            Kind::Profile => b"OSPRYPRT",
            Kind::Report => b"OSPRYRPT",
        }
    }
}

/// Appends `payload` as one record of `kind` to the journal of spool `dir`.
pub fn append(dir: &Path, kind: Kind, payload: &[u8]) -> io::Result<PathBuf> {
    append_all(dir, kind, &[payload])
}

/// Appends each of `payloads` as a record of `kind`, under one lock of the
/// journal (each record one `write`, as [`append`] does).
pub fn append_all(dir: &Path, kind: Kind, payloads: &[&[u8]]) -> io::Result<PathBuf> {
    let records = payloads.iter().map(|p| record(kind, p)).collect::<io::Result<Vec<_>>>()?;
    let path = dir.join(NAME);
    // A sealed file is deleted at most once per attempt; a reader sealing
    // again and again while this one waits is bounded by the tries.
    for _ in 0..16 {
        let open = || OpenOptions::new().append(true).create(true).custom_flags(libc::O_CLOEXEC).open(&path);
        // A spool removed under a live writer (its `osprey exec` ended) is
        // made again, as a file would make it: the next `exec` recovers it.
        let mut f = match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(dir)?;
                open()?
            }
            r => r?,
        };
        lock(&f, libc::LOCK_SH)?;
        if f.metadata()?.nlink() == 0 {
            continue;
        }
        for r in &records {
            f.write_all(r)?;
        }
        return Ok(path);
    }
    Err(io::Error::other("the spool's journal was sealed 16 times during one append"))
}

/// `payload` as a record of `kind`: magic, length, CRC-32, payload.
fn record(kind: Kind, payload: &[u8]) -> io::Result<Vec<u8>> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("record over 4 GiB"))?;
    let mut record = Vec::with_capacity(HEADER + payload.len());
    record.extend_from_slice(kind.magic());
    record.extend_from_slice(&len.to_le_bytes());
    record.extend_from_slice(&crc(payload).to_le_bytes());
    record.extend_from_slice(payload);
    Ok(record)
}

/// Renames the journal of spool `dir` aside for reading; `None` when there
/// is none. The sealed name sorts after earlier seals.
pub fn seal(dir: &Path) -> io::Result<Option<PathBuf>> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let sealed = dir.join(format!("{nanos:024}{SEALED_SUFFIX}"));
    match fs::rename(dir.join(NAME), &sealed) {
        Ok(()) => Ok(Some(sealed)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The sealed journals in spool `dir`, oldest first.
pub fn sealed(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(SEALED_SUFFIX)))
        .collect();
    out.sort();
    Ok(out)
}

/// A sealed journal, read and exclusively locked: no record can be added
/// to it while this lives. Delete its file before dropping it, once its
/// records are kept elsewhere (a writer that opened it before the seal then
/// finds it unlinked and writes to the journal instead).
pub struct Sealed {
    path: PathBuf,
    /// Holds the lock.
    _file: File,
    /// The complete records, in order.
    pub records: Vec<(Kind, Vec<u8>)>,
    /// Bytes of torn records skipped.
    pub torn: usize,
}

impl Sealed {
    /// Locks and reads the sealed journal at `path` (waits for writers
    /// that hold its shared lock).
    pub fn open(path: &Path) -> io::Result<Sealed> {
        let mut f = File::open(path)?;
        lock(&f, libc::LOCK_EX)?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        let (records, torn) = records(&bytes);
        Ok(Sealed { path: path.to_path_buf(), _file: f, records, torn })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The complete records of `bytes` and the number of bytes skipped.
fn records(bytes: &[u8]) -> (Vec<(Kind, Vec<u8>)>, usize) {
    let (mut out, mut torn, mut at) = (Vec::new(), 0, 0);
    while at < bytes.len() {
        if let Some((kind, payload)) = record_at(bytes, at) {
            at += HEADER + payload.len();
            out.push((kind, payload.to_vec()));
            continue;
        }
        // Resynchronise on the next magic after this position.
        let is_magic = |w: &[u8]| Kind::ALL.iter().any(|k| w == k.magic());
        let next = bytes[at + 1..].windows(MAGIC_LEN).position(is_magic).map_or(bytes.len(), |i| at + 1 + i);
        torn += next - at;
        at = next;
    }
    (out, torn)
}

fn record_at(bytes: &[u8], at: usize) -> Option<(Kind, &[u8])> {
    let head = bytes.get(at..at + HEADER)?;
    let kind = *Kind::ALL.iter().find(|k| head.get(..MAGIC_LEN) == Some(k.magic().as_slice()))?;
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (len, sum) = (word(MAGIC_LEN) as usize, word(MAGIC_LEN + 4));
    let payload = bytes.get(at + HEADER..at + HEADER + len)?;
    (crc(payload) == sum).then_some((kind, payload))
}

/// CRC-32 (IEEE, as gzip's), one table lookup a byte. Not a library's:
/// theirs pick an instruction set at first use, and that probe (`cpuid`, a
/// VM exit each) cost a short process more than its whole record's sum.
fn crc(bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |c, &b| CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8))
}

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

fn lock(f: &File, how: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this function's caller owns.
        if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use osprey_testkit::tempdir;

    /// The sum is gzip's CRC-32 (zlib's, through flate2).
    #[test]
    fn crc_is_gzips() {
        for data in [&b""[..], b"a", b"123456789", &[0xffu8; 3000][..]] {
            let mut z = flate2::Crc::new();
            z.update(data);
            assert_eq!(crc(data), z.sum(), "{} bytes", data.len());
        }
        assert_eq!(crc(b"123456789"), 0xcbf4_3926);
    }

    /// A torn record (a writer killed mid-write) is skipped; the records
    /// around it are read.
    #[test]
    fn torn_records_are_skipped() {
        let dir = tempdir("journal-torn");
        append(&dir, Kind::Profile, b"first").unwrap();
        let mut f = OpenOptions::new().append(true).open(dir.join(NAME)).unwrap();
        let torn = [Kind::Profile.magic().as_slice(), &100u32.to_le_bytes(), &7u32.to_le_bytes(), b"cut"].concat();
        f.write_all(&torn).unwrap();
        append(&dir, Kind::Report, b"second").unwrap();
        let s = Sealed::open(&seal(&dir).unwrap().unwrap()).unwrap();
        assert_eq!(s.records, vec![(Kind::Profile, b"first".to_vec()), (Kind::Report, b"second".to_vec())]);
        assert_eq!(s.torn, HEADER + 3);
        fs::remove_file(s.path()).unwrap();
        drop(s);
        assert_eq!(seal(&dir).unwrap(), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The race the locks guard against: writers appending while the
    /// reader seals, reads and deletes journals over and over. Every record
    /// is read exactly once (none written into a journal already read).
    #[test]
    fn every_record_is_read_once_while_sealing() {
        let dir = tempdir("journal-race");
        let writers: Vec<_> = (0..4u32)
            .map(|w| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u32 {
                        append(&dir, Kind::Profile, format!("{w}-{i}").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        let mut seen = Vec::new();
        let drain = |seen: &mut Vec<Vec<u8>>| {
            seal(&dir).unwrap();
            for p in sealed(&dir).unwrap() {
                let s = Sealed::open(&p).unwrap();
                assert_eq!(s.torn, 0);
                seen.extend(s.records.iter().map(|(_, r)| r.clone()));
                fs::remove_file(s.path()).unwrap();
            }
        };
        while !writers.iter().all(|w| w.is_finished()) {
            drain(&mut seen);
        }
        for w in writers {
            w.join().unwrap();
        }
        drain(&mut seen);
        let mut want: Vec<Vec<u8>> =
            (0..4u32).flat_map(|w| (0..1000u32).map(move |i| format!("{w}-{i}").into_bytes())).collect();
        want.sort();
        seen.sort();
        assert_eq!(seen.len(), want.len(), "records lost or read twice");
        assert_eq!(seen, want);
        fs::remove_dir_all(&dir).unwrap();
    }
}
