//! `osprey top --pid PID` and `osprey top -- CMD ARGS`: a live view of the
//! functions using CPU, own and total, over the last interval and since the
//! start, like `py-spy top` and `perf top`.
//!
//! The target is sampled from outside, as `attach` does ([`sampling`]):
//! perf_event_open for native code, `osprey-python` for CPython. A command
//! is started as osprey's child and sampled the same way, not under the
//! exec agent: the agent delivers profiles to files or backends a period at
//! a time, while sampling from outside gives this process the stacks
//! themselves, every interval, for both kinds of target; and the command's
//! output, signals and exit status stay its own (osprey exits with them).
//!
//! On a terminal (stdin and stdout both) the screen is redrawn every
//! interval and keys change the view ([`terminal`]); otherwise one table
//! per interval is printed (as `top -b`), until `--duration`, Ctrl-C or
//! the target's exit.

mod sampling;
mod signals;
mod table;
mod terminal;

use crate::{supervise, target, Failure};
use sampling::Event;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use table::{Sort, Stats, View};

/// Rows of the table when stdout is not a terminal and `--rows` is not given.
const BATCH_ROWS: usize = 20;
/// Lines above and below the table on a terminal.
const CHROME: usize = 6;
/// How long the batch view waits, once stopped, for the sampler's last
/// interval (the sampler notices `stop` within its 100 ms refresh).
const FINAL_WAIT: Duration = Duration::from_secs(2);

/// `osprey top`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The process to watch (else CMD is started and watched).
    #[arg(long)]
    pid: Option<i32>,
    /// Seconds between two refreshes.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    interval: f64,
    /// Stop after this many seconds (a command keeps running; osprey waits for it).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Samples per CPU-second per thread (1-10000).
    #[arg(long, default_value_t = 100)]
    hz: u32,
    /// Rank by own time (the function itself) or total time (with its callees).
    #[arg(long, value_enum, default_value = "own")]
    sort: Sort,
    /// Rows of the table [default: the terminal's height, else 20].
    #[arg(long)]
    rows: Option<usize>,
    /// CPython: the native frames too (sampled as `attach --native` does).
    #[arg(long)]
    native: bool,
    /// The program to start and watch, and its arguments.
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// Seconds as a positive duration, or a usage error naming `flag`.
fn seconds(flag: &str, v: f64) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Failure::usage(format!("{flag} {v} must be a positive number of seconds")))
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let interval = seconds("--interval", a.interval)?;
    let duration = a.duration.map(|d| seconds("--duration", d)).transpose()?;
    if !(1..=10_000).contains(&a.hz) {
        return Err(Failure::usage(format!("--hz {} must be within 1-10000", a.hz)));
    }
    let stop = signals::install();
    let (pid, child) = match (a.pid, a.cmd.is_empty()) {
        (Some(pid), true) => {
            target::check(pid)?;
            (pid, false)
        }
        (None, false) => {
            let c = std::process::Command::new(&a.cmd[0]).args(&a.cmd[1..]).spawn().map_err(|e| Failure {
                message: format!("{}: {e}", a.cmd[0]),
                code: if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 },
            })?;
            (c.id() as i32, true)
        }
        _ => return Err(Failure::usage("top: give either --pid PID or -- CMD ARGS")),
    };
    let process = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim_end().to_string();
    let (tx, rx) = mpsc::channel();
    let settings = sampling::Settings { pid, hz: a.hz, interval, native: a.native };
    let sampler = sampling::start(settings, stop, tx);
    let mut view = View { sort: a.sort, thread: None, rows: a.rows.unwrap_or(BATCH_ROWS) };
    let what = format!("pid {pid} ({process})");
    let watch = Watch { rx: &rx, stop, deadline: duration.map(|d| Instant::now() + d) };
    let interactive = terminal::is_tty(0) && terminal::is_tty(1);
    // A terminal that refuses its settings gets the tables instead.
    let raw = if interactive { terminal::Raw::enter(0).ok() } else { None };
    let ended = match raw {
        Some(raw) => {
            let rows = terminal::size(1).0.saturating_sub(CHROME).max(1);
            view.rows = a.rows.unwrap_or(rows);
            watch.interactive(&raw, &mut view, &what)
            // `raw` dropped here: the terminal is restored before anything else is printed.
        }
        None => watch.batch(&view, &what),
    };
    stop.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    let exited = matches!(ended, End::Exited);
    let failed = match ended {
        End::Failed(why) => Some(why),
        _ => None,
    };
    if !child {
        if let Some(why) = failed {
            return Err(Failure::from(why));
        }
        if exited {
            eprintln!("osprey: pid {pid} exited");
        }
        return Ok(0);
    }
    if let Some(why) = failed {
        eprintln!("osprey: top: {why}");
    }
    if !supervise::has_exited(pid) && interactive {
        eprintln!("osprey: waiting for {} (pid {pid}) to exit", a.cmd[0]);
    }
    // Signals a process sent to osprey go on to the command (the terminal's
    // reached it already), until it exits.
    while !supervise::has_exited(pid) {
        signals::relay(pid);
        std::thread::sleep(Duration::from_millis(20));
    }
    signals::relay(pid);
    Ok(supervise::end_like(supervise::reap(pid)))
}

/// Why the view ended.
enum End {
    /// The target exited.
    Exited,
    /// `q`, Ctrl-C or `--duration`.
    Stopped,
    /// The sampler could not start or failed: why.
    Failed(String),
}

/// The loop's inputs: the sampler's events, Ctrl-C, the deadline.
struct Watch<'a> {
    rx: &'a mpsc::Receiver<Event>,
    stop: &'static std::sync::atomic::AtomicBool,
    deadline: Option<Instant>,
}

impl Watch<'_> {
    fn over(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// One table per interval on stdout; at `--duration` or Ctrl-C, one
    /// more for the samples since the last table (the sampler hands them
    /// over before it ends), so no sample of the run goes unshown.
    fn batch(&self, view: &View, what: &str) -> End {
        let mut stats = Stats::default();
        let mut last_call: Option<Instant> = None;
        loop {
            if last_call.is_none() && self.over() {
                self.stop.store(true, Ordering::SeqCst);
                last_call = Some(Instant::now());
            }
            if last_call.is_some_and(|t| t.elapsed() > FINAL_WAIT) {
                return End::Stopped;
            }
            match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Event::Interval(iv)) => {
                    stats.add(&iv);
                    let mut text = table::render(&stats, view, what).join("\n");
                    text.push_str("\n\n");
                    // A closed stdout (`| head`) ends the view, not the target.
                    if std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes()).is_err() {
                        return End::Stopped;
                    }
                }
                Ok(Event::Ended(Some(why))) if stats.intervals == 0 => return End::Failed(why),
                Ok(Event::Ended(_)) | Err(mpsc::RecvTimeoutError::Disconnected) if last_call.is_some() => {
                    return End::Stopped
                }
                Ok(Event::Ended(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => return End::Exited,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// The screen redrawn at each interval and key.
    fn interactive(&self, raw: &terminal::Raw, view: &mut View, what: &str) -> End {
        let mut stats = Stats::default();
        let mut exited = false;
        let draw = |stats: &Stats, view: &View, exited: bool| {
            let mut lines = table::render(stats, view, what);
            lines.push(String::new());
            lines.push(if exited {
                format!("{what} exited. q: quit")
            } else {
                "q: quit   o/t: sort by own/total   Tab,n/p: next/previous thread   a: all threads".into()
            });
            raw.draw(&lines);
        };
        draw(&stats, view, exited);
        loop {
            if self.over() {
                return End::Stopped;
            }
            if let Some(k) = raw.key(Duration::from_millis(50)) {
                let threads = stats.threads();
                let at = view.thread.and_then(|t| threads.iter().position(|x| *x == t));
                match k {
                    terminal::Key::Quit => return if exited { End::Exited } else { End::Stopped },
                    terminal::Key::SortOwn => view.sort = Sort::Own,
                    terminal::Key::SortTotal => view.sort = Sort::Total,
                    terminal::Key::AllThreads => view.thread = None,
                    terminal::Key::NextThread => {
                        view.thread = match at {
                            None => threads.first().copied(),
                            Some(i) => threads.get(i + 1).copied(),
                        }
                    }
                    terminal::Key::PrevThread => {
                        view.thread = match at {
                            None => threads.last().copied(),
                            Some(i) => i.checked_sub(1).map(|i| threads[i]),
                        }
                    }
                }
                draw(&stats, view, exited);
            }
            while let Ok(ev) = self.rx.try_recv() {
                match ev {
                    Event::Interval(iv) => stats.add(&iv),
                    Event::Ended(Some(why)) if stats.intervals == 0 => return End::Failed(why),
                    // The last figures stay on screen until `q`.
                    Event::Ended(_) => exited = true,
                }
                draw(&stats, view, exited);
            }
        }
    }
}
