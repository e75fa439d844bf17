//! Samples aggregated by (stack, labels) into one profile per window.

use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use osprey_pprof::{Frame, Label, LabelValue, ProfileData, Sample};

use crate::{Sampler, ThreadSample};

/// A stack and its labels.
type Key = (Vec<Frame>, Vec<Label>);

/// Samples aggregated by (stack, labels) until [`Aggregator::take`].
///
/// Values per key: `[samples, cpu ns, gil-wait ns, wall ns]` (wall last:
/// the default of pprof readers). Invariants, per window:
/// a thread with an exact clock ([`ThreadSample::thread_cpu`]) and a raw
/// charge ([`ThreadSample::cpu_ns`]) has `cpu` values adding up (to rounding)
/// to its clock's advance, in proportion to the raw charges; the samples of
/// threads without one share what the process CPU clock advanced beyond
/// those threads, the same way.
pub struct Aggregator {
    pid: i32,
    interval_ns: i64,
    comments: Vec<String>,
    window_start: SystemTime,
    window_instant: Instant,
    /// Process CPU clock at the window's start, and the latest one seen.
    cpu_start: Option<i64>,
    cpu_last: Option<i64>,
    /// Values, and the thread id, per (stack, labels).
    map: HashMap<Key, ([i64; 4], i32)>,
    threads: HashMap<i32, ThreadWindow>,
}

/// A thread's exact clock at the window's start and latest, and its raw
/// charges in the window.
struct ThreadWindow {
    start: u64,
    last: u64,
    raw: i64,
}

impl Aggregator {
    pub fn new(pid: i32, interval_ns: i64, s: &Sampler) -> Self {
        Aggregator {
            pid,
            interval_ns,
            comments: vec![
                format!("python {}", s.target.version),
                format!("osprey-python method {:?}", s.method.map(|m| format!("{m:?}")).unwrap_or("combined".into())),
            ],
            window_start: SystemTime::now(),
            window_instant: Instant::now(),
            cpu_start: None,
            cpu_last: None,
            map: HashMap::new(),
            threads: HashMap::new(),
        }
    }

    /// Adds one pass: its samples, the wall time each stands for, and the
    /// process CPU clock read at the pass (see [`Sampler::cpu_clock`]).
    pub fn add(&mut self, samples: &[ThreadSample], wall_ns: i64, cpu_clock: Option<i64>) {
        if cpu_clock.is_some() {
            self.cpu_start = self.cpu_start.or(cpu_clock);
            self.cpu_last = cpu_clock;
        }
        for s in samples {
            let mut labels = vec![
                Label { key: "thread id".into(), value: LabelValue::Num(s.tid as i64) },
                Label { key: "thread name".into(), value: LabelValue::Str(s.name.clone()) },
                Label { key: "state".into(), value: LabelValue::Str(s.state.to_string()) },
            ];
            if let Some(t) = &s.task {
                labels.push(Label { key: "task".into(), value: LabelValue::Str(t.clone()) });
            }
            if let Some(c) = s.thread_cpu {
                let w = self.threads.entry(s.tid).or_insert(ThreadWindow { start: c, last: c, raw: 0 });
                w.last = c.max(w.last);
                w.raw += s.cpu_ns;
            }
            let (v, _) = self.map.entry((s.frames.clone(), labels)).or_insert(([0; 4], s.tid));
            v[0] += 1;
            v[1] += s.cpu_ns;
            v[2] += s.gil_wait_ns;
            v[3] += wall_ns;
        }
    }

    /// The window's profile, its CPU values rescaled to the process CPU
    /// clock; starts a new window at the latest clock reading.
    pub fn take(&mut self) -> ProfileData {
        let exact = |w: &ThreadWindow| w.raw > 0;
        let exact_cpu: i64 = self.threads.values().filter(|w| exact(w)).map(|w| (w.last - w.start) as i64).sum();
        let rest_raw: i64 = self
            .map
            .values()
            .filter(|(_, tid)| !self.threads.get(tid).is_some_and(exact))
            .map(|(v, _)| v[1])
            .sum();
        let rest_scale = match (self.cpu_start, self.cpu_last) {
            (Some(a), Some(b)) if rest_raw > 0 => Some((b - a - exact_cpu).max(0) as f64 / rest_raw as f64),
            _ => None,
        };
        let threads = &self.threads;
        let samples = self
            .map
            .drain()
            .map(|((frames, labels), (mut v, tid))| {
                let scale = match threads.get(&tid) {
                    Some(w) if exact(w) => Some((w.last - w.start) as f64 / w.raw as f64),
                    _ => rest_scale,
                };
                if let Some(k) = scale {
                    v[1] = (v[1] as f64 * k).round() as i64;
                }
                Sample { frames, values: v.to_vec(), labels }
            })
            .collect();
        // Threads not sampled in this window are dropped (gone, or idle).
        self.threads.retain(|_, w| w.raw > 0 || w.last > w.start);
        for w in self.threads.values_mut() {
            (w.start, w.raw) = (w.last, 0);
        }
        let start_ns = self.window_start.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        let data = ProfileData {
            pid: self.pid,
            sample_types: vec![
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into()),
                ("gil-wait".into(), "nanoseconds".into()),
                ("wall".into(), "nanoseconds".into()),
            ],
            period: ("wall".into(), "nanoseconds".into(), self.interval_ns),
            start_realtime_ns: start_ns,
            duration_ns: self.window_instant.elapsed().as_nanos() as i64,
            samples,
            comments: self.comments.clone(),
            lines: false,
        };
        self.window_start = SystemTime::now();
        self.window_instant = Instant::now();
        self.cpu_start = self.cpu_last;
        data
    }
}
