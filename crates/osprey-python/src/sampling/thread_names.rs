//! Python thread names (`threading.Thread.name`), read from the target.
//!
//! Each interpreter's `sys.modules` (the interpreter state's `modules`, or
//! `sysdict["modules"]`) holds the `threading` module, whose `_active` dict
//! maps a thread's ident (`pthread_self()`, the thread state's `thread_id`)
//! to its `Thread` object, whose `_name` attribute is its name.
//!
//! Invariants: names are read at most every [`REFRESH`], or [`RETRY`] after
//! the previous read when a new OS thread appears (or a new thread state
//! had no name yet, once per thread state); never while sampling a thread.
//! A read does at most [`BUDGET`] memory reads. A thread whose name cannot
//! be read keeps the name it had (same thread state and ident), else has
//! none: the sample then carries the OS thread name. Failures are silent.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use crate::target::pyobject::{Long, Reader};
use crate::target::thread_states::list_tstates;
use crate::target::Target;

/// Names are re-read this often (renamed threads show within it).
pub const REFRESH: Duration = Duration::from_secs(1);
/// Shortest gap between two reads (when new threads appear).
pub const RETRY: Duration = Duration::from_millis(50);
/// Memory reads per refresh, at most.
pub const BUDGET: u32 = 8192;
/// Entries of `threading._active` read per interpreter, at most.
pub const MAX_THREADS: usize = 512;
/// Interpreters looked into, at most.
const MAX_INTERPS: usize = 16;
/// Characters of a name kept (a longer one is cut).
const MAX_NAME: usize = 256;

/// What refreshing has cost so far.
#[derive(Clone, Debug, Default)]
pub struct NameStats {
    /// Refreshes done.
    pub refreshes: u64,
    /// Memory reads done by them.
    pub reads: u64,
    /// Time they took.
    pub time: Duration,
    /// Interpreters whose names could not be read (summed over refreshes).
    pub failures: u64,
}

/// Key objects found last time (interned strings: the same objects).
#[derive(Default)]
struct Hints {
    threading: u64,
    active: u64,
    name: u64,
    modules: u64,
}

/// Names by thread ident in one interpreter: `Some(name)`, or `None` for a
/// thread in `_active` whose name could not be read.
type ByIdent = HashMap<u64, Option<String>>;

/// The Python name of each thread state, refreshed from the target.
#[derive(Default)]
pub struct ThreadNames {
    /// Thread state address -> (its `thread_id`, its name).
    names: HashMap<u64, (u64, String)>,
    refreshed: Option<Instant>,
    /// An earlier refresh is wanted from this time (a new thread state
    /// without a name yet).
    retry_at: Option<Instant>,
    /// OS threads present at the last refresh.
    seen: HashSet<i32>,
    /// Thread states already given their extra early refresh.
    retried: HashSet<u64>,
    hints: Hints,
    /// Cost so far.
    pub stats: NameStats,
}

impl ThreadNames {
    /// The Python name of the thread whose state is at `tstate`, if known.
    pub fn name(&self, tstate: u64) -> Option<&str> {
        self.names.get(&tstate).map(|n| n.1.as_str())
    }

    /// Refreshes the names if they are due, given the OS threads `tids`.
    pub fn update(&mut self, t: &Target, tids: &[i32]) {
        let now = Instant::now();
        let due = match self.refreshed {
            None => true,
            Some(at) => {
                let age = now.duration_since(at);
                let new_thread = tids.iter().any(|x| !self.seen.contains(x));
                age >= REFRESH || (age >= RETRY && (new_thread || self.retry_at.is_some_and(|r| now >= r)))
            }
        };
        if due {
            self.seen = tids.iter().copied().collect();
            self.refresh(t);
        }
    }

    /// Reads every interpreter's names now.
    pub fn refresh(&mut self, t: &Target) {
        let start = Instant::now();
        let r = Reader::new(t, BUDGET);
        self.retry_at = None;
        if let Ok(list) = list_tstates(t) {
            let mut interps: Vec<u64> = Vec::new();
            for ts in &list {
                if !interps.contains(&ts.interp) && interps.len() < MAX_INTERPS {
                    interps.push(ts.interp);
                }
            }
            let mut read: HashMap<u64, ByIdent> = HashMap::new();
            for i in interps {
                match self.interp_names(&r, i) {
                    Ok(m) => {
                        read.insert(i, m);
                    }
                    Err(_) => self.stats.failures += 1,
                }
            }
            let mut names = HashMap::new();
            for ts in &list {
                let fresh = match read.get(&ts.interp) {
                    Some(m) => m.get(&ts.thread_id).map(|n| n.as_ref()),
                    // The interpreter could not be read: as if unreadable.
                    None => Some(None),
                };
                match fresh {
                    Some(Some(n)) => {
                        names.insert(ts.addr, (ts.thread_id, n.clone()));
                    }
                    Some(None) => {
                        if let Some(old) = self.names.get(&ts.addr).filter(|o| o.0 == ts.thread_id) {
                            names.insert(ts.addr, old.clone());
                        }
                    }
                    None => {}
                }
            }
            // A new thread may be registering in `threading` right now: one
            // more look soon, once per thread state.
            self.retried.retain(|a| list.iter().any(|ts| ts.addr == *a));
            for ts in list.iter().filter(|ts| !names.contains_key(&ts.addr)) {
                if self.retried.insert(ts.addr) {
                    self.retry_at = Some(Instant::now() + RETRY);
                }
            }
            self.names = names;
        }
        self.refreshed = Some(Instant::now());
        self.stats.refreshes += 1;
        self.stats.reads += r.reads() as u64;
        self.stats.time += start.elapsed();
    }

    /// `threading._active` of interpreter `interp`, as names by ident; empty
    /// when `threading` is not imported.
    fn interp_names(&mut self, r: &Reader, interp: u64) -> io::Result<ByIdent> {
        let Some(active) = self.active_dict(r, interp)? else { return Ok(HashMap::new()) };
        let mut out = HashMap::new();
        for (k, v) in r.dict(active)?.into_iter().take(MAX_THREADS) {
            let Ok(ident) = r.long(k) else { continue };
            let name = r
                .attrs(v)
                .ok()
                .and_then(|attrs| r.find(&attrs, "_name", &mut self.hints.name))
                .and_then(|s| r.str(s, MAX_NAME, Long::Cut).ok());
            out.insert(ident, name);
        }
        Ok(out)
    }

    /// The address of `threading._active` in interpreter `interp`.
    fn active_dict(&mut self, r: &Reader, interp: u64) -> io::Result<Option<u64>> {
        let h = &mut self.hints;
        let Some(module) = r.sys_module(interp, "threading", &mut h.threading, &mut h.modules)? else {
            return Ok(None);
        };
        r.module_global(module, "_active", &mut h.active)
    }
}
