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
/// a sample of a thread with an exact clock ([`ThreadSample::thread_cpu`])
/// keeps its exact charge (the thread's CPU since its previous sample); the
/// samples of threads without one share, in proportion to their raw charges,
/// what the process CPU clock advanced beyond the exact charges. Every
/// sample carries `thread id`, `thread name` (the Python name where known,
/// else the OS name; see [`crate::thread_names`]), `state` and `process`
/// labels, and an asyncio task's a `task` label.
pub struct Aggregator {
    pid: i32,
    interval_ns: i64,
    comments: Vec<String>,
    window_start: SystemTime,
    window_instant: Instant,
    /// Process CPU clock at the window's start, and the latest one seen.
    cpu_start: Option<i64>,
    cpu_last: Option<i64>,
    /// Values, and whether the CPU value is exact, per (stack, labels).
    map: HashMap<Key, ([i64; 4], bool)>,
    /// Exact CPU charged in the window.
    exact_cpu: i64,
    /// The program's name (`/proc/<pid>/comm` when the sampler started),
    /// kept so profiles written after the process exited still have it.
    process: String,
    /// Samples kept with a `[truncated]` frame, and cyclic frame chains, in
    /// the window (written in the profile's comments).
    pub truncated: u64,
    pub cycles: u64,
    /// Label each sample with its pass's wall-clock time
    /// ([`osprey_pprof::TIMESTAMP_LABEL`]): a timeline, at the cost of one
    /// sample per stack and pass instead of per stack.
    pub timeline: bool,
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
            exact_cpu: 0,
            process: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|n| n.trim_end().to_string())
                .unwrap_or_default(),
            truncated: 0,
            cycles: 0,
            timeline: false,
        }
    }

    /// Adds one pass: its samples, the wall time each stands for, and the
    /// process CPU clock read at the pass (see [`Sampler::cpu_clock`]).
    pub fn add(&mut self, samples: &[ThreadSample], wall_ns: i64, cpu_clock: Option<i64>) {
        if cpu_clock.is_some() {
            self.cpu_start = self.cpu_start.or(cpu_clock);
            self.cpu_last = cpu_clock;
        }
        let now_ns = if self.timeline {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
        } else {
            0
        };
        for s in samples {
            let mut labels = vec![
                Label { key: "thread id".into(), value: LabelValue::Num(s.tid as i64) },
                Label { key: "thread name".into(), value: LabelValue::Str(s.name.clone()) },
                Label { key: "state".into(), value: LabelValue::Str(s.state.to_string()) },
                Label { key: "process".into(), value: LabelValue::Str(self.process.clone()) },
            ];
            if self.timeline {
                labels.push(Label { key: osprey_pprof::TIMESTAMP_LABEL.into(), value: LabelValue::Num(now_ns) });
            }
            if let Some(t) = &s.task {
                labels.push(Label { key: "task".into(), value: LabelValue::Str(t.clone()) });
            }
            if let Some(why) = s.truncated {
                self.truncated += 1;
                self.cycles += (why == crate::stack::End::Cycle) as u64;
            }
            let exact = s.thread_cpu.is_some();
            if exact {
                self.exact_cpu += s.cpu_ns;
            }
            let (v, _) = self.map.entry((s.frames.clone(), labels)).or_insert(([0; 4], exact));
            v[0] += 1;
            v[1] += s.cpu_ns;
            v[2] += s.gil_wait_ns;
            v[3] += wall_ns;
        }
    }

    /// The window's profile, its CPU values rescaled to the process CPU
    /// clock; starts a new window at the latest clock reading.
    pub fn take(&mut self) -> ProfileData {
        let rest_raw: i64 = self.map.values().filter(|(_, exact)| !exact).map(|(v, _)| v[1]).sum();
        let rest_scale = match (self.cpu_start, self.cpu_last) {
            (Some(a), Some(b)) if rest_raw > 0 => Some((b - a - self.exact_cpu).max(0) as f64 / rest_raw as f64),
            _ => None,
        };
        let samples = self
            .map
            .drain()
            .map(|((frames, labels), (mut v, exact))| {
                if let (false, Some(k)) = (exact, rest_scale) {
                    v[1] = (v[1] as f64 * k).round() as i64;
                }
                Sample { frames, values: v.to_vec(), labels }
            })
            .collect();
        self.exact_cpu = 0;
        let mut comments = self.comments.clone();
        if self.truncated > 0 || self.cycles > 0 {
            comments.push(format!(
                "osprey-python: {} samples kept with a [truncated] frame (stack changing while read, or deeper than the limit), {} cyclic frame chains",
                self.truncated, self.cycles
            ));
        }
        (self.truncated, self.cycles) = (0, 0);
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
            comments,
            lines: false,
        };
        self.window_start = SystemTime::now();
        self.window_instant = Instant::now();
        self.cpu_start = self.cpu_last;
        data
    }
}
