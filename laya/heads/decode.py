"""From a row of option logits (and the act head's logits) to a System One answer.

Plain numpy, shared by every runtime and engine. Probabilities keep full precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from laya.calibration.confidence import choice_confidence, score_confidence, top_probability
from laya.questions import Question
from laya.response import Answer


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Calibrated probabilities of the real options (`logits` already cut to them)."""
    return softmax(np.asarray(logits, dtype=np.float64) / temperature)


def answer(question: Question, p: np.ndarray, extras: dict[str, Any] | None = None) -> Answer:
    """The answer of one question from its calibrated probabilities; `extras` are its `x_` fields."""
    extra = dict(extras or {})
    top = top_probability(p)
    if question.qtype == "noul":
        return Answer("noul", float(p[1]), answer_confidence=top, extras=extra)
    probabilities = {k: float(v) for k, v in zip(question.keys, p)}
    if question.qtype == "choice":
        return Answer("choice", question.keys[int(np.argmax(p))], probabilities, choice_confidence(p),
                      answer_confidence=top, extras=extra)
    return Answer("score", float(np.sum(np.arange(len(p)) * p)), probabilities, score_confidence(p),
                  legend=dict(question.legend or {}), answer_confidence=top, extras=extra)


def act_probability(act_logits: np.ndarray) -> float:
    """Probability of the act head's first output ("answer directly")."""
    return float(softmax(act_logits)[0])
