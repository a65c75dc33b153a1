"""A scripted engine for the server's load, overload, failure and disconnect tests (no model)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from laya.engine import EngineInfo
from laya.errors import QuestionError
from laya.limits import UNLIMITED, Limits
from laya.request import Request
from laya.response import Answer, SystemOneResponse
from laya.stop import StopFlag


@dataclass
class Job:
    states: list[Any]
    questions: list[Any]
    cancelled: StopFlag = field(default_factory=StopFlag)

    @property
    def n_rows(self) -> int:
        return len(self.states) * len(self.questions)

    @property
    def n_tokens(self) -> int:
        """Ten a row, as an encoder counts the tokens its rows read ahead (a batch's token budget)."""
        return 10 * self.n_rows


def spin(cpu_s: float, cancelled: StopFlag) -> None:
    """Busy for `cpu_s` seconds of this process's CPU time, however long a busy machine makes that."""
    end = time.process_time() + cpu_s
    while time.process_time() < end and not cancelled.is_set():
        sum(range(1000))


class ScriptedEngine:
    """Answers every noul with 0.5 after `delay` seconds per state (a cancelled job stops between
    states, as the real engines stop between forward passes); the state "boom" raises inside `execute`,
    and "hang" blocks there forever (a forward pass stuck in a native call); "spin:S" spends S seconds of
    CPU time there (a slow forward pass: slower still on a busy machine), stopping early when its job is
    cancelled."""

    def __init__(self, name: str = "scripted", delay: float = 0.0):
        self.info = EngineInfo(name, "scripted", "scripted test engine", "2026-01-01")
        self.name = name
        self.delay = delay
        self.executed: list[Any] = []
        self.lock = threading.Lock()

    def prepare(self, request: Request, *, limits: Limits = UNLIMITED, deadline: float | None = None) -> Job:
        states = list(request.states)
        if "crash" in states:
            raise KeyError("an unexpected bug")
        limits.check("rows", request.rows)  # as the real engines count a request's rows
        return Job(states, list(request.questions), StopFlag(deadline))

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
                if isinstance(state, str) and state.startswith("spin:"):
                    spin(float(state[5:]), job.cancelled)
                with self.lock:
                    self.executed.append(state)
                answers.append(SystemOneResponse(self.name, {q.qid: Answer("noul", 0.5) for q in job.questions},
                                                 input_tokens=1))
            out.append(answers)
        return out

    def plan(self, request: Request, *, limits: Limits = UNLIMITED) -> dict:
        return {"object": "systemone.plan", "model": self.name, "rows": request.rows, "refused": None}

    def warmup(self) -> None:
        pass

    def describe(self) -> dict:
        return {"kind": "scripted"}

    def status(self) -> dict:
        return {"state": "ready"}

    def close(self) -> None:
        pass
