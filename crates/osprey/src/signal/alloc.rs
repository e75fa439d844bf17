//! Allocation sampling: the part of `malloc`/`free` (interposed by the
//! preload library, or wrapped by `osprey::alloc::Sampling`) that is osprey's.
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
//! panic, only a `const`-initialised thread-local without destructor (read
//! at its static-TLS offset from the thread pointer when the preloaded agent
//! says it may, see [`use_static_tls`]), `errno` saved and restored on the
//! sampled path. The fast path
//! ([`on_alloc`], [`on_free`]) is a load, a thread-local decrement and a
//! compare; everything else is in [`sample`], taken about once per `mean`
//! bytes. Its stack use, measured on the release build: 600 bytes for
//! [`sample`]'s frame (the walk inlined), 56 for the storage insert, and
//! libc's `pthread_sigmask`/`clock_gettime`: under 1 KiB. The frames go to
//! the thread's record buffer, not the stack.
//!
//! # Sharing with the CPU-sampling handler
//! A sampled allocation uses the thread's record frame buffer, storage slot
//! and ring, like that thread's sampling handler: the sampling signal is
//! blocked around the sampled path, and a sampled path that interrupted the
//! handler itself (malloc from the program's own signal handler) gives up.

use super::arch::current_regs;
use super::handler::{DepthGuard, InFlight};
use super::live::LIVE;
use super::state::{MAX_FRAMES, STATE};
use super::sys::{self, ErrnoGuard};
use super::{cfi, unwind};
use crate::record::{SampleKind, SampleRecord};
use crate::registry::Registry;
use core::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering::*};

/// Frames of osprey's own at the top of a sampled stack: [`sample`] and the
/// interposed function (or `GlobalAlloc` method) that called it.
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
    /// Samples lost: the thread has no registry record.
    pub lost_unregistered: AtomicU64,
    /// Samples lost: the thread was already inside osprey (re-entry through
    /// a signal handler, or an allocation made by osprey's own path).
    pub lost_reentered: AtomicU64,
}

/// The one allocation-sampling state of the process.
pub static ALLOC: AllocState = AllocState {
    armed: AtomicBool::new(false),
    mean: AtomicU64::new(DEFAULT_MEAN),
    sampled: AtomicU64::new(0),
    lost_unregistered: AtomicU64::new(0),
    lost_reentered: AtomicU64::new(0),
};

/// Per-thread countdown. `Cell`s of plain integers: `const`-initialised,
/// no destructor, so access never allocates, never registers anything and
/// never fails.
struct Countdown {
    /// Bytes left before the next sample; the allocation that takes it
    /// below zero is sampled.
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

/// Offset of this thread's [`COUNTDOWN`] from the thread pointer when every
/// thread has it at the same offset (0: unknown, use `thread_local!`'s
/// access, which in a shared library is a `__tls_get_addr` call).
static STATIC_TLS_OFFSET: AtomicIsize = AtomicIsize::new(0);

/// The thread pointer (`fs:0` holds its own address on x86-64 Linux).
#[inline(always)]
fn thread_pointer() -> isize {
    let tp: isize;
    // SAFETY: reads the TCB's self pointer, set up for every libc thread.
    unsafe { core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

fn offset_here() -> isize {
    COUNTDOWN.with(|c| c as *const Countdown as isize).wrapping_sub(thread_pointer())
}

/// Declares that the code holding the countdown was loaded with the program
/// (`LD_PRELOAD` or linked): its thread-locals are in static TLS, at one
/// offset from every thread's thread pointer, and the fast path reads them
/// there instead of calling `__tls_get_addr`. Never call it from a library
/// that may be `dlopen`ed.
pub fn use_static_tls() {
    STATIC_TLS_OFFSET.store(offset_here(), Relaxed);
}

/// Checks [`use_static_tls`]'s offset on a new thread (the interposed
/// `pthread_create` calls it); a mismatch turns the shortcut off for good.
pub fn check_static_tls() {
    let off = STATIC_TLS_OFFSET.load(Relaxed);
    if off != 0 && off != offset_here() {
        STATIC_TLS_OFFSET.store(0, Relaxed);
    }
}

/// Runs `f` on the calling thread's countdown.
#[inline(always)]
fn with_countdown<R>(f: impl FnOnce(&Countdown) -> R) -> R {
    let off = STATIC_TLS_OFFSET.load(Relaxed);
    if off != 0 {
        // SAFETY: the countdown of this thread lives at the thread pointer
        // plus `off` (static TLS, see `use_static_tls`); only this thread
        // touches it, through `Cell`s.
        f(unsafe { &*(thread_pointer().wrapping_add(off) as *const Countdown) })
    } else {
        COUNTDOWN.with(f)
    }
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

/// Whether allocations are being sampled (one relaxed load): callers may
/// skip [`on_alloc`] entirely, and tail-call the real allocator, when not.
#[inline(always)]
pub fn armed() -> bool {
    ALLOC.armed.load(Relaxed)
}

/// Fast path, after an allocation of `size` bytes returned `addr`: counts the
/// bytes down and samples when the countdown crosses zero. Must be inlined
/// into the interposed function: the stack is cut after it (`OWN_FRAMES`).
#[inline(always)]
pub fn on_alloc(addr: *mut u8, size: usize) {
    if !ALLOC.armed.load(Relaxed) || addr.is_null() {
        return;
    }
    let crossed = with_countdown(|c| {
        let left = c.left.get().wrapping_sub(size as i64);
        c.left.set(left);
        left < 0
    });
    if crossed {
        sample(addr as u64, size as u64);
    }
}

/// Fast path, before the real `free` of `addr`: forgets it if it was sampled.
#[inline(always)]
pub fn on_free(addr: *mut u8) {
    LIVE.remove(addr as u64);
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
    (-(u.ln()) * mean as f64).min(i64::MAX as f64 / 2.0) as i64
}

/// `(bytes, allocations)` a sampled allocation of `size` bytes stands for.
/// The allocation count `1/p` is rounded down or up at random by `u`
/// (uniform in `[0, 1)`), so that it stays unbiased for blocks near or above
/// the mean, where `1/p` is between 1 and 2.
#[inline]
pub fn weights(size: u64, mean: u64, u: f64) -> (u64, u64) {
    let p = -(-(size as f64) / mean.max(1) as f64).exp_m1(); // 1 - exp(-size/mean), exact for small ratios
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

/// Blocks the sampling signal until dropped.
struct SignalBlock(Option<libc::sigset_t>);

impl SignalBlock {
    fn new() -> Self {
        let sig = STATE.sample_signal.load(Relaxed);
        if sig <= 0 {
            return SignalBlock(None);
        }
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset/pthread_sigmask
        // are async-signal-safe and only touch the sets given.
        unsafe {
            let mut set: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
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

/// The sampled path: draws the next interval, then (unless this is the
/// thread's first crossing, which only seeds its countdown) records the
/// allocation `addr` of `size` bytes: its stack to storage, a sample record
/// to the thread's ring, its address to the live set.
#[inline(never)]
fn sample(addr: u64, size: u64) {
    // This function's own frame: the walk lists the interposed function
    // next, then the program's caller (see `OWN_FRAMES`).
    let regs = current_regs();
    let _errno = ErrnoGuard::save();
    let mean = ALLOC.mean.load(Relaxed).max(1);
    let entered = with_countdown(|c| {
        let first = c.rng.get() == 0;
        c.left.set(next_interval(c, mean));
        if first {
            return None;
        }
        if c.busy.replace(true) {
            ALLOC.lost_reentered.fetch_add(1, Relaxed);
            return None;
        }
        Some(weights(size, mean, uniform(c)))
    });
    if let Some((bytes, count)) = entered {
        record(regs, addr, bytes, count);
        with_countdown(|c| c.busy.set(false));
    }
}

#[inline(always)]
fn record(regs: unwind::Regs, addr: u64, bytes: u64, count: u64) {
    let Some(reg) = Registry::get() else { return };
    let _block = SignalBlock::new();
    let me = sys::gettid();
    let _depth = DepthGuard::enter(reg, me);
    let Some((slot, rec)) = reg.lookup(me) else {
        ALLOC.lost_unregistered.fetch_add(1, Relaxed);
        return;
    };
    if rec.in_handler.load(SeqCst) != 0 {
        // This thread's sampling handler was interrupted by a signal whose
        // handler allocates: the frame buffer and ring are in use.
        ALLOC.lost_reentered.fetch_add(1, Relaxed);
        return;
    }
    let Some(_in_flight) = InFlight::enter(rec) else { return };
    // SAFETY: published before `enabled`, never freed while the process lives.
    let Some(storage) = (unsafe { STATE.storage.load(Acquire).as_ref() }) else { return };
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
