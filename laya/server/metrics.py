"""A few Prometheus metrics, written out in the text exposition format (no client library needed)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{edge:g}"}} {count}' for edge, count in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.total}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.6f}" if labels else f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count{{{labels}}} {self.total}" if labels else f"{name}_count {self.total}")
        return out


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.batch_jobs = Histogram(BATCH_BUCKETS)
        self.queue_depth: dict[str, Callable[[], int]] = {}
        self.engines: dict[str, Callable[[], dict]] = {}  # model -> its engine's status()
        self.unavailable_by_model: dict[str, int] = defaultdict(int)

    def request(self, route: str, status: int, seconds: float) -> None:
        """Latency is kept per route for answered requests (2xx) and for the others apart, so the
        answered requests' percentiles stay readable under a flood of refusals."""
        with self._lock:
            self.requests[(route, status)] += 1
            key = f'route="{route}",outcome="{"ok" if status < 300 else "error"}"'
            self.latency.setdefault(key, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def shed(self, route: str) -> None:
        """A request refused at the door: counted, nothing else (it must cost next to nothing)."""
        self.requests[(route, 429)] += 1

    def unavailable(self, model: str) -> None:
        """A request answered 503 because its model's engine was restarting or down."""
        with self._lock:
            self.unavailable_by_model[model] += 1

    def batch(self, jobs: int, rows: int) -> None:
        with self._lock:
            self.batch_jobs.observe(jobs)
            self.batch_rows.observe(rows)

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP laya_requests_total HTTP requests by route and status.",
                     "# TYPE laya_requests_total counter"]
            lines += [f'laya_requests_total{{route="{r}",status="{s}"}} {n}'
                      for (r, s), n in sorted(self.requests.items())]
            lines += ["# HELP laya_errors_total HTTP responses with a 4xx or 5xx status.",
                      "# TYPE laya_errors_total counter"]
            errors: dict[int, int] = defaultdict(int)
            for (_, status), n in self.requests.items():
                if status >= 400:
                    errors[status] += n
            lines += [f'laya_errors_total{{status="{s}"}} {n}' for s, n in sorted(errors.items())]
            lines += ["# HELP laya_request_seconds Request latency.", "# TYPE laya_request_seconds histogram"]
            for labels, hist in sorted(self.latency.items()):
                lines += hist.lines("laya_request_seconds", labels)
            lines += ["# HELP laya_batch_jobs Requests coalesced per forward batch.",
                      "# TYPE laya_batch_jobs histogram"]
            lines += self.batch_jobs.lines("laya_batch_jobs")
            lines += ["# HELP laya_batch_rows Rows per forward batch.", "# TYPE laya_batch_rows histogram"]
            lines += self.batch_rows.lines("laya_batch_rows")
            lines += ["# HELP laya_queue_depth Rows waiting or running per model.", "# TYPE laya_queue_depth gauge"]
            lines += [f'laya_queue_depth{{model="{m}"}} {depth()}' for m, depth in sorted(self.queue_depth.items())]
            statuses = {m: status() for m, status in sorted(self.engines.items())}
            lines += ["# HELP laya_engine_up 1 while the model's engine can answer, 0 while it restarts or is down.",
                      "# TYPE laya_engine_up gauge"]
            lines += [f'laya_engine_up{{model="{m}"}} {int(st.get("state") == "ready")}' for m, st in statuses.items()]
            lines += ["# HELP laya_engine_restarts_total Engine processes started again after one died.",
                      "# TYPE laya_engine_restarts_total counter"]
            lines += [f'laya_engine_restarts_total{{model="{m}"}} {st.get("restarts", 0)}'
                      for m, st in statuses.items()]
            lines += ["# HELP laya_engine_unavailable_total Requests answered 503 while their model's engine "
                      "was restarting or down.", "# TYPE laya_engine_unavailable_total counter"]
            lines += [f'laya_engine_unavailable_total{{model="{m}"}} {self.unavailable_by_model.get(m, 0)}'
                      for m in statuses]
        return "\n".join(lines) + "\n"


class Books:
    """What a finished request leaves to write down (its metrics, its access-log line), written a moment
    later instead of between its response and the next request.

    Why: a client that sends its next request as soon as it has read an answer found the event loop
    still logging the last one (0.1-0.15 ms of a 2-core Xeon's time, measured with timestamps in
    both processes). So the books are written right after the next request is handed to its engine
    (while the engine process prepares it, one core is idle), or `FLUSH_S` later when none comes, or
    before /metrics is read. Only the event loop's thread touches them.
    """

    FLUSH_S = 0.05

    def __init__(self, metrics: Metrics, access_log: logging.Logger):
        self.metrics, self.access_log = metrics, access_log
        self._pending: list[tuple[str, int, float, dict[str, Any] | None]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, route: str, status: int, seconds: float, line: dict[str, Any] | None) -> None:
        """A finished request: its route, status and seconds for the metrics, its access-log fields."""
        self._pending.append((route, status, seconds, line))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.FLUSH_S, self.flush)
            except RuntimeError:  # no loop here: written at once
                self.flush()

    def soon(self) -> None:
        """Write them once what is queued on the loop now, and what that queues, has run: a request
        just handed on is sent to its engine process, or put in its batcher's queue and taken to
        the forward pass's thread, first."""
        if self._pending:
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for route, status, seconds, line in pending:
            self.metrics.request(route, status, seconds)
            if line is not None:
                self.access_log.info(json.dumps(line))
