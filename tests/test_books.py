"""When a finished request's metrics and access-log line are written (laya.server.metrics.Books): not
beside the request, but once the server is idle, never later than their maximum age, all at once, and
at once before /metrics is read or where there is no event loop."""

from __future__ import annotations

import asyncio
import logging

from laya.server.metrics import Books, Metrics


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def books(busy, max_age_s: float = 0.3) -> tuple[Books, Metrics, Lines]:
    log = logging.getLogger("test.books.access")
    log.handlers, log.propagate = [], False
    log.setLevel(logging.INFO)
    lines = Lines()
    log.addHandler(lines)
    metrics = Metrics()
    out = Books(metrics, log, busy=busy)
    out.FLUSH_S, out.MAX_AGE_S = 0.02, max_age_s
    return out, metrics, lines


def counted(metrics: Metrics) -> int:
    return sum(metrics.requests.values())


def test_books_wait_while_a_request_is_inside_and_are_written_together_once_idle():
    inside = {"n": 1}
    b, metrics, lines = books(lambda: inside["n"] > 0, max_age_s=60.0)  # not the maximum age's test

    async def run() -> None:
        b.add("/v1/systemone", 200, 0.004, {"id": "a"})
        b.add("/v1/systemone", 422, 0.001, {"id": "b"})
        b.add("/health", 200, 0.001, None)  # counted, no access-log line
        await asyncio.sleep(0.1)  # five flush periods, a request inside all along
        assert lines.lines == [] and counted(metrics) == 0
        inside["n"] = 0
        await asyncio.sleep(0.06)

    asyncio.run(run())
    assert lines.lines == ['{"id": "a"}', '{"id": "b"}']
    assert counted(metrics) == 3


def test_books_are_written_at_their_maximum_age_under_steady_load():
    b, metrics, lines = books(lambda: True)  # never idle

    async def run() -> float:
        loop = asyncio.get_running_loop()
        began = loop.time()
        b.add("/v1/systemone", 200, 0.004, {"id": "a"})
        while not lines.lines:
            assert loop.time() - began < 2.0, "never written"
            await asyncio.sleep(0.01)
        return loop.time() - began

    waited = asyncio.run(run())
    assert 0.3 <= waited < 1.0, waited
    assert counted(metrics) == 1


def test_books_are_written_at_once_when_read_or_without_a_loop():
    b, metrics, lines = books(lambda: True)

    async def run() -> None:
        b.add("/v1/systemone", 200, 0.004, {"id": "a"})
        b.flush()  # as /metrics does before it renders
        assert lines.lines == ['{"id": "a"}'] and counted(metrics) == 1
        await asyncio.sleep(0.05)  # the cancelled timer writes nothing twice

    asyncio.run(run())
    assert lines.lines == ['{"id": "a"}']
    b.add("/v1/systemone", 200, 0.004, {"id": "b"})  # no event loop here
    assert lines.lines == ['{"id": "a"}', '{"id": "b"}'] and counted(metrics) == 2
