//! The discovery path: a periodic scan of `/proc/self/task` primes threads
//! nobody announced with the priming signal (the thread-start path is in
//! `crate::threads`).
//!
//! inotify on `/proc/self/task` never fires (procfs sends no events), so the
//! scan runs every `scan_interval` (10 ms by default). A new thread can run
//! unprimed for at most one interval plus signal delivery; it is not sampled
//! in that window (its CPU clock is armed only once it has a record), so no
//! handler ever runs on an unregistered thread because of osprey's clocks.

use crate::cpu_clock;
use crate::record::{Record, RecordState};
use crate::registry::Registry;
use crate::signal::{sys, STATE};
use crate::threads::{list_threads, stack_bounds_of, thread_cpu_ns};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::*;

/// The periodic scan. Owned by the agent thread.
#[derive(Default)]
pub struct Discovery {
    /// osprey's own threads: never primed nor sampled.
    pub internal: HashSet<i32>,
    /// When each unregistered tid was last sent the priming signal.
    last_primed: HashMap<i32, u64>,
    /// Tids listed by the previous scan.
    listed: Vec<i32>,
    /// CPU ns of threads without a record at the last accounting.
    unsampled: HashMap<i32, u64>,
    scans: u64,
    last_account_ns: u64,
    lost_ns: u64,
}

/// Re-send the priming signal to a thread that has not answered after this long
/// (it may have had the signal blocked).
const REPRIME_NS: u64 = 100_000_000;

impl Discovery {
    /// One pass: prime new threads, finish the setup of primed ones (stack
    /// bounds, CPU clock), retire records of threads that are gone. Returns
    /// the tids that appeared since the previous pass.
    pub fn scan(&mut self, reg: &Registry) -> Vec<i32> {
        let started = sys::monotonic_ns();
        let Ok(tids) = list_threads() else { return vec![] };
        let appeared: Vec<i32> = tids
            .iter()
            .copied()
            .filter(|t| self.listed.binary_search(t).is_err() && !self.internal.contains(t))
            .collect();
        let pid = sys::getpid();
        let prime = STATE.prime_signal.load(Relaxed);
        let mut maps: Option<String> = None;
        for &tid in &tids {
            if self.internal.contains(&tid) {
                continue;
            }
            match reg.lookup(tid) {
                // An exhausted pool cannot give the thread a record: don't signal
                // it for nothing (its CPU time is accounted as lost below).
                None if prime > 0 && reg.free_count() > 0 => {
                    let last = self.last_primed.get(&tid).copied().unwrap_or(0);
                    if last == 0 || started.saturating_sub(last) > REPRIME_NS {
                        sys::tgkill(pid, tid, prime);
                        self.last_primed.insert(tid, started);
                    }
                }
                None => {}
                Some((_, rec)) => {
                    self.last_primed.remove(&tid);
                    complete_setup(rec, &mut maps);
                }
            }
        }
        self.last_primed.retain(|t, _| tids.binary_search(t).is_ok());
        if started.saturating_sub(self.last_account_ns) >= ACCOUNT_NS || self.scans == 0 {
            self.account_unsampled(reg, &tids);
            self.last_account_ns = started;
        }
        self.scans += 1;
        reg.for_each_active(|_, rec| {
            let tid = rec.tid.load(Relaxed);
            if rec.state() == RecordState::Claimed
                && rec.registered_ns.load(Relaxed) < started
                && tids.binary_search(&tid).is_err()
            {
                cpu_clock::disarm(rec);
                reg.retire(tid);
            }
        });
        self.listed = tids;
        appeared
    }
}

/// How often CPU time of threads without a record is accounted as lost samples.
const ACCOUNT_NS: u64 = 100_000_000;

impl Discovery {
    /// Threads without a record (not primed yet, or the pool is exhausted) are
    /// not sampled; their CPU time, read from `/proc/self/task/TID/schedstat`,
    /// is converted to samples and added to `Registry::dropped_unregistered`, so
    /// the profile shows what was lost. Threads already present at the first
    /// scan count from then on; later ones from their start.
    fn account_unsampled(&mut self, reg: &Registry, tids: &[i32]) {
        let period = STATE.period_ns.load(Relaxed).max(1);
        let first = self.scans == 0;
        let mut seen = HashMap::new();
        for &tid in tids {
            if self.internal.contains(&tid) || reg.lookup(tid).is_some() {
                continue;
            }
            let Some(now) = thread_cpu_ns(tid) else { continue };
            let before = match self.unsampled.get(&tid) {
                Some(&b) => b,
                None if first => now,
                None => 0,
            };
            self.lost_ns += now.saturating_sub(before);
            seen.insert(tid, now);
        }
        self.unsampled = seen;
        if STATE.enabled.load(Relaxed) && self.lost_ns >= period {
            reg.dropped_unregistered.fetch_add(self.lost_ns / period, Relaxed);
            self.lost_ns %= period;
        }
    }
}

/// Stack bounds and CPU clock for a record claimed by the priming handler.
fn complete_setup(rec: &Record, maps: &mut Option<String>) {
    if rec.stack_hi.load(Acquire) == 0 {
        let sp = rec.primed_sp.load(Relaxed);
        if sp != 0 {
            let text = maps.get_or_insert_with(|| std::fs::read_to_string("/proc/self/maps").unwrap_or_default());
            if let Some((lo, hi)) = stack_bounds_of(sp, text) {
                rec.stack_lo.store(lo, Relaxed);
                rec.stack_hi.store(hi, Release);
            }
        }
    }
    if rec.perf_fd.load(Relaxed) < 0 {
        let _ = cpu_clock::arm(rec);
    }
}
