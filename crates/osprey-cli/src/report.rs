//! `osprey report FILE... [--top N] [--flamegraph OUT.svg]`: merges pprof
//! files, prints the functions with the most flat value (like
//! `go tool pprof -top`), and optionally draws a flamegraph.

use osprey_pprof::top::render_top;
use osprey_pprof::{read_profile, summarize, Summary};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// Runs the report on `files`, printing to stdout. `sample_index` picks the
/// value (a sample type name or number; default: the last sample type).
pub fn run(files: &[PathBuf], top: usize, flamegraph: Option<&Path>, sample_index: Option<&str>) -> Result<(), String> {
    if files.is_empty() {
        return Err("no profile files given".into());
    }
    let profiles: Vec<_> =
        files.iter().map(|f| read_profile(f).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let summary = summarize(&profiles, sample_index).map_err(|e| e.to_string())?;
    print!("{}", render_top(&summary, top, files.len()));
    if let Some(out) = flamegraph {
        write_flamegraph(&summary, out)?;
        println!("flamegraph written to {}", out.display());
    }
    Ok(())
}

/// Writes an SVG flamegraph of `s.folded` to `out` (title "osprey", counts in `s`'s unit).
pub fn write_flamegraph(s: &Summary, out: &Path) -> Result<(), String> {
    if s.folded.is_empty() {
        return Err("no samples with a nonzero value: nothing to draw".into());
    }
    let lines: Vec<String> = s.folded.iter().map(|(stack, v)| format!("{stack} {v}")).collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = "osprey".to_string();
    opts.count_name = s.sample_type.1.clone();
    let file = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), BufWriter::new(file))
        .map_err(|e| format!("flamegraph: {e}"))
}
