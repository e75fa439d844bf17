//! Per-thread sample rings.
//!
//! `push` runs in the sampling handler. Single producer (the owning thread's
//! signal handler), single consumer (the collector).
//!
//! The ring lives inside zero-mapped registry records and is never
//! constructed: all-zero bytes are an empty ring (`head == tail == 0`, slot
//! contents are `MaybeUninit`). Because of that it uses `core` atomics
//! directly rather than the loom shim (loom atomics cannot be zero bytes).
//!
//! # Invariants
//! - `head` (next write) is stored only by the producer, `tail` (next read)
//!   only by the consumer; both only grow (wrapping u64, never reached).
//! - `head - tail <= RING_CAPACITY`. Slot `i % RING_CAPACITY` for
//!   `tail <= i < head` is initialised and owned by the consumer; the others
//!   are owned by the producer.
//! - The producer writes a slot, then stores `head` with `Release`; the
//!   consumer loads `head` with `Acquire` before reading. Symmetrically the
//!   consumer copies a record out, then stores `tail` with `Release`, and the
//!   producer loads `tail` with `Acquire` before overwriting.

use super::context::TAG_SLOTS;
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU64, Ordering::*};

/// What a [`SampleRecord`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum SampleKind {
    /// A CPU-clock sample: `value` is CPU ns, `count` samples.
    Cpu = 0,
    /// A wall-clock sample: `value` is wall ns, `state` the thread's state.
    Wall = 1,
    /// A sampled allocation of the block at `addr`: `value` is its weighted
    /// bytes, `count` its weighted allocation count.
    Alloc = 2,
    /// The sampled block at `addr` was freed (no stack: `trace_id` is 0).
    Free = 3,
}

impl SampleKind {
    /// The kind encoded in [`SampleRecord::kind`] (unknown values: `Cpu`).
    pub fn from_u16(v: u16) -> SampleKind {
        match v {
            1 => SampleKind::Wall,
            2 => SampleKind::Alloc,
            3 => SampleKind::Free,
            _ => SampleKind::Cpu,
        }
    }
}

/// One sample, fixed size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleRecord {
    /// Call trace id in storage.
    pub trace_id: u64,
    /// CLOCK_MONOTONIC ns when taken.
    pub timestamp_ns: u64,
    /// Span id of the trace context (0 = none).
    pub span_id: u64,
    /// Local root span id (0 = none).
    pub local_root_span_id: u64,
    /// W3C trace id of the trace context, high half then low half (0 = none).
    pub w3c_trace_id: [u64; 2],
    /// What the sample stands for, in the unit of its kind (see [`SampleKind`]).
    pub value: u64,
    /// Address of the block of an `Alloc`/`Free` sample (0 otherwise).
    pub addr: u64,
    /// Samples this record stands for (weighted allocations for `Alloc`).
    pub count: u32,
    /// Thread that took the sample.
    pub tid: i32,
    /// Interned tag value ids by tag slot (0 = unset).
    pub tags: [u32; TAG_SLOTS],
    /// [`SampleKind`] as u16.
    pub kind: u16,
    /// Thread state of a `Wall` sample (`crate::wall::thread_state` encoding; 0: none).
    pub state: u16,
}

impl SampleRecord {
    /// The record's [`SampleKind`].
    pub fn kind(&self) -> SampleKind {
        SampleKind::from_u16(self.kind)
    }
}

/// Entries per ring.
pub const RING_CAPACITY: usize = 512;
const CAP: u64 = RING_CAPACITY as u64;

/// SPSC ring: producer = the owning thread's signal handler, consumer = collector.
/// All-zero bytes are a valid empty ring.
#[repr(C)]
pub struct SampleRing {
    /// Next index to write. Producer-owned.
    head: AtomicU64,
    /// Next index to read. Consumer-owned; on its own cache line so the
    /// consumer's stores do not invalidate the producer's `head`.
    tail: CacheLine,
    slots: [UnsafeCell<MaybeUninit<SampleRecord>>; RING_CAPACITY],
}

#[repr(C, align(64))]
struct CacheLine(AtomicU64);

// SAFETY: slot access is partitioned between one producer and one consumer by
// head/tail (see the module invariants); callers uphold the SPSC contract.
unsafe impl Sync for SampleRing {}
// SAFETY: single producer and single consumer, each side owning the slots the invariants give it.
unsafe impl Send for SampleRing {}

impl SampleRing {
    /// An empty ring (equivalent to zeroed memory). Not signal-safe to build
    /// on a signal stack (it is large); meant for tests and heap placement.
    pub fn new() -> Self {
        SampleRing {
            head: AtomicU64::new(0),
            tail: CacheLine(AtomicU64::new(0)),
            slots: [const { UnsafeCell::new(MaybeUninit::uninit()) }; RING_CAPACITY],
        }
    }

    /// Signal-safe. Producer only (the owning thread). false when full.
    #[inline]
    pub fn push(&self, r: &SampleRecord) -> bool {
        let h = self.head.load(Relaxed);
        let t = self.tail.0.load(Acquire);
        if h.wrapping_sub(t) >= CAP {
            return false;
        }
        let Some(slot) = self.slots.get((h % CAP) as usize) else { return false };
        // SAFETY: slot `h` is outside `tail..head`, so the producer owns it.
        unsafe { (*slot.get()).write(*r) };
        self.head.store(h.wrapping_add(1), Release);
        true
    }

    /// Consumer only (one collector at a time): calls `f` for each record in order.
    pub fn drain(&self, mut f: impl FnMut(&SampleRecord)) {
        let mut t = self.tail.0.load(Relaxed);
        let h = self.head.load(Acquire);
        // At most one ring's worth, even if the indices were ever inconsistent.
        let n = h.wrapping_sub(t).min(CAP);
        for _ in 0..n {
            let Some(slot) = self.slots.get((t % CAP) as usize) else { break };
            // SAFETY: `tail <= t < head`: initialised by the producer, published by `head`.
            let rec = unsafe { (*slot.get()).assume_init() };
            t = t.wrapping_add(1);
            self.tail.0.store(t, Release);
            f(&rec);
        }
    }

    /// Records waiting to be drained (racy snapshot).
    pub fn len(&self) -> usize {
        self.head.load(Acquire).wrapping_sub(self.tail.0.load(Acquire)).min(CAP) as usize
    }

    /// Whether nothing waits to be drained (consumer side).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for SampleRing {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64) -> SampleRecord {
        SampleRecord { trace_id: i, count: 1, ..Default::default() }
    }

    #[test]
    fn zeroed_memory_is_an_empty_ring() {
        // SAFETY: all-zero bytes are an empty ring (module docs).
        let ring: Box<SampleRing> = unsafe { Box::new_zeroed().assume_init() };
        assert!(ring.is_empty());
        let mut n = 0;
        ring.drain(|_| n += 1);
        assert_eq!(n, 0);
        assert!(ring.push(&rec(7)));
        ring.drain(|r| assert_eq!(r.trace_id, 7));
    }

    #[test]
    fn full_and_wraparound() {
        let ring = Box::new(SampleRing::new());
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..5 {
            while ring.push(&rec(next_in)) {
                next_in += 1;
            }
            assert_eq!(ring.len(), RING_CAPACITY, "round {round}");
            assert!(!ring.push(&rec(u64::MAX)), "full ring must refuse");
            // Drain only part of it so indices wrap at different offsets.
            let mut taken = 0;
            ring.drain(|r| {
                assert_eq!(r.trace_id, next_out);
                next_out += 1;
                taken += 1;
            });
            assert_eq!(taken, RING_CAPACITY);
            for _ in 0..(round * 97 % RING_CAPACITY) {
                assert!(ring.push(&rec(next_in)));
                next_in += 1;
            }
            ring.drain(|r| {
                assert_eq!(r.trace_id, next_out);
                next_out += 1;
            });
        }
        assert_eq!(next_in, next_out);
    }

    #[test]
    fn spsc_threads() {
        let ring = std::sync::Arc::new(SampleRing::new());
        let p = ring.clone();
        const N: u64 = 200_000;
        let prod = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                if p.push(&rec(i)) {
                    i += 1;
                }
            }
        });
        let mut expect = 0;
        while expect < N {
            ring.drain(|r| {
                assert_eq!(r.trace_id, expect);
                expect += 1;
            });
        }
        prod.join().unwrap();
    }
}
