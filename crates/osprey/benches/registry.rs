//! Registration figures: cost per thread on the thread-start path
//! (claim, stack bounds, CPU clock), how long a new thread runs unprimed on
//! the discovery path, and memory per record.
//!
//! `cargo bench -p osprey --bench registry`

use osprey::internals::record::{Origin, Record};
use osprey::internals::registry::Registry;
use osprey::internals::signal::sys;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p) as usize] as f64 / 1000.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("osprey-regbench-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(100).start().unwrap();
    let reg = Registry::get().unwrap();

    // Thread-start path: what the interposed pthread_create does before the
    // start routine; and, apart, its two parts: the registration proper
    // (signals blocked, claim, stack bounds) and arming the perf CPU clock.
    let (mut start_ns, mut claim_ns, mut clock_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..2000 {
        let h = std::thread::spawn(move || {
            let t0 = sys::monotonic_ns();
            let rec = {
                let _b = osprey::internals::threads::SignalBlock::all();
                let (_, rec) = reg.claim(sys::gettid(), Origin::ThreadStart, sys::monotonic_ns()).unwrap();
                let _ = osprey::internals::threads::current_stack_bounds();
                rec
            };
            let t1 = sys::monotonic_ns();
            osprey::internals::cpu_clock::arm(rec).unwrap();
            let t2 = sys::monotonic_ns();
            assert_ne!(rec.clock.load(Relaxed), 0);
            osprey::internals::cpu_clock::disarm(rec);
            osprey::internals::threads::unregister_current();
            let t3 = sys::monotonic_ns();
            let r = osprey::register_current_thread();
            let t4 = sys::monotonic_ns();
            assert!(r.is_some());
            (t4 - t3, t1 - t0, t2 - t1)
        });
        let (a, b, c) = h.join().unwrap();
        start_ns.push(a);
        claim_ns.push(b);
        clock_ns.push(c);
    }

    // Discovery path: threads nobody announces; time from their start to their record.
    let mut unprimed_ns = Vec::new();
    for _ in 0..100 {
        let started = Arc::new(AtomicU64::new(0));
        let tid = Arc::new(AtomicU64::new(0));
        let (s2, t2) = (started.clone(), tid.clone());
        let h = std::thread::spawn(move || {
            s2.store(sys::monotonic_ns(), SeqCst);
            t2.store(sys::gettid() as u64, SeqCst);
            let me = sys::gettid();
            while reg.lookup(me).is_none() {
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        while tid.load(SeqCst) == 0 {
            std::hint::spin_loop();
        }
        let t = tid.load(SeqCst) as i32;
        let rec = loop {
            if let Some((_, r)) = reg.lookup(t) {
                break r;
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        unprimed_ns.push(rec.registered_ns.load(Relaxed) - started.load(SeqCst));
        h.join().unwrap();
    }
    drop(p);
    let _ = std::fs::remove_dir_all(dir);

    println!("| figure | p50 | p99 / max |");
    println!("|---|---|---|");
    let (a, b) = (pct(&mut start_ns, 0.5), pct(&mut start_ns, 0.99));
    println!("| thread-start path, all of it | {a:.1} us | p99 {b:.1} us |");
    let (a, b) = (pct(&mut claim_ns, 0.5), pct(&mut claim_ns, 0.99));
    println!("| - registration: signals blocked, claim, stack bounds | {a:.1} us | p99 {b:.1} us |");
    let (a, b) = (pct(&mut clock_ns, 0.5), pct(&mut clock_ns, 0.99));
    println!("| - arming the CPU clock (perf_event_open + fcntl + enable) | {a:.1} us | p99 {b:.1} us |");
    let (c, d) = (pct(&mut unprimed_ns, 0.5), pct(&mut unprimed_ns, 1.0));
    println!("| discovery: new thread runs unprimed (10 ms scan) | {:.2} ms | max {:.2} ms |", c / 1000.0, d / 1000.0);
    println!(
        "| memory per record | {} bytes ({} of it the sample ring) | |",
        std::mem::size_of::<Record>(),
        std::mem::size_of::<osprey::internals::record::SampleRing>()
    );
}
