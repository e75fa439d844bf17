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
    let free = reg.free_count();
    // Stopped while the threads live: the last clock check charges what they
    // used since the previous one (a starved collector may not have run one).
    let files = p.stop();
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    eprintln!("{stats:?}");
    assert_eq!(reg.capacity(), 64);
    assert_eq!(free, 0, "500 threads did not take all 64 records");
    assert!(stats.signals > 0);
    // Most of the CPU went to threads without a record: it is in the profile,
    // under one frame that says so, not silently lost.
    let (mut unregistered_ns, mut total_ns) = (0i64, 0i64);
    for f in &files {
        let prof = osprey_pprof::read_profile(f).unwrap();
        let unregistered_loc: Vec<u64> = prof
            .location
            .iter()
            .filter(|l| {
                l.line.iter().any(|ln| {
                    let func = &prof.function[ln.function_id as usize - 1];
                    prof.string(func.name) == osprey::internals::collector::FRAME_UNREGISTERED
                })
            })
            .map(|l| l.id)
            .collect();
        for s in &prof.sample {
            total_ns += s.value[1];
            if s.location_id.iter().any(|id| unregistered_loc.contains(id)) {
                unregistered_ns += s.value[1];
            }
        }
    }
    assert!(
        unregistered_ns > total_ns / 2,
        "CPU of threads without a record: {unregistered_ns} ns of {total_ns} ns in the profile"
    );
}
