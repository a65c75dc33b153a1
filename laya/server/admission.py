"""The door: which decision requests get in, decided before a body is read.

Under a flood of impatient clients the refusals themselves become the load: every 429 costs HTTP
parsing, middleware and logging, under the same interpreter as the batcher. So a request is refused
at the door when the server already holds `--max-concurrency` requests, or when the work inside
would not drain, at the measured rate, before the request's own deadline (`--request-timeout-s`, or
the shorter one its client asked for), or past `--max-queue-ms` when the operator sets that bound.
A request that could be answered in time is let in, however long it waits; one that could not is
refused now rather than answered late. The refusal is the cheapest correct answer: a 429 with
`Retry-After` (the queue's drain time), no body read, no JSON, no access-log line of its own (one
aggregated line per second says how many were shed). It is held up to `hold_s` (never longer than
the `Retry-After` it announces) before it is sent: a client that retries at once without backing
off then costs the server a sleeping coroutine, not a spin.

While the server drains to stop, every decision request is refused at the door with a 503 (the
server, not the client, is the reason) and its connection closed after the answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from laya.server.request_ids import REQUEST_ID_RAW, given_or_new

log = logging.getLogger("laya.server")
# `/v1/systemone` and the names hosted services and proxies give the same route (OpenRouter's
# `/api/alpha/decisions`, and `/v1/decisions`): one handler, one door, one set of limits
DECISION_ROUTES = ("/v1/systemone", "/v1/decisions", "/api/alpha/decisions")
SHED_ROUTES = frozenset({*DECISION_ROUTES, "/v1/systemone/batch", "/v1/systemone/plan", "/v1/chat/completions"})
OPENAI_ROUTES = frozenset({"/v1/chat/completions"})
PLAN_ROUTE = "/v1/systemone/plan"
PLAN_SHARE = 8  # plans may hold at most 1/8 of the door (at least one)
PLAN_IDLE_FACTOR = 9.0  # while decisions are inside, plans take at most 1 / (1 + this) of the time


def refusal_body(path: str, kind: str, message: bytes) -> bytes:
    """A door refusal's body, in the shape the route's clients read: OpenAI's `{"error": ...}` on the
    OpenAI routes, System One's `{"detail": ...}` elsewhere (the message holds no quote or backslash)."""
    if path in OPENAI_ROUTES:
        return b'{"error": {"message": "%s", "type": "%s", "param": null, "code": null}}' % (message, kind.encode())
    return b'{"detail": {"error_type": "%s", "message": "%s"}}' % (kind.encode(), message)


class Admission:
    def __init__(self, limit: int, retry_after: Callable[[], int], hold_s: float = 1.0,
                 rows_per_s: Callable[[], float | None] = lambda: None, max_queue_s: float = float("inf")):
        self.limit = limit
        self.inside = 0
        self.retry_after = retry_after
        self.rows_per_s = rows_per_s
        self.max_queue_s = max_queue_s
        self.rows_per_request = 1.0  # running mean of the rows a request brings (updated at admission)
        self.hold_s = hold_s
        self.plans_inside = 0
        self.plan_limit = max(1, limit // PLAN_SHARE)
        self.plans_wait_until = 0.0  # monotonic time before which no plan enters while decisions are inside
        self.last_seen = 0.0  # monotonic time a request last came in or left
        self._shed_since_log = 0
        self._last_log = time.monotonic()

    def queued_s(self, extra: int = 0) -> float:
        """Seconds the requests inside (and `extra` more) take to drain at the measured rate. Counted
        from the requests inside the door, not the rows already queued: requests that arrive together
        are all inside before any of them has been parsed."""
        rate = self.rows_per_s()
        return (self.inside + extra) * self.rows_per_request / rate if rate else 0.0

    def note_rows(self, rows: int) -> None:
        self.rows_per_request += 0.05 * (rows - self.rows_per_request)

    def try_enter(self, budget_s: float = float("inf"), plan: bool = False) -> bool:
        """Let a request in unless the server is full or it could not be answered within `budget_s`
        (its deadline) behind the work inside; a request alone is always let in.

        Plans run no forward pass but parse, tokenise and build rows on the same cores: each takes
        milliseconds, and a flood of them would keep a core busy. So they have a share of the door of
        their own (`plan_limit` at once) and, while decisions are inside, of the time: after a plan
        that took t seconds the next waits `PLAN_IDLE_FACTOR` x t (plans at most a tenth of the time).
        A flood of plans meets 429 while decisions keep the rest of the door and the cores."""
        now = time.monotonic()
        if self.inside >= self.limit:
            return False
        if plan and (self.plans_inside >= self.plan_limit
                     or (self.inside > self.plans_inside and now < self.plans_wait_until)):
            return False
        if not plan and self.inside and (self.queued_s() > self.max_queue_s or self.queued_s(extra=1) > budget_s):
            return False
        self.inside += 1
        self.plans_inside += plan
        self.last_seen = now
        return True

    def leave(self, plan: bool = False, since: float | None = None) -> None:
        """A request left; a plan that entered at `since` (monotonic) counts its time against the next."""
        now = time.monotonic()
        self.inside -= 1
        self.plans_inside -= plan
        if plan and since is not None:
            self.plans_wait_until = max(self.plans_wait_until, now + PLAN_IDLE_FACTOR * (now - since))
        self.last_seen = now

    async def refuse_draining(self, send, request_id: bytes | None, path: str = "") -> None:
        """Answer 503 at the door while the server stops; the client closes and goes elsewhere."""
        self.last_seen = time.monotonic()
        body = refusal_body(path, "overloaded_error", b"the server is shutting down; retry after 1 s (on another "
                                                      b"instance)")
        rid = given_or_new(request_id)
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"retry-after", b"1"), (b"connection", b"close"), (REQUEST_ID_RAW, rid)]})
        await send({"type": "http.response.body", "body": body})

    async def shed(self, send, request_id: bytes | None, path: str = "") -> None:
        """Answer 429 at the door."""
        self._shed_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= 1.0:
            log.info('{"shed": %d, "seconds": %.2f, "limit": %d}', self._shed_since_log, now - self._last_log,
                     self.limit)
            self._shed_since_log, self._last_log = 0, now
        wait = self.retry_after()
        if self.hold_s > 0:
            await asyncio.sleep(min(self.hold_s, wait))
        body = refusal_body(path, "overloaded_error", b"the server is at its limit (%d requests at once, or its "
                                                      b"queue budget); retry after %d s" % (self.limit, wait))
        rid = given_or_new(request_id)
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"retry-after", b"%d" % wait), (REQUEST_ID_RAW, rid)]})
        await send({"type": "http.response.body", "body": body})
