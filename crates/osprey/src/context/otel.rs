//! OpenTelemetry: copy the active OTel span's ids into the osprey context.
//!
//! - trace id = the 16 bytes of the OTel `TraceId`, big-endian (the number
//!   its 32 hex digits spell), with the span's trace flags;
//! - span id = the 8 bytes of the OTel `SpanId`, big-endian (the same number
//!   its hex form shows);
//! - local root span id = the low 64 bits of the `TraceId` (its last 8 bytes,
//!   big-endian). OTel does not expose the process-local root span, so
//!   samples of one trace share it; a 64-bit trace id (as some tracers use)
//!   maps to itself.

use super::{scope_trace, ContextGuard};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;

/// The ids of an OTel span as osprey stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    /// W3C trace id.
    pub trace_id: u128,
    /// Span id.
    pub span_id: u64,
    /// W3C trace flags.
    pub trace_flags: u8,
    /// Local root span id (the trace id's low 64 bits).
    pub local_root_span_id: u64,
}

/// The ids of `cx`'s span, if it has a valid one.
pub fn ids(cx: &Context) -> Option<Ids> {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let trace_id = u128::from_be_bytes(sc.trace_id().to_bytes());
    Some(Ids {
        trace_id,
        span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
        trace_flags: sc.trace_flags().to_u8(),
        local_root_span_id: trace_id as u64,
    })
}

/// Sets osprey's context from `cx`'s span until the guard drops (then the
/// previous context comes back). Without a valid span, nothing changes.
pub fn attach(cx: &Context) -> ContextGuard {
    match ids(cx) {
        Some(i) => scope_trace(i.trace_id, i.span_id, i.trace_flags, i.local_root_span_id),
        None => ContextGuard::restoring(super::current()),
    }
}

/// [`attach`] for `Context::current()`.
pub fn attach_current() -> ContextGuard {
    attach(&Context::current())
}
