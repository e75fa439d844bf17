//! Reading a thread's stack: walks retried until one reaches the
//! outermost frame.

use std::io;

use osprey_pprof::Frame;

use super::cframes::current_frame;
use super::chain::{walk_from, End, Top, Walk, MAX_DEPTH};
use super::code::CodeCache;
use super::frame::{live_flag, top_frame};
use super::memory::{latest_first, Memory, CFRAMES, GENS, HINT_FRAMES};
use super::snapshot::Snapshot;
use crate::remote::process::{rd_u32, rd_u64};
use crate::target::Target;

/// What the walks of one target keep between samples.
#[derive(Default)]
pub struct Walks {
    /// The code objects met.
    pub codes: CodeCache,
    memory: Memory,
}

/// Walks the stack of `tstate` once, leaf first, as far as it is valid.
/// With `last_resort`, a walk torn by the stack moving is replaced by one
/// found within the snapshot alone (see below).
fn walk_once(t: &Target, walks: &mut Walks, tstate: u64, last_resort: bool, still: bool) -> Result<Walk, io::Error> {
    let l = &t.layout;
    let live = live_flag(l);
    let size = l.frame_size_to_read;
    let mut hints = walks.memory.take(tstate);
    let at = tstate + l.tstate_frame;
    let mut asks: Vec<(u64, usize)> = vec![(at, 8)];
    // Copied with the pointer, in the same range.
    let depth_at = l.tstate_recursion_depth.map(|o| tstate + o);
    asks.extend(depth_at.map(|a| (a, 4)));
    let entry_offset = walks.memory.entry_offset().filter(|_| l.minor == 12);
    if let Some(off) = l.cframe_current_frame {
        // Each cframe's current frame and the cframe it was entered from,
        // and its call's entry frame.
        asks.extend(hints.cframes.iter().map(|c| (c + off, 16)));
        if let Some(d) = entry_offset {
            asks.extend(hints.cframes.iter().map(|&c| (c.wrapping_add(d as u64), size)));
        }
    }
    // The pointers first: a frame copied after them is the one they name,
    // or, if it returned meanwhile, still its content (or, 3.8-3.10 and
    // 3.14+, enough of it to tell).
    asks.extend(hints.chain.iter().take(MAX_DEPTH).map(|&a| (a, size)));
    // Last, whether a frame that returned is its code's zombie frame
    // ([`zombie_slot`]): a frame copied after it returned is then one.
    if let Some(off) = l.code_zombieframe.filter(|_| !still) {
        asks.extend(hints.codes.iter().map(|&c| (c + off, 8)));
    }
    let snap = Snapshot::read(t, &asks);
    // The cframe whose current frame the walk begins at, if known.
    let mut named = None;
    let top = match (snap.u64(at), l.cframe_current_frame) {
        (Some(top), None) => top,
        (Some(0), Some(_)) => 0,
        (Some(cframe), Some(off)) => {
            let found = current_frame(l, &snap, &hints.cframes, entry_offset, cframe, off, &mut || {
                let b = t.mem.read_vec(tstate + l.tstate_datastack?, 16).ok()?;
                Some((rd_u64(&b, 0), rd_u64(&b, 8)))
            });
            // A cframe first seen (it may still lie in a range copied for
            // others) or not copied is asked for first from now on.
            if found.is_none() || !hints.cframes.contains(&cframe) {
                hints.cframes.retain(|&c| c != cframe);
                hints.cframes.insert(0, cframe);
                hints.cframes.truncate(CFRAMES);
            }
            match found {
                Some((c, top)) => {
                    named = Some(c);
                    top
                }
                None => {
                    named = Some(cframe);
                    t.mem.u64(cframe + off)?
                }
            }
        }
        (None, _) => top_frame(t, tstate)?,
    };
    let from = if still { Top::Stopped } else { Top::Thread };
    let mut w = walk_from(t, &mut walks.codes, &snap, &hints.gens, top, size, from)?;
    let recursion_depth = depth_at.and_then(|a| snap.copy(a, 4)).map(|b| rd_u32(b, 0) as usize);
    let deep_enough = recursion_depth.is_some_and(|d| (w.chain.len()..=w.chain.len() + 1).contains(&d));
    if w.trusted && w.end == End::Root && !(deep_enough && w.last_running) {
        // A returned frame was shown, and the walk is not as deep as the
        // stack was (the depth counts a call of a C type too: one more) or
        // does not end at a running frame: a free frame handed to another
        // depth took part in it (docs/design/python-walk.md).
        w.end = End::Torn;
    }
    if !still && !w.top_shown && !w.frames.is_empty() && w.end == End::Root {
        // The innermost frame, copied after the pointer, was not the one
        // it named (another call's frame, or its locals, had taken its
        // place: shown, its caller would be) or was a shim (the caller of
        // a short call that began meanwhile, 3.13+): read again.
        w.end = End::Torn;
    }
    // 3.8-3.10 frames are heap objects that every thread's calls take from
    // the same free lists: a frame freed and taken by another thread while
    // the reader was preempted leads the walk into that thread's chain,
    // which is running at every frame and as deep, but ends at that
    // thread's outermost frame. A thread's outermost frame stays while it
    // lives: a walk ending at another one than the last walk's is read
    // again, and kept if the next walk ends there too (a new thread on a
    // reused state, a callback from C).
    let heap_frames_running = live.is_some() && !still;
    let cross = |w: &Walk, root: Option<u64>| {
        heap_frames_running && w.end == End::Root && root.zip(w.chain.last()).is_some_and(|(r, &l)| r != l)
    };
    let last_root = hints.root;
    if w.end == End::Root && heap_frames_running {
        hints.root = w.chain.last().copied();
    }
    if cross(&w, last_root) {
        w.end = End::Torn;
    }
    if w.end == End::Torn && last_resort {
        // The snapshot alone may still hold one whole stack: of the walks
        // from its own running frames that reach the outermost, the deepest
        // is kept. Only as a last resort: taken at every tear, it would
        // favour callers over their short callees.
        let tops = live.map(|lv| snap.own_tops(l, lv)).unwrap_or_default();
        for own in tops {
            let again = walk_from(t, &mut walks.codes, &snap, &[], own, size, Top::Snapshot)?;
            if again.end == End::Root
                && !cross(&again, last_root)
                && (w.end != End::Root || again.frames.len() > w.frames.len())
            {
                w = again;
            }
        }
    }
    // Addresses of this walk first, then those of earlier walks (the
    // deeper frames of a stack that was shallower just now).
    let bound = HINT_FRAMES.max(w.chain.len()).min(MAX_DEPTH);
    hints.chain = latest_first(w.chain.iter().copied(), &hints.chain, |&a| a, bound);
    hints.gens = latest_first(w.gens.iter().copied(), &hints.gens, |g| g.gen, GENS);
    if l.code_zombieframe.is_some() {
        let codes = w.codes.iter().copied().filter(|&c| c != 0);
        hints.codes = latest_first(codes, &hints.codes, |&c| c, HINT_FRAMES);
    }
    if let (Some(c), Some(e), true) = (named, w.entry, l.minor == 12) {
        // The walk began at the current frame of cframe `c`: the first
        // entry frame it met is that call's own.
        walks.memory.found_entry_offset(e.wrapping_sub(c) as i64);
    }
    walks.memory.keep(tstate, hints);
    Ok(w)
}

/// The frame that stands, at the root end of a kept sample, for the part
/// of the stack that could not be read.
pub const TRUNCATED: &str = "[truncated]";

/// One stack read.
#[derive(Debug)]
pub struct Stack {
    /// Innermost first; ending (root side) in a `[truncated]` frame when
    /// `truncated` is set.
    pub frames: Vec<Frame>,
    /// Why the stack could not be read to its outermost frame: it kept
    /// changing under the reader on every attempt, looped, or was deeper
    /// than [`MAX_DEPTH`].
    pub truncated: Option<End>,
    /// Per call of the interpreter's C evaluation function, innermost
    /// first: the index in `frames` one past the outermost frame it runs
    /// (how Python frames sit among native ones; complete only when the
    /// stack is not truncated).
    pub evals: Vec<usize>,
}

impl Stack {
    /// Whether `other`, read later, shows the same calls: every frame the
    /// same function at the same line, but the innermost, whose line moves
    /// as it runs, and the same frames per call of the evaluation function.
    /// A torn read matches nothing.
    pub fn same_calls(&self, other: &Stack) -> bool {
        let same_function = |a: &Frame, b: &Frame| match (a, b) {
            (Frame::Function { name: n, file: f, .. }, Frame::Function { name: m, file: g, .. }) => n == m && f == g,
            (a, b) => a == b,
        };
        self.truncated.is_none()
            && other.truncated.is_none()
            && self.evals == other.evals
            && self.frames.len() == other.frames.len()
            && self.frames.get(1..) == other.frames.get(1..)
            && self.frames.first().zip(other.frames.first()).is_none_or(|(a, b)| same_function(a, b))
    }
}

/// Reads the stack of `tstate`. Every frame is checked when read (a running
/// frame, a code object); a walk that meets one that is not, or loops, is
/// retried up to [`ATTEMPTS`] times, and the longest one is kept with a
/// `[truncated]` frame if none reaches the outermost frame. The first walk
/// that reaches it is kept even if the innermost frame moved on meanwhile:
/// reading until the stack holds still would favour long-lived frames.
/// Never drops a sample. `still`: the thread is stopped (see
/// [`crate::remote::ptrace`]), so one walk is all there is to read.
pub fn read_stack(t: &Target, walks: &mut Walks, tstate: u64, retries: &mut u64, still: bool) -> io::Result<Stack> {
    let mut longest: Option<Walk> = None;
    let attempts = if still { 1 } else { ATTEMPTS };
    for attempt in 0..attempts {
        if attempt > 0 {
            *retries += 1;
        }
        let w = walk_once(t, walks, tstate, attempt + 1 == attempts, still)?;
        match w.end {
            End::Root => return Ok(Stack { frames: w.frames, truncated: None, evals: w.evals.ends }),
            End::Deep => {
                longest = Some(w);
                break;
            }
            End::Torn | End::Cycle => {
                if longest.as_ref().is_none_or(|l| w.frames.len() > l.frames.len()) {
                    longest = Some(w);
                }
            }
        }
    }
    Ok(stack_of(longest.expect("at least one attempt")))
}

/// The stack a walk read, with a `[truncated]` frame if it did not reach
/// the outermost frame.
fn stack_of(w: Walk) -> Stack {
    let mut frames = w.frames;
    if w.end != End::Root {
        frames.push(Frame::Synthetic(TRUNCATED.into()));
    }
    Stack { frames, truncated: (w.end != End::Root).then_some(w.end), evals: w.evals.ends }
}

/// The stack of frames copied while the thread was interrupted (see
/// [`crate::sampling::interrupt`]): `top` its innermost frame, `frames` the
/// copies (address, bytes) from it outwards. The thread did not run during
/// the copy, so one walk over it is the stack of that instant, as a stopped
/// thread's is; frames past the copy's end are read now.
pub fn read_copied(t: &Target, walks: &mut Walks, top: u64, frames: Vec<(u64, Vec<u8>)>) -> io::Result<Stack> {
    let snap = Snapshot::of(frames);
    let w = walk_from(t, &mut walks.codes, &snap, &[], top, t.layout.frame_size_to_read, Top::Stopped)?;
    Ok(stack_of(w))
}

/// Walks per stack read, at most.
const ATTEMPTS: u32 = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[(&str, i64)], evals: &[usize]) -> Stack {
        let frames = frames
            .iter()
            .map(|&(name, line)| Frame::Function { name: name.into(), file: "w.py".into(), line })
            .collect();
        Stack { frames, truncated: None, evals: evals.to_vec() }
    }

    #[test]
    fn same_calls_lets_the_innermost_line_move_only() {
        let a = stack(&[("spin_it", 18), ("<module>", 24)], &[2]);
        assert!(a.same_calls(&stack(&[("spin_it", 19), ("<module>", 24)], &[2])));
        // The loop moved on to its next call.
        assert!(!a.same_calls(&stack(&[("compress_it", 14), ("<module>", 23)], &[2])));
        assert!(!a.same_calls(&stack(&[("spin_it", 18), ("<module>", 25)], &[2])));
        assert!(!a.same_calls(&stack(&[("spin_it", 18), ("<module>", 24)], &[1, 2])));
        assert!(!a.same_calls(&stack(&[("<module>", 24)], &[1])));
        let torn = Stack { truncated: Some(End::Torn), ..stack(&[("spin_it", 18), ("<module>", 24)], &[2]) };
        assert!(!a.same_calls(&torn));
        assert!(!torn.same_calls(&a));
    }
}
