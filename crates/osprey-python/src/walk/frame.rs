//! What a thread's and a frame's fields say: which frame is innermost,
//! whether a frame runs, whether it can be a thread's outermost.

use std::io;

use crate::layout::{Layout, FRAME_OWNED_BY_CSTACK, FRAME_OWNED_BY_GENERATOR};
use crate::target::Target;

/// Pointer to the innermost frame of `tstate`.
pub(crate) fn top_frame(t: &Target, tstate: u64) -> io::Result<u64> {
    let l = &t.layout;
    let f = t.mem.u64(tstate + l.tstate_frame)?;
    match l.cframe_current_frame {
        Some(o) if f != 0 => t.mem.u64(f + o),
        Some(_) => Ok(0),
        None => Ok(f),
    }
}

/// Offset of a frame's "running" byte, and the values that mean running.
pub(crate) type LiveFlag = (usize, fn(u8) -> bool);

/// Where a 3.8–3.10 frame object says whether it is running
/// ([`Layout::frame_live`]), and which values mean it is (3.8/3.9
/// `f_executing` 1; 3.10 `f_state` EXECUTING or UNWINDING): a returned
/// frame keeps its other fields, so only this flag tells it apart.
pub(crate) fn live_flag(l: &Layout) -> Option<LiveFlag> {
    let is_live: fn(u8) -> bool = if l.minor == 10 { |b| b == 0 || b == 2 } else { |b| b == 1 };
    l.frame_live.map(|o| (o as usize, is_live))
}

/// Whether a frame with no caller, owned by `owner`, can be a thread's
/// outermost frame: from 3.12 only a frame of the C stack (an entry frame,
/// or 3.14's base frame) is; on 3.11, any frame but a generator's, whose
/// caller is cleared when it yields. (3.8-3.10: a yielded frame is not
/// running, which the walk already tells.)
pub(crate) fn can_be_outermost(l: &Layout, owner: Option<u8>) -> bool {
    match owner {
        None => true,
        Some(o) if l.minor >= 12 => o >= FRAME_OWNED_BY_CSTACK,
        Some(o) => o != FRAME_OWNED_BY_GENERATOR,
    }
}
