//! Which process the running agent belongs to. A child made by a raw `clone`
//! (no fork hooks ran) inherits the agent but not its collector thread, its
//! clocks or its locks' owners: there the agent must do nothing.
//!
//! Invariant: the owner is set only while an agent is published (claimed
//! after publishing it, released before unpublishing it), so
//! [`owns_process`] implies an agent runs.

use crate::signal::sys;
use std::sync::atomic::{AtomicI32, Ordering::*};

/// The pid of the process the published agent belongs to; 0: none.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Whether an agent runs and belongs to the calling process (not to a
/// parent this process was cloned from without fork hooks).
pub fn owns_process() -> bool {
    let owner = OWNER.load(Acquire);
    owner != 0 && owner == sys::getpid()
}

/// The agent just published belongs to the calling process.
pub(crate) fn claim() {
    OWNER.store(sys::getpid(), Release);
}

/// The agent is about to be unpublished.
pub(crate) fn release() {
    OWNER.store(0, Release);
}
