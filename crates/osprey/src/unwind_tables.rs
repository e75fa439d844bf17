//! The unwind tables of the loaded modules, kept current by the collector and
//! published to the sampling handler (`signal::STATE.modules`). Agent side:
//! compiling reads files, allocates and takes the loader's lock.
//!
//! - [`start`]: before sampling is enabled, so the first samples already walk
//!   with tables; a tracker parked by a previous stop is reused. Unless
//!   [`defer`] was called: then the collector compiles them once the
//!   process has lived that long, so a short-lived process (a shell's
//!   `sh -c`, a compiler driver) never pays for them; until then samples
//!   walk with frame pointers, vetted against the loaded code's ranges
//!   ([`refresh_code`]).
//! - [`refresh`]: each collector pass; one `dl_iterate_phdr` call when nothing
//!   was `dlopen`ed or `dlclose`d.
//! - [`park`]: at stop, keeps the tracker (and its compiled tables) for a
//!   restart.
//! - After `fork`, the child's collector starts a [`fresh`] tracker (the
//!   parent's may have been in use by a thread that does not exist there).
//!
//! A module whose tables cannot be built gets one line on stderr; its frames
//! end the walk as truncated.

use crate::signal::unwind::CodeRanges;
use crate::signal::STATE;
use osprey_unwind::compile::DEBUG_ROOT;
use osprey_unwind::scan::Tracker;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{AcqRel, Acquire, Release},
};
use std::sync::Arc;

/// The tracker a stop parked (a leaked `Box`, null: none). A pointer swapped
/// whole, not a lock: a lock the parent's collector held at a `fork` stays
/// held in the child, whose collector parks at its end.
static PARKED: AtomicPtr<Tracker> = AtomicPtr::new(core::ptr::null_mut());

/// Milliseconds a new agent waits before compiling tables (0: at start).
static DEFER_MS: AtomicU64 = AtomicU64::new(0);

/// Tables of agents started from now on are compiled by the collector once
/// the process has lived `after` (the preload library sets it for the
/// processes a profiled command starts, under `--children`).
pub fn defer(after: std::time::Duration) {
    DEFER_MS.store(after.as_millis() as u64, Release);
}

/// How long after start the collector compiles tables when [`start`]
/// returned none.
pub(crate) fn deferred() -> std::time::Duration {
    std::time::Duration::from_millis(DEFER_MS.load(Acquire))
}

/// The tracker for a new agent: the parked one, else a new one; refreshed and
/// published to the handler. `None` when deferred (see [`defer`]).
pub(crate) fn start() -> Option<Tracker> {
    if !osprey_unwind::loader_lock::usable() {
        return None;
    }
    let p = PARKED.swap(core::ptr::null_mut(), AcqRel);
    // SAFETY: a non-null `PARKED` is a `Box` leaked by `park`, taken once by the swap.
    let parked = (!p.is_null()).then(|| *unsafe { Box::from_raw(p) });
    if parked.is_none() && !deferred().is_zero() {
        refresh_code();
        return None;
    }
    let mut t = parked.unwrap_or_else(new_tracker);
    refresh(&mut t);
    publish(&t);
    Some(t)
}

/// A tracker compiling through the on-disk cache (see
/// `osprey_unwind::cache`), so that a process whose libraries another one
/// already compiled starts in a fraction of the time.
fn new_tracker() -> Tracker {
    Tracker::new(Some(DEBUG_ROOT.into())).with_cache(osprey_unwind::cache::Cache::open_default())
}

/// A new tracker (after fork), refreshed and published to the handler;
/// `None` where the loader cannot be asked (the tables published stay).
pub(crate) fn fresh() -> Option<Tracker> {
    if !osprey_unwind::loader_lock::usable() {
        return None;
    }
    let mut t = new_tracker();
    refresh(&mut t);
    publish(&t);
    Some(t)
}

/// Compiles tables for modules loaded since the last call and publishes the
/// new set; cheap when the loader's generation did not move.
pub(crate) fn refresh(t: &mut Tracker) {
    if !osprey_unwind::loader_lock::usable() {
        return;
    }
    for e in t.refresh().errors {
        crate::say!("osprey: no unwind tables for {e}; its frames end truncated");
    }
}

/// While tables are deferred: publishes the loaded code's ranges for the
/// frame-pointer walk (one `dl_iterate_phdr`, no file read), again whenever
/// the loader's generation moved. Each set is leaked (a handler may hold
/// it); a new one is made only after a `dlopen` or `dlclose`.
pub(crate) fn refresh_code() {
    use osprey_unwind::loaded::Generation;
    // The generation of the set published last (`u64::MAX`: none). Atomics,
    // not a lock: a lock the parent's collector held at a `fork` stays held
    // in the child, whose collector and exit would wait on it forever.
    static SEEN_ADDS: AtomicU64 = AtomicU64::new(u64::MAX);
    static SEEN_SUBS: AtomicU64 = AtomicU64::new(u64::MAX);
    // A forked child whose loader lock came held keeps what it inherited.
    if !osprey_unwind::loader_lock::usable() {
        return;
    }
    let adds = SEEN_ADDS.load(Acquire);
    let seen = (adds != u64::MAX).then(|| Generation { adds, subs: SEEN_SUBS.load(Acquire) });
    let now = osprey_unwind::loaded::generation();
    // Without the loader's counters (an old glibc) the first set stays.
    if !STATE.code.load(Acquire).is_null() && (now.is_none() || seen == now) {
        return;
    }
    let (generation, ranges) = osprey_unwind::loaded::code_ranges();
    STATE.code.store(Box::leak(Box::new(CodeRanges::new(ranges))), Release);
    let g = generation.map_or((u64::MAX, 0), |g| (g.adds, g.subs));
    SEEN_SUBS.store(g.1, Release);
    SEEN_ADDS.store(g.0, Release);
}

/// Keeps `t` for the next start in this process.
pub(crate) fn park(t: Tracker) {
    let old = PARKED.swap(Box::into_raw(Box::new(t)), AcqRel);
    if !old.is_null() {
        // SAFETY: as in `start`: a leaked `Box`, now ours alone.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// Points the handler at `t`'s shared set. The `Arc` is leaked: a handler may
/// hold the pointer at any time, so it is never freed.
fn publish(t: &Tracker) {
    let p = Arc::as_ptr(t.shared()) as *mut _;
    if STATE.modules.load(Acquire) != p {
        std::mem::forget(Arc::clone(t.shared()));
        STATE.modules.store(p, Release);
    }
}
