//! The aggregator: drains per-thread sample rings, aggregates samples by
//! (trace, thread, context), and at flush resolves trace ids against the
//! rotated call trace storage into a [`ProfileData`].
//!
//! Nothing is dropped silently: samples that could not be stored or
//! buffered become samples under a synthetic `[osprey] ...` frame.
//!
//! Ordering that makes resolution complete: `storage.rotate()` waits until no
//! handler is inside the old ACTIVE table, and a handler pushes its sample
//! record *before* leaving the table. So after a rotation, draining the rings
//! yields every sample whose trace is in the rotated table; samples of the new
//! epoch stay pending until the next flush.

use super::heap::LiveHeap;
use crate::context;
use crate::discovery::Unsampled;
use crate::record::{ContextSnapshot, RecordState, SampleKind, SampleRecord, TAG_SLOTS};
use crate::registry::Registry;
use crate::signal::sys;
use crate::storage::{CallTraceStorage, DROPPED_TRACE_ID};
use crate::threads::thread_name;
use crate::wall;
use osprey_pprof::{Frame, Label, LabelValue, ProfileData, Sample, TIMESTAMP_LABEL};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::*;

/// What samples are aggregated by: the stack (a storage trace id, or an
/// [`OWN_STACK`] id), the thread, its trace context and, for wall samples,
/// its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    trace_id: u64,
    tid: i32,
    span_id: u64,
    local_root_span_id: u64,
    w3c_trace_id: [u64; 2],
    tags: [u32; TAG_SLOTS],
    state: u16,
    /// CLOCK_MONOTONIC ns of the sample with a timeline (one entry per
    /// sample), else 0 (samples merged).
    at_ns: u64,
}

/// Flag of stack ids the aggregator interned itself (stacks taken off the
/// signal path, and the stacks of live allocations, which must outlive the
/// storage epoch they were sampled in). Storage ids never have it.
const OWN_STACK: u64 = 1 << 63;

#[derive(Clone, Copy, Default)]
struct Agg {
    count: u64,
    cpu_ns: u64,
    wall_ns: u64,
    alloc_count: u64,
    alloc_bytes: u64,
    /// Flushes this entry survived unresolved.
    age: u32,
}

/// Which profiles are collected besides CPU time: decides the sample types.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kinds {
    /// `wall/nanoseconds`.
    pub wall: bool,
    /// `alloc-samples/count`, `alloc-space/bytes`, `inuse-space/bytes`.
    pub alloc: bool,
    /// Each CPU and wall sample keeps its time (`TIMESTAMP_LABEL`), for
    /// backends that draw timelines: one pprof sample per sample taken.
    pub timeline: bool,
}

/// Stacks the aggregator holds itself, by [`OWN_STACK`] id.
#[derive(Default)]
struct OwnStacks {
    ids: HashMap<(Vec<u64>, bool), u64>,
    frames: HashMap<u64, (Vec<u64>, bool)>,
    next: u64,
}

impl OwnStacks {
    fn intern(&mut self, frames: &[u64], truncated: bool) -> u64 {
        let key = (frames.to_vec(), truncated);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        self.next += 1;
        let id = OWN_STACK | self.next;
        self.frames.insert(id, key.clone());
        self.ids.insert(key, id);
        id
    }

    /// Forgets every stack but those in `keep`.
    fn retain(&mut self, keep: &std::collections::HashSet<u64>) {
        self.frames.retain(|id, _| keep.contains(id));
        self.ids.retain(|_, id| keep.contains(id));
    }
}

/// Synthetic frame names.
pub const FRAME_STORAGE_FULL: &str = "[osprey] dropped: call trace storage full";
/// Samples lost because a thread's sample ring was full.
pub const FRAME_RING_FULL: &str = "[osprey] lost: sample buffer full";
/// Sampled allocations osprey could not record (the thread was inside
/// osprey already, or not registered).
pub const FRAME_ALLOC_LOST: &str = "[osprey] lost: allocation sample not recorded";
/// osprey's own CPU in the process: its threads, and its setup on the
/// program's threads (see `collector::own`).
pub const FRAME_AGENT: &str = "[osprey] agent";
/// Samples on threads without a registry record.
pub const FRAME_UNREGISTERED: &str = "[osprey] dropped: thread not registered";
pub const FRAME_UNRESOLVED: &str = "[osprey] unresolved call trace";
/// Prefix of the frame carrying the CPU time of a thread that blocks the
/// sampling signal (`[signals blocked] tid 1234 'xz'`).
pub const FRAME_BLOCKED: &str = "[signals blocked]";
/// Marks a stack cut at the maximum depth.
pub const FRAME_TRUNCATED: &str = "[truncated]";

pub struct Aggregator {
    kinds: Kinds,
    pending: HashMap<Key, Agg>,
    own: OwnStacks,
    heap: LiveHeap<Key>,
    /// What full rings lost, by thread.
    lost_ring: HashMap<i32, Agg>,
    names: HashMap<i32, String>,
    /// Threads named since the last flush began: their names are current.
    named_since_flush: HashSet<i32>,
    start_realtime_ns: u64,
    start_mono_ns: u64,
    /// `Registry::dropped_unregistered` at the last flush.
    unregistered_seen: u64,
    /// CPU ns of threads that could not be sampled, since the last flush.
    unsampled: HashMap<Unsampled, u64>,
}

impl Default for Aggregator {
    fn default() -> Self {
        Aggregator::new(Kinds::default())
    }
}

impl Aggregator {
    /// An aggregator of CPU samples and of the other `kinds`.
    pub fn new(kinds: Kinds) -> Self {
        Aggregator {
            kinds,
            pending: HashMap::new(),
            own: OwnStacks::default(),
            heap: LiveHeap::default(),
            lost_ring: HashMap::new(),
            names: HashMap::new(),
            named_since_flush: HashSet::new(),
            start_realtime_ns: sys::realtime_ns(),
            start_mono_ns: sys::monotonic_ns(),
            unregistered_seen: Registry::get().map_or(0, |r| r.dropped_unregistered.load(Relaxed)),
            unsampled: HashMap::new(),
        }
    }

    /// The first profile counts from `realtime_ns`/`mono_ns` (the agent's
    /// start) rather than from this aggregator's creation.
    pub(crate) fn since(mut self, realtime_ns: u64, mono_ns: u64) -> Self {
        self.start_realtime_ns = realtime_ns;
        self.start_mono_ns = mono_ns;
        self
    }

    /// Drains every ring that got samples; recycles retired records once drained.
    pub fn drain(&mut self, reg: &Registry) {
        reg.for_each_dirty(|idx, rec| {
            let retired = rec.state() == RecordState::Retired;
            // A retired record's tid is already 0: its samples still name the thread.
            let mut tid = rec.tid.load(Relaxed);
            // Every sample of an exited thread (its ring's, its perf event's)
            // takes the name it left with, even where one was read before a
            // rename; a live thread's exit-path name serves where it has none
            // yet (later renames are read at the next flushes, as for any
            // thread). The name is read first: its Acquire makes `exit_tid`,
            // stored before it, the tid it names.
            if let Some(n) = rec.exit_name() {
                let t = rec.exit_tid.load(Relaxed);
                if t > 0 && (retired || !self.names.contains_key(&t)) {
                    self.names.insert(t, n);
                    self.named_since_flush.insert(t);
                }
            }
            rec.ring.drain(|s| {
                tid = s.tid;
                self.add(s)
            });
            let lost = rec.lost.take();
            if lost.records > 0 {
                let a = self.lost_ring.entry(tid).or_default();
                a.count += lost.cpu_samples;
                a.cpu_ns += lost.cpu_ns;
                a.wall_ns += lost.wall_ns;
                a.alloc_count += lost.alloc_count;
                a.alloc_bytes += lost.alloc_bytes;
            }
            if retired {
                // A clock armed while the thread was retiring goes with it.
                crate::cpu_clock::disarm(rec);
                reg.recycle(idx);
            }
        });
    }

    /// Learns the names of threads discovery just saw appear unannounced, so
    /// such a thread that exits before its samples are drained still has its
    /// name (a thread the start hook registered leaves it in its record,
    /// `threads::unregister_current`, and is named at its first sample).
    pub fn note_threads(&mut self, tids: &[i32]) {
        for &tid in tids {
            if let std::collections::hash_map::Entry::Vacant(e) = self.names.entry(tid) {
                let name = thread_name(tid);
                self.named_since_flush.insert(tid);
                if !name.is_empty() {
                    e.insert(name);
                }
            }
        }
    }

    /// osprey's own CPU time, `ns`, as the sample it is in a profile.
    pub fn own_sample(&self, ns: u64) -> Sample {
        Sample { frames: vec![Frame::Synthetic(FRAME_AGENT.into())], values: self.cpu_values(0, ns), labels: vec![] }
    }

    /// Adds CPU time discovery accounted for threads it could not sample.
    pub fn add_unsampled(&mut self, unsampled: HashMap<Unsampled, u64>) {
        for (k, ns) in unsampled {
            *self.unsampled.entry(k).or_default() += ns;
        }
    }

    fn add(&mut self, s: &SampleRecord) {
        if s.kind() == SampleKind::Free {
            self.heap.on_free(s.addr, s.timestamp_ns);
            return;
        }
        if !self.names.contains_key(&s.tid) {
            self.note_threads(&[s.tid]);
        }
        let key = Key {
            trace_id: s.trace_id,
            tid: s.tid,
            span_id: s.span_id,
            local_root_span_id: s.local_root_span_id,
            w3c_trace_id: s.w3c_trace_id,
            tags: s.tags,
            state: s.state,
            at_ns: if self.kinds.timeline && s.kind() != SampleKind::Alloc { s.timestamp_ns } else { 0 },
        };
        self.add_keyed(key, s.kind(), s.value, s.count);
        if s.kind() == SampleKind::Alloc && s.addr != 0 {
            self.heap.on_alloc(s.addr, key, s.value, s.timestamp_ns);
        }
    }

    fn add_keyed(&mut self, key: Key, kind: SampleKind, value: u64, count: u32) {
        let a = self.pending.entry(key).or_default();
        match kind {
            SampleKind::Cpu => {
                a.count += count as u64;
                a.cpu_ns += value;
            }
            SampleKind::Wall => a.wall_ns += value,
            SampleKind::Alloc => {
                a.alloc_count += count as u64;
                a.alloc_bytes += value;
            }
            SampleKind::Free => {}
        }
    }

    /// Adds a sample taken off the signal path (e.g. the wall-time stack of
    /// a blocked thread, unwound by the collector): `frames` leaf first, as
    /// the handler would have stored them.
    #[allow(clippy::too_many_arguments)]
    pub fn add_stack(
        &mut self,
        tid: i32,
        frames: &[u64],
        truncated: bool,
        kind: SampleKind,
        value: u64,
        count: u32,
        state: u16,
        ctx: &ContextSnapshot,
    ) {
        if !self.names.contains_key(&tid) {
            self.note_threads(&[tid]);
        }
        let trace_id = self.own.intern(frames, truncated);
        let at_ns = if self.kinds.timeline { sys::monotonic_ns() } else { 0 };
        let key = Key {
            trace_id,
            tid,
            span_id: ctx.span_id,
            local_root_span_id: ctx.local_root_span_id,
            w3c_trace_id: [(ctx.trace_id >> 64) as u64, ctx.trace_id as u64],
            tags: ctx.tags,
            state,
            at_ns,
        };
        self.add_keyed(key, kind, value, count);
    }

    /// The sample values of `agg`, one per [`Aggregator::sample_types`] entry.
    fn values(&self, agg: &Agg, inuse: u64) -> Vec<i64> {
        let mut v = vec![agg.count as i64, agg.cpu_ns as i64];
        if self.kinds.wall {
            v.push(agg.wall_ns as i64);
        }
        if self.kinds.alloc {
            v.extend([agg.alloc_count as i64, agg.alloc_bytes as i64, inuse as i64]);
        }
        v
    }

    /// (type, unit) of each sample value: CPU always, then wall time and the
    /// allocation profiles when collected.
    pub fn sample_types(&self) -> Vec<(String, String)> {
        let mut t = vec![("samples", "count"), ("cpu", "nanoseconds")];
        if self.kinds.wall {
            t.push(("wall", "nanoseconds"));
        }
        if self.kinds.alloc {
            t.extend([("alloc-samples", "count"), ("alloc-space", "bytes"), ("inuse-space", "bytes")]);
        }
        t.into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    /// Values of a synthetic sample that stands for `count` CPU samples of `cpu_ns`.
    fn cpu_values(&self, count: u64, cpu_ns: u64) -> Vec<i64> {
        self.values(&Agg { count, cpu_ns, ..Agg::default() }, 0)
    }

    /// Rotates storage, drains, and returns the profile of the period that ends now.
    pub fn flush(
        &mut self,
        reg: &Registry,
        storage: &CallTraceStorage,
        period_ns: u64,
        comments: Vec<String>,
    ) -> ProfileData {
        let collected = storage.rotate();
        self.drain(reg);
        // Names may change after a thread starts (pthread_setname_np): refresh
        // those this profile shows (idle threads cost no read).
        let shown: HashSet<i32> = self
            .pending
            .keys()
            .map(|k| k.tid)
            .chain(self.lost_ring.keys().copied())
            .chain(self.heap.keys().map(|k| k.tid))
            .collect();
        for tid in shown {
            if self.named_since_flush.contains(&tid) {
                continue; // read during this period's drain
            }
            if let Some(name) = self.names.get_mut(&tid) {
                let now = thread_name(tid);
                if !now.is_empty() {
                    *name = now;
                }
            }
        }
        let mut traces: HashMap<u64, (&[u64], bool)> =
            collected.traces.iter().map(|t| (t.id, (t.frames.as_slice(), t.truncated))).collect();
        // Duplicate entries of one stack were merged under one id by `rotate`.
        for &(alias, kept) in &collected.aliases {
            if let Some(&t) = traces.get(&kept) {
                traces.insert(alias, t);
            }
        }
        let mut samples = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        for (key, mut agg) in pending {
            let frames = if key.trace_id == DROPPED_TRACE_ID {
                vec![Frame::Synthetic(FRAME_STORAGE_FULL.into())]
            } else if let Some((addrs, truncated)) = self.own.frames.get(&key.trace_id) {
                native_frames(addrs, *truncated)
            } else if let Some((addrs, truncated)) = traces.get(&key.trace_id) {
                native_frames(addrs, *truncated)
            } else if agg.age == 0 {
                agg.age += 1;
                self.pending.insert(key, agg);
                continue;
            } else {
                vec![Frame::Synthetic(FRAME_UNRESOLVED.into())]
            };
            samples.push(Sample { frames, values: self.values(&agg, 0), labels: self.labels(&key) });
        }
        if self.kinds.alloc {
            // Live allocations keep their stack beyond this storage epoch.
            let own = &mut self.own;
            self.heap.rekey(|key| {
                let (addrs, truncated) = traces.get(&key.trace_id)?;
                Some(Key { trace_id: own.intern(addrs, *truncated), ..*key })
            });
            let inuse = self.heap.inuse();
            for (key, bytes) in inuse {
                let Some((addrs, truncated)) = self.own.frames.get(&key.trace_id) else { continue };
                samples.push(Sample {
                    frames: native_frames(addrs, *truncated),
                    values: self.values(&Agg::default(), bytes),
                    labels: self.labels(&key),
                });
            }
        }
        let keep: std::collections::HashSet<u64> =
            self.heap.keys().map(|k| k.trace_id).chain(self.pending.keys().map(|k| k.trace_id)).collect();
        self.own.retain(&keep);
        for (tid, lost) in std::mem::take(&mut self.lost_ring) {
            samples.push(Sample {
                frames: vec![Frame::Synthetic(FRAME_RING_FULL.into())],
                values: self.values(&lost, 0),
                labels: thread_labels(tid, self.names.get(&tid)),
            });
        }
        if self.kinds.alloc {
            let alloc = &crate::signal::alloc::ALLOC;
            let (count, bytes) = (alloc.lost_count.swap(0, Relaxed), alloc.lost_bytes.swap(0, Relaxed));
            if count > 0 || bytes > 0 {
                samples.push(Sample {
                    frames: vec![Frame::Synthetic(FRAME_ALLOC_LOST.into())],
                    values: self.values(&Agg { alloc_count: count, alloc_bytes: bytes, ..Agg::default() }, 0),
                    labels: vec![],
                });
            }
        }
        let total = reg.dropped_unregistered.load(Relaxed);
        let unregistered = total.saturating_sub(self.unregistered_seen);
        self.unregistered_seen = total;
        let mut unregistered_ns = unregistered * period_ns;
        for (k, ns) in std::mem::take(&mut self.unsampled) {
            match k {
                Unsampled::Unregistered => unregistered_ns += ns,
                Unsampled::Blocked(tid) if ns > 0 => {
                    let name = self.names.get(&tid).cloned().unwrap_or_else(|| thread_name(tid));
                    samples.push(Sample {
                        frames: vec![Frame::Synthetic(format!("{FRAME_BLOCKED} tid {tid} '{name}'"))],
                        values: self.cpu_values(ns / period_ns.max(1), ns),
                        labels: thread_labels(tid, Some(&name)),
                    });
                }
                Unsampled::Blocked(_) => {}
            }
        }
        if unregistered_ns > 0 {
            samples.push(Sample {
                frames: vec![Frame::Synthetic(FRAME_UNREGISTERED.into())],
                values: self.cpu_values(unregistered_ns / period_ns.max(1), unregistered_ns),
                labels: vec![],
            });
        }
        let now_mono = sys::monotonic_ns();
        let pid = sys::getpid();
        let data = ProfileData {
            pid,
            process: self.names.get(&pid).cloned(),
            sample_types: self.sample_types(),
            period: ("cpu".into(), "nanoseconds".into(), period_ns as i64),
            start_realtime_ns: self.start_realtime_ns as i64,
            duration_ns: now_mono.saturating_sub(self.start_mono_ns) as i64,
            samples,
            comments,
            lines: false,
        };
        self.start_realtime_ns = sys::realtime_ns();
        self.start_mono_ns = now_mono;
        self.named_since_flush.clear();
        // Forget names of threads that are gone and left nothing pending.
        let live: std::collections::HashSet<i32> = self.pending.keys().chain(self.heap.keys()).map(|k| k.tid).collect();
        self.names.retain(|tid, _| live.contains(tid) || reg.lookup(*tid).is_some());
        data
    }

    fn labels(&self, key: &Key) -> Vec<Label> {
        let mut labels = thread_labels(key.tid, self.names.get(&key.tid));
        if key.at_ns != 0 {
            // Monotonic to wall clock, at the offset of the current period's start.
            let at = self.start_realtime_ns as i64 + (key.at_ns as i64 - self.start_mono_ns as i64);
            labels.push(Label { key: TIMESTAMP_LABEL.into(), value: LabelValue::Num(at) });
        }
        if let Some(state) = wall::thread_state::label(key.state) {
            labels.push(Label { key: "state".into(), value: LabelValue::Str(state) });
        }
        if key.w3c_trace_id != [0, 0] {
            // As W3C writes it: 32 lowercase hex digits.
            let [hi, lo] = key.w3c_trace_id;
            labels.push(Label { key: "trace id".into(), value: LabelValue::Str(format!("{hi:016x}{lo:016x}")) });
        }
        if key.span_id != 0 || key.local_root_span_id != 0 {
            labels.push(Label { key: "span id".into(), value: LabelValue::Num(key.span_id as i64) });
            labels.push(Label {
                key: "local root span id".into(),
                value: LabelValue::Num(key.local_root_span_id as i64),
            });
        }
        for (slot, &id) in key.tags.iter().enumerate() {
            if id == 0 {
                continue;
            }
            if let (Some(k), Some(v)) = (context::tag_key_name(slot), context::tag_value(id)) {
                labels.push(Label { key: k, value: LabelValue::Str(v) });
            }
        }
        labels
    }
}

fn native_frames(addrs: &[u64], truncated: bool) -> Vec<Frame> {
    let mut frames: Vec<Frame> =
        addrs.iter().enumerate().map(|(i, &addr)| Frame::Native { addr, return_address: i > 0 }).collect();
    if truncated {
        frames.push(Frame::Synthetic(FRAME_TRUNCATED.into()));
    }
    frames
}

fn thread_labels(tid: i32, name: Option<&String>) -> Vec<Label> {
    let mut v = vec![Label { key: "thread id".into(), value: LabelValue::Num(tid as i64) }];
    if let Some(n) = name.filter(|n| !n.is_empty()) {
        v.push(Label { key: "thread name".into(), value: LabelValue::Str(n.clone()) });
    }
    v
}
