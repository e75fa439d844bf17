//! Time in CPython's cyclic garbage collector.
//!
//! An interpreter's `gc.collecting` is set for the whole of a collection
//! (3.8: one flag in `_PyRuntime`). A collection runs on the thread holding
//! that interpreter's GIL, so that thread's sample gets a [`GC_FRAME`] on
//! top of the Python frame that triggered the collection (an allocation,
//! or a `gc.collect()` call). Finalizers a collection runs are Python code:
//! their frames show above the frame that triggered it, under `[gc]`'s
//! caller, since the frame chain is the thread's own.

use crate::target::Target;

/// The frame shown on top of a stack while it collects garbage.
pub const GC_FRAME: &str = "[gc]";

/// What is collecting now: `Some(vec![])` when the runtime-wide flag is set
/// (3.8), else the interpreters whose flag is set. None if nothing is or the
/// layout has no flag.
pub fn collecting(t: &Target) -> Option<Vec<u64>> {
    let l = &t.layout;
    if let Some(off) = l.runtime_gc_collecting {
        return (t.mem.i32(t.runtime + off).ok()? != 0).then(Vec::new);
    }
    let off = l.interp_gc_collecting?;
    let mut out = Vec::new();
    let mut interp = t.interp_head().ok()?;
    let mut n = 0;
    while interp != 0 && n < 64 {
        n += 1;
        if t.mem.i32(interp + off).ok()? != 0 {
            out.push(interp);
        }
        interp = t.mem.u64(interp + l.interp_next).ok()?;
    }
    (!out.is_empty()).then_some(out)
}

/// Is the GIL holder `tstate` running a collection, given [`collecting`]?
pub fn in_collection(t: &Target, tstate: u64, collecting: &[u64]) -> bool {
    if collecting.is_empty() {
        return true;
    }
    t.mem.u64(tstate + t.layout.tstate_interp).is_ok_and(|i| collecting.contains(&i))
}
