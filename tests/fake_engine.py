"""A scripted engine for the server's load, overload, failure and disconnect tests (no model)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from laya.errors import QuestionError
from laya.limits import UNLIMITED, Limits
from laya.questions import parse_questions
from laya.response import Answer, SystemOneResponse
from laya.stop import StopFlag


@dataclass
class Job:
    states: list[Any]
    questions: list[Any]
    cancelled: StopFlag = field(default_factory=StopFlag)


class ScriptedEngine:
    """Answers every noul with 0.5 after `delay` seconds per state (a cancelled job stops between
    states, as the real engines stop between forward passes); the state "boom" raises inside `execute`,
    and "hang" blocks there forever (a forward pass stuck in a native call)."""

    description = "scripted test engine"
    release_date = "2026-01-01"
    batches_where_it_runs = False

    def __init__(self, name: str = "scripted", delay: float = 0.0):
        self.name = name
        self.delay = delay
        self.executed: list[Any] = []
        self.lock = threading.Lock()

    def prepare(self, states: list[Any], questions: dict[str, Any], deadline: float | None = None,
                limits: Limits = UNLIMITED, **options: Any) -> Job:
        if "crash" in states:
            raise KeyError("an unexpected bug")
        parsed = parse_questions(questions)
        limits.check("rows", len(states) * len(parsed))  # as the real engines count a request's rows
        return Job(states, parsed, StopFlag(deadline))

    def rows(self, job: Job) -> int:
        return len(job.states) * len(job.questions)

    def execute(self, jobs: list[Job]) -> list[list[dict]]:
        if any(s == "hang" for job in jobs for s in job.states):
            threading.Event().wait()
        if any(s == "boom" for job in jobs for s in job.states):
            time.sleep(self.delay)
            raise RuntimeError("scripted failure")
        if any(s == "refuse" for job in jobs for s in job.states):
            time.sleep(self.delay)
            raise QuestionError("refused while running", qid="u")
        out = []
        for job in jobs:
            answers = []
            for state in job.states:
                if job.cancelled.is_set():
                    answers = []
                    break
                time.sleep(self.delay)
                with self.lock:
                    self.executed.append(state)
                answers.append(SystemOneResponse(self.name, {q.qid: Answer("noul", 0.5) for q in job.questions},
                                                 input_tokens=1))
            out.append(answers)
        return out

    def warmup(self) -> None:
        pass

    def describe(self) -> dict:
        return {"kind": "scripted"}

    def status(self) -> dict:
        return {"state": "ready"}

    def close(self) -> None:
        pass
