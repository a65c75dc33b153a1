"""The training report's pictures: the loss curve and the act head's precision against coverage."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from laya.calibration.metrics import coverage_curve
from laya.calibration.plots import _pyplot


def loss_plot(losses: Sequence[float], epoch_losses: Sequence[float], path: str | os.PathLike) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=110)
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, color="0.75", linewidth=0.8, label="per step")
    if len(losses) >= 5:
        width = max(2, len(losses) // 25)
        smooth = np.convolve(losses, np.ones(width) / width, mode="valid")
        ax.plot(steps[width - 1:], smooth, color="C0", linewidth=1.6, label=f"mean of {width} steps")
    per_epoch = len(losses) / max(1, len(epoch_losses))
    ax.plot(per_epoch * np.arange(1, len(epoch_losses) + 1), epoch_losses, "o", color="C1", label="epoch mean")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("soft cross-entropy")
    ax.set_title("training loss")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def act_coverage_plot(act: np.ndarray, top: np.ndarray, correct: np.ndarray, path: str | os.PathLike) -> Path:
    """Answering only the most trusted share of questions: precision of what is answered, by act
    probability (the trained act head) and by top probability, on held-out answers."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=110)
    for score, name, style in [(act, "act probability", "C0"), (top, "top probability", "C1")]:
        cov, prec, _ = coverage_curve(np.asarray(score, float), np.asarray(correct, bool))
        ax.plot(cov, prec, color=style, linewidth=1.6, label=f"ranked by {name}")
    ax.axhline(float(np.mean(correct)), color="0.6", linestyle="--", linewidth=1, label="answer everything")
    ax.set_xlabel("coverage (share of questions answered)")
    ax.set_ylabel("precision of the answered")
    ax.set_xlim(0, 1)
    ax.set_title("abstention: precision against coverage (held-out)")
    ax.legend(frameon=False, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
