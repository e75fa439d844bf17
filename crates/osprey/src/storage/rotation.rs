//! Rotation of the triple buffer and trace collection. Collector only, **not
//! signal-safe** (allocates, locks).
//!
//! # Roles and invariants
//! - R1: exactly one table is ACTIVE (`CallTraceStorage::active`); only the
//!   collector changes it, with one `swap`.
//! - R2: STANDBY and SCRATCH are never written by handlers: a handler only
//!   writes a table it validated as ACTIVE under its hazard pointer, and a
//!   table leaves ACTIVE only through `rotate`, which waits until no hazard
//!   references it before reading it (invariant H in `hazard.rs`).
//! - R3: a table is cleared (and, for ACTIVE, given a fresh epoch) right before
//!   it takes its next role, i.e. always while quiescent (R2).
//! - R4: one collector at a time (the `collector` mutex).
//!
//! # One rotation
//! 1. Collect STANDBY (the preserved traces, counts 0), clear it, give it a
//!    new epoch, and swap it in as ACTIVE. The old ACTIVE becomes SCRATCH.
//! 2. `fence(SeqCst)`, then wait until no hazard pointer references the old
//!    ACTIVE. No time-out: handlers are bounded, so this terminates.
//! 3. Collect the old ACTIVE, take the dropped counters.
//! 4. Ask the liveness checkers which ids to keep; the old SCRATCH becomes
//!    STANDBY: cleared, then the kept traces are re-inserted under their ids.
//! 5. Merge the collected entries by (frames, truncated): entries found first
//!    (preserved ones, then ACTIVE in slot order) keep their id, the others
//!    are reported in `Collected::aliases`.
//!
//! Preserved traces restart at count 0: their samples were reported by the
//! rotation that collected them, so nothing is counted twice.

use super::sync::{fence, lock, Ordering::*};
use super::{hash::trace_hash, CallTraceStorage, Collected, CollectedTrace, DROPPED_TRACE_ID};
use std::collections::{HashMap, HashSet};

/// Adds the ids whose traces must survive into the next cycle (keeping their
/// ids). Called by `rotate`, on the collector thread.
pub type LivenessChecker = Box<dyn Fn(&mut HashSet<u64>) + Send + Sync>;

pub(crate) struct CollectorState {
    standby: usize,
    scratch: usize,
    /// Epoch for the next activation (table 0 was activated with epoch 1).
    next_epoch: u64,
    checkers: Vec<LivenessChecker>,
}

impl CollectorState {
    pub(crate) fn new() -> Self {
        CollectorState { standby: 1, scratch: 2, next_epoch: 2, checkers: Vec::new() }
    }

    fn take_epoch(&mut self) -> u64 {
        let e = self.next_epoch;
        // Ids keep the epoch in 32 bits; 0 is never used (id 1 is reserved).
        self.next_epoch = if e >= u32::MAX as u64 { 1 } else { e + 1 };
        e
    }
}

impl CallTraceStorage {
    /// Registers a liveness checker (not signal-safe).
    pub fn add_liveness_checker(&self, checker: LivenessChecker) {
        lock(&self.collector).checkers.push(checker);
    }

    /// Not signal-safe. Rotates the buffers and returns every trace stored
    /// since the last rotation (exactly once), the traces preserved by the
    /// previous rotation (count 0 unless merged with new samples), and the
    /// dropped trace. Rotations from several threads are serialised.
    pub fn rotate(&self) -> Collected {
        let mut st = lock(&self.collector);
        let mut raw = Vec::new();

        // 1. STANDBY: preserved traces out, then fresh epoch, then ACTIVE (R2, R3).
        let standby = st.standby;
        self.tables[standby].collect(&mut raw);
        let epoch = st.take_epoch();
        self.tables[standby].clear(epoch);
        let old_active = self.active.swap(standby, SeqCst);

        // 2. Invariant H: wait for every handler still inside the old table.
        fence(SeqCst);
        self.hazards.wait_until_clear(old_active);

        // 3. The old ACTIVE is quiescent now.
        self.tables[old_active].collect(&mut raw);
        let (dropped_count, dropped_value, dropped) = self.drops.take();

        // 4. Liveness, then old SCRATCH -> STANDBY with the kept traces.
        let mut keep = HashSet::new();
        for c in &st.checkers {
            c(&mut keep);
        }
        let new_standby = st.scratch;
        let table = &self.tables[new_standby];
        table.clear(0);
        let mut preserved = 0;
        for t in raw.iter().filter(|t| keep.contains(&t.id)) {
            if table.insert_preserved(trace_hash(&t.frames, t.truncated), t.id, &t.frames, t.truncated) {
                preserved += 1;
            }
        }
        let preserve_failed = keep.len().saturating_sub(preserved);
        st.standby = new_standby;
        st.scratch = old_active;
        drop(st);

        // 5. One trace per distinct stack.
        let (mut traces, aliases) = merge(raw);
        if dropped_count != 0 || dropped_value != 0 {
            traces.push(CollectedTrace {
                id: DROPPED_TRACE_ID,
                frames: Vec::new(),
                truncated: false,
                count: dropped_count,
                value: dropped_value,
            });
        }
        Collected { traces, aliases, dropped, preserved, preserve_failed }
    }
}

/// Merges entries with equal (frames, truncated); the first one keeps its id.
fn merge(raw: Vec<CollectedTrace>) -> (Vec<CollectedTrace>, Vec<(u64, u64)>) {
    let mut out: Vec<CollectedTrace> = Vec::with_capacity(raw.len());
    let mut aliases = Vec::new();
    let mut by_hash: HashMap<u64, Vec<usize>> = HashMap::with_capacity(raw.len());
    for t in raw {
        let candidates = by_hash.entry(trace_hash(&t.frames, t.truncated)).or_default();
        match candidates.iter().copied().find(|&i| out[i].truncated == t.truncated && out[i].frames == t.frames) {
            Some(i) => {
                let kept = &mut out[i];
                kept.count += t.count;
                kept.value += t.value;
                aliases.push((t.id, kept.id));
            }
            None => {
                candidates.push(out.len());
                out.push(t);
            }
        }
    }
    (out, aliases)
}
