"""The decide engine: a chat GGUF answering through the decide policy, behind `laya.engine.Engine`."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from laya.decide.model import DecideModel, Planned, decisions
from laya.engine import InProcessEngine
from laya.errors import Cancelled, QuestionError
from laya.limits import UNLIMITED, Limits
from laya.native.cpu import cpu
from laya.orders import OrderedJob, execute_in_orders, parts_of, planned_in_orders, prepare_in_orders
from laya.plan import HEADROOM, report
from laya.questions import Question
from laya.redaction import redact
from laya.request import Request
from laya.response import SystemOneResponse
from laya.stop import StopFlag
from laya.tournament import tournament_rows


@dataclass
class DecideJob:
    states: list[Any]
    questions: list[Question]
    planned: list[list[Planned]]  # per state: its questions tokenised by prepare
    reuse_prefix: bool = True
    cancelled: StopFlag = field(default_factory=StopFlag)

    @property
    def n_rows(self) -> int:
        """Decisions it takes: one per state and question, every group and final of a tournament."""
        return sum(tournament_rows(p.question.n_options, p.group) if p.group else 1
                   for planned in self.planned for p in planned)


@dataclass
class DecideEngine(InProcessEngine):
    """A chat GGUF answering through the decide policy (one llama.cpp context, one decision at a time)."""

    model: DecideModel
    description: str = "chat model read by first-token scoring (llama.cpp)"
    kind: ClassVar[str] = "decide"
    speed: dict[str, Any] | None = None  # measured at warm-up: what the server's deadline follows

    def warmup(self) -> None:
        """The first-call costs taken, then a prefill's cost per token measured and carried to the whole
        context (`prefill_token_s`): a request's deadline follows the prompt tokens it asks for at that
        cost (`laya.server.work`)."""
        super().warmup()
        n_ctx = self.model.backend.n_ctx
        try:
            self.speed = {"token_s": round(prefill_token_s(self.model, n_ctx), 9), "n_ctx": n_ctx}
        except QuestionError:  # a readout that cannot ask the timing's question: the server's deadline alone
            self.speed = None

    def prepare(self, request: Request, *, limits: Limits = UNLIMITED, deadline: float | None = None
                ) -> DecideJob | OrderedJob:
        """Past `deadline` (monotonic) the job stops at its next decision, as a cancelled one does.
        A chat model reads the whole state or refuses it (413): it has no window to keep one end of.
        A choice whose prompt the context cannot hold is played as a tournament of groups that it can
        (`tournament=G`: of G options, for every larger choice). With `x_order`, a part per order, each
        with every question (a prompt may list them all), over the same kept state prefix."""
        return prepare_in_orders(request, partial(self._prepare_one, limits=limits, deadline=deadline), limits,
                                 deadline, carry_all=True, counted="decisions")

    def _prepare_one(self, request: Request, *, limits: Limits, deadline: float | None = None) -> DecideJob:
        if shortlisted := next((q for q in request.questions if q.shortlist is not None), None):
            raise QuestionError(f"x_shortlist ranks options with a laya encoder's embeddings; {self.model.name} is "
                                "a chat model with none (ask a laya model, or use tournament)",
                                qid=shortlisted.qid, error_type="invalid_shortlist")
        if request.options.overflow is not None:
            raise QuestionError("x_overflow is for encoder models, whose row holds a bounded part of the state; "
                                f"{self.model.name} reads the whole state (a 413 when its context cannot hold it)",
                                error_type="invalid_overflow")
        states, planned = self.model.prepare_request(request, limits=limits)
        return DecideJob(states, list(request.questions), planned, request.options.reuse_prefix, StopFlag(deadline))

    def plan(self, request: Request, *, limits: Limits = UNLIMITED) -> dict[str, Any]:
        """What `prepare` and the decisions would do with this request (`laya.plan`), prefilling
        nothing. Its token figures are the prompts' whole length: at most what is read, since a
        prompt whose prefix is kept from an earlier decision reads only the rest. With `x_order`, every
        order's part (each with every question) planned and counted, as `prepare` prepares them."""
        figures = {"states": len(request.states), "questions": len(request.questions)}
        describe = self.describe()
        try:
            jobs = [self._prepare_one(part, limits=limits.times(HEADROOM)) for part in parts_of(request, True)]
        except QuestionError as exc:
            return report(self.model.name, describe, limits, states=[], figures=figures, exact=False, refused=exc)
        parts = [[self._state_plan(p) for p in job.planned] for job in jobs]
        tokens = max(sum(s["input_tokens"] for s in part) for part in parts)  # per order's part, as prepared
        planned = planned_in_orders(parts)
        figures |= {"decisions": sum(s["decisions"] for s in planned), "tokens": tokens}
        refused = None
        try:
            limits.check("decisions", figures["decisions"])
            limits.check("tokens", figures["tokens"])
        except QuestionError as exc:
            refused = exc
        return report(self.model.name, describe, limits, states=planned, figures=figures, exact=False, refused=refused)

    def _state_plan(self, planned: list[Planned]) -> dict[str, Any]:
        questions: dict[str, dict[str, Any]] = {}
        for plan in planned:
            q = plan.question
            questions[q.qid] = {"type": q.qtype, "options": q.n_options, "decisions": decisions(plan),
                                "prompt_tokens": [len(p.tokens) for p in plan.prompts],
                                "prefix_tokens": [p.n_prefix for p in plan.prompts],
                                "label_tokens": [[len(label) for label in p.labels] for p in plan.prompts]}
            if plan.group:  # its groups' prompts are built round by round: at most the context each
                questions[q.qid]["tournament"] = {"group": plan.group,
                                                  "rows": tournament_rows(q.n_options, plan.group),
                                                  "tokens_at_most": tournament_rows(q.n_options, plan.group)
                                                  * self.model.backend.n_ctx}
        lengths = [n for entry in questions.values() for n in entry["prompt_tokens"]]
        bound = sum(entry["tournament"]["tokens_at_most"] for entry in questions.values() if "tournament" in entry)
        return {"input_tokens": sum(lengths) + bound, "rows": len(planned),
                "decisions": sum(entry["decisions"] for entry in questions.values()),
                "longest_prompt": max(lengths, default=0), "context": self.model.backend.n_ctx,
                "state_tokens_dropped": 0, "dropped": None, "questions": questions}

    def execute(self, jobs: list[DecideJob | OrderedJob]) -> list[list[SystemOneResponse]]:
        """Decisions run one at a time; a cancelled job stops at its next decision (and gets no answers)."""
        return execute_in_orders(jobs, self._execute)

    def _execute(self, jobs: list[DecideJob]) -> list[list[SystemOneResponse]]:
        out = []
        for job in jobs:
            try:
                out.append([self.model.answer_one(s, job.questions, reuse_prefix=job.reuse_prefix,
                                                  cancelled=job.cancelled, planned=p)
                             for s, p in zip(job.states, job.planned)])
            except Cancelled:
                out.append([])
        return out

    def describe(self) -> dict[str, Any]:
        backend = self.model.backend
        return {"kind": "decide", "runtime": "llama.cpp", "precision": "gguf",
                "device": cpu().model or platform.machine() or "cpu", **self.provenance(),
                **({"speed": dict(self.speed)} if self.speed else {}),
                "source": redact(str(self.model.source)), "prefix_cache": self.model.decider.cache.policy,
                "readout": self.model.readout, **backend.describe()}


SPEED_WORDS = 1024  # the prompt a decide engine's speed is measured on, at most a quarter of its context
SPEED_QUESTION = {"w": {"type": "choice", "instructions": "Which word?", "criteria": ["word", "other"]}}


def prefill_token_s(model: DecideModel, n_ctx: int) -> float:
    """Seconds a prompt token may cost in a prefill as long as the context `n_ctx`, from one prefill
    timed (a prompt of about `SPEED_WORDS` words, at most a quarter of the context; the kept state left
    alone). A token's cost grows at most in proportion to the prompt it attends to, so the per-token
    cost measured over `n` tokens, times `n_ctx / n`, bounds it (loose where attention is a small part
    of the work, never short of it; two lengths and a fitted slope were at the mercy of noise)."""
    words = max(16, min(SPEED_WORDS, n_ctx // 4))
    began = time.perf_counter()
    answer = model.predict(" ".join(["word"] * words), SPEED_QUESTION, reuse_prefix=False)
    tokens = max(1, int(answer["usage"]["input_tokens"]))
    return (time.perf_counter() - began) / tokens * max(1.0, n_ctx / tokens)
