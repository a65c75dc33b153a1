"""An engine in a process of its own (the default of `laya serve`), behind the same `Engine` shape.

The HTTP process keeps parsing, admitting, batching and answering; the engine process loads the
model and does everything that costs CPU under the interpreter lock: preparing jobs (tokenising,
building rows) and running them. So a flood of requests the HTTP process must refuse cannot take
the interpreter away from inference. Jobs stay in the engine process; the HTTP side holds a token.

Messages over one duplex pipe, each `(kind, id, payload)`: `prepare` -> a job token and its rows,
`execute` -> the results, `cancel` (no reply) -> the job's cancelled event is set where it runs
(so an abandoned request stops between forward passes there too). The engine process
reads the pipe on a thread of its own, prepares on another and executes on its main thread.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from laya.errors import LayaError
from laya.limits import UNLIMITED, Limits

log = logging.getLogger("laya.server")


class RemoteFailure(RuntimeError):
    """The engine process failed or went away."""


class _CancelFlag:
    """`threading.Event`'s shape: `set()` tells the engine process to stop the job there."""

    def __init__(self, engine: RemoteEngine, token: int):
        self._engine, self._token, self._set = engine, token, False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._engine._send("cancel", 0, self._token)

    def is_set(self) -> bool:
        return self._set


@dataclass
class RemoteJob:
    token: int
    n_rows: int
    cancelled: Any = field(default=None)


class RemoteEngine:
    def __init__(self, load: Any, start_timeout_s: float = 600.0):
        """`load()` (picklable, called in the engine process) returns the engine to run there."""
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._process = ctx.Process(target=_serve_engine, args=(child, load), daemon=True, name="laya-engine")
        self._process.start()
        child.close()
        if not self._conn.poll(start_timeout_s):
            self._process.kill()
            raise RemoteFailure("the engine process did not start in time")
        kind, _, payload = self._conn.recv()
        if kind != "ready":
            self._process.join(5)
            raise payload if isinstance(payload, BaseException) else RemoteFailure(str(payload))
        self.name, self.description, self.release_date, self._describe = payload
        self._ids = itertools.count(1)
        self._waiting: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"laya-remote-{self.name}", daemon=True)
        self._reader.start()

    def _send(self, kind: str, rid: int, payload: Any) -> None:
        with self._lock:
            self._conn.send((kind, rid, payload))

    def _call(self, kind: str, payload: Any) -> Any:
        rid = next(self._ids)
        future: Future = Future()
        with self._lock:
            if not self._process.is_alive():
                raise RemoteFailure(f"the engine process of {self.name} is gone")
            self._waiting[rid] = future
            self._conn.send((kind, rid, payload))
        return future.result()

    def _read(self) -> None:
        while True:
            try:
                kind, rid, payload = self._conn.recv()
            except (EOFError, OSError):
                break
            future = self._waiting.pop(rid, None)
            if future is None:
                continue
            if kind == "ok":
                future.set_result(payload)
            else:
                future.set_exception(payload if isinstance(payload, BaseException) else RemoteFailure(str(payload)))
        for future in list(self._waiting.values()):
            future.set_exception(RemoteFailure(f"the engine process of {self.name} went away"))
        self._waiting.clear()

    # the Engine shape
    def prepare(self, states: list[Any], questions: dict[str, Any], *, limits: Limits = UNLIMITED,
                **options: Any) -> RemoteJob:
        token, rows = self._call("prepare", (states, questions, limits, options))
        job = RemoteJob(token, rows)
        job.cancelled = _CancelFlag(self, token)
        return job

    def rows(self, job: RemoteJob) -> int:
        return job.n_rows

    def execute(self, jobs: list[RemoteJob]) -> list[list[dict[str, Any]]]:
        return self._call("execute", [job.token for job in jobs])

    def warmup(self) -> None:
        """Warmed up in its own process before it said it was ready."""

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "process": self._process.pid}

    def close(self) -> None:
        self._conn.close()
        self._process.join(5)


def _serve_engine(conn, load) -> None:
    """The engine process: load, warm up, then serve prepare/execute/cancel until the pipe closes."""
    try:
        engine = load()
        engine.warmup()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails with it
        conn.send(("failed", 0, exc if isinstance(exc, LayaError) else portable(exc)))
        return
    conn.send(("ready", 0, (engine.name, engine.description, getattr(engine, "release_date", ""),
                            engine.describe())))
    jobs: dict[int, Any] = {}
    running: set[int] = set()
    tokens = itertools.count(1)
    send_lock = threading.Lock()
    work: queue.Queue = queue.Queue()
    preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-prepare")

    def reply(kind: str, rid: int, payload: Any) -> None:
        with send_lock:
            conn.send((kind, rid, payload))

    def prepare(rid: int, payload: Any) -> None:
        states, questions, limits, options = payload
        try:
            job = engine.prepare(states, questions, limits=limits, **options)
        except Exception as exc:  # noqa: BLE001 - a refusal travels back as it is
            reply("err", rid, portable(exc))
            return
        token = next(tokens)
        jobs[token] = job
        reply("ok", rid, (token, engine.rows(job)))

    def read() -> None:
        while True:
            try:
                kind, rid, payload = conn.recv()
            except (EOFError, OSError):
                work.put(None)
                return
            if kind == "cancel":
                job = jobs.get(payload)
                if job is not None:
                    job.cancelled.set()
                    if payload not in running:  # never to run: the HTTP side skips a cancelled job
                        jobs.pop(payload, None)
            elif kind == "prepare":
                preparer.submit(prepare, rid, payload)
            else:  # execute
                work.put((rid, payload))

    threading.Thread(target=read, name="laya-engine-read", daemon=True).start()
    while (item := work.get()) is not None:
        rid, batch = item
        running.update(batch)
        present = [token for token in batch if token in jobs]
        try:
            done = dict(zip(present, engine.execute([jobs[token] for token in present])))
        except Exception as exc:  # noqa: BLE001
            reply("err", rid, portable(exc))
            continue
        finally:
            for token in batch:
                jobs.pop(token, None)
            running.clear()
        reply("ok", rid, [done.get(token, []) for token in batch])


def portable(exc: BaseException) -> BaseException:
    """`exc` itself when it survives pickling (a refusal keeps its type and fields), else a
    RemoteFailure naming it: an exception the pipe cannot carry must not leave the caller waiting."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RemoteFailure(f"{type(exc).__name__}: {exc}")
