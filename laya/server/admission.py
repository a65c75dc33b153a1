"""The door: how many decision requests are inside the server at once, checked before a body is read.

Under a flood of impatient clients the refusals themselves become the load: every 429 costs HTTP
parsing, middleware and logging, under the same interpreter as the batcher. So a request over the
concurrency limit (`--max-concurrency`) is refused at the door with the cheapest correct answer: a
precomputed 429 with `Retry-After` (from the queue's measured drain rate), no body read, no JSON,
no access-log line of its own (one aggregated line per second says how many were shed). The refusal
is held for `hold_s` before it is sent (never longer than the `Retry-After` it announces): a client
that retries at once without backing off then costs the server a sleeping coroutine, not a spin.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("laya.server")
SHED_ROUTES = frozenset({"/v1/systemone", "/v1/systemone/batch"})


class Admission:
    def __init__(self, limit: int, retry_after: Callable[[], int], hold_s: float = 0.25):
        self.limit = limit
        self.inside = 0
        self.retry_after = retry_after
        self.hold_s = hold_s
        self.shed_total = 0
        self._shed_since_log = 0
        self._last_log = time.monotonic()
        self._ids = itertools.count()
        self._prefix = f"shed-{os.getpid()}-"

    def try_enter(self) -> bool:
        if self.inside >= self.limit:
            return False
        self.inside += 1
        return True

    def leave(self) -> None:
        self.inside -= 1

    async def shed(self, send, request_id: bytes | None) -> None:
        """Answer 429 at the door."""
        self.shed_total += 1
        self._shed_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= 1.0:
            log.info('{"shed": %d, "seconds": %.2f, "limit": %d}', self._shed_since_log, now - self._last_log,
                     self.limit)
            self._shed_since_log, self._last_log = 0, now
        wait = self.retry_after()
        if self.hold_s > 0:
            await asyncio.sleep(min(self.hold_s, wait))
        body = (b'{"detail": {"error_type": "overloaded_error", "message": "the server is at its limit of %d '
                b'requests at once; retry after %d s"}}' % (self.limit, wait))
        rid = request_id[:128] if request_id else (self._prefix + str(next(self._ids))).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"%d" % wait),
                                (b"x-typesafe-request-id", rid)]})
        await send({"type": "http.response.body", "body": body})
