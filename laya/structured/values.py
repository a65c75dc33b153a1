"""From System One answers back to a schema's values, and the details of a decision.

The projection is upstream's (laya 0.4.15, `structured._project`), read on the answers as upstream
reports them (rounded to 4 places, so a tie or a 0.5 falls the same way): a yes/no is
`P(yes) >= 0.5`; a score is the most probable level (the first of equals) plus the schema's
`minimum`, not the expected level the answer reports; a choice is the enum value whose label was
chosen. A field gated out by `min_confidence` is None; a field with no answer is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laya.decoding.confidence import entropy_confidence
from laya.structured.gate import Threshold, apply_gate
from laya.structured.plan import Field


@dataclass
class DecisionResult:
    """`decide(..., return_details=True)`: the values, and per field its probabilities (a yes/no's as
    `{"false", "true"}`, a score's by 0-based level), its `confidence` (upstream's: a choice's or
    score's normalised entropy, a yes/no's `max(p, 1-p)`; the System One answer's own `confidence` is
    TypeSafe's figure), its `answer_confidence` (the top probability, what
    `min_confidence` gates) and the raw answer; the response's usage."""

    values: dict[str, Any]
    confidence: dict[str, float]
    probabilities: dict[str, dict[str, Any]]
    answers: dict[str, Any]
    usage: dict[str, Any] | None = None
    routing: dict[str, Any] | None = None
    answer_confidence: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {"values": self.values, "confidence": self.confidence, "probabilities": self.probabilities,
               "answer_confidence": self.answer_confidence, "answers": self.answers, "usage": self.usage}
        if self.routing is not None:
            out["routing"] = self.routing
        return out


def certain_answer(f: Field) -> dict[str, Any]:
    """The answer of a field with one possible value."""
    label = f.options[0][0]
    return {"type": "choice", "choice": label, "probabilities": {label: 1.0}, "confidence": 1.0,
            "x_answer_confidence": 1.0}


def settle(response: dict[str, Any], fields: list[Field], threshold: Threshold | None) -> dict[str, Any]:
    """A response to a schema's asked questions made the schema's answer: every field with one possible
    value filled in, the gate applied (its answers marked in place), and the typed values projected."""
    answers = response["answers"]
    response["answers"] = {f.name: answers[f.name] if not f.certain else certain_answer(f) for f in fields}
    apply_gate([response], threshold)
    return project(response["answers"], fields)


def _rounded(value: Any) -> float:
    return round(float(value), 4)


def score_level(answer: dict[str, Any]) -> int:
    """A score answer's level (0-based): the most probable one, read at the four decimals the JSON
    carries (so a tie in the printed figures goes to the lower level, whoever reads them), or the
    rounded expectation when no probabilities came back."""
    p = answer.get("probabilities") or {}
    if p:
        return max(range(len(p)), key=lambda i: _rounded(p.get(str(i), 0.0)))
    return round(float(answer.get("score", 0.0)))


def project(answers: dict[str, Any], fields: list[Field]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in fields:
        answer = answers.get(f.name)
        if answer is None:
            continue
        if answer.get("x_low_confidence"):
            values[f.name] = None
        elif f.kind == "noul":
            values[f.name] = _rounded(answer.get("noul", 0.0)) >= 0.5
        elif f.kind == "score":
            values[f.name] = f.minimum + score_level(answer)
        else:
            label = str(answer.get("choice"))
            values[f.name] = next((value for text, value in f.options if text == label), label)
    return values


def details(values: dict[str, Any], response: dict[str, Any]) -> DecisionResult:
    answers = dict(response.get("answers") or {})
    confidence, top, probabilities = {}, {}, {}
    for name, answer in answers.items():
        ac = answer.get("x_answer_confidence")
        top[name] = float(ac) if isinstance(ac, int | float) and not isinstance(ac, bool) else None
        if answer.get("type") == "noul":
            p = float(answer.get("noul", 0.0))
            probabilities[name] = {"false": 1.0 - p, "true": p}
            confidence[name] = max(p, 1.0 - p)
        else:
            probabilities[name] = dict(answer.get("probabilities") or {})
            confidence[name] = entropy_confidence(list(probabilities[name].values()))
    return DecisionResult(values=values, confidence=confidence, probabilities=probabilities, answers=answers,
                          usage=response.get("usage"), routing=response.get("x_routing"), answer_confidence=top)
