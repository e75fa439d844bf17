//! Allocation sampling: the part of `malloc`/`free` that is osprey's, for
//! the interposers of the allocation library (`osprey-alloc`, through
//! [`HOOKS`]) and for `osprey::alloc::Sampling` (through [`on_alloc`] and
//! [`on_free`]).
//!
//! Bytes allocated by a thread drive a Poisson process of mean
//! [`AllocState::mean`] bytes: each thread counts down an exponentially
//! distributed number of bytes, and the allocation that crosses zero is
//! sampled (then a new interval is drawn; the process is memoryless, so an
//! allocation of `size` bytes is sampled with probability
//! `1 - exp(-size/mean)` whatever came before). A sample of `size` bytes
//! stands for `size / (1 - exp(-size/mean))` bytes and `1 / (1 - exp(-size/mean))`
//! allocations, which makes both totals unbiased.
//!
//! # Rules (those of a signal handler)
//! Code here runs inside the program's `malloc`, possibly inside its signal
//! handlers, possibly re-entered by itself: no allocation, no lock, no
//! panic, only `const`-initialised thread-locals without destructor (the
//! agent library is loaded with the program, so they are in static TLS),
//! `errno` saved and restored on the sampled path. The fast path is a load,
//! a thread-local decrement and a compare, kept by the caller (the
//! interposer's own countdown, or [`on_alloc`]'s); everything else is in
//! [`sample`], taken about once per `mean` bytes. Its stack use, measured on
//! the release build: 600 bytes for [`sample`]'s frame (the walk inlined),
//! 56 for the storage insert, and libc's `pthread_sigmask`/`clock_gettime`:
//! under 1 KiB. The frames go to the thread's record buffer, not the stack.
//!
//! # Sharing with the CPU-sampling handler
//! A sampled allocation uses the thread's record frame buffer, storage slot
//! and ring, like that thread's sampling handler: the sampling signal is
//! blocked around the sampled path, and a sampled path that interrupted the
//! handler itself (malloc from the program's own signal handler) gives up.

use super::arch::current_regs;
use super::handler::{DepthGuard, InFlight};
use super::handler_state::{MAX_FRAMES, STATE};
use super::live::LIVE;
use super::sys::{self, ErrnoGuard};
use super::{cfi, unwind};
use crate::record::{SampleKind, SampleRecord};
use crate::registry::Registry;
use core::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// Frames of osprey's own at the top of a sampled stack: the function that
/// took the registers ([`crossed`] or [`sample_here`]) and the interposed
/// function (or `GlobalAlloc` method) that called it.
const OWN_FRAMES: usize = 2;

/// The default mean sampling interval in bytes.
pub const DEFAULT_MEAN: u64 = 512 * 1024;

/// Allocation-sampling switch, rate and counters.
pub struct AllocState {
    /// Sampling allocations on/off.
    pub armed: AtomicBool,
    /// Mean bytes between samples.
    pub mean: AtomicU64,
    /// Allocations sampled and recorded.
    pub sampled: AtomicU64,
    /// Samples lost: the thread has no registry record (or the agent's
    /// storage is not there).
    pub lost_unrecorded: AtomicU64,
    /// Samples lost: the thread was already inside osprey (re-entry through
    /// a signal handler, or an allocation made by osprey's own path).
    pub lost_reentered: AtomicU64,
    /// Weighted allocations of the samples lost (either way), until the
    /// collector takes them into the profile.
    pub lost_count: AtomicU64,
    /// Their weighted bytes.
    pub lost_bytes: AtomicU64,
}

/// The one allocation-sampling state of the process.
pub static ALLOC: AllocState = AllocState {
    armed: AtomicBool::new(false),
    mean: AtomicU64::new(DEFAULT_MEAN),
    sampled: AtomicU64::new(0),
    lost_unrecorded: AtomicU64::new(0),
    lost_reentered: AtomicU64::new(0),
    lost_count: AtomicU64::new(0),
    lost_bytes: AtomicU64::new(0),
};

/// What the allocation library's interposers call, handed to it by the
/// agent (`osprey_alloc_attach`). A C layout: the library is a separate
/// shared object built without this crate, and mirrors it; `size` is
/// checked by the library, which ignores a table of another size.
///
/// Invariant: everything it points to is `'static` and signal-safe.
#[repr(C)]
pub struct Hooks {
    /// `size_of::<Hooks>()`.
    pub size: usize,
    /// The number of live sampled blocks: `free` calls [`Hooks::forget`]
    /// only when it is not zero.
    pub live: &'static AtomicU64,
    /// The countdown of the calling thread crossed zero at the allocation
    /// `addr` of `size` bytes: samples it (see [`crossed`]) and returns the
    /// next countdown. While allocation sampling is off it only draws.
    pub crossed: unsafe extern "C" fn(addr: *mut u8, size: usize) -> i64,
    /// `addr` is about to be freed: forgets it if it was sampled.
    pub forget: unsafe extern "C" fn(addr: *mut u8),
}

/// The hooks of this process.
pub static HOOKS: Hooks = Hooks { size: core::mem::size_of::<Hooks>(), live: &LIVE.len, crossed, forget };

/// Per-thread sampling state. `Cell`s of plain integers: `const`-initialised,
/// no destructor, so access never allocates, never registers anything and
/// never fails.
struct Countdown {
    /// Bytes left before the next sample, for [`on_alloc`] (the allocation
    /// library keeps its own); the allocation that takes it below zero is
    /// sampled.
    left: Cell<i64>,
    /// xorshift64* state; 0 until the thread's first interval is drawn.
    rng: Cell<u64>,
    /// Inside [`sample`] (re-entry guard).
    busy: Cell<bool>,
}

thread_local! {
    static COUNTDOWN: Countdown = const {
        Countdown { left: Cell::new(0), rng: Cell::new(0), busy: Cell::new(false) }
    };
}

/// Starts sampling allocations with a mean interval of `mean` bytes.
pub fn arm(mean: u64) {
    ALLOC.mean.store(mean.max(1), Relaxed);
    ALLOC.armed.store(true, Release);
}

/// Stops sampling allocations (frees of sampled blocks are still tracked).
pub fn disarm() {
    ALLOC.armed.store(false, Release);
}

/// Whether allocations are being sampled (one relaxed load).
#[inline(always)]
pub fn armed() -> bool {
    ALLOC.armed.load(Relaxed)
}

/// Fast path of `osprey::alloc::Sampling`, after an allocation of `size`
/// bytes returned `addr`: counts the bytes down and samples when the
/// countdown crosses zero. Must be inlined into the `GlobalAlloc` method:
/// the stack is cut after it (`OWN_FRAMES`).
#[inline(always)]
pub fn on_alloc(addr: *mut u8, size: usize) {
    if !ALLOC.armed.load(Relaxed) || addr.is_null() {
        return;
    }
    let crossed = COUNTDOWN.with(|c| {
        let left = c.left.get().wrapping_sub(size as i64);
        c.left.set(left);
        left < 0
    });
    if crossed {
        sample_here(addr as u64, size as u64);
    }
}

/// Fast path, before the real `free` of `addr`: forgets it if it was sampled.
#[inline(always)]
pub fn on_free(addr: *mut u8) {
    LIVE.remove(addr as u64);
}

/// [`Hooks::crossed`]: the allocation library's countdown crossed zero.
/// Never inlined: its frame is the first of the walk (`OWN_FRAMES`).
#[inline(never)]
unsafe extern "C" fn crossed(addr: *mut u8, size: usize) -> i64 {
    let regs = current_regs();
    sample(regs, addr as u64, size as u64)
}

/// [`Hooks::forget`].
unsafe extern "C" fn forget(addr: *mut u8) {
    LIVE.remove(addr as u64);
}

/// [`on_alloc`]'s countdown crossed zero. Never inlined: its frame is the
/// first of the walk (`OWN_FRAMES`).
#[inline(never)]
fn sample_here(addr: u64, size: u64) {
    let regs = current_regs();
    let next = sample(regs, addr, size);
    COUNTDOWN.with(|c| c.left.set(next));
}

/// Draws the next exponential interval of mean `mean` from the thread's generator.
fn next_interval(c: &Countdown, mean: u64) -> i64 {
    let mut x = c.rng.get();
    if x == 0 {
        // Seeded from the thread id and the clock: distinct per thread and per run.
        x = ((sys::gettid() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ sys::monotonic_ns()) | 1;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c.rng.set(x);
    let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11; // 53 uniform bits
    let u = (r as f64 + 0.5) / (1u64 << 53) as f64; // in (0, 1)
    (-libm::log(u) * mean as f64).min(i64::MAX as f64 / 2.0) as i64
}

/// `(bytes, allocations)` a sampled allocation of `size` bytes stands for.
/// The allocation count `1/p` is rounded down or up at random by `u`
/// (uniform in `[0, 1)`), so that it stays unbiased for blocks near or above
/// the mean, where `1/p` is between 1 and 2.
#[inline]
pub fn weights(size: u64, mean: u64, u: f64) -> (u64, u64) {
    let p = -libm::expm1(-(size as f64) / mean.max(1) as f64); // 1 - exp(-size/mean), exact for small ratios
    if p <= 0.0 {
        return (size, 1);
    }
    ((size as f64 / p).round() as u64, (1.0 / p + u).floor() as u64)
}

/// A uniform draw in `[0, 1)` from the thread's generator.
fn uniform(c: &Countdown) -> f64 {
    let mut x = c.rng.get() | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c.rng.set(x);
    (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
}

/// Blocks the sampling signal and the termination signals whose handlers
/// wait for the collector ([`super::shutdown::HELD`]) until dropped.
struct SignalBlock(Option<libc::sigset_t>);

impl SignalBlock {
    fn new() -> Self {
        let sig = STATE.sample_signal.load(Relaxed);
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset/pthread_sigmask
        // are async-signal-safe and only touch the sets given.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut set);
            if sig > 0 {
                libc::sigaddset(&mut set, sig);
            }
            for s in super::shutdown::HELD {
                libc::sigaddset(&mut set, s);
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return SignalBlock(None);
            }
            SignalBlock(Some(old))
        }
    }
}

impl Drop for SignalBlock {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, core::ptr::null_mut()) };
        }
    }
}

/// The sampled path: draws the next interval (returned), then (unless this
/// is the thread's first crossing, which only seeds its countdown) records
/// the allocation `addr` of `size` bytes: its stack from `regs` to storage,
/// a sample record to the thread's ring, its address to the live set.
#[inline(always)]
fn sample(regs: unwind::Regs, addr: u64, size: u64) -> i64 {
    let _errno = ErrnoGuard::save();
    let mean = ALLOC.mean.load(Relaxed).max(1);
    let (next, entered) = COUNTDOWN.with(|c| {
        let first = c.rng.get() == 0;
        let next = next_interval(c, mean);
        if first || !ALLOC.armed.load(Relaxed) {
            return (next, None);
        }
        let w = weights(size, mean, uniform(c));
        if c.busy.replace(true) {
            lose(&ALLOC.lost_reentered, w);
            return (next, None);
        }
        (next, Some(w))
    });
    if let Some((bytes, count)) = entered {
        record(regs, addr, bytes, count);
        COUNTDOWN.with(|c| c.busy.set(false));
    }
    next
}

/// A sample that could not be recorded: counted in `why`, and its weights
/// kept for the profile.
fn lose(why: &AtomicU64, (bytes, count): (u64, u64)) {
    why.fetch_add(1, Relaxed);
    ALLOC.lost_count.fetch_add(count, Relaxed);
    ALLOC.lost_bytes.fetch_add(bytes, Relaxed);
}

#[inline(always)]
fn record(regs: unwind::Regs, addr: u64, bytes: u64, count: u64) {
    let lost = || lose(&ALLOC.lost_unrecorded, (bytes, count));
    let Some(reg) = Registry::get() else { return lost() };
    let _block = SignalBlock::new();
    let me = sys::gettid();
    let _depth = DepthGuard::enter(reg, me);
    let Some((slot, rec)) = reg.lookup(me) else { return lost() };
    if rec.in_handler.load(SeqCst) != 0 {
        // This thread's sampling handler was interrupted by a signal whose
        // handler allocates: the frame buffer and ring are in use.
        return lose(&ALLOC.lost_reentered, (bytes, count));
    }
    let Some(_in_flight) = InFlight::enter(rec) else { return lost() };
    // SAFETY: published before `enabled`, never freed while the process lives.
    let Some(storage) = (unsafe { STATE.storage.load(Acquire).as_ref() }) else { return lost() };
    let at_ns = sys::monotonic_ns();
    LIVE.insert(addr, at_ns);

    // SAFETY: only this thread touches its record's frame buffer, and its
    // sampling handler cannot run (signal blocked, none in flight: checked above).
    let frames = unsafe { &mut *rec.frames.get() };
    let depth = (STATE.max_depth.load(Relaxed) + OWN_FRAMES).clamp(1, MAX_FRAMES);
    let (lo, hi) = (rec.stack_lo.load(Relaxed) as u64, rec.stack_hi.load(Acquire) as u64);
    let frames_out = frames.get_mut(..depth).unwrap_or(&mut []);
    let walk = cfi::walk_or_frame_pointers(regs, lo, hi, frames_out);
    let stack = frames.get(OWN_FRAMES..walk.len).unwrap_or(&[]);
    let ctx = rec.context.read().unwrap_or_default();
    let tid = rec.tid.load(Relaxed);
    storage.put(slot, stack, walk.truncated, count, bytes, |trace_id| {
        let sample = SampleRecord {
            trace_id,
            timestamp_ns: at_ns,
            span_id: ctx.span_id,
            local_root_span_id: ctx.local_root_span_id,
            w3c_trace_id: [(ctx.trace_id >> 64) as u64, ctx.trace_id as u64],
            value: bytes,
            addr,
            kind: SampleKind::Alloc as u16,
            state: 0,
            count: count.min(u32::MAX as u64) as u32,
            tid,
            tags: ctx.tags,
        };
        reg.push_sample(slot, rec, &sample);
    });
    ALLOC.sampled.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_correct_for_the_sampling_probability() {
        let mean = 512 * 1024;
        // Small blocks: one sample stands for about mean bytes.
        let (b, n) = weights(64, mean, 0.0);
        assert!((b as f64 - mean as f64).abs() < 64.0, "{b}");
        assert_eq!(n, 8192, "1/p = 8192.5 rounded down at u = 0");
        assert_eq!(weights(64, mean, 0.6).1, 8193);
        // Huge blocks are always sampled: they stand for themselves.
        assert_eq!(weights(100 * mean, mean, 0.5), (100 * mean, 1));
        // Expected weighted bytes and counts per allocation: its size, and 1.
        for size in [1u64, 1000, mean, 3 * mean] {
            let p = 1.0 - (-(size as f64) / mean as f64).exp();
            let (b, _) = weights(size, mean, 0.0);
            assert!((p * b as f64 - size as f64).abs() <= 1.0, "{size}");
            let n: f64 = (0..1000).map(|i| weights(size, mean, i as f64 / 1000.0).1 as f64).sum::<f64>() / 1000.0;
            assert!((p * n - 1.0).abs() < 0.002, "{size}: mean count {n}, 1/p {}", 1.0 / p);
        }
    }

    #[test]
    fn intervals_are_exponential_with_the_mean() {
        let c = Countdown { left: Cell::new(0), rng: Cell::new(0), busy: Cell::new(false) };
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| next_interval(&c, 1000) as f64).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 1000.0).abs() < 15.0, "mean {mean}");
        // Exponential: standard deviation equals the mean.
        assert!((var.sqrt() - 1000.0).abs() < 30.0, "sd {}", var.sqrt());
    }
}
