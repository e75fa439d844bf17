//! Thread registry: one pre-allocated [`Record`] per profiled thread.
//!
//! | file | what | runs in handlers? |
//! |---|---|---|
//! | `lookup.rs` | finding a thread's record, claiming one (priming) | **yes** |
//! | `pool.rs` | creating, growing, retiring and recycling records | no (agent) |
//!
//! The signal-safe half uses only atomics on memory mapped before any handler
//! could run.
//!
//! # How the handler finds its record (no lazy TLS)
//! A tid-indexed table (`tid -> record index + 1`, one `AtomicU32` per possible
//! tid up to the kernel's ceiling for `pid_max`) is mapped once, lazily committed by
//! the kernel. The handler reads `gettid()` with a raw syscall and loads one
//! entry. No `__tls_get_addr`, no `pthread_getspecific`, no errno; it even works
//! on a raw `clone` thread whose `%fs` is not a libc thread pointer.
//!
//! # Invariants
//! - A record is owned by exactly one live tid from `claim` until `retire`;
//!   `tid_table[tid] == index + 1` exactly while that holds. `retire` leaves
//!   `(index + 1) | RETIRED_BIT` instead of 0: the tid stays known as one
//!   whose exit path charged its CPU (however many threads exit at once)
//!   until a thread claims it again.
//! - Records are never unmapped; a retired record goes back to the free list
//!   only after the collector drained its sample ring (`recycle`).
//! - A record whose ring holds samples not yet drained, or that is retired
//!   and not yet recycled, has its `dirty` bit set: producers set it
//!   (Release) after pushing, the collector clears it (Acquire swap) before
//!   draining, so a push that races the drain sets it again and is seen by
//!   the next drain.
//! - `high_water` is raised (before the claimed record's state is
//!   published) past every index ever claimed, and never lowered.
//! - The free list is a Treiber stack whose head packs `(tag << 32) | (index + 1)`;
//!   every successful CAS bumps the tag, so a head that was popped and pushed
//!   back in between (ABA) fails the CAS.

mod lookup;
mod pool;

use crate::record::Record;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

/// Most segments the pool can grow to (each one holds `segment_len` records).
pub const MAX_SEGMENTS: usize = 64;

/// The pool of thread records. One per process, never freed.
pub struct Registry {
    segments: [AtomicPtr<Record>; MAX_SEGMENTS],
    nsegments: AtomicUsize,
    segment_len: usize,
    growable: bool,
    free_head: AtomicU64,
    free_count: AtomicUsize,
    /// One past the highest record index ever claimed: records at or above
    /// it have always been free, so [`Registry::for_each_active`] stops
    /// there instead of faulting in one page per record of the pool.
    high_water: AtomicUsize,
    tid_table: *const AtomicU32,
    /// Per-tid nesting depth of osprey signal handlers (see `handler_depth`).
    depth_table: *const AtomicU32,
    /// One bit per record index: its ring got a sample, or it was retired,
    /// since the collector last drained it (see `push_sample`, `for_each_dirty`).
    dirty: *const AtomicU64,
    /// Words in `dirty` (covers `MAX_SEGMENTS * segment_len` records).
    dirty_words: usize,
    /// Free-list links, one per possible record (index + 1 of the next free
    /// record, 0 at the end). Apart from the records, so that filling the
    /// free list of a new segment writes a few pages, not one per record.
    links: *const AtomicU32,
    /// Bumped at every claim and retire: discovery skips its full scan while
    /// this and the thread count stay the same.
    pub changes: AtomicU64,
    tid_limit: usize,
    /// Samples that arrived on a thread without a record (pool exhausted, or not primed yet).
    pub dropped_unregistered: AtomicU64,
    /// Claims that failed because the pool was exhausted.
    pub exhausted: AtomicU64,
}

/// Set in a tid-table entry by `retire`: the tid's record was given up (see
/// the invariants above). Record indices stay far below it.
const RETIRED_BIT: u32 = 1 << 31;

// SAFETY: all shared state is atomics or immutable after construction.
unsafe impl Sync for Registry {}
// SAFETY: as for Sync: the raw table pointers are never freed and only read through atomics.
unsafe impl Send for Registry {}

/// The process registry, published once (Release) and never freed.
static GLOBAL: AtomicPtr<Registry> = AtomicPtr::new(core::ptr::null_mut());
/// Serialises creation of [`GLOBAL`].
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
