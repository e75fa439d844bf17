//! Stopping leaves no pending signal that could kill the process: start and
//! stop 30 times at 5 kHz over busy threads, then keep running. (A profiler
//! that restores SIG_DFL while its signal is still pending dies here.)

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn thirty_restarts_under_load() {
    let dir = std::env::temp_dir().join(format!("osprey-restart-{}", std::process::id()));
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
        })
        .collect();
    let mut signals = 0;
    for _ in 0..30 {
        let p = osprey::Profiler::builder().out_dir(&dir).hz(5000).start().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        p.stop();
        signals = osprey::internals::agent::stats().signals;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    assert!(signals > 100, "profiler barely ran: {signals} signals");
    let _ = std::fs::remove_dir_all(dir);
}
