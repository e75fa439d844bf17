//! Exhaustion: 500 live threads, a pool of 64, no growth — the
//! samples of threads without a record are counted as dropped; the process
//! is fine.

use osprey::internals::registry::{Registry, RegistryConfig};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[test]
fn five_hundred_threads_with_sixty_four_records() {
    let reg = Registry::get_or_init(RegistryConfig { capacity: 64, growable: false }).unwrap();
    let dir = std::env::temp_dir().join(format!("osprey-exh-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).threads(64, false).start().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(501));
    let hs: Vec<_> = (0..500)
        .map(|_| {
            let (stop, barrier) = (stop.clone(), barrier.clone());
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || {
                    barrier.wait();
                    // ~20 us of CPU every ~10 ms: 500 such threads want about one CPU;
                    // spinning ones would starve everything (the agent too) on 2 cores.
                    let mut x = 0u64;
                    while !stop.load(Relaxed) {
                        let t = std::time::Instant::now();
                        while t.elapsed() < Duration::from_micros(20) {
                            x = std::hint::black_box(x.wrapping_add(1));
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                })
                .unwrap()
        })
        .collect();
    barrier.wait();
    std::thread::sleep(Duration::from_secs(3));
    let stats = osprey::internals::agent::stats();
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    drop(p);
    eprintln!("{stats:?}");
    assert_eq!(reg.capacity(), 64);
    assert!(stats.registry_exhausted > 0, "no claim failed with 500 threads and 64 records");
    // Most of ~1 CPU-second per second went to threads without a record, at 1 kHz.
    assert!(stats.dropped_unregistered > 100, "lost samples not counted: {stats:?}");
    assert!(stats.signals > 0);
}
