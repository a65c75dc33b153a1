"""Order-free choices (`x_order`): an encoder reading `[MASK] a [MASK] b ...`, or a chat model reading a
list, answers a little differently when the same options come in another order. A request may ask for
each choice question to be read in several orders (`both`: as given and reversed; `rotate:K`: K cyclic
rotations, spread evenly) and the calibrated probabilities averaged per option, so the answer no longer
depends on the order the caller happened to list them in (with every rotation, not even on its
starting point).

Both engines do it the same way: the request is prepared once per order (`parts`), the parts run as
one `execute` (one forward batch on the encoder, one shared state prefix on the decide engine), and
the answers are merged here. Score levels are ordinal and never reordered; noul has no order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from laya.decoding.confidence import choice_confidence
from laya.limits import UNLIMITED, Limits
from laya.questions import Question
from laya.request import AS_GIVEN, Request
from laya.response import Answer, SystemOneResponse
from laya.stop import StopFlag


def permutations(order: str, n: int) -> list[tuple[int, ...]]:
    """The option orders to read a choice of `n` options in, the first as given: `both` adds the
    reversed order; `rotate:K` K rotations (at most n), their starts spread evenly over the options."""
    given = tuple(range(n))
    if order == "both":
        return [given, given[::-1]]
    if order.startswith("rotate:"):
        count = min(int(order.removeprefix("rotate:")), n)
        starts = sorted({round(j * n / count) % n for j in range(count)})
        return [given[s:] + given[:s] for s in starts]
    return [given]


def reordered(question: Question, permutation: Sequence[int]) -> Question:
    """The same question with its options read in `permutation`'s order."""
    def pick(values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(values[i] for i in permutation)

    return replace(question, keys=pick(question.keys), options=pick(question.options), names=pick(question.names),
                   descriptions=pick(question.descriptions))


def parts_of(request: Request, carry_all: bool) -> list[Request]:
    """The request once per order, the first as given. Later parts carry only the reordered choice
    questions where each question is read on its own (`carry_all` false: the encoder's rows), else
    every question (a prompt may list them all)."""
    order = request.options.order
    reordering = {q.qid: permutations(order, q.n_options) for q in request.questions if q.qtype == "choice"}
    count = max((len(p) for p in reordering.values()), default=1)
    parts = [request]
    for k in range(1, count):
        questions = []
        for q in request.questions:
            orders = reordering.get(q.qid)
            if orders is not None and k < len(orders):
                questions.append(reordered(q, orders[k]))
            elif carry_all:
                questions.append(q)
        parts.append(replace(request, questions=tuple(questions)))
    return parts


@dataclass
class OrderedJob:
    """One request prepared once per order; it stops as one (its parts share its flag)."""

    request: Request
    parts: list[Any]
    cancelled: StopFlag = field(default_factory=StopFlag)

    @property
    def n_rows(self) -> int:
        return sum(part.n_rows for part in self.parts)

    @property
    def n_tokens(self) -> int:
        return sum(getattr(part, "n_tokens", 0) for part in self.parts)


Part = TypeVar("Part")


def prepare_in_orders(request: Request, prepare: Callable[[Request], Part], limits: Limits = UNLIMITED,
                      deadline: float | None = None, carry_all: bool = True, counted: str = "rows"
                      ) -> Part | OrderedJob:
    """`prepare(request)`, or for a request with `x_order` an `OrderedJob` of its parts, counted
    together against the server's limit on `counted` (rows, or a chat model's decisions)."""
    if request.options.order == AS_GIVEN:
        return prepare(request)
    job = OrderedJob(request, [prepare(part) for part in parts_of(request, carry_all)], StopFlag(deadline))
    for part in job.parts:
        part.cancelled = job.cancelled
    limits.check(counted, job.n_rows)
    return job


def execute_in_orders(jobs: list[Any], execute: Callable[[list[Any]], list[list[SystemOneResponse]]]
                      ) -> list[list[SystemOneResponse]]:
    """Every job's parts in one `execute` (one batch), each ordered job's answers merged back."""
    flat = [part for job in jobs for part in (job.parts if isinstance(job, OrderedJob) else [job])]
    answered = iter(execute(flat))
    out = []
    for job in jobs:
        if not isinstance(job, OrderedJob):
            out.append(next(answered))
            continue
        parts = [next(answered) for _ in job.parts]
        out.append(merged(job.request, parts) if all(parts) else [])
    return out


def merged(request: Request, parts: list[list[SystemOneResponse]]) -> list[SystemOneResponse]:
    """Per state, the first part's answers with each reordered choice averaged over its orders."""
    out = []
    for i, base in enumerate(parts[0]):
        answers = dict(base.answers)
        for q in request.questions:
            readings = [part[i].answers[q.qid] for part in parts if q.qid in part[i].answers]
            if q.qtype == "choice" and len(readings) > 1:
                answers[q.qid] = averaged(q, readings, request.options.order)
        tokens = sum(part[i].input_tokens for part in parts)
        usage = base.x_usage
        if usage is not None and "rows" in usage:  # every order's rows were read
            usage = {**usage, "rows": sum((part[i].x_usage or {}).get("rows", 0) for part in parts)}
        out.append(replace(base, answers=answers, input_tokens=tokens, x_usage=usage))
    return out


PLAN_COUNTS = ("rows", "tokens", "input_tokens", "question_tokens", "decisions")  # what each order adds


def planned_in_orders(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per state, the plan of a request read in several orders from each part's per-state plans (the
    parts `parts_of` makes, planned apart): the first part's entries with every later part's rows,
    tokens and decisions added, to the state's figures and to each question's, and each question read
    more than once saying how often (`orders`). A request read in K orders is planned at K times the
    rows of what each order reads again, as `prepare_in_orders` prepares it."""
    out = parts[0]
    for later in parts[1:]:
        for state, more in zip(out, later):
            _add(state, more)
            for qid, entry in more["questions"].items():
                _add(state["questions"][qid], entry)
                state["questions"][qid]["orders"] = state["questions"][qid].get("orders", 1) + 1
    return out


def _add(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key in PLAN_COUNTS:
        if key in into and key in more:
            into[key] += more[key]


def averaged(question: Question, readings: list[Answer], order: str) -> Answer:
    """One answer from a choice read in several orders: each option's calibrated probability averaged
    (keyed by option, so the orders line up), the top option (ties to the earlier as given), its
    confidence recomputed, the act probability averaged."""
    n = len(readings)
    probabilities = {key: sum((r.probabilities or {}).get(key, 0.0) for r in readings) / n for key in question.keys}
    top = max(question.keys, key=lambda key: probabilities[key])  # max keeps the first of equals
    extras = dict(readings[0].extras)
    acts = [r.extras.get("x_act_probability") for r in readings]
    if all(isinstance(a, float) for a in acts):
        extras["x_act_probability"] = sum(acts) / n  # type: ignore[arg-type]
    extras["x_order"] = {"mode": order, "orders": n}
    values = list(probabilities.values())
    return replace(readings[0], value=top, probabilities=probabilities, confidence=choice_confidence(values),
                   answer_confidence=max(values), extras=extras)

