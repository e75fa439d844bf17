//! `osprey diff BASE NEW`: what changed between two runs. Each side (a file
//! or a directory of profiles) is merged and summarized on one sample type;
//! functions are ranked by the change of their share of their side's total
//! (so runs of different length compare), largest increase first, with both
//! values shown; `--flamegraph` draws the differential flamegraph.
//!
//! Invariant: both sides must have the compared sample type with the same
//! unit, else one line names the file that lacks it (exit 2).

use crate::report::{flamegraph, input, write, Filter, Merged, ReportError};
use osprey_pprof::top::format_value;
use osprey_pprof::Summary;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// One function's values on both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Function name.
    pub name: String,
    /// Its value in the base run.
    pub base: i64,
    /// Its value in the new run.
    pub new: i64,
    /// Its share of the base run's total, percent.
    pub base_pct: f64,
    /// Its share of the new run's total, percent.
    pub new_pct: f64,
}

impl Change {
    /// Change of share, in percentage points.
    pub fn delta(&self) -> f64 {
        self.new_pct - self.base_pct
    }
}

/// The functions of `base` and `new` (flat values, or cumulative with
/// `cum`), largest increase of share first, then largest increase of value.
pub fn changes(base: &Summary, new: &Summary, cum: bool) -> Vec<Change> {
    let mut values: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for f in &base.functions {
        values.entry(&f.name).or_default().0 = if cum { f.cum } else { f.flat };
    }
    for f in &new.functions {
        values.entry(&f.name).or_default().1 = if cum { f.cum } else { f.flat };
    }
    let pct = |v: i64, total: i64| if total == 0 { 0.0 } else { 100.0 * v as f64 / total as f64 };
    let mut out: Vec<Change> = values
        .into_iter()
        .filter(|(_, (b, n))| *b != 0 || *n != 0)
        .map(|(name, (b, n))| Change {
            name: name.to_string(),
            base: b,
            new: n,
            base_pct: pct(b, base.total),
            new_pct: pct(n, new.total),
        })
        .collect();
    out.sort_by(|a, b| b.delta().total_cmp(&a.delta()).then((b.new - b.base).cmp(&(a.new - a.base))));
    out
}

/// The table of [`changes`]: header lines, then `base base% new new% change function` rows.
pub fn render(base: &Merged, b: &Summary, new: &Merged, n: &Summary, rows: &[Change], top: usize) -> String {
    let unit = &b.sample_type.1;
    let mut out = String::new();
    let _ = writeln!(out, "Type: {} ({unit})", b.sample_type.0);
    let _ = writeln!(out, "Base: {} in {} file(s)", format_value(b.total, unit), base.files.len());
    let _ = writeln!(out, "New:  {} in {} file(s)", format_value(n.total, unit), new.files.len());
    let shown = if top == 0 { rows.len() } else { top.min(rows.len()) };
    let _ = writeln!(out, "Showing {shown} of {} functions, by change of share (points)", rows.len());
    let _ = writeln!(out, "{:>10} {:>7} {:>10} {:>7} {:>8}  function", "base", "base%", "new", "new%", "change");
    for c in &rows[..shown] {
        let (bv, nv) = (format_value(c.base, unit), format_value(c.new, unit));
        let _ =
            writeln!(out, "{bv:>10} {:>6.2}% {nv:>10} {:>6.2}% {:>+8.2}  {}", c.base_pct, c.new_pct, c.delta(), c.name);
    }
    out
}

/// Runs `osprey diff`.
pub fn run(
    base: &Path,
    new: &Path,
    top: usize,
    cum: bool,
    flamegraph_out: Option<&Path>,
    sample_index: Option<&str>,
) -> Result<(), ReportError> {
    let base_in = input::read_all(&[base.to_path_buf()])?;
    let new_in = input::read_all(&[new.to_path_buf()])?;
    let split = base_in.len();
    let mut all = base_in;
    all.extend(new_in);
    let sample_type = input::sample_type(&all, sample_index)?;
    let new_in = all.split_off(split);
    let none = Filter::default();
    let base_m = Merged::new(all, sample_type.clone(), &none)?;
    let new_m = Merged::new(new_in, sample_type, &none)?;
    let (b, n) = (base_m.summary()?, new_m.summary()?);
    let rows = changes(&b, &n, cum);
    let text = render(&base_m, &b, &new_m, &n, &rows, top);
    let svg = flamegraph_out.map(|_| flamegraph::render_diff(&b, &n)).transpose()?;
    std::io::stdout().write_all(text.as_bytes()).map_err(|e| ReportError::Write(PathBuf::from("stdout"), e))?;
    if let (Some(path), Some(svg)) = (flamegraph_out, svg) {
        write(path, &svg)?;
        eprintln!("differential flamegraph written to {}", path.display());
    }
    Ok(())
}
