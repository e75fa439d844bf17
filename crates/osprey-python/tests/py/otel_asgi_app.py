"""A FastAPI app with no OpenTelemetry code: run it under
`opentelemetry-instrument` (which instruments FastAPI's ASGI app) and
uvicorn. Each request to `/` is an asyncio task on the server's one event
loop thread, in its own span: 3 bursts of 15 ms of CPU with an `await`
between them, so concurrent requests interleave on that thread
(`otel_request.py`).
"""

import asyncio

from fastapi import FastAPI

from otel_request import record

app = FastAPI()


@app.get("/")
async def index():
    burn = record()
    for _ in range(3):
        burn(0.015)
        await asyncio.sleep(0)
    return "ok"
