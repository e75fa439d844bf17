//! Workloads with a known CPU split, shared by the demo binary, the tests and
//! the overhead benchmark.
//!
//! `split_work` spends CPU in `work_a`, `work_b` and `work_c` in the ratio
//! 50/30/20: the three run the same inner loop, for 5, 3 and 2 units.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Iterations of the inner loop in one unit of work.
pub const UNIT: u64 = 200_000;

#[inline(always)]
fn spin(iters: u64, seed: u64) -> u64 {
    let mut x = seed;
    for i in 0..iters {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(never)]
/// The function meant to take 50% of the CPU time.
pub fn work_a(seed: u64) -> u64 {
    spin(5 * UNIT, seed)
}

#[inline(never)]
/// The function meant to take 30% of the CPU time.
pub fn work_b(seed: u64) -> u64 {
    spin(3 * UNIT, seed)
}

#[inline(never)]
/// The function meant to take 20% of the CPU time.
pub fn work_c(seed: u64) -> u64 {
    spin(2 * UNIT, seed)
}

/// One round of the 50/30/20 split.
#[inline(never)]
pub fn round(seed: u64) -> u64 {
    work_c(work_b(work_a(seed)))
}

/// Runs rounds until `d` has passed; returns how many.
pub fn split_work_for(d: Duration) -> u64 {
    let end = Instant::now() + d;
    let (mut n, mut x) = (0, 1);
    while Instant::now() < end {
        x = round(x);
        n += 1;
    }
    black_box(x);
    n
}

/// Runs exactly `rounds` rounds.
pub fn split_work(rounds: u64) -> u64 {
    let mut x = 1;
    for _ in 0..rounds {
        x = round(x);
    }
    black_box(x)
}

/// Runs `f` on `threads` threads and waits for them.
pub fn on_threads(threads: usize, f: impl Fn() + Send + Sync + Copy + 'static) {
    let hs: Vec<_> = (0..threads)
        .map(|i| std::thread::Builder::new().name(format!("worker-{i}")).spawn(f).expect("spawn"))
        .collect();
    for h in hs {
        h.join().expect("worker");
    }
}
