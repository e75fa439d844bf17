//! Call trace storage figures: put (known / new 32-frame stack), rotation
//! latency, throughput with 1 and 2 threads, bytes per stored trace.
//!
//! `cargo bench -p osprey --bench storage`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use osprey::internals::storage::{CallTraceStorage, Geometry, StorageConfig, ENTRY_BYTES};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const DEPTH: usize = 32;
const BUDGET: usize = 64 << 20;

fn stack(key: u64) -> [u64; DEPTH] {
    let mut f = [0u64; DEPTH];
    for (i, x) in f.iter_mut().enumerate() {
        *x = 0x5555_5555_0000 + key * 0x1000 + i as u64 * 0x37;
    }
    f
}

fn storage() -> CallTraceStorage {
    CallTraceStorage::new(StorageConfig { memory_budget: BUDGET, max_threads: 4 }).unwrap()
}

fn put(c: &mut Criterion) {
    let mut g = c.benchmark_group("put");
    let s = storage();
    let known = stack(1);
    s.put(0, &known, false, 1, 1, |_| {});
    g.bench_function("known_32_frames", |b| {
        b.iter(|| {
            s.put(0, black_box(&known), false, 1, 1000, |id| {
                black_box(id);
            })
        })
    });

    let s = storage();
    // Rotate (untimed) whenever the table is ~40% full so every put is a new entry.
    let fill = s.table_capacity() * 2 / 5;
    let mut key = 0u64;
    g.bench_function("new_32_frames", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                s.rotate();
                let n = (iters - done).min(fill as u64);
                let stacks: Vec<_> = (0..n)
                    .map(|_| {
                        key += 1;
                        stack(key)
                    })
                    .collect();
                let t = Instant::now();
                for f in &stacks {
                    black_box(s.put(0, f, false, 1, 1000, |_| {}));
                }
                total += t.elapsed();
                done += n;
            }
            total
        })
    });
    g.finish();
}

fn rotate(c: &mut Criterion) {
    let mut g = c.benchmark_group("rotate");
    g.sample_size(20);
    for traces in [1_000u64, 10_000] {
        let s = storage();
        let mut key = 0;
        g.bench_with_input(BenchmarkId::new("traces", traces), &traces, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for _ in 0..n {
                        key += 1;
                        s.put(0, &stack(key), false, 1, 1, |_| {});
                    }
                    let t = Instant::now();
                    black_box(s.rotate());
                    total += t.elapsed();
                }
                total
            })
        });
    }
    // An idle rotation (nothing put) measures the fixed cost of the protocol and table scans.
    let s = storage();
    g.bench_function("empty", |b| b.iter(|| black_box(s.rotate())));
    g.finish();
}

fn throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("throughput_known_stacks");
    let s = storage();
    let stacks: Vec<_> = (0..256).map(stack).collect();
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, &threads| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(threads + 1);
                std::thread::scope(|sc| {
                    for slot in 0..threads {
                        let (s, stacks, barrier) = (&s, &stacks, &barrier);
                        sc.spawn(move || {
                            barrier.wait();
                            for i in 0..iters as usize {
                                s.put(slot, &stacks[(i * 7 + slot) & 255], false, 1, 1, |_| {});
                            }
                            barrier.wait();
                        });
                    }
                    barrier.wait();
                    let t = Instant::now();
                    barrier.wait();
                    t.elapsed()
                })
            })
        });
    }
    g.finish();
}

fn bytes_per_trace() {
    let g = Geometry::for_budget(BUDGET);
    let arena = 8 * (1 + DEPTH);
    eprintln!(
        "storage: budget {BUDGET} B -> {} slots/table ({ENTRY_BYTES} B each), arena {} B/table; \
         a {DEPTH}-frame trace costs {} B of arena + {ENTRY_BYTES} B slot = {} B; \
         traces per table: {} (arena-bound) / {} (slot-bound, probe limit aside)",
        g.table_entries,
        g.arena_words * 8,
        arena,
        arena + ENTRY_BYTES,
        g.arena_words * 8 / arena,
        g.table_entries
    );
}

fn all(c: &mut Criterion) {
    bytes_per_trace();
    put(c);
    rotate(c);
    throughput(c);
}

/// `criterion_group!` defines an undocumented `pub fn`.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group! {
        name = benches;
        config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
        targets = all
    }
}
criterion_main!(group::benches);
