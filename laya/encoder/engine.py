"""The encoder engine: a laya checkpoint on one runtime, behind `laya.engine.Engine`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from laya.api import check_budgets
from laya.encoder.model import Model, Prepared
from laya.encoder.plan import plan_states
from laya.encoder.shortlist import shortlist_request
from laya.engine import WARMUP_QUESTIONS, InProcessEngine
from laya.errors import QuestionError
from laya.limits import UNLIMITED, Limits
from laya.orders import OrderedJob, execute_in_orders, parts_of, planned_in_orders, prepare_in_orders
from laya.plan import HEADROOM, report
from laya.redaction import redact
from laya.request import Request
from laya.response import SystemOneResponse
from laya.stop import StopFlag


@dataclass
class EncoderEngine(InProcessEngine):
    """A laya checkpoint on one runtime."""

    model: Model
    description: str = "laya decision model"
    kind: ClassVar[str] = "encoder"
    speed: dict[str, Any] | None = None  # measured at warm-up: what the server's deadline follows

    def warmup(self) -> None:
        """The first-call costs taken, then one full row timed: a request's deadline follows the rows
        it asks for at this speed (`laya.server.work`), a row of `max_len` tokens being the dearest."""
        super().warmup()
        self.speed = {"row_s": round(time_full_row(self.model), 6), "max_len": self.model.max_len}

    def prepare(self, request: Request, *, limits: Limits = UNLIMITED, deadline: float | None = None
                ) -> Prepared | OrderedJob:
        """(`reuse_prefix: false` is refused: it concerns the decide engine, and an encoder keeps no state.)
        A tournament's rows count against the limits: every group of every round and the final row. Past
        `deadline` (monotonic) the job stops between forward passes, as a cancelled one does. With
        `x_order`, a part per order (only the reordered choices: each question is a row of its own)."""
        refuse_reuse_prefix(request, self.model.name)

        def one(part: Request) -> Prepared:
            part, shortlists = shortlist_request(self.model, part)
            prepared = self.model.prepare_request(part, limits)
            prepared.shortlists = shortlists
            prepared.cancelled = StopFlag(deadline)
            _check(prepared, limits)
            return prepared

        return prepare_in_orders(request, one, limits, deadline, carry_all=False)

    def plan(self, request: Request, *, limits: Limits = UNLIMITED) -> dict[str, Any]:
        """What `prepare` and the forward pass would do with this request (`laya.plan`), running nothing:
        with `x_order`, every order's part planned and counted, as `prepare` prepares them."""
        figures = {"states": len(request.states), "questions": len(request.questions)}
        describe = self.describe()
        try:
            refuse_reuse_prefix(request, self.model.name)
            jobs = [self.model.prepare_request(part, limits.times(HEADROOM))
                    for part in parts_of(request, carry_all=False)]
        except QuestionError as exc:
            return report(self.model.name, describe, limits, states=[], figures=figures, exact=True, refused=exc)
        # rows of every order together, tokens per order's part: what `prepare` holds against the limits
        figures |= {"rows": sum(job.n_rows for job in jobs), "tokens": max(job.n_tokens for job in jobs)}
        plans = [plan_states(self.model, job) for job in jobs]
        planned, exact = planned_in_orders([p for p, _ in plans]), all(known for _, known in plans)
        shortlists = {q.qid: {"k": q.shortlist, "n": q.n_options, "embedded_texts": q.n_options + 1}
                      for q in request.questions if q.shortlist is not None and q.shortlist < q.n_options}
        for state in planned if shortlists else ():  # rows and tokens as asked: a bound of the kept options'
            for qid, cost in shortlists.items():
                state["questions"][qid]["x_shortlist"] = cost
        exact &= not shortlists
        refused = None
        try:
            for job in jobs:
                _check(job, limits)
            limits.check("rows", figures["rows"])  # every order's rows together, as `prepare_in_orders` counts
        except QuestionError as exc:
            refused = exc
        return report(self.model.name, describe, limits, states=planned, figures=figures, exact=exact, refused=refused)

    def execute(self, jobs: list[Prepared | OrderedJob]) -> list[list[SystemOneResponse]]:
        return execute_in_orders(jobs, self.model.answer)

    def describe(self) -> dict[str, Any]:
        choice = self.model.choice
        info = self.model.runtime.info()
        gate = info.gate
        return {"kind": "encoder", "runtime": info.name, "precision": info.precision, "device": info.device,
                **self.provenance(), "source": redact(self.model.checkpoint.source), "max_len": self.model.max_len,
                **({"speed": dict(self.speed)} if self.speed else {}),
                "runtime_choice": choice.describe() if choice else "named by the operator",
                **({"runtime_measured": choice.measurement()} if choice and choice.measured else {}),
                **({"gate": {k: gate[k] for k in ("max_dp", "flipped_margin", "argmax_agreement",
                                                  "batch_dependence_max_dp", "passed", "plan", "rows", "bounds",
                                                  "envelope", "max_dp_by_kind", "held_out") if k in gate}}
                   if gate else {}),
                **({"upgrade": self.model.upgrade.status()} if self.model.upgrade else {}),
                **info.details}

    def on_change(self, listener: Callable[[], None]) -> None:
        """`listener()` once auto's background upgrade has swapped in its pick (or given up): what
        `describe` says has changed."""
        if self.model.upgrade is not None:
            self.model.upgrade.on_change(listener)

    def close(self) -> None:
        """Stop auto's background upgrade, if it still prepares."""
        if self.model.upgrade is not None:
            self.model.upgrade.close()


def time_full_row(model: Model) -> float:
    """Seconds one forward pass of a row as long as the model's takes here (a yes/no question over a
    state that fills the row)."""
    job = model.prepare([" ".join(["word"] * model.max_len)], WARMUP_QUESTIONS)
    began = time.perf_counter()
    model.run([job.rows[0][0]])
    return time.perf_counter() - began


def refuse_reuse_prefix(request: Request, name: str) -> None:
    """`reuse_prefix: false` asks a chat model to prefill without the state it kept; an encoder keeps no
    state, so the option cannot apply here, and is refused rather than ignored."""
    if not request.options.reuse_prefix:
        raise QuestionError(f"reuse_prefix is for chat models (the decide engine), which keep a state's prefill "
                            f"between decisions; {name} is a laya encoder, which keeps none: drop it",
                            error_type="invalid_reuse_prefix")


def _check(job: Prepared, limits: Limits) -> None:
    """The refusals after the rows are built, in the order a request meets them: the API's token
    budgets per state, then the server's limits on rows and tokens."""
    for rows, state in zip(job.rows, job.states):
        check_budgets(len(state.ids), [r.head_tokens for r in rows])
    limits.check("rows", job.n_rows)
    limits.check("tokens", job.n_tokens)
