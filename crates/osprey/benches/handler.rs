//! The sampling handler's cost and stack use with CFI unwinding, 32 frames
//! deep. `cargo bench -p osprey --bench handler`
//!
//! The profiler runs (tables published, this thread registered, storage and
//! ring live); `on_sample` is called directly with a `ucontext` captured 32
//! calls deep, so the figure is the handler's own work (walk, trace context,
//! storage, ring) without the kernel's signal delivery. Calls come in batches
//! with pauses so the collector drains the ring as in real sampling. Time per
//! call is wall time (`Instant`, vDSO) around each call; p50 and p99 of
//! 10,000 calls.
//!
//! Stack use: the stack below the call is painted first; after the calls, the
//! deepest byte changed gives the handler's stack use in this release build
//! (the sampling signal is blocked meanwhile, so no kernel signal frame lands
//! there; a real sample adds the kernel's frame, `ucontext` and FPU state).

use std::hint::black_box;
use std::time::{Duration, Instant};

const PAINT: usize = 16 * 1024;
const BATCH: usize = 200;
const BATCHES: usize = 50;

/// Paints `PAINT` bytes below the caller's frame with a pattern; returns the
/// top of the painted area (just below the caller's stack pointer).
#[inline(never)]
fn paint() -> usize {
    let mut a = [0u8; PAINT];
    for b in a.iter_mut() {
        // SAFETY: a volatile write to a local.
        unsafe { std::ptr::write_volatile(b, 0xa5) };
    }
    black_box(&a).as_ptr() as usize + PAINT
}

/// Deepest painted byte overwritten below `top` (an address in the caller's frame).
#[inline(never)]
fn used_below(top: usize) -> usize {
    let lo = top - PAINT;
    // Scan up from the bottom of the painted area for the first changed byte.
    for off in 0..PAINT {
        // SAFETY: within this thread's stack, below the live frames; painted above.
        let b = unsafe { std::ptr::read_volatile((lo + off) as *const u8) };
        if b != 0xa5 {
            return top - (lo + off);
        }
    }
    0
}

struct Out {
    times: Vec<u64>,
    stack: usize,
    depth: u32,
}

#[inline(never)]
fn recurse(n: u32, out: &mut Out) -> u64 {
    if n > 0 {
        return black_box(recurse(n - 1, out)) + 1;
    }
    // SAFETY: zeroed ucontext/siginfo are valid values to be filled.
    let mut uc: libc::ucontext_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: getcontext fills `uc` with this point's registers.
    unsafe { libc::getcontext(&mut uc) };
    let sig = osprey::internals::signal::STATE.sample_signal.load(std::sync::atomic::Ordering::Relaxed);
    // Real samples of this thread would push kernel signal frames into the
    // painted area: the signal is blocked while the handler is called directly.
    // SAFETY: plain signal-mask calls on valid sets.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    for _ in 0..BATCHES {
        let top = paint();
        for _ in 0..BATCH {
            let t = Instant::now();
            // SAFETY: the handler's contract: a siginfo and the ucontext of
            // this thread (captured above, its frames still live).
            unsafe { osprey::internals::signal::on_sample(sig, &mut info, &mut uc as *mut _ as *mut libc::c_void) };
            out.times.push(t.elapsed().as_nanos() as u64);
        }
        out.stack = out.stack.max(used_below(top));
        std::thread::sleep(Duration::from_millis(30));
    }
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    out.depth = osprey::internals::registry::Registry::get()
        .and_then(|r| r.lookup(osprey::internals::signal::sys::gettid()))
        .map_or(0, |(_, rec)| rec.last_depth.load(std::sync::atomic::Ordering::Relaxed));
    0
}

fn main() {
    let dir = std::env::temp_dir().join(format!("osprey-bench-handler-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(10_000).start().unwrap();
    let mut out = Out { times: Vec::new(), stack: 0, depth: 0 };
    // 21 calls + the bench's main and the runtime below it: a 32-frame walk.
    recurse(21, &mut out);
    let stats = osprey::internals::agent::stats();
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
    out.times.sort_unstable();
    let q = |f: f64| out.times[((out.times.len() - 1) as f64 * f) as usize];
    println!(
        "on_sample, CFI walk of {} frames: p50 {} ns, p90 {} ns, p99 {} ns ({} calls; {} of {} walks with CFI tables, {} complete)",
        out.depth,
        q(0.5),
        q(0.9),
        q(0.99),
        out.times.len(),
        stats.cfi_walks,
        stats.signals,
        stats.cfi_complete
    );
    println!("handler stack use: {} bytes below the interrupted frame (painted stack)", out.stack);
}
