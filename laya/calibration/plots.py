"""The report's two pictures (matplotlib, written as PNG): a reliability diagram and accuracy vs coverage."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from laya.calibration.metrics import coverage_curve, equal_mass_bins


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("the calibration plots need matplotlib: pip install 'laya-runtime[calibrate]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def reliability_diagram(before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray], bins: int,
                        path: str | os.PathLike, title: str = "") -> Path:
    """Mean top probability against accuracy per equal-mass bin, before and after calibration."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=110)
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfectly calibrated")
    for (top, correct), name, style in [(before, "before", "o-"), (after, "after", "s-")]:
        groups = equal_mass_bins(top, bins)
        ax.plot([top[g].mean() for g in groups], [correct[g].mean() for g in groups], style, label=name)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean top probability (equal-mass bins)", ylabel="accuracy",
           title=title or f"Reliability, held-out ({bins} bins)")
    return _save(plt, fig, ax, path, legend="upper left")


def _save(plt, fig, ax, path, legend: str) -> Path:
    ax.legend(loc=legend)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def coverage_plot(before: tuple[np.ndarray, np.ndarray], after: tuple[np.ndarray, np.ndarray],
                  path: str | os.PathLike, target: float | None = None, title: str = "") -> Path:
    """Accuracy of the answers kept against the share kept, answering the most confident first."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=110)
    for (top, correct), name in [(before, "before"), (after, "after")]:
        coverage, accuracy, _ = coverage_curve(top, correct.astype(np.float64))
        ax.plot(coverage, accuracy, label=name)
    if target is not None:
        ax.axhline(target, color="0.5", linestyle=":", label=f"precision {target:.0%}")
    ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="coverage (share of answers given)", ylabel="accuracy of answers given",
           title=title or "Accuracy vs coverage, held-out")
    return _save(plt, fig, ax, path, legend="best")


def risk_coverage_plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: str | os.PathLike,
                       max_error: float | None = None, title: str = "") -> Path:
    """Error rate of the answers given against the share given, one curve per group (`name` -> (signal,
    wrong)), answering in order of the abstain signal; the legend carries each curve's AURC."""
    from laya.calibration.selective import aurc, risk_coverage

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=110)
    for name, (signal, wrong) in curves.items():
        if not len(signal):
            continue
        coverage, risk = risk_coverage(signal, wrong)
        ax.plot(coverage, risk, label=f"{name} (AURC {aurc(signal, wrong):.3f})")
    if max_error is not None:
        ax.axhline(max_error, color="0.5", linestyle=":", label=f"error bound {max_error:g}")
    ax.set(xlim=(0, 1), ylim=(0, None), xlabel="coverage (share of answers given)", ylabel="error of answers given",
           title=title or "Risk vs coverage, held-out")
    return _save(plt, fig, ax, path, legend="upper left")


def sets_plot(coverage: dict[str, float], size: dict[str, float], target: float, path: str | os.PathLike,
              title: str = "") -> Path:
    """Per group: the prediction sets' coverage (bars) against the target, and their mean size (labels)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(coverage) + 2), 4.4), dpi=110)
    names = list(coverage)
    bars = ax.bar(range(len(names)), [coverage[n] for n in names], color="tab:blue", label="coverage")
    for bar, name in zip(bars, names):
        ax.annotate(f"size {size[name]:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.axhline(target, color="tab:red", linestyle="--", label=f"target {target:.0%}")
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set(ylim=(0, 1.08), ylabel="share of sets holding the right answer",
           title=title or "Prediction sets per group (random halves of held-out)")
    return _save(plt, fig, ax, path, legend="lower right")
