//! Call trace storage (issue 5). STUB — signatures fixed, being implemented.

pub mod samples;

pub use samples::{SampleRecord, SampleRing};

/// Trace id of samples that could not be stored (table or arena full).
pub const DROPPED_TRACE_ID: u64 = 1;

#[derive(Clone, Copy, Debug)]
pub struct StorageConfig {
    /// Memory budget for tables and frame arenas, in bytes.
    pub memory_budget: usize,
    /// Largest thread slot index + 1 that will call `put`.
    pub max_threads: usize,
}

/// One deduplicated stack collected at rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectedTrace {
    pub id: u64,
    pub frames: Vec<u64>,
    pub truncated: bool,
    pub count: u64,
    pub value: u64,
}

#[derive(Debug, Default)]
pub struct Collected {
    pub traces: Vec<CollectedTrace>,
}

pub struct CallTraceStorage {}

impl CallTraceStorage {
    pub fn new(_cfg: StorageConfig) -> std::io::Result<Self> {
        Ok(CallTraceStorage {})
    }

    /// Signal-safe. Stores `frames` (leaf first), adds `count`/`value`, calls
    /// `then(trace_id)` while the table is still protected, returns the id.
    #[inline]
    pub fn put(&self, _thread_slot: usize, _frames: &[u64], _truncated: bool, _count: u64, _value: u64, then: impl FnOnce(u64)) -> u64 {
        then(DROPPED_TRACE_ID);
        DROPPED_TRACE_ID
    }

    /// Not signal-safe. Rotates the buffers and returns every trace stored since the last rotation.
    pub fn rotate(&self) -> Collected {
        Collected::default()
    }
}
