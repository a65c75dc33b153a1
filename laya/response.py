"""What an engine answers for one state: typed, from `execute` to the edge.

Both engines build these; the engine process and Ray replicas carry them as they are; the server,
`predict` and the CLI turn them into the System One JSON (`to_json`) only where it leaves, so the
fields a caller reads (the usage the access log counts, the served model's name) are attributes on
the way, not keys looked up in a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Literal, TypeVar

QType = Literal["choice", "score", "noul"]
T = TypeVar("T")


def pickled_by_position(cls: type[T]) -> type[T]:
    """Pickle a slotted dataclass as its constructor and field values in order. Every answer crosses
    the pipe to and from the engine process, and the `__getstate__` dataclasses give a slotted class
    runs `fields()` in Python for each object: pickling and unpickling one request's two answers took
    ~0.13 ms where the code runs cold after a forward pass, ~0.09 ms this way."""
    values = attrgetter(*(f.name for f in fields(cls)))  # type: ignore[arg-type]

    def __reduce__(self: T) -> tuple[type[T], tuple[Any, ...]]:
        return cls, values(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign,assignment]
    return cls


@pickled_by_position
@dataclass(slots=True)
class Answer:
    """One question's answer. `value`: the chosen option's key (choice), the expected score
    (score), the probability of yes (noul). `probabilities` and `confidence` are the contract's
    (choice and score); `answer_confidence` is the top probability (`x_answer_confidence`);
    `extras` are the further `x_` fields (act probability, abstention, tournament, prefill)."""

    qtype: QType
    value: str | float
    probabilities: dict[str, float] | None = None
    confidence: float | None = None
    legend: dict[str, str] | None = None
    answer_confidence: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        """The answer object, the contract's fields first, then the `x_` extras (none when `strict`:
        exactly the contract's fields, for clients that validate with no extra field allowed)."""
        out: dict[str, Any]
        if self.qtype == "choice":
            out = {"type": "choice", "choice": self.value, "probabilities": dict(self.probabilities or {}),
                   "confidence": self.confidence}
        elif self.qtype == "score":
            out = {"type": "score", "score": self.value, "legend": dict(self.legend or {}),
                   "probabilities": dict(self.probabilities or {}), "confidence": self.confidence}
        else:
            out = {"type": "noul", "noul": self.value}
        if strict:
            return out
        if self.answer_confidence is not None:
            out["x_answer_confidence"] = self.answer_confidence
        out.update(self.extras)
        return out


@pickled_by_position
@dataclass(slots=True)
class SystemOneResponse:
    """One state's answers. `model` is the name it is served under (the server sets it);
    `x_usage` is the encoder's account of the state's tokens (kept, dropped, rows), None where an
    engine has none."""

    model: str
    answers: dict[str, Answer]
    input_tokens: int
    x_usage: dict[str, Any] | None = None
    # "model": "auto": why this model answered (laya.routing.router), set by the server
    routed_to: str | None = None
    route_reason: str | None = None
    # the precision that answered (an encoder runtime's: fp32, bf16, int8, ...), `x_precision`
    precision: str | None = None

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        """The System One body; `strict`: the contract's fields only (no `x_` extension anywhere)."""
        out: dict[str, Any] = {"model": self.model,
                               "answers": {qid: a.to_json(strict) for qid, a in self.answers.items()},
                               "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}
        if strict:
            return out
        if self.x_usage is not None:
            out["x_usage"] = self.x_usage
        if self.routed_to is not None:
            out["x_routed_to"] = self.routed_to
            out["x_route_reason"] = self.route_reason
        if self.precision is not None:
            out["x_precision"] = self.precision
        return out
