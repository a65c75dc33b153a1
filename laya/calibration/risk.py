"""Answers with an error bound: an abstention threshold chosen by Learn then Test.

Wanted: among the questions answered, the error rate is at most `max_error`, with probability at
least `confidence` over the draw of the calibration data. A point estimate (the lowest threshold
whose held-out error is <= max_error) misses that about half the time. Instead each candidate
threshold is a hypothesis "its error rate exceeds max_error", tested with the exact binomial tail:
if it were true, seeing as few errors as we did among the n answered has probability
P(Binom(n, max_error) <= errors). The candidates form a fixed grid of signal values, tested from the
most conservative down (fixed-sequence testing, which needs no multiplicity correction); the first
that cannot be rejected at delta = 1 - confidence stops the walk, and the last rejected one is the
threshold. If none is rejected no threshold carries the guarantee, and the rule abstains on every
answer rather than pretend.

The walk starts at the first grid value that answers enough questions to reject an error rate of
half the bound (`first_tested`): with fewer, one early error would stop the walk before it reaches a
useful threshold (and below log(delta) / log(1 - max_error) answers no test can reject at all). The
start depends on how many answers each threshold keeps, never on the labels, so the order of the
tests is still fixed before any error is counted.

The guarantee holds for a signal fixed before the calibration answers are seen: a signal fitted on
data (laya.calibration.signal) must be fitted on other answers than the ones that set the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

GRID = np.linspace(1.0, 0.0, 1001)  # candidate thresholds on a signal in [0, 1], most conservative first


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


def binomial_tail(errors: np.ndarray, answered: np.ndarray, rate: float) -> np.ndarray:
    """P(Binom(answered, rate) <= errors), elementwise; 1.0 where nothing is answered."""
    errors, answered = np.asarray(errors, dtype=np.int64), np.asarray(answered, dtype=np.int64)
    if not 0.0 < rate < 1.0:
        raise ValueError(f"the error rate must be between 0 and 1, got {rate}")
    log_fact = _log_factorials(int(answered.max(initial=0)))
    i = np.arange(int(errors.max(initial=0)) + 1)
    n, k = answered[..., None], errors[..., None]
    terms = log_fact[n] - log_fact[i] - log_fact[np.maximum(n - i, 0)] + i * math.log(rate) \
        + (n - i) * math.log1p(-rate)
    terms = np.where((i <= k) & (i <= n), terms, -np.inf)
    top = terms.max(axis=-1, keepdims=True)
    tail = np.exp(top[..., 0]) * np.exp(terms - top).sum(axis=-1)
    return np.minimum(1.0, tail)


def counts_at(signal: np.ndarray, wrong: np.ndarray, grid: np.ndarray = GRID) -> tuple[np.ndarray, np.ndarray]:
    """(answered, errors) at each grid threshold: an answer is given when its signal >= the threshold."""
    order = np.argsort(-np.asarray(signal, dtype=np.float64), kind="stable")
    s, w = np.asarray(signal, dtype=np.float64)[order], np.asarray(wrong, dtype=np.int64)[order]
    answered = np.searchsorted(-s, -grid, side="right")
    cum = np.concatenate([[0], np.cumsum(w)])
    return answered, cum[answered]


def learn_then_test(signal: np.ndarray, wrong: np.ndarray, max_error: float, confidence: float,
                    grid: np.ndarray = GRID) -> float | None:
    """The lowest grid threshold the fixed-sequence test reaches, or None when none is rejected."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"the confidence must be between 0 and 1, got {confidence}")
    delta = 1.0 - confidence
    answered, errors = counts_at(signal, wrong, grid)
    possible = answered >= first_tested(int(answered.max(initial=0)), max_error, delta)
    start = int(np.argmax(possible)) if possible.any() else len(grid)
    rejected = binomial_tail(errors[start:], answered[start:], max_error) <= delta
    run = int(np.argmin(rejected)) if not rejected.all() else len(rejected)  # rejections before the first failure
    return float(grid[start + run - 1]) if run else None


def first_tested(total: int, max_error: float, delta: float) -> int:
    """How many answers the first tested threshold keeps: the fewest at which an error rate of half the
    bound would be rejected, or, with fewer answers than that in all, the fewest at which any count
    (none wrong) could be. A function of the counts only, never of the labels."""
    least = math.ceil(math.log(delta) / math.log1p(-max_error))
    if total <= least:
        return least
    n = np.arange(least, total + 1)
    ok = binomial_tail(np.floor(n * max_error / 2).astype(np.int64), n, max_error) <= delta
    return int(n[np.argmax(ok)]) if ok.any() else least


@dataclass(frozen=True)
class RiskRule:
    """Abstain when the signal is below `threshold` (None: no threshold carries the bound, abstain always)."""

    max_error: float
    confidence: float
    threshold: float | None
    signal: str = "top_probability"

    @property
    def name(self) -> str:
        return f"max_error {self.max_error:g} at confidence {self.confidence:g}"

    def abstains(self, value: float) -> bool:
        return self.threshold is None or value < self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {"max_error": self.max_error, "confidence": self.confidence, "threshold": self.threshold,
                "signal": self.signal}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> RiskRule:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: risk must be an object with max_error, confidence and threshold")
        values = {}
        for key in ("max_error", "confidence"):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
                raise ValueError(f"{where}: risk {key} {value!r} is not a number in (0, 1)")
            values[key] = float(value)
        threshold = data.get("threshold")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int | float)
                                      or not 0.0 <= threshold <= 1.0):
            raise ValueError(f"{where}: risk threshold {threshold!r} is not in [0, 1] nor null")
        signal = data.get("signal", "top_probability")
        if not isinstance(signal, str):
            raise ValueError(f"{where}: risk signal must be a name, got {signal!r}")
        return cls(values["max_error"], values["confidence"], None if threshold is None else float(threshold),
                   signal)
