//! The live heap: sampled allocations not freed yet, by the key (stack,
//! thread, context) of the sample that allocated them, reported as
//! `inuse-space/bytes` at each flush.
//!
//! Liveness is the signal-safe live set's (`signal::live`), which `free`
//! updates synchronously; this side only remembers what each live address
//! stands for. An entry is the address's latest sample (by sample time), and
//! it is kept while the live set still holds that address *with that sample
//! time*: a block freed and its address reused by a later sampled allocation
//! counts once, under the later sample.
//!
//! `Free` records (if a thread pushes them) are applied too, but are not
//! needed: a block freed is gone from the live set by the next flush.

use crate::signal::live::{LiveSet, LIVE};
use std::collections::HashMap;
use std::hash::Hash;

/// See module docs. `K` is the aggregator's sample key.
pub struct LiveHeap<K> {
    by_addr: HashMap<u64, Entry<K>>,
}

#[derive(Clone, Copy)]
struct Entry<K> {
    key: K,
    bytes: u64,
    at_ns: u64,
}

impl<K> Default for LiveHeap<K> {
    fn default() -> Self {
        LiveHeap { by_addr: HashMap::new() }
    }
}

impl<K: Copy + Eq + Hash> LiveHeap<K> {
    /// A sampled allocation at `addr` of `weighted_bytes`, sampled at `at_ns`
    /// (its record's timestamp), under `key`.
    pub fn on_alloc(&mut self, addr: u64, key: K, weighted_bytes: u64, at_ns: u64) {
        let e = Entry { key, bytes: weighted_bytes, at_ns };
        self.by_addr
            .entry(addr)
            .and_modify(|old| {
                if old.at_ns <= at_ns {
                    *old = e
                }
            })
            .or_insert(e);
    }

    /// The sampled block at `addr` was freed at `at_ns` (optional: the live
    /// set is the truth).
    pub fn on_free(&mut self, addr: u64, at_ns: u64) {
        if self.by_addr.get(&addr).is_some_and(|e| e.at_ns <= at_ns) {
            self.by_addr.remove(&addr);
        }
    }

    /// Replaces each block's key by `f(key)` (the aggregator's stack ids
    /// outlive storage epochs); `None` keeps the key as it is.
    pub fn rekey(&mut self, mut f: impl FnMut(&K) -> Option<K>) {
        for e in self.by_addr.values_mut() {
            if let Some(k) = f(&e.key) {
                e.key = k;
            }
        }
    }

    /// Forgets freed blocks and returns the live bytes by key.
    pub fn inuse(&mut self) -> Vec<(K, u64)> {
        self.inuse_in(&LIVE)
    }

    /// Keys of the live blocks (the aggregator keeps their frames).
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_addr.values().map(|e| &e.key)
    }

    fn inuse_in(&mut self, live: &LiveSet) -> Vec<(K, u64)> {
        self.by_addr.retain(|&addr, e| live.contains(addr, e.at_ns));
        let mut sums: HashMap<K, u64> = HashMap::new();
        for e in self.by_addr.values() {
            *sums.entry(e.key).or_default() += e.bytes;
        }
        sums.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_the_live_set_holds() {
        let live = &LIVE;
        let mut h = LiveHeap::<u32>::default();
        // Addresses no allocator returns (odd), so the test owns them in the global set.
        let (a, b, c) = (0x7f00_0000_0001u64, 0x7f00_0000_1001, 0x7f00_0000_2001);
        assert!(live.insert(a, 10) && live.insert(b, 11) && live.insert(c, 12));
        h.on_alloc(a, 1, 100, 10);
        h.on_alloc(b, 1, 50, 11);
        h.on_alloc(c, 2, 7, 12);
        let mut v = h.inuse_in(live);
        v.sort();
        assert_eq!(v, vec![(1, 150), (2, 7)]);
        // b freed; c freed and its address sampled again later under key 3,
        // the older record drained after the newer one.
        assert!(live.remove(b) && live.remove(c) && live.insert(c, 20));
        h.on_alloc(c, 3, 9, 20);
        h.on_alloc(c, 2, 7, 12);
        let mut v = h.inuse_in(live);
        v.sort();
        assert_eq!(v, vec![(1, 100), (3, 9)]);
        assert_eq!(h.keys().count(), 2);
        // A Free record of the older sample leaves the newer one alone.
        h.on_free(c, 15);
        h.rekey(|&k| (k == 3).then_some(30));
        let mut v = h.inuse_in(live);
        v.sort();
        assert_eq!(v, vec![(1, 100), (30, 9)]);
        assert!(live.remove(a) && live.remove(c));
        assert!(h.inuse_in(live).is_empty() && h.keys().count() == 0);
    }
}
