"""An engine in a process of its own (the default of `laya serve`), behind the same `Engine` shape,
and supervised: when that process dies it comes back.

The HTTP process keeps parsing, admitting, batching and answering; the engine process loads the
model and does everything that costs CPU under the interpreter lock: preparing jobs (tokenising,
building rows) and running them. So a flood of requests the HTTP process must refuse cannot take
the interpreter away from inference. Jobs stay in the engine process; the HTTP side holds a token.

Messages over one duplex pipe, each `(kind, id, payload)`: `prepare` -> a job token and its rows,
`execute` -> the results, `cancel` (no reply) -> the job's stop flag is set where it runs (so an
abandoned request stops between forward passes there too). A job's deadline crosses as the seconds
it has left, and stops it there as well. The engine process reads the pipe on a thread of its own,
prepares on another and executes on its main thread.

Supervision. An engine process can die under the server (the kernel's OOM killer, a crash inside
llama.cpp, SIGKILL). The pipe's end tells at once: the model is marked unready, requests get
`Unavailable` (a 503 with Retry-After, never a 500 or a hang), and a new process is started after a
backoff (0.5 s, 1 s, 2 s, ...), warmed up, and put in service. A job that was queued or running when
its process died is prepared again and run once on the new process (System One requests are
idempotent), if that is up before the job's deadline; else it gets the 503. A model that keeps
dying (`RestartPolicy.max_deaths` times within `window_s`) stays down, with its reason in /health.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing
import queue
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from laya.errors import LayaError
from laya.limits import UNLIMITED, Limits
from laya.questions import Questions
from laya.server import heap
from laya.server.batcher import Unavailable
from laya.stop import StopFlag, after

log = logging.getLogger("laya.server")


class RemoteFailure(RuntimeError):
    """The engine process failed or went away."""


class EngineDied(RemoteFailure):
    """The engine process ended while a call was waiting on it."""


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)  # before the 1st, 2nd, ... restart in a window
    max_deaths: int = 5  # deaths within `window_s` after which the model stays down
    window_s: float = 60.0
    start_timeout_s: float = 600.0  # a new process must load and warm up within this
    retry_wait_s: float = 60.0  # longest a job caught by a death waits for the new process (and its deadline)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "its pipe closed"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"it was killed by {name}" + (" (as the kernel's OOM killer does)" if name == "SIGKILL" else "")
    return f"it exited with code {exitcode}"


class _Link:
    """One incarnation of the engine process: its pipe, the calls waiting on it, and its reader."""

    def __init__(self, process: Any, conn: Any, generation: int, on_exit: Any):
        self.process, self.conn, self.generation = process, conn, generation
        self.waiting: dict[int, Future] = {}
        self.lock = threading.Lock()
        self.alive = True
        self._ids = itertools.count(1)
        self._on_exit = on_exit
        self.reader = threading.Thread(target=self._read, name=f"laya-remote-{generation}", daemon=True)
        self.reader.start()

    def send(self, kind: str, rid: int, payload: Any) -> None:
        with self.lock:
            if not self.alive:
                raise EngineDied("the engine process is gone")
            try:
                self.conn.send((kind, rid, payload))
            except (OSError, ValueError) as exc:  # the pipe broke under us: the reader reports the death
                raise EngineDied(f"the engine process is gone ({exc})") from exc

    def call(self, kind: str, payload: Any) -> Any:
        rid = next(self._ids)
        future: Future = Future()
        with self.lock:
            if not self.alive:
                raise EngineDied("the engine process is gone")
            self.waiting[rid] = future
        try:
            self.send(kind, rid, payload)
        except EngineDied:
            with self.lock:
                self.waiting.pop(rid, None)
            raise
        return future.result()

    def _read(self) -> None:
        while True:
            try:
                kind, rid, payload = self.conn.recv()
            except (EOFError, OSError, ValueError):
                break
            with self.lock:
                future = self.waiting.pop(rid, None)
            if future is None:
                continue
            if kind == "ok":
                future.set_result(payload)
            else:
                future.set_exception(payload if isinstance(payload, BaseException) else RemoteFailure(str(payload)))
        self.process.join(2)
        reason = _exit_reason(self.process.exitcode)
        with self.lock:
            self.alive = False
            waiting, self.waiting = list(self.waiting.values()), {}
        for future in waiting:
            future.set_exception(EngineDied(f"the engine process went away: {reason}"))
        self._on_exit(self, reason)

    def close(self) -> None:
        with self.lock:
            self.alive = False
            self.conn.close()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


class _CancelFlag(StopFlag):
    """The HTTP side's stop flag of a remote job: `set()` also tells the process that runs it."""

    __slots__ = ("_job",)

    def __init__(self, job: RemoteJob, deadline: float | None):
        super().__init__(deadline)
        self._job = job

    def set(self) -> None:
        if not self._set:
            self._set = True
            job = self._job
            with contextlib.suppress(EngineDied):  # else nothing runs it any more
                job.link.send("cancel", 0, job.token)


@dataclass(eq=False)
class RemoteJob:
    token: int
    n_rows: int
    link: _Link
    request: tuple[Any, ...]  # (states, questions, limits, options): to prepare it again on a new process
    cancelled: StopFlag = field(default_factory=StopFlag)


class RemoteEngine:
    batches_where_it_runs = False  # the engine process runs what this side's batcher coalesced

    def __init__(self, load: Any, start_timeout_s: float | None = None, policy: RestartPolicy | None = None):
        """`load()` (picklable, called in the engine process) returns the engine to run there. The
        first start raises what the load raised; later ones are the supervisor's."""
        self.policy = policy or RestartPolicy()
        if start_timeout_s is not None:
            self.policy = RestartPolicy(**{**self.policy.__dict__, "start_timeout_s": start_timeout_s})
        self._load = load
        self._lock = threading.Lock()
        self._generation = itertools.count(1)
        self._deaths: deque[float] = deque()
        self._ready = threading.Event()
        self._closing = False
        self.restarts = 0
        self.state, self.reason, self.since = "starting", "", _now_iso()
        self.last_death: dict[str, Any] | None = None
        self._restart_at = 0.0  # monotonic time the pending restart starts
        began = time.monotonic()
        self._link, info = self._spawn()
        self.start_s = time.monotonic() - began
        self.name, self.description, self.release_date, self._describe = info
        self._set_state("ready", "")

    # the process
    def _spawn(self) -> tuple[_Link, tuple]:
        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_serve_engine, args=(child, self._load), daemon=True, name="laya-engine")
        process.start()
        child.close()
        try:
            if not conn.poll(self.policy.start_timeout_s):
                process.kill()
                raise RemoteFailure(f"the engine process did not start within {self.policy.start_timeout_s:g} s")
            kind, _, payload = conn.recv()
        except (EOFError, OSError) as exc:
            process.join(5)
            raise RemoteFailure(f"the engine process ended while loading: {_exit_reason(process.exitcode)}") from exc
        if kind != "ready":
            process.join(5)
            conn.close()
            raise payload if isinstance(payload, BaseException) else RemoteFailure(str(payload))
        return _Link(process, conn, next(self._generation), self._on_exit), payload

    def _set_state(self, state: str, reason: str) -> None:
        self.state, self.reason, self.since = state, reason, _now_iso()
        (self._ready.set if state == "ready" else self._ready.clear)()

    def _on_exit(self, link: _Link, reason: str) -> None:
        """The reader of `link` saw its pipe end: unready at once, then restart (or stay down)."""
        with self._lock:
            if self._closing or link is not self._link:
                return
            now = time.monotonic()
            self._deaths.append(now)
            while self._deaths and now - self._deaths[0] > self.policy.window_s:
                self._deaths.popleft()
            self.last_death = {"at": _now_iso(), "reason": reason, "pid": link.process.pid}
            why = f"the engine process of {self.name} died: {reason}"
            if len(self._deaths) >= self.policy.max_deaths:
                self._set_state("down", f"{why}; it died {len(self._deaths)} times within "
                                        f"{self.policy.window_s:g} s, so it stays down until the server restarts")
                log.error("%s", self.reason)
                return
            delay = self.policy.backoff_s[min(len(self._deaths), len(self.policy.backoff_s)) - 1]
            self._restart_at = now + delay
            self._set_state("restarting", f"{why}; restarting it")
            log.error("%s; restarting it in %.1f s", why, delay)
        threading.Thread(target=self._restart, args=(delay,), name=f"laya-restart-{self.name}", daemon=True).start()

    def _restart(self, delay: float) -> None:
        time.sleep(delay)
        if self._closing:
            return
        began = time.monotonic()
        try:
            link, _ = self._spawn()
        except BaseException as exc:  # noqa: BLE001 - a failed restart counts as one more death
            log.error("restarting the engine process of %s failed: %s", self.name, exc)
            self._on_exit(self._link, f"its restart failed ({type(exc).__name__}: {exc})")
            return
        with self._lock:
            if self._closing:
                link.close()
                return
            self._link = link
            self.restarts += 1
            self.start_s = time.monotonic() - began
            self._set_state("ready", "")
        log.warning("the engine process of %s is back (pid %d, restart %d, %.1f s to load and warm up)",
                    self.name, link.process.pid, self.restarts, self.start_s)

    def retry_after(self) -> int:
        """Whole seconds until the model is expected to answer again."""
        if self.state == "down":
            return 60
        left = max(0.0, self._restart_at - time.monotonic()) + self.start_s
        return max(1, min(60, math.ceil(left)))

    def _unavailable(self) -> Unavailable:
        return Unavailable(f"model {self.name} is {self.state}: {self.reason}", self.retry_after())

    def _link_now(self, wait_s: float = 0.0) -> _Link:
        """The live process's link, waiting up to `wait_s` for a restart; `Unavailable` otherwise."""
        if self.state != "down" and wait_s > 0:
            self._ready.wait(wait_s)
        link = self._link
        if self.state != "ready" or not link.alive:
            raise self._unavailable()
        return link

    # the Engine shape
    def prepare(self, states: list[Any], questions: Questions, *, limits: Limits = UNLIMITED,
                deadline: float | None = None, **options: Any) -> RemoteJob:
        link = self._link_now()
        request = (states, questions, limits, options)
        job = RemoteJob(0, 0, link, request)
        job.cancelled = _CancelFlag(job, deadline)
        self._prepare_on(link, job)
        return job

    def _prepare_on(self, link: _Link, job: RemoteJob) -> None:
        states, questions, limits, options = job.request
        try:
            job.token, job.n_rows = link.call("prepare", (states, questions, limits, job.cancelled.remaining(),
                                                          options))
        except EngineDied as exc:
            raise self._unavailable() from exc
        job.link = link

    def rows(self, job: RemoteJob) -> int:
        return job.n_rows

    def execute(self, jobs: list[RemoteJob]) -> list[list[dict[str, Any]]]:
        """Run on the live process; a job whose process died (before or while it ran) is prepared again
        and run once more on the new one, if that is up within the job's deadline."""
        reran = False
        while True:
            live = [job for job in jobs if not job.cancelled.is_set()]
            if not live:
                return [[] for _ in jobs]
            if any(job.link is not self._link or not job.link.alive for job in live):
                if reran:  # caught by a second death: the 503, not a third process
                    raise self._unavailable()
                reran = True
                left = [t for t in (job.cancelled.remaining() for job in live) if t is not None]
                link = self._link_now(max(0.0, min(self.policy.retry_wait_s, max(left, default=math.inf))))
                for job in live:
                    if job.link is not link:
                        self._prepare_on(link, job)
            else:
                link = self._link_now()
            try:
                done = link.call("execute", [job.token for job in live])
            except EngineDied:
                continue  # its jobs are stale now: prepared again on the new process, once
            by_job = dict(zip(map(id, live), done))
            return [by_job.get(id(job), []) for job in jobs]

    def warmup(self) -> None:
        """Warmed up in its own process before it said it was ready."""

    def status(self) -> dict[str, Any]:
        """For /health and /ready: up or not, why and since when, how often it came back."""
        out: dict[str, Any] = {"state": self.state, "since": self.since, "restarts": self.restarts,
                               "process": self._link.process.pid}
        if self.reason:
            out["reason"] = self.reason
        if self.state == "restarting":
            out["retry_after_s"] = self.retry_after()
        if self.last_death:
            out["last_death"] = self.last_death
        return out

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "process": self._link.process.pid}

    def close(self) -> None:
        with self._lock:
            self._closing = True
        self._link.close()

    @property
    def pid(self) -> int | None:
        """The live engine process's pid."""
        return self._link.process.pid


def _serve_engine(conn, load) -> None:
    """The engine process: load, warm up, then serve prepare/execute/cancel until the pipe closes."""
    try:
        engine = load()
        engine.warmup()
        heap.freeze_loaded()  # this process lives for its engine: nothing is thawed
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails with it
        conn.send(("failed", 0, exc if isinstance(exc, LayaError) else portable(exc)))
        return
    try:
        conn.send(("ready", 0, (engine.name, engine.description, engine.release_date,
                                engine.describe())))
    except OSError:  # the server went away while this process loaded
        return
    jobs: dict[int, Any] = {}
    running: set[int] = set()
    tokens = itertools.count(1)
    send_lock = threading.Lock()
    work: queue.Queue = queue.Queue()
    preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-prepare")

    def reply(kind: str, rid: int, payload: Any) -> None:
        with send_lock, contextlib.suppress(OSError):  # a server gone away reads no reply; the reader ends it
            conn.send((kind, rid, payload))

    def prepare(rid: int, payload: Any) -> None:
        states, questions, limits, seconds_left, options = payload
        try:
            job = engine.prepare(states, questions, limits=limits, deadline=after(seconds_left), **options)
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
            elif kind == "prepare" and _small(payload):
                prepare(rid, payload)  # a few hundred microseconds: cheaper here than a hop to the preparer
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


SMALL_PREPARE_CHARS = 4096  # a request whose states are this short is prepared on the reading thread


def _small(payload: Any) -> bool:
    """One state of a few thousand characters at most: preparing it is quick enough not to hold up
    the reading of the pipe (cancels, executes) behind it."""
    states = payload[0]
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
