//! Call trace storage: deduplicated stacks in lock-free hash tables,
//! rotated through a triple buffer.
//!
//! | file | what | signal-safe? |
//! |---|---|---|
//! | `put.rs` | [`CallTraceStorage::put`] | **yes** |
//! | `table.rs` | open-addressing table (insert: yes; collect/clear: no) | insert: **yes** |
//! | `arena.rs` | bump allocator for frames | store/match: **yes** |
//! | `hazard.rs` | per-thread hazard pointers | protect/release: **yes** |
//! | `hash.rs` | trace hash | **yes** |
//! | `sync.rs` | std/loom atomics shim | **yes** |
//! | `mem.rs` | mmap'd zeroed buffers | access: **yes** |
//! | `rotation.rs` | [`CallTraceStorage::rotate`], liveness | no (collector) |
//!
//! # Triple buffer
//! Three equal tables take turns as ACTIVE (handlers `put` into it), STANDBY
//! (traces preserved from the previous cycle, under their old ids) and SCRATCH
//! (the previous ACTIVE, being drained). See `rotation.rs` for the steps and
//! `hazard.rs` for why the collector never touches a table a handler writes.
//!
//! # Ids
//! `(epoch << 32) | slot`; the epoch starts at 1 and is bumped every time a
//! table becomes ACTIVE, so ids never repeat across activations and never
//! equal [`DROPPED_TRACE_ID`].
//!
//! # Accounting
//! Every `put` adds its count/value to exactly one place: an entry of the
//! ACTIVE table it was protected on, or the dropped counters. Each ACTIVE table
//! is collected exactly once (the rotation that retires it) and the dropped
//! counters are swapped to zero by each rotation, so every put is reported by
//! exactly one `rotate`. Preserved traces are copies with counts reset to 0.

mod arena;
mod hash;
mod hazard;
mod mem;
mod put;
mod rotation;
pub(crate) mod sync;
mod table;

#[cfg(all(test, loom))]
mod loom;
#[cfg(all(test, not(loom)))]
mod tests;

pub use hash::trace_hash;
pub use rotation::LivenessChecker;
pub use table::ENTRY_BYTES;

use std::io;
use sync::{AtomicU64, AtomicUsize, Mutex};

/// Trace id of samples that could not be stored (table or arena full).
pub const DROPPED_TRACE_ID: u64 = 1;

#[derive(Clone, Copy, Debug)]
/// Sizing of a storage.
pub struct StorageConfig {
    /// Memory budget for tables and frame arenas, in bytes.
    pub memory_budget: usize,
    /// Largest thread slot index + 1 that will call `put`.
    pub max_threads: usize,
}

/// One deduplicated stack collected at rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectedTrace {
    /// Trace id (`(epoch << 32) | slot`).
    pub id: u64,
    /// Frames, leaf first.
    pub frames: Vec<u64>,
    /// The walk was cut at the maximum depth.
    pub truncated: bool,
    /// Samples put under this trace during the cycle.
    pub count: u64,
    /// Sum of their values.
    pub value: u64,
}

/// Why samples were dropped during one cycle (their count/value are in the
/// [`DROPPED_TRACE_ID`] trace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropStats {
    /// No free or matching slot within the probe limit.
    pub table_full: u64,
    /// Frames did not fit in the arena.
    pub arena_full: u64,
    /// The active table changed under the put too many times in a row.
    pub contention: u64,
    /// `thread_slot >= max_threads`.
    pub bad_slot: u64,
}

#[derive(Debug, Default)]
/// What one rotation collected.
pub struct Collected {
    /// One entry per distinct (frames, truncated), plus the dropped trace
    /// (id 1, no frames) when anything was dropped.
    pub traces: Vec<CollectedTrace>,
    /// `(id, kept_id)`: ids handed out by `put` (or preserved) whose trace was
    /// merged into the trace `kept_id` (duplicates created under contention, or
    /// a preserved copy of a stack that was also put this cycle).
    pub aliases: Vec<(u64, u64)>,
    /// Dropped samples, by reason.
    pub dropped: DropStats,
    /// Traces copied into STANDBY for the next cycle (ids chosen by liveness checkers).
    pub preserved: usize,
    /// Requested ids that could not be preserved (unknown id or STANDBY full).
    pub preserve_failed: usize,
}

/// Lock-free call trace storage; see the module docs.
pub struct CallTraceStorage {
    tables: [table::Table; 3],
    /// Index of the ACTIVE table. Written only by the collector.
    active: AtomicUsize,
    hazards: hazard::Hazards,
    drops: Drops,
    collector: Mutex<rotation::CollectorState>,
}

/// Dropped samples since the last rotation.
struct Drops {
    count: AtomicU64,
    value: AtomicU64,
    table_full: AtomicU64,
    arena_full: AtomicU64,
    contention: AtomicU64,
    bad_slot: AtomicU64,
}

/// Table geometry derived from a memory budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Slots per table (a power of two).
    pub table_entries: usize,
    /// Arena size per table, in 64-bit words.
    pub arena_words: usize,
}

impl Geometry {
    /// Splits `budget` over three tables; in each, about a fifth goes to slots
    /// (`ENTRY_BYTES` each) and the rest to frames. Tiny budgets still get 2 slots.
    pub fn for_budget(budget: usize) -> Geometry {
        let per_table = budget / 3;
        let want = (per_table / 5 / ENTRY_BYTES).clamp(2, 1 << 31);
        let table_entries = 1usize << (usize::BITS - 1 - want.leading_zeros());
        let slots = table_entries * ENTRY_BYTES + table::used_bytes(table_entries);
        let arena_words = per_table.saturating_sub(slots) / 8;
        Geometry { table_entries, arena_words }
    }
}

impl CallTraceStorage {
    /// Not signal-safe (maps memory). Must be created before any handler can `put`.
    pub fn new(cfg: StorageConfig) -> io::Result<Self> {
        Self::with_geometry(Geometry::for_budget(cfg.memory_budget), cfg.max_threads)
    }

    /// As [`new`](Self::new) with an explicit geometry (tests, tuning).
    pub fn with_geometry(g: Geometry, max_threads: usize) -> io::Result<Self> {
        let t = || table::Table::new(g.table_entries, g.arena_words);
        let tables = [t()?, t()?, t()?];
        tables[0].begin_epoch(1);
        Ok(CallTraceStorage {
            tables,
            active: AtomicUsize::new(0),
            hazards: hazard::Hazards::new(max_threads)?,
            drops: Drops::new(),
            collector: Mutex::new(rotation::CollectorState::new()),
        })
    }

    /// Slots per table.
    pub fn table_capacity(&self) -> usize {
        self.tables[0].capacity()
    }

    /// Bytes mapped for the three tables and arenas.
    pub fn mapped_bytes(&self) -> usize {
        self.tables.iter().map(|t| t.bytes()).sum()
    }

    /// Arena words used in the ACTIVE table (approximate while handlers run).
    pub fn active_arena_words(&self) -> usize {
        let a = self.active.load(sync::Ordering::Acquire);
        self.tables.get(a).map_or(0, |t| t.arena_used_words())
    }
}
