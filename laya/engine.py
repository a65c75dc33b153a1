"""What answers a validated System One request for one served model name: the `Engine` protocol the
encoder engine (`laya.encoder.engine`) and the decide engine (`laya.decide.engine`) implement as
peers, and `ForwardingEngine`, what the engines that send jobs on to where they run add (the engine
process, a Ray Serve deployment).

An engine turns a `Request` into a job (`prepare`, which refuses what only the model can judge and
counts the work against the server's `Limits`, before any inference), and runs many jobs together
(`execute`), which is what lets the server coalesce concurrent requests into shared forward passes.
A job knows the rows it will read (admission counts them) and carries the flag that stops its
remaining work when its caller goes away or its deadline passes. Which engine reads a source is
`laya.engines.open_engine`'s rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from laya.digests import short_digest
from laya.limits import UNLIMITED, Limits
from laya.request import Request
from laya.response import SystemOneResponse
from laya.stop import StopFlag

READY = {"state": "ready"}  # an engine in this process is up while the process is


@dataclass(frozen=True)
class EngineInfo:
    """What an engine says about itself wherever it is listed (`/v1/models`, `/health`, logs)."""

    name: str  # the served name
    kind: str  # "encoder" or "decide"
    description: str
    release_date: str  # ISO date of the artifact that answers (see `laya.engines.release_date_of`)
    digests: Mapping[str, str] = field(default_factory=dict)  # sha256 per artifact role (`laya.digests`)

    @property
    def digest(self) -> str:
        """The short model digest an answer carries (`X-Laya-Model-Digest`): which artifacts answered."""
        return short_digest(self.digests)


class Job(Protocol):
    """What `prepare` returns and `execute` runs: everything prepared for one request, the rows it
    will read (a tournament's groups and a scan's windows included), and the flag that stops its
    remaining work."""

    cancelled: StopFlag

    @property
    def n_rows(self) -> int: ...


@dataclass(frozen=True)
class Timing:
    """Where a job's time went: waiting for its batch, and the batch's forward passes."""

    queue_ms: float = 0.0
    inference_ms: float = 0.0
    batch_rows: int = 0
    batch_jobs: int = 0
    leads_batch: bool = True  # the one answer of its batch that counts the batch (where batches are counted apart)


class _Serves(Protocol):
    """What the server asks of every engine, wherever its model runs."""

    @property
    def info(self) -> EngineInfo: ...

    def prepare(self, request: Request, *, limits: Limits = UNLIMITED, deadline: float | None = None) -> Job:
        """The job for `request`; every refusal of the model's happens here (`QuestionError`, or
        `LimitExceeded` past `limits`). Past `deadline` (monotonic) the job stops between forward passes."""
        ...

    def plan(self, request: Request, *, limits: Limits = UNLIMITED) -> dict[str, Any]:
        """What the request would take and where it would be cut or refused (`laya.plan.report`),
        with no forward pass; blocking (the server calls it on a worker thread)."""
        ...

    def warmup(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Engine(_Serves, Protocol):
    """An engine whose model runs here: the server batches its jobs into `execute`."""

    def execute(self, jobs: list[Any]) -> list[list[SystemOneResponse]]:
        """Each job's answers (empty for a job stopped before it finished), the jobs run together."""
        ...


@runtime_checkable
class ForwardingEngine(_Serves, Protocol):
    """An engine whose other end coalesces jobs itself: the server sends each job on as it comes
    (`submit`) instead of batching jobs here into `execute`; its `prepare` only packs the request (the
    other end prepares it), so the server calls it on the event loop; `serve_on(loop)` tells it the
    event loop its `submit` is awaited on (where replies are read)."""

    async def submit(self, job: Any) -> tuple[list[SystemOneResponse], Timing]: ...

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None: ...


AnyEngine = Engine | ForwardingEngine  # what a served model name maps to


WARMUP_QUESTIONS = {"w": {"type": "noul", "instructions": "Is this a warm-up?"}}


@dataclass
class InProcessEngine:
    """What the engines that run their model in this process share: the served name is the
    model's, the model lives as long as the process (nothing to stop), it is up while the process
    is, and one small decision before the first request takes the first-call costs (allocations,
    kernels picked, caches filled) out of that request's latency."""

    model: Any
    description: str = ""
    release_date: str = ""
    digests: dict[str, str] = field(default_factory=dict)
    calibration: str = ""  # the name of the calibration file in use (its digest is in `digests`)
    kind: ClassVar[str] = ""

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(self.model.name, self.kind, self.description, self.release_date, self.digests)

    def provenance(self) -> dict[str, Any]:
        """What exactly answers, for `describe`: the artifacts' digests and the short model digest."""
        return {"digests": dict(self.digests), "model_digest": short_digest(self.digests),
                "calibration": self.calibration or None}

    def warmup(self) -> None:
        self.model.predict("warm-up", WARMUP_QUESTIONS)

    def status(self) -> dict[str, Any]:
        return READY

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` when what `describe` says changes by itself (an engine whose model never
        changes under it never calls it)."""

    def close(self) -> None:
        """Nothing to stop: the model lives as long as this process."""
