//! The collector: osprey's one background thread. It scans for threads
//! nobody announced, keeps the unwind tables current (`crate::unwind_tables`),
//! drains the per-thread sample rings every drain interval,
//! and each period rotates storage, aggregates and writes a profile; it also
//! writes the profile a termination signal asks for (`crate::shutdown`). It
//! never runs on the signal path and is never sampled itself. It sleeps on
//! the futex word `SHUTDOWN.wake`, which every request bumps ([`wake`]).
//! A stop that comes before its first deadline does its work instead ([`Claim`]).

mod aggregate;
mod heap;
mod own;

pub use aggregate::{
    Aggregator, Kinds, FRAME_AGENT, FRAME_ALLOC_LOST, FRAME_BLOCKED, FRAME_RING_FULL, FRAME_STORAGE_FULL,
    FRAME_TRUNCATED, FRAME_UNREGISTERED,
};
pub(crate) use own::{forget_inherited as forget_inherited_own, setup as own_setup};

use crate::config::Config;
use crate::discovery::{Discovery, Unsampled};
use crate::dispositions::Installed;
use crate::record::{SampleKind, RING_CAPACITY};
use crate::registry::Registry;
use crate::signal::shutdown::{futex_wait, futex_wake, SHUTDOWN};
use crate::signal::sys;
use crate::storage::CallTraceStorage;
use crate::{shutdown, takeover, threads, unwind_tables};
use osprey_pprof as pprof;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// What the collector thread and the caller of `stop`/`flush` share.
#[derive(Default)]
pub(crate) struct Control {
    /// Set by `stop`: write the last profile and exit.
    pub stop: bool,
    /// Set by `flush`: write a profile now; cleared when written.
    pub flush_requested: bool,
    /// Set with a flush request at `_exit`: the flush counts as done once
    /// the backends have what is queued, or at this instant.
    pub deliver_by: Option<std::time::Instant>,
    /// The file of the last flush, if it wrote one.
    pub last_file: Option<PathBuf>,
    /// Every file written so far.
    pub files: Vec<PathBuf>,
    /// Set when the collector thread has finished.
    pub ended: bool,
}

/// A running agent: its configuration and its collector thread. Leaked when
/// started (handlers and the fork hook may still reach it), never freed.
pub(crate) struct Agent {
    pub cfg: Config,
    pub runtime_id: String,
    pub storage: &'static CallTraceStorage,
    pub control: Arc<(Mutex<Control>, Condvar)>,
    pub thread: Mutex<Option<threads::BareThread>>,
    pub dispositions: Vec<Installed>,
    /// The unwind-table tracker, taken by the collector thread when it starts
    /// (`None` after fork, or when deferred: the collector builds one).
    pub tracker: Mutex<Option<osprey_unwind::scan::Tracker>>,
    /// Without a tracker: how long after start the collector builds one.
    pub tables_after: std::time::Duration,
    /// Who does the collector's work: see [`Claim`].
    pub claim: Claim,
    /// When the agent started; the collector's work counts from it.
    pub started: Started,
}

/// Who runs the collector's work ([`run`]) for an agent. Invariant: it
/// leaves `IDLE` once, by a compare-exchange, and only the winner runs
/// `run`. The collector thread sleeps until its first deadline before
/// claiming; a stop that comes first claims and writes the last profile on
/// the stopping thread, so a process shorter than that first sleep never
/// wakes its collector (no thread switch, no malloc arena for it).
#[derive(Default)]
pub(crate) struct Claim(std::sync::atomic::AtomicU8);

impl Claim {
    const IDLE: u8 = 0;
    const COLLECTOR: u8 = 1;
    const STOPPER: u8 = 2;

    fn take(&self, by: u8) -> bool {
        use std::sync::atomic::Ordering::AcqRel;
        self.0.compare_exchange(Self::IDLE, by, AcqRel, std::sync::atomic::Ordering::Acquire).is_ok()
    }
}

/// The agent's start as the collector's work counts from it: the first
/// profile's start time and the first deadlines.
#[derive(Clone, Copy)]
pub(crate) struct Started {
    at: Instant,
    realtime_ns: u64,
    mono_ns: u64,
    /// `Discovery::started`'s mark.
    uncharged_ns: Option<i64>,
}

impl Started {
    pub(crate) fn now() -> Started {
        Started {
            at: Instant::now(),
            realtime_ns: sys::realtime_ns(),
            mono_ns: sys::monotonic_ns(),
            uncharged_ns: crate::discovery::uncharged_ns(),
        }
    }
}

/// Starts the collector thread of `agent`; returns once it is created. It
/// marks itself internal (never primed, never sampled) before it runs, and
/// allocates nothing before its first deadline (see [`Claim`]).
pub(crate) fn spawn(agent: &'static Agent) -> std::io::Result<()> {
    let h = threads::spawn_bare(agent)?;
    *agent.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    Ok(())
}

impl threads::Bare for Agent {
    const NAME: &'static std::ffi::CStr = c"osprey-collect";

    fn run(&'static self) {
        /// Marks the collector ended when dropped: also if `run` panics.
        struct Ended(&'static Agent);
        impl Drop for Ended {
            fn drop(&mut self) {
                let (lock, cv) = &*self.0.control;
                lock.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
                cv.notify_all();
            }
        }
        let _ended = Ended(self);
        let schedule = Schedule::from(&self.cfg, self.started);
        first_wait(self, &schedule);
        if self.claim.take(Claim::COLLECTOR) {
            run(self, schedule, own::OwnCpu::default());
        }
    }
}

/// For a stop: claims the collector's work if its thread has not, and then
/// writes the last profile on the calling thread (sampling already off),
/// its CPU counted as osprey's. Returns false if the collector has it.
pub(crate) fn stop_here(agent: &'static Agent) -> bool {
    if !agent.claim.take(Claim::STOPPER) {
        return false;
    }
    run(agent, Schedule::from(&agent.cfg, agent.started), own::OwnCpu::with_current());
    let (lock, cv) = &*agent.control;
    lock.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
    cv.notify_all();
    true
}

/// The collector's deadlines, from the agent's start.
struct Schedule {
    born: Instant,
    next_scan: Instant,
    next_drain: Instant,
    next_flush: Instant,
    next_takeover_check: Instant,
}

impl Schedule {
    fn from(cfg: &Config, started: Started) -> Schedule {
        let now = started.at;
        // The first scan after one interval: a process that ends sooner is
        // checked once, by the final flush, rather than listed at start too. A
        // process the command started (`--children`) has it when its unwind
        // tables come: most end before, and threads created without
        // `pthread_create` are few there (their CPU is still counted at exit).
        let first_scan = cfg.scan_interval.max(unwind_tables::deferred());
        Schedule {
            born: now,
            next_scan: now + first_scan,
            next_drain: now + drain_interval(cfg),
            next_flush: now + cfg.period_grid.map_or(cfg.period, |g| g.until_next_end()),
            next_takeover_check: now + TAKEOVER_CHECK,
        }
    }

    fn first(&self) -> Instant {
        self.next_scan.min(self.next_drain).min(self.next_flush).min(self.next_takeover_check)
    }
}

/// Sleeps until the first deadline or a request (a flush, a stop, a
/// termination signal), allocating nothing. Not with wall time on: its
/// sampler ticks from the start.
fn first_wait(agent: &Agent, schedule: &Schedule) {
    if agent.cfg.wall {
        return;
    }
    loop {
        // Read before looking for requests: one posted after this bumps it.
        let seq = SHUTDOWN.wake.load(std::sync::atomic::Ordering::Acquire);
        let requested = {
            let g = agent.control.0.lock().unwrap_or_else(|e| e.into_inner());
            g.stop || g.flush_requested
        };
        if requested || shutdown::pending_request().is_some() || Instant::now() >= schedule.first() {
            return;
        }
        sleep_until(seq, schedule.first());
    }
}

/// Sleeps on `SHUTDOWN.wake` until `deadline`, or at once if the word
/// moved past `seq` (a request posted since it was read).
fn sleep_until(seq: u32, deadline: Instant) {
    // At least 1 ns: a zero timeout would mean no limit.
    let ns = deadline.saturating_duration_since(Instant::now()).as_nanos().clamp(1, u64::MAX as u128) as u64;
    futex_wait(&SHUTDOWN.wake, seq, ns);
}

/// Wakes the collector after a request was posted (a flush or stop flag set
/// in [`Control`]).
pub(crate) fn wake() {
    SHUTDOWN.wake.fetch_add(1, std::sync::atomic::Ordering::Release);
    futex_wake(&SHUTDOWN.wake);
}

fn run(agent: &'static Agent, schedule: Schedule, mut own: own::OwnCpu) {
    let started = agent.started;
    let Some(reg) = Registry::get() else { return };
    let storage = agent.storage;
    let cfg = &agent.cfg;
    let mut discovery = Discovery::default();
    discovery.started(started.uncharged_ns);
    let timeline = cfg.upload.as_ref().is_some_and(|u| u.timeline);
    let mut aggregator = Aggregator::new(Kinds { wall: cfg.wall, alloc: cfg.alloc, timeline })
        .since(started.realtime_ns, started.mono_ns);
    // In a forked child there is no tracker: the parent's published tables
    // stay valid here (same mappings), and a new tracker is built only once
    // the child has lived a while, so short-lived children (a shell's
    // subshells) do not pay for compiling every module's tables again.
    let mut tables = agent.tracker.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Schedule { born, mut next_scan, mut next_drain, mut next_flush, mut next_takeover_check } = schedule;
    let mut publish_context_after = crate::context::process_ctx::take_later();
    // Uploads (if configured) run on threads of their own; see osprey_upload.
    let mut delivery = cfg.upload.clone().map(|up| {
        let (id, pid, native) = (agent.runtime_id.clone(), sys::getpid(), osprey_upload::Language::Native);
        let meta = match up.out_spool && !up.uploads() {
            true => osprey_upload::Meta::in_spool(id, pid, native),
            false => osprey_upload::Meta::new(id, pid, native),
        };
        osprey_upload::Delivery::with_spawner(up, meta, cfg.period, spawn_upload)
    });
    let mut report = osprey_upload::RunReport::default();
    let (lock, cv) = &*agent.control;
    let drain_interval = drain_interval(cfg);
    // Wall time: blocked threads sampled here, running ones through their CPU clocks.
    let mut wall = cfg.wall.then(|| crate::wall::sampler::Sampler::new(cfg.wall_hz, cfg.wall_threads));
    let mut next_wall = born;
    loop {
        // Read before looking for work: a request posted after this bumps it,
        // and the wait below returns at once.
        let seq = SHUTDOWN.wake.load(std::sync::atomic::Ordering::Acquire);
        match &mut tables {
            Some(t) => unwind_tables::refresh(t),
            None if born.elapsed() >= agent.tables_after => tables = unwind_tables::fresh(),
            None => unwind_tables::refresh_code(),
        }
        if publish_context_after.is_some_and(|after| born.elapsed() >= after) {
            publish_context_after = None;
            if let Err(e) = crate::context::process_ctx::publish() {
                crate::say!("osprey: OpenTelemetry process context not published: {e}");
            }
        }
        let now = Instant::now();
        if now >= next_scan {
            let unannounced = discovery.scan(reg);
            aggregator.note_threads(&unannounced);
            reg.grow_if_low();
            if let Some(e) = crate::cpu_clock::take_perf_refusal() {
                crate::say!("osprey: a perf CPU clock was refused ({e}); POSIX timers serve those threads, with fewer samples above {} Hz and the same CPU time", crate::cpu_clock::TIMER_MAX_HZ);
            }
            next_scan = now + discovery.next_interval(cfg.scan_interval);
        }
        if let Some(w) = wall.as_mut().filter(|_| now >= next_wall) {
            w.tick(reg, &mut |t| {
                aggregator.add_stack(t.tid, t.frames, t.truncated, SampleKind::Wall, t.ns, 1, t.state, &t.context)
            });
            next_wall = Instant::now() + w.until_due();
        }
        if wall.as_ref().is_some_and(|w| w.is_stopped()) {
            wall = None;
        }
        if now >= next_drain {
            aggregator.drain(reg);
            drain_perf(&mut discovery, &mut aggregator, reg);
            let perf_every = discovery.perf().drain_every().unwrap_or(drain_interval);
            next_drain = now + drain_interval.min(perf_every);
        }
        if now >= next_takeover_check {
            takeover::check_dispositions();
            next_takeover_check = now + TAKEOVER_CHECK;
        }
        let (stop, flush_now, deliver_by) = {
            let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
            (g.stop, g.flush_requested, g.deliver_by.take())
        };
        if stop {
            break;
        }
        let terminating = shutdown::pending_request().is_some();
        if flush_now || terminating || now >= next_flush {
            drain_perf(&mut discovery, &mut aggregator, reg);
            aggregator.add_unsampled(discovery.take_unsampled());
            let file = write(agent, &mut aggregator, reg, storage, delivery.as_ref(), &mut own, &mut report);
            // A process may end with `_exit` right after this flush: the report is current.
            if let (Some(by), Some(d)) = (deliver_by, delivery.as_ref()) {
                d.wait_delivered(by);
            }
            leave_report(agent, &mut report, delivery.as_ref().map(|d| d.stats()));
            let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
            g.flush_requested = false;
            g.last_file = file.clone();
            g.files.extend(file);
            cv.notify_all();
            drop(g);
            if terminating {
                shutdown::request_served();
            }
            // A periodic profile's symbolizer caches go back to the kernel.
            // Never for a last profile: its requester may be stopped holding
            // a malloc arena lock, which the trim would wait on.
            if !(terminating || flush_now) && shutdown::pending_request().is_none() {
                pprof::symbolize::release_free_heap();
            }
            next_flush = next_period_end(cfg);
        }
        let mut wake = next_scan.min(next_drain).min(next_flush).min(next_takeover_check);
        if wall.is_some() {
            wake = wake.min(next_wall);
        }
        sleep_until(seq, wake);
    }
    // Final flush: sampling is already off and no handler is in flight (see `profiler::stop`).
    discovery.check_now(reg);
    discovery.perf().close_all();
    drain_perf(&mut discovery, &mut aggregator, reg);
    aggregator.add_unsampled(discovery.take_unsampled());
    let file = write(agent, &mut aggregator, reg, storage, delivery.as_ref(), &mut own, &mut report);
    if let Some(t) = tables {
        unwind_tables::park(t);
    }
    lock.lock().unwrap_or_else(|e| e.into_inner()).files.extend(file);
    // Bounded: at most the configured exit wait, whatever the backends do.
    let uploads = delivery.as_mut().map(|d| d.finish());
    leave_report(agent, &mut report, uploads);
}

/// When the period that runs now ends: on the spool's grid in a tree, else
/// a period from now.
fn next_period_end(cfg: &Config) -> Instant {
    Instant::now() + cfg.period_grid.map_or(cfg.period, |g| g.until_next_end())
}

/// Adds the samples of the threads that block the sampling signal
/// (`crate::blocked`): CPU, and the running wall time pending for them.
fn drain_perf(discovery: &mut Discovery, aggregator: &mut Aggregator, reg: &Registry) {
    let unstacked = discovery.perf().drain(reg, &mut |t| {
        aggregator.add_stack(t.tid, t.frames, t.truncated, SampleKind::Cpu, t.cpu_ns, t.count, 0, &t.context);
        if t.wall_ns > 0 {
            let running = crate::wall::thread_state::RUNNING;
            aggregator.add_stack(t.tid, t.frames, t.truncated, SampleKind::Wall, t.wall_ns, 1, running, &t.context);
        }
    });
    aggregator.add_unsampled(unstacked.into_iter().map(|(tid, ns)| (Unsampled::Blocked(tid), ns)).collect());
}

/// Leaves `report` (with the backends' counters) where `osprey exec` reads
/// it, if it asked. Best effort: without it, `exec` counts the files it finds.
fn leave_report(
    agent: &Agent,
    report: &mut osprey_upload::RunReport,
    uploads: Option<Vec<osprey_upload::BackendStats>>,
) {
    let Some(dir) = &agent.cfg.status_dir else { return };
    report.uploads = uploads.unwrap_or_default();
    let _ = if agent.cfg.spool {
        report.append_to_spool(&agent.cfg.out_dir, sys::getpid(), &agent.runtime_id)
    } else {
        report.write(dir, sys::getpid(), &agent.runtime_id)
    };
}

/// A spool's agent appends to its journal; any other writes files.
fn destination(cfg: &Config) -> pprof::Destination {
    if cfg.spool {
        pprof::Destination::Journal
    } else {
        pprof::Destination::File
    }
}

/// Upload threads are osprey's own: never sampled, their CPU is `[osprey] agent`.
fn spawn_upload(name: String, body: Box<dyn FnOnce() + Send>) -> std::io::Result<std::thread::JoinHandle<()>> {
    threads::spawn_internal(&name, body)
}

/// The samples of a profile: its `samples` values, else one per stack.
fn sample_count(data: &osprey_pprof::ProfileData) -> u64 {
    match data.sample_types.iter().position(|(t, _)| t == "samples") {
        Some(i) => data.samples.iter().map(|s| s.values.get(i).copied().unwrap_or(0).max(0) as u64).sum(),
        None => data.samples.len() as u64,
    }
}

/// How often the collector checks that osprey's signals are still its own.
const TAKEOVER_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a forked child's collector runs on its parent's unwind tables
/// before building its own (which follows its `dlopen`s).
pub(crate) const FORKED_TABLES_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the sample rings are drained: the configured interval, or
/// sooner at high rates, so a busy thread's ring (`RING_CAPACITY` records)
/// is never more than half full between two drains.
fn drain_interval(cfg: &Config) -> std::time::Duration {
    let half_ring = std::time::Duration::from_secs_f64(RING_CAPACITY as f64 / 2.0 / cfg.hz.max(1) as f64);
    // Allocation samples come at the program's allocation rate: 512 records
    // per 10 ms is 25 GiB/s per thread at the default 512 KiB mean.
    let alloc = if cfg.alloc { std::time::Duration::from_millis(10) } else { std::time::Duration::MAX };
    cfg.drain_interval.min(half_ring).min(alloc).max(std::time::Duration::from_millis(1))
}

/// Writes the profile so far. osprey's own CPU is measured last, once the
/// samples are symbolized (most of a profile's cost: a short process's only
/// profile is mostly that), and is carried to the next profile when there
/// is nothing to write: osprey's CPU alone is no profile of the program.
fn write(
    agent: &Agent,
    aggregator: &mut Aggregator,
    reg: &Registry,
    storage: &CallTraceStorage,
    delivery: Option<&osprey_upload::Delivery>,
    own: &mut own::OwnCpu,
    report: &mut osprey_upload::RunReport,
) -> Option<PathBuf> {
    let mut comments = vec![format!("runtime-id={}", agent.runtime_id)];
    comments.push(format!("osprey {} hz={}", env!("CARGO_PKG_VERSION"), agent.cfg.hz));
    if delivery.is_none() && !agent.cfg.spool {
        // The container and pod (a Delivery adds them itself; `osprey exec`
        // adds the tree's to what it merges from a spool): a `/proc` read a period.
        comments.extend(osprey_upload::Deployment::of(0).comments());
    }
    let mut data = aggregator.flush(reg, storage, agent.cfg.period_ns(), comments);
    data.lines = agent.cfg.lines;
    if data.samples.is_empty() {
        return None;
    }
    report.profiles += 1;
    report.samples += sample_count(&data);
    let aggregator = &*aggregator;
    let late = || match own.take() {
        0 => vec![],
        ns => vec![aggregator.own_sample(ns)],
    };
    let written = match delivery {
        Some(d) => d.flush(&data, late),
        None => pprof::write_profile_with(&agent.cfg.out_dir, &data, late, destination(&agent.cfg)).map(Some),
    };
    match written {
        Ok(p) => {
            report.files.extend(p.clone());
            p
        }
        Err(e) => {
            crate::say!("osprey: cannot write profile to {}: {e}", agent.cfg.out_dir.display());
            None
        }
    }
}
