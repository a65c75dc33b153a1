"""Engines: what answers a validated System One request for one served model name.

An engine turns a request into a job (`prepare`, which validates, counts the work against the
server's `Limits` and refuses before any inference), and runs many jobs together (`execute`),
which is what lets the server coalesce concurrent requests into shared forward passes. A job's
`cancelled` event, set when its caller goes away, stops its remaining work. `EncoderEngine` serves a laya checkpoint,
`DecideEngine` a chat GGUF through the decide policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from laya.api import check_budgets
from laya.errors import Cancelled
from laya.limits import UNLIMITED, Limits
from laya.model import Model, Prepared
from laya.questions import Question
from laya.stop import StopFlag

if TYPE_CHECKING:
    from laya.decide.model import Planned

READY = {"state": "ready"}  # an engine in this process is up while the process is


class Engine(Protocol):
    name: str
    description: str
    release_date: str
    # True for an engine whose other end coalesces jobs itself (a Ray Serve deployment): the server
    # then sends each job as it comes instead of batching them here
    batches_where_it_runs: bool

    def prepare(self, states: list[Any], questions: dict[str, Any], *, limits: Limits = UNLIMITED,
                deadline: float | None = None, **options: Any) -> Any: ...

    def execute(self, jobs: list[Any]) -> list[list[dict[str, Any]]]: ...

    def rows(self, job: Any) -> int: ...

    def warmup(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class EncoderEngine:
    """A laya checkpoint on one runtime."""

    model: Model
    description: str = "laya decision model"
    release_date: str = ""
    batches_where_it_runs: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.model.name

    def prepare(self, states: list[Any], questions: dict[str, Any], *, limits: Limits = UNLIMITED,
                deadline: float | None = None, tournament: int | None = None, **options: Any) -> Prepared:
        """(Options such as `reuse_prefix` concern the decide engine; an encoder has no kept state.)
        A tournament's rows count against the limits: every group of every round and the final row.
        Past `deadline` (monotonic) the job stops between forward passes, as a cancelled one does."""
        prepared = self.model.prepare(states, questions, tournament=tournament)
        prepared.cancelled = StopFlag(deadline)
        for rows, state in zip(prepared.rows, prepared.states):
            check_budgets(len(state.ids), [r.head_tokens for r in rows])
        limits.check("rows", prepared.n_rows)
        limits.check("tokens", prepared.n_tokens)
        return prepared

    def rows(self, job: Prepared) -> int:
        return job.n_rows

    def execute(self, jobs: list[Prepared]) -> list[list[dict[str, Any]]]:
        return self.model.answer(jobs)

    def warmup(self) -> None:
        self.model.predict("warm-up", {"w": {"type": "noul", "instructions": "Is this a warm-up?"}})

    def status(self) -> dict[str, Any]:
        return READY

    def close(self) -> None:
        """Nothing to stop: the model lives as long as this process."""

    def describe(self) -> dict[str, Any]:
        choice = self.model.choice
        gate = getattr(self.model.runtime, "gate", None)
        return {"kind": "encoder", "runtime": self.model.runtime.name, "precision": self.model.runtime.precision,
                "device": "cpu", "source": self.model.checkpoint.source, "max_len": self.model.max_len,
                "runtime_choice": choice.describe() if choice else "named by the operator",
                **({"runtime_measured": choice.measurement()} if choice and choice.measured else {}),
                **({"gate": {k: gate[k] for k in ("max_dp", "argmax_agreement", "batch_dependence_max_dp", "passed")
                             if k in gate}} if gate else {})}


@dataclass
class DecideJob:
    states: list[Any]
    questions: list[Question]
    planned: list[list[Planned]]  # per state: its questions tokenised by prepare
    reuse_prefix: bool = True
    cancelled: StopFlag = field(default_factory=StopFlag)


@dataclass
class DecideEngine:
    """A chat GGUF answering through the decide policy (one llama.cpp context, one decision at a time)."""

    model: Any  # laya.decide.model.DecideModel
    description: str = "chat model read by first-token scoring (llama.cpp)"
    release_date: str = ""
    batches_where_it_runs: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.model.name

    def prepare(self, states: list[Any], questions: dict[str, Any], *, limits: Limits = UNLIMITED,
                deadline: float | None = None, reuse_prefix: bool = True, tournament: int | None = None
                ) -> DecideJob:
        """(`tournament` concerns the encoder engine, whose rows hold a bounded number of options.)
        Past `deadline` (monotonic) the job stops at its next decision, as a cancelled one does."""
        states, parsed, planned = self.model.prepare(states, questions, limits=limits)
        return DecideJob(states, parsed, planned, reuse_prefix, StopFlag(deadline))

    def rows(self, job: DecideJob) -> int:
        return len(job.states) * len(job.questions)

    def execute(self, jobs: list[DecideJob]) -> list[list[dict[str, Any]]]:
        """Decisions run one at a time; a cancelled job stops at its next decision (and gets no answers)."""
        out = []
        for job in jobs:
            try:
                out.append([self.model.answer_one(s, job.questions, reuse_prefix=job.reuse_prefix,
                                                  cancelled=job.cancelled, planned=p)
                             for s, p in zip(job.states, job.planned)])
            except Cancelled:
                out.append([])
        return out

    def warmup(self) -> None:
        self.model.predict("warm-up", {"w": {"type": "noul", "instructions": "Is this a warm-up?"}})

    def status(self) -> dict[str, Any]:
        return READY

    def close(self) -> None:
        """Nothing to stop: the model lives as long as this process."""

    def describe(self) -> dict[str, Any]:
        backend = self.model.backend
        return {"kind": "decide", "runtime": "llama.cpp", "precision": "gguf", "device": "cpu",
                "source": self.model.source, "prefix_cache": self.model.decider.cache.policy, **backend.describe()}
