//! OpenTelemetry span ids -> osprey context. Run with `--features opentelemetry`.
#![cfg(feature = "opentelemetry")]

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use osprey::context::{self, otel};

#[test]
fn attach_sets_and_restores() {
    std::thread::spawn(|| {
        let sc = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            SpanId::from_hex("b7ad6b7169203331").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let cx = Context::new().with_remote_span_context(sc);
        let want = otel::Ids {
            trace_id: 0x0af7651916cd43dd8448eb211c80319c,
            span_id: 0xb7ad6b7169203331,
            trace_flags: 1,
            local_root_span_id: 0x8448eb211c80319c,
        };
        assert_eq!(otel::ids(&cx), Some(want));
        context::set(1, 2);
        {
            let _g = otel::attach(&cx);
            let c = context::current().unwrap();
            assert_eq!((c.span_id, c.local_root_span_id), (0xb7ad6b7169203331, 0x8448eb211c80319c));
            assert_eq!((c.trace_id, c.trace_flags), (0x0af7651916cd43dd8448eb211c80319c, 1));
            let _cx = cx.clone().attach();
            let _inner = otel::attach_current();
            assert_eq!(context::current(), Some(c));
        }
        let c = context::current().unwrap();
        assert_eq!((c.trace_id, c.span_id, c.local_root_span_id), (0, 1, 2));
        // No active span: nothing changes.
        assert_eq!(otel::ids(&Context::new()), None);
        let _g = otel::attach(&Context::new());
        assert_eq!(context::current(), Some(c));
    })
    .join()
    .unwrap();
}
