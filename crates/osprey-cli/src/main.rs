//! The `osprey` command: `exec`, `attach`, `report`.

mod exec;
mod hints;
mod report;
mod supervise;
mod tree;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "osprey",
    version,
    about = "Continuous profiler for Linux: CPU time per thread and per request, as pprof."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone, Debug)]
/// Sampling flags shared by `exec` and `attach`.
pub struct Sampling {
    /// Samples per CPU-second per thread (1-10000).
    #[arg(long, default_value_t = 100)]
    pub hz: u32,
    /// Seconds between profile files.
    #[arg(long, default_value_t = 60.0)]
    pub period: f64,
    /// Directory for the *.pb.gz profiles.
    #[arg(long, default_value = "profiles")]
    pub out: PathBuf,
    /// Native frames with file, line and inlined functions (DWARF; uses more
    /// memory in the profiled process at each flush).
    #[arg(long)]
    pub lines: bool,
    /// No messages from osprey on stderr (errors excepted).
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run CMD with the profiler loaded (native programs) or attached (CPython).
    Exec {
        #[command(flatten)]
        sampling: Sampling,
        /// Also profile the programs CMD executes.
        #[arg(long)]
        children: bool,
        /// The program and its arguments.
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Sample a running CPython process from outside until it exits or Ctrl-C.
    Attach {
        #[arg(long)]
        pid: i32,
        /// Stop after this many seconds.
        #[arg(long)]
        duration: Option<f64>,
        #[command(flatten)]
        sampling: Sampling,
    },
    /// Top functions and a flamegraph from profile files.
    Report {
        /// Profile files (default: every one in ./profiles).
        files: Vec<PathBuf>,
        /// Rows to print.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Write an SVG flamegraph here.
        #[arg(long)]
        flamegraph: Option<PathBuf>,
        /// Sample type to rank by, e.g. cpu, wall, samples (default: cpu when present).
        #[arg(long)]
        sample_index: Option<String>,
        /// Only samples of this process id (repeatable).
        #[arg(long)]
        pid: Vec<i64>,
        /// Only samples of processes with this name (repeatable).
        #[arg(long)]
        process: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Exec { sampling, children, cmd } => exec::exec(&sampling, children, &cmd),
        Cmd::Attach { pid, duration, sampling } => exec::attach(pid, duration, &sampling),
        Cmd::Report { files, top, flamegraph, sample_index, pid, process } => {
            let filter = report::Filter { pids: pid, processes: process };
            report::run(&files, top, flamegraph.as_deref(), sample_index.as_deref(), &filter)
                .map(|_| 0)
                .map_err(Failure::from)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("osprey: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

/// An error with the exit status it maps to.
pub struct Failure {
    /// The one line printed on stderr.
    pub message: String,
    /// The exit status.
    pub code: u8,
}

impl Failure {
    /// A usage error (exit status 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { message: message.into(), code: 2 }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure { message, code: 1 }
    }
}
