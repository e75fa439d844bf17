//! `OspreyLayer`: entering spans sets the thread's context, exiting restores it.
//! Run with `cargo test -p osprey --features tracing`.
#![cfg(feature = "tracing")]

use osprey::context::{self, tracing_layer::OspreyLayer};
use std::sync::{Arc, Barrier};
use tracing::{dispatcher, Dispatch, Span};
use tracing_subscriber::layer::SubscriberExt;

fn dispatch() -> Dispatch {
    Dispatch::new(tracing_subscriber::registry().with(OspreyLayer::new()))
}

fn ids() -> Option<(u64, u64)> {
    context::current().map(|c| (c.span_id, c.local_root_span_id))
}

fn id(s: &Span) -> u64 {
    s.id().unwrap().into_u64()
}

/// Runs `f` on a fresh thread with `d` as its default dispatcher.
fn on_thread<T: Send + 'static>(d: &Dispatch, f: impl FnOnce() -> T + Send + 'static) -> T {
    let d = d.clone();
    std::thread::spawn(move || dispatcher::with_default(&d, f)).join().unwrap()
}

#[test]
fn nested_spans_set_and_restore() {
    on_thread(&dispatch(), || {
        context::set(500, 500);
        let outer = tracing::info_span!("request");
        let mid = tracing::info_span!(parent: &outer, "db");
        let inner = tracing::info_span!(parent: &mid, "query");
        let (o, m, i) = (id(&outer), id(&mid), id(&inner));
        {
            let _a = outer.enter();
            assert_eq!(ids(), Some((o, o)));
            {
                let _b = mid.enter();
                assert_eq!(ids(), Some((m, o)));
                {
                    let _c = inner.enter();
                    assert_eq!(ids(), Some((i, o)), "root is the outermost span");
                }
                assert_eq!(ids(), Some((m, o)));
            }
            assert_eq!(ids(), Some((o, o)));
        }
        assert_eq!(ids(), Some((500, 500)), "context before the first span is back");
    });
}

#[test]
fn contextual_parent_and_new_trace() {
    on_thread(&dispatch(), || {
        let outer = tracing::info_span!("outer");
        let o = id(&outer);
        outer.in_scope(|| {
            let child = tracing::info_span!("child"); // parent = current span
            let c = id(&child);
            child.in_scope(|| assert_eq!(ids(), Some((c, o))));
            let fresh = tracing::info_span!(parent: None, "detached");
            let f = id(&fresh);
            fresh.in_scope(|| assert_eq!(ids(), Some((f, f)), "a root span is its own local root"));
        });
        assert_eq!(ids(), None);
    });
}

#[test]
fn span_entered_on_another_thread() {
    let d = dispatch();
    let (span, s, r) = on_thread(&d, || {
        let root = tracing::info_span!("root");
        let span = tracing::info_span!(parent: &root, "work");
        let (s, r) = (id(&span), id(&root));
        (span, s, r)
    });
    // The span carries its dispatcher; no default needed on this thread.
    let seen = std::thread::spawn(move || {
        context::set(7, 7);
        let during = span.in_scope(ids);
        (during, ids())
    })
    .join()
    .unwrap();
    assert_eq!(seen, (Some((s, r)), Some((7, 7))));
}

#[test]
fn task_polled_on_different_threads() {
    let d = dispatch();
    let root = dispatcher::with_default(&d, || tracing::info_span!("task-root"));
    let task = dispatcher::with_default(&d, || tracing::info_span!(parent: &root, "task"));
    let (t, r) = (id(&task), id(&root));

    // Poll 1 on thread A, poll 2 on thread B, each around other work.
    for (n, (before, tag)) in [((100u64, 100u64), "a"), ((200, 200), "b")].into_iter().enumerate() {
        let task = task.clone();
        let got = std::thread::spawn(move || {
            context::set(before.0, before.1);
            let during = {
                let _poll = task.enter();
                // Tags set while polling do not outlive the poll.
                context::set_tag("poll", tag).unwrap();
                ids()
            };
            (during, context::current())
        })
        .join()
        .unwrap();
        assert_eq!(got.0, Some((t, r)), "poll {n}");
        let after = got.1.unwrap();
        assert_eq!((after.span_id, after.local_root_span_id), before, "poll {n} restored");
        assert_eq!(after.tags, [0; context::TAG_SLOTS], "poll {n} tags restored");
    }

    // The same span entered on two threads at once.
    let barrier = Arc::new(Barrier::new(2));
    let both: Vec<_> = (0..2u64)
        .map(|k| {
            let (task, barrier) = (task.clone(), barrier.clone());
            std::thread::spawn(move || {
                context::set(k + 1, k + 1);
                let g = task.enter();
                barrier.wait();
                let during = ids();
                barrier.wait();
                drop(g);
                (during, ids())
            })
        })
        .collect();
    for (k, h) in both.into_iter().enumerate() {
        let k = k as u64;
        assert_eq!(h.join().unwrap(), (Some((t, r)), Some((k + 1, k + 1))));
    }
}

#[test]
fn out_of_order_exit() {
    on_thread(&dispatch(), || {
        let a = tracing::info_span!("a");
        let b = tracing::info_span!(parent: None, "b");
        let (ia, ib) = (id(&a), id(&b));
        let ga = a.enter();
        let gb = b.enter();
        assert_eq!(ids(), Some((ib, ib)));
        drop(ga); // a exits while b is still entered
        assert_eq!(ids(), Some((ib, ib)), "b is still the innermost span");
        drop(gb);
        assert_eq!(ids(), None, "b restores what a would have");
        let _ = ia;
    });
}

#[test]
fn trace_id_field_is_inherited() {
    on_thread(&dispatch(), || {
        let trace = |_: ()| context::current().map(|c| c.trace_id);
        let request = tracing::info_span!("request", trace_id = "4bf92f3577b34da6a3ce929d0e0e4736");
        let db = tracing::info_span!(parent: &request, "db");
        let numeric = tracing::info_span!("job", trace_id = 0x1234u64);
        let plain = tracing::info_span!("plain");
        request.in_scope(|| assert_eq!(trace(()), Some(0x4bf92f3577b34da6a3ce929d0e0e4736)));
        db.in_scope(|| assert_eq!(trace(()), Some(0x4bf92f3577b34da6a3ce929d0e0e4736), "from the parent"));
        numeric.in_scope(|| assert_eq!(trace(()), Some(0x1234)));
        plain.in_scope(|| assert_eq!(trace(()), Some(0), "no trace id field: none"));
    });
}
