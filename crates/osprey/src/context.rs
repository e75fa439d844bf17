//! Thread-local trace context (span id, local root span id, tags).
//! STUB — being implemented (issue 4). The layout and the two entry points
//! used by the registry and the handler are fixed.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Number of tag slots per thread.
pub const TAG_SLOTS: usize = 10;

/// Per-thread context record, one cache line.
#[repr(C, align(64))]
pub struct ContextRecord {
    span_id: AtomicU64,
    local_root_span_id: AtomicU64,
    checksum: AtomicU64,
    tags: [AtomicU32; TAG_SLOTS],
}

/// A validated context as seen by the handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextSnapshot {
    pub span_id: u64,
    pub local_root_span_id: u64,
    /// Interned tag value ids (0 = unset), by tag-key slot.
    pub tags: [u32; TAG_SLOTS],
}

impl ContextRecord {
    /// Clears the record (used when a registry record is recycled).
    pub fn reset(&self) {
        self.checksum.store(0, Release);
        self.span_id.store(0, Relaxed);
        self.local_root_span_id.store(0, Relaxed);
        for t in &self.tags {
            t.store(0, Relaxed);
        }
    }

    /// Handler-side read. Signal-safe. `None` when no context is set, a write is
    /// in progress, or the checksum does not match (counted).
    #[inline]
    pub fn read(&self) -> Option<ContextSnapshot> {
        let _ = (&self.span_id, &self.local_root_span_id, &self.checksum, &self.tags);
        None
    }
}

/// Name of the tag key in `slot`. (stub)
pub fn tag_key_name(_slot: usize) -> Option<String> {
    None
}

/// String of an interned tag value. (stub)
pub fn tag_value(_id: u32) -> Option<String> {
    None
}
