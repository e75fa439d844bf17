//! The processes of a sampled tree ([`crate::TreeSampler`]) as its
//! side-band records describe them: each one's name, its threads' names,
//! its executable mappings, and the native stack of each of its samples,
//! unwound with the CFI tables of the files mapped. A file's tables are
//! compiled (or read from the on-disk cache) once for the whole tree: a
//! thousand `/bin/true`s read libc's once.
//!
//! Invariants: records are fed in time order (`TreeSampler::drain` hands
//! them so); a process forked without an exec has its parent's image as of
//! the fork; an exec starts a new image (mappings, name); a process's state
//! stays after its exit until [`Images::forget`], so that its last records
//! (its threads' counts at exit) still find it.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use osprey_unwind::cache::Cache;
use osprey_unwind::compile::{compile_elf, compile_file, DEBUG_ROOT};
use osprey_unwind::loaded::{file_of, ExecSegments};
use osprey_unwind::{unwind, Module, ModuleSet, Regs, Table};

use crate::record::{Comm, Mmap, RawSample, Task};
use crate::unwind::{Stack, MAX_FRAMES};

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The file as the process named it, or a pseudo name (`[vdso]`).
    pub path: PathBuf,
    /// The file's GNU build id, from the record or read from the file.
    pub build_id: Option<Arc<[u8]>>,
}

/// A process image: what an exec started.
#[derive(Clone, Debug, Default)]
struct Image {
    /// The process's name (its main thread's).
    name: String,
    /// The executable: the first executable mapping after the exec.
    exe: Option<PathBuf>,
    maps: Vec<Mapping>,
    /// Built from `maps` when a sample needs it; dropped when they change.
    set: Option<Arc<ModuleSet>>,
}

#[derive(Clone, Debug, Default)]
struct Proc {
    image: Image,
    threads: HashMap<u32, String>,
    exited: bool,
}

/// A file's tables and what places them in a process.
#[derive(Clone)]
struct FileTables {
    table: Table,
    segments: ExecSegments,
    build_id: Option<Arc<[u8]>>,
    /// The ELF entry point (`e_entry`), a virtual address.
    entry: Option<u64>,
}

/// A file as mapped: its path and the build id the mapping named.
type FileKey = (PathBuf, Option<BuildId>);

/// A GNU build id's bytes.
type BuildId = Arc<[u8]>;

/// Builds and keeps the images of a tree's processes.
pub struct Images {
    procs: HashMap<u32, Proc>,
    /// Tables by file (path and build id); None: the file cannot be read.
    files: HashMap<FileKey, Option<FileTables>>,
    /// The vDSO's tables: the kernel maps the same image in every process,
    /// so this process's own serves them all.
    vdso: Option<Option<Table>>,
    disk: Option<Cache>,
    frames: Vec<u64>,
}

impl Default for Images {
    fn default() -> Images {
        Images {
            procs: HashMap::new(),
            files: HashMap::new(),
            vdso: None,
            disk: Cache::open_default(),
            frames: vec![0; MAX_FRAMES],
        }
    }
}

impl Images {
    /// A thread or process created, or a thread gone.
    pub fn task(&mut self, t: &Task) {
        if t.exit {
            if t.tid == t.pid {
                self.procs.entry(t.pid).or_default().exited = true;
            }
            return;
        }
        if t.pid != t.ppid {
            // A new process: its parent's image as of now (a fork), its one
            // thread named as the thread that forked it.
            let parent = self.procs.get(&t.ppid);
            let image = parent.map(|p| p.image.clone()).unwrap_or_default();
            let name = parent.and_then(|p| p.threads.get(&t.ptid)).cloned().unwrap_or_else(|| image.name.clone());
            self.procs.insert(t.pid, Proc { image, threads: HashMap::from([(t.tid, name)]), exited: false });
        } else {
            let p = self.procs.entry(t.pid).or_default();
            let name = p.threads.get(&t.ptid).cloned().unwrap_or_else(|| p.image.name.clone());
            p.threads.insert(t.tid, name);
        }
    }

    /// A thread named, or a process exec'd.
    pub fn comm(&mut self, c: &Comm<'_>) {
        let name = String::from_utf8_lossy(c.name).into_owned();
        let p = self.procs.entry(c.pid).or_default();
        if c.exec {
            p.image = Image { name: name.clone(), ..Image::default() };
            p.threads.clear();
        } else if c.tid == c.pid {
            p.image.name.clone_from(&name);
        }
        p.threads.insert(c.tid, name);
    }

    /// A mapping made: kept if executable.
    pub fn mmap(&mut self, m: &Mmap<'_>) {
        if m.prot & libc::PROT_EXEC as u32 == 0 {
            return;
        }
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(m.path));
        let build_id = m.build_id.map(Arc::from);
        let image = &mut self.procs.entry(m.pid).or_default().image;
        if image.exe.is_none() && path.is_absolute() {
            image.exe = Some(path.clone());
        }
        let end = m.start.saturating_add(m.len);
        // A new mapping replaces what it covers (`MAP_FIXED`, a library loaded where one was).
        image.maps.retain(|o| o.end <= m.start || o.start >= end);
        image.maps.push(Mapping { start: m.start, end, pgoff: m.pgoff, path, build_id });
        image.maps.sort_by_key(|o| o.start);
        image.set = None;
    }

    /// The native stack of `s`, with its process's modules as of now.
    pub fn unwind(&mut self, s: &RawSample<'_>) -> Stack {
        let mut stack = Stack { tid: s.tid, time: s.time, period: s.period, pcs: Vec::new(), truncated: true };
        let Some(r) = s.regs else { return stack };
        let set = self.modules(s.pid);
        let read = |a: u64| s.read_stack(a);
        let walk = unwind(&set, Regs { pc: r.ip, sp: r.sp, fp: r.bp }, read, &mut self.frames);
        stack.pcs.extend_from_slice(&self.frames[..walk.len]);
        stack.truncated = walk.truncated;
        stack
    }

    /// Adds the executable mappings `/proc/<pid>/maps` shows that the
    /// records did not (a ring that overflowed loses them too); false if
    /// the process is gone or nothing was missing.
    pub fn fill_from_proc(&mut self, pid: u32) -> bool {
        let Ok(text) = osprey_procfs::maps::read(pid as i32) else { return false };
        let Some(p) = self.procs.get_mut(&pid) else { return false };
        let image = &mut p.image;
        let mut added = false;
        for e in osprey_procfs::maps::entries(&text).filter(|e| e.perms.exec) {
            if image.maps.iter().any(|m| m.start < e.end && e.start < m.end) {
                continue;
            }
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(e.path));
            image.maps.push(Mapping { start: e.start, end: e.end, pgoff: e.offset, path, build_id: None });
            added = true;
        }
        if added {
            image.maps.sort_by_key(|m| m.start);
            image.set = None;
        }
        added
    }

    /// The name of process `pid` (its main thread's), empty if unknown.
    pub fn process_name(&self, pid: u32) -> &str {
        self.procs.get(&pid).map_or("", |p| p.image.name.as_str())
    }

    /// The name of thread `tid` of `pid`, empty if unknown.
    pub fn thread_name(&self, pid: u32, tid: u32) -> &str {
        self.procs.get(&pid).and_then(|p| p.threads.get(&tid)).map_or("", String::as_str)
    }

    /// The executable of `pid`'s image, if mapped.
    pub fn exe(&self, pid: u32) -> Option<&Path> {
        self.procs.get(&pid)?.image.exe.as_deref()
    }

    /// Where `pid`'s executable starts (its ELF entry point, `_start`): the
    /// root of its main thread's stacks.
    pub fn entry(&mut self, pid: u32) -> Option<u64> {
        let exe = self.exe(pid)?.to_path_buf();
        let m = self.mappings(pid).iter().find(|m| m.path == exe)?.clone();
        self.placed(pid, &m)?;
        let f = self.files.get(&(m.path.clone(), m.build_id.clone()))?.as_ref()?;
        Some(f.segments.bias(m.start, m.pgoff)?.wrapping_add(f.entry?))
    }

    /// The executable mappings of `pid`, sorted by address.
    pub fn mappings(&self, pid: u32) -> &[Mapping] {
        self.procs.get(&pid).map_or(&[], |p| &p.image.maps)
    }

    /// Whether `pid`'s main thread has exited.
    pub fn exited(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.exited)
    }

    /// The processes known, exited or not.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().copied()
    }

    /// Drops what is kept of thread `tid` of `pid` (it exited).
    pub fn forget_thread(&mut self, pid: u32, tid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.threads.remove(&tid);
        }
    }

    /// Drops what is kept of `pid`.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// The module set of `pid`, built from its mappings if they changed.
    pub fn modules(&mut self, pid: u32) -> Arc<ModuleSet> {
        let Some(p) = self.procs.get(&pid) else { return Arc::default() };
        if let Some(set) = &p.image.set {
            return Arc::clone(set);
        }
        let maps = p.image.maps.clone();
        let mut modules: Vec<Module> = Vec::new();
        for m in &maps {
            let Some((table, bias, build_id)) = self.placed(pid, m) else { continue };
            match modules.last_mut() {
                // The same file's next executable segment at the same bias.
                Some(last) if last.path == m.path && last.bias == bias => last.end = last.end.max(m.end),
                _ => modules.push(Module { path: m.path.clone(), start: m.start, end: m.end, bias, build_id, table }),
            }
        }
        let set = Arc::new(ModuleSet::new(modules));
        if let Some(p) = self.procs.get_mut(&pid) {
            p.image.set = Some(Arc::clone(&set));
        }
        set
    }

    /// The tables, load bias and build id of mapping `m` of `pid`.
    fn placed(&mut self, pid: u32, m: &Mapping) -> Option<(Table, u64, Option<BuildId>)> {
        if m.path.as_os_str() == "[vdso]" {
            return Some((self.vdso_table()?, m.start, None));
        }
        if !m.path.is_absolute() {
            return None;
        }
        let key = (m.path.clone(), m.build_id.clone());
        let disk = &self.disk;
        let f = self.files.entry(key).or_insert_with(|| {
            let file = file_of(pid, &m.path);
            let segments = ExecSegments::read(&file)?;
            let debug_root = file_of(pid, Path::new(DEBUG_ROOT));
            let c = match disk {
                Some(d) => d.compile_file(&file, Some(&debug_root)).ok()?,
                None => compile_file(&file, Some(&debug_root)).ok()?,
            };
            // The file at that path now may not be the one mapped then.
            let build_id = c.build_id.map(Arc::<[u8]>::from);
            if m.build_id.is_some() && build_id != m.build_id {
                return None;
            }
            Some(FileTables { table: c.table, segments, build_id, entry: elf_entry(&file) })
        });
        let f = f.as_ref()?;
        Some((f.table.clone(), f.segments.bias(m.start, m.pgoff)?, f.build_id.clone()))
    }

    /// This process's vDSO tables (the same image as every process's).
    fn vdso_table(&mut self) -> Option<Table> {
        self.vdso.get_or_insert_with(own_vdso_table).clone()
    }
}

/// `e_entry` of a 64-bit little-endian ELF file.
fn elf_entry(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut head = [0u8; 32];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    (head[..6] == *b"\x7fELF\x02\x01").then(|| u64::from_le_bytes(head[24..32].try_into().unwrap_or_default()))
}

/// Compiles this process's vDSO image.
fn own_vdso_table() -> Option<Table> {
    let maps = osprey_procfs::maps::read(std::process::id() as i32).ok()?;
    let e = osprey_procfs::maps::entries(&maps).find(|e| e.path == b"[vdso]")?;
    let len = usize::try_from(e.end - e.start).ok()?;
    // SAFETY: the vDSO is mapped readable for the life of the process.
    let image = unsafe { std::slice::from_raw_parts(e.start as usize as *const u8, len) };
    Some(compile_elf(Path::new("[vdso]"), image, None).ok()?.table)
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images").field("processes", &self.procs.len()).field("files", &self.files.len()).finish()
    }
}
