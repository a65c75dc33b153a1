"""Confidence figures of an answer.

`jev_confidence` is what the System One API reports (TypeSafe's definition, not upstream laya's
entropy figure); `top_probability` is the quantity temperatures are fitted on and abstention
thresholds apply to.
"""

from __future__ import annotations

import numpy as np


def top_probability(p: np.ndarray) -> float:
    return float(np.max(p))


def choice_confidence(p: np.ndarray) -> float:
    """(m - 1/n) / (1 - 1/n): 0 for a uniform answer, 1 for a certain one."""
    n = len(p)
    if n < 2:
        return 1.0
    value = (float(np.max(p)) - 1.0 / n) / (1.0 - 1.0 / n)
    return min(1.0, max(0.0, value))


def score_confidence(p: np.ndarray) -> float:
    """max(0, 1 - sum_i p_i |i - k| / D), k the likeliest level, D the uniform answer's spread."""
    n = len(p)
    levels = np.arange(n, dtype=np.float64)
    spread = float(np.mean(np.abs(levels - (n - 1) / 2.0)))
    if spread == 0.0:
        return 1.0
    k = int(np.argmax(p))
    value = 1.0 - float(np.sum(p * np.abs(levels - k))) / spread
    return min(1.0, max(0.0, value))
