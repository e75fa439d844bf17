//! The unwind tables of the loaded modules, kept current by the collector and
//! published to the sampling handler (`signal::STATE.modules`). Agent side:
//! compiling reads files, allocates and takes the loader's lock.
//!
//! - [`start`]: before sampling is enabled, so the first samples already walk
//!   with tables; a tracker parked by a previous stop is reused.
//! - [`refresh`]: each collector pass; one `dl_iterate_phdr` call when nothing
//!   was `dlopen`ed or `dlclose`d.
//! - [`park`]: at stop, keeps the tracker (and its compiled tables) for a
//!   restart.
//! - After `fork`, the child's collector starts a [`fresh`] tracker (the
//!   parent's may have been in use by a thread that does not exist there).
//!
//! A module whose tables cannot be built gets one line on stderr; its frames
//! end the walk as truncated.

use crate::signal::STATE;
use osprey_unwind::compile::DEBUG_ROOT;
use osprey_unwind::scan::Tracker;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, Mutex};

static PARKED: Mutex<Option<Tracker>> = Mutex::new(None);

/// The tracker for a new agent: the parked one, else a new one; refreshed and
/// published to the handler.
pub(crate) fn start() -> Tracker {
    let parked = PARKED.lock().unwrap_or_else(|e| e.into_inner()).take();
    let mut t = parked.unwrap_or_else(|| Tracker::new(Some(DEBUG_ROOT.into())));
    refresh(&mut t);
    publish(&t);
    t
}

/// A new tracker (after fork), refreshed and published to the handler.
pub(crate) fn fresh() -> Tracker {
    let mut t = Tracker::new(Some(DEBUG_ROOT.into()));
    refresh(&mut t);
    publish(&t);
    t
}

/// Compiles tables for modules loaded since the last call and publishes the
/// new set; cheap when the loader's generation did not move.
pub(crate) fn refresh(t: &mut Tracker) {
    for e in t.refresh().errors {
        eprintln!("osprey: no unwind tables for {e}; its frames end truncated");
    }
}

/// Keeps `t` for the next start in this process.
pub(crate) fn park(t: Tracker) {
    *PARKED.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
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
