//! OpenTelemetry: copy the active OTel span's ids into the osprey context.
//!
//! - span id = the 8 bytes of the OTel `SpanId`, big-endian (the same number
//!   its hex form shows);
//! - local root span id = the low 64 bits of the `TraceId` (its last 8 bytes,
//!   big-endian). OTel does not expose the process-local root span, and the
//!   trace id is what a user has in hand when jumping from a trace to its
//!   profile; a 64-bit trace id (as some tracers use) maps to itself.

use super::{scope, ContextGuard};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;

/// `(span_id, local_root_span_id)` of `cx`'s span, if it has a valid one.
pub fn ids(cx: &Context) -> Option<(u64, u64)> {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let trace = sc.trace_id().to_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace[8..]);
    Some((u64::from_be_bytes(sc.span_id().to_bytes()), u64::from_be_bytes(low)))
}

/// Sets osprey's context from `cx`'s span until the guard drops (then the
/// previous context comes back). Without a valid span, nothing changes.
pub fn attach(cx: &Context) -> ContextGuard {
    match ids(cx) {
        Some((span, root)) => scope(span, root),
        None => ContextGuard::restoring(super::current()),
    }
}

/// [`attach`] for `Context::current()`.
pub fn attach_current() -> ContextGuard {
    attach(&Context::current())
}
