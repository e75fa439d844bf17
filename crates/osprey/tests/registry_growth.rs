//! Growth under a burst: 200 threads register at the same instant into a
//! pool of 4 records per segment. Every thread gets a record of its own
//! (growth is serialised: two growers never map the same segment slot nor
//! put one record on the free list twice).

use osprey::internals::registry::Registry;
use osprey::internals::signal::sys;
use std::collections::HashSet;
use std::sync::{Arc, Barrier};

#[test]
fn a_burst_of_registrations_gets_distinct_records() {
    let dir = std::env::temp_dir().join(format!("osprey-growth-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).threads(4, true).start().unwrap();
    let barrier = Arc::new(Barrier::new(200));
    let hs: Vec<_> = (0..200)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let r = osprey::register_current_thread();
                let found = Registry::get().unwrap().lookup(sys::gettid());
                // Hold the record until every thread has one (and reach the
                // barrier even without one, so a failure fails, not hangs).
                barrier.wait();
                assert!(r.is_some(), "no record for a thread");
                let (idx, rec) = found.expect("registered");
                assert_eq!(rec.tid.load(std::sync::atomic::Ordering::Relaxed), sys::gettid());
                drop(r);
                idx
            })
        })
        .collect();
    let idx: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let distinct: HashSet<usize> = idx.iter().copied().collect();
    assert_eq!(distinct.len(), 200, "records shared between live threads");
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
