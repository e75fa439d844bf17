//! `/proc/PID/maps`: one [`Entry`] per line,
//! `start-end perms offset major:minor inode [path]`.
//!
//! Invariants: the path is the rest of the line after the inode and the
//! whitespace that follows it, interior and trailing spaces kept; a trailing
//! `" (deleted)"` is removed from it and reported as [`Entry::deleted`];
//! pseudo names (`[heap]`, `[stack]`, `[vdso]`, `[anon:...]`), `memfd:...`
//! names and the empty path of anonymous memory are kept as they are.
//! Paths are bytes (file names need not be UTF-8).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;

/// The permission column, e.g. `r-xp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Perms {
    /// `r`: readable.
    pub read: bool,
    /// `w`: writable.
    pub write: bool,
    /// `x`: executable.
    pub exec: bool,
    /// `s`: shared; `p` (private, copy-on-write) otherwise.
    pub shared: bool,
}

impl Perms {
    /// Parses the four characters `[r-][w-][x-][ps]`.
    pub fn parse(s: &[u8]) -> Option<Perms> {
        let flag = |c: u8, on: u8| match c {
            _ if c == on => Some(true),
            b'-' => Some(false),
            _ => None,
        };
        let &[r, w, x, s] = s else { return None };
        Some(Perms {
            read: flag(r, b'r')?,
            write: flag(w, b'w')?,
            exec: flag(x, b'x')?,
            shared: match s {
                b's' => true,
                b'p' => false,
                _ => return None,
            },
        })
    }
}

/// One line of `/proc/PID/maps`, borrowing the path from the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// First address of the mapping.
    pub start: u64,
    /// End address of the mapping, exclusive.
    pub end: u64,
    /// Its permissions.
    pub perms: Perms,
    /// Offset in the mapped file of the byte at `start`; 0 for anonymous memory.
    pub offset: u64,
    /// Device of the mapped file, (major, minor).
    pub dev: (u32, u32),
    /// Inode of the mapped file; 0 for anonymous memory.
    pub inode: u64,
    /// Path or pseudo name, without a trailing `" (deleted)"`; empty for
    /// anonymous memory.
    pub path: &'a [u8],
    /// The path ended in `" (deleted)"`: the file was unlinked after mapping.
    pub deleted: bool,
}

const DELETED: &[u8] = b" (deleted)";

impl<'a> Entry<'a> {
    /// Parses one line (a trailing `\n` is allowed). `None` if any field
    /// before the path is missing or malformed.
    pub fn parse(line: &'a [u8]) -> Option<Entry<'a>> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let mut rest = line;
        let range = next_field(&mut rest)?;
        let perms = next_field(&mut rest)?;
        let offset = next_field(&mut rest)?;
        let dev = next_field(&mut rest)?;
        let inode = next_field(&mut rest)?;
        let split = |s: &'a [u8], c: u8| s.iter().position(|&b| b == c).map(|i| (&s[..i], &s[i + 1..]));
        let (start, end) = split(range, b'-')?;
        let (major, minor) = split(dev, b':')?;
        let (path, deleted) = match rest.strip_suffix(DELETED) {
            Some(p) => (p, true),
            None => (rest, false),
        };
        Some(Entry {
            start: hex(start)?,
            end: hex(end)?,
            perms: Perms::parse(perms)?,
            offset: hex(offset)?,
            dev: (u32::try_from(hex(major)?).ok()?, u32::try_from(hex(minor)?).ok()?),
            inode: decimal(inode)?,
            path,
            deleted,
        })
    }

    /// Parses one line given as text.
    pub fn parse_str(line: &'a str) -> Option<Entry<'a>> {
        Entry::parse(line.as_bytes())
    }

    /// The path as UTF-8, `None` if it is not.
    pub fn path_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.path).ok()
    }

    /// The path as an `OsStr` (any bytes, no copy).
    pub fn path_os(&self) -> &'a OsStr {
        OsStr::from_bytes(self.path)
    }

    /// The mapping is of a file (its path is absolute), not anonymous memory
    /// or a pseudo name such as `[stack]` or `memfd:...`.
    pub fn is_file(&self) -> bool {
        self.path.first() == Some(&b'/')
    }

    /// Whether `addr` is in `[start, end)`.
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }
}

/// The field at the start of `rest` (up to a space or tab), and `rest`
/// advanced past it and the whitespace after it. `None` if it is empty.
fn next_field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let end = rest.iter().position(blank).unwrap_or(rest.len());
    let field = &rest[..end];
    let after = &rest[end..];
    *rest = &after[after.iter().position(|b| !blank(b)).unwrap_or(after.len())..];
    (!field.is_empty()).then_some(field)
}

fn hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| Some(acc << 4 | u64::from((b as char).to_digit(16)?)))
}

fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| acc.checked_mul(10)?.checked_add(u64::from((b as char).to_digit(10)?)))
}

/// The entries of a maps buffer, line by line; lines that do not parse are
/// skipped.
pub fn entries(buf: &[u8]) -> Entries<'_> {
    Entries { rest: buf }
}

/// Iterator of [`entries`].
#[derive(Clone, Debug)]
pub struct Entries<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        while !self.rest.is_empty() {
            let (line, rest) = match self.rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
                None => (self.rest, &[][..]),
            };
            self.rest = rest;
            if let Some(e) = Entry::parse(line) {
                return Some(e);
            }
        }
        None
    }
}

/// The contents of `/proc/<pid>/maps` (`pid <= 0`: this process). Fails if
/// it is unreadable (e.g. the process is gone).
pub fn read(pid: i32) -> io::Result<Vec<u8>> {
    crate::read_file(&crate::proc_dir(pid).join("maps"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> Entry<'_> {
        Entry::parse_str(line).unwrap()
    }

    #[test]
    fn file_mapping() {
        let e = p("55d0a0000000-55d0a0021000 r-xp 00002000 fd:01 1234                     /usr/bin/x\n");
        assert_eq!(
            (e.start, e.end, e.offset, e.dev, e.inode),
            (0x55d0a0000000, 0x55d0a0021000, 0x2000, (0xfd, 1), 1234)
        );
        assert_eq!(e.perms, Perms { read: true, write: false, exec: true, shared: false });
        assert_eq!((e.path, e.deleted, e.is_file()), (&b"/usr/bin/x"[..], false, true));
        assert!(e.contains(0x55d0a0000000) && !e.contains(0x55d0a0021000));
    }

    #[test]
    fn path_with_spaces_and_deleted() {
        let e = p("7f0000000000-7f0000001000 r--s 00000000 08:02 77    /tmp/my lib (v2).so (deleted)");
        assert_eq!(e.path_str(), Some("/tmp/my lib (v2).so"));
        assert!(e.deleted && e.perms.shared);
        let e = p("7f0000000000-7f0000001000 r--p 00000000 08:02 77 /a  b ");
        assert_eq!(e.path, b"/a  b ");
        assert!(!e.deleted);
    }

    #[test]
    fn anonymous_and_pseudo() {
        let anon = p("7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ");
        assert_eq!((anon.path, anon.deleted, anon.is_file(), anon.inode), (&b""[..], false, false, 0));
        let anon = p("7f0000000000-7f0000001000 ---p 00000000 00:00 0");
        assert_eq!(anon.path, b"");
        assert_eq!(anon.perms, Perms::default());
        for name in ["[vdso]", "[heap]", "[stack]", "[anon:glibc: malloc]"] {
            let line = format!("7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          {name}");
            let e = Entry::parse_str(&line).unwrap();
            assert_eq!((e.path_str(), e.is_file()), (Some(name), false));
        }
        let memfd = p("7f0000000000-7f0000001000 rw-s 00000000 00:01 99 /memfd:jit cache (deleted)");
        assert_eq!((memfd.path_str(), memfd.deleted, memfd.is_file()), (Some("/memfd:jit cache"), true, true));
        let memfd = p("7f0000000000-7f0000001000 rw-s 00000000 00:01 99 memfd:x");
        assert_eq!(memfd.path_str(), Some("memfd:x"));
    }

    #[test]
    fn widths() {
        let e = p("08048000-08049000 r-xp 00000000 03:00 8364       /bin/small");
        assert_eq!((e.start, e.end), (0x08048000, 0x08049000));
        let e = p("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]");
        assert_eq!((e.start, e.end), (0xffffffffff600000, 0xffffffffff601000));
        assert_eq!(Entry::parse_str("1ffffffffff600000-2 r-xp 0 0:0 0"), None);
    }

    #[test]
    fn garbage_is_none() {
        for line in [
            "",
            "\n",
            "garbage",
            "7f00-7f01",
            "7f00-7f01 r-xp",
            "7f00-7f01 r-xp 0",
            "7f00-7f01 r-xp 0 00:00",
            "7f00 r-xp 0 00:00 0",
            "7f00-zz r-xp 0 00:00 0",
            "7f00-7f01 rwxq 0 00:00 0",
            "7f00-7f01 r-x 0 00:00 0",
            "7f00-7f01 r-xp 0 0000 0",
            "7f00-7f01 r-xp 0 00:00 x",
            "7f00-7f01 r-xp 0 00:00 99999999999999999999999",
            "7f00-7f01 r-xp 0 123456789:0 1",
            "-  : ",
        ] {
            assert_eq!(Entry::parse_str(line), None, "{line:?}");
        }
        let e = Entry::parse(b"7f00-7f01 r-xp 0 00:00 1 /\xff\xfe").unwrap();
        assert_eq!((e.path, e.path_str()), (&b"/\xff\xfe"[..], None));
    }

    #[test]
    fn iterates_skipping_bad_lines() {
        let buf =
            b"1000-2000 r-xp 0 00:00 0 /a\nbad line\n\n3000-4000 rw-p 0 00:00 0\n5000-6000 r--p 0 00:00 0 [stack]";
        let got: Vec<(u64, &[u8])> = entries(buf).map(|e| (e.start, e.path)).collect();
        assert_eq!(got, [(0x1000, &b"/a"[..]), (0x3000, b""), (0x5000, b"[stack]")]);
        assert_eq!(entries(b"").count(), 0);
    }

    #[test]
    fn reads_own_maps() {
        let buf = read(0).unwrap();
        let f = reads_own_maps as fn() as usize as u64;
        let e = entries(&buf).find(|e| e.contains(f)).unwrap();
        assert!(e.perms.exec && e.is_file());
        assert!(entries(&buf).any(|e| e.path == b"[stack]"));
    }
}
