//! Following a thread's frame chain from its innermost frame, each frame
//! checked as it is read.

use std::collections::HashSet;
use std::io;

use osprey_pprof::Frame;

use super::code::{CodeCache, FrameErr};
use super::frame::{can_be_outermost, live_flag};
use super::snapshot::Snapshot;
use crate::layout::{InstrKind, FRAME_OWNED_BY_CSTACK, FRAME_OWNED_BY_GENERATOR};
use crate::remote::process::{rd_u32, rd_u64};
use crate::target::Target;

/// Frames read per stack, at most (about 1 µs each); a deeper stack keeps
/// its innermost `MAX_DEPTH` frames and a `[truncated]` frame.
pub const MAX_DEPTH: usize = 2048;

/// The zombie frame slot of the code object of a frame copied in `b`
/// (3.8-3.10, [`crate::layout::Layout::code_zombieframe`]): the frame the interpreter
/// keeps for that code object's next call, or 0 while it is in use. Read
/// from the snapshot, where the slots of the codes of the thread's previous
/// walk are copied after its frames. A returned frame that is (or, its slot
/// taken, was) its code's zombie still says which call it ran: it keeps its
/// code and caller, and is reused only for a call of that code.
fn zombie_slot(t: &Target, snap: &Snapshot, b: &[u8]) -> Option<u64> {
    let off = t.layout.code_zombieframe?;
    let code = rd_u64(b, t.layout.frame_code as usize);
    (code != 0).then(|| snap.u64(code + off).map_or_else(|| t.mem.u64(code + off).ok(), Some))?
}

/// Where the bytecode a frame runs starts (3.11+): its code object's own
/// `co_code_adaptive`, or, for a frame of a free-threaded 3.14+ thread with
/// its own copy (`tlbc_index` not 0), entry `tlbc_index` of the code's
/// `co_tlbc` array. Two or three reads then: the array's size bounds the
/// index, so a torn index is not followed.
fn bytecode_of(t: &Target, code: u64, tlbc_index: u32) -> Result<u64, FrameErr> {
    let l = &t.layout;
    let own = code.wrapping_add(l.code_code_adaptive.unwrap_or(0));
    let Some(off) = l.code_tlbc.filter(|_| tlbc_index != 0) else { return Ok(own) };
    let array = t.mem.u64(code.wrapping_add(off))?;
    if array == 0 || array % 8 != 0 {
        return Err(FrameErr::Torn);
    }
    let size = t.mem.u64(array)?;
    if tlbc_index as u64 >= size.min(1 << 16) {
        return Err(FrameErr::Torn);
    }
    let copy = t.mem.u64(array.wrapping_add(8 + 8 * tlbc_index as u64))?;
    Ok(if copy == 0 { own } else { copy })
}

/// A generator frame met running: the caller that resumed it, and the
/// instruction pointer of the first Python frame from that caller on (past
/// 3.12+'s entry frames of a resume from C), which stays while the
/// generator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resumed {
    pub(crate) gen: u64,
    pub(crate) caller: u64,
    pub(crate) instr: Option<u64>,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// At the thread's outermost frame.
    Root,
    /// At a frame that was not a running frame when read (the stack moved
    /// under the reader, or the pointer was stale).
    Torn,
    /// Deeper than [`MAX_DEPTH`].
    Deep,
    /// A frame already seen: the chain loops.
    Cycle,
}

/// One walk of a frame chain.
pub(crate) struct Walk {
    pub(crate) frames: Vec<Frame>,
    /// The first entry frame met (3.12: a frame the C stack owns).
    pub(crate) entry: Option<u64>,
    /// The innermost frame read was shown: a Python function's, not a
    /// shim's nor a torn one.
    pub(crate) top_shown: bool,
    /// Addresses of the frames visited, innermost first.
    pub(crate) chain: Vec<u64>,
    /// The code object field of each frame read, innermost first.
    pub(crate) codes: Vec<u64>,
    /// Generator frames met running, and their callers.
    pub(crate) gens: Vec<Resumed>,
    /// A frame that was not running when copied was shown, the thread
    /// running (3.8-3.10).
    pub(crate) trusted: bool,
    /// The last frame read was running when copied.
    pub(crate) last_running: bool,
    pub(crate) end: End,
    pub(crate) evals: Evals,
}

/// Where each call of the interpreter's C evaluation function ends in a
/// walk's frames: a call runs one frame (3.8-3.10) or, from 3.11, the frames
/// pushed since it was entered (the outermost of them is marked: 3.11
/// `is_entry`, 3.12+ an entry frame owned by the C stack below it).
#[derive(Default)]
pub(crate) struct Evals {
    /// Per closed call, innermost first: one past its outermost shown frame.
    pub(crate) ends: Vec<usize>,
    /// Frames read (shown or not) since the last call closed.
    open: usize,
}

impl Evals {
    fn close(&mut self, shown: usize) {
        if self.open > 0 {
            self.ends.push(shown);
            self.open = 0;
        }
    }
}

/// Where a walk's top (innermost) frame comes from, and so how far it is trusted.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Top {
    /// The thread's frame pointer, the thread running: each frame must be
    /// running (or its code object's zombie frame, 3.8-3.10).
    Thread,
    /// The frame pointer of a stopped thread: its own, running or being
    /// entered or left.
    Stopped,
    /// A frame of the snapshot, walked within the snapshot alone.
    Snapshot,
}

/// Walks from frame `top`, using the snapshot's copies where it has them
/// (only them from [`Top::Snapshot`]). A generator's frame found suspended
/// (no caller: `yield` clears it) was running when the pointer to it was
/// read: the walk goes on from the caller it had when last seen running
/// (`gens`), not from a new read, which would charge its consumer. One
/// found done (at a return instruction) whose caller is no longer at the
/// instruction it resumed it from was named by a stale pointer: the walk
/// is torn.
pub(crate) fn walk_from(
    t: &Target,
    cache: &mut CodeCache,
    snap: &Snapshot,
    gens: &[Resumed],
    top: u64,
    size: usize,
    from: Top,
) -> io::Result<Walk> {
    let l = &t.layout;
    let live = live_flag(l);
    let mut w = Walk {
        frames: Vec::new(),
        entry: None,
        top_shown: false,
        end: End::Root,
        chain: Vec::new(),
        codes: Vec::new(),
        gens: Vec::new(),
        trusted: false,
        last_running: false,
        evals: Evals::default(),
    };
    let mut seen = HashSet::new();
    let mut f = top;
    let mut depth = 0;
    let torn = |e: io::Error| if e.raw_os_error() == Some(libc::ESRCH) { Err(e) } else { Ok(End::Torn) };
    // A frame's copy: the snapshot's, or read now (`None`: neither).
    let copy = |f: u64| -> io::Result<Option<Vec<u8>>> {
        match snap.copy(f, size) {
            Some(b) => Ok(Some(b.to_vec())),
            None if from == Top::Snapshot => Ok(None),
            None => t.mem.read_vec(f, size).map(Some),
        }
    };
    let running = |b: &[u8]| live.is_none_or(|(o, is_live)| is_live(b[o]));
    // The next frame's copy, when it was read to decide on this one.
    let mut ahead: Option<(u64, Vec<u8>)> = None;
    // Frames from the innermost on that had been popped when copied.
    let mut cleared = 0;
    // The owner of the last frame read (3.11+).
    let mut last_owner = None;
    // A generator met running whose caller's instruction is still to be
    // read (index in `w.gens`); the instruction the next Python frame must
    // be at, the walk having gone on from a generator found done.
    let mut pending: Option<usize> = None;
    let mut expect: Option<u64> = None;
    while f != 0 {
        depth += 1;
        if depth > MAX_DEPTH {
            w.end = End::Deep;
            break;
        }
        if !seen.insert(f) {
            w.end = End::Cycle;
            break;
        }
        w.chain.push(f);
        let b = match ahead.take().filter(|a| a.0 == f) {
            Some((_, b)) => b,
            None => match copy(f) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    w.end = End::Torn;
                    break;
                }
                Err(e) => {
                    w.end = torn(e)?;
                    break;
                }
            },
        };
        // The frame's fields this walk reads, from its one copy.
        let code_raw = rd_u64(&b, l.frame_code as usize);
        let instr_raw = rd_u64(&b, l.frame_instr as usize);
        let mut prev = rd_u64(&b, l.frame_previous as usize);
        let owner = l.frame_owner.map(|o| b[o as usize]);
        last_owner = owner;
        w.codes.push(code_raw);
        w.last_running = running(&b);
        if l.minor < 12 || owner.is_none_or(|o| o < FRAME_OWNED_BY_CSTACK) {
            if let Some(i) = pending.take() {
                w.gens[i].instr = Some(instr_raw);
            }
            if expect.take().is_some_and(|e| e != instr_raw) {
                w.end = End::Torn;
                break;
            }
        }
        // A generator's frame with no caller is suspended: the caller that
        // resumed it last, if known.
        let gen = owner == Some(FRAME_OWNED_BY_GENERATOR) || l.frame_gen.is_some_and(|o| rd_u64(&b, o as usize) != 0);
        let mut resumed_by = None;
        if gen && from == Top::Thread {
            match prev {
                0 => resumed_by = gens.iter().find(|g| g.gen == f),
                _ if w.last_running => {
                    pending = Some(w.gens.len());
                    w.gens.push(Resumed { gen: f, caller: prev, instr: None });
                }
                _ => {}
            }
        }
        if !w.last_running {
            // Not running when copied, but trusted: a stopped thread's own
            // innermost frame; or, the thread running, a frame that returned
            // (or was being entered) during the copy and is its code's zombie
            // ([`zombie_slot`]), or whose caller was running or its own
            // code's zombie, or whose code's zombie is in use again and whose
            // caller runs other code (see docs/design/python-walk.md,
            // "Frames that returned").
            let slot = zombie_slot(t, snap, &b);
            let mut caller_vouches = || {
                let c = copy(prev).ok().flatten().filter(|c| {
                    running(c)
                        || zombie_slot(t, snap, c) == Some(prev)
                        || slot == Some(0) && rd_u64(c, l.frame_code as usize) != code_raw
                })?;
                ahead = Some((prev, c));
                Some(())
            };
            let trusted = depth == 1 && from == Top::Stopped
                || from == Top::Thread
                    && (slot == Some(f) || resumed_by.is_some() || prev != 0 && caller_vouches().is_some());
            if !trusted {
                w.end = End::Torn;
                break;
            }
            w.trusted |= from == Top::Thread;
        }
        if let Some(g) = resumed_by {
            prev = g.caller;
        }
        // 3.14+: `f_executable` is a stack reference, its low bits a tag.
        let mut code = code_raw & !7;
        if code == 0 && cleared + 1 == depth && l.minor >= 14 && from != Top::Snapshot {
            // The innermost frame (or the caller of popped frames only)
            // returned after its pointer was read: 3.14+ clears its code
            // reference on pop, but its instruction pointer, into the code's
            // inline bytecode, still names a cached code object.
            cleared += 1;
            code = cache.code_at(instr_raw).unwrap_or(0);
        }
        f = prev;
        // Highest owner value a frame can have: 3.14 added one (the C
        // stack's frames are 4, the interpreter's base frame 3).
        let max_owner = if l.minor >= 14 { FRAME_OWNED_BY_CSTACK + 1 } else { FRAME_OWNED_BY_CSTACK };
        if l.minor >= 12 && owner.is_some_and(|o| (FRAME_OWNED_BY_CSTACK..=max_owner).contains(&o)) {
            w.entry = w.entry.or(w.chain.last().copied());
            w.evals.close(w.frames.len());
            continue;
        }
        if owner.is_some_and(|o| o > max_owner) || code == 0 {
            w.end = End::Torn;
            break;
        }
        // This frame belongs to the open call, shown or not; a call that
        // runs one frame, or whose entry this frame is, closes after it.
        w.evals.open += 1;
        let closes = l.minor <= 10 || l.frame_is_entry.is_some_and(|o| b.get(o as usize).is_some_and(|&e| e != 0));
        let e = match cache.entry(t, code) {
            Ok(Some(e)) => Some(e),
            Ok(None) if l.minor >= 13 => None,
            Ok(None) | Err(FrameErr::Torn) => {
                w.end = End::Torn;
                break;
            }
            Err(FrameErr::Io(e)) => return Err(e),
        };
        let tlbc_index = l.frame_tlbc_index.map_or(0, |o| rd_u32(&b, o as usize));
        let bytecode = match bytecode_of(t, code, tlbc_index) {
            Ok(a) => a,
            Err(FrameErr::Torn) => {
                w.end = End::Torn;
                break;
            }
            Err(FrameErr::Io(e)) => return Err(e),
        };
        // Garbage in a torn frame must not overflow: wrapping, then clamped below.
        let unit = (instr_raw as i64).wrapping_sub(bytecode as i64) / 2;
        let found = e.is_some();
        if let Some(e) = e.filter(|e| !t.is_shim_code(code, &e.name, &e.file)) {
            let addr: i64 = match l.instr_kind {
                InstrKind::LastiBytes => (instr_raw as u32 as i32) as i64,
                InstrKind::LastiUnits => (instr_raw as u32 as i32) as i64 * 2,
                InstrKind::Pointer => unit,
            };
            let line = e.lines.line(addr.clamp(0, u32::MAX as i64) as u32);
            w.top_shown |= depth == 1;
            w.frames.push(Frame::Function { name: e.name.clone(), file: e.file.clone(), line: line as i64 });
        }
        if closes {
            w.evals.close(w.frames.len());
        }
        if let Some(want) = resumed_by.and_then(|g| g.instr).filter(|_| found) {
            match cache.returns_at(t, code, unit) {
                Ok(true) => expect = Some(want),
                Ok(false) => {}
                Err(FrameErr::Torn) => {
                    w.end = End::Torn;
                    break;
                }
                Err(FrameErr::Io(e)) => return Err(e),
            }
        }
    }
    if w.end == End::Root && !can_be_outermost(l, last_owner) {
        w.end = End::Torn;
    }
    if w.end == End::Root {
        w.evals.close(w.frames.len());
    }
    Ok(w)
}
