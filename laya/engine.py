"""What answers a validated System One request for one served model name: the one `Engine` protocol
the encoder engine (`laya.encoder.engine`) and the decide engine (`laya.decide.engine`) implement as
peers, and the one rule that picks between them.

An engine turns a request into a job (`prepare`, which validates, counts the work against the
server's `Limits` and refuses before any inference), and runs many jobs together (`execute`),
which is what lets the server coalesce concurrent requests into shared forward passes. A job's
`cancelled` event, set when its caller goes away, stops its remaining work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from laya.limits import UNLIMITED, Limits
from laya.questions import Questions
from laya.response import SystemOneResponse
from laya.stop import StopFlag

READY = {"state": "ready"}  # an engine in this process is up while the process is


class Job(Protocol):
    """What `prepare` returns and `execute` runs: everything prepared for one request, and the flag
    that stops its remaining work (set when its caller goes away or its deadline passes)."""

    cancelled: StopFlag


class Engine(Protocol):
    name: str
    description: str
    release_date: str
    # True for an engine whose other end coalesces jobs itself (the engine process, a Ray Serve
    # deployment): the server then sends each job on as it comes, through `async submit(job) ->
    # (results, Timing)`, instead of batching them here into `execute`; its `prepare` only packs the
    # request (the other end prepares it), so the server calls it on the event loop; and
    # `serve_on(loop)` tells it the event loop its `submit` is awaited on (where replies are read)
    batches_where_it_runs: bool

    def prepare(self, states: list[Any], questions: Questions, *, limits: Limits = UNLIMITED,
                deadline: float | None = None, **options: Any) -> Job: ...

    def execute(self, jobs: list[Job]) -> list[list[SystemOneResponse]]: ...

    def plan(self, states: list[Any], questions: Questions, *, limits: Limits = UNLIMITED,
             **options: Any) -> dict[str, Any]:
        """What the request would take and where it would be cut or refused (`laya.plan.report`),
        with no forward pass; blocking (the server calls it on a worker thread)."""
        ...

    def rows(self, job: Job) -> int: ...

    def warmup(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


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
    batches_where_it_runs: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.model.name

    def warmup(self) -> None:
        self.model.predict("warm-up", WARMUP_QUESTIONS)

    def status(self) -> dict[str, Any]:
        return READY

    def close(self) -> None:
        """Nothing to stop: the model lives as long as this process."""


def is_gguf(source: str) -> bool:
    """The rule: a `.gguf` file (`path.gguf`, or `path.gguf:READOUT` naming its readout profile) is a
    chat model for the decide engine, unless it is a laya decision model in llama.cpp's format
    (`modern-bert.decision.type = "laya"`), which the encoder engine reads; anything else names a laya
    checkpoint (a folder, a bundle, a registry name, a Hub repository) for the encoder engine."""
    path, readout = split_readout(source)
    if not path.lower().endswith(".gguf"):
        return False
    from laya.encoder.gguf_file import is_laya_gguf

    return readout is not None or not is_laya_gguf(path)


def split_readout(source: str) -> tuple[str, str | None]:
    """`path.gguf:READOUT` as (`path.gguf`, `READOUT`); anything else as (itself, None)."""
    head, colon, readout = source.rpartition(":")
    if colon and head.lower().endswith(".gguf") and readout and not any(c in readout for c in "/\\."):
        return head, readout
    return source, None
