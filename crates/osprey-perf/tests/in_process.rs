//! The in-process use: a thread of our own that blocks every signal (as
//! liblzma's workers do) is sampled by an event, its signal mask untouched,
//! with either software clock.

mod common;
use common::Namer;

use osprey_perf::{Clock, Config, ThreadSampler, Unwinder};
use std::sync::mpsc;
use std::time::Duration;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Burns `ns` of this thread's CPU time.
#[inline(never)]
fn spin_in_rust(ns: u64) -> u64 {
    let start = thread_cpu_ns();
    let mut x = 1u64;
    while thread_cpu_ns() - start < ns {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// Blocks every signal, reports its tid, waits for the go, burns `ns`.
fn masked_thread(ns: u64, tid: mpsc::Sender<u32>, go: mpsc::Receiver<()>) -> u64 {
    // SAFETY: a full set, installed as this thread's mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    // SAFETY: gettid has no preconditions.
    tid.send(unsafe { libc::gettid() } as u32).unwrap();
    go.recv().unwrap();
    spin_in_rust(ns)
}

#[test]
fn a_thread_blocking_every_signal_is_sampled_with_either_clock() {
    let mut unwinder = Unwinder::new(std::process::id());
    let mut namer = Namer::default();
    for clock in [Clock::Task, Clock::Cpu] {
        let (tid_tx, tid_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        let h = std::thread::spawn(move || masked_thread(500_000_000, tid_tx, go_rx));
        let tid = tid_rx.recv().unwrap();
        let config = Config { clock, ring_pages: Some(256), ..Config::new(999, 16 << 10) };
        let mut sampler = ThreadSampler::open_with(tid, &config).expect("perf_event_open");
        go_tx.send(()).unwrap();
        let (mut stacks, mut scratch, mut d) = (Vec::new(), Vec::new(), osprey_perf::Drained::default());
        while !h.is_finished() {
            sampler.wait(Duration::from_millis(50)).unwrap();
            d += sampler.drain(&mut scratch, &mut |s| stacks.push(unwinder.unwind(s)));
        }
        h.join().unwrap();
        d += sampler.drain(&mut scratch, &mut |s| stacks.push(unwinder.unwind(s)));
        let counts = sampler.counts().unwrap();
        let named = stacks
            .iter()
            .filter(|s| {
                let names = namer.names(unwinder.modules(), &s.pcs);
                !s.truncated && names.iter().any(|n| n.contains("spin_in_rust"))
            })
            .count();
        let weighed: u64 = stacks.iter().map(|s| s.period).sum();
        eprintln!(
            "{clock:?}: {} samples ({} lost, {counts:?}), {named} complete through spin_in_rust, {weighed} ns",
            d.samples, d.lost
        );
        assert_eq!(counts.lost.unwrap_or(0) + d.lost, 0);
        assert!(stacks.iter().all(|s| s.tid == tid));
        // 0.5 s of CPU at 999 Hz: about 500 samples of 1 ms each.
        assert!((400_000_000..=600_000_000).contains(&weighed), "{clock:?}: {weighed} ns sampled");
        assert!(named * 100 >= stacks.len() * 95, "{clock:?}: {named}/{}", stacks.len());
    }
}
