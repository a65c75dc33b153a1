"""Dynamic micro-batching: concurrent requests for one engine share forward passes.

One worker per engine takes every job waiting (as `laya.server.batching`'s policy allows: rows, tokens,
wait) and runs them together on a dedicated thread, off the event loop. An idle engine starts at once:
what batches is what queued while it was busy, so a lone request pays no wait. `max_wait_ms` > 0 makes
it wait that long for company instead (more rows per forward pass at low load, for that much latency).

Admission is counted in work, not jobs: a request reserves its rows (`reserve`) before it is
tokenised, and past `max_pending_rows` rows waiting or running it is refused at once (`Overloaded`)
instead of letting latency grow without bound; a request alone is always admitted (the per-request
limits bound it). The worker measures how many rows a second it drains, so a refusal can say when a
retry is worth it (`retry_after`). A job whose caller went away before its turn is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from laya.engine import Engine, ForwardingEngine, Job, Timing
from laya.errors import QuestionError
from laya.response import SystemOneResponse
from laya.server.batching import Batching, tokens_of

log = logging.getLogger("laya.server")


class Overloaded(Exception):
    """The queue is full; the caller should retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Item:
    job: Job
    rows: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class DrainRate:
    """Rows per second the worker has been finishing (an exponentially weighted mean of busy time)."""

    def __init__(self, half_life_rows: float = 256.0):
        self.rows_per_s: float | None = None
        self.half_life = half_life_rows

    def add(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        rate = rows / seconds
        if self.rows_per_s is None:
            self.rows_per_s = rate
        else:
            keep = 0.5 ** (rows / self.half_life)
            self.rows_per_s = keep * self.rows_per_s + (1 - keep) * rate

    def seconds_for(self, rows: int) -> int:
        """Whole seconds (1 to 60) until `rows` rows have drained at the measured rate."""
        if not self.rows_per_s:
            return 1
        return max(1, min(60, math.ceil(rows / self.rows_per_s)))


class MicroBatcher:
    def __init__(self, engine: Engine, *, batching: Batching | None = None, max_pending_rows: int = 512,
                 on_batch=None):
        self.engine = engine
        self.batching = batching or Batching()  # rows, tokens and wait: the policy every mode shares
        self.max_pending_rows = max_pending_rows
        self.on_batch = on_batch
        self.pending_rows = 0  # reserved by admitted requests, until their job is done
        self.drain = DrainRate()
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"laya-{engine.info.name}")

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def full(self) -> bool:
        return self.pending_rows >= self.max_pending_rows

    def retry_after(self) -> int:
        """Seconds until the work waiting now has drained, at the measured rate."""
        return self.drain.seconds_for(self.pending_rows)


    def reserve(self, rows: int) -> None:
        """Admit a request of `rows` rows, or refuse it (`Overloaded`) when the queue holds too much."""
        if self.pending_rows and self.pending_rows + rows > self.max_pending_rows:
            raise Overloaded(f"{self.pending_rows} rows are already waiting for {self.engine.info.name}",
                             self.retry_after())
        self.pending_rows += rows

    def release(self, rows: int) -> None:
        """Give back a reservation whose job will not run (refused while it was prepared)."""
        self.pending_rows -= rows

    def resize(self, reserved: int, rows: int) -> None:
        """A prepared job takes `rows` where `reserved` were counted at admission (a tournament takes more)."""
        self.pending_rows += rows - reserved

    async def submit(self, job: Job, rows: int) -> tuple[list[SystemOneResponse], Timing]:
        """Run a job whose `rows` were reserved; the reservation is released when it is done."""
        if self._queue is None:
            raise RuntimeError("batcher not started")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(job=job, rows=rows, future=future))
        return await future

    async def _worker(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            batch, rows, tokens = [first], first.rows, tokens_of(first.job)
            deadline = time.perf_counter() + self.batching.wait_s
            while self.batching.has_room(rows, tokens):
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self._queue.get(), left)
                    except TimeoutError:
                        break
                batch.append(item)
                rows += item.rows
                tokens += tokens_of(item.job)
            live = [it for it in batch if not it.future.done()]
            try:
                if live:
                    await self._run(loop, live)
            finally:
                self.pending_rows -= sum(it.rows for it in batch)

    async def _run(self, loop, items: list[_Item]) -> None:
        started = time.perf_counter()
        try:
            outcomes = await loop.run_in_executor(self._executor, run_together, self.engine, [it.job for it in items])
        except Unavailable as exc:  # the engine is down or restarting: the same answer for every job
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        seconds = time.perf_counter() - started
        rows = sum(it.rows for it in items)
        self.drain.add(rows, seconds)
        if self.on_batch:
            self.on_batch(len(items), rows)
        leader = True
        for it, outcome in zip(items, outcomes):
            if it.future.done():
                continue
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, QuestionError):  # a refusal found while running is the caller's mistake
                    log.error("inference failed on %s", self.engine.info.name, exc_info=outcome)
                    outcome = InferenceFailed(self.engine.info.name)
                it.future.set_exception(outcome)
                continue
            timing = Timing(queue_ms=(started - it.enqueued) * 1000.0, inference_ms=seconds * 1000.0,
                            batch_rows=rows, batch_jobs=len(items), leads_batch=leader)
            leader = False
            it.future.set_result((outcome, timing))


def run_together(engine: Engine, jobs: list[Job]) -> list[list[SystemOneResponse] | Exception]:
    """Each job's results, or what it failed with: the jobs run in shared forward passes, and if that
    fails, each alone, so one bad job cannot fail its company. `Unavailable` (the engine is down) is
    raised for all of them."""
    try:
        return list(engine.execute(jobs))
    except Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted out below, job by job
        if len(jobs) == 1:
            return [exc]
    outcomes: list[list[SystemOneResponse] | Exception] = []
    for job in jobs:
        try:
            outcomes.extend(engine.execute([job]))
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001
            outcomes.append(exc)
    return outcomes


class InferenceFailed(Exception):
    """An internal failure while running a job (logged with its traceback where it happened)."""


class Unavailable(Exception):
    """No replica of the model can take the request now (they are all gone or restarting); the
    caller should retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class PassThrough(MicroBatcher):
    """For an engine that batches where it runs (a `ForwardingEngine`, e.g. a Ray Serve
    deployment whose replicas each run a MicroBatcher): the same admission in rows, but each job is
    sent on at once (`engine.submit`), so several replicas work at the same time. The drain rate is
    the replicas' own (rows per second of a forward batch, as each answer reports it): one replica's
    rate, so with several the door and Retry-After err on the side of waiting."""

    def __init__(self, engine: ForwardingEngine, *, max_pending_rows: int = 512, on_batch=None, **_ignored: Any):
        super().__init__(engine, max_pending_rows=max_pending_rows, on_batch=on_batch)  # type: ignore[arg-type]
        self.forwarding = engine

    def start(self) -> None:
        self._queue = asyncio.Queue()  # unused; marks the batcher as started
        self.forwarding.serve_on(asyncio.get_running_loop())

    async def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, job: Job, rows: int) -> tuple[list[SystemOneResponse], Timing]:
        if self._queue is None:
            raise RuntimeError("batcher not started")
        try:
            results, timing = await self.forwarding.submit(job)
        except (Overloaded, Unavailable, QuestionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            log.exception("inference failed on %s", self.engine.info.name)
            raise InferenceFailed(self.engine.info.name) from exc
        finally:
            self.pending_rows -= rows
        self.drain.add(timing.batch_rows, timing.inference_ms / 1000.0)
        if self.on_batch and timing.leads_batch:  # each replica batch counted once, by its first answer's caller
            self.on_batch(timing.batch_jobs, timing.batch_rows)
        return results, timing
