//! Per-thread hazard pointers protecting the ACTIVE table.
//!
//! **Signal-safe module** (`protect`, `release`): each thread touches only its
//! own slot; no waiting on other threads (the retry loop is bounded).
//!
//! A slot holds `table index + 1` while its thread may be writing that table,
//! 0 otherwise. Slots are padded to a cache line: every put writes its slot
//! twice, so unpadded neighbours could bounce lines between cores. (Measured
//! on a loaded 2-core box: no significant difference either way, the shared
//! entry counters dominate; the padding costs 64 B per thread.)
//!
//! # Invariant H (no reclamation under a writer)
//! Handler: `a = active; hazard = a; fence(SeqCst); active == a ?` (else retry).
//! Collector: `active = new (swap); fence(SeqCst); wait until no hazard == old`.
//! The two SeqCst fences are totally ordered. If the handler's fence comes
//! first, the collector's scan sees its hazard and waits for the `Release`
//! clear (which happens after all the handler's writes); if the collector's
//! fence comes first, the handler's re-load sees the new table and retries.
//! Either way no handler writes the old table once the scan has passed it.
//! There is no time-out: the collector waits (handlers are bounded).
//!
//! # Invariant U (the scan's bound)
//! A slot's index is below `used` before its first hazard store: the
//! `fetch_max` is sequenced before that put's SeqCst fence, so a collector
//! whose fence follows it reads `used` past the slot. Later puts on the slot
//! (the same thread, or the next owner of its record, which the registry's
//! free list orders after it) find the slot's mark set and skip the RMW.
//!
//! Every hazard store is `Release` and the scan loads with `Acquire`: the value
//! the collector reads may be the *next* put's hazard rather than the clear,
//! and it must still happen-after the previous put's writes.

use super::mem::{Zeroable, ZeroedBuf};
use super::sync::{fence, spin_wait, AtomicUsize, Ordering::*};

/// Attempts before a put gives up (the active table kept changing under it).
/// Each failed attempt means a rotation completed its swap in between.
pub(crate) const MAX_PROTECT_TRIES: usize = 8;

#[repr(C, align(64))]
pub(crate) struct HazardSlot(AtomicUsize, AtomicUsize);

pub(crate) struct Hazards {
    /// One cache line per possible thread record; zero (no hazard) until a
    /// put uses it, so the slots of threads that never ran cost no memory.
    slots: ZeroedBuf<HazardSlot>,
    /// One past the highest slot ever used (invariant U): the collector's
    /// scan stops there, so the slots of records never used are never
    /// touched (no page faults on a fresh storage).
    used: AtomicUsize,
}

// SAFETY: zero AtomicUsizes: no hazard, slot not yet counted in `used`.
unsafe impl Zeroable for HazardSlot {
    #[cfg(loom)]
    fn zero() -> Self {
        HazardSlot(AtomicUsize::new(0), AtomicUsize::new(0))
    }
}

impl Hazards {
    /// Not signal-safe (maps memory once, up front).
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        Ok(Hazards { slots: ZeroedBuf::new(threads)?, used: AtomicUsize::new(0) })
    }

    /// Signal-safe. `None` when `thread_slot` is out of range. The first use
    /// of a slot raises `used` past it (one RMW per slot, ever) before any
    /// hazard is published on it; the slot's second word remembers that.
    #[inline(always)]
    pub(crate) fn slot(&self, thread_slot: usize) -> Option<&HazardSlot> {
        let s = self.slots.as_slice().get(thread_slot)?;
        if s.1.load(Relaxed) == 0 {
            self.used.fetch_max(thread_slot + 1, SeqCst);
            s.1.store(1, Relaxed);
        }
        Some(s)
    }

    /// Collector: spins until no slot protects table `index` (invariant H).
    /// Must follow the swap of `active` and a `fence(SeqCst)`.
    pub(crate) fn wait_until_clear(&self, index: usize) {
        let used = self.used.load(SeqCst).min(self.slots.as_slice().len());
        for s in &self.slots.as_slice()[..used] {
            let mut round = 0;
            while s.0.load(Acquire) == index.wrapping_add(1) {
                spin_wait(round);
                round = round.saturating_add(1);
            }
        }
    }
}

impl HazardSlot {
    /// Signal-safe. Publishes a hazard on the current active table and returns
    /// its index, or `None` (slot cleared) after `MAX_PROTECT_TRIES` changes.
    #[inline(always)]
    pub(crate) fn protect(&self, active: &AtomicUsize) -> Option<usize> {
        for _ in 0..MAX_PROTECT_TRIES {
            let a = active.load(Acquire);
            // Release, not Relaxed: the collector may skip past our clear of a
            // previous put and read this store instead; it must still acquire
            // that put's writes (found by the loom model, see `loom.rs`).
            self.0.store(a.wrapping_add(1), Release);
            fence(SeqCst);
            if active.load(Acquire) == a {
                return Some(a);
            }
        }
        self.release();
        None
    }

    /// Signal-safe. Ends the protection; every write made under it happens
    /// before the collector's `Acquire` load that sees 0.
    #[inline(always)]
    pub(crate) fn release(&self) {
        self.0.store(0, Release);
    }
}
