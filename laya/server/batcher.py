"""Dynamic micro-batching: concurrent requests for one engine share forward passes.

One worker per engine takes the first waiting job, gathers more for at most `max_wait_ms` (or
until `max_rows` rows), and runs them together on a dedicated thread, off the event loop. The
queue is bounded: past `max_pending` jobs a submit raises `Overloaded` at once instead of letting
latency grow without bound. A job whose caller went away before its turn is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from laya.errors import QuestionError

log = logging.getLogger("laya.server")


class Overloaded(Exception):
    """The queue is full; the caller should retry after a moment."""


@dataclass
class Timing:
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    batch_rows: int = 0
    batch_jobs: int = 0


@dataclass
class _Item:
    job: Any
    rows: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    def __init__(self, engine: Any, *, max_wait_ms: float = 2.0, max_rows: int = 64, max_pending: int = 64,
                 on_batch=None):
        self.engine = engine
        self.max_wait = max_wait_ms / 1000.0
        self.max_rows = max_rows
        self.max_pending = max_pending
        self.on_batch = on_batch
        self.pending = 0
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"laya-{engine.name}")

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
        return self.pending >= self.max_pending

    async def submit(self, job: Any) -> tuple[list[dict], Timing]:
        if self._queue is None:
            raise RuntimeError("batcher not started")
        if self.full:
            raise Overloaded(f"{self.pending} requests are already waiting for {self.engine.name}")
        future = asyncio.get_running_loop().create_future()
        self.pending += 1
        self._queue.put_nowait(_Item(job=job, rows=self.engine.rows(job), future=future))
        return await future

    async def _worker(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            batch, rows = [first], first.rows
            deadline = time.perf_counter() + self.max_wait
            while rows < self.max_rows:
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
            live = [it for it in batch if not it.future.done()]
            try:
                if live:
                    await self._run(loop, live)
            finally:
                self.pending -= len(batch)

    async def _run(self, loop, items: list[_Item]) -> None:
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._executor, self.engine.execute, [it.job for it in items])
        except Exception as exc:
            if len(items) > 1:  # isolate the failure: one bad job must not fail its batch company
                for it in items:
                    await self._run(loop, [it])
                return
            if not isinstance(exc, QuestionError):  # a refusal found while running is the caller's mistake
                log.exception("inference failed on %s", self.engine.name)
                exc = InferenceFailed(self.engine.name)
            if not items[0].future.done():
                items[0].future.set_exception(exc)
            return
        elapsed = (time.perf_counter() - started) * 1000.0
        rows = sum(it.rows for it in items)
        if self.on_batch:
            self.on_batch(len(items), rows)
        for it, result in zip(items, results):
            if not it.future.done():
                timing = Timing(queue_ms=(started - it.enqueued) * 1000.0, inference_ms=elapsed,
                                batch_rows=rows, batch_jobs=len(items))
                it.future.set_result((result, timing))


class InferenceFailed(Exception):
    """An internal failure while running a job (logged with its traceback where it happened)."""
