//! Thread registry: one pre-allocated [`Record`] per profiled thread.
//!
//! **Signal-safe parts:** [`Registry::get`], [`Registry::current`],
//! [`Registry::claim_current`], and every `Record` field access. They use only
//! atomics on memory mapped before any handler could run.
//!
//! # How the handler finds its record (no lazy TLS)
//! A tid-indexed table (`tid -> record index + 1`, one `AtomicU32` per possible
//! tid up to `/proc/sys/kernel/pid_max`) is mapped once, lazily committed by
//! the kernel. The handler reads `gettid()` with a raw syscall and loads one
//! entry. No `__tls_get_addr`, no `pthread_getspecific`, no errno; it even works
//! on a raw `clone` thread whose `%fs` is not a libc thread pointer.
//!
//! # Invariants
//! - A record is owned by exactly one live tid from `claim` until `retire`;
//!   `tid_table[tid] == index + 1` exactly while that holds (see
//!   `claim_for`: CAS from 0).
//! - Records are never unmapped; a retired record goes back to the free list
//!   only after the collector drained its sample ring (`recycle`).
//! - The free list is a Treiber stack whose head packs `(tag << 32) | (index + 1)`;
//!   every successful CAS bumps the tag, so a head that was popped and pushed
//!   back in between (ABA) fails the CAS.

use crate::context::ContextRecord;
use crate::storage::SampleRing;
use crate::sys;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// Most segments the pool can grow to (each one holds `segment_len` records).
pub const MAX_SEGMENTS: usize = 64;

/// Record lifecycle.
pub mod state {
    pub const FREE: u32 = 0;
    pub const CLAIMED: u32 = 1;
    /// The thread is gone; waiting for the collector to drain and recycle it.
    pub const RETIRED: u32 = 2;
}

/// How a thread got its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Path {
    /// Registered from inside the thread before its start routine (interposed
    /// `pthread_create`, or `register_current_thread` in library mode).
    ThreadStart = 1,
    /// Found by the discovery scan and primed by the real-time signal.
    Discovery = 2,
}

/// Per-thread profiler state. Lives in a pool mapped up front; see module docs.
#[repr(C, align(64))]
pub struct Record {
    /// Trace context, written by the application thread, read by the handler.
    pub context: ContextRecord,
    /// Owning OS thread id (0 when free).
    pub tid: AtomicI32,
    state: AtomicU32,
    next_free: AtomicU32,
    /// `Path` as u32 (0 when free).
    pub path: AtomicU32,
    /// perf_event fd driving this thread's CPU-time samples (-1: none).
    pub perf_fd: AtomicI32,
    /// Set while this thread runs a profiler signal handler (nesting depth).
    pub in_handler: AtomicU32,
    /// Highest stack address of the thread (exclusive); 0 = unknown yet.
    pub stack_hi: AtomicUsize,
    /// Lowest mapped stack address of the thread; 0 = unknown yet.
    pub stack_lo: AtomicUsize,
    /// A stack pointer seen while priming, so the collector can find the stack mapping.
    pub primed_sp: AtomicUsize,
    /// `starttime` from `/proc/self/task/TID/stat` (detects tid reuse); 0 = unknown.
    pub start_time: AtomicU64,
    /// Monotonic time of registration.
    pub registered_ns: AtomicU64,
    /// Samples this thread took while the ring was full (reported, never silent).
    pub ring_overflow: AtomicU64,
    /// Samples taken on this thread.
    pub samples: AtomicU64,
    /// Per-thread sample records, drained by the collector.
    pub ring: SampleRing,
}

impl Record {
    #[inline]
    pub fn state(&self) -> u32 {
        self.state.load(Acquire)
    }
}

/// The pool of thread records. One per process, never freed.
pub struct Registry {
    segments: [AtomicPtr<Record>; MAX_SEGMENTS],
    nsegments: AtomicUsize,
    segment_len: usize,
    growable: bool,
    free_head: AtomicU64,
    free_count: AtomicUsize,
    tid_table: *const AtomicU32,
    /// Per-tid nesting depth of osprey signal handlers (see `handler_depth`).
    depth_table: *const AtomicU32,
    tid_limit: usize,
    /// Samples that arrived on a thread without a record (pool exhausted, or not primed yet).
    pub dropped_unregistered: AtomicU64,
    /// Claims that failed because the pool was exhausted.
    pub exhausted: AtomicU64,
}

// SAFETY: all shared state is atomics or immutable after construction.
unsafe impl Sync for Registry {}
unsafe impl Send for Registry {}

static GLOBAL: AtomicPtr<Registry> = AtomicPtr::new(core::ptr::null_mut());
static INIT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sizing of the registry. Fixed for the life of the process once created.
#[derive(Clone, Copy, Debug)]
pub struct RegistryConfig {
    /// Records per segment; the initial pool is one segment.
    pub capacity: usize,
    /// Whether the collector may add segments when the pool runs low.
    pub growable: bool,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig { capacity: 256, growable: true }
    }
}

impl Registry {
    /// The process registry if it exists. Signal-safe (one atomic load).
    #[inline(always)]
    pub fn get() -> Option<&'static Registry> {
        // SAFETY: published once with Release and never freed.
        unsafe { GLOBAL.load(Acquire).as_ref() }
    }

    /// The process registry, created with `cfg` if it does not exist yet (the
    /// first configuration wins). Not signal-safe.
    pub fn get_or_init(cfg: RegistryConfig) -> std::io::Result<&'static Registry> {
        if let Some(r) = Self::get() {
            return Ok(r);
        }
        let _g = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = Self::get() {
            return Ok(r);
        }
        let r: &'static Registry = Box::leak(Box::new(Registry::new(cfg)?));
        GLOBAL.store(r as *const _ as *mut _, Release);
        Ok(r)
    }

    fn new(cfg: RegistryConfig) -> std::io::Result<Registry> {
        let tid_limit = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(4_194_304)
            .min(4_194_304)
            + 1;
        let tid_table = sys::map_zeroed(tid_limit * 4)? as *const AtomicU32;
        let depth_table = sys::map_zeroed(tid_limit * 4)? as *const AtomicU32;
        let r = Registry {
            segments: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_SEGMENTS],
            nsegments: AtomicUsize::new(0),
            segment_len: cfg.capacity.max(1),
            growable: cfg.growable,
            free_head: AtomicU64::new(0),
            free_count: AtomicUsize::new(0),
            tid_table,
            depth_table,
            tid_limit,
            dropped_unregistered: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
        };
        r.add_segment()?;
        Ok(r)
    }

    /// Maps one more segment and pushes its records on the free list.
    /// Not signal-safe; called at creation and by the collector when low.
    pub fn add_segment(&self) -> std::io::Result<bool> {
        let n = self.nsegments.load(Acquire);
        if n >= MAX_SEGMENTS {
            return Ok(false);
        }
        let bytes = self.segment_len * core::mem::size_of::<Record>();
        let base = sys::map_zeroed(bytes)? as *mut Record;
        // Zeroed memory is a valid Record for every field (atomics, rings) except
        // perf_fd, which must read -1 for "none".
        for i in 0..self.segment_len {
            // SAFETY: within the fresh mapping.
            unsafe { (*base.add(i)).perf_fd.store(-1, Relaxed) };
        }
        self.segments[n].store(base, Release);
        self.nsegments.store(n + 1, Release);
        for i in (0..self.segment_len).rev() {
            self.push_free((n * self.segment_len + i) as u32);
        }
        Ok(true)
    }

    /// Adds a segment if fewer than a quarter of the records are free and growth is allowed.
    pub fn grow_if_low(&self) {
        if self.growable && self.free_count.load(Relaxed) * 4 < self.segment_len {
            let _ = self.add_segment();
        }
    }

    /// Adds a segment now if growth is allowed. Not signal-safe.
    pub fn grow_now(&self) -> bool {
        self.growable && self.add_segment().unwrap_or(false)
    }

    /// Number of records mapped so far (upper bound of indices in use).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.nsegments.load(Acquire) * self.segment_len
    }

    /// Records currently on the free list.
    pub fn free_count(&self) -> usize {
        self.free_count.load(Relaxed)
    }

    /// Largest number of records the pool can ever hold.
    pub fn max_records(&self) -> usize {
        if self.growable { MAX_SEGMENTS * self.segment_len } else { self.segment_len }
    }

    /// The record at `index`, if mapped. Signal-safe.
    #[inline]
    pub fn record(&self, index: usize) -> Option<&'static Record> {
        let seg = index / self.segment_len;
        if seg >= MAX_SEGMENTS {
            return None;
        }
        let base = self.segments[seg].load(Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: segments are never unmapped; index is within the segment.
        Some(unsafe { &*base.add(index % self.segment_len) })
    }

    #[inline(always)]
    fn tid_slot(&self, tid: i32) -> Option<&AtomicU32> {
        let t = tid as usize;
        if tid <= 0 || t >= self.tid_limit {
            return None;
        }
        // SAFETY: t < tid_limit, table mapped for tid_limit entries.
        Some(unsafe { &*self.tid_table.add(t) })
    }

    /// Depth of osprey signal handlers running on thread `tid` (registered
    /// or not). Handlers bump it on entry; the test allocator aborts when it
    /// is non-zero. Signal-safe.
    #[inline]
    pub fn handler_depth(&self, tid: i32) -> Option<&AtomicU32> {
        let t = tid as usize;
        if tid <= 0 || t >= self.tid_limit {
            return None;
        }
        // SAFETY: t < tid_limit, table mapped for tid_limit entries.
        Some(unsafe { &*self.depth_table.add(t) })
    }

    /// Record index registered for `tid`. Signal-safe.
    #[inline]
    pub fn lookup(&self, tid: i32) -> Option<(usize, &'static Record)> {
        let v = self.tid_slot(tid)?.load(Acquire);
        if v == 0 {
            return None;
        }
        let idx = (v - 1) as usize;
        let rec = self.record(idx)?;
        (rec.tid.load(Relaxed) == tid).then_some((idx, rec))
    }

    /// The calling thread's record. Signal-safe.
    #[inline]
    pub fn current(&self) -> Option<(usize, &'static Record)> {
        self.lookup(sys::gettid())
    }

    /// Claims a record for the calling thread, or returns the one it has.
    /// Signal-safe: callable from the priming handler. Callers outside a
    /// handler must block the profiler's signals around it (see `register_current`).
    pub fn claim_current(&self, path: Path) -> Option<(usize, &'static Record)> {
        let tid = sys::gettid();
        if let Some(found) = self.lookup(tid) {
            return Some(found); // dedup: already registered
        }
        let slot = self.tid_slot(tid)?;
        let Some(idx) = self.pop_free() else {
            self.exhausted.fetch_add(1, Relaxed);
            return None;
        };
        let rec = self.record(idx as usize)?;
        rec.tid.store(tid, Relaxed);
        rec.path.store(path as u32, Relaxed);
        rec.registered_ns.store(sys::monotonic_ns(), Relaxed);
        rec.state.store(state::CLAIMED, Release);
        if slot.compare_exchange(0, idx + 1, AcqRel, Acquire).is_err() {
            // A stale entry for a reused tid: the old owner is dead (its tid is ours now).
            let old = slot.load(Acquire);
            if let Some(old_rec) = self.record((old - 1) as usize) {
                if old_rec.tid.load(Relaxed) == tid {
                    old_rec.tid.store(0, Relaxed);
                    old_rec.state.store(state::RETIRED, Release);
                }
            }
            slot.store(idx + 1, Release);
        }
        Some((idx as usize, rec))
    }

    /// Marks the record of `tid` retired: it stops being found by the handler;
    /// the collector drains and recycles it. Call from the exiting thread (with
    /// profiler signals blocked) or for a tid known to be dead.
    pub fn retire(&self, tid: i32) -> bool {
        let Some((idx, rec)) = self.lookup(tid) else { return false };
        if let Some(slot) = self.tid_slot(tid) {
            let _ = slot.compare_exchange(idx as u32 + 1, 0, AcqRel, Acquire);
        }
        // A zero tid tells writer-side caches (`context`) the record is no longer theirs.
        rec.tid.store(0, Release);
        rec.state.store(state::RETIRED, Release);
        true
    }

    /// Puts a drained, retired record back on the free list. Collector only.
    pub fn recycle(&self, index: usize) {
        let Some(rec) = self.record(index) else { return };
        if rec
            .state
            .compare_exchange(state::RETIRED, state::FREE, AcqRel, Acquire)
            .is_err()
        {
            return;
        }
        rec.tid.store(0, Relaxed);
        rec.path.store(0, Relaxed);
        rec.stack_hi.store(0, Relaxed);
        rec.stack_lo.store(0, Relaxed);
        rec.primed_sp.store(0, Relaxed);
        rec.start_time.store(0, Relaxed);
        rec.context.reset();
        self.push_free(index as u32);
    }

    /// Visits every record index that is not free.
    pub fn for_each_active(&self, mut f: impl FnMut(usize, &'static Record)) {
        for i in 0..self.capacity() {
            if let Some(r) = self.record(i) {
                if r.state() != state::FREE {
                    f(i, r);
                }
            }
        }
    }

    fn push_free(&self, index: u32) {
        let rec = self.record(index as usize).expect("mapped record");
        let mut head = self.free_head.load(Acquire);
        loop {
            rec.next_free.store(head as u32, Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | (index as u64 + 1);
            match self.free_head.compare_exchange_weak(head, new, AcqRel, Acquire) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        self.free_count.fetch_add(1, Relaxed);
    }

    /// Signal-safe pop. Returns a record index.
    fn pop_free(&self) -> Option<u32> {
        let mut head = self.free_head.load(Acquire);
        loop {
            let top = head as u32;
            if top == 0 {
                return None;
            }
            let rec = self.record((top - 1) as usize)?;
            let next = rec.next_free.load(Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | next as u64;
            match self.free_head.compare_exchange_weak(head, new, AcqRel, Acquire) {
                Ok(_) => {
                    self.free_count.fetch_sub(1, Relaxed);
                    return Some(top - 1);
                }
                Err(h) => head = h,
            }
        }
    }
}

/// The calling thread's record, after the full thread-start setup (record,
/// stack bounds, CPU clock; see `discovery::register_current`, idempotent):
/// a record claimed by the priming handler gets its setup now rather than at
/// the next scan. Not signal-safe: for application-side writers (context
/// setters cache the result) and thread hooks.
pub fn current_or_register() -> Option<&'static Record> {
    Registry::get_or_init(RegistryConfig::default()).ok()?;
    crate::discovery::register_current().map(|(_, r)| r)
}

/// Blocks every signal on the calling thread until dropped.
pub struct SignalBlock(libc::sigset_t);

impl SignalBlock {
    pub fn all() -> Self {
        // SAFETY: plain sigset manipulation on stack values.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalBlock(old)
        }
    }
}

impl Drop for SignalBlock {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `all`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
}
