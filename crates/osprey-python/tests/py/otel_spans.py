"""Threads in OpenTelemetry spans, for the span labels of Python samples.

Usage: otel_spans.py OUT THREADS SECONDS [SPAN_MS]

Each of THREADS threads runs, for SECONDS, spans of its own trace (real
opentelemetry-sdk, `tracer.start_as_current_span`): a root span `request`
burning SPAN_MS (default 30) of CPU in `in_root`, then a child span `child`
burning as long in `in_child`, then, outside any span, `outside` burning
SPAN_MS / 3 between short sleeps. Every span it used is written to OUT, one
line each: `TID KIND SPAN_ID TRACE_ID ROOT_SPAN_ID` (native thread id, ids in
hex). Prints "ready" once the threads run. With OSPREY_EXTRA_VARS=N, each
thread first sets N context variables of its own (more than 16 make the
context's HAMT root an array node).
"""

import contextvars
import os
import sys
import threading
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

provider = TracerProvider()
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("osprey-test")


def burn(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(i * i for i in range(50))
    return n


def in_root(seconds):
    return burn(seconds)


def in_child(seconds):
    return burn(seconds)


def outside(seconds):
    return burn(seconds)


EXTRA_VARS = [contextvars.ContextVar("extra%d" % i) for i in range(int(os.environ.get("OSPREY_EXTRA_VARS", "0")))]


def worker(stop_at, span_s, lines, lock):
    for v in EXTRA_VARS:
        v.set(1)
    tid = threading.get_native_id()
    mine = []
    while time.time() < stop_at:
        with tracer.start_as_current_span("request") as root:
            rc = root.get_span_context()
            in_root(span_s)
            with tracer.start_as_current_span("child") as child:
                cc = child.get_span_context()
                in_child(span_s)
        mine.append("%d root %016x %032x %016x" % (tid, rc.span_id, rc.trace_id, rc.span_id))
        mine.append("%d child %016x %032x %016x" % (tid, cc.span_id, cc.trace_id, rc.span_id))
        # Outside any span, between sleeps: a sample there never meets a span
        # that starts or ends during its read.
        time.sleep(0.002)
        outside(span_s / 3)
        time.sleep(0.002)
    with lock:
        lines.extend(mine)


def main():
    out, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    span_s = (float(sys.argv[4]) if len(sys.argv) > 4 else 30.0) / 1000
    stop_at = time.time() + seconds
    lines, lock = [], threading.Lock()
    ts = [
        threading.Thread(target=worker, args=(stop_at, span_s, lines, lock), name="w%d" % i) for i in range(threads)
    ]
    for t in ts:
        t.start()
    print("ready", flush=True)
    for t in ts:
        t.join()
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
