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
