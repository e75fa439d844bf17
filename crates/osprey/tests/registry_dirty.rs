//! The drain marks (`Registry::push_sample` / `for_each_dirty`): a consumer
//! that drains only marked records while producers push must lose nothing.
//! The race it guards against: a push landing between the consumer's
//! clearing of a mark and its read of the ring must leave the record marked
//! (so producers mark after pushing, and the consumer clears before reading).
//! Checked at 1000 quiet points: after every burst, one marked drain must
//! find every sample pushed so far.

use osprey::internals::record::{Origin, SampleRecord};
use osprey::internals::registry::{Registry, RegistryConfig};
use osprey::internals::signal::sys;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

const PRODUCERS: u64 = 3;
const ROUNDS: u64 = 1000;

#[test]
fn marked_drains_lose_no_sample() {
    let reg = Registry::get_or_init(RegistryConfig::default()).unwrap();
    let round = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let pushed = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (round, done, pushed) = (round.clone(), done.clone(), pushed.clone());
            std::thread::spawn(move || {
                let (idx, rec) = reg.claim(sys::gettid(), Origin::ThreadStart, sys::monotonic_ns()).unwrap();
                for r in 0..ROUNDS {
                    while round.load(Acquire) != r {
                        std::thread::yield_now();
                    }
                    for _ in 0..1 + (r + p) % 5 {
                        reg.push_sample(idx, rec, &SampleRecord { trace_id: 1, count: 1, ..Default::default() });
                        pushed.fetch_add(1, Relaxed);
                    }
                    done.fetch_add(1, Release);
                }
                rec.lost.records.load(Relaxed)
            })
        })
        .collect();
    let mut drained = 0u64;
    for r in 0..ROUNDS {
        // Drain while the burst is under way, then once when it is over.
        while done.load(Acquire) < (r + 1) * PRODUCERS {
            reg.for_each_dirty(|_, rec| rec.ring.drain(|s| drained += s.count as u64));
            std::thread::yield_now();
        }
        reg.for_each_dirty(|_, rec| rec.ring.drain(|s| drained += s.count as u64));
        let p = pushed.load(Relaxed);
        assert_eq!(drained, p, "round {r}: a marked drain found {drained} of {p} samples pushed");
        round.store(r + 1, Release);
    }
    let lost: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
    assert_eq!(lost, 0);
}
