"""The precision standard: when a reduced precision may answer, measured once for all runtimes.

A reduced precision (bf16, fp16 and int8 on the packed runtime, ONNX int8, llama.cpp's f16 and q8_0)
answers only when, on the checkpoint at hand, it stays within upstream laya's own envelope for its fast
path: upstream's README holds that path to max |dp| <= 0.05 against fp32 (0.046 measured) with argmax
agreement of at least 47 of 48 per question type, and reports its stock bf16 autocast moving a
probability by up to 0.073 and flipping 3 of 864 top answers. So, on the gate's fixed rows:

- no answer probability moves more than 0.05 from fp32's (fp16, which keeps 11 bits, keeps 0.02);
- no top answer changes where fp32's top two are 0.10 or more apart (a flip inside a closer race is
  the rounding of a near tie, as in upstream's own figures). Under the first bound this one always
  holds (each of two probabilities moving at most 0.05 closes a gap of at most 0.10): it is stated,
  and measured, so that the record says how close a flip came;
- a row's answer moves at most 0.01 between running alone and inside a full batch (the packed
  runtime runs each row alone at its exact length: 0 there).

The gate runs fixed, varied decision rows through the fp32 reference and the candidate, the way the
runtime runs them. The record goes into the bundle (ONNX int8, llama.cpp) or the cache (packed); a
failed gate is refused unless the caller forces it. fp32 runtimes are not gated: they equal the
reference to 1e-4 (the parity suite).
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
# Bumped whenever the standard changes, so that gate records measured under another are measured again.
STANDARD = 2


@dataclass(frozen=True)
class Bounds:
    max_dp: float  # largest change of any answer probability against fp32
    flip_margin: float  # no top answer may change where fp32's top-two margin is at least this
    batch_dependence_max_dp: float  # largest change between a row alone and inside a full batch


ENVELOPE = Bounds(0.05, 0.10, 0.01)  # upstream's envelope for its fast path (see above)
FP16 = Bounds(0.02, 0.10, 0.01)
# llama.cpp's types: f16 (fp16 weights) as fp16, q8_0 (int8 blocks) as int8
BOUNDS = {"bf16": ENVELOPE, "int8": ENVELOPE, "q8_0": ENVELOPE, "fp16": FP16, "f16": FP16}


class GateFailed(RuntimeUnavailable):
    """A reduced precision whose answers drift from fp32 beyond its documented bound on this checkpoint."""

    def __init__(self, message: str, gate: dict[str, Any]):
        super().__init__(message)
        self.gate = gate

    def __reduce__(self):
        return (GateFailed, (str(self), self.gate))


def describe(gate: dict[str, Any]) -> str:
    if gate.get("measured") is False:
        return str(gate.get("note", "no gate measured"))
    bounds = gate.get("bounds", {})
    return (f"max |dp| {gate['max_dp']:.4g} (bound {bounds.get('max_dp')}), largest fp32 margin of a flipped top "
            f"answer {gate.get('flipped_margin', float('nan')):.3g} (must stay under {bounds.get('flip_margin')}), "
            f"batch dependence {gate['batch_dependence_max_dp']:.3g} (bound {bounds.get('batch_dependence_max_dp')}) "
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
    from laya.decoding.decode import probabilities
    from laya.encoder.batch import collate

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
    alone = [answers(candidate, [i])[0] for i in every]
    record = judge(answers(reference, every), alone, answers(candidate, every), precision)
    for name, forward in (extra or {}).items():
        record[f"{name}_max_dp"] = round(_worst(answers(forward, every), alone), 6)
    return record


def judge(reference: list[np.ndarray], alone: list[np.ndarray], together: list[np.ndarray],
          precision: str) -> dict[str, Any]:
    """The gate's record of a candidate's answers (each row alone, and all together) against fp32's."""
    bounds = BOUNDS[precision]
    max_dp, batch_dp = _worst(reference, alone), _worst(together, alone)
    agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(reference, alone)) / len(reference)
    flipped = max((_margin(a) for a, b in zip(reference, alone) if np.argmax(a) != np.argmax(b)), default=0.0)
    return {
        "standard": STANDARD, "precision": precision, "rows": len(reference), "max_dp": round(max_dp, 6),
        "flipped_margin": round(flipped, 6), "argmax_agreement": round(agree, 4),
        "batch_dependence_max_dp": round(batch_dp, 6), "bounds": asdict(bounds),
        "passed": bool(max_dp <= bounds.max_dp and flipped < bounds.flip_margin
                       and batch_dp <= bounds.batch_dependence_max_dp)}


def _worst(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def _margin(p: np.ndarray) -> float:
    """fp32's lead of its top answer over the runner-up."""
    top = np.sort(p)[::-1]
    return float(top[0] - top[1]) if len(top) > 1 else 1.0


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
        if isinstance(record, dict) and {"passed", "max_dp", "bounds"} <= set(record) \
                and record.get("standard") == STANDARD:
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
