//! Brendan Gregg's folded stacks: one line `root;...;leaf VALUE` per
//! distinct stack, the input of flamegraph.pl and inferno.
//!
//! Invariant: the values add up to the summary's total (stacks of value 0
//! are left out); no frame holds `;` or a line break.

use osprey_pprof::Summary;

/// The folded lines of `s`, in the summary's (stack) order.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    for (stack, v) in lines(s) {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

/// `(stack, value)` pairs of `s`, frames cleaned of line breaks.
pub fn lines(s: &Summary) -> impl Iterator<Item = (String, i64)> + '_ {
    s.folded.iter().map(|(stack, v)| (stack.replace(['\n', '\r'], " "), *v))
}
