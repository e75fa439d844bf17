//! The `top` table of a [`Summary`]: the functions with the most flat value,
//! like `go tool pprof -top`, with values in readable units.

use crate::Summary;
use std::fmt::Write as _;

/// The top table: header lines, then `flat flat% cum cum% function` rows.
pub fn render_top(s: &Summary, top: usize, files: usize) -> String {
    let (kind, unit) = (&s.sample_type.0, &s.sample_type.1);
    let mut out = String::new();
    let _ = writeln!(out, "Type: {kind} ({unit}), {files} file(s)");
    let _ = writeln!(out, "Total: {} in {} samples", format_value(s.total, unit), s.samples);
    let shown = top.min(s.functions.len());
    let _ = writeln!(out, "Showing top {shown} of {} functions", s.functions.len());
    let _ = writeln!(out, "{:>10} {:>7} {:>10} {:>7}  function", "flat", "flat%", "cum", "cum%");
    let pct = |v: i64| {
        if s.total == 0 {
            0.0
        } else {
            100.0 * v as f64 / s.total as f64
        }
    };
    for f in &s.functions[..shown] {
        let (flat, cum) = (format_value(f.flat, unit), format_value(f.cum, unit));
        let _ = writeln!(out, "{flat:>10} {:>6.2}% {cum:>10} {:>6.2}%  {}", pct(f.flat), pct(f.cum), f.name);
    }
    out
}

/// `v` in a readable unit: nanoseconds as ns/us/ms/s, bytes as B/KiB/MiB/GiB,
/// anything else as the bare number.
pub fn format_value(v: i64, unit: &str) -> String {
    let scaled = |steps: &[(f64, &str)]| {
        let (div, name) = steps.iter().rev().find(|(d, _)| (v.unsigned_abs() as f64) >= *d).unwrap_or(&steps[0]);
        if *div == 1.0 {
            format!("{v}{name}")
        } else {
            format!("{:.2}{name}", v as f64 / div)
        }
    };
    match unit {
        "nanoseconds" => scaled(&[(1.0, "ns"), (1e3, "us"), (1e6, "ms"), (1e9, "s")]),
        "bytes" => scaled(&[(1.0, "B"), (1024.0, "KiB"), (1048576.0, "MiB"), (1073741824.0, "GiB")]),
        _ => v.to_string(),
    }
}
