//! The thread-start path: a thread registers itself (interposed
//! `pthread_create`, `register_current_thread`, or its first trace-context
//! write), learns its stack bounds and arms its CPU clock, all with signals
//! blocked; and the helpers about threads that discovery shares.

use crate::cpu_clock;
use crate::record::{Origin, Record};
use crate::registry::{Registry, RegistryConfig};
use crate::signal::sys;
use std::sync::atomic::Ordering::*;

/// Thread-start path: registers the calling thread, learns its stack and arms
/// its CPU clock, all with signals blocked. Idempotent.
pub fn register_current() -> Option<(usize, &'static Record)> {
    let reg = Registry::get()?;
    let _blocked = SignalBlock::all();
    // Outside any handler the pool may grow on the spot: a burst of new
    // threads can outrun the collector's recycling of exited ones.
    let (me, now) = (sys::gettid(), sys::monotonic_ns());
    let claim = || reg.claim(me, Origin::ThreadStart, now);
    let (idx, rec) = claim().or_else(|| if reg.grow_now() { claim() } else { None })?;
    if rec.stack_hi.load(Acquire) == 0 {
        if let Some((lo, hi)) = current_stack_bounds() {
            rec.stack_lo.store(lo, Relaxed);
            rec.stack_hi.store(hi, Release);
        }
    }
    let _ = cpu_clock::arm(rec);
    Some((idx, rec))
}

/// Thread-exit path: disarms and retires the calling thread's record.
pub fn unregister_current() {
    let Some(reg) = Registry::get() else { return };
    let _blocked = SignalBlock::all();
    if let Some((_, rec)) = reg.lookup(sys::gettid()) {
        cpu_clock::disarm(rec);
        reg.retire(rec.tid.load(Relaxed));
    }
}

/// The calling thread's record, after the full thread-start setup (record,
/// stack bounds, CPU clock; see [`register_current`], idempotent):
/// a record claimed by the priming handler gets its setup now rather than at
/// the next scan. Not signal-safe: for application-side writers (context
/// setters cache the result) and thread hooks.
pub fn current_or_register() -> Option<&'static Record> {
    Registry::get_or_init(RegistryConfig::default()).ok()?;
    register_current().map(|(_, r)| r)
}

/// Blocks every signal on the calling thread until dropped.
pub struct SignalBlock(libc::sigset_t);

impl SignalBlock {
    /// Blocks every signal; the old mask comes back on drop.
    pub fn all() -> Self {
        // SAFETY: plain sigset manipulation on stack values.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalBlock(old)
        }
    }
}

impl Drop for SignalBlock {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `all`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
}

/// Tids of the threads in this process, from `/proc/self/task`.
pub fn list_threads() -> std::io::Result<Vec<i32>> {
    let mut tids: Vec<i32> =
        std::fs::read_dir("/proc/self/task")?.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    Ok(tids)
}

/// Stack mapping `[lo, hi)` of the calling thread (pthread_getattr_np; the
/// main thread's lower bound comes from RLIMIT_STACK). Not signal-safe.
pub fn current_stack_bounds() -> Option<(usize, usize)> {
    // SAFETY: attr initialised by pthread_getattr_np and destroyed after use.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = core::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok.then(|| (addr as usize, addr as usize + size))
    }
}

/// The mapping of `/proc/self/maps` that contains `sp`. For the main
/// thread's growable `[stack]` the lower bound is extended to the stack rlimit.
pub fn stack_bounds_of(sp: usize, maps: &str) -> Option<(usize, usize)> {
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let range = parts.next()?;
        let (a, b) = range.split_once('-')?;
        let (lo, hi) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
        if (lo..hi).contains(&sp) {
            if line.ends_with("[stack]") {
                return Some((hi.saturating_sub(stack_rlimit()), hi));
            }
            return Some((lo, hi));
        }
    }
    None
}

fn stack_rlimit() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut r) };
    if r.rlim_cur == libc::RLIM_INFINITY || r.rlim_cur == 0 {
        1 << 30
    } else {
        r.rlim_cur as usize
    }
}

/// CPU time of thread `tid` in ns (first field of schedstat).
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}
