"""Engines: what answers a validated System One request for one served model name.

An engine turns a request into a job (`prepare`, which validates and refuses before any
inference), and runs many jobs together (`execute`), which is what lets the server coalesce
concurrent requests into shared forward passes. `EncoderEngine` serves a laya checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from laya.api import check_budgets
from laya.model import Model, Prepared


class Engine(Protocol):
    name: str
    description: str

    def prepare(self, states: list[Any], questions: dict[str, Any]) -> Any: ...

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

    def prepare(self, states: list[Any], questions: dict[str, Any]) -> Prepared:
        prepared = self.model.prepare(states, questions)
        for rows in prepared.rows:
            check_budgets(rows[0].state_tokens, [r.head_tokens for r in rows])
        return prepared

    def rows(self, job: Prepared) -> int:
        return sum(len(rows) for rows in job.rows)

    def execute(self, jobs: list[Prepared]) -> list[list[dict[str, Any]]]:
        flat = [row for job in jobs for rows in job.rows for row in rows]
        logits, acts = self.model.run(flat)
        out, at = [], 0
        for job in jobs:
            responses = []
            for rows in job.rows:
                n = len(rows)
                responses.append(self.model.respond(job.questions, rows, logits[at : at + n], acts[at : at + n]))
                at += n
            out.append(responses)
        return out

    def warmup(self) -> None:
        self.model.predict("warm-up", {"w": {"type": "noul", "instructions": "Is this a warm-up?"}})

    def describe(self) -> dict[str, Any]:
        return {"kind": "encoder", "runtime": self.model.runtime.name, "precision": self.model.runtime.precision,
                "device": "cpu", "source": self.model.checkpoint.source, "max_len": self.model.max_len}
