//! Per-thread sample rings. STUB — signatures fixed, being implemented.

use crate::context::TAG_SLOTS;

/// One sample, fixed size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleRecord {
    pub trace_id: u64,
    /// CLOCK_MONOTONIC ns when taken.
    pub timestamp_ns: u64,
    pub span_id: u64,
    pub local_root_span_id: u64,
    /// CPU nanoseconds this sample stands for.
    pub cpu_ns: u64,
    pub count: u32,
    pub tid: i32,
    pub tags: [u32; TAG_SLOTS],
}

/// Entries per ring.
pub const RING_CAPACITY: usize = 512;

/// SPSC ring: producer = the owning thread's signal handler, consumer = collector.
/// All-zero bytes are a valid empty ring.
#[repr(C)]
pub struct SampleRing {
    _slots: [core::mem::MaybeUninit<SampleRecord>; RING_CAPACITY],
    _head: core::sync::atomic::AtomicU64,
    _tail: core::sync::atomic::AtomicU64,
}

impl SampleRing {
    /// Signal-safe. false when full.
    pub fn push(&self, _r: &SampleRecord) -> bool {
        false
    }
    /// Consumer side: calls `f` for each record in order.
    pub fn drain(&self, _f: impl FnMut(&SampleRecord)) {}
}
