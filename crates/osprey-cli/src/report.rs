//! `osprey report FILE... [--top N] [--flamegraph OUT.svg]`: merges pprof
//! files, prints the functions with the most flat value (like
//! `go tool pprof -top`), and optionally draws a flamegraph.

use osprey::export::{read_profile, summarize, Summary};
use std::fmt::Write as _;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// Runs the report on `files`, printing to stdout. `sample_index` picks the
/// value (a sample type name or number; default: the last sample type).
pub fn run(
    files: &[PathBuf],
    top: usize,
    flamegraph: Option<&Path>,
    sample_index: Option<&str>,
) -> Result<(), String> {
    if files.is_empty() {
        return Err("no profile files given".into());
    }
    let profiles: Vec<_> = files
        .iter()
        .map(|f| read_profile(f).map_err(|e| format!("{}: {e}", f.display())))
        .collect::<Result<_, _>>()?;
    let summary = summarize(&profiles, sample_index)?;
    print!("{}", render_top(&summary, top, files.len()));
    if let Some(out) = flamegraph {
        write_flamegraph(&summary, out)?;
        println!("flamegraph written to {}", out.display());
    }
    Ok(())
}

/// The top table: header lines, then `flat flat% cum cum% function` rows.
pub fn render_top(s: &Summary, top: usize, files: usize) -> String {
    let (kind, unit) = (&s.sample_type.0, &s.sample_type.1);
    let mut out = String::new();
    let _ = writeln!(out, "Type: {kind} ({unit}), {files} file(s)");
    let _ = writeln!(
        out,
        "Total: {} in {} samples",
        format_value(s.total, unit),
        s.samples
    );
    let shown = top.min(s.functions.len());
    let _ = writeln!(
        out,
        "Showing top {shown} of {} functions",
        s.functions.len()
    );
    let _ = writeln!(
        out,
        "{:>10} {:>7} {:>10} {:>7}  function",
        "flat", "flat%", "cum", "cum%"
    );
    let pct = |v: i64| {
        if s.total == 0 {
            0.0
        } else {
            100.0 * v as f64 / s.total as f64
        }
    };
    for f in &s.functions[..shown] {
        let (flat, cum) = (format_value(f.flat, unit), format_value(f.cum, unit));
        let _ = writeln!(
            out,
            "{flat:>10} {:>6.2}% {cum:>10} {:>6.2}%  {}",
            pct(f.flat),
            pct(f.cum),
            f.name
        );
    }
    out
}

/// `v` in a readable unit: nanoseconds as ns/us/ms/s, bytes as B/KiB/MiB/GiB,
/// anything else as the bare number.
pub fn format_value(v: i64, unit: &str) -> String {
    let scaled = |steps: &[(f64, &str)]| {
        let (div, name) = steps
            .iter()
            .rev()
            .find(|(d, _)| (v.unsigned_abs() as f64) >= *d)
            .unwrap_or(&steps[0]);
        if *div == 1.0 {
            format!("{v}{name}")
        } else {
            format!("{:.2}{name}", v as f64 / div)
        }
    };
    match unit {
        "nanoseconds" => scaled(&[(1.0, "ns"), (1e3, "us"), (1e6, "ms"), (1e9, "s")]),
        "bytes" => scaled(&[
            (1.0, "B"),
            (1024.0, "KiB"),
            (1048576.0, "MiB"),
            (1073741824.0, "GiB"),
        ]),
        _ => v.to_string(),
    }
}

/// Writes an SVG flamegraph of `s.folded` to `out` (title "osprey", counts in `s`'s unit).
pub fn write_flamegraph(s: &Summary, out: &Path) -> Result<(), String> {
    if s.folded.is_empty() {
        return Err("no samples with a nonzero value: nothing to draw".into());
    }
    let lines: Vec<String> = s
        .folded
        .iter()
        .map(|(stack, v)| format!("{stack} {v}"))
        .collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = "osprey".to_string();
    opts.count_name = s.sample_type.1.clone();
    let file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    inferno::flamegraph::from_lines(
        &mut opts,
        lines.iter().map(String::as_str),
        BufWriter::new(file),
    )
    .map_err(|e| format!("flamegraph: {e}"))
}
