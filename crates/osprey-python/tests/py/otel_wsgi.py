"""A WSGI app instrumented by opentelemetry-instrumentation-wsgi (its
middleware, unchanged) on a threading wsgiref server, under concurrent
requests carrying W3C `traceparent` headers, for the span labels of Python
samples.

Usage: otel_wsgi.py OUT CLIENTS SECONDS

CLIENTS client threads send requests for SECONDS, each with a new trace id
and a remote parent span id, then burn 5 ms in `outside` (no span). The
server runs each request in its own thread, in the middleware's server span
(whose parent is remote: it is its own local root), burning 30 ms in
`in_root`. Every server span is written to OUT, one line each:
`TID root SPAN_ID TRACE_ID SPAN_ID` (native thread id, ids in hex).
Prints "ready" once the server listens.
"""

import random
import sys
import threading
import time
import urllib.request
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry import trace
from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware

# The CPU burners (and the SDK's tracer provider) of the threads' fixture,
# beside this file.
from otel_spans import in_root, outside

lines, lock = [], threading.Lock()


def worker(environ, start_response):
    """The application (named as the span tests expect the caller of `in_root`)."""
    sc = trace.get_current_span().get_span_context()
    in_root(0.03)
    with lock:
        lines.append("%d root %016x %032x %016x" % (threading.get_native_id(), sc.span_id, sc.trace_id, sc.span_id))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Client:
    def worker(self, url, stop_at):
        while time.time() < stop_at:
            parent = "00-%032x-%016x-01" % (random.getrandbits(128) | 1, random.getrandbits(64) | 1)
            req = urllib.request.Request(url, headers={"traceparent": parent})
            with urllib.request.urlopen(req) as r:
                r.read()
            outside(0.005)


def main():
    out, clients, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    server = make_server("127.0.0.1", 0, OpenTelemetryMiddleware(worker), server_class=Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/" % server.server_port
    print("ready", flush=True)
    stop_at = time.time() + seconds
    ts = [threading.Thread(target=Client().worker, args=(url, stop_at)) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    server.shutdown()
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
