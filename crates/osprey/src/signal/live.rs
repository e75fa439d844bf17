//! The set of sampled allocations still live: which addresses were sampled
//! and not freed since, each with the time it was sampled.
//!
//! Fixed capacity, in zeroed static memory (the kernel maps it on first
//! touch), lock-free and signal-safe. Open addressing with the probe window
//! bounded to one 64-byte bucket of [`WAYS`] slots: an address lives in the
//! bucket its hash names, or nowhere. No probe sequence crosses a bucket, so
//! a removed slot goes straight back to empty (no tombstones, no slow
//! growth of probe lengths under churn). A bucket found full refuses the
//! insert (counted in [`LiveSet::full`]).
//!
//! # Invariants
//! - An address is present at most once: it is inserted by the allocation
//!   that returned it, and removed by `free` *before* the real `free` runs,
//!   so the allocator cannot hand it out again while it is still present.
//! - `at_ns[i]` is written (Release) after `addrs[i]` is claimed; readers
//!   that learned about the sample through its ring record (Acquire on the
//!   ring's head, pushed after the insert) see it.

use std::sync::atomic::{AtomicU64, Ordering::*};

/// Slots per bucket (one cache line of addresses).
pub const WAYS: usize = 8;
/// Buckets.
pub const BUCKETS: usize = 4096;
/// Capacity in sampled live allocations (at the default 512 KiB mean, about
/// 16 GiB of live heap).
pub const CAPACITY: usize = WAYS * BUCKETS;

#[repr(C, align(64))]
struct Bucket([AtomicU64; WAYS]);

/// See module docs.
pub struct LiveSet {
    addrs: [Bucket; BUCKETS],
    at_ns: [AtomicU64; CAPACITY],
    /// Addresses present (the `free` fast path skips the probe at 0).
    pub(crate) len: AtomicU64,
    /// Inserts refused because their bucket was full.
    pub full: AtomicU64,
}

/// The process's live set.
pub static LIVE: LiveSet = LiveSet {
    addrs: [const { Bucket([const { AtomicU64::new(0) }; WAYS]) }; BUCKETS],
    at_ns: [const { AtomicU64::new(0) }; CAPACITY],
    len: AtomicU64::new(0),
    full: AtomicU64::new(0),
};

#[inline(always)]
fn bucket_of(addr: u64) -> usize {
    // Fibonacci hashing; malloc addresses are 16-byte aligned.
    ((addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % BUCKETS
}

impl LiveSet {
    /// Signal-safe. Adds `addr` (non-zero) sampled at `at_ns`; false if its bucket is full.
    pub fn insert(&self, addr: u64, at_ns: u64) -> bool {
        let b = bucket_of(addr);
        let Some(bucket) = self.addrs.get(b) else { return false };
        for (i, slot) in bucket.0.iter().enumerate() {
            if slot.load(Relaxed) == 0 && slot.compare_exchange(0, addr, AcqRel, Relaxed).is_ok() {
                if let Some(t) = self.at_ns.get(b * WAYS + i) {
                    t.store(at_ns, Release);
                }
                self.len.fetch_add(1, Relaxed);
                return true;
            }
        }
        self.full.fetch_add(1, Relaxed);
        false
    }

    /// Signal-safe, the `free` path: removes `addr` if present. One relaxed
    /// load when the set is empty, else one bucket (cache line) scanned.
    #[inline(always)]
    pub fn remove(&self, addr: u64) -> bool {
        if self.len.load(Relaxed) == 0 || addr == 0 {
            return false;
        }
        self.remove_slow(addr)
    }

    #[inline]
    fn remove_slow(&self, addr: u64) -> bool {
        let Some(bucket) = self.addrs.get(bucket_of(addr)) else { return false };
        for slot in &bucket.0 {
            if slot.load(Relaxed) == addr && slot.compare_exchange(addr, 0, AcqRel, Relaxed).is_ok() {
                self.len.fetch_sub(1, Relaxed);
                return true;
            }
        }
        false
    }

    /// Whether `addr` is present with the sample time `at_ns` (a later
    /// sample of a reused address does not count).
    pub fn contains(&self, addr: u64, at_ns: u64) -> bool {
        let b = bucket_of(addr);
        let Some(bucket) = self.addrs.get(b) else { return false };
        bucket.0.iter().enumerate().any(|(i, slot)| {
            slot.load(Acquire) == addr && self.at_ns.get(b * WAYS + i).is_some_and(|t| t.load(Acquire) == at_ns)
        })
    }

    /// Addresses present.
    pub fn len(&self) -> u64 {
        self.len.load(Relaxed)
    }

    /// Whether no address is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_contains_remove() {
        let s: &'static LiveSet = Box::leak(Box::new(LiveSet {
            addrs: [const { Bucket([const { AtomicU64::new(0) }; WAYS]) }; BUCKETS],
            at_ns: [const { AtomicU64::new(0) }; CAPACITY],
            len: AtomicU64::new(0),
            full: AtomicU64::new(0),
        }));
        assert!(!s.remove(0x1000));
        assert!(s.insert(0x1000, 5));
        assert!(s.contains(0x1000, 5));
        assert!(!s.contains(0x1000, 6));
        assert_eq!(s.len(), 1);
        assert!(s.remove(0x1000));
        assert!(!s.contains(0x1000, 5));
        assert!(!s.remove(0x1000));
        // One bucket holds WAYS addresses, then refuses.
        let same: Vec<u64> = (1..1_000_000u64).map(|i| i * 16).filter(|&a| bucket_of(a) == 0).take(WAYS + 1).collect();
        for (i, &a) in same.iter().enumerate() {
            assert_eq!(s.insert(a, 1), i < WAYS, "{i}");
        }
        assert_eq!(s.full.load(Relaxed), 1);
        assert!(s.remove(same[0]));
        assert!(s.insert(same[WAYS], 2), "a freed slot is reused");
    }
}
