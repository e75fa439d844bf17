//! Starting and stopping the agent, and its background thread.
//!
//! One agent per process. `start` installs the handlers, registers the
//! calling thread, and spawns the `osprey-agent` thread, which scans for new
//! threads, drains sample rings, and writes a profile every period. Dropping
//! the [`Profiler`] guard stops sampling, waits for handlers in flight,
//! writes the last profile, and restores the signal dispositions.

use crate::config::Config;
use crate::discovery::{self, Discovery};
use osprey_pprof as pprof;
use crate::handler::{self, Installed, STATE};
use crate::recorder::Recorder;
use crate::registry::{Registry, RegistryConfig};
use crate::storage::{CallTraceStorage, StorageConfig};
use crate::{sampler, sys};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Builds a [`Profiler`].
#[derive(Clone, Debug, Default)]
pub struct Builder {
    cfg: Config,
}

impl Builder {
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
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cfg.out_dir = dir.into();
        self
    }
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
    pub fn scan_interval(mut self, d: Duration) -> Self {
        self.cfg.scan_interval = d;
        self
    }
    /// File, line and inlined frames from DWARF at each flush (more memory).
    pub fn lines(mut self, on: bool) -> Self {
        self.cfg.lines = on;
        self
    }
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.cfg.memory_budget = bytes;
        self
    }
    /// Starts sampling every thread of the process.
    pub fn start(self) -> Result<Profiler, String> {
        start(self.cfg)
    }
}

/// Running profiler; dropping it stops sampling and writes the last profile.
pub struct Profiler {
    stopped: bool,
}

impl Profiler {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Writes a profile now (the period restarts). Returns the file written, if any.
    pub fn flush(&self) -> Result<Option<PathBuf>, String> {
        let agent = current_agent().ok_or("profiler is not running")?;
        let (lock, cv) = &*agent.control;
        lock.lock().unwrap_or_else(|e| e.into_inner()).flush_requested = true;
        cv.notify_all();
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while g.flush_requested {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        Ok(g.last_file.clone())
    }

    /// Stops sampling, writes the last profile, and returns every file written.
    pub fn stop(mut self) -> Vec<PathBuf> {
        self.stopped = true;
        stop()
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.stopped {
            stop();
        }
    }
}

/// Registers the calling thread now (thread-start path) instead of waiting for
/// discovery. Call it first thing in threads you spawn; the guard unregisters
/// on drop. A no-op if no profiler runs.
pub fn register_current_thread() -> Option<ThreadRegistration> {
    discovery::register_current().map(|_| ThreadRegistration(()))
}

/// Keeps the calling thread registered; unregisters it when dropped.
pub struct ThreadRegistration(());

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        discovery::unregister_current();
    }
}

/// What the agent thread and the stopper share.
#[derive(Default)]
struct Control {
    stop: bool,
    flush_requested: bool,
    last_file: Option<PathBuf>,
    files: Vec<PathBuf>,
}

struct Agent {
    cfg: Config,
    runtime_id: String,
    control: Arc<(Mutex<Control>, Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    handlers: Vec<Installed>,
}

static AGENT: AtomicPtr<Agent> = AtomicPtr::new(core::ptr::null_mut());
static STORAGE: AtomicPtr<CallTraceStorage> = AtomicPtr::new(core::ptr::null_mut());
static START_LOCK: Mutex<()> = Mutex::new(());
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

fn start(cfg: Config) -> Result<Profiler, String> {
    cfg.validate()?;
    let _g = START_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if current_agent().is_some() {
        return Err("a profiler is already running in this process".into());
    }
    check_writable(&cfg.out_dir)?;
    let reg = Registry::get_or_init(RegistryConfig { capacity: cfg.threads, growable: cfg.threads_grow })
        .map_err(|e| format!("cannot map the thread registry: {e}"))?;
    let storage = storage_for(&cfg, reg)?;
    let (handlers, sample_sig, prime_sig) = install_handlers(&cfg)?;
    STATE.storage.store(storage as *const _ as *mut _, Release);
    STATE.period_ns.store(cfg.period_ns(), Relaxed);
    STATE.max_depth.store(cfg.max_depth, Relaxed);
    STATE.sample_signal.store(sample_sig, Relaxed);
    STATE.prime_signal.store(prime_sig, Relaxed);
    STATE.enabled.store(true, SeqCst);

    let agent: &'static Agent = Box::leak(Box::new(Agent {
        cfg: cfg.clone(),
        runtime_id: new_runtime_id(),
        control: Arc::new((Mutex::new(Control::default()), Condvar::new())),
        thread: Mutex::new(None),
        handlers,
    }));
    AGENT.store(agent as *const _ as *mut _, Release);
    discovery::register_current();
    spawn_agent_thread(agent)?;
    FORK_HOOK.call_once(|| {
        // SAFETY: registering plain extern "C" callbacks.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    });
    Ok(Profiler { stopped: false })
}

fn storage_for(cfg: &Config, reg: &Registry) -> Result<&'static CallTraceStorage, String> {
    // SAFETY: leaked below, never freed.
    if let Some(s) = unsafe { STORAGE.load(Acquire).as_ref() } {
        return Ok(s);
    }
    new_storage(cfg, reg)
}

/// Maps a new storage and makes it the one handlers use. The old one (if any)
/// is leaked: a handler may still hold a pointer to it.
fn new_storage(cfg: &Config, reg: &Registry) -> Result<&'static CallTraceStorage, String> {
    let s = CallTraceStorage::new(StorageConfig { memory_budget: cfg.memory_budget, max_threads: reg.max_records() })
        .map_err(|e| format!("cannot map call trace storage: {e}"))?;
    let s: &'static CallTraceStorage = Box::leak(Box::new(s));
    STORAGE.store(s as *const _ as *mut _, Release);
    STATE.storage.store(s as *const _ as *mut _, Release);
    Ok(s)
}

fn install_handlers(cfg: &Config) -> Result<(Vec<Installed>, i32, i32), String> {
    let sample = match cfg.sample_signal {
        Some(s) => s,
        None => handler::free_rt_signal(6, &[]).ok_or("no free real-time signal for sampling")?,
    };
    let prime = match cfg.prime_signal {
        Some(s) => s,
        None => handler::free_rt_signal(7, &[sample]).ok_or("no free real-time signal for priming")?,
    };
    let a = handler::install(sample, handler::on_sample).map_err(|e| format!("sigaction({sample}): {e}"))?;
    let b = handler::install(prime, handler::on_prime).map_err(|e| format!("sigaction({prime}): {e}"))?;
    Ok((vec![a, b], sample, prime))
}

/// Creates `dir` if needed and checks a file can be written in it.
pub fn check_writable(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create output directory {}: {e}", dir.display()))?;
    let probe = dir.join(format!(".osprey-write-test-{}", sys::getpid()));
    std::fs::write(&probe, b"").map_err(|e| format!("output directory {} is not writable: {e}", dir.display()))?;
    let _ = std::fs::remove_file(probe);
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
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

fn spawn_agent_thread(agent: &'static Agent) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::Builder::new()
        .name("osprey-agent".into())
        .spawn(move || {
            let _ = tx.send(sys::gettid());
            agent_loop(agent);
        })
        .map_err(|e| format!("cannot start the agent thread: {e}"))?;
    let _ = rx.recv();
    *agent.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    Ok(())
}

fn agent_loop(agent: &'static Agent) {
    let Some(reg) = Registry::get() else { return };
    // SAFETY: set in `start` before this thread exists.
    let Some(storage) = (unsafe { STORAGE.load(Acquire).as_ref() }) else { return };
    let cfg = &agent.cfg;
    // The agent is not profiled (an interposed pthread_create may have registered it).
    discovery::unregister_current();
    let mut discovery = Discovery::default();
    discovery.internal.insert(sys::gettid());
    let mut recorder = Recorder::default();
    let (lock, cv) = &*agent.control;
    let now = Instant::now();
    let (mut next_scan, mut next_drain, mut next_flush) = (now, now + cfg.drain_interval, now + cfg.period);
    loop {
        let now = Instant::now();
        if now >= next_scan {
            let appeared = discovery.scan(reg);
            recorder.note_threads(&appeared);
            reg.grow_if_low();
            next_scan = now + cfg.scan_interval;
        }
        if now >= next_drain {
            recorder.drain(reg);
            next_drain = now + cfg.drain_interval;
        }
        let (stop, flush_now) = {
            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
            (g.stop, g.flush_requested)
        };
        if stop {
            break;
        }
        if flush_now || now >= next_flush {
            let file = write(agent, &mut recorder, reg, storage);
            let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
            g.flush_requested = false;
            g.last_file = file.clone();
            g.files.extend(file);
            cv.notify_all();
            next_flush = Instant::now() + cfg.period;
        }
        let wake = next_scan.min(next_drain).min(next_flush);
        let g = lock.lock().unwrap_or_else(|e| e.into_inner());
        if !g.stop && !g.flush_requested {
            let _ = cv.wait_timeout(g, wake.saturating_duration_since(Instant::now()));
        }
    }
    // Final flush: sampling is already off and no handler is in flight (see `stop`).
    let file = write(agent, &mut recorder, reg, storage);
    let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
    g.files.extend(file);
}

fn write(agent: &Agent, recorder: &mut Recorder, reg: &Registry, storage: &CallTraceStorage) -> Option<PathBuf> {
    let mut comments = vec![format!("runtime-id={}", agent.runtime_id)];
    comments.push(format!("osprey {} hz={}", env!("CARGO_PKG_VERSION"), agent.cfg.hz));
    let mut data = recorder.flush(reg, storage, agent.cfg.period_ns(), comments);
    data.lines = agent.cfg.lines;
    if data.samples.is_empty() {
        return None;
    }
    match pprof::write_profile(&agent.cfg.out_dir, &data) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("osprey: cannot write profile to {}: {e}", agent.cfg.out_dir.display());
            None
        }
    }
}

/// Stops the running agent (if any); returns the files it wrote.
fn stop() -> Vec<PathBuf> {
    let _g = START_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(agent) = current_agent() else { return vec![] };
    let Some(reg) = Registry::get() else { return vec![] };
    // 1. No new samples: sampling off (Dekker pair with the handler), clocks closed.
    STATE.enabled.store(false, SeqCst);
    reg.for_each_active(|_, rec| sampler::disarm(rec));
    // 2. Wait for handlers in flight; they are bounded, so this terminates.
    reg.for_each_active(|_, rec| {
        while rec.in_handler.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
    });
    // 3. Final flush on the agent thread.
    {
        let (lock, cv) = &*agent.control;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        cv.notify_all();
    }
    if let Some(h) = agent.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = h.join();
    }
    // 4. Restore dispositions unless a signal is still pending somewhere.
    for h in &agent.handlers {
        if !h.restore() {
            eprintln!("osprey: signal {} still pending; its no-op handler stays installed", h.signal);
        }
    }
    AGENT.store(core::ptr::null_mut(), Release);
    let files = std::mem::take(&mut agent.control.0.lock().unwrap_or_else(|e| e.into_inner()).files);
    files
}

/// In a forked child: the registry is reduced to the one thread that exists,
/// the parent's buffered samples are discarded (the parent reports them), and
/// profiling continues with a new agent thread (or stops if configured so).
extern "C" fn after_fork_child() {
    let Some(agent) = current_agent() else { return };
    let Some(reg) = Registry::get() else { return };
    let me = sys::gettid();
    // Inherited perf fds belong to the parent's threads: close without
    // disabling (the event is shared with the parent).
    reg.for_each_active(|_, rec| {
        let fd = rec.perf_fd.swap(-1, AcqRel);
        if fd >= 0 {
            // SAFETY: our inherited copy of the fd.
            unsafe { libc::close(fd) };
        }
        let tid = rec.tid.load(Relaxed);
        if tid != me {
            reg.retire(tid);
        }
        // Threads that were inside a handler at the fork do not exist here.
        rec.in_handler.store(0, Relaxed);
        rec.ring.drain(|_| {});
        rec.ring_overflow.store(0, Relaxed);
    });
    // The parent's storage may have its collector lock held or hazards set by
    // threads that do not exist here: the child starts on a fresh one.
    if new_storage(&agent.cfg, reg).is_err() {
        STATE.enabled.store(false, SeqCst);
        AGENT.store(core::ptr::null_mut(), Release);
        return;
    }
    if !agent.cfg.continue_after_fork {
        STATE.enabled.store(false, SeqCst);
        AGENT.store(core::ptr::null_mut(), Release);
        return;
    }
    let child: &'static Agent = Box::leak(Box::new(Agent {
        cfg: agent.cfg.clone(),
        runtime_id: new_runtime_id(),
        control: Arc::new((Mutex::new(Control::default()), Condvar::new())),
        thread: Mutex::new(None),
        handlers: vec![],
    }));
    AGENT.store(child as *const _ as *mut _, Release);
    discovery::register_current();
    if spawn_agent_thread(child).is_err() {
        STATE.enabled.store(false, SeqCst);
    }
}

/// Counters for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub signals: u64,
    pub primed: u64,
    pub truncated: u64,
    pub leaf_only: u64,
    pub dropped_unregistered: u64,
    pub registry_exhausted: u64,
}

pub fn stats() -> Stats {
    let reg = Registry::get();
    Stats {
        signals: STATE.signals.load(Relaxed),
        primed: STATE.primed.load(Relaxed),
        truncated: STATE.truncated.load(Relaxed),
        leaf_only: STATE.leaf_only.load(Relaxed),
        dropped_unregistered: reg.map_or(0, |r| r.dropped_unregistered.load(Relaxed)),
        registry_exhausted: reg.map_or(0, |r| r.exhausted.load(Relaxed)),
    }
}
