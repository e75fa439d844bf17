//! Samples a thread took while its ring was full: summed by kind in its
//! record, so that what they stood for reaches the profile in the right
//! sample types (never silent, never counted as CPU time when it was an
//! allocation). All-zero bytes are "nothing lost".

use super::{SampleKind, SampleRecord};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Sums of the samples lost by one thread since the collector last took them.
pub struct Lost {
    /// Records lost, of any kind; bumped last (Release), read first.
    pub records: AtomicU64,
    /// CPU samples.
    pub cpu_samples: AtomicU64,
    /// Their CPU nanoseconds.
    pub cpu_ns: AtomicU64,
    /// Wall nanoseconds.
    pub wall_ns: AtomicU64,
    /// Weighted allocations.
    pub alloc_count: AtomicU64,
    /// Weighted allocated bytes.
    pub alloc_bytes: AtomicU64,
}

/// What [`Lost::take`] returns: the fields of [`Lost`], taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LostSums {
    pub records: u64,
    pub cpu_samples: u64,
    pub cpu_ns: u64,
    pub wall_ns: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
}

impl Lost {
    /// Signal-safe. Adds `s` (a record the ring refused). A lost `Free`
    /// counts as a record only: the live set, not the ring, says which
    /// blocks are freed.
    #[inline]
    pub fn add(&self, s: &SampleRecord) {
        match s.kind() {
            SampleKind::Cpu => {
                self.cpu_samples.fetch_add(s.count as u64, Relaxed);
                self.cpu_ns.fetch_add(s.value, Relaxed);
            }
            SampleKind::Wall => {
                self.wall_ns.fetch_add(s.value, Relaxed);
            }
            SampleKind::Alloc => {
                self.alloc_count.fetch_add(s.count as u64, Relaxed);
                self.alloc_bytes.fetch_add(s.value, Relaxed);
            }
            SampleKind::Free => {}
        }
        self.records.fetch_add(1, Release);
    }

    /// Takes the sums (the collector; one load when nothing was lost, so an
    /// idle record's page is not written). A sample added while this runs
    /// is taken now or at the next call, never twice nor never.
    pub fn take(&self) -> LostSums {
        if self.records.load(Acquire) == 0 {
            return LostSums::default();
        }
        LostSums {
            records: self.records.swap(0, Acquire),
            cpu_samples: self.cpu_samples.swap(0, Relaxed),
            cpu_ns: self.cpu_ns.swap(0, Relaxed),
            wall_ns: self.wall_ns.swap(0, Relaxed),
            alloc_count: self.alloc_count.swap(0, Relaxed),
            alloc_bytes: self.alloc_bytes.swap(0, Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: SampleKind, value: u64, count: u32) -> SampleRecord {
        SampleRecord { kind: kind as u16, value, count, ..Default::default() }
    }

    #[test]
    fn sums_by_kind_and_takes_once() {
        // SAFETY: all-zero atomics are valid (records are zeroed memory).
        let lost: Lost = unsafe { core::mem::zeroed() };
        assert_eq!(lost.take(), LostSums::default());
        lost.add(&rec(SampleKind::Cpu, 10_000_000, 1));
        lost.add(&rec(SampleKind::Cpu, 20_000_000, 2));
        lost.add(&rec(SampleKind::Wall, 50_000_000, 1));
        lost.add(&rec(SampleKind::Alloc, 524_288, 1024));
        lost.add(&rec(SampleKind::Free, 0, 1));
        let want = LostSums {
            records: 5,
            cpu_samples: 3,
            cpu_ns: 30_000_000,
            wall_ns: 50_000_000,
            alloc_count: 1024,
            alloc_bytes: 524_288,
        };
        assert_eq!(lost.take(), want);
        assert_eq!(lost.take(), LostSums::default(), "taken once");
    }
}
