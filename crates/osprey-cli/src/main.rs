//! The `osprey` command: `exec`, `attach`, `report`.

mod agent_libs;
mod attach;
mod attach_native;
mod diff;
mod dump;
mod dump_python;
mod exec;
mod hints;
mod native_tree;
mod report;
mod spool;
mod status;
mod supervise;
mod target;
mod top;
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
    /// Directory for the *.pb.gz profiles [default: profiles when no backend
    /// is named; with a backend, files are written only if --out is given].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Native frames with file, line and inlined functions (DWARF; uses more
    /// memory in the profiled process at each flush).
    #[arg(long)]
    pub lines: bool,
    /// Also a wall-time profile: every thread, running or blocked, with its
    /// state (`running`, `sleeping`, the system call it waits in).
    #[arg(long)]
    pub wall: bool,
    /// Wall-clock ticks per second (1-1000).
    #[arg(long, default_value_t = 20, value_name = "HZ")]
    pub wall_hz: u32,
    /// At most this many threads sampled per wall tick (1-1024).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub wall_threads: usize,
    /// Also allocation and live-heap profiles (native programs: the malloc
    /// family and C++ new/delete).
    #[arg(long)]
    pub alloc: bool,
    /// Mean bytes allocated between two allocation samples (`K`/`M` suffix).
    #[arg(long, default_value = "512K", value_name = "BYTES")]
    pub alloc_interval: String,
    /// CPython: the native frames (C extensions, libraries, the
    /// interpreter's C functions) merged with the Python frames. A running
    /// thread's native stack is sampled by a perf event between two reads of
    /// its Python stack, without a stop (with --blocking: stopped by ptrace).
    #[arg(long)]
    pub native: bool,
    /// CPython: stop each running thread for the moment its stack is read
    /// (ptrace), so that stacks changing faster than they can be copied are
    /// read whole, as py-spy's default mode does; costs about a point of CPU
    /// at 100 Hz.
    #[arg(long)]
    pub blocking: bool,
    /// No messages from osprey on stderr (errors excepted).
    #[arg(long, short)]
    pub quiet: bool,
    /// Backends, tags and upload timeouts.
    #[command(flatten)]
    pub delivery: Delivery,
}

/// Where profiles are sent, and their tags (see `osprey_upload::config`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Delivery {
    /// Service name [default: DD_SERVICE, OTEL_SERVICE_NAME, PYROSCOPE_APPLICATION_NAME, else the program's name].
    #[arg(long)]
    pub service: Option<String>,
    /// Deployment environment [default: DD_ENV].
    #[arg(long)]
    pub env: Option<String>,
    /// Version of the program [default: DD_VERSION].
    #[arg(long)]
    pub version: Option<String>,
    /// KEY:VALUE tag on every profile (repeatable).
    #[arg(long = "tag", value_name = "KEY:VALUE")]
    pub tags: Vec<String>,
    /// Send to a Datadog agent [default URL: DD_TRACE_AGENT_URL, else http://$DD_AGENT_HOST:$DD_TRACE_AGENT_PORT, else http://localhost:8126].
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub datadog: Option<String>,
    /// Send to Grafana Pyroscope [default URL: PYROSCOPE_SERVER_ADDRESS].
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub pyroscope: Option<String>,
    /// Send to an OTLP/HTTP collector [default URL: OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1development/profiles, else http://localhost:4318].
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub otlp: Option<String>,
    /// Seconds each upload request may take.
    #[arg(long, value_name = "S")]
    pub upload_timeout: Option<f64>,
    /// Seconds to wait at exit for the last uploads.
    #[arg(long, value_name = "S")]
    pub exit_wait: Option<f64>,
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
    /// Sample a running process from outside until it exits, --duration or Ctrl-C
    /// (CPython: its Python stacks; any other: native stacks with perf_event_open).
    Attach {
        #[arg(long)]
        pid: i32,
        /// Stop after this many seconds.
        #[arg(long)]
        duration: Option<f64>,
        #[command(flatten)]
        sampling: Sampling,
    },
    /// Print every thread's stack now: id, name, state, system call, frames.
    /// Each thread is stopped (ptrace) for the moment its registers and
    /// stack top are copied.
    Dump {
        #[arg(long)]
        pid: i32,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// CPython: the native frames too, after the Python frames (other processes: always native).
        #[arg(long)]
        native: bool,
    },
    /// A live view of the functions using CPU in a process (--pid) or a command (-- CMD),
    /// refreshed every --interval; one table per interval when stdout is not a terminal.
    Top(top::Args),
    /// Top functions, folded stacks, speedscope or pprof, a flamegraph and
    /// a timeline from profile files.
    Report {
        /// Profile files (default: every one in ./profiles).
        files: Vec<PathBuf>,
        /// Rows to print.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// What to print.
        #[arg(long, value_enum, default_value = "top")]
        format: report::Format,
        /// Write it to this file instead of stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// speedscope: one profile per thread or per process.
        #[arg(long, value_enum, default_value = "thread")]
        group: report::Group,
        /// Write an SVG flamegraph here.
        #[arg(long)]
        flamegraph: Option<PathBuf>,
        /// Write an HTML timeline here (profiles recorded with OSPREY_TIMELINE=1).
        #[arg(long)]
        timeline: Option<PathBuf>,
        /// Sample type to rank by, e.g. cpu, wall, samples (default: cpu when present).
        #[arg(long)]
        sample_index: Option<String>,
        /// Only samples of this process id (repeatable).
        #[arg(long)]
        pid: Vec<i64>,
        /// Only samples of processes with this name (repeatable).
        #[arg(long)]
        process: Vec<String>,
        /// Only samples taken in this span or under this local root span (decimal or hex; repeatable).
        #[arg(long, value_name = "ID")]
        span: Vec<String>,
        /// Only samples of this trace (decimal or hex; repeatable).
        #[arg(long, value_name = "ID")]
        trace: Vec<String>,
    },
    /// Functions ranked by the change of their share between two runs.
    Diff {
        /// The base run: a profile file or a directory of them.
        base: PathBuf,
        /// The new run: a profile file or a directory of them.
        new: PathBuf,
        /// Rows to print (0: all).
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Rank by cumulative value (function and callees) instead of flat.
        #[arg(long)]
        cum: bool,
        /// Write a differential SVG flamegraph here (red: grew, blue: shrank).
        #[arg(long)]
        flamegraph: Option<PathBuf>,
        /// Sample type to compare, e.g. cpu, wall, samples (default: cpu when present).
        #[arg(long)]
        sample_index: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Exec { sampling, children, cmd } => exec::exec(&sampling, children, &cmd),
        Cmd::Attach { pid, duration, sampling } => attach::attach(pid, duration, &sampling),
        Cmd::Dump { pid, json, native } => dump::run(pid, json, native),
        Cmd::Top(args) => top::run(&args),
        Cmd::Report {
            files,
            top,
            format,
            output,
            group,
            flamegraph,
            timeline,
            sample_index,
            pid,
            process,
            span,
            trace,
        } => report::Filter::new(pid, process, &span, &trace).map_err(Failure::usage).and_then(|filter| {
            let o = report::Options { files, top, format, output, flamegraph, timeline, sample_index, group, filter };
            report::run(&o).map(|_| 0).map_err(Failure::from)
        }),
        Cmd::Diff { base, new, top, cum, flamegraph, sample_index } => {
            diff::run(&base, &new, top, cum, flamegraph.as_deref(), sample_index.as_deref())
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

impl From<report::ReportError> for Failure {
    fn from(e: report::ReportError) -> Self {
        Failure { message: e.to_string(), code: e.exit_code() }
    }
}
