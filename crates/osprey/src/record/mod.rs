//! The layout shared by the registry, the trace context and the sample ring:
//! one [`Record`] per profiled thread, holding its [`ContextRecord`] and its
//! [`SampleRing`]. Records live in memory mapped up front and zeroed; all-zero
//! bytes are a valid free record.
//!
//! Every field is an atomic or a signal-safe structure: handlers read and
//! write records without locks.

mod context;
mod lost;
mod ring;

pub use context::{
    checksum, snapshot_checksum, tags_term, torn_reads, trace_term, ContextRecord, ContextSnapshot, OtelRecord,
    ValueBytes, KNUTH, OTEL_ATTRS_CAPACITY, OTEL_MAX_VALUE, TAG_SLOTS, TORN_READS,
};
pub use lost::{Lost, LostSums};
pub use ring::{SampleKind, SampleRecord, SampleRing, RING_CAPACITY};

use core::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// Upper bound of the configurable stack depth.
pub const MAX_FRAMES: usize = 256;

/// Where a record is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RecordState {
    /// On the free list.
    Free = 0,
    /// Owned by a live thread.
    Claimed = 1,
    /// The thread is gone; waiting for the collector to drain and recycle it.
    Retired = 2,
}

impl RecordState {
    #[inline]
    fn from_u32(v: u32) -> RecordState {
        match v {
            1 => RecordState::Claimed,
            2 => RecordState::Retired,
            _ => RecordState::Free,
        }
    }
}

/// How a thread got its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Origin {
    /// Registered from inside the thread before its start routine (interposed
    /// `pthread_create`, or `register_current_thread` in library mode).
    ThreadStart = 1,
    /// Found by the discovery scan.
    Discovery = 2,
}

/// Per-thread profiler state. Lives in a pool mapped up front; see module docs.
///
/// Page-aligned, with everything a thread that takes no sample touches
/// (context, ids, clock, bounds, counters) in its first page: an idle thread
/// costs one resident page; the frame buffer and the ring's slots become
/// resident only as samples are taken.
#[repr(C, align(4096))]
pub struct Record {
    /// Trace context, written by the application thread, read by the handler.
    pub context: ContextRecord,
    /// Owning OS thread id (0 when free).
    pub tid: AtomicI32,
    /// [`RecordState`] as u32; see [`Record::state`].
    pub(crate) state: AtomicU32,
    /// [`Origin`] as u32 (0 when free).
    pub origin: AtomicU32,
    /// The CPU clock driving this thread's samples, as `cpu_clock::Armed`
    /// encodes it (0: none).
    pub clock: AtomicU64,
    /// CPU nanoseconds the samples of this thread stood for so far.
    pub charged_ns: AtomicU64,
    /// CPU nanoseconds the thread used while it had no working clock (the
    /// program closed its descriptor), found by discovery: added to its
    /// next sample, which swaps it to 0. Not part of `charged_ns` until then.
    pub owed_ns: AtomicU64,
    /// 1 when the thread blocks the sampling signal: it has no clock and its
    /// CPU time is accounted from its clock reading instead.
    pub blocked: AtomicU32,
    /// Valid frames in `frames` (0: no sample yet).
    pub last_depth: AtomicU32,
    /// Entry point of the thread's start routine, when the thread-start
    /// path knows it (0: unknown): the stack charged for CPU time a thread
    /// used before its first sample.
    pub start_routine: AtomicU64,
    /// Set while this thread runs a profiler signal handler (nesting depth).
    pub in_handler: AtomicU32,
    /// Highest stack address of the thread (exclusive); 0 = unknown yet.
    pub stack_hi: AtomicUsize,
    /// Lowest mapped stack address of the thread; 0 = unknown yet.
    pub stack_lo: AtomicUsize,
    /// A stack pointer seen by a handler while the bounds were unknown, so the
    /// collector can find the stack mapping.
    pub primed_sp: AtomicUsize,
    /// `starttime` from `/proc/self/task/TID/stat` (detects tid reuse); 0 = unknown.
    pub start_time: AtomicU64,
    /// Monotonic time of registration.
    pub registered_ns: AtomicU64,
    /// Samples this thread took while the ring was full (reported, never silent).
    pub lost: Lost,
    /// Samples taken on this thread.
    pub samples: AtomicU64,
    /// The thread's name (`comm`, NUL-padded) as it exited, or as the
    /// process's exit path found it (`exit`, `_exit`, an exec): samples
    /// drained after it is gone still carry its name, and a thread never
    /// named costs no `/proc` read. Zero before that.
    pub exit_name: [AtomicU64; 2],
    /// The tid whose name `exit_name` is (a retired record's `tid` is 0).
    pub exit_tid: AtomicI32,
    /// Wall nanoseconds the wall sampler found this thread running for and
    /// not yet recorded: the thread's next CPU sample records them with its
    /// stack (`signal::wall`), so a running thread is never signalled for
    /// wall time. Swapped to 0 by that handler or at recycling.
    pub wall_pending_ns: AtomicU64,
    /// Frames of the last stack walked (`frames[..last_depth]`, leaf first);
    /// also the handler's work buffer, so the walk costs the interrupted
    /// stack nothing. Touched only by the owning thread (its handler, or the
    /// thread itself with the sampling signal blocked).
    pub frames: UnsafeCell<[u64; MAX_FRAMES]>,
    /// Per-thread sample records, drained by the collector.
    pub ring: SampleRing,
}

// Everything an idle thread touches lies in the record's first page (see
// `Record`'s docs): the header fields end before the frame buffer, which
// starts in that page.
const _: () = {
    assert!(core::mem::offset_of!(Record, samples) + 8 <= core::mem::offset_of!(Record, frames));
    assert!(core::mem::offset_of!(Record, frames) < 4096);
};

// SAFETY: every field is an atomic except `frames`, which only the owning
// thread touches (see its docs).
unsafe impl Sync for Record {}

impl Record {
    /// Where the record is in its life (Acquire).
    #[inline]
    pub fn state(&self) -> RecordState {
        RecordState::from_u32(self.state.load(Acquire))
    }

    /// The name stored by the exiting thread, if any.
    pub fn exit_name(&self) -> Option<String> {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.exit_name[0].load(Acquire).to_ne_bytes());
        b[8..].copy_from_slice(&self.exit_name[1].load(Acquire).to_ne_bytes());
        let n = b.iter().position(|&c| c == 0).unwrap_or(16);
        (n > 0).then(|| String::from_utf8_lossy(&b[..n]).into_owned())
    }

    /// How the owning thread got the record, if claimed.
    pub fn origin(&self) -> Option<Origin> {
        match self.origin.load(Relaxed) {
            1 => Some(Origin::ThreadStart),
            2 => Some(Origin::Discovery),
            _ => None,
        }
    }
}
