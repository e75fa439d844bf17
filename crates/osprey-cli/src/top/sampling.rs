//! The samplers behind `osprey top`, run on their own thread: a native
//! process through `osprey-perf` (as [`crate::attach_native`]), a CPython one
//! through `osprey-python` (as [`crate::attach`], its profile period set to
//! the refresh interval). Either hands over one [`Interval`] of named stacks
//! per refresh, then [`Event::Ended`] when the target exits or `stop` is set.

use osprey_pprof::{Frame, LabelValue, ProfileData};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stack bytes the kernel copies per native sample (as `attach`).
const STACK_BYTES: u32 = 16 << 10;
/// How often the native thread list and the target's liveness are checked.
const REFRESH: Duration = Duration::from_millis(100);

/// One sampled stack: its thread, its function names (leaf first) and the
/// CPU time it stands for.
#[derive(Clone, Debug)]
pub struct Stack {
    pub tid: u32,
    pub frames: Vec<Arc<str>>,
    pub cpu_ns: u64,
}

/// The samples of one refresh interval.
#[derive(Debug, Default)]
pub struct Interval {
    pub stacks: Vec<Stack>,
    /// Names of the threads seen (OS names; Python thread names for CPython).
    pub names: Vec<(u32, String)>,
    /// Wall time the interval covered.
    pub span: Duration,
}

/// What the sampling thread sends.
pub enum Event {
    Interval(Interval),
    /// The sampler stopped: `Some(why)` if it failed (nothing sampled then).
    Ended(Option<String>),
}

/// What to sample and how.
#[derive(Clone, Copy)]
pub struct Settings {
    pub pid: i32,
    pub hz: u32,
    pub interval: Duration,
    /// CPython: the native frames too (`--native`).
    pub native: bool,
}

/// Starts sampling `s.pid` on a new thread until `stop` or its exit.
pub fn start(s: Settings, stop: &'static AtomicBool, tx: Sender<Event>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let r = if osprey_python::is_cpython_process(s.pid) { python(s, stop, &tx) } else { native(s, stop, &tx) };
        let _ = tx.send(Event::Ended(r.err()));
    })
}

/// Names native pcs once each (a cache over the run).
struct Namer {
    pid: i32,
    names: HashMap<(u64, bool), Arc<str>>,
}

impl Namer {
    /// Names the `(pc, is a return address)` keys not seen before, in one
    /// symbolization pass; `module+0xoffset` or `[unknown]` when unnamed.
    fn name_all(&mut self, keys: impl Iterator<Item = (u64, bool)>, modules: Option<&osprey_unwind::ModuleSet>) {
        let mut new: Vec<(u64, bool)> = keys.filter(|k| !self.names.contains_key(k)).collect();
        if new.is_empty() {
            return;
        }
        new.sort_unstable();
        new.dedup();
        for (k, name) in crate::dump::name_pcs(self.pid, &new, modules) {
            self.names.insert(k, name.into());
        }
    }

    fn name(&self, key: (u64, bool)) -> Arc<str> {
        self.names.get(&key).cloned().unwrap_or_else(|| format!("{:#x}", key.0).into())
    }

    /// The names of native pcs, leaf first.
    fn frames(&self, pcs: &[u64]) -> Vec<Arc<str>> {
        pcs.iter().enumerate().map(|(i, &pc)| self.name((pc, i > 0))).collect()
    }
}

fn native(s: Settings, stop: &AtomicBool, tx: &Sender<Event>) -> Result<(), String> {
    let pid = s.pid;
    let mut sampler =
        osprey_perf::ProcessSampler::attach(pid as u32, s.hz, STACK_BYTES).map_err(|e| format!("pid {pid}: {e}"))?;
    let mut n = Native {
        unwinder: osprey_perf::Unwinder::new(pid as u32),
        namer: Namer { pid, names: HashMap::new() },
        pending: Vec::new(),
    };
    let mut began = Instant::now();
    let mut refreshed = Instant::now();
    let mut ended = false;
    while !ended && !stop.load(Ordering::SeqCst) {
        let _ = sampler.wait(REFRESH.min(s.interval));
        n.drain(&mut sampler);
        if refreshed.elapsed() >= REFRESH {
            refreshed = Instant::now();
            ended = !crate::target::alive(pid) || sampler.refresh_threads().is_err();
        }
        if began.elapsed() >= s.interval || ended {
            n.drain(&mut sampler);
            if ended && n.pending.is_empty() {
                return Ok(());
            }
            let iv = n.interval(&sampler, began);
            began = Instant::now();
            if tx.send(Event::Interval(iv)).is_err() {
                return Ok(());
            }
        }
    }
    // Stopped: the samples since the last interval make one more, shorter one.
    n.drain(&mut sampler);
    if !ended && !n.pending.is_empty() {
        let _ = tx.send(Event::Interval(n.interval(&sampler, began)));
    }
    Ok(())
}

/// A native target's samples between two intervals, and how to name them.
struct Native {
    unwinder: osprey_perf::Unwinder,
    namer: Namer,
    /// (tid, pcs leaf first, CPU ns) of the samples not yet handed over.
    pending: Vec<(u32, Vec<u64>, u64)>,
}

impl Native {
    /// Unwinds what the rings hold (drained often, so they never fill).
    fn drain(&mut self, sampler: &mut osprey_perf::ProcessSampler) {
        let (unwinder, pending) = (&mut self.unwinder, &mut self.pending);
        sampler.drain(&mut |raw| {
            let st = unwinder.unwind(raw);
            pending.push((st.tid, st.pcs, st.period));
        });
    }

    /// The pending samples, named, as the interval since `began`.
    fn interval(&mut self, sampler: &osprey_perf::ProcessSampler, began: Instant) -> Interval {
        let keys = self.pending.iter().flat_map(|p| p.1.iter().enumerate().map(|(i, &pc)| (pc, i > 0)));
        self.namer.name_all(keys, Some(self.unwinder.modules()));
        let namer = &self.namer;
        let stacks = self
            .pending
            .drain(..)
            .map(|(tid, pcs, cpu_ns)| Stack { tid, frames: namer.frames(&pcs), cpu_ns })
            .collect();
        let pid = self.namer.pid;
        let names = sampler.tids().map(|t| (t, crate::target::thread_name(pid, t as i32))).collect();
        Interval { stacks, names, span: began.elapsed() }
    }
}

fn python(s: Settings, stop: &AtomicBool, tx: &Sender<Event>) -> Result<(), String> {
    let opts =
        osprey_python::Options { hz: s.hz, period: s.interval, native: s.native, ..osprey_python::Options::default() };
    let mut namer = Namer { pid: s.pid, names: HashMap::new() };
    let mut began = Instant::now();
    let mut sink = |data: &ProfileData| {
        let iv = python_interval(data, &mut namer, began.elapsed());
        began = Instant::now();
        tx.send(Event::Interval(iv)).map(|_| None).map_err(|_| std::io::Error::other("osprey top ended"))
    };
    let summary = osprey_python::attach_with_sink(s.pid, &opts, stop, &mut sink).map_err(|e| e.to_string())?;
    if summary.samples == 0 && summary.passes_done == 0 {
        return Err(summary.warnings.first().cloned().unwrap_or_else(|| "no sampling pass could be made".into()));
    }
    Ok(())
}

/// The CPU samples of one `osprey-python` profile as an [`Interval`]
/// (idle threads' samples, of no CPU time, left out).
fn python_interval(data: &ProfileData, namer: &mut Namer, span: Duration) -> Interval {
    let cpu = data.sample_types.iter().position(|t| t.0 == "cpu").unwrap_or(0);
    let native = data.samples.iter().flat_map(|smp| smp.frames.iter()).filter_map(|f| match f {
        Frame::Native { addr, return_address } => Some((*addr, *return_address)),
        _ => None,
    });
    namer.name_all(native, None);
    let mut iv = Interval { span, ..Default::default() };
    let mut names = HashMap::new();
    for smp in &data.samples {
        let label = |k: &str| smp.labels.iter().find(|l| l.key == k).map(|l| &l.value);
        let tid = match label("thread id") {
            Some(LabelValue::Num(n)) => *n as u32,
            _ => 0,
        };
        if let Some(LabelValue::Str(n)) = label("thread name") {
            names.insert(tid, n.clone());
        }
        let cpu_ns = smp.values.get(cpu).copied().unwrap_or(0).max(0) as u64;
        if cpu_ns == 0 {
            continue;
        }
        let frames = smp
            .frames
            .iter()
            .map(|f| match f {
                // Functions by name and file: a top ranks functions, not lines.
                Frame::Function { name, file, .. } if !file.is_empty() => {
                    Arc::from(format!("{name} ({})", file.rsplit('/').next().unwrap_or(file)))
                }
                Frame::Function { name, .. } | Frame::Synthetic(name) => Arc::from(name.as_str()),
                Frame::Native { addr, return_address } => namer.name((*addr, *return_address)),
            })
            .collect();
        iv.stacks.push(Stack { tid, frames, cpu_ns });
    }
    iv.names = names.into_iter().collect();
    iv
}
