//! Samples aggregated by (stack, labels) into one profile per window.

use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use osprey_pprof::{Frame, Label, LabelValue, ProfileData, Sample};

use super::sampler::{Sampler, ThreadSample};
use crate::sampling::thread_state::State;

/// A stack and its labels.
type Key = (Vec<Frame>, Vec<Label>);

/// Samples aggregated by (stack, labels) until [`Aggregator::take`].
///
/// Values per key: `[samples, cpu ns, gil-wait ns, wall ns]` (wall last:
/// the default of pprof readers). Invariants, per window:
/// the samples of a thread with an exact clock ([`ThreadSample::thread_cpu`])
/// share, in proportion to their raw charges ([`ThreadSample::cpu_ns`]),
/// exactly what that clock advanced since the thread's last sample of the
/// previous window (all of it on the thread's latest sample that is not
/// `sleeping` when none was charged; a thread only seen sleeping in the
/// window leaves out what its wakeups used); `sleeping` samples carry no
/// CPU; the samples of threads without one share, in the same way,
/// what the process CPU clock advanced beyond the exact threads. Every
/// sample carries `thread id`, `thread name` (the Python name where known,
/// else the OS name; see [`crate::sampling::thread_names`]), `state` and `process`
/// labels, an asyncio task's a `task` label, and one in an OpenTelemetry
/// span `trace id`, `span id` and `local root span id`.
pub struct Aggregator {
    pid: i32,
    interval_ns: i64,
    comments: Vec<String>,
    window_start: SystemTime,
    window_instant: Instant,
    /// Process CPU clock at the window's start, and the latest one seen.
    cpu_start: Option<i64>,
    cpu_last: Option<i64>,
    /// Values, and the thread id when the thread has an exact clock, per
    /// (stack, labels).
    map: HashMap<Key, ([i64; 4], Option<i32>)>,
    /// Threads with an exact clock.
    clocked: HashMap<i32, Clocked>,
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
    /// The target has a GIL: profiles carry `gil-wait` (a free-threaded
    /// target's leave that sample type out rather than carry zeros).
    gil: bool,
}

impl Aggregator {
    pub fn new(pid: i32, interval_ns: i64, s: &Sampler) -> Self {
        let ft = s.target.layout.free_threaded;
        let mut a = Self::with_comments(
            pid,
            interval_ns,
            vec![
                format!("python {}{}", s.target.version, if ft { " free-threaded" } else { "" }),
                format!("osprey-python method {:?}", s.method.map(|m| format!("{m:?}")).unwrap_or("combined".into())),
            ],
        );
        a.gil = !ft;
        a
    }

    fn with_comments(pid: i32, interval_ns: i64, comments: Vec<String>) -> Self {
        Aggregator {
            pid,
            interval_ns,
            comments,
            window_start: SystemTime::now(),
            window_instant: Instant::now(),
            cpu_start: None,
            cpu_last: None,
            map: HashMap::new(),
            clocked: HashMap::new(),
            process: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|n| n.trim_end().to_string())
                .unwrap_or_default(),
            truncated: 0,
            cycles: 0,
            timeline: false,
            gil: true,
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
                Label { key: "state".into(), value: LabelValue::Str(s.state.label().into()) },
                Label { key: "process".into(), value: LabelValue::Str(self.process.clone()) },
            ];
            if self.timeline {
                labels.push(Label { key: osprey_pprof::TIMESTAMP_LABEL.into(), value: LabelValue::Num(now_ns) });
            }
            if let Some(t) = &s.task {
                labels.push(Label { key: "task".into(), value: LabelValue::Str(t.clone()) });
            }
            if let Some(span) = &s.span {
                // The keys and formats of native samples' span labels; the
                // trace id as W3C writes it: 32 lowercase hex digits.
                labels
                    .push(Label { key: "trace id".into(), value: LabelValue::Str(format!("{:032x}", span.trace_id)) });
                labels.push(Label { key: "span id".into(), value: LabelValue::Num(span.span_id as i64) });
                labels.push(Label {
                    key: "local root span id".into(),
                    value: LabelValue::Num(span.local_root_span_id as i64),
                });
            }
            if let Some(why) = s.truncated {
                self.truncated += 1;
                self.cycles += (why == crate::walk::End::Cycle) as u64;
            }
            let key = (s.frames.clone(), labels);
            let exact = s.thread_cpu.map(|clock| {
                let c = self.clocked.entry(s.tid).or_default();
                // A clock below the last reading is a new clock (the thread
                // id was reused, or the clock reopened): it counts from 0.
                c.cpu += clock.checked_sub(c.last).unwrap_or(clock) as i64;
                c.last = clock;
                c.raw += s.cpu_ns;
                // Needed only while none of its samples is charged.
                if c.raw > 0 {
                    c.latest = None;
                } else if s.state != State::Sleeping {
                    c.latest = Some(key.clone());
                }
                c.seen = true;
                s.tid
            });
            let (v, _) = self.map.entry(key).or_insert(([0; 4], exact));
            v[0] += 1;
            v[1] += s.cpu_ns;
            v[2] += s.gil_wait_ns;
            v[3] += wall_ns;
        }
    }

    /// The window's profile, its CPU values rescaled to the process CPU
    /// clock; starts a new window at the latest clock reading.
    pub fn take(&mut self) -> ProfileData {
        let exact_cpu: i64 = self.clocked.values().map(|c| c.cpu).sum();
        let rest_raw: i64 = self.map.values().filter(|(_, exact)| exact.is_none()).map(|(v, _)| v[1]).sum();
        let rest_scale = match (self.cpu_start, self.cpu_last) {
            (Some(a), Some(b)) if rest_raw > 0 => Some((b - a - exact_cpu).max(0) as f64 / rest_raw as f64),
            _ => None,
        };
        for c in self.clocked.values_mut().filter(|c| c.raw == 0 && c.cpu > 0) {
            if let Some((v, _)) = c.latest.as_ref().and_then(|k| self.map.get_mut(k)) {
                (v[1], c.raw) = (c.cpu, c.cpu);
            }
        }
        let clocked = &self.clocked;
        let samples = self
            .map
            .drain()
            .map(|((frames, labels), (mut v, exact))| {
                let scale = match exact {
                    Some(tid) => clocked.get(&tid).filter(|c| c.raw > 0).map(|c| c.cpu as f64 / c.raw as f64),
                    None => rest_scale,
                };
                if let Some(k) = scale {
                    v[1] = (v[1] as f64 * k).round() as i64;
                }
                let values = if self.gil { v.to_vec() } else { vec![v[0], v[1], v[3]] };
                Sample { frames, values, labels }
            })
            .collect();
        // A thread not sampled in this window has ended.
        self.clocked.retain(|_, c| c.seen);
        for c in self.clocked.values_mut() {
            (c.cpu, c.raw, c.latest, c.seen) = (0, 0, None, false);
        }
        let mut comments = self.comments.clone();
        if self.truncated > 0 || self.cycles > 0 {
            comments.push(format!(
                "osprey-python: {} samples kept with a [truncated] frame (stack changing while read, or deeper than the limit), {} cyclic frame chains",
                self.truncated, self.cycles
            ));
        }
        (self.truncated, self.cycles) = (0, 0);
        let start_ns = self.window_start.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        let mut sample_types = vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())];
        if self.gil {
            sample_types.push(("gil-wait".into(), "nanoseconds".into()));
        }
        sample_types.push(("wall".into(), "nanoseconds".into()));
        let data = ProfileData {
            pid: self.pid,
            process: None,
            sample_types,
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

/// A thread with an exact clock, in the current window.
#[derive(Default)]
struct Clocked {
    /// Its clock at its latest sample (kept across windows).
    last: u64,
    /// What its clock advanced in the window, and its samples' raw charges.
    cpu: i64,
    raw: i64,
    /// The key of its latest sample in the window that is not `sleeping`,
    /// kept while none of its samples is charged.
    latest: Option<Key>,
    /// Whether it was sampled in the window.
    seen: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(tid: i32, leaf: &str, cpu_ns: i64, thread_cpu: Option<u64>) -> ThreadSample {
        ThreadSample {
            tid,
            name: "t".into(),
            state: State::Running,
            cpu_ns,
            tstate: 0,
            frames: vec![Frame::Synthetic(leaf.into())],
            truncated: None,
            thread_cpu,
            gil_wait_ns: 0,
            task: None,
            span: None,
        }
    }

    /// CPU by leaf name.
    fn cpu(data: &ProfileData) -> HashMap<String, i64> {
        let mut m = HashMap::new();
        for s in &data.samples {
            let Frame::Synthetic(n) = &s.frames[0] else { unreachable!() };
            *m.entry(n.clone()).or_default() += s.values[1];
        }
        m
    }

    #[test]
    fn a_threads_charges_share_exactly_what_its_clock_advanced() {
        let mut a = Aggregator::with_comments(1, 10_000_000, vec![]);
        // Thread 7: 31 ms of CPU (from its clock's opening) over three samples charged 10, 10 and 0 ms
        // of raw weight. Thread 8: 5 ms, never seen on a CPU.
        a.add(&[sample(7, "f", 10_000_000, Some(1_000_000)), sample(8, "idle", 0, Some(0))], 10_000_000, None);
        a.add(&[sample(7, "g", 10_000_000, Some(21_000_000)), sample(8, "idle", 0, Some(2_000_000))], 10_000_000, None);
        a.add(&[sample(7, "h", 0, Some(31_000_000)), sample(8, "wait", 0, Some(5_000_000))], 10_000_000, None);
        let mut asleep = sample(8, "asleep", 0, Some(5_000_000));
        asleep.state = State::Sleeping;
        a.add(&[asleep], 10_000_000, None);
        let c = cpu(&a.take());
        assert_eq!((c["f"], c["g"], c["h"]), (15_500_000, 15_500_000, 0));
        assert_eq!(
            (c["idle"], c["wait"], c["asleep"]),
            (0, 5_000_000, 0),
            "uncharged CPU on the latest sample not asleep"
        );
        // The next window counts from the last readings.
        a.add(&[sample(7, "f", 3, Some(41_000_000)), sample(8, "idle", 0, Some(5_000_000))], 10_000_000, None);
        let c = cpu(&a.take());
        assert_eq!((c["f"], c["idle"]), (10_000_000, 0));
        // A thread id reused by a new thread: its clock counts from 0 again.
        a.add(&[sample(7, "f", 1, Some(2_000_000))], 10_000_000, None);
        assert_eq!(cpu(&a.take())["f"], 2_000_000);
    }

    #[test]
    fn without_a_gil_there_is_no_gil_wait_type() {
        let mut a = Aggregator::with_comments(1, 10_000_000, vec![]);
        a.gil = false;
        a.add(&[sample(7, "f", 10, Some(1_000))], 10_000_000, None);
        let p = a.take();
        let types: Vec<&str> = p.sample_types.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(types, ["samples", "cpu", "wall"]);
        assert_eq!(p.samples[0].values, [1, 1_000, 10_000_000]);
    }
}
