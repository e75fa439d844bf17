//! Putting a thread's Python frames where they ran among its native frames.
//!
//! Each call of the interpreter's C evaluation function (an *eval* native
//! frame) runs a group of Python frames ([`crate::walk::Stack::evals`]).
//! When the native walk and the Python walk both reached their outermost
//! frames and count the same number of calls, the k-th eval frame (innermost
//! first) is replaced by the k-th group. Between two groups, the native
//! frames are kept only if one of them is outside the interpreter (a C
//! extension or library that called back into Python); a stretch of the
//! interpreter's own call machinery (`_PyFunction_Vectorcall` and the like)
//! is left out. Above the innermost group every native frame is kept (that is
//! where the time goes); below the outermost group, the interpreter's start
//! (`main`, `Py_RunMain`, `thread_run`, ...) is left out.
//!
//! What cannot be matched is said in the stack, never dropped:
//! - the native walk stopped before its outermost frame ([`NATIVE_TRUNCATED`]):
//!   the groups it reached are placed, the others follow the marker;
//! - the counts differ ([`UNMATCHED`]): the native frames above the innermost
//!   eval frame, the marker, then the whole Python stack.

/// Marker: the native walk ended early; the Python frames below it follow.
pub const NATIVE_TRUNCATED: &str = "[native: truncated]";
/// Marker: native and Python frames could not be matched.
pub const UNMATCHED: &str = "[native: unmatched]";

/// What a native frame is, for merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call of the interpreter's evaluation function.
    Eval,
    /// Another function of the interpreter's own module.
    Interp,
    /// Anything else (C extensions, libraries, unknown code).
    Other,
}

/// How a merge went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every eval frame replaced by its group of Python frames.
    Matched,
    /// The native walk ended early: [`NATIVE_TRUNCATED`] in the stack.
    NativeTruncated,
    /// The counts differ: [`UNMATCHED`] in the stack.
    Unmatched,
}

/// Merges `native` (leaf first; `native_complete`: the walk reached the
/// outermost frame) with the Python frames `py` (leaf first, in groups
/// ending at `evals`; `py_complete`: read to the outermost frame, else its
/// last frame is the `[truncated]` marker). `marker` makes a marker frame.
pub fn merge<F: Clone>(
    native: &[(F, Kind)],
    native_complete: bool,
    py: &[F],
    evals: &[usize],
    py_complete: bool,
    marker: impl Fn(&str) -> F,
) -> (Vec<F>, Outcome) {
    let at: Vec<usize> = native.iter().enumerate().filter(|(_, f)| f.1 == Kind::Eval).map(|(i, _)| i).collect();
    let groups = evals.len();
    let leaf = at.first().copied().unwrap_or(native.len());
    let mut out: Vec<F> = native[..leaf].iter().map(|f| f.0.clone()).collect();
    let group = |k: usize| {
        let start = if k == 0 { 0 } else { evals[k - 1] };
        &py[start.min(py.len())..evals[k].min(py.len())]
    };
    let whole = at.len() == groups && native_complete && py_complete;
    let placed = if whole || (!native_complete && at.len() <= groups) {
        at.len()
    } else if !py_complete && groups <= at.len() {
        groups
    } else {
        out.push(marker(UNMATCHED));
        out.extend(py.iter().cloned());
        return (out, Outcome::Unmatched);
    };
    for k in 0..placed {
        out.extend(group(k).iter().cloned());
        let end = at.get(k + 1).copied().unwrap_or(native.len());
        let between = &native[at[k] + 1..end];
        let last = k + 1 == placed;
        // Below the outermost placed group: the interpreter's start when the
        // walk is whole; what the walk reached before it stopped otherwise.
        let keep = if last { !native_complete } else { between.iter().any(|f| f.1 == Kind::Other) };
        if keep {
            out.extend(between.iter().map(|f| f.0.clone()));
        }
    }
    let rest = if placed == 0 { 0 } else { evals[placed - 1].min(py.len()) };
    if !native_complete {
        out.push(marker(NATIVE_TRUNCATED));
        out.extend(py[rest..].iter().cloned());
        return (out, Outcome::NativeTruncated);
    }
    // Python read incompletely: what it has beyond the groups (its marker).
    out.extend(py[rest..].iter().cloned());
    (out, Outcome::Matched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Kind::*;

    fn m(s: &str) -> String {
        s.to_string()
    }

    fn n(v: &[(&str, Kind)]) -> Vec<(String, Kind)> {
        v.iter().map(|(s, k)| (s.to_string(), *k)).collect()
    }

    #[test]
    fn groups_replace_eval_frames() {
        // deflate <- zlib_compress (ext) <- eval[g0] <- vectorcall (interp)
        // <- eval[g1] <- main (root, dropped)
        let native = n(&[
            ("deflate", Other),
            ("zlib_compress", Other),
            ("eval", Eval),
            ("vectorcall", Interp),
            ("eval", Eval),
            ("main", Other),
        ]);
        let py = vec![m("f"), m("g"), m("<module>")];
        let (out, o) = merge(&native, true, &py, &[2, 3], true, m);
        assert_eq!(o, Outcome::Matched);
        assert_eq!(out, vec!["deflate", "zlib_compress", "f", "g", "<module>"]);
    }

    #[test]
    fn an_extension_between_groups_is_kept() {
        let native =
            n(&[("eval", Eval), ("call", Interp), ("ext_callback", Other), ("eval", Eval), ("start_thread", Other)]);
        let py = vec![m("key"), m("run")];
        let (out, _) = merge(&native, true, &py, &[1, 2], true, m);
        assert_eq!(out, vec!["key", "call", "ext_callback", "run"]);
    }

    #[test]
    fn truncated_native_walk_keeps_every_python_frame() {
        let native = n(&[("leaf", Other), ("eval", Eval), ("jit?", Other)]);
        let py = vec![m("a"), m("b"), m("c")];
        let (out, o) = merge(&native, false, &py, &[1, 2, 3], true, |s| format!("<{s}>"));
        assert_eq!(o, Outcome::NativeTruncated);
        assert_eq!(out, vec!["leaf", "a", "jit?", "<[native: truncated]>", "b", "c"]);
    }

    #[test]
    fn a_count_mismatch_is_marked() {
        let native = n(&[("leaf", Other), ("eval", Eval), ("main", Other)]);
        let py = vec![m("a"), m("b")];
        let (out, o) = merge(&native, true, &py, &[1, 2], true, |s| format!("<{s}>"));
        assert_eq!(o, Outcome::Unmatched);
        assert_eq!(out, vec!["leaf", "<[native: unmatched]>", "a", "b"]);
    }

    #[test]
    fn a_deep_python_stack_places_its_innermost_groups() {
        let native = n(&[("eval", Eval), ("eval", Eval), ("eval", Eval), ("main", Other)]);
        let py = vec![m("a"), m("b"), m("[truncated]")];
        let (out, o) = merge(&native, true, &py, &[1, 2], false, m);
        assert_eq!(o, Outcome::Matched);
        assert_eq!(out, vec!["a", "b", "[truncated]"]);
    }
}
