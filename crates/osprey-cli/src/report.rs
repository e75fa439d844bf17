//! `osprey report [FILE...] [--top N] [--flamegraph OUT.svg] [--pid P] [--process NAME]`:
//! merges pprof files (by default every profile in `./profiles`, several
//! processes alike), keeps the samples of the chosen processes, prints the
//! functions with the most flat value (like `go tool pprof -top`; by CPU
//! time when the profiles have it), and optionally draws a flamegraph.

use osprey_pprof::pprof::Profile;
use osprey_pprof::top::render_top;
use osprey_pprof::{read_profile, summarize, Summary};
use std::fmt;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// Why `osprey report` failed; each message is one line.
#[derive(Debug)]
pub enum ReportError {
    /// A directory of profiles cannot be listed.
    ReadDir(PathBuf, std::io::Error),
    /// A directory holds no profile file.
    NoProfileFiles(PathBuf),
    /// No file was named and `./profiles` has none (the reason).
    NoneGiven(Box<ReportError>),
    /// A profile cannot be read or the profiles cannot be summarized.
    Profile(osprey_pprof::Error),
    /// The `--pid`/`--process` filter kept no sample.
    NoChosenSamples,
    /// Every sample has a zero value: no flamegraph to draw.
    NothingToDraw,
    /// The flamegraph file cannot be created.
    Create(PathBuf, std::io::Error),
    /// Drawing the flamegraph failed.
    Flamegraph(std::io::Error),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::ReadDir(dir, e) => write!(f, "{}: {e}", dir.display()),
            ReportError::NoProfileFiles(dir) => write!(f, "no profile files in {}", dir.display()),
            ReportError::NoneGiven(e) => write!(f, "no profile files given, and {e}"),
            ReportError::Profile(e) => e.fmt(f),
            ReportError::NoChosenSamples => f.write_str("no samples of the chosen --pid/--process in these profiles"),
            ReportError::NothingToDraw => f.write_str("no samples with a nonzero value: nothing to draw"),
            ReportError::Create(path, e) => write!(f, "{}: {e}", path.display()),
            ReportError::Flamegraph(e) => write!(f, "flamegraph: {e}"),
        }
    }
}

impl std::error::Error for ReportError {}

impl From<osprey_pprof::Error> for ReportError {
    fn from(e: osprey_pprof::Error) -> Self {
        ReportError::Profile(e)
    }
}

/// Which samples to keep: those whose `pid` label is one of `pids` and whose
/// `process` label is one of `processes` (an empty list keeps all).
#[derive(Default)]
pub struct Filter {
    /// Process ids to keep (`--pid`).
    pub pids: Vec<i64>,
    /// Program names to keep (`--process`).
    pub processes: Vec<String>,
}

impl Filter {
    fn keep(&self, p: &Profile, s: &osprey_pprof::pprof::Sample) -> bool {
        let label = |k: &str| s.label.iter().find(|l| p.string(l.key) == k);
        (self.pids.is_empty() || label("pid").is_some_and(|l| self.pids.contains(&l.num)))
            && (self.processes.is_empty()
                || label("process").is_some_and(|l| self.processes.iter().any(|n| n == p.string(l.str))))
    }
}

/// Runs the report on `files` (a directory: its profiles; none: every
/// profile in `./profiles`),
/// printing to stdout. `sample_index` picks the value (a sample type name or
/// number; default: `cpu` when present, else the last sample type).
pub fn run(
    files: &[PathBuf],
    top: usize,
    flamegraph: Option<&Path>,
    sample_index: Option<&str>,
    filter: &Filter,
) -> Result<(), ReportError> {
    let mut expanded = Vec::new();
    for f in files {
        if f.is_dir() {
            expanded.extend(profiles_in(f)?);
        } else {
            expanded.push(f.clone());
        }
    }
    if files.is_empty() {
        expanded = profiles_in(Path::new("profiles")).map_err(|e| ReportError::NoneGiven(Box::new(e)))?;
    }
    let files = &expanded[..];
    let mut profiles: Vec<Profile> = files.iter().map(|f| read_profile(f)).collect::<Result<_, _>>()?;
    for p in &mut profiles {
        let kept: Vec<_> = p.sample.iter().filter(|s| filter.keep(p, s)).cloned().collect();
        p.sample = kept;
    }
    if profiles.iter().all(|p| p.sample.is_empty()) && !(filter.pids.is_empty() && filter.processes.is_empty()) {
        return Err(ReportError::NoChosenSamples);
    }
    let summary = summarize(&profiles, sample_index)?;
    print!("{}", render_top(&summary, top, files.len()));
    if let Some(out) = flamegraph {
        write_flamegraph(&summary, out)?;
        println!("flamegraph written to {}", out.display());
    }
    Ok(())
}

/// The profile files in `dir`, sorted.
fn profiles_in(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let rd = std::fs::read_dir(dir).map_err(|e| ReportError::ReadDir(dir.to_path_buf(), e))?;
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.starts_with('.') && n.ends_with(".pb.gz"))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(ReportError::NoProfileFiles(dir.to_path_buf()));
    }
    Ok(v)
}

/// Writes an SVG flamegraph of `s.folded` to `out` (title "osprey", counts in `s`'s unit).
pub fn write_flamegraph(s: &Summary, out: &Path) -> Result<(), ReportError> {
    if s.folded.is_empty() {
        return Err(ReportError::NothingToDraw);
    }
    let lines: Vec<String> = s.folded.iter().map(|(stack, v)| format!("{stack} {v}")).collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = "osprey".to_string();
    opts.count_name = s.sample_type.1.clone();
    let file = File::create(out).map_err(|e| ReportError::Create(out.to_path_buf(), e))?;
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), BufWriter::new(file))
        .map_err(ReportError::Flamegraph)
}
