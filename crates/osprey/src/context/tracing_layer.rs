//! [`OspreyLayer`]: a `tracing_subscriber` layer that writes the entered
//! span into the thread's osprey context.
//!
//! - span id = the `tracing` span [`Id`] as `u64`;
//! - local root span id = the id of the outermost span of the same trace in
//!   this process, computed once in `on_new_span` (the parent's cached root,
//!   or the span itself) and kept in the span's extensions;
//! - trace id = a `trace_id` field of the span or, without one, of its
//!   nearest ancestor that has one: 32 hex digits (a `&str` or `Display`
//!   value) or an integer; none otherwise (trace flags are left 0).
//!
//! `tracing` ids are unique only among *open* spans (the registry reuses
//! slots), which is enough to tell requests apart within one profile. To link
//! with a distributed trace, set OpenTelemetry ids instead (see
//! [`super::otel`]).
//!
//! Enter/exit bookkeeping is per thread: a span (e.g. an async task's) can be
//! entered on several threads, even at once, so the context to restore lives
//! in a thread-local stack, not in the span. `on_exit` restores the whole
//! context (ids and tags) that this thread had before the matching
//! `on_enter`, so tags set while the span was entered do not leak past it.

use super::{current, replace, set_trace, ContextSnapshot};
use std::cell::RefCell;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The layer. Add it to a `tracing_subscriber::Registry`.
#[derive(Clone, Copy, Debug, Default)]
pub struct OspreyLayer {
    _private: (),
}

impl OspreyLayer {
    /// The layer; add it to a `tracing_subscriber::Registry`.
    pub fn new() -> Self {
        OspreyLayer { _private: () }
    }
}

/// Cached in each span's extensions: the local root span id and the trace id.
#[derive(Clone, Copy, Debug)]
struct LocalRoot(u64, u128);

/// Finds a `trace_id` field.
#[derive(Default)]
struct TraceIdField(Option<u128>);

impl Visit for TraceIdField {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record_u128(field, value as u128);
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        if field.name() == "trace_id" && value != 0 {
            self.0 = Some(value);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "trace_id" && value.len() == 32 {
            self.0 = u128::from_str_radix(value, 16).ok().filter(|&v| v != 0);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "trace_id" {
            self.record_str(field, format!("{value:?}").trim_matches('"'));
        }
    }
}

/// One entered span on this thread and the context to go back to.
struct Entered {
    span: u64,
    saved: Option<ContextSnapshot>,
}

thread_local! {
    /// Spans entered on this thread, innermost last.
    static STACK: RefCell<Vec<Entered>> = const { RefCell::new(Vec::new()) };
}

impl<S> Layer<S> for OspreyLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let (root, parent_trace) = span
            .parent()
            .map(|p| match p.extensions().get::<LocalRoot>() {
                Some(r) => (r.0, r.1),
                // Parent created before this layer saw it: walk to the top.
                None => (p.scope().from_root().next().map_or(p.id().into_u64(), |r| r.id().into_u64()), 0),
            })
            .unwrap_or_else(|| (id.into_u64(), 0));
        let mut own = TraceIdField::default();
        attrs.record(&mut own);
        span.extensions_mut().insert(LocalRoot(root, own.0.unwrap_or(parent_trace)));
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let (root, trace) = span.extensions().get::<LocalRoot>().map_or((id.into_u64(), 0), |r| (r.0, r.1));
        let saved = current();
        let pushed = STACK.try_with(|s| s.borrow_mut().push(Entered { span: id.into_u64(), saved })).is_ok();
        if pushed {
            set_trace(trace, id.into_u64(), 0, root);
        }
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let _ = STACK.try_with(|s| {
            let mut s = s.borrow_mut();
            let key = id.into_u64();
            let Some(i) = s.iter().rposition(|e| e.span == key) else { return };
            let e = s.remove(i);
            if i == s.len() {
                // Innermost: go back to what this thread had before it.
                replace(e.saved);
            } else {
                // Exited out of order: the span entered after it now restores
                // what this one would have.
                s[i].saved = e.saved;
            }
        });
    }
}
