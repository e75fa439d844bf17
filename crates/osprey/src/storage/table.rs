//! One open-addressing hash table of call traces plus its frame arena.
//!
//! **Signal-safe module**: `insert` (and everything it calls) never allocates,
//! locks, waits for another thread or panics, and visits at most
//! [`MAX_PROBES`] slots. `collect`, `clear` and `insert_preserved` are
//! collector-only.
//!
//! # Entry protocol
//! `hash` 0 = empty. A thread claims an empty slot with CAS `0 -> hash`, writes
//! the frames to the arena, then publishes `meta` (arena offset, length,
//! truncated flag) with `Release`. `meta == 0` means "claimed, not yet
//! published"; `meta == DEAD` means the claimer ran out of arena.
//!
//! # Invariants
//! - T1 (no false merge): counts are added to an entry only after its hash is
//!   equal AND its published frames and truncated flag are equal.
//! - T2 (no waiting): an entry with an equal hash that is not yet published is
//!   skipped; the probe continues (a duplicate entry may result; the collector
//!   merges duplicates by frames).
//! - T3 (ids): an entry's id is `(epoch << 32) | slot` for the activation that
//!   created it, or the preserved id copied in by the collector; it is written
//!   to the arena record before `meta` is published.
//! - T4 (quiescence): `clear`, `collect` and `insert_preserved` run only on a
//!   table no handler can be writing (see `hazard.rs` and `rotation.rs`).

use super::arena::Arena;
use super::mem::{Zeroable, ZeroedBuf};
use super::sync::{AtomicU64, Ordering::*};
use super::CollectedTrace;

/// Most slots one insert looks at before giving up (the sample is then dropped).
pub(crate) const MAX_PROBES: usize = 64;

/// Bytes of one table slot.
pub const ENTRY_BYTES: usize = core::mem::size_of::<Entry>();

const DEAD: u64 = u64::MAX;

/// Why a sample went to the dropped trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// `MAX_PROBES` slots visited without a match or a free slot (table full).
    TableFull,
    /// The frames did not fit in the arena.
    ArenaFull,
    /// The active table changed under the hazard pointer too many times.
    Contention,
    /// `thread_slot >= max_threads`.
    BadSlot,
}

#[repr(C)]
pub(crate) struct Entry {
    hash: AtomicU64,
    meta: AtomicU64,
    count: AtomicU64,
    value: AtomicU64,
}

// SAFETY: four atomics, all zero = empty entry.
unsafe impl Zeroable for Entry {
    #[cfg(loom)]
    fn zero() -> Self {
        Entry { hash: AtomicU64::new(0), meta: AtomicU64::new(0), count: AtomicU64::new(0), value: AtomicU64::new(0) }
    }
}

#[inline(always)]
fn pack(start: usize, len: usize, truncated: bool) -> u64 {
    ((start as u64 + 1) << 32) | ((len as u64) << 1) | truncated as u64
}

/// `(start, len, truncated)` of a published meta.
#[inline(always)]
fn unpack(meta: u64) -> Option<(usize, usize, bool)> {
    if meta == 0 || meta == DEAD {
        return None;
    }
    let start = (meta >> 32).checked_sub(1)?;
    Some((start as usize, ((meta as u32) >> 1) as usize, meta & 1 != 0))
}

/// Slots per bit of [`Table::used`]: one page of entries, so that the
/// collector's sweeps never touch (and so commit) a page no handler wrote.
const GROUP: usize = 4096 / ENTRY_BYTES;

/// 64 groups' bits of [`Table::used`].
#[repr(C)]
pub(crate) struct UsedWord(AtomicU64);

// SAFETY: one atomic, zero = no group used.
unsafe impl Zeroable for UsedWord {
    #[cfg(loom)]
    fn zero() -> Self {
        UsedWord(AtomicU64::new(0))
    }
}

/// Bytes of the [`Table::used`] bitmap of a table of `entries` slots.
pub(crate) fn used_bytes(entries: usize) -> usize {
    entries.div_ceil(GROUP).div_ceil(64) * core::mem::size_of::<UsedWord>()
}

pub(crate) struct Table {
    entries: ZeroedBuf<Entry>,
    /// Bit `g` set: some slot of group `g` (slots `g * GROUP ..`) may have
    /// been claimed since the last [`Table::clear`]. Set by the claimer
    /// before its hazard is released, so a quiescent table's claimed slots
    /// all lie in set groups.
    used: ZeroedBuf<UsedWord>,
    /// `entries.len() - 1`; the length is a power of two >= 2.
    mask: usize,
    /// log2(entries.len()).
    bits: u32,
    arena: Arena,
    /// Epoch of the current activation; written by the collector while the
    /// table is not active, read by handlers after an `Acquire` of `active`.
    epoch: AtomicU64,
    /// Loom only: handlers currently inside `insert` (checks invariant T4).
    #[cfg(loom)]
    pub(crate) writers: super::sync::AtomicUsize,
}

impl Table {
    /// `entries` is rounded down to a power of two (at least 2, at most 2^31).
    pub(crate) fn new(entries: usize, arena_words: usize) -> std::io::Result<Self> {
        let n = prev_pow2(entries.clamp(2, 1 << 31));
        Ok(Table {
            entries: ZeroedBuf::new(n)?,
            used: ZeroedBuf::new(used_bytes(n) / core::mem::size_of::<UsedWord>())?,
            mask: n - 1,
            bits: n.trailing_zeros(),
            arena: Arena::new(arena_words)?,
            epoch: AtomicU64::new(0),
            #[cfg(loom)]
            writers: super::sync::AtomicUsize::new(0),
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    pub(crate) fn bytes(&self) -> usize {
        self.entries.bytes() + self.used.bytes() + self.arena.bytes()
    }

    pub(crate) fn arena_used_words(&self) -> usize {
        self.arena.used_words()
    }

    /// First probe slot: the top `bits` bits of the (well-mixed) hash.
    #[inline(always)]
    fn start(&self, hash: u64) -> usize {
        hash.rotate_left(self.bits) as usize & self.mask
    }

    #[inline(always)]
    fn entry(&self, i: usize) -> &Entry {
        let entries = self.entries.as_slice();
        debug_assert!(i & self.mask < entries.len());
        // SAFETY: `entries.len() == mask + 1`, so `i & mask` is in bounds.
        unsafe { entries.get_unchecked(i & self.mask) }
    }

    /// Signal-safe. Adds `count`/`value` to the entry holding `frames`
    /// (creating it if needed) and returns its id. `hash` must be
    /// `trace_hash(frames, truncated)` except in tests that force collisions.
    #[inline]
    pub(crate) fn insert(
        &self,
        hash: u64,
        frames: &[u64],
        truncated: bool,
        count: u64,
        value: u64,
    ) -> Result<u64, DropReason> {
        let mut i = self.start(hash);
        for _ in 0..MAX_PROBES.min(self.capacity()) {
            let e = self.entry(i);
            let mut h = e.hash.load(Acquire);
            if h == 0 {
                match e.hash.compare_exchange(0, hash, AcqRel, Acquire) {
                    Ok(_) => {
                        self.mark_used(i);
                        let id = (self.epoch.load(Relaxed) << 32) | i as u64;
                        return self.publish(e, id, frames, truncated, count, value);
                    }
                    Err(now) => h = now,
                }
            }
            if h == hash {
                if let Some((start, len, t)) = unpack(e.meta.load(Acquire)) {
                    if t == truncated && self.arena.matches(start, len, frames) {
                        e.count.fetch_add(count, Relaxed);
                        e.value.fetch_add(value, Relaxed);
                        return Ok((self.epoch.load(Relaxed) << 32) | i as u64);
                    }
                }
                // Unpublished (T2), dead, or a real collision (T1): keep probing.
            }
            i = (i + 1) & self.mask;
        }
        Err(DropReason::TableFull)
    }

    /// Signal-safe. Records that slot `i`'s group holds a claimed slot; the
    /// plain load first keeps the shared word's cache line clean once set.
    #[inline(always)]
    fn mark_used(&self, i: usize) {
        let g = (i & self.mask) / GROUP;
        if let Some(w) = self.used.as_slice().get(g / 64) {
            let bit = 1u64 << (g % 64);
            if w.0.load(Relaxed) & bit == 0 {
                w.0.fetch_or(bit, Relaxed);
            }
        }
    }

    /// The slots of every used group (quiescent table only, T4).
    fn used_entries(&self) -> impl Iterator<Item = &Entry> {
        let entries = self.entries.as_slice();
        self.used.as_slice().iter().enumerate().flat_map(move |(w, word)| {
            let bits = word.0.load(Relaxed);
            (0..64).filter(move |b| bits & (1 << b) != 0).flat_map(move |b| {
                let from = ((w * 64 + b) * GROUP).min(entries.len());
                entries[from..(from + GROUP).min(entries.len())].iter()
            })
        })
    }

    /// Fills a freshly claimed entry and publishes it.
    #[inline]
    fn publish(
        &self,
        e: &Entry,
        id: u64,
        frames: &[u64],
        truncated: bool,
        count: u64,
        value: u64,
    ) -> Result<u64, DropReason> {
        let start = if frames.len() < (1 << 31) { self.arena.store(id, frames) } else { None };
        match start {
            Some(start) => {
                e.count.store(count, Relaxed);
                e.value.store(value, Relaxed);
                e.meta.store(pack(start, frames.len(), truncated), Release);
                Ok(id)
            }
            None => {
                e.meta.store(DEAD, Release);
                Err(DropReason::ArenaFull)
            }
        }
    }

    /// Collector, quiescent table (T4): stores a preserved trace under its old
    /// id with zero counts. Never merges with an existing entry. false when full.
    pub(crate) fn insert_preserved(&self, hash: u64, id: u64, frames: &[u64], truncated: bool) -> bool {
        let mut i = self.start(hash);
        for _ in 0..MAX_PROBES.min(self.capacity()) {
            let e = self.entry(i);
            if e.hash.compare_exchange(0, hash, AcqRel, Acquire).is_ok() {
                self.mark_used(i);
                return self.publish(e, id, frames, truncated, 0, 0).is_ok();
            }
            i = (i + 1) & self.mask;
        }
        false
    }

    /// Collector, quiescent table (T4): appends every published entry.
    pub(crate) fn collect(&self, out: &mut Vec<CollectedTrace>) {
        for e in self.used_entries() {
            if e.hash.load(Acquire) == 0 {
                continue;
            }
            let Some((start, len, truncated)) = unpack(e.meta.load(Acquire)) else { continue };
            if let Some((id, frames)) = self.arena.read(start, len) {
                out.push(CollectedTrace {
                    id,
                    frames,
                    truncated,
                    count: e.count.load(Relaxed),
                    value: e.value.load(Relaxed),
                });
            }
        }
    }

    /// A table just made (all zero, so empty) gets `epoch`, without the
    /// sweep of [`Table::clear`], which would fault in every page.
    pub(crate) fn begin_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Relaxed);
    }

    /// Collector, quiescent table (T4): empties the table and gives it `epoch`.
    /// Only the used groups are swept, so untouched pages stay uncommitted.
    pub(crate) fn clear(&self, epoch: u64) {
        #[cfg(loom)]
        assert_eq!(self.writers.load(Relaxed), 0, "T4 violated: table cleared while a put is in it");
        for e in self.used_entries() {
            if e.hash.load(Relaxed) != 0 {
                e.meta.store(0, Relaxed);
                e.count.store(0, Relaxed);
                e.value.store(0, Relaxed);
                e.hash.store(0, Relaxed);
            }
        }
        for w in self.used.as_slice() {
            if w.0.load(Relaxed) != 0 {
                w.0.store(0, Relaxed);
            }
        }
        self.arena.reset();
        self.epoch.store(epoch, Relaxed);
    }
}

fn prev_pow2(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}
