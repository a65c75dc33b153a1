"""Accuracy gates of reduced-precision runtimes (ONNX int8, torch bf16, llama f16 and q8_0), one measurement for all.

A reduced precision is only offered when its answers stay near fp32 on this checkpoint: the gate
runs fixed, varied decision rows through the fp32 reference and the candidate, the way the runtime
runs them, and records the largest change of any answer probability, the share of rows whose top
answer agrees, and how much a row's answer moves between running alone and inside a full padded
batch. The record goes into the bundle (int8) or the cache (bf16); a failed gate is refused unless
the caller forces it.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from laya.errors import RuntimeUnavailable

if TYPE_CHECKING:
    from laya.encoder.batch import Batch
    from laya.encoder.checkpoint import Checkpoint
    from laya.encoder.rows import Row
    from laya.questions import Question

Forward = Callable[["Batch"], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Bounds:
    max_dp: float  # largest change of any answer probability against fp32
    argmax_agreement: float  # least share of rows with the same top answer
    batch_dependence_max_dp: float  # largest change between a row alone and inside a full batch


# llama.cpp's types: f16 (fp16 activations) is held to bf16's bound, q8_0 (int8 blocks) to int8's
BOUNDS = {"int8": Bounds(0.05, 0.95, 0.01), "bf16": Bounds(0.02, 0.98, 0.01),
          "f16": Bounds(0.02, 0.98, 0.01), "q8_0": Bounds(0.05, 0.95, 0.01)}


class GateFailed(RuntimeUnavailable):
    """A reduced precision whose answers drift from fp32 beyond its documented bound on this checkpoint."""

    def __init__(self, message: str, gate: dict[str, Any]):
        super().__init__(message)
        self.gate = gate

    def __reduce__(self):
        return (GateFailed, (str(self), self.gate))


def describe(gate: dict[str, Any]) -> str:
    return (f"max |dp| {gate['max_dp']:.4g} (bound {gate['bounds']['max_dp']}), argmax agreement "
            f"{gate['argmax_agreement']:.3g} (bound {gate['bounds']['argmax_agreement']}), batch dependence "
            f"{gate['batch_dependence_max_dp']:.3g} (bound {gate['bounds']['batch_dependence_max_dp']}) "
            f"on {gate['rows']} rows")


def gate_rows(checkpoint: Checkpoint) -> list[tuple[Question, Row]]:
    """Fixed, varied decision rows: every type, 2 to 12 options, short to long states."""
    from laya.encoder.rows import build_rows
    from laya.questions import parse_questions

    rng = random.Random(1234)
    words = ["refund", "invoice", "order", "late", "angry", "happy", "billing", "shipping", "login", "password",
             "cancel", "upgrade", "thanks", "broken", "urgent", "price"]
    rows = []
    for i in range(8):
        state = " ".join(rng.choice(words) for _ in range(rng.randint(3, 150)))
        labels = rng.sample(words, 2 + i % 11)
        questions = parse_questions({
            "c": {"type": "choice", "instructions": " ".join(rng.sample(words, 5)),
                  "criteria": {w: " ".join(rng.sample(words, 3)) for w in labels}},
            "s": {"type": "score", "instructions": "how much", "criteria": rng.sample(words, 2 + i % 9)},
            "n": {"type": "noul", "instructions": " ".join(rng.sample(words, 4))},
        })
        rows += list(zip(questions, build_rows(checkpoint.tokenizer, state, questions, checkpoint.config.max_len,
                                               checkpoint.config.head_max_len)))
    return rows


def measure(checkpoint: Checkpoint, reference: Forward, candidate: Forward, precision: str,
            extra: dict[str, Forward] | None = None) -> dict[str, Any]:
    """The candidate against the fp32 reference on the fixed rows, with `precision`'s bounds.

    `extra` names other ways to run the candidate whose drift from the row alone is recorded for
    information (e.g. a padded int8 batch the runtime does not use)."""
    from laya.calibration.temperatures import Temperatures
    from laya.encoder.batch import collate
    from laya.heads.decode import probabilities

    bounds = BOUNDS[precision]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checkpoint's own clamp was reported when it was loaded
        temps = Temperatures.from_raw(checkpoint.config.temperature, checkpoint.config.temperature_by_options,
                                      source="gate")
    pairs = gate_rows(checkpoint)
    pad = checkpoint.tokenizer.pad_id

    def answers(forward: Forward, indices: list[int]) -> list[np.ndarray]:
        logits, _ = forward(collate([pairs[i][1] for i in indices], pad))
        return [probabilities(logits[j, : len(pairs[i][1].markers)],
                              temps.for_question(pairs[i][0].qtype, pairs[i][0].n_options))
                for j, i in enumerate(indices)]

    every = list(range(len(pairs)))
    ref = answers(reference, every)
    together = answers(candidate, every)
    alone = [answers(candidate, [i])[0] for i in every]

    def worst(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))

    max_dp, batch_dp = worst(ref, alone), worst(together, alone)
    agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(ref, alone)) / len(pairs)
    record: dict[str, Any] = {
        "precision": precision, "rows": len(pairs), "max_dp": round(max_dp, 6), "argmax_agreement": round(agree, 4),
        "batch_dependence_max_dp": round(batch_dp, 6), "bounds": asdict(bounds),
        "passed": bool(max_dp <= bounds.max_dp and agree >= bounds.argmax_agreement
                       and batch_dp <= bounds.batch_dependence_max_dp)}
    for name, forward in (extra or {}).items():
        record[f"{name}_max_dp"] = round(worst(answers(forward, every), alone), 6)
    return record


def cached_gate(key: str, measure_now: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A gate record kept in `$LAYA_CACHE/gates/<key>.json`: measured once per checkpoint, processor
    and framework version, since the measurement costs a few dozen forward passes."""
    import json
    import os
    import tempfile
    from pathlib import Path

    folder = Path(os.environ.get("LAYA_CACHE", Path.home() / ".cache" / "laya")) / "gates"
    path = folder / f"{key}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and {"passed", "max_dp", "bounds"} <= set(record):
            return record
    except (OSError, ValueError):
        pass
    record = measure_now()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{key}.", suffix=".partial")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the measurement at the next load
    return record
