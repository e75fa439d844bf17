"""An `opentelemetry.context` whose runtime context is not the contextvars
one (as OTEL_PYTHON_CONTEXT can choose): osprey cannot read its spans and
says so once."""


class _ThreadLocalContext:
    def __init__(self):
        self._store = {}


_RUNTIME_CONTEXT = _ThreadLocalContext()
