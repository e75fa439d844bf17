//! The native processes of an `osprey exec --children` tree, sampled by the
//! kernel instead of an agent in each (`osprey_perf::TreeSampler`): nothing
//! is preloaded, so a process of the tree pays no agent start, and its
//! samples are in the kernel's rings the moment they are taken (a child
//! killed by SIGKILL loses none).
//!
//! A thread of `osprey exec` reads the rings, follows each process's image
//! from the side-band records (`osprey_perf::Images`), unwinds the samples
//! and, at each end of the period grid, appends one part per process to
//! the spool's journal, which `exec` merges as it merges the agents'
//! (`crate::spool`), and hands each part, named, to the backends as that
//! process's profile (its runtime id, its pid: what an agent in it would
//! have sent). CPython images are left to the Python sampler
//! (`crate::tree`): their samples are dropped here, and their exec or fork
//! wakes `exec`'s loop so that the sampler attaches at once.
//!
//! Every thread's CPU is exact: the kernel reports each thread's count at
//! its exit, and what its samples did not cover (a process shorter than a
//! period, the end of a longer one) is charged to its last sampled stack,
//! or to the program's entry point (`_start`) for a thread never sampled.

use osprey_perf::{Images, RawSample, Record, TreeSampler};
use osprey_pprof::{Frame, Label, LabelValue, ProfileData, Sample};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Stack bytes the kernel copies per sample.
const STACK_BYTES: u32 = 16 << 10;
/// Parts of processes gone that are appended without waiting for the
/// period's end once there are this many.
const FLUSH_PARTS: usize = 256;
/// Longest wait for the rings between two reads.
const READ_EVERY: Duration = Duration::from_millis(50);

/// Opens the tree's events on the calling thread, which must be the one
/// that then spawns the command (see `TreeSampler::open`).
pub fn open(hz: u32) -> Result<TreeSampler, osprey_perf::Error> {
    TreeSampler::open(&osprey_perf::Config::new(hz, STACK_BYTES))
}

/// What the tree's native processes gave.
#[derive(Debug, Default)]
pub struct Totals {
    /// Samples kept (CPython images' excluded).
    pub samples: u64,
    /// Records the kernel dropped, a ring being full.
    pub lost: u64,
    /// Parts appended to the spool.
    pub parts: u64,
    /// What each backend took of the tree's profiles.
    pub uploads: Vec<osprey_upload::BackendStats>,
    /// Parts that could not be written, with why.
    pub errors: Vec<String>,
}

/// The reading thread.
pub struct NativeTree {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Totals>,
}

impl NativeTree {
    /// Reads `sampler`'s rings on a thread of its own, for the tree of
    /// `root`, at `hz`: parts into `spool` (if any) at the ends of `grid`'s
    /// periods, and to the backends `up` names; `lines`: their native frames
    /// get DWARF files, lines and inlined functions where they are named.
    pub fn start(
        sampler: TreeSampler,
        root: u32,
        spool: Option<PathBuf>,
        grid: osprey_pprof::periods::Grid,
        hz: u32,
        lines: bool,
        up: &osprey_upload::UploadConfig,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let uploads = up.uploads().then(|| Uploads::start(up, root, grid));
        let exit_wait = up.exit_wait;
        let thread = std::thread::Builder::new()
            .name("osprey-tree".into())
            .spawn(move || {
                let mut r = Reader::new(root, spool, uploads, grid, hz, lines);
                r.run(sampler, &stopped);
                if let Some(u) = r.uploads.as_mut() {
                    r.totals.uploads = u.uploader.shutdown(exit_wait);
                }
                r.totals
            })
            .expect("spawn the tree's reader thread");
        NativeTree { stop, thread }
    }

    /// Reads what is left (the command has ended), writes the last parts.
    pub fn finish(self) -> Totals {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .join()
            .unwrap_or_else(|_| Totals { errors: vec!["the tree's reader thread failed".into()], ..Totals::default() })
    }
}

/// The tree's backends: one uploader for every process, each profile
/// sent as its process's.
struct Uploads {
    uploader: osprey_upload::Uploader,
    host: String,
    deployment: osprey_upload::Deployment,
}

impl Uploads {
    /// Up to this many of the tree's profiles wait for a backend (within
    /// the configured bytes): a period's end hands over one per process.
    const QUEUE: usize = 4096;

    fn start(up: &osprey_upload::UploadConfig, root: u32, grid: osprey_pprof::periods::Grid) -> Uploads {
        let mut cfg = up.clone();
        cfg.queue_profiles = cfg.queue_profiles.max(Self::QUEUE);
        let meta =
            osprey_upload::Meta::new(osprey_upload::new_runtime_id(), root as i32, osprey_upload::Language::Native);
        let (host, deployment) = (meta.host.clone(), meta.deployment.clone());
        Uploads { uploader: osprey_upload::Uploader::start(cfg, meta, grid.period()), host, deployment }
    }

    /// Queues `part` (named) as its process's profile.
    fn submit(&self, part: &Part, profile: &mut osprey_pprof::pprof::Profile) {
        let meta = osprey_upload::Meta {
            runtime_id: part.runtime_id.clone(),
            pid: part.pid as i32,
            language: osprey_upload::Language::Native,
            host: self.host.clone(),
            deployment: self.deployment.clone(),
        };
        let mut comments = self.deployment.comments();
        comments.extend(self.uploader.take_comments());
        osprey_upload::add_comments(profile, &comments);
        self.uploader.submit_for(Arc::new(meta), prost::Message::encode_to_vec(&*profile), part.start_ns, part.end_ns);
    }
}

/// One process's part of a period.
struct Part {
    pid: u32,
    runtime_id: String,
    start_ns: i64,
    end_ns: i64,
    profile: osprey_pprof::pprof::Profile,
}

/// Samples merged by thread, stack (leaf first) and cut or not.
type Key = (u32, Vec<u64>, bool);

/// One process of the tree, across periods.
#[derive(Default)]
struct Proc {
    /// Its image is CPython's: sampled by the Python sampler, not here.
    python: bool,
    /// Given when it starts, and again at each exec: `runtime-id` of its parts.
    runtime_id: String,
    /// This period's samples: (count, CPU ns).
    pending: HashMap<Key, (i64, i64)>,
    /// CPU each thread's samples stood for, and what the kernel counted at
    /// its exit.
    sampled: HashMap<u32, u64>,
    counted: HashMap<u32, u64>,
    /// Each thread's last stack: where what its samples missed is charged.
    last: HashMap<u32, (Vec<u64>, bool)>,
    /// Threads charged at their exit by the last part, forgotten by the
    /// next (the count of each CPU's copy comes in a record of its own).
    exited: Vec<u32>,
    /// Its map was read from `/proc` once (records were lost).
    filled: bool,
    /// When its main thread exited (`CLOCK_MONOTONIC` ns).
    exit_time: Option<u64>,
}

struct Reader {
    root: u32,
    spool: Option<PathBuf>,
    uploads: Option<Uploads>,
    grid: osprey_pprof::periods::Grid,
    hz: u32,
    /// DWARF lines asked for (`--lines`).
    lines: bool,
    images: Images,
    procs: HashMap<u32, Proc>,
    /// The processes of the tree: the root and what it started.
    tree: std::collections::HashSet<u32>,
    /// Monotonic ns of the end of the period being filled.
    period_end: u64,
    /// Wall-clock start of that period, ns since the epoch.
    period_start_realtime: i64,
    /// CPython or not, by executable.
    cpython: HashMap<PathBuf, bool>,
    /// Build ids read from files (hex), when the records had none.
    build_ids: HashMap<PathBuf, Option<String>>,
    /// Parts not yet written: appended to the journal together at the
    /// period's end (and named together for the backends).
    parts: Vec<Part>,
    /// Records the kernel dropped so far (a full ring).
    lost: u64,
    totals: Totals,
}

impl Reader {
    fn new(
        root: u32,
        spool: Option<PathBuf>,
        uploads: Option<Uploads>,
        grid: osprey_pprof::periods::Grid,
        hz: u32,
        lines: bool,
    ) -> Reader {
        let now = osprey_pprof::periods::monotonic_ns();
        Reader {
            root,
            spool,
            uploads,
            grid,
            hz,
            lines,
            images: Images::default(),
            procs: HashMap::new(),
            tree: [root].into(),
            period_end: grid.next_end(now),
            period_start_realtime: realtime_ns(),
            cpython: HashMap::new(),
            build_ids: HashMap::new(),
            parts: Vec::new(),
            lost: 0,
            totals: Totals::default(),
        }
    }

    fn run(&mut self, mut sampler: TreeSampler, stop: &AtomicBool) {
        loop {
            let ending = stop.load(Ordering::SeqCst);
            if !ending {
                let _ = sampler.wait(READ_EVERY.min(self.until_period_end()));
            }
            sampler.drain(ending, &mut |r| self.record(r));
            // Every record before the period's end is read once the drain's
            // horizon passed it.
            let horizon = osprey_pprof::periods::monotonic_ns().saturating_sub(hold_ns());
            self.reap(horizon.saturating_sub(hold_ns()));
            if ending || horizon >= self.period_end {
                self.write_parts(ending);
                self.period_end = self.grid.next_end(horizon);
            }
            if ending {
                break;
            }
        }
        let c = sampler.counts();
        self.totals.lost = c.lost;
    }

    fn until_period_end(&self) -> Duration {
        let now = osprey_pprof::periods::monotonic_ns();
        Duration::from_nanos(self.period_end.saturating_sub(now) + hold_ns())
    }

    fn record(&mut self, r: Record<'_>) {
        match r {
            Record::Sample(s) => {
                if s.time >= self.period_end {
                    self.write_parts(false);
                    self.period_end = self.grid.next_end(s.time);
                }
                self.sample(&s);
            }
            Record::Task(t) if !t.exit => {
                if t.pid != t.ppid && !self.tree.contains(&t.ppid) {
                    return; // not of the command's tree
                }
                if t.pid != t.ppid && self.procs.contains_key(&t.pid) {
                    // A pid used again: what its last process left goes first.
                    self.write_part(t.pid);
                    self.procs.remove(&t.pid);
                }
                self.tree.insert(t.pid);
                self.images.task(&t);
                if t.pid != t.ppid {
                    let python = self.procs.get(&t.ppid).is_some_and(|p| p.python);
                    let runtime_id = osprey_upload::new_runtime_id();
                    self.procs.insert(t.pid, Proc { python, runtime_id, ..Proc::default() });
                    if python {
                        wake_exec();
                    }
                }
            }
            Record::Task(t) if self.tree.contains(&t.pid) => {
                self.images.task(&t);
                if t.tid == t.pid {
                    self.procs.entry(t.pid).or_default().exit_time = Some(t.time);
                }
            }
            Record::Comm(c) => {
                if !self.tree.contains(&c.pid) {
                    return;
                }
                if c.exec {
                    // The old image's samples go with its name and mappings.
                    self.write_part(c.pid);
                    let p = self.procs.entry(c.pid).or_default();
                    p.runtime_id = osprey_upload::new_runtime_id();
                    p.python = false;
                    // Stacks of the old image are no place to charge the new one's CPU.
                    p.last.clear();
                }
                self.images.comm(&c);
            }
            Record::Mmap(m) => {
                if !self.tree.contains(&m.pid) {
                    return;
                }
                let first = self.images.exe(m.pid).is_none();
                self.images.mmap(&m);
                if let (true, Some(exe)) = (first, self.images.exe(m.pid).map(Path::to_path_buf)) {
                    let python =
                        *self.cpython.entry(exe.clone()).or_insert_with(|| osprey_python::is_cpython_executable(&exe));
                    if python {
                        self.procs.entry(m.pid).or_default().python = true;
                        wake_exec();
                    }
                }
            }
            Record::Lost(n) => self.lost += n,
            Record::Read(r) => {
                if let Some(p) = self.procs.get_mut(&r.pid) {
                    *p.counted.entry(r.tid).or_default() += r.value;
                }
            }
            _ => {}
        }
    }

    fn sample(&mut self, s: &RawSample<'_>) {
        if !self.tree.contains(&s.pid) {
            return;
        }
        let p = self.procs.entry(s.pid).or_default();
        *p.sampled.entry(s.tid).or_default() += s.period;
        if p.python {
            return;
        }
        let mut st = self.images.unwind(s);
        let unmapped = |images: &Images, pcs: &[u64]| {
            pcs.first().is_some_and(|&pc| !images.mappings(s.pid).iter().any(|m| m.start <= pc && pc < m.end))
        };
        // Mapping records lost with a full ring: the process's own map, once
        // per process while it lives.
        if unmapped(&self.images, &st.pcs) && self.may_fill(s.pid) && self.images.fill_from_proc(s.pid) {
            st = self.images.unwind(s);
        }
        // A sample in the kernel during an exec has the old image's user
        // registers: CPU the new image spends starting, charged to its entry.
        if unmapped(&self.images, &st.pcs) {
            st.pcs = self.images.entry(s.pid).into_iter().collect();
            st.truncated = st.pcs.is_empty();
        }
        let p = self.procs.entry(s.pid).or_default();
        let a = p.pending.entry((st.tid, st.pcs.clone(), st.truncated)).or_default();
        a.0 += 1;
        a.1 += st.period as i64;
        p.last.insert(st.tid, (st.pcs, st.truncated));
        self.totals.samples += 1;
    }

    /// Whether `pid`'s map may be read from `/proc`: records were lost
    /// (mappings among them, maybe), and not read for it yet.
    fn may_fill(&mut self, pid: u32) -> bool {
        let lost = self.lost > 0;
        let p = self.procs.entry(pid).or_default();
        lost && !std::mem::replace(&mut p.filled, true)
    }

    /// Writes the period's part of every process, and forgets those gone.
    fn write_parts(&mut self, ending: bool) {
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            self.write_part(pid);
            if self.images.exited(pid) || ending {
                self.forget(pid);
            }
        }
        self.period_start_realtime = realtime_ns();
        self.flush_parts();
    }

    /// Writes the parts of the processes whose main thread exited before
    /// `before` and forgets them: their counts at exit, which follow the
    /// exit, are in by then. What a tree holds is then its live processes,
    /// however many come and go in a period.
    fn reap(&mut self, before: u64) {
        let gone: Vec<u32> =
            self.procs.iter().filter(|(_, p)| p.exit_time.is_some_and(|t| t < before)).map(|(&pid, _)| pid).collect();
        for pid in gone {
            self.write_part(pid);
            self.forget(pid);
        }
        if self.parts.len() >= FLUSH_PARTS {
            self.flush_parts();
        }
    }

    fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.images.forget(pid);
        if pid != self.root {
            self.tree.remove(&pid);
        }
    }

    /// Names (for the backends), sends and appends the parts written so far.
    fn flush_parts(&mut self) {
        let mut parts = std::mem::take(&mut self.parts);
        if parts.is_empty() {
            return;
        }
        if let Some(up) = &self.uploads {
            // The backends want names: the period's parts named together,
            // each file read once (the merge finds nothing left to name).
            let mut profiles: Vec<_> = parts.iter_mut().map(|p| std::mem::take(&mut p.profile)).collect();
            osprey_pprof::deferred::name_parts(&mut profiles);
            for (part, mut profile) in parts.iter_mut().zip(profiles) {
                let named = profile.clone();
                up.submit(part, &mut profile);
                part.profile = named;
            }
        }
        let Some(spool) = &self.spool else { return };
        let encoded: Vec<Vec<u8>> = parts.iter().map(|p| prost::Message::encode_to_vec(&p.profile)).collect();
        let all: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        match osprey_pprof::journal::append_all(spool, osprey_pprof::journal::Kind::Profile, &all) {
            Ok(_) => self.totals.parts += parts.len() as u64,
            Err(e) => self.totals.errors.push(format!("{} parts: {e}", parts.len())),
        }
    }

    /// Charges what `pid`'s threads ran beyond their samples, and appends
    /// its pending samples as one part.
    fn write_part(&mut self, pid: u32) {
        let entry = self.images.entry(pid);
        let Some(p) = self.procs.get_mut(&pid) else { return };
        if p.python {
            p.pending.clear();
            return;
        }
        let previous = std::mem::take(&mut p.exited);
        for (&tid, &counted) in &p.counted {
            p.exited.push(tid);
            let sampled = p.sampled.entry(tid).or_default();
            let rest = counted.saturating_sub(*sampled);
            if rest == 0 {
                continue;
            }
            *sampled = counted;
            let stack = match p.last.get(&tid) {
                Some((pcs, cut)) => (pcs.clone(), *cut),
                None => match entry {
                    Some(e) => (vec![e], false),
                    None => (Vec::new(), true),
                },
            };
            p.pending.entry((tid, stack.0, stack.1)).or_default().1 += rest as i64;
        }
        let pending = std::mem::take(&mut p.pending);
        let runtime_id = p.runtime_id.clone();
        if !pending.is_empty() {
            let data = self.profile(pid, pending, &runtime_id);
            let map = self.map(pid);
            let (start_ns, end_ns) = (data.start_realtime_ns, data.start_realtime_ns + data.duration_ns);
            let profile = osprey_pprof::to_pprof_part_of(&data, &map);
            self.parts.push(Part { pid, runtime_id: runtime_id.clone(), start_ns, end_ns, profile });
        }
        // Threads charged by the part before this one: any count of theirs
        // still to come came since, and was charged above.
        let Some(p) = self.procs.get_mut(&pid) else { return };
        for tid in previous {
            p.counted.remove(&tid);
            p.sampled.remove(&tid);
            p.last.remove(&tid);
            p.exited.retain(|&t| t != tid);
            self.images.forget_thread(pid, tid);
        }
    }

    fn profile(&self, pid: u32, pending: HashMap<Key, (i64, i64)>, runtime_id: &str) -> ProfileData {
        let now = realtime_ns();
        let samples = pending
            .into_iter()
            .map(|((tid, pcs, cut), (count, cpu))| {
                let mut frames: Vec<Frame> =
                    pcs.iter().enumerate().map(|(i, &addr)| Frame::Native { addr, return_address: i > 0 }).collect();
                if cut {
                    frames.push(Frame::Synthetic(osprey::internals::collector::FRAME_TRUNCATED.into()));
                }
                let mut labels = vec![Label { key: "thread id".into(), value: LabelValue::Num(i64::from(tid)) }];
                let name = self.images.thread_name(pid, tid);
                if !name.is_empty() {
                    labels.push(Label { key: "thread name".into(), value: LabelValue::Str(name.into()) });
                }
                Sample { frames, values: vec![count, cpu], labels }
            })
            .collect();
        let mut comments = vec![format!("osprey {} hz={}", env!("CARGO_PKG_VERSION"), self.hz)];
        if !runtime_id.is_empty() {
            comments.insert(0, format!("runtime-id={runtime_id}"));
        }
        ProfileData {
            pid: pid as i32,
            process: Some(self.images.process_name(pid).to_string()),
            sample_types: vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())],
            period: ("cpu".into(), "nanoseconds".into(), 1_000_000_000 / i64::from(self.hz.max(1))),
            start_realtime_ns: self.period_start_realtime,
            duration_ns: (now - self.period_start_realtime).max(0),
            samples,
            comments,
            lines: self.lines,
        }
    }

    /// `pid`'s executable mappings as a map, with their build ids (hex).
    fn map(&mut self, pid: u32) -> osprey_pprof::maps::ProcMaps {
        let mut regions = Vec::new();
        for m in self.images.mappings(pid) {
            let path = m.path.to_string_lossy().into_owned();
            let build_id = match &m.build_id {
                Some(id) => Some(osprey_pprof::build_id::hex(id)),
                None if m.path.is_absolute() => self
                    .build_ids
                    .entry(m.path.clone())
                    .or_insert_with(|| osprey_pprof::build_id::read_hex(&m.path))
                    .clone(),
                None => None,
            };
            regions.push(osprey_pprof::maps::Region {
                start: m.start,
                end: m.end,
                offset: m.pgoff,
                executable: true,
                path,
                deleted: false,
                build_id,
            });
        }
        osprey_pprof::maps::ProcMaps { regions, exe: self.images.exe(pid).map(Path::to_path_buf) }
    }
}

/// How long the sampler holds a record back (see `osprey_perf::TREE_HOLD`).
fn hold_ns() -> u64 {
    osprey_perf::TREE_HOLD.as_nanos() as u64
}

/// Wakes `osprey exec`'s loop (which waits for SIGCHLD among its signals)
/// to scan the tree now: a CPython image for the Python sampler.
fn wake_exec() {
    // SAFETY: a signal to this process, which blocks and waits for it.
    unsafe { libc::kill(libc::getpid(), libc::SIGCHLD) };
}

/// Wall-clock now, ns since the Unix epoch.
fn realtime_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}
