"""From a row of option logits (and the act head's logits) to a System One answer.

Shared by every runtime and engine. Probabilities keep full precision (float64).

A decision has a handful of options, and on a small vector each numpy call costs far more than its
arithmetic: decoding one answer took ~25 of them, ~0.2 ms on a 2-core VM whose code runs cold after
every timer tick. So the arithmetic here is on plain floats, doing exactly the operations numpy did
before, in the same order (float64 division, `exp` of the shifted logits, numpy's pairwise summation
in `floats.pairwise_sum`): the answers keep their bits wherever Python's `exp` and numpy's agree (every
processor without AVX-512, where both are the C library's; within a few ulps where numpy has its own).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from laya.decoding.confidence import choice_confidence, score_confidence, top_probability
from laya.decoding.floats import floats, pairwise_sum
from laya.questions import Question
from laya.response import Answer


def _softmax(z: list[float]) -> list[float]:
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = pairwise_sum(e)
    return [v / total for v in e]


def probabilities(logits: Any, temperature: float) -> np.ndarray:
    """Calibrated probabilities of the real options (`logits` already cut to them), float64."""
    t = float(temperature)
    return np.array(_softmax([v / t for v in floats(logits)]))


def answer(question: Question, p: Any, extras: dict[str, Any] | None = None) -> Answer:
    """The answer of one question from its calibrated probabilities; `extras` are its `x_` fields."""
    extra = dict(extras or {})
    p = floats(p)
    top = top_probability(p)
    if question.qtype == "noul":
        return Answer("noul", p[1], answer_confidence=top, extras=extra)
    probabilities = dict(zip(question.keys, p))
    if question.qtype == "choice":
        return Answer("choice", question.keys[p.index(top)], probabilities, choice_confidence(p),
                      answer_confidence=top, extras=extra)
    expected = pairwise_sum([i * v for i, v in enumerate(p)])
    return Answer("score", expected, probabilities, score_confidence(p),
                  legend=dict(question.legend or {}), answer_confidence=top, extras=extra)


def act_probability(act_logits: Any) -> float:
    """Probability of the act head's first output ("answer directly")."""
    return _softmax(floats(act_logits))[0]
