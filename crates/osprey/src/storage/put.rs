//! The handler-side entry point.
//!
//! **Signal-safe module.** Everything reachable from [`CallTraceStorage::put`]
//! is async-signal-safe: no allocation, no locks, no waiting on other threads,
//! no panics (all indexing is `get` or proven-in-bounds), no thread-locals, no
//! libc. Its running time is bounded by `MAX_PROTECT_TRIES` hazard attempts,
//! `MAX_PROBES` slots and one pass over `frames` for hashing, copying and
//! comparing (per probed entry with an equal hash).

use super::sync::{AtomicU64, Ordering::*};
use super::table::DropReason;
use super::{hash, CallTraceStorage, DropStats, Drops, DROPPED_TRACE_ID};

impl CallTraceStorage {
    /// Signal-safe. Adds `count`/`value` to the trace `frames` (leaf first),
    /// calls `then(trace_id)` while the table is still protected by this
    /// thread's hazard pointer, and returns the id ([`DROPPED_TRACE_ID`] if the
    /// sample could not be stored; it is then counted in the dropped trace).
    ///
    /// `thread_slot` must be unique among threads that may be inside `put` at
    /// the same time, and `< max_threads`.
    #[inline]
    pub fn put(
        &self,
        thread_slot: usize,
        frames: &[u64],
        truncated: bool,
        count: u64,
        value: u64,
        then: impl FnOnce(u64),
    ) -> u64 {
        let h = hash::trace_hash(frames, truncated);
        self.put_hashed(thread_slot, h, frames, truncated, count, value, then)
    }

    /// `put` with the hash supplied (tests force collisions through this).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn put_hashed(
        &self,
        thread_slot: usize,
        hash: u64,
        frames: &[u64],
        truncated: bool,
        count: u64,
        value: u64,
        then: impl FnOnce(u64),
    ) -> u64 {
        let Some(hazard) = self.hazards.slot(thread_slot) else {
            self.drops.add(DropReason::BadSlot, count, value);
            then(DROPPED_TRACE_ID);
            return DROPPED_TRACE_ID;
        };
        let Some(table) = hazard.protect(&self.active).and_then(|a| self.tables.get(a)) else {
            hazard.release();
            self.drops.add(DropReason::Contention, count, value);
            then(DROPPED_TRACE_ID);
            return DROPPED_TRACE_ID;
        };
        #[cfg(loom)]
        table.writers.fetch_add(1, Relaxed);
        let id = match table.insert(hash, frames, truncated, count, value) {
            Ok(id) => id,
            Err(reason) => {
                self.drops.add(reason, count, value);
                DROPPED_TRACE_ID
            }
        };
        then(id);
        #[cfg(loom)]
        table.writers.fetch_sub(1, Relaxed);
        hazard.release();
        id
    }
}

impl Drops {
    pub(super) fn new() -> Self {
        let z = || AtomicU64::new(0);
        Drops { count: z(), value: z(), table_full: z(), arena_full: z(), contention: z(), bad_slot: z() }
    }

    /// Signal-safe.
    #[inline]
    fn add(&self, reason: DropReason, count: u64, value: u64) {
        self.count.fetch_add(count, Relaxed);
        self.value.fetch_add(value, Relaxed);
        let c = match reason {
            DropReason::TableFull => &self.table_full,
            DropReason::ArenaFull => &self.arena_full,
            DropReason::Contention => &self.contention,
            DropReason::BadSlot => &self.bad_slot,
        };
        c.fetch_add(1, Relaxed);
    }

    /// Collector: takes (count, value, reasons) accumulated so far.
    pub(super) fn take(&self) -> (u64, u64, DropStats) {
        let stats = DropStats {
            table_full: self.table_full.swap(0, Relaxed),
            arena_full: self.arena_full.swap(0, Relaxed),
            contention: self.contention.swap(0, Relaxed),
            bad_slot: self.bad_slot.swap(0, Relaxed),
        };
        (self.count.swap(0, Relaxed), self.value.swap(0, Relaxed), stats)
    }
}
