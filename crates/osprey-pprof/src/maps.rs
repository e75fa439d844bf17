//! The profiled process's memory map, read from `/proc/<pid>/maps` at flush.
//!
//! Invariants: [`ProcMaps::regions`] is sorted by `start` and regions do not
//! overlap (the kernel's order); `end` is exclusive.

use osprey_procfs::maps::Entry;
pub use osprey_procfs::proc_dir;
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

impl From<Entry<'_>> for Region {
    fn from(e: Entry<'_>) -> Region {
        Region {
            start: e.start,
            end: e.end,
            offset: e.offset,
            executable: e.perms.exec,
            path: String::from_utf8_lossy(e.path).into_owned(),
        }
    }
}

impl ProcMaps {
    /// Reads the map of `pid` (`pid <= 0`: this process) from `/proc`. Fails if
    /// `/proc/<pid>/maps` is unreadable (e.g. the process is gone); lines that do
    /// not parse are skipped; `exe` is `None` if `/proc/<pid>/exe` is unreadable.
    pub fn read(pid: i32) -> io::Result<ProcMaps> {
        Ok(Self::read_with_text(pid)?.0)
    }

    /// [`ProcMaps::read`], with the text read (for the symbolizer, so that
    /// one profile reads the map once).
    pub fn read_with_text(pid: i32) -> io::Result<(ProcMaps, Vec<u8>)> {
        let dir = proc_dir(pid);
        let text = osprey_procfs::maps::read(pid)?;
        let exe = fs::read_link(dir.join("exe")).ok().map(|p| {
            let s = p.to_string_lossy();
            PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s))
        });
        let regions = osprey_procfs::maps::entries(&text).map(Region::from).collect();
        Ok((ProcMaps { regions, exe }, text))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn region(line: &str) -> Region {
        Region::from(Entry::parse_str(line).unwrap())
    }

    #[test]
    fn regions_from_lines() {
        let r = region("55d0a0000000-55d0a0021000 r-xp 00002000 fd:01 1234    /usr/bin/my x (deleted)");
        assert_eq!((r.start, r.end, r.offset, r.executable), (0x55d0a0000000, 0x55d0a0021000, 0x2000, true));
        assert_eq!(r.path, "/usr/bin/my x");
        let anon = region("7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ");
        assert_eq!((anon.path.as_str(), anon.executable), ("", false));
    }

    #[test]
    fn finds_own_text() {
        let maps = ProcMaps::read(0).unwrap();
        let f = regions_from_lines as fn() as usize as u64;
        let i = maps.find(f).unwrap();
        assert!(maps.regions[i].executable && maps.is_main(i));
        assert_eq!(maps.main_text(), Some(i));
    }
}
