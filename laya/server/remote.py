"""An engine in a process of its own (the default of `laya serve`), behind the same `Engine` shape,
and supervised: when that process dies it comes back.

The HTTP process keeps parsing, admitting (in rows) and answering; the engine process loads the
model and does everything that costs CPU under the interpreter lock: preparing jobs (tokenising,
building rows), batching them and running them. So a flood of requests the HTTP process must refuse
cannot take the interpreter away from inference.

One round trip a request, over one duplex pipe of `(kind, id, payload)` messages: `run` carries the
validated `Request` (its states, its questions and options, the limits, the seconds left before its
deadline, the send time) and is answered by its results and timing, or by its refusal; `plan` carries
a request to be prepared and reported on, never run (`laya.plan`), answered by the plan. Questions and
options the engine process already holds under the same limits travel as their slot number. A cancel is
no message: the HTTP side writes the request's id on a shared board that its stop flag reads where it
runs, so an abandoned request stops between forward passes there too, with nobody there to read the
pipe meanwhile.

No thread stands between a request and its forward pass on either side. The HTTP side writes and
reads the pipe on the server's event loop (`laya.server.pipe`): a reply settles the waiting
coroutine's future directly. In the engine process (`laya.server.engine_loop`, this module's other half)
the main thread reads the pipe itself (blocked on it while idle, draining it after each batch), prepares
what it read (a large request on a preparing thread) and runs it: an idle engine starts at once, and what
queued in the pipe while it was busy runs together in shared forward passes, as `laya.server.batching`'s
policy (the one every mode applies) allows. Measured on a 2-core AMD EPYC (`benchmarks/overhead.py`, interleaved with
the previous design in one run): 0.25-0.28 ms a hop one way, against 0.50-0.55 ms with a reader
thread on each side, and a p90 round trip 6.0-6.2 ms against 10.3-10.4 ms.

Supervision. An engine process can die under the server (the kernel's OOM killer, a crash inside
llama.cpp, SIGKILL). The pipe's end tells at once: the model is marked unready, requests get
`Unavailable` (a 503 with Retry-After, never a 500 or a hang), and a new process is started after a
backoff (0.5 s, 1 s, 2 s, ...), warmed up, and put in service. A request that was queued or running
when its process died is sent once more to the new process (System One requests are idempotent), if
that is up before the request's deadline; else it gets the 503. A model that keeps dying
(`RestartPolicy.max_deaths` times within `window_s`) stays down, with its reason in /health.

A hang is told by progress, not by wall time (`laya.server.progress`): a process with work
outstanding that consumes no CPU and answers nothing for `hang_min_s` is hung (stopped, deadlocked,
stuck waiting in a native call); one that spends more CPU on a batch than its units (tokens, else
rows) need at its measured speed, `hang_factor` times over (and at least `hang_cpu_s`), is spinning.
Either is killed and restarted; a slow one, on a busy machine, is left to work. A replacement found
spinning like the process it replaced is not killed again: the machine is slow, /health says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import multiprocessing
import queue
import secrets
import signal
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from laya.engine import EngineInfo, Timing
from laya.limits import UNLIMITED, Limits
from laya.request import Options, Request
from laya.response import SystemOneResponse
from laya.server.batcher import Unavailable
from laya.server.batching import Batching
from laya.server.engine_loop import RemoteFailure, serve_engine_process, small_request
from laya.server.pipe import Pipe, on_loop, own_loop
from laya.server.progress import BOARD_SLOTS, SLOW_SHARE, Bounds, Watch
from laya.server.work import work_s
from laya.stop import StopFlag

log = logging.getLogger("laya.server")


class EngineDied(RemoteFailure):
    """The engine process ended while a call was waiting on it."""


HANG_CHECK_S = 0.5  # how often the watchdog looks for a hung engine process
DEFAULT_ROW_S = 0.1  # where CPU time cannot be read: the seconds a row is allowed before one is measured


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)  # before the 1st, 2nd, ... restart in a window
    max_deaths: int = 5  # deaths within `window_s` after which the model stays down
    window_s: float = 60.0
    start_timeout_s: float = 600.0  # a new process must load and warm up within this
    # Longest a job with no deadline, caught by a death, waits for the new process. One with a deadline (every
    # request the server admits) waits up to its deadline: on a busy machine a restart can take longer than a
    # fixed bound, and a 503 before the deadline drops what the new process would have answered.
    retry_wait_s: float = 60.0
    # A process with work outstanding that consumes no CPU and answers nothing for `hang_min_s` is hung;
    # so is one that spends more CPU seconds on a batch than `hang_factor` times what the batch's units
    # need at its measured speed (and at least `hang_cpu_s`): killed and restarted (`laya.server.progress`).
    # Where CPU time cannot be read (not Linux): silent for `hang_factor` times what its measured wall
    # time a row needs for that work, and at least `hang_min_s`.
    hang_min_s: float = 10.0
    hang_factor: float = 10.0
    hang_cpu_s: float = 60.0


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
    """One incarnation of the engine process: its pipe (read on an event loop), the requests waiting
    on it, and the board their cancels are written on."""

    def __init__(self, process: Any, conn: Any, generation: int, on_exit: Any, board: Any,
                 loop: asyncio.AbstractEventLoop, work: Any = None):
        self.process, self.generation, self.board = process, generation, board
        self.work = work if work is not None else [0.0] * BOARD_SLOTS  # what it runs now (`WorkBoard`)
        self.watch = Watch(process.pid)  # its progress, as the watchdog sees it
        self.spared = False  # found spinning, and left to work (the machine is slow)
        self.instance = secrets.token_hex(4)  # names this start of the process in answers (never its pid)
        self.waiting: dict[int, Future | asyncio.Future] = {}
        self.lock = threading.Lock()
        self.alive = True
        self.sent: dict[int, tuple[int, float]] = {}  # request id -> its rows and when it was sent
        self.allowed: dict[int, float] = {}  # request id -> the seconds its work may take (`laya.server.work`)
        self.last_heard = time.monotonic()  # the process's last reply
        self.hung = ""  # why the watchdog killed it, if it did
        self.on_speed: Any = None  # called with the seconds a row took, as replies come
        self.on_describe: Any = None  # called with what the engine says it is now, when that changes
        self._ids = itertools.count(1)
        self._on_exit = on_exit
        self.known: OrderedDict[tuple, int] = OrderedDict()  # (questions, limits) it holds -> slot
        self.pipe = Pipe(conn, loop, self._message, self._ended)

    def send(self, kind: str, rid: int, payload: Any) -> None:
        if not self.alive:
            raise EngineDied("the engine process is gone")
        self.pipe.send((kind, rid, payload))

    def expect(self) -> tuple[int, Future | asyncio.Future]:
        """A new request id and the future its reply will settle (or the process's death): one of
        the pipe's loop for a caller on that loop, else one any thread may wait on."""
        rid = next(self._ids)
        future: Future | asyncio.Future = (self.pipe.loop.create_future() if on_loop(self.pipe.loop)
                                           else Future())
        with self.lock:
            if not self.alive:
                raise EngineDied("the engine process is gone")
            self.waiting[rid] = future
        return rid, future

    def forget(self, rid: int) -> None:
        with self.lock:
            self.waiting.pop(rid, None)
            self.sent.pop(rid, None)
            self.allowed.pop(rid, None)

    def sending(self, rid: int, rows: int) -> None:
        with self.lock:
            if not self.sent:  # idle until now: silence counts from here
                self.last_heard = time.monotonic()
            self.sent[rid] = (rows, time.monotonic())

    def busy(self) -> tuple[int, float]:
        """The rows of work outstanding, and how long the process has been silent with work."""
        with self.lock:
            rows = sum(r for r, _ in self.sent.values())
            return rows, (time.monotonic() - self.last_heard) if rows else 0.0

    def heard(self) -> float:
        """When it last replied, or was given work while idle (monotonic)."""
        with self.lock:
            return self.last_heard

    def allowance(self) -> float:
        """The seconds the work outstanding may take at the model's measured speed, all of it."""
        with self.lock:
            return sum(self.allowed.values())

    def send_run(self, rid: int, job: RemoteJob) -> None:
        """Send `job` as request `rid`. From the pipe's loop its questions and limits go as a slot number
        once the engine process holds them (routers ask the same questions of every state under the
        server's one set of limits, and unpickling them was most of a small request's hop), else with
        the slot to keep them in. Slots are given (least recently used out first) only on the loop, so
        in the order the pipe carries them, and only once the message is written."""
        if not self.alive:
            raise EngineDied("the engine process is gone")
        self.sending(rid, max(1, job.n_rows))
        with self.lock:
            self.allowed[rid] = job.work_s
        request = job.request
        if not on_loop(self.pipe.loop):  # sent whole
            self.pipe.send(("run", rid, job.payload((None, request.questions, request.options, job.limits))))
            return
        key = (request.questions, request.options, job.limits)
        slot = self.known.get(key)
        if slot is not None:
            self.known.move_to_end(key)
            self.pipe.send(("run", rid, job.payload(slot)))
            return
        full = len(self.known) >= QUESTION_SLOTS
        slot = next(iter(self.known.values())) if full else len(self.known)
        self.pipe.send(("run", rid, job.payload((slot, request.questions, request.options, job.limits))))
        if full:
            self.known.popitem(last=False)
        self.known[key] = slot

    def cancel(self, rid: int) -> None:
        """Stop request `rid` where it runs: it reads the board between forward passes."""
        self.board[rid % len(self.board)] = rid

    def _message(self, message: Any) -> None:
        """A reply, on the pipe's loop."""
        kind, rid, payload = message
        if kind == "describe":  # the engine changed by itself (auto's upgrade swapped its runtime)
            if self.on_describe is not None:
                self.on_describe(payload)
            return
        now = time.monotonic()
        with self.lock:
            future = self.waiting.pop(rid, None)
            sent = self.sent.pop(rid, None)
            self.allowed.pop(rid, None)
            self.last_heard = now
        if sent is not None and self.on_speed is not None:
            self.on_speed((now - sent[1]) / sent[0])
        if future is None:  # its caller went away
            return
        if kind == "ok":
            _settle(future, payload, None)
        else:
            _settle(future, None, payload if isinstance(payload, BaseException) else RemoteFailure(str(payload)))

    def _ended(self) -> None:
        """The pipe ended (on its loop): no new request from now; the process is buried on a thread."""
        with self.lock:
            self.alive = False
        threading.Thread(target=self._bury, name=f"laya-bury-{self.generation}", daemon=True).start()

    def _bury(self) -> None:
        self.process.join(2)
        reason = self.hung or _exit_reason(self.process.exitcode)
        self._on_exit(self, reason)  # unready (and restarting) before a waiting caller retries
        with self.lock:
            waiting, self.waiting = list(self.waiting.values()), {}
        for future in waiting:
            _settle(future, None, EngineDied(f"the engine process went away: {reason}"))

    def close(self) -> None:
        with self.lock:
            self.alive = False
        self.pipe.close()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def _settle(future: Future | asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Settle a waiting caller's future from any thread (an asyncio one on its own loop), unless it
    was cancelled meanwhile."""
    if isinstance(future, asyncio.Future):
        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        loop = future.get_loop()
        if on_loop(loop):
            settle()
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle)
        return
    with contextlib.suppress(InvalidStateError):
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


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
            if job.link is not None and job.token:
                job.link.cancel(job.token)


# questions, options and limits as a run carries them: a slot the engine process holds, or
# (the slot to keep them in or None, questions, options, limits)
Kept = int | tuple[int | None, tuple, Options, Limits]


@dataclass(eq=False)
class RemoteJob:
    """A validated request, packed to be prepared and run in the engine process; `token` and `link`
    name where it was last sent (what a cancel goes to). Its rows are the request's (the engine process
    counts a tournament's and a scan's exactly where it prepares them)."""

    request: Request
    limits: Limits
    work_s: float = 0.0  # the seconds its work may take at the model's measured speed (`laya.server.work`)
    token: int = 0
    link: _Link | None = None
    cancelled: StopFlag = field(default_factory=StopFlag)

    @property
    def n_rows(self) -> int:
        return self.request.rows

    def payload(self, kept: Kept) -> tuple[Any, ...]:
        """What `run` carries: the states, the questions, options and limits as `_Link.send_run` refers to
        them (`Kept`), and the send time on `time.monotonic()`, which is the machine's (its boot clock on
        Linux and macOS) and so the engine process's too: its queue time counts what the request waited in
        the pipe while a forward pass ran."""
        return self.request.states, kept, self.cancelled.remaining(), time.monotonic()


class RemoteEngine:
    """The engine process's model, behind `ForwardingEngine`: it coalesces what queued while it was busy."""

    def __init__(self, load: Any, start_timeout_s: float | None = None, policy: RestartPolicy | None = None,
                 batching: Batching | None = None):
        """`load()` (picklable, called in the engine process) returns the engine to run there. The
        first start raises what the load raised; later ones are the supervisor's."""
        self.batching = batching or Batching()
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
        self._row_s: deque[float] = deque([DEFAULT_ROW_S], maxlen=64)  # seconds a row took, lately
        self._spun = -1  # the generation last killed for spinning (its replacement is not, for the same)
        self.slow: dict[str, Any] | None = None  # the machine is slow: said in /health
        self._loop = own_loop()  # where replies are read until the server serves it on its own
        self._restarts: queue.SimpleQueue[float | None] = queue.SimpleQueue()  # delays, None to stop
        began = time.monotonic()
        self._link, info = self._spawn()
        self.start_s = time.monotonic() - began
        self.info: EngineInfo = info[0]
        self._describe: dict[str, Any] = info[1]
        # Restarts are started from a thread made here, at the CPU priority the engine has. A thread (and
        # a process it starts) takes the priority of the thread that made it, and the HTTP loop lowers its
        # own once the engines are loaded (`ServerConfig.http_nice`) so that inference wins under load: an
        # engine process restarted from the loop's side ran at the loop's priority for good (an unprivileged
        # process cannot raise it again).
        threading.Thread(target=self._restarter, name="laya-restarter", daemon=True).start()
        threading.Thread(target=self._watchdog, name="laya-watchdog", daemon=True).start()
        self._set_state("ready", "")

    # the process
    def _spawn(self) -> tuple[_Link, tuple]:
        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe(duplex=True)
        board = ctx.RawArray("q", CANCEL_SLOTS)
        work = ctx.RawArray("d", BOARD_SLOTS)
        process = ctx.Process(target=serve_engine_process, args=(child, self._load, self.batching, board, work),
                              daemon=True, name="laya-engine")
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
        with self._lock:
            loop = self._loop
        link = _Link(process, conn, next(self._generation), self._on_exit, board, loop, work)
        link.on_speed = self._row_s.append
        link.on_describe = self._described
        return link, payload

    def _described(self, describe: dict[str, Any]) -> None:
        self._describe = describe

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
            self.last_death = {"at": _now_iso(), "reason": reason, "instance": link.instance}
            why = f"the engine process of {self.info.name} died: {reason}"
            if len(self._deaths) >= self.policy.max_deaths:
                self._set_state("down", f"{why}; it died {len(self._deaths)} times within "
                                        f"{self.policy.window_s:g} s, so it stays down until the server restarts")
                log.error("%s", self.reason)
                return
            delay = self.policy.backoff_s[min(len(self._deaths), len(self.policy.backoff_s)) - 1]
            self._restart_at = now + delay
            self._set_state("restarting", f"{why}; restarting it")
            log.error("%s; restarting it in %.1f s", why, delay)
        self._restarts.put(delay)

    def _restarter(self) -> None:
        while (delay := self._restarts.get()) is not None:
            self._restart(delay)

    def _watchdog(self) -> None:
        """Death is told by the pipe's end; a hang is not: an engine process stuck in a forward pass or a
        native call stays alive with its work outstanding. Checked every `HANG_CHECK_S`, only on a
        process in service (one that loads is the restarter's, bounded by `start_timeout_s`)."""
        while not self._closing:
            time.sleep(HANG_CHECK_S)
            with self._lock:
                link = self._link
            if link.alive and not link.hung and (why := self.hung(link)):
                link.hung = why
                log.error("the engine process of %s is hung (%s): killing it to restart it", self.info.name, why)
                with contextlib.suppress(OSError):
                    link.process.kill()

    def hung(self, link: _Link) -> str:
        """Why `link`'s process counts as hung now, or "" (it is idle, or making progress)."""
        rows, silent = link.busy()
        if not link.watch.readable:  # no CPU time to read here: silence against the measured wall speed
            bound = max(self.policy.hang_min_s, self.policy.hang_factor * rows * max(self._row_s),
                        link.allowance())
            if rows and silent > bound:
                return (f"it answered nothing for {silent:.1f} s with {rows} rows of work, over the {bound:.1f} s "
                        "its measured speed allows")
            return ""
        bounds = Bounds(self.policy.hang_min_s, self.policy.hang_cpu_s, self.policy.hang_factor)
        verdict = link.watch.look(bool(rows), link.heard(), link.work, bounds)
        if verdict is None or (verdict.kind == "spinning" and link.spared):
            return ""
        if verdict.kind == "spinning":
            with self._lock:
                again = self._spun == link.generation - 1
                self._spun = link.generation
            if again:  # the replacement spends as much: a slow machine, not a stuck process
                link.spared = True
                self.slow = {"since": _now_iso(), "note": f"the engine process {verdict.why}, as the one it "
                             "replaced did: the machine is slow, so it is left to work"}
                log.warning("the engine process of %s %s, as the one it replaced did: the machine is slow, so it "
                            "is left to work", self.info.name, verdict.why)
                return ""
        return verdict.why

    def _restart(self, delay: float) -> None:
        time.sleep(delay)
        if self._closing:
            return
        began = time.monotonic()
        try:
            link, _ = self._spawn()
        except BaseException as exc:  # noqa: BLE001 - a failed restart counts as one more death
            log.error("restarting the engine process of %s failed: %s", self.info.name, exc)
            self._on_exit(self._link, f"its restart failed ({type(exc).__name__}: {exc})")
            return
        with self._lock:
            if self._closing:
                link.close()
                return
            self._link = link
            loop = self._loop
        link.pipe.move_to(loop)  # served on the server's loop since this process was started
        with self._lock:
            self.restarts += 1
            self.start_s = time.monotonic() - began
            self._set_state("ready", "")
        log.warning("the engine process of %s is back (pid %d, restart %d, %.1f s to load and warm up)",
                    self.info.name, link.process.pid, self.restarts, self.start_s)

    def retry_after(self) -> int:
        """Whole seconds until the model is expected to answer again."""
        if self.state == "down":
            return 60
        left = max(0.0, self._restart_at - time.monotonic()) + self.start_s
        return max(1, min(60, math.ceil(left)))

    def _unavailable(self) -> Unavailable:
        return Unavailable(f"model {self.info.name} is {self.state}: {self.reason}", self.retry_after())

    def _link_now(self) -> _Link:
        """The live process's link; `Unavailable` while there is none."""
        link = self._link
        if self.state == "ready" and not link.alive:  # its pipe just ended; the supervisor is told next
            raise Unavailable(f"model {self.info.name} is restarting: its engine process ended", self.retry_after())
        if self.state != "ready":
            raise self._unavailable()
        return link

    async def _restarted(self, seconds: float) -> None:
        """Until the model is back (or down for good), for at most `seconds`."""
        end = time.monotonic() + seconds
        while self.state not in ("ready", "down") and time.monotonic() < end:
            await asyncio.sleep(0.05)

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read replies on `loop` (the server's, whose coroutines wait for them) from now on, this
        process's and those that replace it."""
        with self._lock:
            self._loop = loop
            link = self._link
        link.pipe.move_to(loop)

    # the Engine shape
    def prepare(self, request: Request, *, limits: Limits = UNLIMITED, deadline: float | None = None) -> RemoteJob:
        """Packed, not prepared: the engine process prepares it (and refuses it, naming why) as it
        arrives there."""
        job = RemoteJob(request, limits, work_s=work_s(request, self._describe.get("speed"), limits))
        job.cancelled = _CancelFlag(job, deadline)
        return job

    async def submit(self, job: RemoteJob) -> tuple[list[SystemOneResponse], Timing]:
        """The job's answers from the engine process, in one round trip. A job whose process dies
        under it is sent once more to the new one, if that is up within the job's deadline (however long
        a busy machine makes the restart; a second death: the 503, not a third process)."""
        link = self._link_now()
        for attempt in (1, 2):
            try:
                return await self._run_on(link, job)
            except EngineDied:
                if attempt == 2 or job.cancelled.is_set():
                    raise self._unavailable() from None
            left = job.cancelled.remaining()
            await self._restarted(max(0.0, self.policy.retry_wait_s if left is None else left))
            link = self._link_now()
        raise AssertionError("unreachable")

    async def _run_on(self, link: _Link, job: RemoteJob) -> tuple[list[SystemOneResponse], Timing]:
        rid, future = link.expect()
        job.token, job.link = rid, link
        try:
            if small_request(job.request.states):
                link.send_run(rid, job)
            else:  # megabytes to pickle and write: off the event loop
                await asyncio.to_thread(link.send_run, rid, job)
            return await (future if isinstance(future, asyncio.Future) else asyncio.wrap_future(future))
        except BaseException:
            link.forget(rid)
            raise

    def plan(self, request: Request, *, limits: Limits = UNLIMITED) -> dict[str, Any]:
        """The engine process's plan of the request (one `plan` round trip; it prepares, runs nothing).
        Blocking: the server calls it on a worker thread."""
        link = self._link_now()
        rid = 0
        try:
            rid, future = link.expect()
            link.sending(rid, 1)
            link.send("plan", rid, (request, limits))
            return cast(Future, future).result(timeout=PLAN_TIMEOUT_S)  # off the loop: a thread's future
        except EngineDied:
            raise self._unavailable() from None
        except FutureTimeout:
            raise Unavailable(f"model {self.info.name} did not plan the request within {PLAN_TIMEOUT_S:g} s",
                              self.retry_after()) from None
        finally:
            link.forget(rid)

    def warmup(self) -> None:
        """Warmed up in its own process before it said it was ready."""

    def status(self) -> dict[str, Any]:
        """For /health and /ready: up or not, why and since when, how often it came back."""
        out: dict[str, Any] = {"state": self.state, "since": self.since, "restarts": self.restarts,
                               "instance": self._link.instance}
        if self.reason:
            out["reason"] = self.reason
        if self.state == "restarting":
            out["retry_after_s"] = self.retry_after()
        if self.last_death:
            out["last_death"] = self.last_death
        share = self._link.watch.share
        if self.slow:
            out["slow"] = self.slow
        elif share is not None and share < SLOW_SHARE:
            out["slow"] = {"note": f"while working, the engine process got {share:.0%} of a core: the machine is "
                                   "busy, so answers are slow (it is working, not hung)"}
        return out

    def describe(self) -> dict[str, Any]:
        """The engine's own description, and which start of its process answers (a random name, new at
        each restart): an operator's handle on a restart, where a pid would be one on the host."""
        return {**self._describe, "instance": self._link.instance}

    def close(self) -> None:
        with self._lock:
            self._closing = True
        self._restarts.put(None)
        self._link.close()

    @property
    def pid(self) -> int | None:
        """The live engine process's pid."""
        return self._link.process.pid


QUESTION_SLOTS = 256  # distinct question sets the engine process keeps for the HTTP side
CANCEL_SLOTS = 1 << 16  # a cancel is lost only if the request still runs 65,536 requests later
PLAN_TIMEOUT_S = 30.0  # a plan prepares at most four times a request's limits; this is a wedged process
