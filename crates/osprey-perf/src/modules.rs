//! The target's executable modules and their CFI tables, kept in step with
//! its `/proc/<pid>/maps`.
//!
//! Files are opened through `/proc/<pid>/root` (a container's own files;
//! `osprey_unwind::scan::file_of`), tables compiled once per (path, load
//! bias) and kept across re-reads, through the on-disk cache when there is
//! one. The vDSO has no file: its image is read from the target's memory.
//! The maps are re-read when asked ([`Modules::rescan`]); the set is rebuilt
//! only if their text changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use osprey_unwind::cache::Cache;
use osprey_unwind::compile::{compile_elf, compile_file, DEBUG_ROOT};
use osprey_unwind::scan::{file_of, loaded_from, Loaded};
use osprey_unwind::{Module, ModuleSet};

/// The modules of one process.
pub(crate) struct Modules {
    pid: u32,
    set: ModuleSet,
    /// Compiled modules by (path, bias), kept across re-reads.
    compiled: HashMap<(PathBuf, u64), Module>,
    /// `/proc/<pid>/maps` as of the last rebuild.
    maps: String,
    disk: Option<Cache>,
}

impl Modules {
    /// Reads the target's modules now.
    pub(crate) fn new(pid: u32) -> Modules {
        let mut m = Modules {
            pid,
            set: ModuleSet::default(),
            compiled: HashMap::new(),
            maps: String::new(),
            disk: Cache::open_default(),
        };
        m.rescan();
        m
    }

    pub(crate) fn set(&self) -> &ModuleSet {
        &self.set
    }

    /// Re-reads the maps; rebuilds the set if they changed. True if it did.
    /// A target that has exited keeps its last set.
    pub(crate) fn rescan(&mut self) -> bool {
        // A path that is not UTF-8 is mangled and its file not found; the
        // other modules stay.
        let Ok(maps) = osprey_procfs::maps::read(self.pid as i32).map(|b| String::from_utf8_lossy(&b).into_owned())
        else {
            return false;
        };
        if maps == self.maps {
            return false;
        }
        let loaded = loaded_from(self.pid, &maps);
        let vdso = vdso(&maps);
        self.maps = maps;
        let debug_root = file_of(self.pid, Path::new(DEBUG_ROOT));
        let mut compiled = HashMap::new();
        for l in loaded.into_iter().chain(vdso) {
            let key = (l.path.clone(), l.bias);
            let module = match self.compiled.remove(&key) {
                Some(m) => m,
                None => match self.compile(&l, &debug_root) {
                    Some(m) => m,
                    None => continue,
                },
            };
            compiled.insert(key, module);
        }
        self.set = ModuleSet::new(compiled.values().cloned().collect());
        self.compiled = compiled;
        true
    }

    fn compile(&self, l: &Loaded, debug_root: &Path) -> Option<Module> {
        let c = match l.image {
            Some((lo, hi)) => compile_elf(&l.path, &read_memory(self.pid, lo, hi)?, None).ok()?,
            None => {
                let file = file_of(self.pid, &l.path);
                match &self.disk {
                    Some(d) => d.compile_file(&file, Some(debug_root)).ok()?,
                    None => compile_file(&file, Some(debug_root)).ok()?,
                }
            }
        };
        Some(Module {
            path: l.path.clone(),
            start: l.start,
            end: l.end,
            bias: l.bias,
            build_id: c.build_id.map(Into::into),
            table: c.table,
        })
    }
}

/// The vDSO's mapping in `maps`, if any, as a module whose image is read
/// from the target.
fn vdso(maps: &str) -> Option<Loaded> {
    let e = osprey_procfs::maps::entries(maps.as_bytes()).find(|e| e.path == b"[vdso]")?;
    let (start, end) = (e.start, e.end);
    Some(Loaded { path: "[vdso]".into(), bias: start, start, end, image: Some((start, end)) })
}

/// `[lo, hi)` of the target's memory (at most 1 MiB), with
/// `process_vm_readv`.
fn read_memory(pid: u32, lo: u64, hi: u64) -> Option<Vec<u8>> {
    let len = usize::try_from(hi.checked_sub(lo)?).ok().filter(|&l| l <= 1 << 20)?;
    let mut buf = vec![0u8; len];
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
    let remote = libc::iovec { iov_base: lo as usize as *mut libc::c_void, iov_len: len };
    // SAFETY: `local` covers `buf`, owned here; the remote iovec is only
    // interpreted by the kernel.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    (usize::try_from(n).ok()? == len).then_some(buf)
}
