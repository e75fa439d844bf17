//! The wall-clock tick, run by the collector thread `wall_hz` times a
//! second: which threads are sampled, what each sample weighs, and where
//! the samples go.
//!
//! - Selection: at most `wall_threads` threads a tick, taken in turn from
//!   the process's thread list (refreshed every [`LIST_EVERY_NS`]), so each
//!   tick costs at most that many samples whatever the thread count.
//! - Schedule: ticks follow their own timeline, each spaced from the
//!   previous *scheduled* one by the interval jittered ±50% (a fixed period
//!   would phase-lock with programs that wake on timers of a similar
//!   period: a tick landing each time just as a thread wakes would see it
//!   running, never asleep).
//! - Weight: every thread sampled at a tick stands for `spacing × live /
//!   sampled` wall nanoseconds, `spacing` the tick's scheduled spacing and
//!   `live` the threads listed. The spacing, not the time that actually
//!   elapsed, so that the weight does not depend on what the threads do:
//!   a collector held up by CPU contention wakes later when the observed
//!   threads are running, and weighting by the elapsed time would then
//!   favour the running state. Ticks late by more than [`MAX_BEHIND_NS`]
//!   are dropped from the timeline (that time is not accounted).
//! - A blocked thread is sampled here, from `/proc` and a copy of its stack
//!   ([`super::blocked`]), never signalled. One whose CPU clock has not
//!   advanced since its last consistent blocked sample has not run since:
//!   its stack and state are that sample's, reused without reading `/proc`
//!   or its stack (most threads of a server are idle most of the time).
//! - A running thread is never signalled either: its weight is added to its
//!   record's `wall_pending_ns`, which its next CPU-clock sample records
//!   with that sample's stack (`signal::wall`). While running, wall time and
//!   CPU time advance together, so the stacks of CPU samples are distributed
//!   as the running thread's wall time is. A running thread with no CPU
//!   clock (no record yet, or it blocks the sampling signal) is accounted
//!   here without a stack.
//! - A failure of the kernel interfaces (no `/proc/TID/syscall`,
//!   `process_vm_readv` refused) stops wall sampling with one line on stderr.

use super::blocked::{self, Blocked, Buffers};
use super::proc::ReadError;
use super::thread_state;
use crate::cpu_clock::thread_cpu_ns;
use crate::record::{ContextSnapshot, Record, RecordState};
use crate::registry::Registry;
use crate::signal::{sys, STATE};
use crate::threads::{is_internal, list_threads};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// How often the thread list is re-read.
pub const LIST_EVERY_NS: u64 = 200_000_000;

/// How far the timeline may fall behind before the ticks missed are dropped
/// (the ticks that catch up all observe about the same moment: a long
/// burst of them would weigh one instant heavily).
pub const MAX_BEHIND_NS: u64 = 250_000_000;

/// Pending running time past which a thread's CPU clock is taken to be
/// silent (it blocks the signal, or lost its clock): the time is
/// accounted without a stack rather than held.
const MAX_PENDING_NS: u64 = 10_000_000_000;

/// What the wall sampler did, since the process started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Ticks run.
    pub ticks: AtomicU64,
    /// Threads found running (left to their CPU clock).
    pub running: AtomicU64,
    /// Blocked threads sampled.
    pub blocked: AtomicU64,
    /// Blocked samples whose walk ended before an outermost frame.
    pub truncated: AtomicU64,
    /// Frame pointers recovered by scanning a copied stack.
    pub recovered: AtomicU64,
    /// Blocked samples whose walk was discarded (leaf only): the thread
    /// moved between the two reads of `/proc`.
    pub inconsistent: AtomicU64,
    /// Blocked threads whose stack could not be read at `sp`.
    pub unreadable: AtomicU64,
    /// Running threads accounted without a stack (no CPU clock).
    pub unclocked: AtomicU64,
    /// Blocked samples reused from the thread's previous one (it had not run).
    pub reused: AtomicU64,
}

/// The process's wall-sampler counters.
pub static COUNTERS: Counters = Counters {
    ticks: AtomicU64::new(0),
    running: AtomicU64::new(0),
    blocked: AtomicU64::new(0),
    truncated: AtomicU64::new(0),
    recovered: AtomicU64::new(0),
    inconsistent: AtomicU64::new(0),
    unreadable: AtomicU64::new(0),
    unclocked: AtomicU64::new(0),
    reused: AtomicU64::new(0),
};

/// A wall sample taken off the signal path, for the aggregator: `frames`
/// leaf first, `ns` of wall time in `state`, with the thread's trace
/// context at the time.
#[derive(Debug)]
pub struct Taken<'a> {
    /// The thread.
    pub tid: i32,
    /// Its stack, leaf first (empty when it could not be walked).
    pub frames: &'a [u64],
    /// The walk did not reach an outermost frame.
    pub truncated: bool,
    /// Wall nanoseconds the sample stands for.
    pub ns: u64,
    /// Its state (`state` encoding).
    pub state: u16,
    /// Its trace context.
    pub context: ContextSnapshot,
}

/// The collector's wall sampler.
pub struct Sampler {
    per_tick: usize,
    interval_ns: u64,
    tids: Vec<i32>,
    cursor: usize,
    listed_ns: Option<u64>,
    /// When the next tick is due, and its spacing from the previous one.
    due_ns: u64,
    spacing_ns: u64,
    buf: Buffers,
    stopped: bool,
    /// xorshift state of the tick jitter.
    jitter: u64,
    /// Each listed thread's last consistent blocked sample.
    last: HashMap<i32, Last>,
}

/// A blocked sample kept for reuse while its thread does not run.
struct Last {
    /// The thread's CPU clock, read before the sample.
    cpu_ns: u64,
    frames: Vec<u64>,
    truncated: bool,
    state: u16,
}

impl Sampler {
    /// A sampler of at most `per_tick` threads, `hz` ticks a second.
    pub fn new(hz: u32, per_tick: usize) -> Sampler {
        let depth = STATE.max_depth.load(Relaxed).clamp(1, crate::record::MAX_FRAMES);
        Sampler {
            per_tick: per_tick.max(1),
            interval_ns: 1_000_000_000 / u64::from(hz.max(1)),
            tids: Vec::new(),
            cursor: 0,
            listed_ns: None,
            due_ns: sys::monotonic_ns(),
            spacing_ns: 1_000_000_000 / u64::from(hz.max(1)),
            buf: Buffers::new(depth),
            stopped: false,
            jitter: sys::monotonic_ns() | 1,
            last: HashMap::new(),
        }
    }

    /// Whether sampling stopped for good (a kernel interface failed).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Time until the next tick is due.
    pub fn until_due(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.due_ns.saturating_sub(sys::monotonic_ns()))
    }

    /// The interval jittered uniformly by ±50%.
    fn draw_spacing(&mut self) -> u64 {
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let half = self.interval_ns / 2;
        half + self.jitter % (2 * half).max(1)
    }

    /// One tick: samples the next threads in turn, giving blocked ones to
    /// `add` and leaving running ones to their CPU clocks.
    pub fn tick(&mut self, reg: &Registry, add: &mut dyn FnMut(Taken<'_>)) {
        if self.stopped {
            return;
        }
        let now = sys::monotonic_ns();
        let spacing = self.spacing_ns;
        self.spacing_ns = self.draw_spacing();
        self.due_ns = if now.saturating_sub(self.due_ns) > MAX_BEHIND_NS {
            now + self.spacing_ns
        } else {
            self.due_ns + self.spacing_ns
        };
        if self.listed_ns.is_none_or(|t| now.saturating_sub(t) >= LIST_EVERY_NS) {
            match list_threads() {
                Ok(mut t) => {
                    t.retain(|&tid| !is_internal(tid));
                    t.sort_unstable();
                    self.last.retain(|tid, _| t.binary_search(tid).is_ok());
                    self.tids = t;
                    self.listed_ns = Some(now);
                }
                Err(e) => return self.stop(&format!("cannot list threads: {e}")),
            }
        }
        let live = self.tids.len();
        if live == 0 {
            return;
        }
        COUNTERS.ticks.fetch_add(1, Relaxed);
        let n = self.per_tick.min(live);
        let weight = spacing.saturating_mul(live as u64) / n as u64;
        for i in 0..n {
            let Some(&tid) = self.tids.get((self.cursor + i) % live) else { continue };
            if let Err(why) = self.sample(reg, add, tid, weight) {
                return self.stop(&why);
            }
        }
        self.cursor = (self.cursor + n) % live;
    }

    /// Samples one thread; `Err` says why wall sampling cannot go on.
    fn sample(&mut self, reg: &Registry, add: &mut dyn FnMut(Taken<'_>), tid: i32, weight: u64) -> Result<(), String> {
        let rec = reg.lookup(tid).map(|(_, r)| r).filter(|r| r.state() == RecordState::Claimed);
        let (lo, hi) = rec.map_or((0, 0), |r| (r.stack_lo.load(Relaxed) as u64, r.stack_hi.load(Acquire) as u64));
        let context = rec.and_then(|r| r.context.read()).unwrap_or_default();
        let mut add = |frames: &[u64], truncated: bool, state: u16, ns: u64| {
            add(Taken { tid, frames, truncated, ns, state, context })
        };
        // Invariant: a thread's CPU clock advances whenever it runs, so an
        // equal reading means its registers and stack are those of `last`
        // (one woken but not yet on a CPU is still counted in its wait).
        let cpu_ns = thread_cpu_ns(tid);
        if let Some(l) = self.last.get(&tid).filter(|l| Some(l.cpu_ns) == cpu_ns) {
            COUNTERS.blocked.fetch_add(1, Relaxed);
            COUNTERS.reused.fetch_add(1, Relaxed);
            add(&l.frames, l.truncated, l.state, weight);
            return Ok(());
        }
        self.last.remove(&tid);
        let outcome = blocked::sample(tid, lo, hi, &mut self.buf);
        match outcome {
            Ok(Blocked::Sample { walk, nr }) => {
                COUNTERS.blocked.fetch_add(1, Relaxed);
                COUNTERS.recovered.fetch_add(u64::from(walk.recovered), Relaxed);
                if walk.truncated {
                    COUNTERS.truncated.fetch_add(1, Relaxed);
                }
                let frames = self.buf.frames.get(..walk.len).unwrap_or(&[]);
                let state = thread_state::in_syscall(nr);
                add(frames, walk.truncated, state, weight);
                if let Some(cpu_ns) = cpu_ns {
                    let last = Last { cpu_ns, frames: frames.to_vec(), truncated: walk.truncated, state };
                    self.last.insert(tid, last);
                }
            }
            Ok(Blocked::Running) => {
                COUNTERS.running.fetch_add(1, Relaxed);
                let here = leave_to_clock(rec, weight);
                if here > 0 {
                    COUNTERS.unclocked.fetch_add(1, Relaxed);
                    add(&[], true, thread_state::RUNNING, here);
                }
            }
            Ok(Blocked::Inconsistent { nr, pc }) => {
                // Blocked at the tick, in `nr` at `pc`: the time is the
                // state's; only the stack past `pc` is unknown.
                COUNTERS.inconsistent.fetch_add(1, Relaxed);
                add(&[pc], true, thread_state::in_syscall(nr), weight);
            }
            Ok(Blocked::Unreadable) => {
                COUNTERS.unreadable.fetch_add(1, Relaxed);
                add(&[], true, thread_state::SLEEPING, weight);
            }
            Err(ReadError::Gone | ReadError::Transient(_)) => {}
            Err(ReadError::Unsupported(e)) => return Err(format!("cannot read thread {tid}'s state: {e}")),
        }
        Ok(())
    }

    fn stop(&mut self, why: &str) {
        self.stopped = true;
        crate::say!("osprey: wall-time sampling stopped: {why}");
    }
}

/// Leaves `weight` to the CPU clock of a running thread (or to the perf
/// event of one that blocks the signal, `crate::blocked`), which records it
/// with its next sample; returns the nanoseconds the caller must account
/// itself: `weight` when the thread has neither, everything pending when
/// the clock stayed silent for [`MAX_PENDING_NS`], else 0.
fn leave_to_clock(rec: Option<&Record>, weight: u64) -> u64 {
    let Some(rec) = rec else { return weight };
    let blocked = rec.blocked.load(Relaxed);
    let event = blocked == crate::blocked::SAMPLED_BY_EVENT;
    if !event && (rec.clock.load(Relaxed) == 0 || blocked != 0) {
        return weight;
    }
    let before = rec.wall_pending_ns.fetch_add(weight, Relaxed);
    if before.saturating_add(weight) > MAX_PENDING_NS {
        return rec.wall_pending_ns.swap(0, Relaxed);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RegistryConfig;
    use std::time::Duration;

    /// The state of `tid` in its samples over `ticks` ticks, with how many
    /// of them were reused.
    fn states_of(s: &mut Sampler, reg: &Registry, tid: i32, ticks: usize) -> (Vec<u16>, u64) {
        let reused = COUNTERS.reused.load(Relaxed);
        let mut states = vec![];
        for _ in 0..ticks {
            s.tick(reg, &mut |t| {
                if t.tid == tid {
                    states.push(t.state)
                }
            });
        }
        (states, COUNTERS.reused.load(Relaxed) - reused)
    }

    /// A thread that stays blocked is read once and reused; once it wakes
    /// (its CPU clock moves), it is read again and shows its new wait.
    #[test]
    fn a_sample_is_reused_only_while_its_thread_does_not_run() {
        let reg = Registry::get_or_init(RegistryConfig::default()).unwrap();
        let mut fds = [0; 2];
        // SAFETY: valid out array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tx.send(sys::gettid()).unwrap();
            let mut b = [0u8; 1];
            // SAFETY: reading one byte into a local buffer from our pipe.
            unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
            std::thread::sleep(Duration::from_secs(3));
        });
        let tid = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut s = Sampler::new(100, 1024);
        let (before, reused) = states_of(&mut s, reg, tid, 5);
        assert_eq!(before, vec![thread_state::in_syscall(libc::SYS_read); 5]);
        assert!(reused >= 4, "{reused} of 5 samples of a blocked thread reused");
        // SAFETY: writing one byte to our pipe.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        std::thread::sleep(Duration::from_millis(100));
        let (after, _) = states_of(&mut s, reg, tid, 5);
        let sleeping = thread_state::in_syscall(libc::SYS_clock_nanosleep);
        assert_eq!(after, vec![sleeping; 5], "the wait after the wake-up");
        h.join().unwrap();
        // SAFETY: our pipe's descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
