"""`min_confidence`: the caller's own abstention gate, as upstream laya 0.4.15 applies it.

A threshold is one number in [0, 1] or a map from option-count buckets (`"choice:3-5"`, `"noul:2"`,
... and `"default"`) to numbers; an unknown key is refused, since a bucket the caller believes is
gated but is not would gate nothing. An answer is gated on its top probability
(`x_answer_confidence`, falling back to `confidence`) as upstream reports it, rounded to 4 places;
below the threshold it gets `x_low_confidence: true`, and every answer gets `x_abstention`
(`passed` | `abstained` | `unevaluated`) and `x_abstention_threshold`. With no threshold nothing is
written. The checkpoint's own calibrated abstention (`x_abstain`) is a separate thing and stays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from laya.request import DEFAULT_KEY, KINDS, Threshold
from laya.request import check_min_confidence as check_min_confidence  # the threshold's rule lives with the request


def bucket_of(answer: dict[str, Any]) -> str | None:
    kind = answer.get("type")
    if kind not in KINDS:
        return None
    probabilities = answer.get("probabilities")
    if isinstance(probabilities, dict) and probabilities:
        k = len(probabilities)
    elif kind == "noul":
        k = 2
    else:
        return None
    return f"{kind}:{'2' if k <= 2 else '3-5' if k <= 5 else '6-10' if k <= 10 else '11+'}"


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def gate_confidence(answer: dict[str, Any]) -> float | None:
    """The number an answer is gated on, as upstream reports it (4 places), or None."""
    value = _number(answer.get("x_answer_confidence"))
    if value is None:
        value = _number(answer.get("confidence"))
    return None if value is None else round(value, 4)


def threshold_for(answer: dict[str, Any], threshold: Threshold) -> float:
    if not isinstance(threshold, dict):
        return threshold
    key = bucket_of(answer)
    if key is not None and key in threshold:
        return threshold[key]
    return threshold.get(DEFAULT_KEY, 0.0)


def apply_gate(responses: Iterable[dict[str, Any]], threshold: Threshold | None) -> None:
    """Mark, in place, every answer of `responses` (System One JSON) against `threshold`."""
    if threshold is None:
        return
    for response in responses:
        for answer in (response.get("answers") or {}).values():
            confidence = gate_confidence(answer)
            bound = threshold_for(answer, threshold)
            answer.pop("x_low_confidence", None)
            if confidence is None:
                answer["x_abstention"] = "unevaluated"
            elif confidence < bound:
                answer["x_low_confidence"] = True
                answer["x_abstention"] = "abstained"
            else:
                answer["x_abstention"] = "passed"
            answer["x_abstention_threshold"] = float(bound)
