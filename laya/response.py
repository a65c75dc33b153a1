"""What an engine answers for one state: typed, from `execute` to the edge.

Both engines build these; the engine process and Ray replicas carry them as they are; the server,
`predict` and the CLI turn them into the System One JSON (`to_json`) only where it leaves, so the
fields a caller reads (the usage the access log counts, the served model's name) are attributes on
the way, not keys looked up in a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

QType = Literal["choice", "score", "noul"]


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

    def to_json(self) -> dict[str, Any]:
        """The answer object, the contract's fields first, then the `x_` extras."""
        out: dict[str, Any]
        if self.qtype == "choice":
            out = {"type": "choice", "choice": self.value, "probabilities": dict(self.probabilities or {}),
                   "confidence": self.confidence}
        elif self.qtype == "score":
            out = {"type": "score", "score": self.value, "legend": dict(self.legend or {}),
                   "probabilities": dict(self.probabilities or {}), "confidence": self.confidence}
        else:
            out = {"type": "noul", "noul": self.value}
        if self.answer_confidence is not None:
            out["x_answer_confidence"] = self.answer_confidence
        out.update(self.extras)
        return out


@dataclass(slots=True)
class SystemOneResponse:
    """One state's answers. `model` is the name it is served under (the server sets it);
    `x_usage` is the encoder's account of the state's tokens (kept, dropped, rows), None where an
    engine has none."""

    model: str
    answers: dict[str, Answer]
    input_tokens: int
    x_usage: dict[str, Any] | None = None
    # "model": "auto": why this model answered (laya.router), set by the server
    routed_to: str | None = None
    route_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "answers": {qid: a.to_json() for qid, a in self.answers.items()},
                               "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}
        if self.x_usage is not None:
            out["x_usage"] = self.x_usage
        if self.routed_to is not None:
            out["x_routed_to"] = self.routed_to
            out["x_route_reason"] = self.route_reason
        return out
