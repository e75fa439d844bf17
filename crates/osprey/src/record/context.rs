//! The per-thread [`ContextRecord`]: layout, checksum, write protocol and the
//! signal-safe [`ContextRecord::read`]. The ordering argument is in
//! `crate::context`'s module docs.

use core::sync::atomic::{compiler_fence, AtomicU32, AtomicU64, Ordering::*};

/// Number of tag slots per thread.
pub const TAG_SLOTS: usize = 10;

/// Knuth's multiplicative hashing constant (2^64 / golden ratio, odd).
pub const KNUTH: u64 = 0x9E37_79B9_7F4A_7C15;

/// Odd multipliers for the five tag pairs (each one distinct from `KNUTH` and
/// from each other, so a value moved to another pair changes the checksum).
const TAG_MUL: [u64; TAG_SLOTS / 2] =
    [0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0xD6E8_FEB8_6659_FD93, 0xFF51_AFD7_ED55_8CCD, 0xC4CE_B9FE_1A85_EC53];

/// Reads that found a nonzero checksum not matching the fields (handler side).
/// In-process this stays 0; a nonzero value means memory corruption or a
/// writer that broke the protocol.
pub static TORN_READS: AtomicU64 = AtomicU64::new(0);

/// Value of [`TORN_READS`].
pub fn torn_reads() -> u64 {
    TORN_READS.load(Relaxed)
}

/// Per-thread context record, exactly one cache line, zero = "no context".
///
/// Byte layout (stable; out-of-process readers rely on it): `span_id` at 0,
/// `local_root_span_id` at 8, `checksum` at 16, `tags[i]` at `24 + 4 * i`,
/// all native-endian.
///
/// Invariants:
/// - Single writer: only the thread that owns the enclosing registry record
///   calls the `store*` methods (or the collector, through `reset`, once that
///   thread is gone).
/// - `checksum == 0` means "no context or write in progress"; otherwise it
///   equals [`checksum`] of the fields.
#[repr(C, align(64))]
pub struct ContextRecord {
    span_id: AtomicU64,
    local_root_span_id: AtomicU64,
    checksum: AtomicU64,
    tags: [AtomicU32; TAG_SLOTS],
}

const _: () = {
    assert!(core::mem::size_of::<ContextRecord>() == 64);
    assert!(core::mem::offset_of!(ContextRecord, local_root_span_id) == 8);
    assert!(core::mem::offset_of!(ContextRecord, checksum) == 16);
    assert!(core::mem::offset_of!(ContextRecord, tags) == 24);
};

/// A validated context as seen by the handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ContextSnapshot {
    /// Span id (0 = none).
    pub span_id: u64,
    /// Local root span id (0 = none).
    pub local_root_span_id: u64,
    /// Interned tag value ids (0 = unset), by tag-key slot.
    pub tags: [u32; TAG_SLOTS],
}

impl ContextSnapshot {
    /// True when no field is set (publishing it leaves the record empty).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.span_id | self.local_root_span_id == 0 && self.tags.iter().all(|&t| t == 0)
    }
}

/// Checksum of a context: never zero, deterministic, pure arithmetic
/// (signal-safe).
///
/// `span * K ^ swap32(root) * K`, XOR one term per pair of tags
/// (`(tag[2j] | tag[2j+1] << 32) * M_j`), with a raw 0 folded to all-ones.
/// With every tag 0 this is exactly the classic span/root checksum, so readers
/// that only know span and root stay compatible.
///
/// Every term is a bijection of its own field(s) (multiplication by an odd
/// constant mod 2^64), so changing any single field, in any bits, changes the
/// XOR. The only blind spot is the final fold, which merges raw `0` and raw
/// `!0`: a change is missed only if it moves the raw hash between exactly
/// those two values (for a single flipped bit this needs bit 0 and a crafted
/// input; see the checksum tests).
#[inline(always)]
pub fn checksum(span_id: u64, local_root_span_id: u64, tags: &[u32; TAG_SLOTS]) -> u64 {
    fold(ids_term(span_id, local_root_span_id) ^ tags_term(tags))
}

/// The span/root part of [`checksum`] (root with its 32-bit halves swapped).
#[inline(always)]
fn ids_term(span_id: u64, local_root_span_id: u64) -> u64 {
    span_id.wrapping_mul(KNUTH) ^ local_root_span_id.rotate_left(32).wrapping_mul(KNUTH)
}

/// Folds a raw hash of 0 to all-ones, so a published checksum is never 0.
#[inline(always)]
fn fold(h: u64) -> u64 {
    if h == 0 {
        u64::MAX
    } else {
        h
    }
}

/// The tags' contribution to [`checksum`] (0 when every tag is 0).
#[inline(always)]
pub fn tags_term(tags: &[u32; TAG_SLOTS]) -> u64 {
    let mut h = 0;
    let mut j = 0;
    while j < TAG_SLOTS / 2 {
        let pair = tags[2 * j] as u64 | (tags[2 * j + 1] as u64) << 32;
        h ^= pair.wrapping_mul(TAG_MUL[j]);
        j += 1;
    }
    h
}

impl ContextRecord {
    /// An empty record (all zero), for tests and benchmarks; real records
    /// live in the registry's zeroed mapping.
    pub const fn new() -> Self {
        ContextRecord {
            span_id: AtomicU64::new(0),
            local_root_span_id: AtomicU64::new(0),
            checksum: AtomicU64::new(0),
            tags: [const { AtomicU32::new(0) }; TAG_SLOTS],
        }
    }

    /// Clears the record (used when a registry record is recycled).
    pub fn reset(&self) {
        self.checksum.store(0, Release);
        compiler_fence(SeqCst);
        self.span_id.store(0, Relaxed);
        self.local_root_span_id.store(0, Relaxed);
        for t in &self.tags {
            t.store(0, Relaxed);
        }
    }

    /// Handler-side read. Signal-safe: atomics and arithmetic only (no
    /// allocation, locks, TLS, libc or panics). `None` when no context is set,
    /// a write is in progress, or the checksum does not match (counted in
    /// [`TORN_READS`]).
    #[inline]
    pub fn read(&self) -> Option<ContextSnapshot> {
        // Acquire: the field loads below cannot be hoisted above this load
        // (compiler and CPU); free on x86.
        let c = self.checksum.load(Acquire);
        if c == 0 {
            return None;
        }
        let span_id = self.span_id.load(Relaxed);
        let local_root_span_id = self.local_root_span_id.load(Relaxed);
        let tags = self.load_tags();
        if checksum(span_id, local_root_span_id, &tags) != c {
            TORN_READS.fetch_add(1, Relaxed);
            return None;
        }
        Some(ContextSnapshot { span_id, local_root_span_id, tags })
    }

    /// Writer-side view of the fields, without validation (the owner thread
    /// cannot race itself). `None` when the record is empty.
    #[inline]
    pub fn load(&self) -> Option<ContextSnapshot> {
        if self.checksum.load(Relaxed) == 0 {
            return None;
        }
        Some(ContextSnapshot {
            span_id: self.span_id.load(Relaxed),
            local_root_span_id: self.local_root_span_id.load(Relaxed),
            tags: self.load_tags(),
        })
    }

    #[inline(always)]
    fn load_tags(&self) -> [u32; TAG_SLOTS] {
        // No indexing, hence no panic path (this runs in the handler).
        let mut tags = [0; TAG_SLOTS];
        for (t, a) in tags.iter_mut().zip(&self.tags) {
            *t = a.load(Relaxed);
        }
        tags
    }

    /// Publishes a whole context (ids and tags). Owner thread only.
    #[inline]
    pub fn store(&self, s: &ContextSnapshot) {
        let c = if s.is_empty() { 0 } else { checksum(s.span_id, s.local_root_span_id, &s.tags) };
        self.begin();
        self.span_id.store(s.span_id, Relaxed);
        self.local_root_span_id.store(s.local_root_span_id, Relaxed);
        for (a, &v) in self.tags.iter().zip(&s.tags) {
            a.store(v, Relaxed);
        }
        self.publish(c);
    }

    /// Publishes new ids, keeping the tags. Owner thread only.
    #[inline]
    pub fn store_ids(&self, span_id: u64, local_root_span_id: u64) {
        let c = checksum_of(span_id, local_root_span_id, |i| self.tags[i].load(Relaxed));
        self.begin();
        self.span_id.store(span_id, Relaxed);
        self.local_root_span_id.store(local_root_span_id, Relaxed);
        self.publish(c);
    }

    /// Publishes one tag value (0 = unset) in `slot`, keeping everything
    /// else. Owner thread only. Out-of-range slots are ignored.
    #[inline]
    pub fn store_tag(&self, slot: usize, value_id: u32) {
        if slot >= TAG_SLOTS {
            return;
        }
        let tag = |i: usize| if i == slot { value_id } else { self.tags[i].load(Relaxed) };
        let (span_id, local_root_span_id) = (self.span_id.load(Relaxed), self.local_root_span_id.load(Relaxed));
        let c = checksum_of(span_id, local_root_span_id, tag);
        self.begin();
        self.tags[slot].store(value_id, Relaxed);
        self.publish(c);
    }

    /// Marks the record "in progress" before any field changes.
    #[inline(always)]
    fn begin(&self) {
        self.checksum.store(0, Relaxed);
        // Same-thread reader: the field stores after this must not be moved
        // before the checksum = 0 store. x86 (TSO) keeps stores in order, so
        // this is also a CPU store-store barrier there.
        compiler_fence(SeqCst);
    }

    /// Makes the new fields valid. `c` is 0 only for an empty context.
    #[inline(always)]
    fn publish(&self, c: u64) {
        // Release: no field store may sink below the checksum store.
        self.checksum.store(c, Release);
    }
}

impl Default for ContextRecord {
    fn default() -> Self {
        Self::new()
    }
}

/// The checksum a writer publishes for these ids and the tags `tag(i)`
/// (0 = no context at all). Tags are read straight from `tag`, not copied
/// into an array first: a stack copy invites a memcmp and store-forwarding
/// stalls on the 4+4 -> 8 byte reload (measured: 10.5 ns instead of 5).
#[inline(always)]
fn checksum_of(span_id: u64, local_root_span_id: u64, tag: impl Fn(usize) -> u32) -> u64 {
    let mut term = 0;
    let mut any = 0;
    for (j, mul) in TAG_MUL.iter().enumerate() {
        let (lo, hi) = (tag(2 * j), tag(2 * j + 1));
        any |= lo | hi;
        term ^= (lo as u64 | (hi as u64) << 32).wrapping_mul(*mul);
    }
    if span_id | local_root_span_id == 0 && any == 0 {
        0
    } else {
        fold(ids_term(span_id, local_root_span_id) ^ term)
    }
}
