"""Selective figures per group: the risk-coverage curve and its area (AURC), ECE, and, where answers
carry them, the prediction sets' coverage and size and the abstentions' error rate.

The risk-coverage curve answers the questions in order of an abstain signal, most confident first:
at coverage k/n the risk is the error rate of the k answered. AURC is its mean over k = 1..n; lower
is better, and a signal that orders right before wrong perfectly reaches the floor set by the error
rate. `laya calibrate` (held-out answers) and `laya eval` (any method's answers) both report them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laya.calibration.metrics import ece


def risk_coverage(signal: np.ndarray, wrong: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, error rate among the answered) answering in order of `signal`, highest first."""
    order = np.argsort(-np.asarray(signal, dtype=np.float64), kind="stable")
    kept = np.arange(1, len(order) + 1)
    return kept / max(1, len(order)), np.cumsum(np.asarray(wrong, dtype=np.float64)[order]) / kept


def aurc(signal: np.ndarray, wrong: np.ndarray) -> float | None:
    """Area under the risk-coverage curve (None for no answers)."""
    if len(signal) == 0:
        return None
    return float(risk_coverage(signal, wrong)[1].mean())


@dataclass
class Answered:
    """One labelled answer as the report sees it."""

    top: float  # the top probability
    wrong: bool
    signal: float  # the abstain signal (x_signal where the answer has one, else the top probability)
    groups: tuple[str, ...]  # every group it belongs to besides "overall"
    in_set: bool | None = None  # the right answer is in x_set (None: no x_set)
    set_size: int | None = None
    abstained: bool | None = None  # x_abstain (None: not given)


def group_figures(answers: Sequence[Answered], bins: int = 10) -> dict[str, dict[str, Any]]:
    """Figures overall and per group."""
    members: dict[str, list[Answered]] = {"overall": list(answers)}
    for a in answers:
        for g in a.groups:
            members.setdefault(g, []).append(a)
    return {name: _figures(group, bins) for name, group in members.items()}


def _figures(group: Sequence[Answered], bins: int) -> dict[str, Any]:
    top = np.array([a.top for a in group])
    wrong = np.array([a.wrong for a in group])
    out: dict[str, Any] = {"n": len(group), "error": float(wrong.mean()) if len(group) else None,
                           "ece": ece(top, ~wrong, bins) if len(group) else None,
                           "aurc": aurc(np.array([a.signal for a in group]), wrong)}
    sets = [a for a in group if a.in_set is not None]
    if sets:
        out["set_coverage"] = float(np.mean([a.in_set for a in sets]))
        out["mean_set_size"] = float(np.mean([a.set_size for a in sets]))
    told = [a for a in group if a.abstained is not None]
    if told:
        answered = [a for a in told if not a.abstained]
        out["answered_share"] = len(answered) / len(told)
        out["error_of_answered"] = float(np.mean([a.wrong for a in answered])) if answered else None
    return out


def answered_of(p: Sequence[float] | np.ndarray, label: int, answer: Mapping[str, Any], keys: Sequence[str],
                groups: tuple[str, ...]) -> Answered:
    """An `Answered` from an answer's probabilities (in option order) and its `x_` fields."""
    top_index = int(np.argmax(p))
    signal = answer.get("x_signal")
    x_set = answer.get("x_set")
    in_set = size = None
    if isinstance(x_set, list):
        names = ["true" if v is True else "false" if v is False else str(v) for v in x_set]
        in_set, size = keys[label] in names, len(names)
    abstained = answer.get("x_abstain")
    return Answered(float(p[top_index]), top_index != label,
                    float(signal) if isinstance(signal, int | float) else float(p[top_index]), groups, in_set, size,
                    abstained if isinstance(abstained, bool) else None)


def lines(figures: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per group for a terminal."""
    out = []
    for name, f in figures.items():
        parts = [f"n {f['n']}", f"error {_n(f['error'])}", f"ECE {_n(f['ece'])}", f"AURC {_n(f['aurc'])}"]
        if "set_coverage" in f:
            parts.append(f"set coverage {_n(f['set_coverage'])}, mean size {f['mean_set_size']:.2f}")
        if "answered_share" in f:
            parts.append(f"answered {_n(f['answered_share'])} with error {_n(f['error_of_answered'])}")
        out.append(f"  {name}: " + ", ".join(parts))
    return out


def _n(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.3f}"
