//! Threads that block the sampling signal (liblzma's workers, any thread
//! that masks everything), sampled without it: one `perf_event_open`
//! CPU-clock event per such thread (`osprey_perf::ThreadSampler`), whose
//! samples carry the thread's user registers and the top of its stack. The
//! collector drains and unwinds them off the signal path, with the tables
//! the handler uses (`signal::STATE.modules`), reading the stack from the
//! copy. The thread's signal mask is never touched.
//!
//! Accounting (the profile's CPU total stays the process's): discovery
//! charges a blocked thread's CPU under `[signals blocked]` up to the moment
//! its event opened ([`Coverage::Opened`]), never after; from then on each
//! sample charges its period, and what the event counted beyond the
//! samples (ticks in the kernel, which a user-only event does not sample;
//! samples lost to a full ring) goes with the thread's last stack, all of
//! it when the event closes. The event's clock also runs while the
//! hypervisor steals the vCPU, the thread's CPU clock does not: charges are
//! scaled by the ratio of the two over each drain interval. Where the
//! kernel refuses the event (`perf_event_paranoid`, seccomp), the thread
//! stays under `[signals blocked]` and one line says why and what would
//! allow it.

use crate::cpu_clock::thread_cpu_ns;
use crate::record::ContextSnapshot;
use crate::registry::Registry;
use crate::signal::STATE;
use crate::threads::thread_name;
use osprey_perf::{Error, RawSample, ThreadSampler};
use osprey_unwind::{ModuleSet, Shared};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// User stack copied per sample: the frames the CFI walk can follow.
const STACK_BYTES: u32 = 16 << 10;

/// `Record::blocked` of a thread sampled through its event (any non-zero
/// value means the thread blocks the signal): the wall sampler leaves its
/// running time to the event's next sample, as it does to a clock's.
pub const SAMPLED_BY_EVENT: u32 = 2;

/// Bytes of a sample record besides the stack copy (header, registers, sizes).
const RECORD_OVERHEAD: u64 = 128;

/// Whether discovery charges a blocked thread's CPU itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// No event: all its CPU goes under `[signals blocked]`.
    Signals,
    /// The event opened when the thread's CPU clock read this: the CPU
    /// before is discovery's to charge, once; nothing after.
    Opened(u64),
    /// The event charges all of it.
    Sampled,
}

/// One CPU sample (or remainder) taken off the signal path.
pub struct Taken<'a> {
    pub tid: i32,
    /// Leaf first, as the handler stores them.
    pub frames: &'a [u64],
    pub truncated: bool,
    pub cpu_ns: u64,
    /// Samples it stands for (0: a remainder).
    pub count: u32,
    /// Running wall time the wall sampler left pending for the thread.
    pub wall_ns: u64,
    pub context: ContextSnapshot,
}

struct Sampled {
    sampler: ThreadSampler,
    /// Thread CPU when the event opened, until discovery takes it.
    opened_cpu: Option<u64>,
    /// CPU charged so far through this event.
    charged: u64,
    /// The last stack, which remainders go with.
    last: Option<(Vec<u64>, bool)>,
    /// Paused: drained one last time, then dropped.
    closing: bool,
    /// The thread's CPU clock and the event's count at the last drain.
    clocks_at: (u64, u64),
    /// What a counted nanosecond is charged: the thread's CPU clock's
    /// advance over the event's in the last drain interval (at most 1).
    scale: f64,
}

/// The events of the blocked threads. Owned by discovery, on the collector thread.
#[derive(Default)]
pub struct PerfSampled {
    threads: HashMap<i32, Sampled>,
    /// Tids an event was tried for (said once each), while they live.
    tried: HashSet<i32>,
    /// The kernel refuses these events to this process: never tried again.
    refused: Option<String>,
    scratch: Vec<u8>,
    frames: Vec<u64>,
}

impl PerfSampled {
    /// Whether an event should be tried for blocked thread `tid`.
    pub fn wants(&self, tid: i32) -> bool {
        !self.tried.contains(&tid) && !self.threads.contains_key(&tid)
    }

    /// Opens the event of blocked thread `tid`, and says once how the
    /// thread is sampled (or why it cannot be). Returns whether it opened.
    pub fn open(&mut self, tid: i32) -> bool {
        let period = STATE.period_ns.load(Relaxed);
        if period == 0 {
            return false; // sampling not set up: tried again at the next pass
        }
        self.tried.insert(tid);
        let hz = u32::try_from(1_000_000_000 / period).unwrap_or(u32::MAX).clamp(1, 100_000);
        let name = thread_name(tid);
        if self.refused.is_some() {
            // The reason was given with the first thread refused.
            crate::say!(
                "osprey: thread {tid} '{name}' blocks the sampling signal; its CPU time is reported under \
                 [signals blocked] (perf_event_open refused, see above)"
            );
            return false;
        }
        let Some(cpu) = thread_cpu_ns(tid) else { return false };
        match ThreadSampler::open(tid as u32, hz, STACK_BYTES) {
            Ok(sampler) => {
                let s = Sampled {
                    sampler,
                    opened_cpu: Some(cpu),
                    charged: 0,
                    last: None,
                    closing: false,
                    clocks_at: (cpu, 0),
                    scale: 1.0,
                };
                self.threads.insert(tid, s);
                crate::say!(
                    "osprey: thread {tid} '{name}' blocks the sampling signal; sampled with perf_event_open instead"
                );
                true
            }
            Err(Error::NoSuchThread { .. }) => false,
            Err(e) => {
                if matches!(e, Error::Permission { .. } | Error::Unsupported { .. }) {
                    self.refused = Some(e.to_string());
                }
                crate::say!(
                    "osprey: thread {tid} '{name}' blocks the sampling signal; its CPU time is reported under \
                     [signals blocked]: {e}"
                );
                false
            }
        }
    }

    /// Where `tid`'s CPU is charged from now on (see [`Coverage`]).
    pub fn coverage(&mut self, tid: i32) -> Coverage {
        match self.threads.get_mut(&tid) {
            None => Coverage::Signals,
            Some(s) => s.opened_cpu.take().map_or(Coverage::Sampled, Coverage::Opened),
        }
    }

    /// Stops sampling `tid` (it unblocked, or exited): its last samples and
    /// remainder go at the next drain.
    pub fn close(&mut self, tid: i32) {
        if let Some(s) = self.threads.get_mut(&tid) {
            let _ = s.sampler.pause();
            s.closing = true;
        }
    }

    /// Closes the events of threads `alive` says are gone; forgets them.
    pub fn forget_gone(&mut self, alive: impl Fn(i32) -> bool) {
        let gone: Vec<i32> = self.threads.keys().copied().filter(|&t| !alive(t)).collect();
        for tid in gone {
            self.close(tid);
        }
        self.tried.retain(|&t| alive(t) || self.threads.contains_key(&t));
    }

    /// How often the rings must be drained so that none fills: half the
    /// time a ring holds (`osprey_perf::Config`'s default size for the
    /// rate); `None` while no thread is sampled this way.
    pub fn drain_every(&self) -> Option<std::time::Duration> {
        if self.threads.is_empty() {
            return None;
        }
        let period = STATE.period_ns.load(Relaxed).max(1);
        let hz = u32::try_from(1_000_000_000 / period).unwrap_or(u32::MAX).clamp(1, 100_000);
        let pages = osprey_perf::Config::new(hz, STACK_BYTES).ring_pages_or_default() as u64;
        let samples = pages * 4096 / (u64::from(STACK_BYTES) + RECORD_OVERHEAD);
        Some(std::time::Duration::from_nanos((samples * period / 2).max(1_000_000)))
    }

    /// Closes every event (the agent stops); [`PerfSampled::drain`] then
    /// charges what they counted.
    pub fn close_all(&mut self) {
        let tids: Vec<i32> = self.threads.keys().copied().collect();
        for tid in tids {
            self.close(tid);
        }
    }

    /// Unwinds the samples in every ring and passes them to `f`, with the
    /// remainders due; drops closed events. Returns CPU counted by events
    /// of threads never sampled with a stack (for `[signals blocked]`).
    pub fn drain(&mut self, reg: &Registry, f: &mut dyn FnMut(&Taken<'_>)) -> Vec<(i32, u64)> {
        if self.threads.is_empty() {
            return vec![];
        }
        let period = STATE.period_ns.load(Relaxed).max(1);
        let depth = STATE.max_depth.load(Relaxed).clamp(1, crate::record::MAX_FRAMES);
        self.frames.resize(depth, 0);
        // SAFETY: published by the agent and never freed (see `HandlerState::modules`).
        let shared: Option<&Shared<ModuleSet>> = unsafe { STATE.modules.load(Acquire).as_ref() };
        let mut unstacked = vec![];
        let mut done = vec![];
        for (&tid, s) in &mut self.threads {
            let rec = reg.lookup(tid).map(|(_, r)| r);
            let context = rec.and_then(|r| r.context.read()).unwrap_or_default();
            // A closing thread's clock may be gone: the last scale then.
            if let (Some(cpu), Ok(c)) = (thread_cpu_ns(tid), s.sampler.counts()) {
                let (cpu0, count0) = s.clocks_at;
                if c.cpu_ns > count0 {
                    s.scale = (cpu.saturating_sub(cpu0) as f64 / (c.cpu_ns - count0) as f64).min(1.0);
                    s.clocks_at = (cpu, c.cpu_ns);
                }
            }
            let k = s.scale;
            let scaled = move |ns: u64| (ns as f64 * k).round() as u64;
            // Counted nanoseconds (`charged`), and what they are charged.
            let (mut charged, mut charged_ns) = (0, 0);
            let frames = &mut self.frames;
            let last = &mut s.last;
            s.sampler.drain(&mut self.scratch, &mut |raw| {
                let (len, truncated) = unwind(shared, raw, frames);
                if len == 0 {
                    return;
                }
                let wall_ns = rec.map_or(0, |r| r.wall_pending_ns.swap(0, Relaxed));
                let stack = &frames[..len];
                f(&Taken { tid, frames: stack, truncated, cpu_ns: scaled(raw.period), count: 1, wall_ns, context });
                charged += raw.period;
                charged_ns += scaled(raw.period);
                if last.as_ref().is_none_or(|(l, t)| l.as_slice() != stack || *t != truncated) {
                    *last = Some((stack.to_vec(), truncated));
                }
            });
            // What the event counted beyond its samples: all of it at the
            // end, else what exceeds the period in progress.
            let counted = s.sampler.counts().map_or(s.charged + charged, |c| c.cpu_ns);
            let excess = counted.saturating_sub(s.charged + charged);
            let owed = if s.closing { excess } else { excess.saturating_sub(2 * period).div_ceil(period) * period };
            let owed = owed.min(excess);
            if owed > 0 {
                match &s.last {
                    Some((stack, truncated)) => {
                        f(&Taken {
                            tid,
                            frames: stack,
                            truncated: *truncated,
                            cpu_ns: scaled(owed),
                            count: 0,
                            wall_ns: 0,
                            context,
                        });
                    }
                    None => unstacked.push((tid, scaled(owed))),
                }
                charged += owed;
                charged_ns += scaled(owed);
            }
            s.charged += charged;
            if let Some(r) = rec {
                r.charged_ns.fetch_add(charged_ns, Relaxed);
            }
            STATE.charged_ns.fetch_add(charged_ns, Relaxed);
            if s.closing {
                done.push(tid);
            }
        }
        for tid in done {
            self.threads.remove(&tid);
        }
        unstacked
    }
}

/// The CFI walk of a sample over its stack copy, with the published tables
/// (the leaf alone when there are none yet). Returns the frames written and
/// whether the walk stopped short of an outermost frame.
fn unwind(shared: Option<&Shared<ModuleSet>>, raw: &RawSample<'_>, frames: &mut [u64]) -> (usize, bool) {
    let Some(r) = raw.regs else { return (0, true) };
    let regs = osprey_unwind::Regs { pc: r.ip, sp: r.sp, fp: r.bp };
    let walked = shared.and_then(|s| s.read(|set| osprey_unwind::unwind(set, regs, |a| raw.read_stack(a), frames)));
    match walked {
        Some(w) if w.len > 0 => (w.len, w.truncated),
        _ => match frames.first_mut() {
            Some(f) => {
                *f = r.ip;
                (1, true)
            }
            None => (0, true),
        },
    }
}
