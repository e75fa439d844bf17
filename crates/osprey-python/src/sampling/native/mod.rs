//! `--native`: mixed stacks, the thread's native frames (C extensions,
//! libraries, the interpreter's own C functions) with its Python frames at
//! the places they ran.
//!
//! A thread that is running is not stopped: a perf event armed for one
//! sample ([`osprey_perf::OneShot`]) copies its registers and the top of its
//! stack after 10 µs of its CPU time, between two reads of its Python stack
//! (the second one right after the sample, and the sample unwound after it);
//! a sample in a C extension or a library is kept only when both reads show
//! the same calls (so the sample ran them too), one in Python code with a
//! read that merges with it whole. The native stack is unwound with the CFI
//! tables of `osprey-unwind` over that copy, and [`merge`] puts the two
//! together.
//! With `--blocking`, or where no event can be opened, the thread is stopped
//! for the moment of the read instead (see [`crate::remote::ptrace`]) and
//! its stack copied a chunk at a time while it stands still; so is a
//! runnable thread whose sample did not come within 200 µs, being preempted
//! (a stop then costs it little), and one whose calls changed around three
//! samples in a row. Threads that wait are neither sampled nor stopped (a
//! stop interrupts a blocking system call, which some return as `EINTR`):
//! their stacks stay Python only.
//!
//! Modules (`/proc/<pid>/maps`, through `/proc/<pid>/root` for a container)
//! are compiled once per file and load address; the maps are looked at
//! again at most once a second when a walk meets code outside every known
//! module, and every [`RESCAN`] otherwise, and the modules re-read only if
//! they changed. The vDSO is compiled from the target's memory.
//! Native frames are named when sampled (the target may be gone by the time
//! a profile is written): the function symbol, else `module+0xoffset`, with
//! the module's path as file.

pub mod merge;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use osprey_pprof::Frame;
use osprey_unwind::compile::{compile_elf, compile_file, DEBUG_ROOT};
use osprey_unwind::scan::{file_of, loaded_from};
use osprey_unwind::symbols::{module_offset_name, Symbols};
use osprey_unwind::{unwind, Module, ModuleSet, Regs};

use crate::remote::ptrace::Stopped;
use crate::walk::Stack;
use merge::{Kind, Outcome};

/// Native frames per stack, at most.
const MAX_FRAMES: usize = 256;
/// Stack memory read per thread, at most.
const MAX_STACK: usize = 1 << 20;
/// Stack memory copied per read.
const CHUNK: usize = 8192;
/// Stack bytes a one-shot sample copies: the most a perf record holds.
const SHOT_STACK: u32 = osprey_perf::Config::MAX_STACK;
/// One-shot samples open at once, at most: each pins a 64 KiB ring. The
/// least recently armed is closed for a new one.
const MAX_SHOTS: usize = 64;
/// How long a sample is waited for: the sample's 10 µs of the thread's
/// CPU, longer for a thread preempted.
const SHOT_WAIT: Duration = Duration::from_micros(200);
/// Modules are re-read at least this often.
const RESCAN: Duration = Duration::from_secs(5);
/// Native frames named, at most, before the cache of names is dropped.
const MAX_NAMES: usize = 1 << 16;

/// The interpreter's evaluation function, whose calls run Python frames. It
/// is also its module's biggest function (3.8-3.15, shared and static
/// builds): that is how it is found where it has no symbol of its own
/// (Debian's 3.13+ export a small `_PyEval_EvalFrameDefault` and run an
/// unnamed LTO copy). Its `.cold` part, when named, counts too.
const EVAL: &str = "_PyEval_EvalFrameDefault";

/// Counts of how merges went.
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeStats {
    /// Stacks unwound and merged (stopped, or sampled running).
    pub unwound: u64,
    /// Running threads stopped for their read after all: their one-shot
    /// sample did not come in time (they waited for a CPU), or their calls
    /// changed around each of the samples tried.
    pub missed: u64,
    /// One-shot samples dropped because the Python stack moved on around
    /// them: in a C extension or a library, the reads before and after
    /// showed different calls; in Python code, neither read merged whole;
    /// or the read after came too late to tell.
    pub moved: u64,
    /// Stacks merged whole.
    pub matched: u64,
    /// Stacks whose native walk ended early (marked in the stack).
    pub native_truncated: u64,
    /// Stacks that could not be matched (marked in the stack).
    pub unmatched: u64,
}

struct ModInfo {
    /// Path as the target sees it (`[vdso]` for the vDSO).
    path: String,
    /// Whether it is the module the interpreter runs from.
    interp: bool,
    /// Loaded the first time a frame of the module is named.
    symbols: Option<Symbols>,
    /// Where the file can be opened from here.
    file: PathBuf,
    /// The interpreter's evaluation function (see [`EVAL`]), as ELF
    /// virtual addresses.
    eval: Option<(u64, u64)>,
}

/// A compiled module and its longest FDE (see [`EVAL`]).
type Compiled = (Module, Option<(u64, u64)>);

/// A native frame as named at sampling time.
#[derive(Clone)]
struct Named {
    frame: Frame,
    kind: Kind,
}

/// Native unwinding of one target process.
pub struct Native {
    pid: i32,
    /// The interpreter's module, as the target maps it.
    interp_path: String,
    set: ModuleSet,
    /// Parallel to `set.modules()`.
    info: Vec<ModInfo>,
    /// Compiled modules by (path, bias), kept across re-reads, with their
    /// longest FDE.
    compiled: HashMap<(PathBuf, u64), Compiled>,
    names: HashMap<(u64, bool), Named>,
    scanned: Option<Instant>,
    /// `/proc/<pid>/maps` as of the last re-read.
    maps: String,
    /// Compiled tables on disk (see `osprey_unwind::cache`).
    disk: Option<osprey_unwind::cache::Cache>,
    /// A walk met code outside every module since the last re-read.
    unknown_code: bool,
    /// Each running thread's one-shot sample (None where it could not be
    /// opened: that thread is stopped instead) and when it was last armed
    /// (a count of arms).
    shots: HashMap<i32, (Option<osprey_perf::OneShot>, u64)>,
    arms: u64,
    /// The one-shot sample last taken, not unwound yet.
    taken: Taken,
    /// Why the last one-shot sample could not be opened.
    pub shot_error: Option<String>,
    /// How merges went.
    pub stats: NativeStats,
}

impl Native {
    /// `interp_path`: the module defining `_PyRuntime`, as mapped by the
    /// target.
    pub fn new(pid: i32, interp_path: &str) -> Native {
        let mut n = Native {
            pid,
            interp_path: interp_path.to_string(),
            set: ModuleSet::default(),
            info: Vec::new(),
            compiled: HashMap::new(),
            names: HashMap::new(),
            scanned: None,
            maps: String::new(),
            disk: osprey_unwind::cache::Cache::open_default(),
            unknown_code: false,
            shots: HashMap::new(),
            arms: 0,
            taken: Taken::default(),
            shot_error: None,
            stats: NativeStats::default(),
        };
        n.rescan();
        n
    }

    /// Number of modules with unwind tables.
    pub fn modules(&self) -> usize {
        self.set.modules().len()
    }

    fn due(&self) -> bool {
        self.scanned.is_none_or(|t| {
            let e = t.elapsed();
            e >= RESCAN || (self.unknown_code && e >= Duration::from_secs(1))
        })
    }

    /// Re-reads the target's modules when its mappings changed, compiling
    /// the new ones.
    fn rescan(&mut self) {
        self.scanned = Some(Instant::now());
        self.unknown_code = false;
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) else { return };
        if maps == self.maps {
            return;
        }
        let loaded = loaded_from(self.pid as u32, &maps);
        let vdso = vdso(&maps);
        self.maps = maps;
        let debug_root = file_of(self.pid as u32, Path::new(DEBUG_ROOT));
        let mut compiled = HashMap::new();
        for l in loaded.into_iter().chain(vdso) {
            let key = (l.path.clone(), l.bias);
            let entry = match self.compiled.remove(&key) {
                Some(e) => e,
                None => {
                    let file = file_of(self.pid as u32, &l.path);
                    let c = match l.image {
                        Some((lo, hi)) => self.read_image(lo, hi).and_then(|b| compile_elf(&l.path, &b, None).ok()),
                        None => match &self.disk {
                            Some(d) => d.compile_file(&file, Some(&debug_root)).ok(),
                            None => compile_file(&file, Some(&debug_root)).ok(),
                        },
                    };
                    let Some(c) = c else { continue };
                    let m = Module {
                        path: l.path.clone(),
                        start: l.start,
                        end: l.end,
                        bias: l.bias,
                        build_id: c.build_id.map(Into::into),
                        table: c.table,
                    };
                    (m, c.largest_fde)
                }
            };
            compiled.insert(key, entry);
        }
        self.set = ModuleSet::new(compiled.values().map(|e| e.0.clone()).collect());
        let mut old: HashMap<String, ModInfo> = self.info.drain(..).map(|i| (i.path.clone(), i)).collect();
        self.info = self
            .set
            .modules()
            .iter()
            .map(|m| {
                let path = m.path.to_string_lossy().into_owned();
                let interp = path == self.interp_path;
                let eval = compiled.get(&(m.path.clone(), m.bias)).and_then(|e| e.1).filter(|_| interp);
                old.remove(&path).unwrap_or_else(|| ModInfo {
                    interp,
                    file: file_of(self.pid as u32, &m.path),
                    path,
                    symbols: None,
                    eval,
                })
            })
            .collect();
        self.compiled = compiled;
        // Names depend on where modules are.
        self.names.clear();
    }

    fn read_image(&self, lo: u64, hi: u64) -> Option<Vec<u8>> {
        let len = usize::try_from(hi.checked_sub(lo)?).ok().filter(|&l| l <= 1 << 20)?;
        crate::remote::process::Mem::new(self.pid).read_vec(lo, len).ok()
    }

    /// Re-reads the modules when due: called before a thread is stopped,
    /// never while one is.
    pub fn prepare(&mut self) {
        if self.due() {
            self.rescan();
        }
    }

    /// Unwinds the stopped thread: frames leaf first, and whether the walk
    /// reached the outermost frame.
    pub fn unwind(&mut self, stopped: &Stopped) -> Option<(Vec<u64>, bool)> {
        let r = stopped.regs().ok()?;
        let mut stack = RemoteStack { pid: self.pid, base: r.rsp & !7, bytes: Vec::new(), end: false };
        let walked = walk(&self.set, Regs { pc: r.rip, sp: r.rsp, fp: r.rbp }, |a| stack.read(a));
        Some(self.walked(walked))
    }

    /// Arms running thread `tid`'s one-shot sample (opened the first time),
    /// just after its Python stack is read. False where none can be opened:
    /// the caller stops the thread instead.
    pub fn arm(&mut self, tid: i32) -> bool {
        self.shot(tid).is_some_and(|s| s.arm().is_ok())
    }

    /// Whether a one-shot sample can be armed for `tid` (its event opened).
    pub fn can_arm(&mut self, tid: i32) -> bool {
        self.shot(tid).is_some()
    }

    /// The one-shot event of `tid`, opened at its first use (the least
    /// recently armed one closed past [`MAX_SHOTS`]); None if it cannot be.
    fn shot(&mut self, tid: i32) -> Option<&mut osprey_perf::OneShot> {
        self.arms += 1;
        if !self.shots.contains_key(&tid) && self.shots.len() >= MAX_SHOTS {
            if let Some(oldest) = self.shots.iter().min_by_key(|(_, s)| s.1).map(|(&t, _)| t) {
                self.shots.remove(&oldest);
            }
        }
        let error = &mut self.shot_error;
        let shot = self.shots.entry(tid).or_insert_with(|| {
            (osprey_perf::OneShot::open(tid as u32, SHOT_STACK).map_err(|e| *error = Some(e.to_string())).ok(), 0)
        });
        shot.1 = self.arms;
        shot.0.as_mut()
    }

    /// Takes the sample armed for `tid`: its registers and stack are kept
    /// for [`Native::unwind_taken`] (unwound after the next Python read, so
    /// that the read follows the sample closely). Returns when the sample
    /// was taken (`CLOCK_MONOTONIC` ns); None if the thread did not run the
    /// 10 µs the sample waits for within [`SHOT_WAIT`].
    pub fn take(&mut self, tid: i32) -> Option<u64> {
        let shot = self.shots.get_mut(&tid)?.0.as_mut()?;
        let taken = &mut self.taken;
        taken.regs = None;
        let _ = shot.take(SHOT_WAIT, |s| {
            let Some(r) = s.regs else { return };
            taken.regs = Some((Regs { pc: r.ip, sp: r.sp, fp: r.bp }, s.time));
            taken.stack.clear();
            taken.stack.extend_from_slice(s.stack);
        });
        match taken.regs {
            Some((_, time)) => Some(time),
            None => {
                self.stats.missed += 1;
                None
            }
        }
    }

    /// The native stack of the sample last taken (as [`Native::unwind`]).
    pub fn unwind_taken(&mut self) -> Option<(Vec<u64>, bool)> {
        let (regs, _) = self.taken.regs.take()?;
        let (base, copy) = (regs.sp, &self.taken.stack);
        let read = |a: u64| {
            let off = usize::try_from(a.checked_sub(base)?).ok()?;
            Some(u64::from_le_bytes(copy.get(off..off.checked_add(8)?)?.try_into().ok()?))
        };
        let walked = walk(&self.set, regs, read);
        Some(self.walked(walked))
    }

    /// For a sample in Python code (the native frames above the innermost
    /// call of the evaluation function all the interpreter's own, no C
    /// extension or library): its calls of the evaluation function, which a
    /// Python stack must have as many groups of to be merged with it.
    pub fn in_python(&mut self, native: &[u64]) -> Option<usize> {
        // Leaf first: the interpreter's own frames, then an evaluation call.
        let mut evals = 0;
        let mut leaf = None;
        for (i, &pc) in native.iter().enumerate() {
            let kind = self.name(pc, i > 0).kind;
            if leaf.is_none() && kind != Kind::Interp {
                leaf = Some(kind);
            }
            evals += usize::from(kind == Kind::Eval);
        }
        (leaf? == Kind::Eval).then_some(evals)
    }

    /// Drops the one-shot samples of threads not in `tids`.
    pub fn retain_threads(&mut self, tids: &[i32]) {
        self.shots.retain(|t, _| tids.contains(t));
    }

    /// Notes code outside every module.
    fn walked(&mut self, (frames, complete): (Vec<u64>, bool)) -> (Vec<u64>, bool) {
        if !complete && frames.last().is_some_and(|&pc| self.set.module_for(pc).is_none()) {
            self.unknown_code = true;
        }
        (frames, complete)
    }

    /// The merged stack (see [`merge`]).
    pub fn merge(&mut self, native: &[u64], native_complete: bool, py: &Stack) -> Vec<Frame> {
        let named: Vec<(Frame, Kind)> = native
            .iter()
            .enumerate()
            .map(|(i, &pc)| {
                let n = self.name(pc, i > 0);
                (n.frame, n.kind)
            })
            .collect();
        let (frames, outcome) =
            merge::merge(&named, native_complete, &py.frames, &py.evals, py.truncated.is_none(), |m| {
                Frame::Synthetic(m.to_string())
            });
        self.stats.unwound += 1;
        match outcome {
            Outcome::Matched => self.stats.matched += 1,
            Outcome::NativeTruncated => self.stats.native_truncated += 1,
            Outcome::Unmatched => self.stats.unmatched += 1,
        }
        frames
    }

    fn name(&mut self, pc: u64, ret: bool) -> Named {
        if let Some(n) = self.names.get(&(pc, ret)) {
            return n.clone();
        }
        let at = if ret { pc.wrapping_sub(1) } else { pc };
        let n = match self.set.index_for(at) {
            Some(i) => {
                let bias = self.set.modules()[i].bias;
                let info = &mut self.info[i];
                let syms = info.symbols.get_or_insert_with(|| {
                    let root = file_of(self.pid as u32, Path::new(DEBUG_ROOT));
                    Symbols::load_with_debug(&info.file, Some(&root)).unwrap_or_default()
                });
                let svma = at.wrapping_sub(bias);
                let sym = syms.lookup(svma).map(|s| s.0);
                let eval = info.eval.is_some_and(|(a, b)| (a..b).contains(&svma))
                    || sym.is_some_and(|s| s.strip_prefix(EVAL).is_some_and(|r| r.starts_with(".cold")));
                let kind = match (info.interp, eval) {
                    (true, true) => Kind::Eval,
                    (true, false) => Kind::Interp,
                    _ => Kind::Other,
                };
                let name = match sym {
                    Some(s) => s.to_string(),
                    None if eval => EVAL.to_string(),
                    None => module_offset_name(Path::new(&info.path), svma),
                };
                Named { frame: Frame::Function { name, file: info.path.clone(), line: 0 }, kind }
            }
            None => Named {
                frame: Frame::Function { name: format!("{pc:#x}"), file: String::new(), line: 0 },
                kind: Kind::Other,
            },
        };
        if self.names.len() >= MAX_NAMES {
            self.names.clear();
        }
        self.names.insert((pc, ret), n.clone());
        n
    }
}

/// Walks a stack from `regs` with `read` over its memory: frames leaf
/// first, and whether the walk reached the outermost frame.
fn walk(set: &ModuleSet, regs: Regs, read: impl FnMut(u64) -> Option<u64>) -> (Vec<u64>, bool) {
    let mut frames = vec![0u64; MAX_FRAMES];
    let w = unwind(set, regs, read, &mut frames);
    frames.truncate(w.len);
    (frames, !w.truncated)
}

/// A one-shot sample's registers (with when it was taken) and stack copy;
/// the buffer is reused from sample to sample.
#[derive(Default)]
struct Taken {
    regs: Option<(Regs, u64)>,
    stack: Vec<u8>,
}

/// The vDSO's mapping in `maps`, if any (its image is read from the target).
fn vdso(maps: &str) -> Option<osprey_unwind::scan::Loaded> {
    let e = osprey_procfs::maps::entries(maps.as_bytes()).find(|e| e.path == b"[vdso]")?;
    let (start, end) = (e.start, e.end);
    Some(osprey_unwind::scan::Loaded { path: "[vdso]".into(), bias: start, start, end, image: Some((start, end)) })
}

/// The stopped thread's stack, copied from its stack pointer upwards a
/// chunk at a time as the walk climbs.
struct RemoteStack {
    pid: i32,
    base: u64,
    bytes: Vec<u8>,
    /// The mapping ended (a read came short).
    end: bool,
}

impl RemoteStack {
    fn read(&mut self, addr: u64) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok().filter(|&o| o < MAX_STACK)?;
        while off + 8 > self.bytes.len() {
            if self.end || self.bytes.len() >= MAX_STACK {
                return None;
            }
            self.fetch();
        }
        let b = self.bytes.get(off..off + 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    fn fetch(&mut self) {
        let at = self.base + self.bytes.len() as u64;
        // Up to the next chunk boundary, so that reads stay page-aligned.
        let want = CHUNK - (at as usize % CHUNK);
        let old = self.bytes.len();
        self.bytes.resize(old + want, 0);
        let local = libc::iovec { iov_base: self.bytes[old..].as_mut_ptr().cast(), iov_len: want };
        let remote = libc::iovec { iov_base: at as usize as *mut libc::c_void, iov_len: want };
        // SAFETY: `local` is the tail of `bytes`, owned here; the remote iovec
        // is only interpreted by the kernel.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        let n = usize::try_from(n).unwrap_or(0);
        if n < want {
            self.end = true;
            // Partial reads stop at a page boundary: keep the whole words.
            self.bytes.truncate(old + n / 8 * 8);
        }
    }
}

impl std::fmt::Debug for Native {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Native").field("pid", &self.pid).field("modules", &self.modules()).finish()
    }
}
