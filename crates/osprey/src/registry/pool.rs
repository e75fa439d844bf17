//! The registry's agent side: creating the pool, growing it, retiring the
//! records of threads that are gone and recycling them once drained. Maps
//! memory, allocates, takes the init lock: never called from a handler.

use super::{Registry, RegistryConfig, GLOBAL, INIT_LOCK, MAX_SEGMENTS, RETIRED_BIT};
use crate::fork_lock::ForkLock;
use crate::mmap::map_zeroed;
use crate::record::{Record, RecordState};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// The highest `/proc/sys/kernel/pid_max` the kernel accepts (64-bit).
const PID_MAX_LIMIT: usize = 4_194_304;

/// Held while a thread grows the pool: growth is serialised (see
/// `add_segment_locked`). Its data is nothing; a growth a `fork` interrupted
/// leaves at worst a segment mapped but not counted (leaked) or records not
/// yet on the free list (never used): nothing is handed out twice.
static GROWING: ForkLock<()> = ForkLock::new(());

impl Registry {
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
        // The kernel's ceiling for `pid_max`, not its value now: nothing to
        // read at start, and a `pid_max` raised later is covered. Untouched
        // entries cost no memory.
        let tid_limit = PID_MAX_LIMIT + 1;
        let tid_table = map_zeroed(tid_limit * 4)? as *const AtomicU32;
        let depth_table = map_zeroed(tid_limit * 4)? as *const AtomicU32;
        let segment_len = cfg.capacity.max(1);
        let dirty_words = (MAX_SEGMENTS * segment_len).div_ceil(64);
        let dirty = map_zeroed(dirty_words * 8)? as *const AtomicU64;
        let links = map_zeroed(MAX_SEGMENTS * segment_len * 4)? as *const AtomicU32;
        let r = Registry {
            segments: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_SEGMENTS],
            nsegments: AtomicUsize::new(0),
            segment_len,
            growable: cfg.growable,
            free_head: AtomicU64::new(0),
            free_count: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
            tid_table,
            depth_table,
            dirty,
            dirty_words,
            links,
            changes: AtomicU64::new(0),
            tid_limit,
            dropped_unregistered: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
        };
        r.add_segment()?;
        Ok(r)
    }

    /// Maps one more segment and pushes its records on the free list.
    /// Not signal-safe; called at creation, by the collector when low, and
    /// by threads registering themselves when the pool is empty.
    pub fn add_segment(&self) -> std::io::Result<bool> {
        let _g = GROWING.lock();
        self.add_segment_locked()
    }

    /// [`Registry::add_segment`] with [`GROWING`] set: growth is serialised,
    /// so two growers never map the same segment slot (which would lose one
    /// mapping and put the same record indices on the free list twice).
    fn add_segment_locked(&self) -> std::io::Result<bool> {
        let n = self.nsegments.load(Acquire);
        if n >= MAX_SEGMENTS {
            return Ok(false);
        }
        let bytes = self.segment_len * core::mem::size_of::<Record>();
        let base = map_zeroed(bytes)? as *mut Record;
        // Zeroed memory is a valid free Record (record module docs).
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
            // Another thread growing it now is as good.
            if let Some(_g) = GROWING.try_lock() {
                let _ = self.add_segment_locked();
            }
        }
    }

    /// Adds a segment now if growth is allowed. Not signal-safe.
    pub fn grow_now(&self) -> bool {
        if !self.growable {
            return false;
        }
        let _g = GROWING.lock();
        // Another thread may have grown the pool while this one waited.
        self.free_count() > 0 || self.add_segment_locked().unwrap_or(false)
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
        if self.growable {
            MAX_SEGMENTS * self.segment_len
        } else {
            self.segment_len
        }
    }

    /// Marks the record of `tid` retired: it stops being found by the handler;
    /// the collector drains and recycles it. Call from the exiting thread (with
    /// profiler signals blocked) or for a tid known to be dead.
    pub fn retire(&self, tid: i32) -> bool {
        let Some((idx, rec)) = self.lookup(tid) else { return false };
        if let Some(slot) = self.tid_slot(tid) {
            let v = idx as u32 + 1;
            let _ = slot.compare_exchange(v, v | RETIRED_BIT, AcqRel, Acquire);
        }
        // A zero tid tells writer-side caches (`context`) the record is no longer theirs.
        rec.tid.store(0, Release);
        rec.state.store(RecordState::Retired as u32, Release);
        self.changes.fetch_add(1, Relaxed);
        self.mark_dirty(idx);
        true
    }

    /// Whether `tid` gave up its record and no thread claimed it since: a
    /// thread on its way out whose CPU time its exit path charged (or a dead
    /// tid, or one the kernel gave to a thread not registered yet).
    /// Discovery does not count such a thread's CPU as an unregistered
    /// thread's.
    pub fn retired_recently(&self, tid: i32) -> bool {
        self.tid_slot(tid).is_some_and(|s| s.load(Acquire) & RETIRED_BIT != 0)
    }

    /// Puts a drained, retired record back on the free list. Collector only.
    pub fn recycle(&self, index: usize) {
        let Some(rec) = self.record(index) else { return };
        if rec.state.compare_exchange(RecordState::Retired as u32, RecordState::Free as u32, AcqRel, Acquire).is_err() {
            return;
        }
        rec.tid.store(0, Relaxed);
        rec.origin.store(0, Relaxed);
        rec.stack_hi.store(0, Relaxed);
        rec.stack_lo.store(0, Relaxed);
        rec.primed_sp.store(0, Relaxed);
        rec.start_time.store(0, Relaxed);
        rec.charged_ns.store(0, Relaxed);
        rec.owed_ns.store(0, Relaxed);
        rec.blocked.store(0, Relaxed);
        rec.last_depth.store(0, Relaxed);
        rec.start_routine.store(0, Relaxed);
        rec.exit_name[0].store(0, Relaxed);
        rec.exit_name[1].store(0, Relaxed);
        rec.exit_tid.store(0, Relaxed);
        rec.wall_pending_ns.store(0, Relaxed);
        rec.context.reset();
        self.push_free(index as u32);
    }

    /// Visits the records marked since the last call (samples pushed, or
    /// retired), clearing their marks first: what the collector drains.
    /// Costs one load per 64 records plus the marked ones, so idle threads
    /// cost nothing.
    pub fn for_each_dirty(&self, mut f: impl FnMut(usize, &'static Record)) {
        let words = self.capacity().div_ceil(64).min(self.dirty_words);
        for w in 0..words {
            let Some(word) = self.dirty_word(w) else { break };
            if word.load(Relaxed) == 0 {
                continue;
            }
            let mut bits = word.swap(0, Acquire);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(r) = self.record(i) {
                    if r.state() != RecordState::Free {
                        f(i, r);
                    }
                }
            }
        }
    }

    /// Visits every record index that is not free. Only indices below the
    /// high-water mark are looked at: the pool's untouched records stay
    /// uncommitted (one page each).
    pub fn for_each_active(&self, mut f: impl FnMut(usize, &'static Record)) {
        for i in 0..self.capacity().min(self.high_water.load(Acquire)) {
            if let Some(r) = self.record(i) {
                if r.state() != RecordState::Free {
                    f(i, r);
                }
            }
        }
    }

    fn push_free(&self, index: u32) {
        let link = self.link(index as usize).expect("record index in range");
        let mut head = self.free_head.load(Acquire);
        loop {
            link.store(head as u32, Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | (index as u64 + 1);
            match self.free_head.compare_exchange_weak(head, new, AcqRel, Acquire) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        self.free_count.fetch_add(1, Relaxed);
    }
}
