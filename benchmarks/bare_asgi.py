"""The floor under `laya serve`'s HTTP figure: an ASGI app that does nothing but read the body, parse
it as JSON, keep a worker thread busy for `x-work-ms` milliseconds (as a forward pass keeps the cores
while the event loop waits) and answer a few bytes, served by the same uvicorn (uvloop, httptools) on
the same loopback.

    .venv/bin/python -m uvicorn --app-dir benchmarks bare_asgi:app --port PORT --no-access-log

`benchmarks/overhead.py` measures it beside the real server, so what the stack costs above what any
Python HTTP server costs on this machine is a figure of the same run.
"""

from __future__ import annotations

import asyncio
import json
import time

ANSWER = b'{"ok":true}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


def spin(ms: float) -> None:
    """Busy, not asleep: what the machine does during a forward pass, so that the code after it runs
    as cold as the real server's does (a sleeping process wakes slower than a running one)."""
    until = time.perf_counter() + ms / 1000
    while time.perf_counter() < until:
        pass


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if body:
        json.loads(body)
    work = dict(scope["headers"]).get(b"x-work-ms")
    if work:
        await asyncio.get_running_loop().run_in_executor(None, spin, float(work))
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
