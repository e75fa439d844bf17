"""A Flask app with no OpenTelemetry code: run it under
`opentelemetry-instrument` (which instruments Flask) and a WSGI server.
Each request to `/` runs in its own span and burns `OSPREY_TEST_REQUEST_MS`
(default 30) ms of CPU time; with `OSPREY_TEST_SLOW_EVERY=N`, every Nth request
the process serves also runs `slow_path`, 40 ms of CPU time more, and is written as
`slow` instead of `root` (`otel_request.py`).
"""

import os
import threading

from flask import Flask

from otel_request import record

app = Flask(__name__)
request_s = float(os.environ.get("OSPREY_TEST_REQUEST_MS", "30")) / 1000
slow_every = int(os.environ.get("OSPREY_TEST_SLOW_EVERY", "0"))
served, lock = 0, threading.Lock()


def slow_path(burn):
    burn(0.04)


@app.route("/")
def index():
    global served
    with lock:
        served += 1
        slow = slow_every > 0 and served % slow_every == 0
    burn = record(kind="slow" if slow else "root")
    burn(request_s)
    if slow:
        slow_path(burn)
    return "ok"
