//! The wall-time half of the sampling handler.
//!
//! The wall sampler never signals a thread for wall time: it adds the wall
//! time it found a thread running for to the thread's
//! `Record::wall_pending_ns`, and the thread's next CPU-clock sample
//! records that time with its own stack, as a second ring record of kind
//! `Wall` and state [`WALL_RUNNING`]. The CPU record is left as it was.
//!
//! Signal-safe: two atomics and a ring push.

use super::handler_state::STATE;
use crate::record::{Record, SampleKind, SampleRecord};
use crate::registry::Registry;
use std::sync::atomic::Ordering::Relaxed;

/// The `state` of a wall sample of a running thread (`wall::thread_state::RUNNING`
/// is defined as this value; this folder may not import the agent side).
pub const WALL_RUNNING: u16 = 1;

/// Pushes the thread's pending running wall time, if any, as a wall record
/// sharing `cpu`'s stack and context, on the ring of record `slot` (`rec`),
/// and marks it for draining. Time that finds the ring full stays pending
/// for the next sample.
#[inline(always)]
pub(super) fn record_pending(reg: &Registry, slot: usize, rec: &Record, cpu: &SampleRecord) {
    // Load first: most samples find nothing pending, and a swap would write.
    if rec.wall_pending_ns.load(Relaxed) == 0 {
        return;
    }
    let ns = rec.wall_pending_ns.swap(0, Relaxed);
    if ns == 0 {
        return;
    }
    let wall = SampleRecord { value: ns, kind: SampleKind::Wall as u16, state: WALL_RUNNING, ..*cpu };
    if rec.ring.push(&wall) {
        reg.mark_dirty(slot);
        STATE.wall_records.fetch_add(1, Relaxed);
    } else {
        rec.wall_pending_ns.fetch_add(ns, Relaxed);
    }
}
