//! [`Uploader`]: one thread per backend, each with its own bounded
//! [`Queue`] of shared profiles.
//!
//! - [`Uploader::submit`] only takes a lock held for queue operations (never
//!   across I/O) and returns; a slow or dead backend delays nothing else.
//! - A backend thread sends the oldest queued profile; on a connection
//!   error, a timeout, 5xx, 408 or 429 it waits (capped exponential backoff,
//!   +-25% jitter, or the server's `Retry-After`) and sends it again; the
//!   profiles behind it wait their turn, so once the backend is back every
//!   queued profile arrives, in order.
//! - Any other 4xx: the profile is dropped and one line says what the
//!   backend answered.
//! - Failures are logged at most once per `log_interval` per backend.
//! - [`Uploader::shutdown`] sends what is queued, and returns after at most
//!   `max_wait` whatever the backends do: every request made after it
//!   began has its timeout cut to the time left, and threads still blocked
//!   then are left behind (the process exit ends them).

use crate::config::{Backend, Endpoint, UploadConfig};
use crate::http::{self, Outcome, Request};
use crate::queue::Queue;
use crate::{Item, Meta};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Counters of one backend, since the uploader started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// `datadog`, `pyroscope` or `otlp`.
    pub backend: &'static str,
    /// Where requests go.
    pub url: String,
    /// Profiles the backend accepted (2xx).
    pub delivered: u64,
    /// Dropped from a full queue.
    pub dropped: u64,
    /// Refused by the backend (4xx other than 408/429): not retried.
    pub rejected: u64,
    /// Attempts that failed and were retried.
    pub retries: u64,
    /// Profiles still queued (the one being sent included).
    pub queued: usize,
    /// Bytes held by the queue.
    pub queued_bytes: usize,
    /// Request bodies sent, successful or not.
    pub bytes_sent: u64,
    /// CPU time spent encoding requests (thread CPU clock), ns.
    pub encode_cpu_ns: u64,
    /// What the last failure was.
    pub last_error: Option<String>,
}

struct Lane {
    backend: Backend,
    endpoint: Endpoint,
    queue: Queue,
    busy: bool,
    /// No thread serves this lane: shutdown does not wait for its queue.
    stalled: bool,
    stats: BackendStats,
    /// Counts already reported in a profile's comments.
    reported_dropped: u64,
    reported_rejected: u64,
}

struct State {
    lanes: Vec<Lane>,
    /// Set by shutdown: nothing is sent after this instant.
    deadline: Option<Instant>,
    last_end_ns: Option<i64>,
    /// The last end submitted per process ([`Uploader::submit_for`]), by runtime id.
    last_end_of: std::collections::HashMap<String, i64>,
    seq: u64,
}

/// Processes whose last end [`Uploader::submit_for`] keeps.
const MAX_PROCESSES: usize = 4096;

pub(crate) struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    pub(crate) cfg: UploadConfig,
    pub(crate) meta: Meta,
    /// `code-provenance.json`, computed once on a backend thread.
    pub(crate) provenance: OnceLock<String>,
    log_interval: Duration,
}

/// The upload threads of one process, one per backend.
pub struct Uploader {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    shut: bool,
}

static JITTER: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

fn jitter(d: Duration) -> Duration {
    // xorshift; +-25%.
    let mut x = JITTER.load(Ordering::Relaxed) ^ crate::now_ns() as u64;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    JITTER.store(x, Ordering::Relaxed);
    let f = 0.75 + (x % 1000) as f64 / 2000.0;
    d.mul_f64(f)
}

/// The delay before retry number `attempt` (1-based).
pub fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let d = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    jitter(d.min(max))
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Starts one upload thread: `(name, body)`. The agent passes one that makes
/// the thread its own (never sampled, its CPU charged to `[osprey] agent`).
pub type Spawner = fn(String, Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>>;

/// A plain named thread.
pub fn std_spawner(name: String, body: Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(body)
}

impl Uploader {
    /// Starts one thread per backend of `cfg`. `log_interval`: at most one
    /// line per backend per interval on stderr (the profiling period).
    pub fn start(cfg: UploadConfig, meta: Meta, log_interval: Duration) -> Uploader {
        Self::start_with(cfg, meta, log_interval, std_spawner)
    }

    /// [`Uploader::start`] with threads started by `spawn`. A backend whose
    /// thread cannot start keeps its profiles queued: they count as not
    /// delivered, with the reason as its last error.
    pub fn start_with(cfg: UploadConfig, meta: Meta, log_interval: Duration, spawn: Spawner) -> Uploader {
        let lanes = cfg
            .endpoints()
            .into_iter()
            .map(|(backend, endpoint)| Lane {
                backend,
                stats: BackendStats { backend: backend.name(), url: endpoint.url.clone(), ..Default::default() },
                endpoint,
                queue: Queue::new(cfg.queue_profiles, cfg.queue_bytes),
                busy: false,
                stalled: false,
                reported_dropped: 0,
                reported_rejected: 0,
            })
            .collect::<Vec<_>>();
        let n = lanes.len();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                lanes,
                deadline: None,
                last_end_ns: None,
                last_end_of: Default::default(),
                seq: 0,
            }),
            cv: Condvar::new(),
            cfg,
            meta,
            provenance: OnceLock::new(),
            log_interval: log_interval.max(Duration::from_secs(1)),
        });
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let s = shared.clone();
            match spawn(format!("osprey-upload-{i}"), Box::new(move || run(&s, i))) {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.lanes[i].stats.last_error = Some(format!("cannot start its upload thread: {e}"));
                    st.lanes[i].stalled = true;
                }
            }
        }
        Uploader { shared, threads, shut: false }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an encoded (not compressed) pprof profile covering
    /// `[start_ns, end_ns)` for every backend; never blocks on I/O. The
    /// start is moved to the previous profile's end, so uploads are
    /// contiguous. Returns how many older profiles were dropped to make room.
    pub fn submit(&self, pprof: Vec<u8>, start_ns: i64, end_ns: i64) -> usize {
        self.queue(None, pprof, start_ns, end_ns)
    }

    /// [`Uploader::submit`] for another process than the uploader's (the
    /// processes of a tree, each its own to the backends): `meta` names
    /// it, and its uploads are contiguous among themselves.
    pub fn submit_for(&self, meta: Arc<Meta>, pprof: Vec<u8>, start_ns: i64, end_ns: i64) -> usize {
        self.queue(Some(meta), pprof, start_ns, end_ns)
    }

    fn queue(&self, meta: Option<Arc<Meta>>, pprof: Vec<u8>, start_ns: i64, end_ns: i64) -> usize {
        let mut st = self.lock();
        if st.deadline.is_some() || st.lanes.is_empty() {
            return 0;
        }
        let last = match &meta {
            Some(m) => st.last_end_of.get(&m.runtime_id).copied(),
            None => st.last_end_ns,
        };
        let start = last.unwrap_or(start_ns);
        let end = end_ns.max(start);
        match &meta {
            Some(m) => {
                // Bounded: a tree's processes come and go.
                if st.last_end_of.len() >= MAX_PROCESSES && !st.last_end_of.contains_key(&m.runtime_id) {
                    st.last_end_of.clear();
                }
                st.last_end_of.insert(m.runtime_id.clone(), end);
            }
            None => st.last_end_ns = Some(end),
        }
        let item = Arc::new(Item { pprof, start_ns: start, end_ns: end, seq: st.seq, meta });
        st.seq += 1;
        let mut dropped = 0;
        for lane in st.lanes.iter_mut() {
            let n = lane.queue.push(item.clone());
            lane.stats.dropped += n as u64;
            dropped += n;
        }
        drop(st);
        self.shared.cv.notify_all();
        dropped
    }

    /// [`submit`](Self::submit) for a profile object.
    pub fn submit_profile(&self, profile: &osprey_pprof::pprof::Profile) -> usize {
        let end = profile.time_nanos + profile.duration_nanos;
        self.submit(prost::Message::encode_to_vec(profile), profile.time_nanos, end)
    }

    /// Lines for the next profile's comments: profiles dropped or refused
    /// since the last call (empty when none).
    pub fn take_comments(&self) -> Vec<String> {
        let mut st = self.lock();
        let mut out = Vec::new();
        for l in st.lanes.iter_mut() {
            let (d, r) = (l.stats.dropped - l.reported_dropped, l.stats.rejected - l.reported_rejected);
            if d > 0 || r > 0 {
                let mut s = format!("upload {}: {d} profiles dropped (queue full), {r} refused", l.backend.name());
                if let Some(e) = &l.stats.last_error {
                    s.push_str(&format!(" (last error: {e})"));
                }
                out.push(s);
            }
            (l.reported_dropped, l.reported_rejected) = (l.stats.dropped, l.stats.rejected);
        }
        out
    }

    /// The counters of every backend.
    pub fn stats(&self) -> Vec<BackendStats> {
        let st = self.lock();
        st.lanes
            .iter()
            .map(|l| BackendStats { queued: l.queue.len(), queued_bytes: l.queue.bytes(), ..l.stats.clone() })
            .collect()
    }

    /// Waits until no backend has a profile queued or in flight, or until
    /// `deadline`. Nothing stops: for a process about to end abruptly.
    pub fn wait_idle(&self, deadline: Instant) {
        drop(self.idle_by(deadline));
    }

    /// [`Uploader::wait_idle`], returning the lock and whether every lane is idle.
    fn idle_by(&self, deadline: Instant) -> (MutexGuard<'_, State>, bool) {
        let mut st = self.lock();
        loop {
            let pending = st.lanes.iter().any(|l| !l.stalled && (l.busy || !l.queue.is_empty()));
            let now = Instant::now();
            if !pending || now >= deadline {
                return (st, !pending);
            }
            st = self.shared.cv.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Sends what is queued, waiting at most `max_wait`; then returns the
    /// counters. Later submissions are ignored.
    pub fn shutdown(&mut self, max_wait: Duration) -> Vec<BackendStats> {
        let deadline = Instant::now() + max_wait;
        {
            let mut st = self.lock();
            st.deadline = Some(st.deadline.map_or(deadline, |d| d.min(deadline)));
        }
        self.shut = true;
        self.shared.cv.notify_all();
        let (st, done) = self.idle_by(deadline);
        drop(st);
        if done {
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
        self.stats()
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        if !self.shut {
            let wait = self.shared.cfg.exit_wait;
            self.shutdown(wait);
        }
    }
}

/// Per-backend log throttle: one line per interval, counting what it covers.
struct Log {
    next: Instant,
    failures: u64,
}

fn run(s: &Shared, i: usize) {
    let agent = http::agent(s.cfg.ca_file.as_deref());
    let mut attempt: u32 = 0;
    let mut current: Option<(Arc<Item>, Request)> = None;
    let mut log = Log { next: Instant::now(), failures: 0 };
    let (backend, endpoint) = {
        let st = s.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.lanes[i].backend, st.lanes[i].endpoint.clone())
    };
    loop {
        // Take the oldest profile (or wait for one).
        let item = {
            let mut st = s.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let now = Instant::now();
                if st.deadline.is_some_and(|d| now >= d) {
                    st.lanes[i].busy = false;
                    s.cv.notify_all();
                    return;
                }
                if let Some(f) = st.lanes[i].queue.front().cloned() {
                    st.lanes[i].busy = true;
                    break f;
                }
                st.lanes[i].busy = false;
                if st.deadline.is_some() {
                    s.cv.notify_all();
                    return;
                }
                s.cv.notify_all();
                st = s.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        if current.as_ref().is_none_or(|(c, _)| !Arc::ptr_eq(c, &item)) {
            let cpu = thread_cpu_ns();
            let req = match crate::encode_for(backend, &endpoint, &item, s) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("osprey: upload to {}: cannot encode profile {}: {e}; dropped", backend.name(), item.seq);
                    let mut st = s.state.lock().unwrap_or_else(|e| e.into_inner());
                    let l = &mut st.lanes[i];
                    l.queue.remove_front(&item);
                    l.stats.rejected += 1;
                    l.stats.last_error = Some(e.to_string());
                    continue;
                }
            };
            let used = thread_cpu_ns().saturating_sub(cpu);
            s.state.lock().unwrap_or_else(|e| e.into_inner()).lanes[i].stats.encode_cpu_ns += used;
            current = Some((item.clone(), req));
            attempt = 0;
        }
        let req = &current.as_ref().expect("set above").1;
        let deadline = s.state.lock().unwrap_or_else(|e| e.into_inner()).deadline;
        let timeout = match deadline {
            Some(d) => s.cfg.timeout.min(d.saturating_duration_since(Instant::now())).max(Duration::from_millis(1)),
            None => s.cfg.timeout,
        };
        // An attempt cut short by the shutdown's deadline says less than an
        // earlier failure's reason: that one stays the lane's last error.
        let cut = timeout < s.cfg.timeout;
        let outcome = http::post(&agent, req, timeout);
        let mut st = s.state.lock().unwrap_or_else(|e| e.into_inner());
        let queued = st.lanes[i].queue.len();
        let l = &mut st.lanes[i];
        l.stats.bytes_sent += req.body.len() as u64;
        let wait = match outcome {
            Outcome::Delivered(_) => {
                l.queue.remove_front(&item);
                l.stats.delivered += 1;
                if log.failures > 0 {
                    eprintln!(
                        "osprey: upload to {} ({}) works again after {} failed attempts",
                        backend.name(),
                        endpoint.url,
                        log.failures
                    );
                    log = Log { next: Instant::now(), failures: 0 };
                }
                current = None;
                None
            }
            Outcome::Rejected(why) => {
                eprintln!(
                    "osprey: upload to {} ({}) refused profile {}: {why}; not retried",
                    backend.name(),
                    endpoint.url,
                    item.seq
                );
                l.queue.remove_front(&item);
                l.stats.rejected += 1;
                l.stats.last_error = Some(why);
                current = None;
                None
            }
            Outcome::Retry { why, after } => {
                attempt += 1;
                l.stats.retries += 1;
                log.failures += 1;
                let now = Instant::now();
                if now >= log.next {
                    eprintln!(
                        "osprey: upload to {} ({}) failing: {why}; {} failed attempts, {queued} profiles queued, {} dropped so far; retrying",
                        backend.name(),
                        endpoint.url,
                        log.failures,
                        l.stats.dropped
                    );
                    log.next = now + s.log_interval;
                }
                if !(cut && l.stats.last_error.is_some()) {
                    l.stats.last_error = Some(why);
                }
                Some(after.map_or_else(
                    || backoff(s.cfg.retry_base, s.cfg.retry_max, attempt),
                    |a| a.min(s.cfg.retry_max.max(a)),
                ))
            }
        };
        if let Some(wait) = wait {
            let until = Instant::now() + wait;
            loop {
                let now = Instant::now();
                let d = st.deadline;
                if now >= until || d.is_some_and(|d| now >= d) {
                    break;
                }
                let limit = d.map_or(until, |d| d.min(until));
                st = s.cv.wait_timeout(st, limit - now).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
        drop(st);
        s.cv.notify_all();
    }
}
