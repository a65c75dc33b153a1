"""How good a set of probabilistic answers is: accuracy, NLL, Brier, ECE, AUROC, coverage.

Plain numpy over `probs` (one probability vector per answer) and `labels` (the right option's index).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_BINS = 10
EPS = 1e-12


def _stack(probs: Sequence[np.ndarray], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    top = np.array([float(np.max(p)) for p in probs])
    correct = np.array([int(np.argmax(p)) == int(y) for p, y in zip(probs, labels)])
    p_true = np.array([float(p[y]) for p, y in zip(probs, labels)])
    return top, correct, p_true


def nll(probs: Sequence[np.ndarray], labels: Sequence[int]) -> float:
    return float(np.mean([-np.log(max(float(p[y]), EPS)) for p, y in zip(probs, labels)]))


def brier(probs: Sequence[np.ndarray], labels: Sequence[int]) -> float:
    """Multi-class Brier score: sum over options of (p - onehot)^2, averaged over answers."""
    total = 0.0
    for p, y in zip(probs, labels):
        onehot = np.zeros(len(p))
        onehot[y] = 1.0
        total += float(np.sum((np.asarray(p) - onehot) ** 2))
    return total / max(1, len(labels))


def equal_mass_bins(top: np.ndarray, bins: int) -> list[np.ndarray]:
    """Indices of answers sorted by top probability, cut into `bins` groups of (nearly) equal size."""
    order = np.argsort(top, kind="stable")
    return [chunk for chunk in np.array_split(order, min(bins, len(order))) if len(chunk)]


def ece(top: np.ndarray, correct: np.ndarray, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error of the top probability, equal-mass bins."""
    if len(top) == 0:
        return float("nan")
    return float(sum(len(b) * abs(top[b].mean() - correct[b].mean()) for b in equal_mass_bins(top, bins)) / len(top))


def auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """Probability that a random positive scores above a random negative (ties count half); None if
    either class is empty."""
    score, positive = np.asarray(score, dtype=np.float64), np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    sorted_scores = score[order]
    # average ranks over ties
    i = 0
    while i < len(score):
        j = i
        while j + 1 < len(score) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def coverage_curve(top: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coverage, accuracy of the answers kept, threshold) when keeping the most confident first."""
    order = np.argsort(-top, kind="stable")
    kept = np.arange(1, len(top) + 1)
    return kept / len(top), np.cumsum(correct[order]) / kept, top[order]


def coverage_at_precision(top: np.ndarray, correct: np.ndarray, precision: float) -> float:
    """The largest share of answers that can be kept with at least `precision` accuracy among them."""
    if len(top) == 0:
        return 0.0
    coverage, accuracy, threshold = coverage_curve(top, correct)
    boundary = np.r_[threshold[1:] < threshold[:-1], True]  # only cut between distinct values
    ok = np.flatnonzero(boundary & (accuracy >= precision))
    return float(coverage[ok[-1]]) if len(ok) else 0.0


def summarise(probs: Sequence[np.ndarray], labels: Sequence[int], act: Sequence[float | None] | None = None,
              bins: int = DEFAULT_BINS) -> dict[str, Any]:
    """Every figure of one group of answers."""
    top, correct, _ = _stack(probs, labels)
    out: dict[str, Any] = {
        "n": len(labels),
        "accuracy": float(correct.mean()) if len(labels) else float("nan"),
        "nll": nll(probs, labels) if len(labels) else float("nan"),
        "brier": brier(probs, labels) if len(labels) else float("nan"),
        "ece": ece(top, correct, bins),
        "ece_bins": min(bins, len(labels)),
        "auroc_top_probability": auroc(top, correct),
    }
    if act is not None and all(a is not None for a in act) and len(act):
        out["auroc_act_probability"] = auroc(np.array(act, dtype=np.float64), correct)
    return out
