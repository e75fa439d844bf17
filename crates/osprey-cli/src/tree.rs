//! The processes `osprey exec` watches, and the CPython ones among them.
//!
//! Invariants:
//! - without `--children` only the command's own pid is watched (through
//!   every program it execs); with it, every descendant: a process whose
//!   parent chain, as first seen, leads to the command, including orphans
//!   reparented later;
//! - a process is judged by the image it runs now: an exec (a new exe, or the
//!   same exe mapped afresh) is a new image, and a sampler attached to the
//!   previous one is stopped;
//! - each CPython image gets one sampler thread, attached once.

use osprey_procfs::stat::{self, Stat};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Identity of the image a process runs: exe path and where its code and
/// stack were mapped (fresh at every exec, with ASLR).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Image {
    exe: String,
    startcode: u64,
    startstack: u64,
}

/// The `stat` of the process's main thread. The process's own `stat` sums
/// CPU times over all its threads (0.2 ms at 1000 threads, every scan); the
/// fields read here are the process's either way (an exec runs on as the
/// thread whose tid is the pid).
fn main_thread_stat(pid: i32) -> Option<Vec<u8>> {
    stat::read_task(pid, pid).ok()
}

fn image(pid: i32) -> Option<Image> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?.to_string_lossy().into_owned();
    let text = main_thread_stat(pid)?;
    let stat = Stat::parse(&text)?;
    Some(Image { exe, startcode: stat.startcode()?, startstack: stat.startstack()? })
}

/// Whether this kernel has `/proc/PID/task/TID/children` (`CONFIG_PROC_CHILDREN`).
fn children_files() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::path::Path::new("/proc/thread-self/children").exists())
}

/// The children of every thread of `pid` (`/proc/PID/task/TID/children`);
/// `None` if the process is gone.
fn children_of(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let path = t.path().join("children");
        if let Ok(text) = osprey_procfs::read_file(&path) {
            let text = String::from_utf8_lossy(&text);
            out.extend(text.split_ascii_whitespace().filter_map(|c| c.parse::<i32>().ok()));
        }
    }
    Some(out)
}

/// An image whose executable is not CPython's. A program that embeds
/// CPython loads libpython itself: its map is read once it has lived
/// [`EMBEDDED_AFTER`], so the tree's short commands (a build's compilers, a
/// script's tools) cost no map read.
struct Native {
    image: Image,
    seen: std::time::Instant,
    maps_read: bool,
}

/// When an image's map is read for a libpython it loaded itself.
const EMBEDDED_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// One Python sampler thread.
struct Sampler {
    image: Image,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Result<osprey_python::Summary, osprey_python::Error>, Vec<osprey_upload::BackendStats>)>,
}

/// What a finished sampler reports.
pub struct Finished {
    pub pid: i32,
    pub root: bool,
    pub result: Result<osprey_python::Summary, osprey_python::Error>,
    /// What its profiles' delivery to the backends did (empty without one).
    pub uploads: Vec<osprey_upload::BackendStats>,
}

pub struct Tree {
    root: i32,
    children: bool,
    opts: osprey_python::Options,
    /// Where each sampler's profiles go (files and/or backends).
    up: osprey_upload::UploadConfig,
    /// The descendants found so far (orphans stay: their parent was one).
    members: Vec<i32>,
    /// Without `children` files: the parent of every pid seen in `/proc` (as first seen).
    parents: HashMap<i32, i32>,
    /// Images already judged not to be CPython.
    native: HashMap<i32, Native>,
    samplers: HashMap<i32, Sampler>,
    /// Samplers told to stop (their process exec'd), not yet ended.
    stopping: Vec<(i32, Sampler)>,
    finished: Vec<Finished>,
    /// How many processes the previous scan watched.
    last_watched: usize,
}

impl Tree {
    pub fn new(root: i32, children: bool, opts: osprey_python::Options, up: osprey_upload::UploadConfig) -> Tree {
        Tree {
            root,
            children,
            opts,
            up,
            members: Vec::new(),
            parents: HashMap::new(),
            native: HashMap::new(),
            samplers: HashMap::new(),
            stopping: Vec::new(),
            finished: Vec::new(),
            last_watched: 0,
        }
    }

    /// The watched pids: the root, and with `--children` its descendants,
    /// found through the `children` files of the tree's threads (the
    /// tree's own `/proc` entries, not the machine's). A process whose
    /// parent ended before it was seen is not found, as it would not be by
    /// its parent pid either.
    fn watched(&mut self) -> Vec<i32> {
        if !self.children {
            return vec![self.root];
        }
        if !children_files() {
            return self.by_parent_pids();
        }
        let mut out = vec![self.root];
        out.extend(self.members.iter().copied().filter(|&p| p != self.root));
        let mut seen: HashSet<i32> = out.iter().copied().collect();
        let mut live = Vec::with_capacity(out.len());
        let mut i = 0;
        while i < out.len() {
            let pid = out[i];
            i += 1;
            let Some(children) = children_of(pid) else { continue };
            live.push(pid);
            out.extend(children.into_iter().filter(|c| seen.insert(*c)));
        }
        self.members = live.clone();
        live
    }

    /// [`Tree::watched`] without `children` files (a kernel built without
    /// them): every pid of `/proc` and its parent, as first seen.
    fn by_parent_pids(&mut self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return vec![self.root] };
        let live: HashSet<i32> =
            dir.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect();
        self.parents.retain(|p, _| live.contains(p));
        for &p in &live {
            if let std::collections::hash_map::Entry::Vacant(v) = self.parents.entry(p) {
                if let Some(pp) = Stat::parse(&main_thread_stat(p).unwrap_or_default()).and_then(|s| s.ppid()) {
                    v.insert(pp);
                }
            }
        }
        let mut out = vec![self.root];
        let mut i = 0;
        while i < out.len() {
            let parent = out[i];
            out.extend(self.parents.iter().filter(|(c, pp)| **pp == parent && **c != parent).map(|(c, _)| *c));
            i += 1;
        }
        out
    }

    /// Looks for new CPython images among the watched processes and starts a
    /// sampler on each; collects samplers whose process ended. Returns
    /// whether anything changed (a new process or image, a sampler ended).
    pub fn scan(&mut self) -> bool {
        let pids = self.watched();
        let mut changed = pids.len() != self.last_watched;
        self.last_watched = pids.len();
        for pid in pids {
            let Some(img) = image(pid) else { continue };
            if let Some(n) = self.native.get_mut(&pid).filter(|n| n.image == img) {
                if n.maps_read || n.seen.elapsed() < EMBEDDED_AFTER {
                    continue;
                }
                n.maps_read = true;
                if osprey_python::maps_libpython(pid) {
                    changed = true;
                    self.native.remove(&pid);
                    self.start(pid, img);
                }
                continue;
            }
            if self.samplers.get(&pid).is_some_and(|s| s.image == img) {
                continue;
            }
            changed = true;
            if self.samplers.contains_key(&pid) {
                // Told to stop, not waited for: it may still be waiting for
                // the old image's interpreter to start.
                let s = self.samplers.remove(&pid).expect("present");
                s.stop.store(true, Ordering::SeqCst);
                self.stopping.push((pid, s));
            }
            if osprey_python::runs_cpython_executable(pid) {
                self.start(pid, img);
            } else {
                self.native.insert(pid, Native { image: img, seen: std::time::Instant::now(), maps_read: false });
            }
        }
        let done: Vec<i32> = self.samplers.iter().filter(|(_, s)| s.thread.is_finished()).map(|(p, _)| *p).collect();
        changed |= !done.is_empty();
        for pid in done {
            self.stop_one(pid);
        }
        let (ended, running): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.stopping).into_iter().partition(|(_, s)| s.thread.is_finished());
        self.stopping = running;
        changed |= !ended.is_empty();
        for (pid, s) in ended {
            self.join(pid, s);
        }
        changed
    }

    fn start(&mut self, pid: i32, image: Image) {
        let stop = Arc::new(AtomicBool::new(false));
        let (opts, flag, up) = (self.opts.clone(), stop.clone(), self.up.clone());
        let thread = std::thread::Builder::new().name(format!("py-{pid}")).spawn(move || {
            // Each CPython process delivers its own profiles, with its own
            // runtime id; at the end the uploader gets at most `exit_wait`.
            let meta = osprey_upload::Meta::new(osprey_upload::new_runtime_id(), pid, osprey_upload::Language::Python);
            let mut delivery = osprey_upload::Delivery::new(up, meta, opts.period);
            let result = osprey_python::attach_with_sink(pid, &opts, &flag, &mut |data| delivery.flush(data, Vec::new));
            let uploads = delivery.finish();
            (result, uploads)
        });
        match thread {
            Ok(thread) => {
                self.samplers.insert(pid, Sampler { image, stop, thread });
            }
            Err(e) => {
                self.finished.push(Finished { pid, root: pid == self.root, result: Err(e.into()), uploads: Vec::new() })
            }
        }
    }

    fn stop_one(&mut self, pid: i32) {
        if let Some(s) = self.samplers.remove(&pid) {
            s.stop.store(true, Ordering::SeqCst);
            self.join(pid, s);
        }
    }

    fn join(&mut self, pid: i32, s: Sampler) {
        let (result, uploads) =
            s.thread.join().unwrap_or_else(|_| (Err(std::io::Error::other("sampler panicked").into()), Vec::new()));
        self.finished.push(Finished { pid, root: pid == self.root, result, uploads });
    }

    /// Stops every sampler (each writes its last profile) and returns what
    /// all of them reported.
    pub fn finish(mut self) -> Vec<Finished> {
        let pids: Vec<i32> = self.samplers.keys().copied().collect();
        for s in self.samplers.values() {
            s.stop.store(true, Ordering::SeqCst);
        }
        for pid in pids {
            self.stop_one(pid);
        }
        for (pid, s) in std::mem::take(&mut self.stopping) {
            self.join(pid, s);
        }
        self.finished
    }
}
