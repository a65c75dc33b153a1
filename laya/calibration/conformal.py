"""Prediction sets with a coverage guarantee: split conformal, per stratum (Mondrian).

The score of a labelled answer is 1 - p(right option) under the calibrated probabilities; the set of
a new answer is every option whose score would not exceed the stratum's threshold, i.e. every option
with p >= 1 - threshold. On exchangeable data the set holds the right option with probability at
least 1 - alpha because the threshold is the ceil((n+1)(1-alpha))-th smallest of the n held-out
scores: the new score is equally likely to fall in any of the n+1 ranks. When (n+1)(1-alpha) > n no
held-out score is large enough and the only set with the guarantee is every option; that is what a
stratum with too few answers (or none) gets, and the report says so.

A stratum is a question type and option-count bucket (`choice:3-5`), and within it a group (a
language, or a line's `group` field) with at least `min_group` held-out answers. A served answer
does not say which group it belongs to, so it gets the largest threshold of its bucket and of the
bucket's groups: the set then contains each group's own set and keeps every group's guarantee, at the
price of some size. Empty sets are possible (no option is probable enough): they are part of the
guarantee, and mean the model has no usable answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laya.calibration.temperatures import bucket_key

MIN_GROUP = 100  # held-out answers a group needs for its own threshold
SEP = "|"  # `choice:3-5|de`: a group's stratum within a bucket


def scores(p_true: np.ndarray) -> np.ndarray:
    """Nonconformity of labelled answers: 1 - the probability the model gave the right option."""
    return 1.0 - np.asarray(p_true, dtype=np.float64)


def conformal_quantile(held_out: np.ndarray, alpha: float) -> float | None:
    """The ceil((n+1)(1-alpha))-th smallest score, or None when that rank exceeds n (every option)."""
    s = np.sort(np.asarray(held_out, dtype=np.float64))
    rank = math.ceil((len(s) + 1) * (1.0 - alpha) - 1e-9)
    return float(s[rank - 1]) if rank <= len(s) else None


def qualifying(p: Sequence[float] | np.ndarray, threshold: float | None) -> list[int]:
    """Indices of the options in the set, most probable first (None: every option)."""
    order = sorted(range(len(p)), key=lambda i: -float(p[i]))
    if threshold is None:
        return order
    return [i for i in order if 1.0 - float(p[i]) <= threshold + 1e-12]


@dataclass(frozen=True)
class ConformalSets:
    coverage: float  # 1 - alpha
    thresholds: dict[str, float | None]  # stratum -> threshold (None: every option)
    counts: dict[str, int] = field(default_factory=dict)  # held-out answers per stratum

    def threshold(self, qtype: str, n_options: int, group: str | None = None) -> float | None:
        """The group's own threshold where it has one; without a group, the bucket's most generous
        (see the module's docstring); a bucket never seen: None, every option."""
        bucket = bucket_key(qtype, n_options)
        if group is not None and f"{bucket}{SEP}{group}" in self.thresholds:
            return self.thresholds[f"{bucket}{SEP}{group}"]
        if bucket not in self.thresholds:
            return None
        values = [v for k, v in self.thresholds.items() if k == bucket or k.startswith(bucket + SEP)]
        return None if any(v is None for v in values) else max(v for v in values if v is not None)

    def members(self, qtype: str, n_options: int, p: Sequence[float] | np.ndarray,
                group: str | None = None) -> list[int]:
        return qualifying(p, self.threshold(qtype, n_options, group))

    def extras(self, keys: Sequence[str], qtype: str, p: Sequence[float] | np.ndarray) -> dict[str, Any]:
        """`x_set` of one answer: option names (choice), level keys (score), booleans (noul)."""
        chosen = self.members(qtype, len(p), p)
        if qtype == "noul":
            return {"x_set": [keys[i] == "true" for i in chosen]}
        return {"x_set": [keys[i] for i in chosen]}

    def to_dict(self) -> dict[str, Any]:
        return {"coverage": self.coverage, "thresholds": dict(self.thresholds), "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ConformalSets:
        if not isinstance(data, Mapping) or not isinstance(data.get("thresholds"), Mapping):
            raise ValueError(f"{where}: conformal needs \"coverage\" and a \"thresholds\" object")
        coverage = data.get("coverage")
        if isinstance(coverage, bool) or not isinstance(coverage, int | float) or not 0.0 < coverage < 1.0:
            raise ValueError(f"{where}: conformal coverage {coverage!r} is not a number in (0, 1)")
        thresholds: dict[str, float | None] = {}
        for key, value in data["thresholds"].items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 0.0 <= value <= 1.0):
                raise ValueError(f"{where}: conformal threshold {key!r} = {value!r} is not in [0, 1] nor null")
            thresholds[str(key)] = None if value is None else float(value)
        counts = {str(k): int(v) for k, v in dict(data.get("counts") or {}).items()}
        return cls(float(coverage), thresholds, counts)


def fit_sets(qtypes: Sequence[str], n_options: Sequence[int], p_true: np.ndarray, coverage: float,
             groups: Sequence[str | None] | None = None, min_group: int = MIN_GROUP) -> ConformalSets:
    """Thresholds per bucket, and per group within a bucket where the group has `min_group` answers."""
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"the coverage must be between 0 and 1, got {coverage}")
    s = scores(p_true)
    strata: dict[str, list[int]] = {}
    for i, (qtype, n) in enumerate(zip(qtypes, n_options)):
        bucket = bucket_key(qtype, n)
        strata.setdefault(bucket, []).append(i)
        if groups is not None and groups[i] is not None:
            strata.setdefault(f"{bucket}{SEP}{groups[i]}", []).append(i)
    alpha = 1.0 - coverage
    thresholds: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for key, idx in sorted(strata.items()):
        if SEP in key and len(idx) < min_group:
            continue
        thresholds[key] = conformal_quantile(s[idx], alpha)
        counts[key] = len(idx)
    return ConformalSets(coverage, thresholds, counts)
