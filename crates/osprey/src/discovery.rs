//! The discovery path: a scan of `/proc/self/task` that finds threads nobody
//! announced (the thread-start path is in `crate::threads`), and the
//! once-a-second check of every thread's CPU clock against its samples.
//!
//! - A new thread is primed only while it is running (`R` in its `stat`): a
//!   sleeping thread is never woken by osprey, so its `nanosleep`/`epoll_wait`
//!   never returns `EINTR` because of priming. A thread that has the priming
//!   signal blocked is never signalled. A running thread still unregistered
//!   a second after its priming (the signal may have met a moment where
//!   the claim could not complete) is primed again, at most
//!   [`MAX_PRIMES`] times in all, and never while a priming signal is
//!   still pending for it.
//! - A thread that blocks the sampling signal (liblzma's workers, any thread
//!   that masks everything) gets no clock: it is sampled through a
//!   `perf_event_open` event instead (`crate::blocked`), opened at the first
//!   pass that finds it blocked and closed when it unblocks or exits. Where
//!   the kernel refuses that event, its CPU time, read from its CPU clock,
//!   is reported under a `[signals blocked]` frame. One line on stderr says
//!   which. Pending signals caused by osprey are thereby bounded by the
//!   thread count (a POSIX timer keeps at most one pending).
//! - The scan backs off while nothing changes (up to one second), so its
//!   cost does not grow with idle threads; the interval comes back down at
//!   the first change. Threads the start hook registered are no change.
//!   While it backs off, a pass that finds the thread count and the
//!   registry's claim/retire counter as they were lists nothing (a full
//!   listing at least every 10 s); while a listed thread could still be
//!   registered, only once backed off to the full second.

use crate::blocked::{Coverage, PerfSampled, SAMPLED_BY_EVENT};
use crate::cpu_clock::{self, thread_cpu_ns, Armed};
use crate::record::{Origin, Record, RecordState};
use crate::registry::Registry;
use crate::signal::{sys, STATE};
use crate::threads::{
    internal_tids, is_internal, list_threads, signal_blocked, signal_pending, stack_bounds_of, thread_count,
    thread_running,
};
use std::collections::HashMap;
use std::sync::atomic::Ordering::*;
use std::time::Duration;

/// How often clocks are checked against samples, and blocked or
/// unregistered threads' CPU time is accounted.
const CHECK_NS: u64 = 1_000_000_000;

/// Most priming signals a thread is ever sent.
pub const MAX_PRIMES: u32 = 3;

/// Passes that look again soon at a new thread found blocking the priming signal.
const BLOCKED_LOOKS: u32 = 10;

/// Time after which a running thread still unregistered is primed again.
const REPRIME_NS: u64 = 1_000_000_000;

/// Longest interval the scan backs off to while nothing changes.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// While backed off, a full scan (listing every thread) runs only when the
/// thread count or the registry changed, or after this long.
const FULL_SCAN_NS: u64 = 10_000_000_000;

/// While backed off, the per-thread clock check is skipped when the
/// process's CPU not charged to samples grew by less than this many
/// sampling periods since the last check that ran (see [`uncharged_ns`]),
/// and runs at least this often anyway.
const QUIET_PERIODS: u64 = 3;
const FULL_CHECK_NS: u64 = 10_000_000_000;

/// CPU time osprey could not sample, per thread, since the last flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unsampled {
    /// The thread blocks the sampling signal.
    Blocked(i32),
    /// The thread has no record (not primed yet, or the pool is exhausted).
    Unregistered,
}

/// The scan's state. Owned by the collector thread.
#[derive(Default)]
pub struct Discovery {
    /// Tids sent the priming signal: how often, and when last.
    primed: HashMap<i32, (u32, u64)>,
    /// How many passes found each unregistered tid blocking the priming signal.
    blocked_seen: HashMap<i32, u32>,
    /// An unregistered thread used CPU since the last clock check: scan at
    /// the shortest interval to catch it running.
    unregistered_busy: bool,
    /// The last full scan found a thread it could register (no record yet,
    /// records free): passes keep listing, to prime it when it runs.
    unregistered_listed: bool,
    /// Tids listed by the previous scan.
    listed: Vec<i32>,
    /// Per thread: CPU ns and samples at the last check.
    checked: HashMap<i32, (u64, u64)>,
    /// CPU ns of unregistered threads at the last check.
    unregistered: HashMap<i32, u64>,
    /// Accounted since the last `take_unsampled`.
    unsampled: HashMap<Unsampled, u64>,
    /// The events of threads that block the signal.
    perf: PerfSampled,
    last_check_ns: u64,
    /// Whether a check has run: threads seen after it count from their start.
    checked_once: bool,
    /// [`uncharged_ns`] and the time when the last per-thread check ran.
    uncharged_at_check: Option<(i64, u64)>,
    /// [`uncharged_ns`] when the collector started (see [`Discovery::started`]).
    uncharged_at_start: Option<i64>,
    /// The current scan interval (backs off while nothing changes).
    interval: Option<Duration>,
    /// Thread count and registry changes when the last full scan started.
    fingerprint: Option<(u64, u64)>,
    /// When the last full scan started.
    last_full_ns: u64,
}

impl Discovery {
    /// One pass: prime new running threads, finish the setup of primed ones
    /// (stack bounds, CPU clock), retire records of threads that are gone,
    /// and once a second check clocks against samples. Returns the tids that
    /// appeared since the previous pass unannounced: not registered by the
    /// start hook, so their exit leaves no name in a record.
    pub fn scan(&mut self, reg: &Registry) -> Vec<i32> {
        let started = sys::monotonic_ns();
        // Backing off and nothing changed (same thread count, no record
        // claimed or retired): no listing, only the clock check when due.
        let fingerprint = thread_count().map(|n| (n, reg.changes.load(Relaxed)));
        let backing_off = match self.interval {
            Some(i) if self.unregistered_listed => i == MAX_BACKOFF,
            Some(i) => !i.is_zero(),
            None => false,
        };
        if backing_off
            && fingerprint.is_some()
            && fingerprint == self.fingerprint
            && started.saturating_sub(self.last_full_ns) < FULL_SCAN_NS
        {
            self.interval = self.interval.map(|i| (i * 2).min(MAX_BACKOFF));
            if started.saturating_sub(self.last_check_ns) >= CHECK_NS {
                self.last_check_ns = started;
                if self.quiet(started) {
                    return vec![];
                }
                let tids = std::mem::take(&mut self.listed);
                self.check_clocks(reg, &tids);
                self.listed = tids;
                if self.unregistered_busy {
                    self.fingerprint = None;
                }
            }
            return vec![];
        }
        self.fingerprint = fingerprint;
        self.last_full_ns = started;
        let Ok(tids) = list_threads() else { return vec![] };
        let appeared: Vec<i32> =
            tids.iter().copied().filter(|t| self.listed.binary_search(t).is_err() && !is_internal(*t)).collect();
        let gone = self.listed.iter().any(|t| tids.binary_search(t).is_err());
        let pid = sys::getpid();
        let prime = STATE.prime_signal.load(Relaxed);
        let mut maps: Option<Vec<u8>> = None;
        let mut waiting = false;
        self.unregistered_listed = false;
        for &tid in &tids {
            if is_internal(tid) {
                continue;
            }
            match reg.lookup(tid) {
                None if prime > 0 && reg.free_count() > 0 => {
                    self.unregistered_listed = true;
                    let (count, last) = self.primed.get(&tid).copied().unwrap_or((0, 0));
                    if count >= MAX_PRIMES || (count > 0 && started.saturating_sub(last) < REPRIME_NS) {
                        continue;
                    }
                    if signal_blocked(tid, prime) == Some(true) {
                        // Never signalled while it blocks the signal (its CPU is
                        // accounted below). A thread just created blocks every
                        // signal for a moment: look again soon, a few times.
                        let seen = self.blocked_seen.entry(tid).or_default();
                        *seen += 1;
                        waiting |= *seen <= BLOCKED_LOOKS;
                    } else if thread_running(tid) && signal_pending(tid, prime) == Some(false) {
                        sys::tgkill(pid, tid, prime);
                        self.primed.insert(tid, (count + 1, started));
                    }
                    // Asleep: primed when a scan finds it running; the clock
                    // check brings the scan back to its shortest interval when
                    // an unregistered thread used CPU.
                }
                None => {}
                Some((_, rec)) => {
                    waiting |= complete_setup(rec, &mut maps);
                    if rec.blocked.load(Relaxed) != 0 && self.perf.wants(tid) && self.perf.open(tid) {
                        let _ = rec.blocked.compare_exchange(1, SAMPLED_BY_EVENT, Relaxed, Relaxed);
                    }
                }
            }
        }
        // Gone for sure (the listing may skip a live thread): no record, or no such thread.
        self.perf.forget_gone(|t| {
            tids.binary_search(&t).is_ok() || (reg.lookup(t).is_some() && sys::tgkill(pid, t, 0) == 0)
        });
        self.primed.retain(|t, _| tids.binary_search(t).is_ok());
        self.blocked_seen.retain(|t, _| tids.binary_search(t).is_ok());
        waiting |= std::mem::take(&mut self.unregistered_busy);
        if started.saturating_sub(self.last_check_ns) >= CHECK_NS {
            self.check_clocks(reg, &tids);
            self.last_check_ns = started;
        }
        reg.for_each_active(|_, rec| {
            let tid = rec.tid.load(Relaxed);
            // The listing can skip a live thread while others start or exit
            // (its cursor is a position in a list that changes): a record is
            // retired only once the thread is gone for the kernel too (a
            // null signal finds no such thread).
            if rec.state() == RecordState::Claimed
                && rec.registered_ns.load(Relaxed) < started
                && tids.binary_search(&tid).is_err()
                && sys::tgkill(pid, tid, 0) == -(libc::ESRCH as i64)
            {
                cpu_clock::disarm(rec);
                reg.retire(tid);
            }
        });
        self.listed = tids;
        // Threads the start hook registered need nothing of the scan: a burst
        // of them lets it back off as if nothing had changed.
        let unannounced: Vec<i32> = appeared
            .into_iter()
            .filter(|&t| reg.lookup(t).and_then(|(_, r)| r.origin()) != Some(Origin::ThreadStart))
            .collect();
        let changed = !unannounced.is_empty() || gone || waiting;
        self.interval = Some(match (changed, self.interval) {
            (false, Some(i)) => (i * 2).max(Duration::from_millis(1)).min(MAX_BACKOFF),
            _ => Duration::ZERO,
        });
        unannounced
    }

    /// When the next scan is due, given the configured (shortest) interval.
    pub fn next_interval(&self, base: Duration) -> Duration {
        self.interval.unwrap_or(Duration::ZERO).max(base)
    }

    /// Notes [`uncharged_ns`] as taken when the collector was started: what
    /// the main thread used before it was registered (the loader, the
    /// agent's own start) is never charged, and is no thread's to account.
    pub fn started(&mut self, uncharged_ns: Option<i64>) {
        self.uncharged_at_start = uncharged_ns;
    }

    /// Runs the clock check now (before the last profile), whatever its
    /// schedule; skipped in a process with one registered thread where less
    /// than a tenth of a period of CPU went uncharged since [`started`]
    /// (no other thread can hold a tenth of a sample): a short command
    /// lists no threads.
    ///
    /// [`started`]: Discovery::started
    pub fn check_now(&mut self, reg: &Registry) {
        let period = STATE.period_ns.load(Relaxed).max(1) as i64;
        let mut registered = 0;
        reg.for_each_active(|_, _| registered += 1);
        let since_start = self.uncharged_at_start.zip(uncharged_ns()).map(|(a, b)| b - a);
        if registered <= 1 && since_start.is_some_and(|u| u < period / 10) {
            return;
        }
        if let Ok(tids) = list_threads() {
            self.check_clocks(reg, &tids);
            self.last_check_ns = sys::monotonic_ns();
        }
    }

    /// The events of threads that block the sampling signal, to drain.
    pub fn perf(&mut self) -> &mut PerfSampled {
        &mut self.perf
    }

    /// CPU time accounted for threads osprey could not sample, since the
    /// last call.
    pub fn take_unsampled(&mut self) -> HashMap<Unsampled, u64> {
        std::mem::take(&mut self.unsampled)
    }

    /// Whether the per-thread check can wait: the process used next to no
    /// CPU that samples did not charge since the last check (its threads'
    /// clocks all tick, none blocks the signal, none is unregistered and
    /// busy). Skipping loses nothing: the next check that runs takes every
    /// thread's clock from where the last one left it.
    fn quiet(&self, now: u64) -> bool {
        let Some((at_check, when)) = self.uncharged_at_check else { return false };
        let Some(uncharged) = uncharged_ns() else { return false };
        let period = STATE.period_ns.load(Relaxed).max(1);
        now.saturating_sub(when) < FULL_CHECK_NS && uncharged - at_check < (QUIET_PERIODS * period) as i64
    }

    /// Every registered thread whose CPU clock advanced by several periods
    /// with no sample blocks the sampling signal (checked in its `status`):
    /// its clock is taken away and its CPU time accounted from then on. A
    /// blocked thread that unblocked gets its clock back. Unregistered
    /// threads' CPU time is accounted too.
    fn check_clocks(&mut self, reg: &Registry, tids: &[i32]) {
        let period = STATE.period_ns.load(Relaxed).max(1);
        let signal = STATE.sample_signal.load(Relaxed);
        let mut checked = HashMap::new();
        let mut unregistered = HashMap::new();
        let mut newly_blocked = vec![];
        for &tid in tids {
            if is_internal(tid) {
                continue;
            }
            let Some(cpu) = thread_cpu_ns(tid) else { continue };
            let Some((_, rec)) = reg.lookup(tid) else {
                if reg.retired_recently(tid) {
                    continue; // on its way out: its exit path charged its CPU
                }
                let first = if self.checked_once { 0 } else { cpu };
                let before = self.unregistered.get(&tid).copied().unwrap_or(first);
                *self.unsampled.entry(Unsampled::Unregistered).or_default() += cpu.saturating_sub(before);
                self.unregistered_busy |= cpu > before;
                unregistered.insert(tid, cpu);
                continue;
            };
            let samples = rec.samples.load(Relaxed);
            let blocked = rec.blocked.load(Relaxed) != 0;
            let uncharged = cpu.saturating_sub(rec.charged_ns.load(Relaxed));
            // A thread that blocked the signal from its start (found so at
            // registration) and appeared after the first check was never
            // sampled: all its CPU is accounted.
            let first = if blocked && self.checked_once { 0 } else { cpu };
            let (cpu0, samples0) = self.checked.get(&tid).copied().unwrap_or((first, samples));
            if blocked {
                // Up to the moment its event opened, if one did (then the event charges it).
                let upto = match self.perf.coverage(tid) {
                    Coverage::Signals => Some(cpu),
                    Coverage::Opened(at) => Some(at.min(cpu)),
                    Coverage::Sampled => None,
                };
                if let Some(upto) = upto {
                    *self.unsampled.entry(Unsampled::Blocked(tid)).or_default() += upto.saturating_sub(cpu0);
                }
                // Unblocked for sure: an exiting thread's status may be unreadable.
                if signal_blocked(tid, signal) == Some(false) {
                    self.perf.close(tid);
                    rec.blocked.store(0, Relaxed);
                    let _ = cpu_clock::arm(rec);
                }
            } else if stalled(
                cpu.saturating_sub(cpu0),
                samples == samples0,
                uncharged,
                self.checked.contains_key(&tid),
                period,
            ) {
                if blocks_signal(reg, tid, signal) {
                    cpu_clock::disarm(rec);
                    rec.blocked.store(1, Relaxed);
                    // All it used since its last sample (or its registration), which
                    // the first check of a thread that blocked early has no baseline for.
                    *self.unsampled.entry(Unsampled::Blocked(tid)).or_default() += uncharged;
                    rec.charged_ns.fetch_add(uncharged, Relaxed);
                    newly_blocked.push(tid);
                } else if self.checked.contains_key(&tid)
                    && matches!(Armed::decode(rec.clock.load(Relaxed)), Some(Armed::Perf { .. }))
                {
                    // A clock that stopped working: its descriptor was closed by the program.
                    // (A timer cannot be taken away; one checked at the tick may
                    // lag, and catches up with its overrun count.) The CPU it
                    // missed goes with its next sample (or its exit remainder).
                    rec.owed_ns.fetch_add(cpu.saturating_sub(cpu0), Relaxed);
                    let _ = cpu_clock::revive(rec);
                }
            }
            checked.insert(tid, (cpu, samples));
        }
        // Sampled from now on: the next check charges the CPU from this
        // check to the event's opening ([`Coverage::Opened`]).
        for tid in newly_blocked {
            if self.perf.wants(tid) && self.perf.open(tid) {
                if let Some((_, rec)) = reg.lookup(tid) {
                    let _ = rec.blocked.compare_exchange(1, SAMPLED_BY_EVENT, Relaxed, Relaxed);
                }
            }
        }
        self.checked = checked;
        self.unregistered = unregistered;
        self.checked_once = true;
        self.uncharged_at_check = uncharged_ns().map(|u| (u, sys::monotonic_ns()));
    }
}

/// Whether thread `tid` blocks `signal`, as opposed to running our handler
/// (which masks the signal while it runs: a thread sampled at a high rate by
/// a slow handler shows it masked much of the time). A read of its mask
/// counts only with no handler of ours running on the thread before and
/// after it (one running proves the signal is delivered); two such reads
/// 200 µs apart must agree.
fn blocks_signal(reg: &Registry, tid: i32, signal: i32) -> bool {
    let in_handler = || reg.handler_depth(tid).is_some_and(|d| d.load(Acquire) > 0);
    for attempt in 0..2 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        if in_handler() {
            return false;
        }
        let blocked = signal_blocked(tid, signal) == Some(true);
        if !blocked || in_handler() {
            return false;
        }
    }
    true
}

/// Whether a thread with a clock looks like it stopped being sampled: its
/// clock advanced by `advanced` since the last check, with no sample (`none`),
/// or, at its first check, `uncharged` since its last sample is over three
/// periods (a thread that blocked the signal right after it started).
fn stalled(advanced: u64, none: bool, uncharged: u64, seen: bool, period: u64) -> bool {
    if seen {
        advanced >= 3 * period && none
    } else {
        uncharged >= 3 * period
    }
}

/// CPU time of the process (its exited threads included) that no sample
/// charged and osprey's own threads did not use, in total: it grows by the
/// CPU of threads that are not sampled, and otherwise stays within a
/// sampling period per running thread.
pub(crate) fn uncharged_ns() -> Option<i64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return None;
    }
    let process = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
    let own: u64 = internal_tids().filter_map(thread_cpu_ns).sum();
    Some(process - STATE.charged_ns.load(Relaxed) as i64 - own as i64)
}

/// Stack bounds and CPU clock for a record claimed by the priming handler
/// (or found without bounds). Returns whether the setup is still incomplete.
fn complete_setup(rec: &Record, maps: &mut Option<Vec<u8>>) -> bool {
    if rec.stack_hi.load(Acquire) == 0 {
        let sp = rec.primed_sp.load(Relaxed);
        if sp != 0 {
            let text = maps.get_or_insert_with(|| osprey_procfs::maps::read(0).unwrap_or_default());
            if let Some((lo, hi)) = stack_bounds_of(sp, text) {
                rec.stack_lo.store(lo, Relaxed);
                rec.stack_hi.store(hi, Release);
            }
        }
    }
    if rec.clock.load(Relaxed) == 0 && rec.blocked.load(Relaxed) == 0 {
        let _ = cpu_clock::arm(rec);
    }
    rec.stack_hi.load(Relaxed) == 0
}
