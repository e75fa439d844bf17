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
    /// The file was unlinked after it was mapped.
    pub deleted: bool,
    /// The GNU build id (hex) of the loaded object, when the loader's
    /// in-memory copy of its notes gave it (see [`ProcMaps::from_loader`]).
    pub build_id: Option<String>,
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
            deleted: e.deleted,
            build_id: None,
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

    /// This process's map as its loader knows it (`dl_iterate_phdr`: no
    /// system call but the executable's `readlink`): one executable region
    /// per `PF_X` `PT_LOAD` segment of each object, with the build id of
    /// its notes, which are in memory. Anonymous memory, JIT code and files
    /// mapped without the loader are not in it.
    pub fn from_loader() -> ProcMaps {
        // The executable is this process's for its whole life (an exec starts a new one).
        static EXE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let exe = EXE.get_or_init(|| fs::read_link("/proc/self/exe").ok().map(|p| p.to_string_lossy().into_owned()));
        let (path, deleted) = match exe.as_deref().map(|e| (e.strip_suffix(" (deleted)"), e)) {
            Some((Some(gone), _)) => (gone.to_string(), true),
            Some((None, e)) => (e.to_string(), false),
            None => (String::new(), false),
        };
        let mut regions = loader::regions();
        for r in regions.iter_mut().filter(|r| r.path.is_empty()) {
            r.path.clone_from(&path);
            r.deleted = deleted;
        }
        regions.sort_by_key(|r| r.start);
        ProcMaps { regions, exe: exe.as_ref().map(|_| PathBuf::from(path)) }
    }

    /// Gives each region the build id a region of `loaded` (see
    /// [`ProcMaps::from_loader`]) of the same file and range knows.
    pub fn take_build_ids(&mut self, loaded: &ProcMaps) {
        for r in &mut self.regions {
            let same = |l: &&Region| l.path == r.path && l.start <= r.start && r.end <= l.end;
            if let Some(l) = loaded.regions.iter().find(same) {
                r.build_id.clone_from(&l.build_id);
            }
        }
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

mod loader {
    use super::Region;

    /// Executable segments of every loaded object (the main program's path empty).
    pub(super) fn regions() -> Vec<Region> {
        let mut out: Vec<Region> = Vec::new();
        osprey_unwind::loaded::each_object(|o| {
            let path = o.name.to_string_lossy().into_owned();
            let build_id = o.notes().find_map(crate::build_id::scan_notes).map(crate::build_id::hex);
            let page = |a: u64| a & !0xfff;
            for p in o.phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0) {
                let lo = o.bias.wrapping_add(p.p_vaddr);
                let hi = lo.wrapping_add(p.p_memsz);
                out.push(Region {
                    start: page(lo),
                    end: (hi + 0xfff) & !0xfff,
                    offset: page(p.p_offset),
                    executable: true,
                    path: path.clone(),
                    deleted: false,
                    build_id: build_id.clone(),
                });
            }
            true
        });
        out
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

    /// The loader's map agrees with `/proc/self/maps` on the executable's
    /// text, and its build ids are the files'.
    #[test]
    fn loader_map_agrees_with_proc() {
        let loader = ProcMaps::from_loader();
        let proc = ProcMaps::read(0).unwrap();
        let f = regions_from_lines as fn() as usize as u64;
        let (l, p) = (&loader.regions[loader.find(f).unwrap()], &proc.regions[proc.find(f).unwrap()]);
        assert_eq!(l.path, p.path);
        assert!(loader.is_main(loader.find(f).unwrap()));
        // The segment's file offset maps to the same place in both.
        assert_eq!(f - l.start + l.offset, f - p.start + p.offset);
        let from_file = crate::build_id::read_hex(std::path::Path::new(&l.path));
        assert!(from_file.is_some(), "test binaries have a build id");
        assert_eq!(l.build_id, from_file);
        let libc_fn = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let c = &loader.regions[loader.find(libc_fn).unwrap()];
        assert_eq!(c.build_id, crate::build_id::read_hex(std::path::Path::new(&c.path)), "{}", c.path);
        let mut with = proc.clone();
        with.take_build_ids(&loader);
        assert_eq!(with.regions[proc.find(f).unwrap()].build_id, from_file);
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
