//! The live heap: sampled allocations not freed yet, by the key (stack,
//! thread, context) they were sampled under; what `inuse-space` reports.
//!
//! Fed by the aggregator from the sample rings: an `Alloc` record adds the
//! block at its address, a `Free` record of that address removes it. Rings
//! are drained one thread after another, so a block's `Free` (pushed by the
//! freeing thread) may be seen before its `Alloc`: a free is remembered for
//! one more flush and cancels an allocation of that address made before it
//! (by the records' monotonic timestamps).

use std::collections::HashMap;
use std::hash::Hash;

/// Sampled live blocks by address.
pub struct LiveHeap<K> {
    /// addr -> (key, weighted bytes, allocation time).
    blocks: HashMap<u64, (K, u64, u64)>,
    /// Frees whose allocation was not seen yet: addr -> (time, flushes seen).
    early_frees: HashMap<u64, (u64, u32)>,
}

impl<K> Default for LiveHeap<K> {
    fn default() -> Self {
        LiveHeap { blocks: HashMap::new(), early_frees: HashMap::new() }
    }
}

impl<K: Copy + Eq + Hash> LiveHeap<K> {
    /// A sampled allocation at `at_ns` of the block at `addr`, standing for `weighted_bytes`.
    pub fn on_alloc(&mut self, addr: u64, key: K, weighted_bytes: u64, at_ns: u64) {
        if let Some(&(freed, _)) = self.early_frees.get(&addr) {
            if freed >= at_ns {
                self.early_frees.remove(&addr);
                return;
            }
        }
        match self.blocks.get(&addr) {
            Some(&(_, _, older)) if older > at_ns => {}
            _ => drop(self.blocks.insert(addr, (key, weighted_bytes, at_ns))),
        }
    }

    /// The sampled block at `addr` was freed at `at_ns`.
    pub fn on_free(&mut self, addr: u64, at_ns: u64) {
        match self.blocks.get(&addr) {
            Some(&(_, _, allocated)) if allocated <= at_ns => drop(self.blocks.remove(&addr)),
            _ => drop(self.early_frees.insert(addr, (at_ns, 0))),
        }
    }

    /// Replaces each block's key by `f(key)` (the aggregator's stack ids
    /// outlive storage epochs); `None` keeps the key as it is.
    pub fn rekey(&mut self, mut f: impl FnMut(&K) -> Option<K>) {
        for (key, _, _) in self.blocks.values_mut() {
            if let Some(k) = f(key) {
                *key = k;
            }
        }
    }

    /// In-use bytes by key, now; forgets frees left unmatched for a flush.
    pub fn inuse(&mut self) -> Vec<(K, u64)> {
        self.early_frees.retain(|_, (_, flushes)| {
            *flushes += 1;
            *flushes <= 1
        });
        let mut by_key: HashMap<K, u64> = HashMap::new();
        for (key, bytes, _) in self.blocks.values() {
            *by_key.entry(*key).or_default() += bytes;
        }
        by_key.into_iter().collect()
    }

    /// Keys of the live blocks (their stacks must be kept).
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.blocks.values().map(|(k, _, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_in_any_order() {
        let mut h = LiveHeap::default();
        h.on_alloc(0x10, 1u32, 100, 5);
        h.on_alloc(0x20, 2u32, 50, 6);
        h.on_free(0x30, 9); // freed before its allocation is drained
        h.on_alloc(0x30, 3u32, 70, 8);
        h.on_free(0x10, 7);
        assert_eq!(h.inuse(), vec![(2, 50)]);
        // Reused address: a later allocation stays live.
        h.on_alloc(0x10, 4u32, 10, 12);
        let mut v = h.inuse();
        v.sort();
        assert_eq!(v, vec![(2, 50), (4, 10)]);
    }
}
