//! 3.11-3.12: the innermost frame from the thread's cframes.

use super::memory::CFRAMES;
use super::snapshot::Snapshot;
use crate::layout::{Layout, FRAME_OWNED_BY_CSTACK, FRAME_OWNED_BY_GENERATOR};
use crate::remote::process::{rd_u32, rd_u64};

/// What the cframes copied say.
pub(crate) enum Current {
    /// The cframe naming the innermost frame, and that frame.
    At(u64, u64),
    /// `cframe` was not asked for (first seen).
    Unknown,
    /// The pointer's cframe no longer names the frames of its call: read again.
    Torn,
}

/// The innermost frame of a thread whose cframe pointer (3.11-3.12) read
/// `cframe`, and the cframe naming it, as the cframes copied in the same
/// snapshot say at the instant of that copy: a call of the interpreter from
/// C may have begun or ended between the pointer and the copy. Moves up to
/// the cframe it was entered from while the current frame is its own
/// entry frame (its call returned), down to a known cframe entered from
/// it whose entry frame was entered from the current frame (a call began);
/// 3.11, which has no entry frames, only down, and a pointer's cframe whose
/// frames were replaced is [`Current::Torn`]. See docs/design/python-walk.md,
/// "Cframes".
pub(crate) fn current_frame(
    l: &Layout,
    snap: &Snapshot,
    known: &[u64],
    entry_offset: Option<i64>,
    cframe: u64,
    off: u64,
) -> Current {
    let size = l.frame_size_to_read;
    let cur = |c: u64| snap.u64(c + off);
    let previous = |c: u64| snap.frames.get(&(c + off)).filter(|b| b.len() >= 16).map(|b| rd_u64(b, 8));
    let mut c = cframe;
    let Some(mut top) = cur(c) else { return Current::Unknown };
    if let (Some(ie), Some(st)) = (l.frame_is_entry, l.frame_stacktop) {
        // 3.11 marks a call from C by its first frame (`is_entry`).
        // The first frame met from `f` that is a call's first (None: not
        // all copied, or no such frame), and the frame that call was
        // entered from.
        let entered = |mut f: u64| {
            for _ in 0..64 {
                let b = snap.frames.get(&f).filter(|b| b.len() >= size)?;
                let prev = rd_u64(b, l.frame_previous as usize);
                if b[ie as usize] != 0 {
                    let gen = l.frame_owner.is_some_and(|o| b[o as usize] == FRAME_OWNED_BY_GENERATOR);
                    return Some((f, prev, gen));
                }
                f = prev;
            }
            None
        };
        let first_frame = |f: u64, caller: u64| entered(f).filter(|e| e.1 == caller).map(|e| e.0);
        // The pointer's cframe, entered from a cframe copied with it: its
        // call's first frame was entered from that cframe's current frame,
        // which stays put while the call runs. A cframe whose call returned
        // still names that call's frames, until another call takes their
        // place on the frame stack (a call of the caller, not entered from
        // C): then its frames lead to a first frame entered from elsewhere,
        // and what the pointer named is gone. (A generator that yielded
        // has no caller: the walk goes on from the one it had.)
        if let Some(caller) = previous(c).filter(|&p| p != 0).and_then(cur) {
            if entered(top).is_some_and(|e| e.1 != caller && !(e.1 == 0 && e.2)) {
                return Current::Torn;
            }
        }
        // Down to a cframe entered from this one whose current frame runs:
        // a returned call's cframe and frames stay in memory until
        // overwritten, but a frame's `stacktop` is -1 only while it is its
        // evaluation loop's current frame, and set when it returns.
        let runs = |f: u64| {
            snap.frames
                .get(&f)
                .filter(|b| b.len() >= st as usize + 4)
                .is_some_and(|b| rd_u32(b, st as usize) == u32::MAX)
        };
        for _ in 0..CFRAMES {
            let inner = known.iter().find_map(|&k| {
                let f = cur(k).filter(|&f| f != 0 && k != c && previous(k) == Some(c) && runs(f))?;
                first_frame(f, top).map(|_| (k, f))
            });
            let Some((k, f)) = inner else { break };
            (c, top) = (k, f);
        }
        return Current::At(c, top);
    }
    let Some(d) = entry_offset else { return Current::At(c, top) };
    let entry = |c: u64| c.wrapping_add(d as u64);
    // The entry frame of cframe `k`'s call, if it is one (owned by the C
    // stack) and was entered from frame `caller`.
    let entered_from = |k: u64, caller: u64| {
        let b = snap.frames.get(&entry(k)).filter(|b| b.len() >= size)?;
        let owner = l.frame_owner.map(|o| b[o as usize])?;
        (owner == FRAME_OWNED_BY_CSTACK && rd_u64(b, l.frame_previous as usize) == caller).then_some(())
    };
    for _ in 0..CFRAMES {
        match previous(c).filter(|p| top == entry(c) && known.contains(p)) {
            Some(p) => match cur(p) {
                Some(f) => (c, top) = (p, f),
                None => return Current::Unknown,
            },
            None => break,
        }
    }
    for _ in 0..CFRAMES {
        let inner = known.iter().find_map(|&k| {
            let f = cur(k).filter(|&f| f != 0 && f != entry(k))?;
            (k != c && previous(k) == Some(c) && entered_from(k, top).is_some()).then_some((k, f))
        });
        match inner {
            Some(next) => (c, top) = next,
            None => break,
        }
    }
    Current::At(c, top)
}
