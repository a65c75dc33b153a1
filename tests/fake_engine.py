"""A scripted engine for the server's load, overload, failure and disconnect tests (no model)."""

from __future__ import annotations

import threading
import time
from typing import Any

from laya.errors import QuestionError
from laya.questions import parse_questions


class ScriptedEngine:
    """Answers every noul with 0.5 after `delay` seconds; the state "boom" raises inside `execute`."""

    description = "scripted test engine"
    release_date = "2026-01-01"

    def __init__(self, name: str = "scripted", delay: float = 0.0):
        self.name = name
        self.delay = delay
        self.executed: list[Any] = []
        self.lock = threading.Lock()

    def prepare(self, states: list[Any], questions: dict[str, Any], **options: Any) -> dict:
        if "crash" in states:
            raise KeyError("an unexpected bug")
        return {"states": states, "questions": parse_questions(questions)}

    def rows(self, job: dict) -> int:
        return len(job["states"]) * len(job["questions"])

    def execute(self, jobs: list[dict]) -> list[list[dict]]:
        time.sleep(self.delay)
        if any(s == "boom" for job in jobs for s in job["states"]):
            raise RuntimeError("scripted failure")
        if any(s == "refuse" for job in jobs for s in job["states"]):
            raise QuestionError("refused while running", qid="u")
        with self.lock:
            self.executed.extend(s for job in jobs for s in job["states"])
        return [[{"model": self.name, "answers": {q.qid: {"type": "noul", "noul": 0.5} for q in job["questions"]},
                  "usage": {"input_tokens": 1, "output_tokens": 0}} for _ in job["states"]] for job in jobs]

    def warmup(self) -> None:
        pass

    def describe(self) -> dict:
        return {"kind": "scripted"}
