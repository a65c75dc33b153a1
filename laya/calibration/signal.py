"""The abstain signal: which number says "this answer may be wrong".

Single signals, each a number in [0, 1] oriented so that higher means more likely right (so one
grid of thresholds serves them all): the act head's probability (encoder checkpoints with an act
head), the calibrated top probability, the top-two margin, exp(-entropy) and 1 / the option count
(monotone in the entropy and the count, so their AUROCs are the entropy's and the count's). The
combination is a logistic regression over all of them (standardised, a few Newton steps with a
small ridge), fitted on one part of the held-out answers and kept only if its AUROC on the other
part beats every single signal's; otherwise the best single
signal is used. Learn then Test (laya.calibration.risk) then sets the threshold on answers neither
part has seen, so the guarantee is not spent on choosing the signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laya.calibration.metrics import auroc

FEATURES = ("act_probability", "top_probability", "margin", "exp_neg_entropy", "inverse_option_count")
RIDGE = 1e-3
NEWTON_STEPS = 25


def features(p: Sequence[float] | np.ndarray, act: float | None) -> dict[str, float]:
    """Every single signal of one answer (act_probability only where the model has an act head)."""
    q = np.sort(np.asarray(p, dtype=np.float64))[::-1]
    out = {"top_probability": float(q[0]), "margin": float(q[0] - (q[1] if len(q) > 1 else 0.0)),
           "exp_neg_entropy": float(np.exp(np.sum(q[q > 0] * np.log(q[q > 0])))),
           "inverse_option_count": 1.0 / len(q)}
    if act is not None:
        out["act_probability"] = float(act)
    return out


def fit_logistic(x: np.ndarray, y: np.ndarray, ridge: float = RIDGE, steps: int = NEWTON_STEPS) -> np.ndarray:
    """Weights (bias last) of P(y=1 | x) by Newton's method on the ridge-penalised log-likelihood."""
    design = np.column_stack([x, np.ones(len(x))])
    w = np.zeros(design.shape[1])
    penalty = ridge * np.eye(design.shape[1])
    penalty[-1, -1] = 0.0
    for _ in range(steps):
        mu = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -30, 30)))
        grad = design.T @ (mu - y) + penalty @ w
        hess = (design * (mu * (1 - mu))[:, None]).T @ design + penalty + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.max(np.abs(step))) < 1e-10:
            break
    return w


@dataclass(frozen=True)
class Signal:
    """A single signal by name, or the combination (`names` with their mean, scale and weights)."""

    kind: str  # one of FEATURES, or "combined"
    names: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()
    scale: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()  # one per name, then the bias

    def value(self, feats: Mapping[str, float]) -> float:
        if self.kind != "combined":
            return float(feats[self.kind])
        z = self.weights[-1] + sum(w * (feats[n] - m) / s
                                   for n, m, s, w in zip(self.names, self.mean, self.scale, self.weights))
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))

    def needs(self) -> tuple[str, ...]:
        return self.names if self.kind == "combined" else (self.kind,)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "combined":
            out |= {"features": list(self.names), "mean": list(self.mean), "scale": list(self.scale),
                    "weights": list(self.weights)}
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Signal:
        kind = data.get("kind") if isinstance(data, Mapping) else None
        if kind in FEATURES:
            return cls(str(kind))
        if kind != "combined":
            raise ValueError(f"{where}: signal kind must be one of {[*FEATURES, 'combined']}, got {kind!r}")
        try:
            names = tuple(str(n) for n in data["features"])
            mean, scale, weights = (tuple(float(v) for v in data[k]) for k in ("mean", "scale", "weights"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: a combined signal needs features, mean, scale and weights ({exc})") from exc
        if not set(names) <= set(FEATURES) or not len(names) == len(mean) == len(scale) == len(weights) - 1 \
                or not all(s > 0 and math.isfinite(s) for s in scale) or not all(map(math.isfinite, weights)):
            raise ValueError(f"{where}: the combined signal's features, mean, scale and weights do not fit together")
        return cls("combined", names, mean, scale, weights)


def fit_combined(rows: Sequence[Mapping[str, float]], right: np.ndarray) -> Signal:
    """The logistic combination over every feature all `rows` have."""
    names = tuple(n for n in FEATURES if all(n in r for r in rows))
    x = np.array([[r[n] for n in names] for r in rows], dtype=np.float64)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    w = fit_logistic((x - mean) / scale, np.asarray(right, dtype=np.float64))
    return Signal("combined", names, tuple(map(float, mean)), tuple(map(float, scale)), tuple(map(float, w)))


def choose_signal(fit_rows: Sequence[Mapping[str, float]], fit_right: np.ndarray,
                  test_rows: Sequence[Mapping[str, float]], test_right: np.ndarray) -> tuple[Signal, dict[str, Any]]:
    """The combination if its AUROC on `test_rows` beats every single signal's, else the best single one;
    with every AUROC for the report."""
    singles = [n for n in FEATURES if test_rows and all(n in r for r in (*fit_rows, *test_rows))]
    aurocs: dict[str, float | None] = {n: auroc(np.array([r[n] for r in test_rows]), test_right) for n in singles}
    combined: Signal | None = None
    if len(fit_rows) >= 10 and 0 < int(np.sum(fit_right)) < len(fit_right):
        combined = fit_combined(fit_rows, fit_right)
        aurocs["combined"] = auroc(np.array([combined.value(r) for r in test_rows]), test_right)
    best_single = max(singles, key=lambda n: -1.0 if aurocs[n] is None else float(aurocs[n] or 0.0))
    best = aurocs.get(best_single)
    use_combined = combined is not None and aurocs["combined"] is not None and all(
        v is None or aurocs["combined"] > v for k, v in aurocs.items() if k != "combined")  # type: ignore[operator]
    chosen = combined if use_combined and combined is not None else Signal(best_single)
    return chosen, {"auroc": aurocs, "chosen": chosen.kind, "best_single": best_single, "best_single_auroc": best,
                    "fit_answers": len(fit_rows), "compared_on_answers": len(test_rows)}
