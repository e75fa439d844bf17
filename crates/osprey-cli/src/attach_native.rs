//! `osprey attach` to a process that is not CPython: every thread sampled
//! from outside with `perf_event_open` (`osprey-perf`: CPU clock, user
//! registers and the top of the stack copied by the kernel), stacks unwound
//! here with the target's CFI tables, and profiles delivered like the
//! agent's (`osprey_upload::Delivery`: files, backends).
//!
//! Nothing is injected. A target that publishes OpenTelemetry thread
//! contexts (OTEP 4947) has each thread stopped once, briefly, when first
//! seen, for its thread pointer; each sample then gets the thread's trace
//! and span ids read without a stop ([`LiveReader`]), at drain time, so the
//! drain runs every [`CONTEXT_DRAIN`] and a span shorter than that may be
//! missed. A record changing under the read is skipped and counted. Any
//! other target is never stopped. Threads started after the
//! attach are sampled from the next refresh on ([`REFRESH`]). The run ends at
//! `--duration`, Ctrl-C, or the target's exit; a profile written once the
//! target is gone (its maps unreadable) is named here, from the modules the
//! unwinder last read ([`symbolize_offline`]).

use crate::{exec, Failure, Sampling};
use osprey_perf::thread_ctx::{LiveReader, ThreadRead};
use osprey_pprof::{Frame, Label, LabelValue, ProfileData, Sample};
use osprey_unwind::compile::DEBUG_ROOT;
use osprey_unwind::ModuleSet;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Stack bytes the kernel copies per sample.
const STACK_BYTES: u32 = 16 << 10;
/// Interval of the thread-list refresh and of the target's liveness check.
const REFRESH: Duration = Duration::from_millis(100);
/// Longest wait between drains when thread contexts are read: the record is
/// read when the sample is drained, so this bounds how stale its span is.
const CONTEXT_DRAIN: Duration = Duration::from_millis(10);

/// What samples are merged by: thread, frames (leaf first), cut or not,
/// the sample's wall time when a timeline is kept (else 0), and the
/// thread's (trace id, span id) (0 = none).
type Key = (u32, Vec<u64>, bool, i64, (u128, u64));

/// Counts and CPU nanoseconds of the samples of one key.
#[derive(Default, Clone, Copy)]
struct Agg {
    count: i64,
    cpu_ns: i64,
}

/// Samples `pid` (checked by [`crate::target::check`]) until `duration`,
/// Ctrl-C or its exit.
pub fn run(pid: i32, duration: Option<Duration>, s: &Sampling) -> Result<u8, Failure> {
    if s.wall || s.alloc {
        let flag = if s.wall { "--wall" } else { "--alloc" };
        return Err(Failure::usage(format!(
            "{flag}: only `osprey exec` has it (the agent, from inside the program); `attach` to a native process samples CPU time"
        )));
    }
    let process = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string();
    let up = exec::delivery(s, &process)?;
    let cfg = exec::check_sampling(s, &up)?;
    let mut sampler = osprey_perf::ProcessSampler::attach(pid as u32, cfg.hz, STACK_BYTES)
        .map_err(|e| Failure::from(format!("pid {pid}: {e}")))?;
    let mut unwinder = osprey_perf::Unwinder::new(pid as u32);
    let stop = exec::stop_on_ctrl_c();
    let meta = osprey_upload::Meta::new(osprey_upload::new_runtime_id(), pid, osprey_upload::Language::Native);
    let delivery = osprey_upload::Delivery::new(up.clone(), meta, cfg.period);
    let mut run = Run {
        pid,
        process,
        hz: cfg.hz,
        lines: s.lines,
        timeline: up.timeline,
        names: HashMap::new(),
        pending: HashMap::new(),
        start_realtime_ns: realtime_ns(),
        start_mono_ns: osprey_perf::now_ns(),
        started: Instant::now(),
        files: Vec::new(),
        errors: Vec::new(),
        samples: 0,
    };
    run.name_threads(sampler.tids());
    let mut contexts = LiveReader::open(pid).ok().flatten();
    if let Some(c) = &mut contexts {
        c.track(sampler.tids().map(|t| t as i32));
    }
    let drain_every = if contexts.is_some() { CONTEXT_DRAIN } else { REFRESH };
    let began = Instant::now();
    let mut refreshed = Instant::now();
    let mut ended = false;
    while !ended {
        let now = Instant::now();
        let left = duration.map(|d| d.saturating_sub(began.elapsed()));
        if stop.load(Ordering::SeqCst) || left == Some(Duration::ZERO) {
            break;
        }
        let wait = left.map_or(drain_every, |l| l.min(drain_every));
        let _ = sampler.wait(wait);
        sampler.drain(&mut |raw| run.add(&unwinder.unwind(raw), span_of(&mut contexts, raw.tid)));
        if now.duration_since(refreshed) >= REFRESH || sampler.tids().next().is_none() {
            refreshed = Instant::now();
            ended = !crate::target::alive(pid) || sampler.refresh_threads().is_err();
            run.name_threads(sampler.tids());
            if let Some(c) = &mut contexts {
                c.track(sampler.tids().map(|t| t as i32));
            }
        }
        if run.started.elapsed() >= cfg.period {
            run.flush(&delivery, unwinder.modules());
        }
    }
    sampler.drain(&mut |raw| run.add(&unwinder.unwind(raw), span_of(&mut contexts, raw.tid)));
    run.flush(&delivery, unwinder.modules());
    let mut delivery = delivery;
    exec::report_uploads(&delivery.finish(), s.quiet);
    let totals = sampler.totals();
    if !s.quiet {
        run.errors.iter().for_each(|e| eprintln!("osprey: {e}"));
        if totals.lost > 0 {
            eprintln!("osprey: {} samples lost (the kernel's sample buffer was full)", totals.lost);
        }
        if let Some(c) = contexts.as_ref().filter(|c| c.torn() > 0) {
            eprintln!("osprey: {} samples without their thread context (the record changed during the read)", c.torn());
        }
        if ended {
            eprintln!("osprey: pid {pid} exited");
        }
        let names: Vec<String> = run.files.iter().map(|p| p.display().to_string()).collect();
        match names.len() {
            0 if run.samples > 0 && up.uploads() => {}
            0 if run.samples > 0 => {
                eprintln!("osprey: {} samples taken, yet no profile written (see above)", run.samples)
            }
            0 => eprintln!("osprey: no samples (pid {pid} used no CPU while attached); no profile written"),
            n => eprintln!("osprey: {} samples; {n} profile(s) written: {}", run.samples, names.join(" ")),
        }
    }
    Ok(0)
}

/// One attach's pending samples and what it wrote.
struct Run {
    pid: i32,
    process: String,
    hz: u32,
    lines: bool,
    timeline: bool,
    /// Thread names by id: read when the thread is first seen and again at
    /// each flush, kept after it exits.
    names: HashMap<u32, String>,
    pending: HashMap<Key, Agg>,
    start_realtime_ns: i64,
    start_mono_ns: u64,
    /// Start of the current profile.
    started: Instant,
    files: Vec<PathBuf>,
    errors: Vec<String>,
    samples: u64,
}

impl Run {
    fn name_threads(&mut self, tids: impl Iterator<Item = u32>) {
        for tid in tids {
            self.names.entry(tid).or_insert_with(|| crate::target::thread_name(self.pid, tid as i32));
        }
    }

    fn add(&mut self, st: &osprey_perf::Stack, span: (u128, u64)) {
        self.samples += 1;
        let at =
            if self.timeline { self.start_realtime_ns + st.time.saturating_sub(self.start_mono_ns) as i64 } else { 0 };
        let a = self.pending.entry((st.tid, st.pcs.clone(), st.truncated, at, span)).or_default();
        a.count += 1;
        a.cpu_ns += st.period as i64;
    }

    /// Delivers the pending samples as one profile (none: nothing written).
    fn flush(&mut self, delivery: &osprey_upload::Delivery, modules: &ModuleSet) {
        let now = realtime_ns();
        let pending = std::mem::take(&mut self.pending);
        let start = self.start_realtime_ns;
        self.start_realtime_ns = now;
        self.started = Instant::now();
        if pending.is_empty() {
            return;
        }
        // Names set after a thread was first seen (pthread_setname_np once
        // started) are the ones shown; a gone thread keeps its last name.
        for tid in pending.keys().map(|k| k.0).collect::<std::collections::HashSet<u32>>() {
            let name = crate::target::thread_name(self.pid, tid as i32);
            if !name.is_empty() {
                self.names.insert(tid, name);
            }
        }
        let samples = pending.into_iter().map(|(key, agg)| self.sample(key, agg)).collect();
        let mut data = ProfileData {
            pid: self.pid,
            process: None,
            sample_types: vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())],
            period: ("cpu".into(), "nanoseconds".into(), 1_000_000_000 / i64::from(self.hz.max(1))),
            start_realtime_ns: start,
            duration_ns: now - start,
            samples,
            comments: Vec::new(),
            lines: self.lines,
        };
        // A zombie's maps read back empty, not as an error: a target that
        // exited but is not yet reaped (its parent has not waited) is gone too.
        if !crate::target::alive(self.pid) || osprey_pprof::maps::ProcMaps::read(self.pid).is_err() {
            symbolize_offline(&mut data, modules);
        }
        match delivery.flush(&data, Vec::new) {
            Ok(Some(f)) => self.files.push(f),
            Ok(None) => {}
            Err(e) => self.errors.push(format!("writing the profile: {e}")),
        }
    }

    fn sample(&self, (tid, pcs, truncated, at, (trace, span)): Key, agg: Agg) -> Sample {
        let mut frames: Vec<Frame> =
            pcs.iter().enumerate().map(|(i, &addr)| Frame::Native { addr, return_address: i > 0 }).collect();
        if truncated {
            frames.push(Frame::Synthetic(osprey::internals::collector::FRAME_TRUNCATED.into()));
        }
        let mut labels = vec![
            Label { key: "pid".into(), value: LabelValue::Num(i64::from(self.pid)) },
            Label { key: "thread id".into(), value: LabelValue::Num(i64::from(tid)) },
        ];
        if !self.process.is_empty() {
            labels.push(Label { key: "process".into(), value: LabelValue::Str(self.process.clone()) });
        }
        if let Some(n) = self.names.get(&tid).filter(|n| !n.is_empty()) {
            labels.push(Label { key: "thread name".into(), value: LabelValue::Str(n.clone()) });
        }
        if at != 0 {
            labels.push(Label { key: osprey_pprof::TIMESTAMP_LABEL.into(), value: LabelValue::Num(at) });
        }
        // The agent's keys and formats. OTEP records carry no local root span:
        // as the agent does for OTel spans, it is the trace id's low 64 bits.
        if trace != 0 {
            labels.push(Label { key: "trace id".into(), value: LabelValue::Str(format!("{trace:032x}")) });
        }
        if span != 0 || trace as u64 != 0 {
            labels.push(Label { key: "span id".into(), value: LabelValue::Num(span as i64) });
            labels.push(Label { key: "local root span id".into(), value: LabelValue::Num(trace as u64 as i64) });
        }
        Sample { frames, values: vec![agg.count, agg.cpu_ns], labels }
    }
}

/// Thread `tid`'s (trace id, span id) now; (0, 0) without a readable,
/// consistent record.
fn span_of(contexts: &mut Option<LiveReader>, tid: u32) -> (u128, u64) {
    match contexts.as_mut().map(|c| c.read(tid as i32)) {
        Some(ThreadRead::Record(c)) => (c.trace_id, c.span_id),
        _ => (0, 0),
    }
}

/// Names the native frames of `data` from `modules`' files (ELF symbols):
/// for a profile written after the target exited, when its maps, which the
/// usual symbolization reads, are gone. A frame in no module, or one its
/// module does not name, becomes `module+0xoffset` or stays an address.
fn symbolize_offline(data: &mut ProfileData, modules: &ModuleSet) {
    let mut keys: Vec<(u64, bool)> = Vec::new();
    for s in &data.samples {
        for f in &s.frames {
            if let Frame::Native { addr, return_address } = *f {
                keys.push((addr, return_address));
            }
        }
    }
    let names = name_from_modules(modules, keys);
    for s in &mut data.samples {
        for f in &mut s.frames {
            if let Frame::Native { addr, return_address } = *f {
                if let Some(name) = names.get(&(addr, return_address)) {
                    *f = Frame::Function { name: name.clone(), file: String::new(), line: 0 };
                }
            }
        }
    }
}

/// Names `(pc, is a return address)` keys from `modules`' files alone (ELF
/// symbols, separate debug files), reading each module once; a key in a
/// module that does not name it gets `module+0xoffset`, one in no module
/// no entry. Needs no live process.
pub(crate) fn name_from_modules(
    modules: &ModuleSet,
    keys: impl IntoIterator<Item = (u64, bool)>,
) -> HashMap<(u64, bool), String> {
    // module index -> (svma, key) pairs, named once per module.
    type Svmas = Vec<(u64, (u64, bool))>;
    let mut wanted: HashMap<usize, Svmas> = HashMap::new();
    for (addr, ret) in keys {
        let pc = if ret { addr.saturating_sub(1) } else { addr };
        if let Some(i) = modules.index_for(pc) {
            wanted.entry(i).or_default().push((pc - modules.modules()[i].bias, (addr, ret)));
        }
    }
    let mut names = HashMap::new();
    for (i, mut pairs) in wanted {
        pairs.sort_unstable();
        pairs.dedup();
        let m = &modules.modules()[i];
        let svmas: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let named =
            osprey_unwind::symbols::name_addresses(&m.path, Some(Path::new(DEBUG_ROOT)), &svmas).unwrap_or_default();
        for (k, (svma, key)) in pairs.into_iter().enumerate() {
            let name = named.get(k).cloned().flatten();
            names.insert(key, name.unwrap_or_else(|| osprey_unwind::symbols::module_offset_name(&m.path, svma)));
        }
    }
    names
}

/// Wall-clock now, ns since the Unix epoch.
fn realtime_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_offline_names() -> u64 {
        std::hint::black_box(7)
    }

    /// A profile written after the target is gone names its frames from the
    /// unwinder's modules; an address in no module stays an address.
    #[test]
    fn offline_names_come_from_the_modules() {
        let unwinder = osprey_perf::Unwinder::new(std::process::id());
        let pc = marker_function_for_offline_names as *const () as u64 + 1;
        let mut data = ProfileData {
            samples: vec![Sample {
                frames: vec![
                    Frame::Native { addr: pc, return_address: false },
                    Frame::Native { addr: 8, return_address: true },
                ],
                values: vec![1, 1],
                labels: vec![],
            }],
            ..Default::default()
        };
        symbolize_offline(&mut data, unwinder.modules());
        let f = &data.samples[0].frames;
        assert!(
            matches!(&f[0], Frame::Function { name, .. } if name.contains("marker_function_for_offline_names")),
            "{f:?}"
        );
        assert_eq!(f[1], Frame::Native { addr: 8, return_address: true });
    }
}
