"""Requests in OpenTelemetry spans, for the span labels of Python samples:
what every request handler of the server fixtures (`otel_flask_app.py`,
`otel_asgi_app.py`) does, and, run as a script, asyncio tasks in spans.

A request reads the current span as the app sees it
(`opentelemetry.trace.get_current_span()`), appends it to a file (one line
per request, `TID KIND SPAN_ID TRACE_ID ROOT_SPAN_ID`: native thread id,
ids in hex; each line one `write` in append mode, so processes can share
the file), and burns CPU time in a function named after its span,
`request_burn_<span id>`, so that a sample says by its stack alone which
request it was taken in. Its span's parent is remote (the client sent
`traceparent`) or absent: it is its own local root.

Usage: otel_request.py OUT TASKS SECONDS

One event loop runs TASKS tasks for SECONDS, each one span after another
(real opentelemetry-sdk, `tracer.start_as_current_span`, a new trace
each), each span 4 bursts of 5 ms of CPU with an `await asyncio.sleep(0)`
between them, so the tasks interleave on the thread inside their spans.
Prints "ready" once they run.
"""

import asyncio
import os
import sys
import threading
import time
import types

from opentelemetry import trace


def request_burn(seconds):
    """Burns `seconds` of the thread's CPU time (not wall time: on a loaded
    machine a request's CPU is then what it says)."""
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += sum(i * i for i in range(50))
    return n


# Every renamed function stays alive: a code object or name freed and
# another allocated at its address could be read as the one cached there.
named = []


def named_burn(span_id):
    """`request_burn` named `request_burn_<span id in hex>` (its code object
    renamed: the name a profiler reads)."""
    name = "request_burn_%016x" % span_id
    renamed = {"co_name": name}
    if hasattr(request_burn.__code__, "co_qualname"):
        renamed["co_qualname"] = name
    f = types.FunctionType(request_burn.__code__.replace(**renamed), globals(), name)
    named.append(f)
    return f


def record(out=None, kind="root"):
    """Appends the current span's line, of kind `kind`, to `out` (default:
    the file named by `OSPREY_TEST_SPANS`); returns its burner."""
    sc = trace.get_current_span().get_span_context()
    assert sc.is_valid, "the handler runs in no span: not instrumented?"
    line = "%d %s %016x %032x %016x\n" % (threading.get_native_id(), kind, sc.span_id, sc.trace_id, sc.span_id)
    fd = os.open(out or os.environ["OSPREY_TEST_SPANS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return named_burn(sc.span_id)


async def task(tracer, out, stop_at):
    while time.time() < stop_at:
        with tracer.start_as_current_span("task"):
            burn = record(out)
            for _ in range(4):
                burn(0.005)
                await asyncio.sleep(0)


async def tasks(out, n, seconds):
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("osprey-test")
    stop_at = time.time() + seconds
    running = [asyncio.create_task(task(tracer, out, stop_at), name="t%d" % i) for i in range(n)]
    print("ready", flush=True)
    await asyncio.gather(*running)


if __name__ == "__main__":
    asyncio.run(tasks(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
