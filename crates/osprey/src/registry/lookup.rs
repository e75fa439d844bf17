//! The registry's signal-safe half: finding the calling thread's record
//! through the tid table, and claiming one from the free list (the priming
//! handler does). Atomics only, on memory mapped before handlers run.

use super::{Registry, GLOBAL, MAX_SEGMENTS, RETIRED_BIT};
use crate::record::{Origin, Record, RecordState, SampleRecord};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

impl Registry {
    /// The process registry if it exists. Signal-safe (one atomic load).
    #[inline(always)]
    pub fn get() -> Option<&'static Registry> {
        // SAFETY: published once with Release and never freed.
        unsafe { GLOBAL.load(Acquire).as_ref() }
    }

    /// The record at `index`, if mapped. Signal-safe.
    #[inline]
    pub fn record(&self, index: usize) -> Option<&'static Record> {
        let seg = index / self.segment_len;
        if seg >= MAX_SEGMENTS {
            return None;
        }
        let base = self.segments[seg].load(Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: segments are never unmapped; index is within the segment.
        Some(unsafe { &*base.add(index % self.segment_len) })
    }

    /// The free-list link of record `index`. Signal-safe.
    #[inline(always)]
    pub(super) fn link(&self, index: usize) -> Option<&AtomicU32> {
        // SAFETY: `links` has MAX_SEGMENTS * segment_len entries, mapped for
        // the life of the process.
        (index < MAX_SEGMENTS * self.segment_len).then(|| unsafe { &*self.links.add(index) })
    }

    #[inline(always)]
    pub(super) fn tid_slot(&self, tid: i32) -> Option<&AtomicU32> {
        let t = tid as usize;
        if tid <= 0 || t >= self.tid_limit {
            return None;
        }
        // SAFETY: t < tid_limit, table mapped for tid_limit entries.
        Some(unsafe { &*self.tid_table.add(t) })
    }

    /// Depth of osprey signal handlers running on thread `tid` (registered
    /// or not). Handlers bump it on entry; the test allocator aborts when it
    /// is non-zero. Signal-safe.
    #[inline]
    pub fn handler_depth(&self, tid: i32) -> Option<&AtomicU32> {
        let t = tid as usize;
        if tid <= 0 || t >= self.tid_limit {
            return None;
        }
        // SAFETY: t < tid_limit, table mapped for tid_limit entries.
        Some(unsafe { &*self.depth_table.add(t) })
    }

    /// Marks record `index` for the collector's next drain. Signal-safe.
    #[inline]
    pub fn mark_dirty(&self, index: usize) {
        if let Some(w) = self.dirty_word(index / 64) {
            w.fetch_or(1 << (index % 64), Release);
        }
    }

    #[inline(always)]
    pub(super) fn dirty_word(&self, i: usize) -> Option<&AtomicU64> {
        // SAFETY: i < dirty_words, table mapped for dirty_words words.
        (i < self.dirty_words).then(|| unsafe { &*self.dirty.add(i) })
    }

    /// Pushes `sample` on the ring of record `index` (`rec`), counting it
    /// as lost when the ring is full, and marks the record for draining.
    /// Signal-safe; the caller is the ring's one producer (its thread, with
    /// the sampling signal blocked or inside the handler).
    #[inline]
    pub fn push_sample(&self, index: usize, rec: &Record, sample: &SampleRecord) {
        if !rec.ring.push(sample) {
            rec.lost.add(sample);
        }
        self.mark_dirty(index);
    }

    /// Record index registered for `tid`. Signal-safe.
    #[inline]
    pub fn lookup(&self, tid: i32) -> Option<(usize, &'static Record)> {
        let v = self.tid_slot(tid)?.load(Acquire);
        if v == 0 || v & RETIRED_BIT != 0 {
            return None;
        }
        let idx = (v - 1) as usize;
        let rec = self.record(idx)?;
        (rec.tid.load(Relaxed) == tid).then_some((idx, rec))
    }

    /// Claims a record for `tid`, the calling thread, or returns the one it
    /// has; `now_ns` is its registration time. Signal-safe: callable from the
    /// priming handler. Callers outside a handler must block the profiler's
    /// signals around it (see `threads::register_current`).
    pub fn claim(&self, tid: i32, origin: Origin, now_ns: u64) -> Option<(usize, &'static Record)> {
        if let Some(found) = self.lookup(tid) {
            return Some(found); // dedup: already registered
        }
        let slot = self.tid_slot(tid)?;
        let Some(idx) = self.pop_free() else {
            self.exhausted.fetch_add(1, Relaxed);
            return None;
        };
        let rec = self.record(idx as usize)?;
        self.high_water.fetch_max(idx as usize + 1, Release);
        rec.tid.store(tid, Relaxed);
        rec.origin.store(origin as u32, Relaxed);
        rec.registered_ns.store(now_ns, Relaxed);
        rec.state.store(RecordState::Claimed as u32, Release);
        self.changes.fetch_add(1, Relaxed);
        let old = slot.swap(idx + 1, AcqRel);
        // A live entry left by a dead thread whose tid the kernel gave to
        // this one (it exited without retiring): its record is retired here.
        // A retired entry's record was retired by its owner already.
        if old != 0 && old & RETIRED_BIT == 0 && old != idx + 1 {
            if let Some(old_rec) = self.record((old - 1) as usize) {
                if old_rec.tid.load(Relaxed) == tid {
                    old_rec.tid.store(0, Relaxed);
                    old_rec.state.store(RecordState::Retired as u32, Release);
                    self.mark_dirty((old - 1) as usize);
                }
            }
        }
        Some((idx as usize, rec))
    }

    /// Signal-safe pop. Returns a record index.
    fn pop_free(&self) -> Option<u32> {
        let mut head = self.free_head.load(Acquire);
        loop {
            let top = head as u32;
            if top == 0 {
                return None;
            }
            let next = self.link((top - 1) as usize)?.load(Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | next as u64;
            match self.free_head.compare_exchange_weak(head, new, AcqRel, Acquire) {
                Ok(_) => {
                    self.free_count.fetch_sub(1, Relaxed);
                    return Some(top - 1);
                }
                Err(h) => head = h,
            }
        }
    }
}
