//! SVG flamegraphs (inferno): of one summary, and differential between two.
//!
//! A differential graph has the new run's stacks, widths by its values,
//! red where a stack's share grew and blue where it shrank: the base
//! run's values are scaled to the new run's total first (inferno's
//! `normalize`), so runs of different length compare.

use super::{collapsed, ReportError};
use osprey_pprof::Summary;

fn options(title: &str, unit: &str) -> inferno::flamegraph::Options<'static> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = unit.to_string();
    opts
}

/// The SVG flamegraph of `s` (title "osprey", counts in `s`'s unit).
pub fn render(s: &Summary) -> Result<Vec<u8>, ReportError> {
    if s.folded.is_empty() {
        return Err(ReportError::NothingToDraw);
    }
    let lines: Vec<String> = collapsed::lines(s).map(|(stack, v)| format!("{stack} {v}")).collect();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(
        &mut options("osprey", &s.sample_type.1),
        lines.iter().map(String::as_str),
        &mut svg,
    )
    .map_err(|e| ReportError::Render(format!("flamegraph: {e}")))?;
    Ok(svg)
}

/// The differential flamegraph from `base` to `new` (see the module doc).
pub fn render_diff(base: &Summary, new: &Summary) -> Result<Vec<u8>, ReportError> {
    if base.folded.is_empty() || new.folded.is_empty() {
        return Err(ReportError::NothingToDraw);
    }
    let (before, after) = (collapsed::render(base), collapsed::render(new));
    let mut folded = Vec::new();
    let opts = inferno::differential::Options { normalize: true, ..Default::default() };
    inferno::differential::from_readers(opts, before.as_bytes(), after.as_bytes(), &mut folded)
        .map_err(|e| ReportError::Render(format!("differential stacks: {e}")))?;
    let text = String::from_utf8_lossy(&folded);
    let mut svg = Vec::new();
    let title = "osprey diff (red: grew, blue: shrank)";
    inferno::flamegraph::from_lines(&mut options(title, &new.sample_type.1), text.lines(), &mut svg)
        .map_err(|e| ReportError::Render(format!("flamegraph: {e}")))?;
    Ok(svg)
}
