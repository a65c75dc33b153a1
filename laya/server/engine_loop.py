"""The engine process's side of `laya.server.remote`: load the model, then read the pipe, prepare what
comes and run it in batches (`laya.server.batching`'s policy) until the pipe closes.

Its main thread reads the pipe itself (blocked on it while idle, draining it after each batch), prepares
what it read (a large request on a preparing thread, which wakes it when done) and runs what is prepared:
no other thread stands between a request and its forward pass, and none wakes up during one. A cancel is
read from the board the HTTP side writes (`_Watched`), between forward passes; the units of work a batch
holds are written where the parent's watchdog reads them (`laya.server.progress.WorkBoard`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from laya.engine import Timing
from laya.errors import LayaError, QuestionError
from laya.limits import Limits
from laya.native.placement import dedicate_this_thread
from laya.request import Options, Request
from laya.server import heap
from laya.server.batcher import run_together
from laya.server.batching import Batching, tokens_of
from laya.server.pipe import pickled
from laya.server.progress import BOARD_SLOTS, WorkBoard
from laya.stop import StopFlag, after

log = logging.getLogger("laya.server")

SMALL_PREPARE_CHARS = 4096  # a request whose states are this short is prepared as it is read


class RemoteFailure(RuntimeError):
    """The engine process failed or went away."""


class _Watched(StopFlag):
    """A job's stop flag in the engine process: its deadline, or its cancel on the board the HTTP
    side writes (read between forward passes, with no message to wait for)."""

    __slots__ = ("_board", "_rid")

    def __init__(self, deadline: float | None, board: Any, rid: int):
        super().__init__(deadline)
        self._board, self._rid = board, rid

    def is_set(self) -> bool:
        return self._set or self._board[self._rid % len(self._board)] == self._rid or self.expired


def name_this_process(name: str) -> None:
    """The name `ps -o comm` and /proc/PID/comm show for this process (Linux; 15 bytes): an engine
    process says which model it serves, since the server's answers carry no pid."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode("utf-8", "replace")[:15], 0, 0, 0)  # PR_SET_NAME


def serve_engine_process(conn, load, batching: Batching, board, work=None) -> None:
    """The engine process: load, warm up, then serve `run` and `plan` until the pipe closes."""
    try:
        engine = load()
        name_this_process(f"laya:{engine.info.name}")
        dedicate_this_thread()  # this thread runs the forward passes, and reads and prepares only between them
        engine.warmup()
        heap.freeze_loaded()  # this process lives for its engine: nothing is thawed
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails with it
        conn.send(("failed", 0, exc if isinstance(exc, LayaError) else portable(exc)))
        return
    try:
        conn.send(("ready", 0, (engine.info, engine.describe())))
    except OSError:  # the server went away while this process loaded
        return
    served = _Served(engine, conn, board, work)
    listen = getattr(engine, "on_change", None)  # an engine whose description can change by itself says so
    if listen is not None:
        listen(lambda: served.reply("describe", 0, engine.describe()))
    served.serve(batching)


@dataclass
class _Queued:
    rid: int
    job: Any
    rows: int
    queued: float  # when it was sent, on time.monotonic()
    tokens: int = 0  # the tokens its rows read, where its engine counts them ahead (an encoder's)


class _Served:
    """The engine process's main thread and what it holds: it reads the pipe itself (blocked on it
    while idle, draining it after each batch), prepares what it reads (a large request on the
    preparing thread, which wakes it when done) and runs what is prepared. No other thread stands
    between a request and its forward pass, and none wakes up during one."""

    def __init__(self, engine: Any, conn: Any, board: Any, work: Any = None):
        self.engine, self.conn, self.board = engine, conn, board
        self.work = WorkBoard(work if work is not None else [0.0] * BOARD_SLOTS)  # what the watchdog reads
        self.prepared: deque[_Queued] = deque()
        self.kept: dict[int, tuple[tuple, Options, Limits]] = {}  # slot -> questions, options, limits as sent
        self.aside: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()  # from the preparing thread
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.selector = selectors.DefaultSelector()  # one, kept: building one per wait costs more
        self.selector.register(conn.fileno(), selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.send_lock = threading.Lock()
        self.preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-prepare")
        self.open = True

    def reply(self, kind: str, rid: int, payload: Any) -> None:
        with self.send_lock, contextlib.suppress(OSError):  # a server gone away reads no reply
            self.conn.send_bytes(pickled((kind, rid, payload)))

    def prepare(self, rid: int, payload: Any) -> _Queued | None:
        """The job of a `run`, its stop flag the board's; a refusal goes back at once (None)."""
        states, kept, seconds_left, sent = payload
        try:
            if isinstance(kept, int):  # a slot the HTTP side filled before
                questions, options, limits = self.kept[kept]
            else:
                slot, questions, options, limits = kept
                if slot is not None:  # to keep for the requests that follow
                    self.kept[slot] = questions, options, limits
            request = Request(states, questions, options)
            job = self.engine.prepare(request, limits=limits, deadline=after(seconds_left))
        except Exception as exc:  # noqa: BLE001 - a refusal travels back as it is
            self.reply("err", rid, portable(exc))
            return None
        job.cancelled = _Watched(job.cancelled.deadline, self.board, rid)
        return _Queued(rid, job, job.n_rows, min(sent, time.monotonic()), tokens_of(job))

    def prepare_aside(self, rid: int, payload: Any) -> None:
        self.aside.put(self.prepare(rid, payload))
        os.write(self.wake_w, b"!")

    def plan(self, rid: int, payload: Any) -> None:
        request, limits = payload
        try:
            self.reply("ok", rid, self.engine.plan(request, limits=limits))
        except Exception as exc:  # noqa: BLE001 - travels back as it is
            self.reply("err", rid, portable(exc))

    def read(self, timeout: float | None) -> None:
        """Take in what came, waiting up to `timeout` seconds (None: until something does)."""
        ready = self.selector.select(timeout)
        if not ready:
            return
        while self.open and self.conn.poll(0):
            try:
                kind, rid, payload = self.conn.recv()
            except (EOFError, OSError):
                self.open = False
                break
            if kind == "plan":  # prepared and reported, never queued for the forward pass
                self.preparer.submit(self.plan, rid, payload)
            elif small_request(payload[0]):  # tens of microseconds: cheaper here than a hop to the preparer
                if (item := self.prepare(rid, payload)) is not None:
                    self.prepared.append(item)
            else:
                self.preparer.submit(self.prepare_aside, rid, payload)
        if any(key.fd == self.wake_r for key, _ in ready):  # the preparing thread has finished some
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 4096)
            while not self.aside.empty():
                if (item := self.aside.get()) is not None:
                    self.prepared.append(item)

    def take(self, batching: Batching) -> list[_Queued]:
        """What is prepared, in arrival order, as `batching` allows (at least one job; waiting
        `max_wait_ms` for company when asked to)."""
        if batching.max_wait_ms > 0:  # else no wait at all: what is prepared goes now
            deadline = time.perf_counter() + batching.wait_s
            while self.open and batching.has_room(sum(item.rows for item in self.prepared),
                                                  sum(item.tokens for item in self.prepared)):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self.read(left)
        batch = [self.prepared.popleft()]
        rows, tokens = batch[0].rows, batch[0].tokens
        while self.prepared and batching.has_room(rows, tokens):
            item = self.prepared.popleft()
            batch.append(item)
            rows, tokens = rows + item.rows, tokens + item.tokens
        return batch

    def serve(self, batching: Batching) -> None:
        while self.open:
            self.read(0 if self.prepared else None)
            if not self.prepared or not self.open:
                continue
            self.run(self.take(batching))

    def run(self, batch: list[_Queued]) -> None:
        started, began = time.perf_counter(), time.monotonic()
        live = [item for item in batch if not item.job.cancelled.is_set()]
        units, began_cpu = self.work.begin(item.job for item in live)
        outcomes = run_together(self.engine, [item.job for item in live]) if live else []
        self.work.end(units, began_cpu)
        seconds = time.perf_counter() - started
        rows = sum(item.rows for item in live)
        done = dict(zip(map(id, live), outcomes))
        leader = id(live[0]) if live else None
        for item in batch:
            outcome = done.get(id(item), [])
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, QuestionError):
                    log.error("inference failed on %s", self.engine.info.name, exc_info=outcome)
                self.reply("err", item.rid, portable(outcome))
                continue
            timing = Timing(queue_ms=(began - item.queued) * 1000.0, inference_ms=seconds * 1000.0,
                            batch_rows=rows, batch_jobs=len(live), leads_batch=id(item) == leader)
            self.reply("ok", item.rid, (outcome, timing))


def small_request(states: Sequence[Any]) -> bool:
    """One state of a few thousand characters at most: preparing (or pickling) it is quick enough to
    do in the thread that reads the pipe (or the HTTP side's event loop)."""
    return len(states) == 1 and isinstance(states[0], str) and len(states[0]) <= SMALL_PREPARE_CHARS


def portable(exc: BaseException) -> BaseException:
    """`exc` itself when it survives pickling (a refusal keeps its type and fields), else a
    RemoteFailure naming it: an exception the pipe cannot carry must not leave the caller waiting."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RemoteFailure(f"{type(exc).__name__}: {exc}")
