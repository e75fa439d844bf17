// A Rust release program for `osprey attach`: CPU split 70/30 between
// `seventy` and `thirty`, called in turns from `main` for ARG1 seconds;
// prints a checksum and exits 0, the same with or without a profiler.
use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn seventy(mut x: u64) -> u64 {
    for i in 0..7_000_000u64 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(never)]
fn thirty(mut x: u64) -> u64 {
    for i in 0..3_000_000u64 {
        x = black_box(x.wrapping_mul(2862933555777941757).wrapping_add(i));
    }
    x
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let (mut x, mut rounds) = (1u64, 0u64);
    while Instant::now() < end {
        x = thirty(seventy(x));
        rounds += 1;
    }
    println!("ok {}", (x ^ rounds) & 1 | 1);
}
