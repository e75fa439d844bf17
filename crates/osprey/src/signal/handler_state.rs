//! The state handlers read: one process-wide [`HandlerState`], set by the
//! agent before sampling starts, plus the handlers' own counters.

use super::unwind::CodeRanges;
use crate::storage::CallTraceStorage;
use osprey_unwind::{ModuleSet, Shared};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize};

pub use crate::record::MAX_FRAMES;

/// Handler-visible configuration and counters.
///
/// Invariant: `storage` is published (Release) before `enabled` is set and is
/// never freed while the process lives (replaced storages are leaked), so a
/// handler that saw `enabled` may dereference what it loads. `modules`, when
/// not null, is likewise never freed (its `Arc` is leaked when published);
/// the module sets inside it are reclaimed by `Shared`'s reader counters.
pub struct HandlerState {
    /// Sampling on/off; the handler returns at once when off.
    pub enabled: AtomicBool,
    /// Where handlers `put` stacks.
    pub storage: AtomicPtr<CallTraceStorage>,
    /// The unwind tables of the loaded modules (null: frame pointers only).
    pub modules: AtomicPtr<Shared<ModuleSet>>,
    /// The loaded modules' code, published (and leaked: never freed) while
    /// `modules` is not yet: what the frame-pointer walk takes for return
    /// addresses (null: any word).
    pub code: AtomicPtr<CodeRanges>,
    /// Frames kept per stack (1..=[`MAX_FRAMES`]).
    pub max_depth: AtomicUsize,
    /// CPU nanoseconds one sample stands for.
    pub period_ns: AtomicU64,
    /// Sampling signals handled (any thread).
    pub signals: AtomicU64,
    /// CPU nanoseconds charged to samples (any thread, exit remainders included).
    pub charged_ns: AtomicU64,
    /// Samples whose walk did not reach an outermost frame (depth limit, a pc
    /// in no module, a frame the CFI cannot follow, unknown stack bounds).
    pub truncated: AtomicU64,
    /// Sampling signals a handler took off the queue after its walk and
    /// counted in its sample's weight (a handler slower than its period):
    /// delivered, not walked.
    pub folded: AtomicU64,
    /// Samples walked with the CFI tables.
    pub cfi_walks: AtomicU64,
    /// Of those, walks that reached an outermost frame (`_start`, a thread's start).
    pub cfi_complete: AtomicU64,
    /// Samples taken before the thread's stack bounds were known (leaf only).
    pub leaf_only: AtomicU64,
    /// Priming signals handled.
    pub primed: AtomicU64,
    /// Wall records of running threads pushed by sampling handlers
    /// (`signal::wall`).
    pub wall_records: AtomicU64,
    /// The sampling signal's number (0 before start).
    pub sample_signal: AtomicI32,
    /// The priming signal's number (0 before start).
    pub prime_signal: AtomicI32,
}

/// The one handler state of the process.
pub static STATE: HandlerState = HandlerState {
    enabled: AtomicBool::new(false),
    storage: AtomicPtr::new(core::ptr::null_mut()),
    modules: AtomicPtr::new(core::ptr::null_mut()),
    code: AtomicPtr::new(core::ptr::null_mut()),
    max_depth: AtomicUsize::new(128),
    period_ns: AtomicU64::new(10_000_000),
    signals: AtomicU64::new(0),
    charged_ns: AtomicU64::new(0),
    truncated: AtomicU64::new(0),
    folded: AtomicU64::new(0),
    cfi_walks: AtomicU64::new(0),
    cfi_complete: AtomicU64::new(0),
    leaf_only: AtomicU64::new(0),
    primed: AtomicU64::new(0),
    wall_records: AtomicU64::new(0),
    sample_signal: AtomicI32::new(0),
    prime_signal: AtomicI32::new(0),
};
