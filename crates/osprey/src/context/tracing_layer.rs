//! [`OspreyLayer`]: a `tracing_subscriber` layer that writes the entered
//! span into the thread's osprey context.
//!
//! - span id = the `tracing` span [`Id`] as `u64`;
//! - local root span id = the id of the outermost span of the same trace in
//!   this process, computed once in `on_new_span` (the parent's cached root,
//!   or the span itself) and kept in the span's extensions.
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

use super::{current, replace, set, ContextSnapshot};
use std::cell::RefCell;
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

/// Cached in each span's extensions.
#[derive(Clone, Copy, Debug)]
struct LocalRoot(u64);

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
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let root = span
            .parent()
            .map(|p| match p.extensions().get::<LocalRoot>() {
                Some(r) => r.0,
                // Parent created before this layer saw it: walk to the top.
                None => p.scope().from_root().next().map_or(p.id().into_u64(), |r| r.id().into_u64()),
            })
            .unwrap_or_else(|| id.into_u64());
        span.extensions_mut().insert(LocalRoot(root));
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let root = span.extensions().get::<LocalRoot>().map_or(id.into_u64(), |r| r.0);
        let saved = current();
        let pushed = STACK.try_with(|s| s.borrow_mut().push(Entered { span: id.into_u64(), saved })).is_ok();
        if pushed {
            set(id.into_u64(), root);
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
