//! Bump allocator holding the frames of stored traces.
//!
//! **Signal-safe module** (except `new`). Allocation is one `fetch_add`
//! (wait-free); nothing is ever freed individually, the whole arena is reset
//! when its table is cleared.
//!
//! # Record layout
//! `[id, frame0, frame1, ...]`, in 64-bit words. The id is written by whoever
//! claimed the table slot, so the collector needs no epoch bookkeeping and
//! preserved traces keep the id they were created with.
//!
//! # Invariants
//! - A record's words are written only by the thread that allocated them, and
//!   only before the owning entry's `meta` is published with `Release`.
//!   Readers load `meta` with `Acquire` first, so they see complete records.
//! - `reset` is called only by the collector on a quiescent table (no hazard
//!   pointer can reference it, see `hazard.rs`).
//! - Words are atomics so loom checks the publication; on x86 relaxed loads and
//!   stores are plain moves.

use super::mem::ZeroedBuf;
use super::sync::{AtomicU64, AtomicUsize, Ordering::*};

/// Largest arena, in words: offsets must fit the 31 bits kept in an entry's `meta`.
pub(crate) const MAX_WORDS: usize = (1 << 31) - 1;

pub(crate) struct Arena {
    words: ZeroedBuf<AtomicU64>,
    /// Next free word. May run past `len` after failed allocations; reset by `reset`.
    next: AtomicUsize,
}

impl Arena {
    pub(crate) fn new(words: usize) -> std::io::Result<Self> {
        Ok(Arena { words: ZeroedBuf::new(words.min(MAX_WORDS))?, next: AtomicUsize::new(0) })
    }

    /// Signal-safe. Stores `[id, frames...]`, returns the record's first word
    /// offset, or `None` when the arena is full.
    #[inline]
    pub(crate) fn store(&self, id: u64, frames: &[u64]) -> Option<usize> {
        let words = self.words.as_slice();
        let n = frames.len().checked_add(1)?;
        if n > words.len() {
            return None; // cannot fit even in an empty arena; do not move `next`
        }
        // Wait-free. A failed attempt undoes its bump with one CAS if nobody
        // allocated after it; otherwise `next` stays past the end (the arena is
        // full for this cycle anyway). It cannot wrap: each attempt adds at most
        // `words.len()` and tables are reset every rotation.
        let start = self.next.fetch_add(n, Relaxed);
        let end = start.saturating_add(n);
        let Some(rec) = words.get(start..end) else {
            let _ = self.next.compare_exchange(end, start, Relaxed, Relaxed);
            return None;
        };
        let (head, body) = rec.split_first()?;
        head.store(id, Relaxed);
        for (w, &f) in body.iter().zip(frames) {
            w.store(f, Relaxed);
        }
        Some(start)
    }

    /// Signal-safe. Whether the record at `start` holds exactly `frames`.
    #[inline]
    pub(crate) fn matches(&self, start: usize, len: usize, frames: &[u64]) -> bool {
        if len != frames.len() {
            return false;
        }
        let body =
            start.checked_add(1).and_then(|b| Some(b..b.checked_add(len)?)).and_then(|r| self.words.as_slice().get(r));
        let Some(body) = body else { return false };
        body.iter().zip(frames).all(|(w, &f)| w.load(Relaxed) == f)
    }

    /// Collector: the id and frames of the record at `start`.
    pub(crate) fn read(&self, start: usize, len: usize) -> Option<(u64, Vec<u64>)> {
        let rec = self.words.as_slice().get(start..start.checked_add(len)?.checked_add(1)?)?;
        let (head, body) = rec.split_first()?;
        Some((head.load(Relaxed), body.iter().map(|w| w.load(Relaxed)).collect()))
    }

    /// Collector, quiescent table only.
    pub(crate) fn reset(&self) {
        self.next.store(0, Relaxed);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.words.bytes()
    }

    /// Words handed out since the last reset (for statistics).
    pub(crate) fn used_words(&self) -> usize {
        self.next.load(Relaxed).min(self.words.as_slice().len())
    }
}
