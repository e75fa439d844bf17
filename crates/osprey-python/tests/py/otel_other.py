"""Imports the `opentelemetry.context` of `otel_other/` (on PYTHONPATH),
prints "ready" and burns CPU for SECONDS (argv[1])."""

import sys
import time

import opentelemetry.context  # noqa: F401

print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    sum(i * i for i in range(1000))
