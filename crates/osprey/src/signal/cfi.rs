//! The CFI walk: unwinds through code with and without frame pointers using
//! the compact tables of `osprey_unwind`, which the collector compiles off the
//! signal path and publishes through [`STATE`]`.modules`.
//!
//! Runs inside the sampling handler: no allocation, no lock, no panic, no
//! libc. Reads are bounded to `[sp, stack_hi)` of the interrupted thread's
//! stack (mapped: `sp` is its stack pointer, `stack_hi` the top of the
//! mapping that holds it) and to the published tables, which stay alive while
//! read (`Shared::read`'s reader counters; the agent never frees a set a
//! handler may hold).
//!
//! `truncated` means the walk did not reach an outermost frame (`_start`,
//! `clone`'s child): the depth limit, a pc in no module (JIT, anonymous
//! code), a frame the CFI cannot follow (`__restore_rt`, hand-written
//! assembly), or garbage.

use super::handler_state::STATE;
use super::unwind::{self, Regs, Walk};
use osprey_unwind::{ModuleSet, Shared, StackReader};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// Walks with the published tables. `None` when there are none yet, when the
/// stack bounds are unknown or `sp` is outside them (alternate signal stack,
/// coroutine stack), or when publications raced the entry several times: the
/// caller then uses the frame-pointer walk.
#[inline]
pub fn walk(regs: Regs, stack_lo: u64, stack_hi: u64, frames: &mut [u64]) -> Option<Walk> {
    if stack_hi == 0 || regs.sp < stack_lo || regs.sp >= stack_hi || frames.is_empty() {
        return None;
    }
    // SAFETY: published (Release) by the agent before sampling is enabled and
    // never freed while the process lives (see `HandlerState::modules`).
    let shared: &Shared<ModuleSet> = unsafe { STATE.modules.load(Acquire).as_ref() }?;
    // SAFETY: `[sp, stack_hi)` is the live part of this thread's stack,
    // mapped while the handler runs (it runs on top of it).
    let stack = unsafe { StackReader::new(regs.sp, stack_hi) };
    let regs = osprey_unwind::Regs { pc: regs.pc, sp: regs.sp, fp: regs.fp };
    let w = shared.read(|set| osprey_unwind::unwind(set, regs, |a| stack.read(a), frames))?;
    STATE.cfi_walks.fetch_add(1, Relaxed);
    if !w.truncated {
        STATE.cfi_complete.fetch_add(1, Relaxed);
    }
    Some(Walk { len: w.len, truncated: w.truncated })
}

/// The CFI walk, else (no tables yet, or `sp` outside the known stack: an
/// alternate signal stack, a coroutine) the frame-pointer walk, marked
/// truncated when off the stack (leaf only there). Without tables, the
/// frame-pointer walk stops at a return address outside the loaded code
/// when its ranges are published.
#[inline]
pub fn walk_or_frame_pointers(regs: Regs, stack_lo: u64, stack_hi: u64, frames: &mut [u64]) -> Walk {
    if let Some(w) = walk(regs, stack_lo, stack_hi, frames) {
        return w;
    }
    // SAFETY: published (Release) before it is read and never freed (see `HandlerState::code`).
    let code = unsafe { STATE.code.load(Acquire).as_ref() };
    let w = unwind::walk(regs, stack_lo, stack_hi, frames, |ra| code.is_none_or(|c| c.contains(ra.wrapping_sub(1))));
    let off_stack = stack_hi == 0 || regs.sp < stack_lo || regs.sp >= stack_hi;
    Walk { len: w.len, truncated: w.truncated || off_stack }
}
