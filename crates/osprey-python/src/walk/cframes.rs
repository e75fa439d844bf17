//! 3.11-3.12: the innermost frame from the thread's cframes.

use super::memory::CFRAMES;
use super::snapshot::Snapshot;
use crate::layout::{Layout, FRAME_OWNED_BY_CSTACK};
use crate::remote::process::rd_u64;

/// The innermost frame of a thread whose cframe pointer (3.11-3.12) read
/// `cframe`, and the cframe naming it, as the cframes copied in the same
/// snapshot say at the instant of that copy: a call of the interpreter from
/// C may have begun or ended between the pointer and the copy. Moves up to
/// the cframe it was entered from while the current frame is its own
/// entry frame (its call returned), down to a known cframe entered from
/// it whose entry frame was entered from the current frame (a call began);
/// 3.11, which has no entry frames, only down. `None` if `cframe` was not
/// copied. See docs/design/python-walk.md, "Cframes".
pub(crate) fn current_frame(
    l: &Layout,
    snap: &Snapshot,
    known: &[u64],
    entry_offset: Option<i64>,
    cframe: u64,
    off: u64,
    datastack_now: &mut dyn FnMut() -> Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    let size = l.frame_size_to_read;
    let cur = |c: u64| snap.u64(c + off);
    let previous = |c: u64| snap.copy(c + off, 16).map(|b| rd_u64(b, 8));
    let mut c = cframe;
    let mut top = cur(c)?;
    if let Some(ie) = l.frame_is_entry {
        // 3.11 marks a call from C by its first frame (`is_entry`). Down
        // only, to a cframe whose frames are still on the frame stack (read
        // again now: a returned call's cframe and frames stay in memory).
        let first_frame = |mut f: u64, caller: u64| {
            for _ in 0..64 {
                let b = snap.copy(f, size)?;
                if b[ie as usize] != 0 {
                    return (rd_u64(b, l.frame_previous as usize) == caller).then_some(f);
                }
                f = rd_u64(b, l.frame_previous as usize);
            }
            None
        };
        let mut stack: Option<Option<(u64, u64)>> = None;
        for _ in 0..CFRAMES {
            let inner = known.iter().find_map(|&k| {
                let f = cur(k).filter(|&f| f != 0 && k != c && previous(k) == Some(c))?;
                Some((k, f, first_frame(f, top)?))
            });
            let Some((k, f, first)) = inner else { break };
            let Some((chunk, next)) = *stack.get_or_insert_with(&mut *datastack_now) else { break };
            if first < chunk || f >= next {
                break;
            }
            (c, top) = (k, f);
        }
        return Some((c, top));
    }
    let Some(d) = entry_offset else { return Some((c, top)) };
    let entry = |c: u64| c.wrapping_add(d as u64);
    // The entry frame of cframe `k`'s call, if it is one (owned by the C
    // stack) and was entered from frame `caller`.
    let entered_from = |k: u64, caller: u64| {
        let b = snap.copy(entry(k), size)?;
        let owner = l.frame_owner.map(|o| b[o as usize])?;
        (owner == FRAME_OWNED_BY_CSTACK && rd_u64(b, l.frame_previous as usize) == caller).then_some(())
    };
    for _ in 0..CFRAMES {
        match previous(c).filter(|p| top == entry(c) && known.contains(p)) {
            Some(p) => (c, top) = (p, cur(p)?),
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
    Some((c, top))
}
