//! The profiler's signal handlers and their installation.
//!
//! **Signal-safe module** (the two `extern "C"` handlers and what they call).
//! Rules: no allocation, no locks, no panics, no thread-locals, no
//! non-async-signal-safe libc; `errno` saved and restored.
//!
//! Two real-time signals are used, both chosen among `SIGRTMIN..=SIGRTMAX`
//! with no handler installed (or given by the user):
//! - the **sampling** signal, delivered to one thread by its perf_event CPU
//!   clock (see `sampler`); SIGPROF stays free for the program's own use;
//! - the **priming** signal, sent by discovery to a thread nobody announced;
//!   its handler only claims a registry record.

use crate::context::ContextSnapshot;
use crate::registry::{Path, Registry};
use crate::storage::{CallTraceStorage, SampleRecord};
use crate::sys::{self, ErrnoGuard};
use crate::unwind::{self, Regs};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

/// Upper bound of the configurable stack depth.
pub const MAX_FRAMES: usize = 256;

/// Handler-visible configuration and counters. Set before sampling starts.
pub struct HandlerState {
    /// Sampling on/off; the handler returns at once when off.
    pub enabled: AtomicBool,
    pub storage: AtomicPtr<CallTraceStorage>,
    pub max_depth: AtomicUsize,
    /// CPU nanoseconds one sample stands for.
    pub period_ns: AtomicU64,
    /// Sampling signals handled (any thread).
    pub signals: AtomicU64,
    /// Samples whose stack walk hit `max_depth`.
    pub truncated: AtomicU64,
    /// Samples taken before the thread's stack bounds were known (leaf only).
    pub leaf_only: AtomicU64,
    /// Priming signals handled.
    pub primed: AtomicU64,
    pub sample_signal: AtomicI32,
    pub prime_signal: AtomicI32,
}

pub static STATE: HandlerState = HandlerState {
    enabled: AtomicBool::new(false),
    storage: AtomicPtr::new(core::ptr::null_mut()),
    max_depth: AtomicUsize::new(128),
    period_ns: AtomicU64::new(10_000_000),
    signals: AtomicU64::new(0),
    truncated: AtomicU64::new(0),
    leaf_only: AtomicU64::new(0),
    primed: AtomicU64::new(0),
    sample_signal: AtomicI32::new(0),
    prime_signal: AtomicI32::new(0),
};

/// Sampling handler. Signal-safe.
pub extern "C" fn on_sample(_sig: libc::c_int, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    STATE.signals.fetch_add(1, Relaxed);
    let Some(reg) = Registry::get() else { return };
    let me = sys::gettid();
    let _depth = DepthGuard::enter(reg, me);
    let Some((slot, rec)) = reg.lookup(me) else {
        reg.dropped_unregistered.fetch_add(1, Relaxed);
        return;
    };
    // Dekker pair with `profiler::stop`: it stores `enabled = false` then waits
    // for `in_handler == 0` on every record (both SeqCst), so a handler either
    // sees sampling off or is waited for before the final flush.
    rec.in_handler.fetch_add(1, SeqCst);
    if !STATE.enabled.load(SeqCst) {
        rec.in_handler.fetch_sub(1, SeqCst);
        return;
    }
    // SAFETY: published before `enabled`, never freed while the process lives.
    let Some(storage) = (unsafe { STATE.storage.load(Acquire).as_ref() }) else {
        rec.in_handler.fetch_sub(1, SeqCst);
        return;
    };

    let mut frames = [0u64; MAX_FRAMES];
    let depth = STATE.max_depth.load(Relaxed).clamp(1, MAX_FRAMES);
    // SAFETY: `uc` is the ucontext of this SA_SIGINFO handler.
    let regs = unsafe { Regs::from_ucontext(uc) };
    let hi = rec.stack_hi.load(Acquire) as u64;
    if hi == 0 {
        STATE.leaf_only.fetch_add(1, Relaxed);
    }
    let lo = rec.stack_lo.load(Relaxed) as u64;
    let walk = unwind::walk(regs, lo, hi, frames.get_mut(..depth).unwrap_or(&mut []));
    if walk.truncated {
        STATE.truncated.fetch_add(1, Relaxed);
    }
    let ctx: ContextSnapshot = rec.context.read().unwrap_or_default();
    let period = STATE.period_ns.load(Relaxed);
    let tid = rec.tid.load(Relaxed);
    let stack = frames.get(..walk.len).unwrap_or(&[]);
    storage.put(slot, stack, walk.truncated, 1, period, |trace_id| {
        let sample = SampleRecord {
            trace_id,
            timestamp_ns: sys::monotonic_ns(),
            span_id: ctx.span_id,
            local_root_span_id: ctx.local_root_span_id,
            cpu_ns: period,
            count: 1,
            tid,
            tags: ctx.tags,
        };
        if !rec.ring.push(&sample) {
            rec.ring_overflow.fetch_add(1, Relaxed);
        }
    });
    rec.samples.fetch_add(1, Relaxed);
    rec.in_handler.fetch_sub(1, SeqCst);
}

/// Priming handler: claims a record for the interrupted thread. Signal-safe.
pub extern "C" fn on_prime(_sig: libc::c_int, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    STATE.primed.fetch_add(1, Relaxed);
    let Some(reg) = Registry::get() else { return };
    let _depth = DepthGuard::enter(reg, sys::gettid());
    if let Some((_, rec)) = reg.claim_current(Path::Discovery) {
        // SAFETY: `uc` is the ucontext of this SA_SIGINFO handler.
        let sp = unsafe { Regs::from_ucontext(uc) }.sp as usize;
        let _ = rec.primed_sp.compare_exchange(0, sp, Relaxed, Relaxed);
    }
}

/// Marks the calling thread as inside an osprey handler until dropped.
struct DepthGuard(Option<&'static std::sync::atomic::AtomicU32>);

impl DepthGuard {
    #[inline(always)]
    fn enter(reg: &'static Registry, tid: i32) -> Self {
        let d = reg.handler_depth(tid);
        if let Some(d) = d {
            d.fetch_add(1, Relaxed);
        }
        DepthGuard(d)
    }
}

impl Drop for DepthGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(d) = self.0 {
            d.fetch_sub(1, Relaxed);
        }
    }
}

/// Whether the calling thread is inside an osprey signal handler. Signal-safe;
/// used by the allocation-guard tests.
pub fn in_handler() -> bool {
    Registry::get()
        .and_then(|r| r.handler_depth(sys::gettid()))
        .is_some_and(|d| d.load(Relaxed) > 0)
}

/// A handler installed by osprey, with what it replaced.
pub struct Installed {
    pub signal: i32,
    previous: libc::sigaction,
}

/// Picks a real-time signal with no handler, starting the search at `SIGRTMIN + from`.
pub fn free_rt_signal(from: i32, skip: &[i32]) -> Option<i32> {
    let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    ((lo + from)..=hi).chain(lo..(lo + from).min(hi)).find(|&s| {
        if skip.contains(&s) {
            return false;
        }
        // SAFETY: querying a disposition with a null new action.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            libc::sigaction(s, core::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
        }
    })
}

/// Installs `handler` for `signal` (SA_SIGINFO | SA_RESTART; the signal is
/// blocked while its handler runs).
pub fn install(
    signal: i32,
    handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
) -> std::io::Result<Installed> {
    // SAFETY: plain sigaction with a valid handler.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut previous: libc::sigaction = core::mem::zeroed();
        if libc::sigaction(signal, &sa, &mut previous) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Installed { signal, previous })
    }
}

impl Installed {
    /// Restores the previous disposition unless the signal is still pending
    /// somewhere in the process (restoring SIG_DFL then would kill the
    /// process: the default action of a real-time signal is to terminate).
    /// Returns whether it restored; if not, osprey's handler stays installed
    /// and does nothing once sampling is off.
    pub fn restore(&self) -> bool {
        for _ in 0..100 {
            if !signal_pending_anywhere(self.signal) {
                // SAFETY: restoring the disposition saved at install time.
                unsafe { libc::sigaction(self.signal, &self.previous, core::ptr::null_mut()) };
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        false
    }
}

/// Whether `signal` is pending for the process or any of its threads.
pub fn signal_pending_anywhere(signal: i32) -> bool {
    let bit = 1u64 << (signal - 1);
    let pending = |path: &std::path::Path| -> bool {
        std::fs::read_to_string(path)
            .map(|s| {
                s.lines().any(|l| {
                    (l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
                        && u64::from_str_radix(l[7..].trim(), 16).is_ok_and(|m| m & bit != 0)
                })
            })
            .unwrap_or(false)
    };
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return false };
    dir.flatten().any(|e| pending(&e.path().join("status")))
}
