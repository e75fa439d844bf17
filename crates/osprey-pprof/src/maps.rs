//! The profiled process's memory map, read from `/proc/<pid>/maps` at flush.
//!
//! Invariants: [`ProcMaps::regions`] is sorted by `start` and regions do not
//! overlap (the kernel's order); `end` is exclusive.

use std::fs;
use std::io;
use std::path::PathBuf;

/// One line of `/proc/<pid>/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// First address of the region.
    pub start: u64,
    /// End address of the region, exclusive.
    pub end: u64,
    /// Offset in the mapped file of the byte at `start`; 0 for anonymous memory.
    pub offset: u64,
    /// The region is mapped executable (`x` in its permissions).
    pub executable: bool,
    /// Path or pseudo name (`[vdso]`, `[heap]`); empty for anonymous memory.
    /// A `" (deleted)"` suffix is removed.
    pub path: String,
}

/// A process's memory map and main executable. The default is an empty map
/// (no regions, no executable).
#[derive(Clone, Debug, Default)]
pub struct ProcMaps {
    /// The regions, in the kernel's order: sorted by `start`, non-overlapping.
    pub regions: Vec<Region>,
    /// Target of `/proc/<pid>/exe`, if readable.
    pub exe: Option<PathBuf>,
}

/// `/proc/<pid>` for `pid > 0`, `/proc/self` otherwise.
pub fn proc_dir(pid: i32) -> PathBuf {
    if pid > 0 {
        PathBuf::from(format!("/proc/{pid}"))
    } else {
        PathBuf::from("/proc/self")
    }
}

impl ProcMaps {
    /// Reads the map of `pid` (`pid <= 0`: this process) from `/proc`. Fails if
    /// `/proc/<pid>/maps` is unreadable (e.g. the process is gone); lines that do
    /// not parse are skipped; `exe` is `None` if `/proc/<pid>/exe` is unreadable.
    pub fn read(pid: i32) -> io::Result<ProcMaps> {
        let dir = proc_dir(pid);
        let text = fs::read_to_string(dir.join("maps"))?;
        let exe = fs::read_link(dir.join("exe")).ok().map(|p| {
            let s = p.to_string_lossy();
            PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s))
        });
        Ok(ProcMaps { regions: text.lines().filter_map(parse_line).collect(), exe })
    }

    /// Index of the region containing `addr`.
    pub fn find(&self, addr: u64) -> Option<usize> {
        let i = self.regions.partition_point(|r| r.end <= addr);
        self.regions.get(i).filter(|r| r.start <= addr).map(|_| i)
    }

    /// Whether region `i` belongs to the main executable.
    pub fn is_main(&self, i: usize) -> bool {
        let r = &self.regions[i];
        self.exe.as_deref().is_some_and(|exe| !r.path.is_empty() && exe.as_os_str() == r.path.as_str())
    }

    /// First executable region of the main executable.
    pub fn main_text(&self) -> Option<usize> {
        (0..self.regions.len()).find(|&i| self.regions[i].executable && self.is_main(i))
    }
}

/// Parses `start-end perms offset dev inode [path]`.
pub fn parse_line(line: &str) -> Option<Region> {
    let mut it = line.splitn(6, ' ');
    let (range, perms, offset) = (it.next()?, it.next()?, it.next()?);
    let (_dev, _inode) = (it.next()?, it.next()?);
    let path = it.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    Some(Region {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        path: path.strip_suffix(" (deleted)").unwrap_or(path).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let r = parse_line("55d0a0000000-55d0a0021000 r-xp 00002000 fd:01 1234    /usr/bin/x (deleted)").unwrap();
        assert_eq!((r.start, r.end, r.offset, r.executable), (0x55d0a0000000, 0x55d0a0021000, 0x2000, true));
        assert_eq!(r.path, "/usr/bin/x");
        let anon = parse_line("7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((anon.path.as_str(), anon.executable), ("", false));
    }

    #[test]
    fn finds_own_text() {
        let maps = ProcMaps::read(0).unwrap();
        let f = parses_lines as fn() as usize as u64;
        let i = maps.find(f).unwrap();
        assert!(maps.regions[i].executable && maps.is_main(i));
        assert_eq!(maps.main_text(), Some(i));
    }
}
