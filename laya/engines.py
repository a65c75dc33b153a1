"""Engines: what answers a validated System One request for one served model name.

An engine turns a request into a job (`prepare`, which validates and refuses before any
inference), and runs many jobs together (`execute`), which is what lets the server coalesce
concurrent requests into shared forward passes. `EncoderEngine` serves a laya checkpoint,
`DecideEngine` a chat GGUF through the decide policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from laya.api import check_budgets
from laya.model import Model, Prepared


class Engine(Protocol):
    name: str
    description: str

    def prepare(self, states: list[Any], questions: dict[str, Any], **options: Any) -> Any: ...

    def execute(self, jobs: list[Any]) -> list[list[dict[str, Any]]]: ...

    def rows(self, job: Any) -> int: ...

    def warmup(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass
class EncoderEngine:
    """A laya checkpoint on one runtime."""

    model: Model
    description: str = "laya decision model"
    release_date: str = ""

    @property
    def name(self) -> str:
        return self.model.name

    def prepare(self, states: list[Any], questions: dict[str, Any], **options: Any) -> Prepared:
        """(Options such as `reuse_prefix` concern the decide engine; an encoder has no kept state.)"""
        prepared = self.model.prepare(states, questions)
        for rows in prepared.rows:
            check_budgets(rows[0].state_tokens, [r.head_tokens for r in rows])
        return prepared

    def rows(self, job: Prepared) -> int:
        return sum(len(rows) for rows in job.rows)

    def execute(self, jobs: list[Prepared]) -> list[list[dict[str, Any]]]:
        return self.model.answer(jobs)

    def warmup(self) -> None:
        self.model.predict("warm-up", {"w": {"type": "noul", "instructions": "Is this a warm-up?"}})

    def describe(self) -> dict[str, Any]:
        return {"kind": "encoder", "runtime": self.model.runtime.name, "precision": self.model.runtime.precision,
                "device": "cpu", "source": self.model.checkpoint.source, "max_len": self.model.max_len}


@dataclass
class DecideEngine:
    """A chat GGUF answering through the decide policy (one llama.cpp context, one decision at a time)."""

    model: Any  # laya.decide.model.DecideModel
    description: str = "chat model read by first-token scoring (llama.cpp)"
    release_date: str = ""

    @property
    def name(self) -> str:
        return self.model.name

    def prepare(self, states: list[Any], questions: dict[str, Any], reuse_prefix: bool = True) -> Any:
        states, parsed = self.model.prepare(states, questions)
        return states, parsed, reuse_prefix

    def rows(self, job: Any) -> int:
        return len(job[0]) * len(job[1])

    def execute(self, jobs: list[Any]) -> list[list[dict[str, Any]]]:
        return [[self.model.answer_one(s, parsed, reuse_prefix=reuse) for s in states]
                for states, parsed, reuse in jobs]

    def warmup(self) -> None:
        self.model.predict("warm-up", {"w": {"type": "noul", "instructions": "Is this a warm-up?"}})

    def describe(self) -> dict[str, Any]:
        backend = self.model.backend
        info = backend.describe() if hasattr(backend, "describe") else {}
        return {"kind": "decide", "runtime": "llama.cpp", "precision": "gguf", "device": "cpu",
                "source": self.model.source, "prefix_cache": self.model.decider.cache.policy, **info}
