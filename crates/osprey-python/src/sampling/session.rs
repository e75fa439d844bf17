//! A sampling session: passes at the requested rate until stopped, a
//! profile flushed every period.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use osprey_pprof::ProfileData;

use super::aggregate::Aggregator;
use super::native;
use super::sampler::{self, Sampler};
use crate::error::Error;
use crate::remote::process;
use crate::target::open_target;
use crate::target::thread_states::Method;

/// Sampling options for [`attach`] and [`attach_with_sink`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Samples per second per thread.
    pub hz: u32,
    /// Flush a profile file every `period`.
    pub period: Duration,
    /// Directory profile files are written to (by [`attach`]).
    pub out_dir: PathBuf,
    /// Stop after this long (None: until `stop` or the process exits).
    pub duration: Option<Duration>,
    /// Force one thread-state discovery method (tests); None = combined.
    pub method: Option<Method>,
    /// Samples carry their time (a timeline).
    pub timeline: bool,
    /// Mixed native and Python stacks (see [`native`]).
    pub native: bool,
    /// Stop each running thread for the moment its stack is read (see
    /// [`crate::remote::ptrace`]): stacks that change faster than they can be copied are
    /// read whole, at a cost per sample.
    pub blocking: bool,
    /// The process was started to be profiled (`osprey exec`): a thread
    /// first sampled young is charged the CPU it used since it started.
    /// Otherwise (attaching to a running process) that is done only for
    /// threads that start after the sampler: the profile covers the time
    /// it was attached, not what ran before.
    pub from_start: bool,
    /// Periods end on this grid (a `--children` tree's spool; see
    /// `osprey_pprof::periods`) instead of every `period` from the start.
    pub grid: Option<osprey_pprof::periods::Grid>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hz: 100,
            period: Duration::from_secs(60),
            out_dir: PathBuf::from("."),
            duration: None,
            method: None,
            timeline: false,
            native: false,
            blocking: false,
            from_start: false,
            grid: None,
        }
    }
}

/// What a sampling session did, returned by [`attach`].
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Thread samples recorded.
    pub samples: u64,
    /// Profile files written.
    pub files: Vec<PathBuf>,
    /// Stacks kept with a `[truncated]` frame (changing while read on every
    /// retry, looping, or too deep).
    pub torn: u64,
    /// Stacks re-read because they changed while being read.
    pub retries: u64,
    /// Sampling passes requested (hz * elapsed time).
    pub passes_requested: u64,
    /// Sampling passes done.
    pub passes_done: u64,
    /// The target's Python version, e.g. "3.12.1".
    pub version: String,
    /// Distinct OS threads sampled at least once.
    pub threads_seen: usize,
    /// Errors from handing profiles to the sink (profiles lost).
    pub flush_errors: Vec<String>,
    /// Non-fatal problems worth telling the user (e.g. ptrace refused).
    pub warnings: Vec<String>,
    /// How `--native` merges went.
    pub native: Option<native::NativeStats>,
    /// What copying stacks at the sampling interrupt did (None: not used).
    pub interrupt: Option<super::interrupt::InterruptStats>,
    /// What reading OpenTelemetry spans did.
    pub spans: super::otel_context::SpanStats,
}

/// Samples `pid` until `stop`, `opts.duration` or the process exits,
/// writing a profile every `opts.period` and at the end.
pub fn attach(pid: i32, opts: &Options, stop: &AtomicBool) -> Result<Summary, Error> {
    let dir = opts.out_dir.clone();
    attach_with_sink(pid, opts, stop, &mut |data| osprey_pprof::write_profile(&dir, data).map(Some))
}

/// [`attach`] with the flushed profiles handed to `sink` (which returns the
/// file it wrote, if any).
pub fn attach_with_sink(
    pid: i32,
    opts: &Options,
    stop: &AtomicBool,
    sink: &mut dyn FnMut(&ProfileData) -> io::Result<Option<PathBuf>>,
) -> Result<Summary, Error> {
    let target = open_target(pid)?;
    let mut summary = Summary { version: target.version.to_string(), ..Default::default() };
    for n in &target.notes {
        eprintln!("osprey: {n}");
        summary.warnings.push(n.clone());
    }
    if let Some(e) = &target.pthread_error {
        summary.warnings.push(format!("TSS method unavailable: {e}"));
    }
    let mut sampler = Sampler::new(target, opts.method)?;
    if !opts.from_start {
        // Thread starts are stamped in clock ticks (10 ms, rounded down):
        // one tick of slack charges every thread started after attaching.
        sampler.since = process::uptime().map(|u| u - 0.01);
    }
    if opts.native {
        let n = native::Native::new(pid, &sampler.target.module.path);
        if n.modules() == 0 {
            return Err(Error::Unsupported(format!(
                "--native: no module of process {pid} could be read for unwinding"
            )));
        }
        sampler.native = Some(n);
    }
    sampler.blocking = opts.blocking;
    if !opts.blocking && !opts.native {
        let interval_ns = 1_000_000_000 / u64::from(opts.hz.clamp(1, 10_000));
        match super::interrupt::Interrupt::new(&sampler.target.layout, interval_ns) {
            Ok(i) => sampler.interrupt = Some(i),
            Err(e) => summary.warnings.push(format!(
                "running threads' stacks read while they run, not at the sampling interrupt ({e}): \
                 calls of a few microseconds may be charged to their neighbours; run as root for exact stacks"
            )),
        }
    }
    let started = Instant::now();
    sampler.wait_initialized(Duration::from_secs(5));

    let hz = opts.hz.clamp(1, 10_000);
    let interval = Duration::from_nanos(1_000_000_000 / hz as u64);
    let interval_ns = interval.as_nanos() as i64;
    sampler.interval_ns = interval_ns;
    let mut agg = Aggregator::new(pid, interval_ns, &sampler);
    agg.timeline = opts.timeline;
    let mut next = Instant::now();
    let period_end = || Instant::now() + opts.grid.map_or(opts.period, |g| g.until_next_end());
    let mut next_flush = period_end();
    let loop_start = Instant::now();
    let mut rng = (std::process::id() as u64) << 32 | pid as u64 | 1;
    let mut flush = |agg: &mut Aggregator, summary: &mut Summary| {
        let data = agg.take();
        if data.samples.is_empty() {
            return;
        }
        match sink(&data) {
            Ok(Some(p)) => summary.files.push(p),
            Ok(None) => {}
            Err(e) => {
                eprintln!("osprey-python: writing profile failed: {e}");
                summary.flush_errors.push(e.to_string());
            }
        }
        // osprey's own process: no thread of it stops inside malloc.
        osprey_pprof::symbolize::release_free_heap();
    };
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        match sampler.sample() {
            Ok(samples) => agg.add(&samples, interval_ns, sampler.cpu_clock),
            Err(sampler::Gone) => break,
        }
        summary.passes_done += 1;
        if Instant::now() >= next_flush {
            flush(&mut agg, &mut summary);
            next_flush = period_end();
        }
        // Intervals are uniform in [interval/2, 3*interval/2): the mean rate
        // is `hz`, and a workload with a period near a multiple of the
        // interval is not seen at the same phase every time (aliasing).
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        next += interval / 2 + Duration::from_nanos(rng % interval.as_nanos().max(1) as u64);
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else if now - next > interval * 4 {
            // Fell behind (the machine is busy): skip, don't burst.
            next = now;
        }
    }
    flush(&mut agg, &mut summary);
    summary.passes_requested = (loop_start.elapsed().as_secs_f64() * hz as f64).round() as u64;
    summary.samples = sampler.stats.samples;
    summary.torn = sampler.stats.torn;
    summary.retries = sampler.stats.retries;
    summary.threads_seen = sampler.stats.threads_seen.len();
    if let Some(e) = &sampler.clock_error {
        summary.warnings.push(format!(
            "per-thread CPU clocks unavailable ({e}): CPU time goes to runnable threads, preempted ones included"
        ));
    }
    summary.native = sampler.native.as_ref().map(|n| n.stats);
    if let Some(e) = sampler.native.as_ref().and_then(|n| n.shot_error.as_ref()) {
        summary
            .warnings
            .push(format!("--native: a thread's stack could not be sampled ({e}): it was stopped for its reads"));
    }
    summary.interrupt = sampler.interrupt.as_ref().map(|i| i.stats);
    if let Some(e) = sampler.interrupt.as_ref().and_then(|i| i.error.as_ref()) {
        summary
            .warnings
            .push(format!("a thread's sampling interrupt could not be armed ({e}): its stack was read while it ran"));
    }
    if let Some(e) = sampler.interrupt.as_ref().and_then(|i| i.spans_error.as_ref()).filter(|_| sampler.spans.found()) {
        summary.warnings.push(format!(
            "spans not copied at the sampling interrupt ({e}): threads in spans were read while they ran"
        ));
    }
    summary.spans = sampler.spans.stats.clone();
    if let Some(n) = &sampler.spans.note {
        summary.warnings.push(n.clone());
    }
    if let Some(e) = &sampler.last_stop_error {
        summary.warnings.push(format!(
            "{} reads without stopping the thread (it could not be stopped; last: {e})",
            sampler.stop_failed
        ));
    }
    if let Some(e) = &sampler.disc.last_ptrace_error {
        summary
            .warnings
            .push(format!(
                "{} threads' thread-local state could not be read with ptrace (last: {e}); their Python stacks were matched through the interpreter's thread list instead",
                sampler.disc.ptrace_errors
            ));
    }
    Ok(summary)
}
