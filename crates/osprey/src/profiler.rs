//! Starting and stopping the agent.
//!
//! One agent per process. `start` installs the handlers, registers the
//! calling thread, and spawns the collector thread (`crate::collector`).
//! Dropping the [`Profiler`] guard stops sampling, waits for handlers in
//! flight, writes the last profile, and restores the signal dispositions.

use crate::collector::{self, Agent, Control};
use crate::config::Config;
use crate::dispositions::{self, Installed};
use crate::error::Error;
use crate::fork_lock::ForkLock;
use crate::ownership::{self, owns_process};
use crate::registry::{Registry, RegistryConfig};
use crate::signal::{self, sys, MAX_FRAMES, STATE};
use crate::storage::{CallTraceStorage, StorageConfig};
use crate::{cpu_clock, shutdown, threads, unwind_tables};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Builds a [`Profiler`].
#[derive(Clone, Debug, Default)]
pub struct Builder {
    cfg: Config,
}

impl Builder {
    /// Replaces the whole configuration.
    pub fn config(mut self, cfg: Config) -> Self {
        self.cfg = cfg;
        self
    }
    /// Samples per CPU-second per thread.
    pub fn hz(mut self, hz: u32) -> Self {
        self.cfg.hz = hz;
        self
    }
    /// Time between profile files.
    pub fn period(mut self, p: Duration) -> Self {
        self.cfg.period = p;
        self
    }
    /// Directory the profiles are written to (created if missing).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cfg.out_dir = dir.into();
        self
    }
    /// Frames kept per stack (1-256).
    pub fn max_depth(mut self, d: usize) -> Self {
        self.cfg.max_depth = d;
        self
    }
    /// Thread records pre-allocated, and whether the pool may grow.
    pub fn threads(mut self, n: usize, grow: bool) -> Self {
        self.cfg.threads = n;
        self.cfg.threads_grow = grow;
        self
    }
    /// Interval of the scan for threads nobody announced.
    pub fn scan_interval(mut self, d: Duration) -> Self {
        self.cfg.scan_interval = d;
        self
    }
    /// File, line and inlined frames from DWARF at each flush (more memory).
    pub fn lines(mut self, on: bool) -> Self {
        self.cfg.lines = on;
        self
    }
    /// Wall-time profile of every thread, running or blocked (`wall/nanoseconds`).
    pub fn wall(mut self, on: bool) -> Self {
        self.cfg.wall = on;
        self
    }
    /// Wall-clock ticks per second (1-1000).
    pub fn wall_hz(mut self, hz: u32) -> Self {
        self.cfg.wall_hz = hz;
        self
    }
    /// At most this many threads sampled per wall tick (1-1024).
    pub fn wall_threads(mut self, n: usize) -> Self {
        self.cfg.wall_threads = n;
        self
    }
    /// Allocation and live-heap profiles (`alloc-samples`, `alloc-space`, `inuse-space`).
    pub fn alloc(mut self, on: bool) -> Self {
        self.cfg.alloc = on;
        self
    }
    /// Mean bytes allocated between two allocation samples.
    pub fn alloc_interval(mut self, bytes: u64) -> Self {
        self.cfg.alloc_interval = bytes;
        self
    }
    /// Call trace storage budget in bytes.
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.cfg.memory_budget = bytes;
        self
    }
    /// Also sends each period's profile to the backends of `upload`
    /// (Datadog, Pyroscope, OTLP), from threads of its own; files are then
    /// written only if `upload.out` is set. See `osprey_upload::UploadConfig`
    /// (`resolve` from flags and the environment, or build one directly).
    pub fn upload(mut self, upload: osprey_upload::UploadConfig) -> Self {
        if let Some(dir) = &upload.out {
            self.cfg.out_dir = dir.clone();
        }
        self.cfg.upload = Some(upload);
        self
    }
    /// Starts sampling every thread of the process.
    pub fn start(self) -> Result<Profiler, Error> {
        collector::own_setup(|| start(self.cfg))
    }
}

/// Running profiler; dropping it stops sampling and writes the last profile.
pub struct Profiler {
    stopped: bool,
}

impl Profiler {
    /// A builder with the default configuration.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Writes a profile now (the period restarts). Returns the file written, if any.
    pub fn flush(&self) -> Result<Option<PathBuf>, Error> {
        request_flush(None)
    }

    /// Stops sampling, writes the last profile, and returns every file written.
    pub fn stop(mut self) -> Vec<PathBuf> {
        self.stopped = true;
        stop(Ending::Stop)
    }

    /// [`Profiler::stop`] for a process that is exiting (the preload
    /// library's `exit` hook): see [`Ending::Exit`].
    pub fn stop_at_exit(mut self) -> Vec<PathBuf> {
        self.stopped = true;
        stop(Ending::Exit)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.stopped {
            stop(Ending::Stop);
        }
    }
}

/// What follows the agent's stop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The program goes on: its dispositions of osprey's signals are restored.
    Stop,
    /// The process is exiting: osprey's handlers stay installed (no-ops once
    /// stopped). Dispositions no longer matter, a signal still pending must
    /// not meet `SIG_DFL` while the rest of `exit` runs, and checking for one
    /// reads every thread's `status` (25 ms for 1000 threads).
    Exit,
}

/// Asks the collector for a profile now and waits for it, at most `limit`.
/// With a limit, the control lock is only tried until the deadline too (the
/// caller may be `abort`/`_exit` on a thread that holds it).
fn request_flush(limit: Option<Duration>) -> Result<Option<PathBuf>, Error> {
    request_flush_delivered(limit, None)
}

/// [`request_flush`]; with `deliver`, the collector also waits (that long at
/// most) for the backends to take what is queued.
fn request_flush_delivered(limit: Option<Duration>, deliver: Option<Duration>) -> Result<Option<PathBuf>, Error> {
    if !owns_process() {
        return Err(Error::NotRunning);
    }
    let agent = current_agent().ok_or(Error::NotRunning)?;
    let deadline = limit.map(|l| std::time::Instant::now() + l);
    let (lock, cv) = &*agent.control;
    let Some(mut g) = lock_until(lock, deadline) else { return Ok(None) };
    g.flush_requested = true;
    g.deliver_by = deliver.map(|d| std::time::Instant::now() + d);
    collector::wake();
    while g.flush_requested {
        g = match deadline {
            None => cv.wait(g).unwrap_or_else(|e| e.into_inner()),
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                cv.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0
            }
        };
    }
    Ok(g.last_file.clone())
}

/// Locks `lock`, giving up at `deadline` (None: waits).
fn lock_until<T>(lock: &Mutex<T>, deadline: Option<std::time::Instant>) -> Option<std::sync::MutexGuard<'_, T>> {
    let Some(d) = deadline else { return Some(lock.lock().unwrap_or_else(|e| e.into_inner())) };
    loop {
        match lock.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < d => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// Writes the profile so far if this process's agent runs, waiting at most
/// `limit`; for the termination paths (`crate::shutdown`).
pub(crate) fn flush_within(limit: Duration) {
    let _ = request_flush(Some(limit));
}

fn flush_for_shutdown() {
    flush_within(crate::shutdown::FLUSH_WAIT);
}

/// Writes the profile so far, waiting at most `shutdown::FLUSH_WAIT` (for
/// `abort`, `_exit`). Does nothing in a process the agent does not belong to.
pub fn flush_bounded() {
    if owns_process() {
        threads::charge_current_remainder();
    }
    flush_for_shutdown();
}

/// For `_exit`, the end of a process as normal as `exit`: the profile so far
/// is written (at most `shutdown::FLUSH_WAIT`) and, as at `exit`, the
/// backends get the configured exit wait to take it. Does nothing in a
/// process the agent does not belong to.
pub fn flush_at_exit() {
    if !owns_process() {
        return;
    }
    threads::charge_current_remainder();
    let wait = current_agent().and_then(|a| a.cfg.upload.as_ref().filter(|u| u.uploads()).map(|u| u.exit_wait));
    let _ = request_flush_delivered(Some(crate::shutdown::FLUSH_WAIT + wait.unwrap_or_default()), wait);
}

/// Registers the calling thread now (thread-start path) instead of waiting for
/// discovery. Call it first thing in threads you spawn; the guard unregisters
/// on drop. A no-op if no profiler runs.
pub fn register_current_thread() -> Option<ThreadRegistration> {
    threads::register_current().map(|_| ThreadRegistration(()))
}

/// Keeps the calling thread registered; unregisters it when dropped.
pub struct ThreadRegistration(());

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        threads::unregister_current();
    }
}

static AGENT: AtomicPtr<Agent> = AtomicPtr::new(core::ptr::null_mut());
static STORAGE: AtomicPtr<CallTraceStorage> = AtomicPtr::new(core::ptr::null_mut());
/// Serialises start and stop. A [`ForkLock`]: a child forked while a
/// parent thread started or stopped the agent does not wait on it forever.
static START_LOCK: ForkLock<()> = ForkLock::new(());
static FORK_HOOK: std::sync::Once = std::sync::Once::new();
fn current_agent() -> Option<&'static Agent> {
    // SAFETY: agents are leaked (never freed), see `stop`.
    unsafe { AGENT.load(Acquire).as_ref() }
}

/// Whether a profiler is running in this process.
pub fn is_running() -> bool {
    current_agent().is_some()
}

/// This process's runtime id (random, fixed while the agent runs).
pub fn runtime_id() -> Option<String> {
    current_agent().map(|a| a.runtime_id.clone())
}

fn start(cfg: Config) -> Result<Profiler, Error> {
    crate::stderr::open();
    cfg.validate()?;
    let _g = START_LOCK.lock();
    if current_agent().is_some() {
        return Err(Error::AlreadyRunning);
    }
    if cfg.upload.as_ref().is_none_or(|u| u.out.is_some()) {
        check_writable(&cfg.out_dir)?;
    }
    let reg = Registry::get_or_init(RegistryConfig { capacity: cfg.threads, growable: cfg.threads_grow })
        .map_err(|e| Error::io("cannot map the thread registry", e))?;
    let storage = storage_for(&cfg, reg)?;
    let (installed, sample_sig, prime_sig) = install_handlers(&cfg)?;
    // Tables before sampling: the first samples already walk with them
    // (unless deferred: then the collector builds them).
    let tracker = unwind_tables::start();
    let tables_after = unwind_tables::deferred();
    STATE.storage.store(storage as *const _ as *mut _, Release);
    STATE.period_ns.store(cfg.period_ns(), Relaxed);
    STATE.max_depth.store(cfg.max_depth, Relaxed);
    STATE.sample_signal.store(sample_sig, Relaxed);
    STATE.prime_signal.store(prime_sig, Relaxed);
    STATE.enabled.store(true, SeqCst);
    if cfg.alloc {
        signal::alloc::arm(cfg.alloc_interval);
    }

    let agent: &'static Agent = Box::leak(Box::new(Agent {
        cfg: cfg.clone(),
        runtime_id: new_runtime_id(),
        storage,
        control: Arc::new((Mutex::new(Control::default()), Condvar::new())),
        thread: Mutex::new(None),
        dispositions: installed,
        tracker: Mutex::new(tracker),
        tables_after,
        claim: Default::default(),
        started: collector::Started::now(),
    }));
    AGENT.store(agent as *const _ as *mut _, Release);
    ownership::claim();
    threads::register_current();
    collector::spawn(agent).map_err(|e| Error::io("cannot start the collector thread", e))?;
    shutdown::install();
    FORK_HOOK.call_once(|| {
        // SAFETY: registering plain extern "C" callbacks.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child)) };
    });
    Ok(Profiler { stopped: false })
}

fn storage_for(cfg: &Config, reg: &Registry) -> Result<&'static CallTraceStorage, Error> {
    // SAFETY: leaked below, never freed.
    if let Some(s) = unsafe { STORAGE.load(Acquire).as_ref() } {
        return Ok(s);
    }
    new_storage(cfg, reg)
}

/// Maps a new storage and makes it the one handlers use. The old one (if any)
/// is leaked: a handler may still hold a pointer to it.
fn new_storage(cfg: &Config, reg: &Registry) -> Result<&'static CallTraceStorage, Error> {
    let s = CallTraceStorage::new(StorageConfig { memory_budget: cfg.memory_budget, max_threads: reg.max_records() })
        .map_err(|e| Error::io("cannot map call trace storage", e))?;
    let s: &'static CallTraceStorage = Box::leak(Box::new(s));
    STORAGE.store(s as *const _ as *mut _, Release);
    STATE.storage.store(s as *const _ as *mut _, Release);
    Ok(s)
}

fn install_handlers(cfg: &Config) -> Result<(Vec<Installed>, i32, i32), Error> {
    let sample = match cfg.sample_signal {
        Some(s) => s,
        None => dispositions::free_rt_signal(6, &[]).ok_or(Error::NoFreeSignal { purpose: "sampling" })?,
    };
    let prime = match cfg.prime_signal {
        Some(s) => s,
        None => dispositions::free_rt_signal(7, &[sample]).ok_or(Error::NoFreeSignal { purpose: "priming" })?,
    };
    let a =
        dispositions::install(sample, signal::on_sample).map_err(|e| Error::io(format!("sigaction({sample})"), e))?;
    let b = dispositions::install(prime, signal::on_prime).map_err(|e| Error::io(format!("sigaction({prime})"), e))?;
    Ok((vec![a, b], sample, prime))
}

/// Creates `dir` if needed and checks a file can be written in it.
pub fn check_writable(dir: &Path) -> Result<(), Error> {
    // Asked of the kernel (permissions, read-only mounts) rather than by
    // creating a file: every process of a profiled tree starts here, and
    // there the directory exists (one system call).
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| {
        Error::io(format!("output directory {}", dir.display()), std::io::ErrorKind::InvalidInput.into())
    })?;
    // SAFETY: a NUL-terminated path; faccessat only reads it.
    let writable = || unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK | libc::X_OK, libc::AT_EACCESS) };
    if writable() == 0 {
        return Ok(());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create output directory {}", dir.display()), e))?;
    if writable() != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::io(format!("output directory {} is not writable", dir.display()), e));
    }
    Ok(())
}

fn new_runtime_id() -> String {
    let mut b = [0u8; 16];
    // SAFETY: valid buffer; getrandom fills it (or we fall back to time-derived bytes).
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 16, 0) };
    if n != 16 {
        let t = sys::realtime_ns() ^ ((sys::getpid() as u64) << 32);
        b[..8].copy_from_slice(&t.to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let h: String = b.iter().flat_map(|x| [HEX[(x >> 4) as usize] as char, HEX[(x & 15) as usize] as char]).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Stops the running agent (if any); returns the files it wrote. In a
/// process the agent does not belong to (see [`owns_process`]) it does
/// nothing: the collector to join does not exist there, and `START_LOCK`
/// may have been copied held.
fn stop(ending: Ending) -> Vec<PathBuf> {
    if !owns_process() {
        return vec![];
    }
    let _g = START_LOCK.lock();
    let Some(agent) = current_agent() else { return vec![] };
    let Some(reg) = Registry::get() else { return vec![] };
    // 0. The stopping thread's CPU since its last sample (at `exit`, the
    // whole of a process shorter than a clock tick).
    threads::charge_current_remainder();
    // 1. No new samples: sampling off (Dekker pair with the handler), clocks closed.
    signal::alloc::disarm();
    STATE.enabled.store(false, SeqCst);
    reg.for_each_active(|_, rec| cpu_clock::disarm(rec));
    // 2. Wait for handlers in flight; they are bounded, so this terminates.
    reg.for_each_active(|_, rec| {
        while rec.in_handler.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
    });
    // 3. Final flush: here if the collector has not begun its work (it is
    // asleep: at `exit` it ends with the process), else on the collector.
    agent.control.0.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
    let left_asleep = collector::stop_here(agent) && ending == Ending::Exit;
    if !left_asleep {
        collector::wake();
    }
    let joined = if left_asleep { None } else { agent.thread.lock().unwrap_or_else(|e| e.into_inner()).take() };
    if let Some(h) = joined {
        let limit = COLLECTOR_END + agent.cfg.upload.as_ref().map_or(Duration::ZERO, |u| u.exit_wait);
        if collector_ended_within(agent, limit) {
            h.join();
        } else {
            crate::say!(
                "osprey: the collector did not finish within {} s; stopping without this process's last profile",
                limit.as_secs()
            );
        }
    }
    // 4. Restore dispositions unless a signal is still pending somewhere.
    shutdown::uninstall();
    // A signal still pending (on a thread that blocks it) keeps osprey's
    // handler, a no-op once stopped: SIG_DFL would kill the process.
    if ending == Ending::Stop {
        for h in &agent.dispositions {
            h.restore();
        }
    }
    ownership::release();
    AGENT.store(core::ptr::null_mut(), Release);
    let files = std::mem::take(&mut agent.control.0.lock().unwrap_or_else(|e| e.into_inner()).files);
    files
}

/// How long a stop waits for the collector's last profile, beyond the
/// backends' exit wait: far more than it takes, short of a hang.
const COLLECTOR_END: Duration = Duration::from_secs(30);

/// Waits up to `limit` for `agent`'s collector thread to finish. A collector
/// stuck for good (a bug: a lock copied held by a `fork`) does not hold
/// the program's `exit` forever.
fn collector_ended_within(agent: &Agent, limit: Duration) -> bool {
    let (lock, cv) = &*agent.control;
    let deadline = std::time::Instant::now() + limit;
    let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
    while !g.ended {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        g = cv.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
    }
    true
}

/// The thread that is forking (set in the parent just before `fork`).
static FORKING_TID: AtomicI32 = AtomicI32::new(0);

extern "C" fn before_fork() {
    FORKING_TID.store(sys::gettid(), Relaxed);
    osprey_unwind::loader_lock::fork_prepare();
}

extern "C" fn after_fork_parent() {
    osprey_unwind::loader_lock::fork_parent();
}

/// In a forked child: the registry is reduced to the one thread that exists,
/// the parent's buffered samples are discarded (the parent reports them), and
/// profiling continues with a new agent thread (or stops if configured so).
extern "C" fn after_fork_child() {
    osprey_unwind::loader_lock::fork_child();
    collector::forget_inherited_own();
    collector::own_setup(continue_in_child);
}

fn continue_in_child() {
    let Some(agent) = current_agent() else { return };
    let Some(reg) = Registry::get() else { return };
    let me = sys::gettid();
    threads::forget_internal_after_fork();
    // The stack the forking thread was last sampled in, for CPU this
    // thread uses before its own first sample (a child shorter than that).
    let forked_from = reg.lookup(FORKING_TID.load(Relaxed)).map(|(_, rec)| {
        let n = (rec.last_depth.load(Relaxed) as usize).min(MAX_FRAMES);
        let mut frames = [0u64; MAX_FRAMES];
        // SAFETY: the thread that owned this buffer does not exist in the child.
        frames[..n].copy_from_slice(unsafe { &(&*rec.frames.get())[..n] });
        (frames, n, rec.start_routine.load(Relaxed))
    });
    // Inherited perf fds belong to the parent's threads: close without
    // disabling (the event is shared with the parent).
    reg.for_each_active(|_, rec| {
        cpu_clock::forget_inherited(rec);
        let tid = rec.tid.load(Relaxed);
        if tid != me {
            reg.retire(tid);
        }
        // Threads that were inside a handler at the fork do not exist here.
        rec.in_handler.store(0, Relaxed);
        rec.ring.drain(|_| {});
        rec.lost.take();
    });
    // The parent's storage may have its collector lock held or hazards set by
    // threads that do not exist here: a child that goes on starts on a fresh one.
    let storage = if agent.cfg.continue_after_fork { new_storage(&agent.cfg, reg).ok() } else { None };
    let Some(storage) = storage else {
        STATE.enabled.store(false, SeqCst);
        ownership::release();
        AGENT.store(core::ptr::null_mut(), Release);
        return;
    };
    let child: &'static Agent = Box::leak(Box::new(Agent {
        cfg: agent.cfg.clone(),
        runtime_id: new_runtime_id(),
        storage,
        control: Arc::new((Mutex::new(Control::default()), Condvar::new())),
        thread: Mutex::new(None),
        dispositions: vec![],
        tracker: Mutex::new(None),
        tables_after: collector::FORKED_TABLES_AFTER,
        claim: Default::default(),
        started: collector::Started::now(),
    }));
    AGENT.store(child as *const _ as *mut _, Release);
    ownership::claim();
    if let (Some((_, rec)), Some((frames, n, start))) = (threads::register_current(), forked_from) {
        // A stack of its own (its clock already fired) is kept.
        if rec.last_depth.load(Relaxed) == 0 {
            let _blocked = threads::SignalBlock::all();
            // SAFETY: this thread's own buffer, its sampling signal blocked.
            unsafe { (&mut *rec.frames.get())[..n].copy_from_slice(&frames[..n]) };
            rec.last_depth.store(n as u32, Relaxed);
        }
        if rec.start_routine.load(Relaxed) == 0 {
            rec.start_routine.store(start, Relaxed);
        }
    }
    if collector::spawn(child).is_err() {
        STATE.enabled.store(false, SeqCst);
    }
    shutdown::arm();
}

/// Counters for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Sampling signals handled.
    pub signals: u64,
    /// Priming signals handled.
    pub primed: u64,
    /// Samples whose walk did not reach an outermost frame.
    pub truncated: u64,
    /// Samples walked with the CFI tables.
    pub cfi_walks: u64,
    /// Of those, walks that reached an outermost frame.
    pub cfi_complete: u64,
    /// Samples taken before the thread's stack bounds were known.
    pub leaf_only: u64,
    /// Samples on threads without a record.
    pub dropped_unregistered: u64,
    /// Claims refused because the record pool was exhausted.
    pub registry_exhausted: u64,
}

/// The agent's counters now.
pub fn stats() -> Stats {
    let reg = Registry::get();
    Stats {
        signals: STATE.signals.load(Relaxed),
        primed: STATE.primed.load(Relaxed),
        truncated: STATE.truncated.load(Relaxed),
        cfi_walks: STATE.cfi_walks.load(Relaxed),
        cfi_complete: STATE.cfi_complete.load(Relaxed),
        leaf_only: STATE.leaf_only.load(Relaxed),
        dropped_unregistered: reg.map_or(0, |r| r.dropped_unregistered.load(Relaxed)),
        registry_exhausted: reg.map_or(0, |r| r.exhausted.load(Relaxed)),
    }
}
