"""Abstention: answer only when the top probability clears a threshold chosen for a target precision.

The threshold is chosen on held-out labelled data (`laya calibrate --target-precision`), overall and
per bucket where a bucket has enough held-out answers. The act head's probability is reported beside
it but not used: on the published checkpoints it reads about 1.0 for almost every input, and the
calibration report measures (AUROC) which signal separates right from wrong answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laya.calibration.temperatures import bucket_key

# A threshold is only trusted where at least this many held-out answers clear it.
MIN_ANSWERED = 20


@dataclass(frozen=True)
class Abstention:
    threshold: float
    target_precision: float
    by_bucket: dict[str, float] = field(default_factory=dict)

    def threshold_for(self, qtype: str, n_options: int) -> float:
        return self.by_bucket.get(bucket_key(qtype, n_options), self.threshold)

    def extras(self, qtype: str, n_options: int, p: np.ndarray) -> dict[str, Any]:
        """`x_abstain` / `x_threshold` of one answer."""
        threshold = self.threshold_for(qtype, n_options)
        return {"x_abstain": bool(float(np.max(p)) < threshold), "x_threshold": threshold}

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "target_precision": self.target_precision,
                "by_bucket": dict(self.by_bucket)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Abstention:
        try:
            threshold, target = float(data["threshold"]), float(data["target_precision"])
            by_bucket = {str(k): float(v) for k, v in dict(data.get("by_bucket") or {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: abstention needs numeric threshold and target_precision ({exc})") from exc
        for name, value in [("threshold", threshold), *by_bucket.items()]:
            if not 0.0 <= value <= 1.0 + 1e-12:
                raise ValueError(f"{where}: abstention {name} {value} is not a probability")
        return cls(threshold, target, by_bucket)


def choose_threshold(top: np.ndarray, correct: np.ndarray, target: float,
                     min_answered: int = MIN_ANSWERED) -> float | None:
    """The lowest top-probability threshold at which the answers kept reach `target` precision.

    Conservative: every stricter threshold (with at least `min_answered` answers kept) must reach it
    too, so one lucky spike of precision does not set the threshold. None if no threshold does.
    """
    order = np.argsort(-top, kind="stable")
    top, correct = np.asarray(top, dtype=np.float64)[order], np.asarray(correct, dtype=np.float64)[order]
    kept = np.arange(1, len(top) + 1)
    precision = np.cumsum(correct) / kept
    # keeping the k most confident answers is a threshold only where the k-th value differs from the next
    candidate = np.r_[top[1:] < top[:-1], True] & (kept >= min_answered)
    fine = ~candidate | (precision >= target)
    all_stricter_fine = np.cumprod(fine).astype(bool)  # every candidate keeping fewer answers reaches it
    usable = np.flatnonzero(candidate & all_stricter_fine)
    return float(top[usable[-1]]) if len(usable) else None
