"""From a row of option logits (and the act head's logits) to a System One answer.

Plain numpy, shared by every runtime and engine. Probabilities keep full precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from laya.calibration.confidence import choice_confidence, score_confidence, top_probability
from laya.questions import Question


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Calibrated probabilities of the real options (`logits` already cut to them)."""
    return softmax(np.asarray(logits, dtype=np.float64) / temperature)


def answer(question: Question, p: np.ndarray, extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """The answer object of one question, with `x_` extras after the contract's fields."""
    out: dict[str, Any]
    if question.qtype == "choice":
        out = {
            "type": "choice",
            "choice": question.keys[int(np.argmax(p))],
            "probabilities": {k: float(v) for k, v in zip(question.keys, p)},
            "confidence": choice_confidence(p),
        }
    elif question.qtype == "score":
        out = {
            "type": "score",
            "score": float(np.sum(np.arange(len(p)) * p)),
            "legend": dict(question.legend or {}),
            "probabilities": {k: float(v) for k, v in zip(question.keys, p)},
            "confidence": score_confidence(p),
        }
    else:
        out = {"type": "noul", "noul": float(p[1])}
    out["x_answer_confidence"] = top_probability(p)
    if extras:
        out.update(extras)
    return out


def act_probability(act_logits: np.ndarray) -> float:
    """Probability of the act head's first output ("answer directly")."""
    return float(softmax(act_logits)[0])
