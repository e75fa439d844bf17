//! The bounded queue of one backend.
//!
//! Invariants: at most `max_items` profiles and `max_bytes` bytes (the
//! encoded pprof of each) are held; a submission that goes over either
//! bound drops the oldest profiles first (the one being sent included: its
//! sender finds it gone and does not count it twice) and counts them;
//! profiles leave in submission order.

use crate::Item;
use std::collections::VecDeque;
use std::sync::Arc;

#[derive(Debug)]
/// Profiles waiting for one backend, oldest first.
pub struct Queue {
    items: VecDeque<Arc<Item>>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
    /// Profiles dropped because the queue was full, ever.
    pub dropped: u64,
    /// Samples' worth of bytes is unknown here; dropped bytes, ever.
    pub dropped_bytes: u64,
}

impl Queue {
    /// An empty queue with these bounds (at least one profile).
    pub fn new(max_items: usize, max_bytes: usize) -> Queue {
        Queue { items: VecDeque::new(), bytes: 0, max_items: max_items.max(1), max_bytes, dropped: 0, dropped_bytes: 0 }
    }

    /// Adds `item` at the back; returns how many old ones were dropped.
    pub fn push(&mut self, item: Arc<Item>) -> usize {
        self.bytes += item.pprof.len();
        self.items.push_back(item);
        let mut n = 0;
        while !self.items.is_empty() && (self.items.len() > self.max_items || self.bytes > self.max_bytes) {
            let old = self.items.pop_front().expect("not empty");
            self.bytes -= old.pprof.len();
            self.dropped += 1;
            self.dropped_bytes += old.pprof.len() as u64;
            n += 1;
        }
        n
    }

    /// The oldest profile.
    pub fn front(&self) -> Option<&Arc<Item>> {
        self.items.front()
    }

    /// Removes `item` if it is still at the front (it may have been dropped meanwhile).
    pub fn remove_front(&mut self, item: &Arc<Item>) -> bool {
        if self.items.front().is_some_and(|f| Arc::ptr_eq(f, item)) {
            self.items.pop_front();
            self.bytes -= item.pprof.len();
            true
        } else {
            false
        }
    }

    /// Profiles held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Nothing held?
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes held (encoded pprof).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(seq: u64, len: usize) -> Arc<Item> {
        Arc::new(Item { pprof: vec![0; len], start_ns: 0, end_ns: 0, seq, meta: None })
    }

    #[test]
    fn drops_oldest() {
        let mut q = Queue::new(5, 1000);
        for i in 0..7 {
            q.push(item(i, 10));
        }
        assert_eq!((q.len(), q.dropped, q.front().unwrap().seq), (5, 2, 2));
        // Bytes bound: 3 x 400 > 1000.
        let mut q = Queue::new(5, 1000);
        for i in 0..3 {
            q.push(item(i, 400));
        }
        assert_eq!((q.len(), q.bytes(), q.dropped, q.front().unwrap().seq), (2, 800, 1, 1));
        let f = q.front().unwrap().clone();
        q.push(item(9, 400));
        assert!(!q.remove_front(&f), "dropped while in flight");
    }
}
