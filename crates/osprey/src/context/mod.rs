//! Per-thread trace context: W3C trace id, span id, local root span id and
//! up to [`TAG_SLOTS`] tags, written by the application thread and read
//! without locks by the profiler's signal handler, so each sample carries the
//! context that was active when it was taken.
//!
//! The same record is an OpenTelemetry thread-context record (OTEP 4947,
//! [`crate::record::OtelRecord`]): the preloaded agent points its TLS symbol
//! `otel_thread_ctx_v1` at it ([`set_tls_publisher`]) and announces it in the
//! OTEP 4719 process context ([`process_ctx`]), so profilers outside the
//! process (eBPF, `osprey dump --pid`) read the same ids.
//!
//! # Write protocol
//! The owner thread is the only writer of its [`ContextRecord`]. Each update:
//! 1. computes the new checksum (pure arithmetic, before touching the record);
//! 2. stores `checksum = 0` and the OTEP `valid = 0` ("in progress");
//! 3. stores the changed fields (and the OTEP attributes if a tag changed);
//! 4. stores the new checksum, which is never 0 for a non-empty context,
//!    then `valid = 1`.
//!
//! The handler ([`ContextRecord::read`]) loads the checksum first; 0 means
//! "nothing to report". Otherwise it loads the fields, recomputes the checksum
//! and accepts the fields only if it matches (a mismatch is counted in
//! `TORN_READS` and the sample goes unlabelled: never a torn pair).
//!
//! # Ordering: the same-thread reader
//! The reader that matters runs in a signal handler *on the writer's own
//! thread*. It interrupts the writer between two instructions and the writer
//! does not run again until it returns, and a CPU always observes its own
//! thread's memory operations in program order. So the only hazard is the
//! *compiler* moving stores across each other; no CPU barrier is needed on
//! any architecture. What is required:
//! - the `checksum = 0` store must be emitted before every field store
//!   (`compiler_fence(SeqCst)` after it);
//! - every field store must be emitted before the final checksum store
//!   (`Release` store, which implies the compiler fence; on x86 it is a plain
//!   `mov`, on AArch64 an `stlr`);
//! - all accesses are atomics, so none is torn, duplicated or elided.
//!
//! With that, the handler sees either the old checksum with the old fields,
//! `0`, or the new checksum with the new fields; the checksum comparison is a
//! second line of defence that in-process should never fire.
//!
//! # Ordering: an out-of-process reader
//! A reader on another CPU (eBPF at a perf event on another core, or a
//! process reading `/proc/PID/mem`) races the writer for real, so in addition
//! it needs:
//! - CPU ordering on the writer side: the field stores must become visible
//!   after `checksum = 0` and before the new checksum (Release semantics for
//!   both steps). x86-64 is TSO, so the compiler fences above already give
//!   this; on weakly ordered CPUs the fence after `checksum = 0` would have to
//!   become `fence(Release)`, which this module does not pay for.
//! - CPU ordering on the reader side: Acquire on the first checksum load, and
//!   an Acquire fence before re-loading it;
//! - a seqlock-style re-check: read checksum, fields, checksum again; accept
//!   only if both are equal, nonzero and match the fields (the writer may
//!   have finished a whole update in between, which the recomputed checksum
//!   alone would catch only probabilistically).
//!
//! # Writer-side cache
//! Setters find the calling thread's record through a const-initialized
//! `thread_local!` holding the record pointer and the tid it was cached for.
//! Each write re-validates it with two loads (`record.tid`, `record.state`),
//! because records are recycled after their thread exits. The handler never
//! touches this cache (it finds records through the registry's tid table).

#[cfg(feature = "opentelemetry")]
pub mod otel;
pub mod process_ctx;
mod tags;
#[cfg(feature = "tracing")]
pub mod tracing_layer;

use crate::record::{ContextRecord, Record};
pub use crate::record::{ContextSnapshot, TAG_SLOTS};
use crate::threads;
pub use tags::{
    find_tag_key, intern_value, tag_key, tag_key_name, tag_keys, tag_value, tag_values_overflowed, value_bytes,
    MAX_KEY_LEN, MAX_TAG_VALUES, OVERFLOW_VALUE, OVERFLOW_VALUE_ID,
};

use core::cell::Cell;
use core::ffi::c_void;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Sets the calling thread's `otel_thread_ctx_v1` TLS pointer (0: none).
pub type TlsPublisher = extern "C" fn(*const c_void);

static TLS_PUBLISHER: AtomicUsize = AtomicUsize::new(0);

/// Makes every thread point `f`'s TLS variable at its OTEP record when it
/// first uses the context API (or first again after its record changed).
/// The preloaded agent passes the setter of its exported
/// `otel_thread_ctx_v1` at start, before the program's threads run.
pub fn set_tls_publisher(f: TlsPublisher) {
    TLS_PUBLISHER.store(f as usize, Relaxed);
}

/// Points the thread's OTEP TLS variable at `rec`, if a publisher is set.
fn publish_tls(rec: &ContextRecord) {
    let f = TLS_PUBLISHER.load(Relaxed);
    if f != 0 {
        // SAFETY: only `set_tls_publisher` stores here, from a `TlsPublisher`.
        let f: TlsPublisher = unsafe { core::mem::transmute::<usize, TlsPublisher>(f) };
        f(rec.otel_record().cast());
    }
}

struct Cache {
    rec: Cell<*const Record>,
    tid: Cell<i32>,
}

thread_local! {
    static CACHE: Cache = const { Cache { rec: Cell::new(core::ptr::null()), tid: Cell::new(0) } };
}

/// The calling thread's context record, registering the thread on first use.
/// `None` if the registry cannot give this thread a record (pool exhausted;
/// retried on the next call). Not signal-safe.
#[inline(always)]
pub fn this_thread() -> Option<&'static ContextRecord> {
    CACHE.with(|c| {
        let p = c.rec.get();
        if !p.is_null() {
            // SAFETY: registry records are never unmapped.
            let rec = unsafe { &*p };
            if rec.tid.load(Relaxed) == c.tid.get() {
                return Some(&rec.context);
            }
        }
        refresh(c)
    })
}

#[cold]
#[inline(never)]
fn refresh(c: &Cache) -> Option<&'static ContextRecord> {
    c.rec.set(core::ptr::null());
    let rec = threads::current_or_register()?;
    c.tid.set(rec.tid.load(Relaxed));
    c.rec.set(rec);
    publish_tls(&rec.context);
    Some(&rec.context)
}

/// Sets the calling thread's span and local root span ids, without a trace
/// id (tags unchanged).
#[inline]
pub fn set(span_id: u64, local_root_span_id: u64) {
    if let Some(r) = this_thread() {
        r.store_ids(0, 0, span_id, local_root_span_id);
    }
}

/// Sets the calling thread's W3C trace id (as the number its 32 hex digits
/// spell), trace flags, span id and local root span id (tags unchanged).
#[inline]
pub fn set_trace(trace_id: u128, span_id: u64, trace_flags: u8, local_root_span_id: u64) {
    if let Some(r) = this_thread() {
        r.store_ids(trace_id, trace_flags, span_id, local_root_span_id);
    }
}

/// Clears the trace and span ids (tags stay; use [`clear_all`] for everything).
#[inline]
pub fn clear() {
    set(0, 0);
}

/// Clears span ids and every tag of the calling thread.
pub fn clear_all() {
    replace(None);
}

/// Replaces the whole context (ids and tags); `None` empties it.
#[inline]
pub fn replace(ctx: Option<ContextSnapshot>) {
    if let Some(r) = this_thread() {
        r.store(&ctx.unwrap_or_default(), &value_bytes);
    }
}

/// The calling thread's context as last written (`None` when empty).
pub fn current() -> Option<ContextSnapshot> {
    this_thread()?.load()
}

/// Why a tag could not be set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagError {
    /// Empty or over-long key, or all [`TAG_SLOTS`] keys already registered.
    BadKey,
    /// The calling thread has no registry record.
    NoRecord,
}

/// Sets tag `key` to `value` on the calling thread (registering the key and
/// interning the value; locks).
pub fn set_tag(key: &str, value: &str) -> Result<(), TagError> {
    let slot = tag_key(key).ok_or(TagError::BadKey)?;
    set_tag_id(slot, intern_value(value))
}

/// Unsets tag `key` on the calling thread.
pub fn clear_tag(key: &str) -> Result<(), TagError> {
    let slot = tag_key(key).ok_or(TagError::BadKey)?;
    set_tag_id(slot, 0)
}

/// Fast path: sets a pre-registered slot ([`tag_key`]) to a pre-interned
/// value id ([`intern_value`]; 0 unsets). No lock.
#[inline]
pub fn set_tag_id(slot: usize, value_id: u32) -> Result<(), TagError> {
    if slot >= TAG_SLOTS {
        return Err(TagError::BadKey);
    }
    this_thread().ok_or(TagError::NoRecord)?.store_tag(slot, value_id, &value_bytes);
    Ok(())
}

/// Sets span ids for the lifetime of the guard; dropping it restores the
/// previous context (ids and tags) of this thread.
#[must_use = "the context is restored when the guard drops"]
pub fn scope(span_id: u64, local_root_span_id: u64) -> ContextGuard {
    scope_trace(0, span_id, 0, local_root_span_id)
}

/// [`scope`] with a W3C trace id and flags (see [`set_trace`]).
#[must_use = "the context is restored when the guard drops"]
pub fn scope_trace(trace_id: u128, span_id: u64, trace_flags: u8, local_root_span_id: u64) -> ContextGuard {
    let prev = current();
    set_trace(trace_id, span_id, trace_flags, local_root_span_id);
    ContextGuard { prev, _not_send: PhantomData }
}

/// Restores the context saved by [`scope`] when dropped. Not `Send`: it must
/// drop on the thread that created it.
pub struct ContextGuard {
    prev: Option<ContextSnapshot>,
    _not_send: PhantomData<*const ()>,
}

impl ContextGuard {
    /// A guard that restores `prev` on drop without changing anything now.
    pub fn restoring(prev: Option<ContextSnapshot>) -> Self {
        ContextGuard { prev, _not_send: PhantomData }
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        replace(self.prev);
    }
}
