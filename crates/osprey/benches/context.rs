//! Context write (Rust API through the TLS record cache) and handler-side
//! read + validate. `cargo bench -p osprey --bench context`.
//!
//! Times are this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall
//! time, so a loaded machine (shared CI cores) does not bill other processes'
//! time to the operation; `baseline` is an empty iteration for reference.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use osprey::context::{self, ContextSnapshot};

struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer, clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, t0: u64) -> u64 {
        thread_cpu_ns() - t0
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Ns
    }
}

struct Ns;

impl ValueFormatter for Ns {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns (thread CPU)"
    }
    fn scale_throughputs(&self, _typical: f64, _t: &Throughput, values: &mut [f64]) -> &'static str {
        for v in values {
            *v = 1e9 / *v;
        }
        "elem/s"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn bench(c: &mut Criterion<ThreadCpu>) {
    context::set(1, 1); // registers this thread, fills the cache
    let mut g = c.benchmark_group("context");
    g.bench_function("baseline", |b| b.iter(|| black_box(black_box(1u64) + 1)));
    let mut i = 0u64;
    g.bench_function("set(span, root)", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            context::set(black_box(i), black_box(42));
        })
    });
    // What the loop around `set_trace` costs without the call: its counter
    // and its arguments through `black_box` (each a store and a load), to
    // subtract from the figures of the two `set`s.
    g.bench_function("arguments of set_trace, no call", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let trace = black_box(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736 ^ i as u128);
            black_box(trace as u64 ^ black_box(i) ^ black_box(42u64))
        })
    });
    g.bench_function("set_trace(trace, span, flags, root)", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            context::set_trace(
                black_box(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736 ^ i as u128),
                black_box(i),
                1,
                black_box(42),
            );
        })
    });
    let slot = context::tag_key("endpoint").unwrap();
    let id = context::intern_value("/checkout");
    let other = context::intern_value("/cart");
    g.bench_function("set_tag_id(slot, id), same value", |b| {
        b.iter(|| context::set_tag_id(black_box(slot), black_box(id)))
    });
    // A change re-encodes the OTEP attributes (the value's bytes).
    let mut flip = false;
    g.bench_function("set_tag_id(slot, id), new value", |b| {
        b.iter(|| {
            flip = !flip;
            context::set_tag_id(black_box(slot), black_box(if flip { id } else { other }))
        })
    });
    g.bench_function("scope(span, root) + drop", |b| b.iter(|| drop(context::scope(black_box(7), black_box(42)))));

    let (_, rec) =
        osprey::internals::registry::Registry::get().unwrap().lookup(osprey::internals::signal::sys::gettid()).unwrap();
    context::replace(Some(ContextSnapshot {
        trace_id: 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
        span_id: 9,
        local_root_span_id: 42,
        tags: [3; context::TAG_SLOTS],
        trace_flags: 1,
    }));
    g.bench_function("read (handler, valid)", |b| b.iter(|| black_box(black_box(&rec.context).read())));
    context::clear_all();
    g.bench_function("read (handler, empty)", |b| b.iter(|| black_box(black_box(&rec.context).read())));
    g.finish();
}

/// `criterion_group!` defines an undocumented `pub fn`.
#[allow(missing_docs)]
mod group {
    use super::*;
    criterion_group! {
        name = benches;
        config = Criterion::default().with_measurement(ThreadCpu);
        targets = bench
    }
}
criterion_main!(group::benches);
