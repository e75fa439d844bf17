//! `osprey report [FILE|DIR...]`: merges pprof files (by default every
//! profile in `./profiles`, several processes alike), keeps the samples the
//! [`Filter`] chooses (process, span, trace), and shows them in the form
//! asked: the top functions (like `go tool pprof -top`; by CPU time when
//! the profiles have it), folded stacks, a speedscope file or one merged
//! pprof file; optionally an SVG flamegraph and an HTML timeline too.
//!
//! Invariant: every output is rendered in memory before the first byte is
//! written, so a failure writes nothing.
//!
//! | file | what |
//! |---|---|
//! | [`input`] | files and directories read, the sample type chosen |
//! | [`filter`] | `--pid`, `--process`, `--span`, `--trace` |
//! | [`collapsed`] | Brendan Gregg's folded stacks |
//! | [`flamegraph`] | SVG flamegraphs (inferno), plain and differential |
//! | [`speedscope`] | speedscope's JSON file format |
//! | [`pprof_out`] | one gzip pprof file |
//! | [`timeline`] | the self-contained HTML timeline |

pub mod collapsed;
pub mod filter;
pub mod flamegraph;
pub mod input;
pub mod pprof_out;
pub mod speedscope;
pub mod timeline;

pub use filter::Filter;
use osprey_pprof::top::render_top;
use osprey_pprof::{summarize, Summary};
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// What `--format` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The functions with the most flat value.
    Top,
    /// Folded stacks, `root;...;leaf VALUE` (flamegraph.pl, inferno).
    Collapsed,
    /// speedscope's JSON file format.
    Speedscope,
    /// One gzip pprof file of the merged, filtered samples.
    Pprof,
}

/// What one speedscope profile holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// One profile per thread.
    Thread,
    /// One profile per process.
    Process,
}

/// Everything `osprey report` was asked.
pub struct Options {
    /// Files and directories (none: `./profiles`).
    pub files: Vec<PathBuf>,
    /// Rows of the top table.
    pub top: usize,
    /// What to print.
    pub format: Format,
    /// Where to write it (None: stdout).
    pub output: Option<PathBuf>,
    /// Also an SVG flamegraph here.
    pub flamegraph: Option<PathBuf>,
    /// Also an HTML timeline here.
    pub timeline: Option<PathBuf>,
    /// The sample type (name or index; default `cpu` when present).
    pub sample_index: Option<String>,
    /// speedscope: a profile per thread or per process.
    pub group: Group,
    /// Which samples to keep.
    pub filter: Filter,
}

/// Why `osprey report` or `osprey diff` failed; each message is one line.
#[derive(Debug)]
pub enum ReportError {
    /// A directory of profiles cannot be listed.
    ReadDir(PathBuf, std::io::Error),
    /// A directory holds no profile file.
    NoProfileFiles(PathBuf),
    /// No file was named and `./profiles` has none (the reason).
    NoneGiven(Box<ReportError>),
    /// A profile cannot be read (the error names the file).
    Profile(osprey_pprof::Error),
    /// `--sample-index` names no sample type of the first file.
    UnknownType { path: PathBuf, asked: String, have: Vec<String> },
    /// A file lacks the sample type the others are compared on.
    MissingType { path: PathBuf, want: String, have: Vec<String>, like: PathBuf },
    /// The filter kept no sample.
    NoChosenSamples,
    /// Every sample has a zero value: no flamegraph to draw.
    NothingToDraw,
    /// `--timeline` on samples without their time.
    NoTimestamps,
    /// `--format pprof` (binary) to a terminal.
    BinaryToTerminal,
    /// An output file cannot be written.
    Write(PathBuf, std::io::Error),
    /// Rendering an output failed.
    Render(String),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::ReadDir(dir, e) => write!(f, "{}: {e}", dir.display()),
            ReportError::NoProfileFiles(dir) => write!(f, "no profile files in {}", dir.display()),
            ReportError::NoneGiven(e) => write!(f, "no profile files given, and {e}"),
            ReportError::Profile(e) => e.fmt(f),
            ReportError::UnknownType { path, asked, have } => {
                write!(f, "{}: no sample type {asked:?}; it has {}", path.display(), have.join(", "))
            }
            ReportError::MissingType { path, want, have, like } => write!(
                f,
                "{}: sample types {} lack {want} (which {} has): not comparable",
                path.display(),
                have.join(", "),
                like.display()
            ),
            ReportError::NoChosenSamples => f.write_str("no samples of the chosen --pid/--process/--span/--trace"),
            ReportError::NothingToDraw => f.write_str("no samples with a nonzero value: nothing to draw"),
            ReportError::NoTimestamps => f.write_str(
                "no sample carries its time: record with OSPREY_TIMELINE=1 (osprey exec), or a backend that keeps a timeline",
            ),
            ReportError::BinaryToTerminal => {
                f.write_str("--format pprof is binary: name a file with --output (or redirect stdout)")
            }
            ReportError::Write(path, e) => write!(f, "{}: {e}", path.display()),
            ReportError::Render(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ReportError {}

impl From<osprey_pprof::Error> for ReportError {
    fn from(e: osprey_pprof::Error) -> Self {
        ReportError::Profile(e)
    }
}

impl ReportError {
    /// The exit status: 2 for bad input (files, arguments), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReportError::NothingToDraw | ReportError::NoChosenSamples | ReportError::Write(..) => 1,
            ReportError::Render(_) => 1,
            _ => 2,
        }
    }
}

/// The inputs read, filtered and merged, with the chosen sample type.
pub struct Merged {
    /// The files read.
    pub files: Vec<PathBuf>,
    /// Their kept samples as one profile (default sample type: the chosen one).
    pub profile: osprey_pprof::pprof::Profile,
    /// (type, unit) compared.
    pub sample_type: (String, String),
}

impl Merged {
    /// The summary of the chosen sample type.
    pub fn summary(&self) -> Result<Summary, ReportError> {
        Ok(summarize(std::slice::from_ref(&self.profile), Some(&self.sample_type.0))?)
    }

    /// Index of the chosen sample type in `profile`.
    pub fn value_index(&self) -> usize {
        let p = &self.profile;
        p.sample_type
            .iter()
            .position(|t| p.string(t.r#type) == self.sample_type.0 && p.string(t.unit) == self.sample_type.1)
            .unwrap_or(0)
    }
}

/// Reads `files` (see [`input::expand`]), keeps what `filter` keeps and merges them.
pub fn load(files: &[PathBuf], sample_index: Option<&str>, filter: &Filter) -> Result<Merged, ReportError> {
    let inputs = input::read_all(files)?;
    let sample_type = input::sample_type(&inputs, sample_index)?;
    Merged::new(inputs, sample_type, filter)
}

impl Merged {
    /// `inputs` filtered and merged, compared on `sample_type`.
    pub fn new(
        mut inputs: Vec<input::Input>,
        sample_type: (String, String),
        filter: &Filter,
    ) -> Result<Merged, ReportError> {
        for i in &mut inputs {
            filter.apply(&mut i.profile);
        }
        if filter.is_active() && inputs.iter().all(|i| i.profile.sample.is_empty()) {
            return Err(ReportError::NoChosenSamples);
        }
        let (files, profiles): (Vec<PathBuf>, Vec<_>) = inputs.into_iter().map(|i| (i.path, i.profile)).unzip();
        let mut merged = Merged { files, profile: osprey_pprof::merge::merge(&profiles), sample_type };
        // pprof's default_sample_type is a string index: what tools show first.
        let t = merged.value_index();
        merged.profile.default_sample_type = merged.profile.sample_type[t].r#type;
        Ok(merged)
    }
}

/// Runs `osprey report`.
pub fn run(o: &Options) -> Result<(), ReportError> {
    // SAFETY: isatty only reads the descriptor's state.
    if o.format == Format::Pprof && o.output.is_none() && unsafe { libc::isatty(1) } == 1 {
        return Err(ReportError::BinaryToTerminal);
    }
    let m = load(&o.files, o.sample_index.as_deref(), &o.filter)?;
    let summary = m.summary()?;
    let main = match o.format {
        Format::Top => render_top(&summary, o.top, m.files.len()).into_bytes(),
        Format::Collapsed => collapsed::render(&summary).into_bytes(),
        Format::Speedscope => speedscope::render(&m, o.group).into_bytes(),
        Format::Pprof => pprof_out::render(&m.profile).map_err(|e| ReportError::Render(format!("pprof: {e}")))?,
    };
    let svg = o.flamegraph.as_ref().map(|_| flamegraph::render(&summary)).transpose()?;
    let html = o.timeline.as_ref().map(|_| timeline::render(&m)).transpose()?;
    match &o.output {
        Some(path) => write(path, &main)?,
        None => std::io::stdout().write_all(&main).map_err(|e| ReportError::Write("stdout".into(), e))?,
    }
    for (path, bytes, what) in [(&o.flamegraph, svg, "flamegraph"), (&o.timeline, html, "timeline")] {
        if let (Some(path), Some(bytes)) = (path, bytes) {
            write(path, &bytes)?;
            eprintln!("{what} written to {}", path.display());
        }
    }
    Ok(())
}

/// Writes `bytes` to `path`.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    std::fs::write(path, bytes).map_err(|e| ReportError::Write(path.to_path_buf(), e))
}
