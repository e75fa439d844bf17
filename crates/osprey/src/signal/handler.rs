//! The two signal handlers.
//!
//! - [`on_sample`], run by the **sampling** signal that a thread's CPU clock
//!   (`crate::cpu_clock`) delivers to that very thread: walks the stack (CFI
//!   tables, else frame pointers), reads
//!   the trace context, stores the stack and pushes a sample record.
//! - [`on_prime`], run by the **priming** signal that discovery sends to a
//!   thread nobody announced: claims a registry record for it.
//!
//! Both hold an [`ErrnoGuard`] and a [`DepthGuard`] for their whole body;
//! `on_sample` also holds an [`InFlight`] guard while it may touch storage.

use super::arch::{timer_overrun, Regs};
use super::handler_state::{MAX_FRAMES, STATE};
use super::sys::{self, ErrnoGuard};
use super::{cfi, wall};
use crate::record::{Origin, Record, SampleKind, SampleRecord};
use crate::registry::Registry;
use std::sync::atomic::{AtomicU32, Ordering::*};

/// Most pending sampling signals one handler folds into its sample.
const MAX_FOLDED: u32 = 64;

/// Sampling handler.
///
/// # Safety
/// Installed with `SA_SIGINFO`: `uc` is the interrupted context.
pub unsafe extern "C" fn on_sample(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    STATE.signals.fetch_add(1, Relaxed);
    let Some(reg) = Registry::get() else { return };
    let me = sys::gettid();
    let _depth = DepthGuard::enter(reg, me);
    let Some((slot, rec)) = reg.lookup(me) else {
        reg.dropped_unregistered.fetch_add(1, Relaxed);
        return;
    };
    let Some(_in_flight) = InFlight::enter(rec) else { return };
    // SAFETY: published before `enabled`, never freed while the process lives.
    let Some(storage) = (unsafe { STATE.storage.load(Acquire).as_ref() }) else { return };

    // SAFETY: `info` and `uc` are this SA_SIGINFO handler's arguments.
    let (regs, overrun) = unsafe { (Regs::from_ucontext(uc), timer_overrun(info)) };
    // SAFETY: only this thread touches its record's frame buffer, and the
    // sampling signal does not nest (it is blocked while its handler runs).
    let frames = unsafe { &mut *rec.frames.get() };
    let depth = STATE.max_depth.load(Relaxed).clamp(1, MAX_FRAMES);
    let hi = rec.stack_hi.load(Acquire) as u64;
    if hi == 0 {
        // Bounds unknown (found by discovery): leaf only; the collector
        // learns the stack mapping from this stack pointer.
        STATE.leaf_only.fetch_add(1, Relaxed);
        let _ = rec.primed_sp.compare_exchange(0, regs.sp as usize, Relaxed, Relaxed);
    }
    let lo = rec.stack_lo.load(Relaxed) as u64;
    let frames_out = frames.get_mut(..depth).unwrap_or(&mut []);
    let walk = cfi::walk_or_frame_pointers(regs, lo, hi, frames_out);
    if walk.truncated {
        STATE.truncated.fetch_add(1, Relaxed);
    }
    rec.last_depth.store(walk.len as u32, Relaxed);
    let ctx = rec.context.read().unwrap_or_default();
    // A timer signal that stands for several periods (expiries folded at the
    // tick) carries their count: the sample is weighted so CPU time is exact.
    // CPU the thread used while it had no working clock comes with it.
    // Signals that came during this walk are periods of this sample too.
    let folded = sys::take_pending(sig, MAX_FOLDED);
    if folded > 0 {
        STATE.folded.fetch_add(folded, Relaxed);
    }
    let owed = rec.owed_ns.swap(0, Relaxed);
    let periods = 1 + overrun as u64 + folded;
    let cpu_ns = STATE.period_ns.load(Relaxed).saturating_mul(periods).saturating_add(owed);
    rec.charged_ns.fetch_add(cpu_ns, Relaxed);
    STATE.charged_ns.fetch_add(cpu_ns, Relaxed);
    let tid = rec.tid.load(Relaxed);
    let stack = frames.get(..walk.len).unwrap_or(&[]);
    storage.put(slot, stack, walk.truncated, 1, cpu_ns, |trace_id| {
        let sample = SampleRecord {
            trace_id,
            timestamp_ns: sys::monotonic_ns(),
            span_id: ctx.span_id,
            local_root_span_id: ctx.local_root_span_id,
            w3c_trace_id: [(ctx.trace_id >> 64) as u64, ctx.trace_id as u64],
            value: cpu_ns,
            addr: 0,
            count: 1,
            tid,
            tags: ctx.tags,
            kind: SampleKind::Cpu as u16,
            state: 0,
        };
        reg.push_sample(slot, rec, &sample);
        wall::record_pending(reg, slot, rec, &sample);
    });
    rec.samples.fetch_add(1, Relaxed);
}

/// Priming handler: claims a record for the interrupted thread.
///
/// # Safety
/// Installed with `SA_SIGINFO`: `uc` is the interrupted context.
pub(crate) unsafe extern "C" fn on_prime(_sig: libc::c_int, _info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    STATE.primed.fetch_add(1, Relaxed);
    let Some(reg) = Registry::get() else { return };
    let me = sys::gettid();
    let _depth = DepthGuard::enter(reg, me);
    if let Some((_, rec)) = reg.claim(me, Origin::Discovery, sys::monotonic_ns()) {
        charge_from_now(rec);
        // SAFETY: `uc` is the ucontext of this SA_SIGINFO handler.
        let sp = unsafe { Regs::from_ucontext(uc) }.sp as usize;
        let _ = rec.primed_sp.compare_exchange(0, sp, Relaxed, Relaxed);
    }
}

/// A record just claimed by the calling thread: the CPU it used before
/// (e.g. in the program image it exec'd from, whose agent reported it) is
/// not its to charge. Signal-safe.
pub(crate) fn charge_from_now(rec: &Record) {
    let _ = rec.charged_ns.compare_exchange(0, sys::thread_cpu_ns(), Relaxed, Relaxed);
}

/// A sampling handler between "sampling is on" and its last storage access.
///
/// Dekker pair with the agent's stop: it stores `enabled = false` then waits
/// for `in_handler == 0` on every record (both SeqCst); the handler bumps
/// `in_handler` then loads `enabled` (both SeqCst). So a handler either sees
/// sampling off and touches nothing, or is waited for before the final flush.
pub(crate) struct InFlight<'a>(&'a Record);

impl<'a> InFlight<'a> {
    /// Enters, or `None` (and nothing held) when sampling is off.
    #[inline(always)]
    pub(crate) fn enter(rec: &'a Record) -> Option<Self> {
        rec.in_handler.fetch_add(1, SeqCst);
        let guard = InFlight(rec);
        STATE.enabled.load(SeqCst).then_some(guard)
    }
}

impl Drop for InFlight<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.in_handler.fetch_sub(1, SeqCst);
    }
}

/// Marks the calling thread as inside an osprey handler until dropped.
pub(super) struct DepthGuard(Option<&'static AtomicU32>);

impl DepthGuard {
    #[inline(always)]
    pub(super) fn enter(reg: &'static Registry, tid: i32) -> Self {
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

/// Whether the calling thread is inside an osprey signal handler (the
/// allocation-guard test aborts on any allocation while this holds).
pub fn in_handler() -> bool {
    Registry::get().and_then(|r| r.handler_depth(sys::gettid())).is_some_and(|d| d.load(Relaxed) > 0)
}
