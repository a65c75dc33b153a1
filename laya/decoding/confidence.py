"""Confidence figures of an answer.

`jev_confidence` is what the System One API reports (TypeSafe's definition, not upstream laya's
entropy figure); `top_probability` is the quantity temperatures are fitted on and abstention
thresholds apply to.
"""

from __future__ import annotations

import math
from typing import Any

from laya.decoding.floats import floats, pairwise_sum

# `p` is a vector of probabilities (numpy or a list of floats); the arithmetic is on plain floats in
# numpy's order (see laya.decoding.floats).


def top_probability(p: Any) -> float:
    return max(floats(p))


def choice_confidence(p: Any) -> float:
    """(m - 1/n) / (1 - 1/n): 0 for a uniform answer, 1 for a certain one."""
    n = len(p)
    if n < 2:
        return 1.0
    value = (max(floats(p)) - 1.0 / n) / (1.0 - 1.0 / n)
    return min(1.0, max(0.0, value))


def score_confidence(p: Any) -> float:
    """max(0, 1 - sum_i p_i |i - k| / D), k the likeliest level, D the uniform answer's spread."""
    p = floats(p)
    n = len(p)
    spread = pairwise_sum([abs(i - (n - 1) / 2.0) for i in range(n)]) / n
    if spread == 0.0:
        return 1.0
    k = p.index(max(p))
    value = 1.0 - pairwise_sum([v * abs(i - k) for i, v in enumerate(p)]) / spread
    return min(1.0, max(0.0, value))


def entropy_confidence(p: Any) -> float:
    """1 - H(p) / log(k), clipped to [0, 1]: upstream laya's `confidence` of a choice or a score (how
    concentrated the whole answer is), which its `DecisionResult` reports; 1 for fewer than 2 options."""
    p = floats(p)
    k = len(p)
    if k < 2:
        return 1.0
    entropy = -pairwise_sum([v * math.log(min(1.0, max(1e-12, v))) for v in p])
    return min(1.0, max(0.0, 1.0 - entropy / math.log(k)))
