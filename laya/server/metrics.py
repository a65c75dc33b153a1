"""A few Prometheus metrics, written out in the text exposition format (no client library needed)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
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
    """What a finished request leaves to write down (its metrics, its access-log line), written when
    the server is idle rather than beside each request.

    Why: written for each request, its access-log line was about 0.1 ms of that request's latency on
    a 2-core EPYC (interleaved A/B, the line written against not written): written after the
    response, it held up the client's next request (0.1-0.15 ms on a 2-core Xeon, timestamps in both
    processes); written while the engine process ran the next forward pass, it took the CPU that
    forward pass needed. Deferred, the lines of many requests are written together, so the logging
    code's cold start is paid once for all of them. The books are written `FLUSH_S` after the first
    one was left, once no decision request is inside the server (`busy`), else `FLUSH_S` later again,
    but never later than `MAX_AGE_S` after it; and before /metrics is read, and as the server stops.
    Only the event loop's thread touches them.
    """

    FLUSH_S = 0.05
    MAX_AGE_S = 0.5

    def __init__(self, metrics: Metrics, access_log: logging.Logger, busy: Callable[[], bool] = lambda: False):
        self.metrics, self.access_log, self.busy = metrics, access_log, busy
        self._pending: list[tuple[str, int, float, dict[str, Any] | None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # monotonic time the oldest pending entry was left

    def add(self, route: str, status: int, seconds: float, line: dict[str, Any] | None) -> None:
        """A finished request: its route, status and seconds for the metrics, its access-log fields."""
        self._pending.append((route, status, seconds, line))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.FLUSH_S, self._due)
            except RuntimeError:  # no loop here: written at once
                self.flush()
                return
            self._since = time.monotonic()

    def _due(self) -> None:
        self._timer = None
        if self.busy() and time.monotonic() - self._since < self.MAX_AGE_S:
            self._timer = asyncio.get_running_loop().call_later(self.FLUSH_S, self._due)
            return
        self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for route, status, seconds, line in pending:
            self.metrics.request(route, status, seconds)
            if line is not None:
                self.access_log.info(json.dumps(line))
