"""The precision standard: when a reduced precision may answer, measured once for all runtimes.

A reduced precision (bf16, fp16 and int8 on the packed runtime, ONNX int8, llama.cpp's f16 and q8_0)
answers only when, on the checkpoint at hand, it stays within upstream laya's own envelope for its fast
path: upstream's README holds that path to max |dp| <= 0.05 against fp32 (0.046 measured) with argmax
agreement of at least 47 of 48 per question type, and reports its stock bf16 autocast moving a
probability by up to 0.073 and flipping 3 of 864 top answers. That envelope is what a reduced
precision promises on every input (`PROMISED`):

- no answer probability moves more than 0.05 from fp32's (fp16, which keeps 11 bits, keeps 0.02);
- no top answer changes where fp32's top two are 0.10 or more apart (a flip inside a closer race is
  the rounding of a near tie, as in upstream's own figures);
- a row's answer moves at most 0.01 between running alone and inside a full batch (the packed
  runtime runs each row alone at its exact length: 0 there).

The gate cannot run every input, so it keeps headroom: on its own rows it applies `HEADROOM` (0.6) of
the envelope's moves (`BOUNDS`: 0.03 and a flip margin of 0.06 for bf16 and int8), and its rows are
every kind of input callers send (`laya.encoder.gate_cases`: text, JSON-object and conversation
states, non-Latin scripts, states cut at the row's end, 2 options up to as many as the row holds,
with and without descriptions, special tokens typed in text, scores, yes/no, several questions per
state), at lengths up to the row. The record keeps both figures (the bound applied and the envelope
promised) and the largest move per kind. It goes into the bundle (ONNX int8, llama.cpp) or the cache
(packed); a failed gate is refused unless the caller forces it. fp32 runtimes are not gated: they
equal the reference to 1e-4 (the parity suite).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from laya.encoder.cache import cache_root, write_json
from laya.errors import RuntimeUnavailable

if TYPE_CHECKING:
    from laya.encoder.batch import Batch
    from laya.encoder.checkpoint import Checkpoint
    from laya.encoder.rows import Row
    from laya.questions import Question

Forward = Callable[["Batch"], tuple[np.ndarray, np.ndarray]]
# Bumped whenever the standard changes, so that gate records measured under another are measured again.
STANDARD = 3


@dataclass(frozen=True)
class Bounds:
    max_dp: float  # largest change of any answer probability against fp32
    flip_margin: float  # no top answer may change where fp32's top-two margin is at least this
    batch_dependence_max_dp: float  # largest change between a row alone and inside a full batch

    def within(self, share: float) -> Bounds:
        """These bounds with headroom: the moves scaled by `share`, batch dependence kept (it is 0 for a
        runtime that runs each row alone, and a property of the batch, not of the input)."""
        return Bounds(round(self.max_dp * share, 6), round(self.flip_margin * share, 6),
                      self.batch_dependence_max_dp)


ENVELOPE = Bounds(0.05, 0.10, 0.01)  # upstream's envelope for its fast path (see above)
FP16 = Bounds(0.02, 0.10, 0.01)
# llama.cpp's types: f16 (fp16 weights) as fp16, q8_0 (int8 blocks) as int8
PROMISED = {"bf16": ENVELOPE, "int8": ENVELOPE, "q8_0": ENVELOPE, "fp16": FP16, "f16": FP16}
# The gate applies a tighter bound than the envelope it promises: its rows are many kinds of input, but
# not every input, and an input it never saw may move further (measured: up to 1.8x the gate's figure on
# hidden cases when its rows were of one kind). 0.6 of the envelope leaves that room.
HEADROOM = 0.6
BOUNDS = {precision: bounds.within(HEADROOM) for precision, bounds in PROMISED.items()}
TOGETHER = 8  # rows of one padded length run together when the gate measures batch dependence


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


def _rows_of(checkpoint: Checkpoint, state: Any, questions: dict[str, Any]) -> list[tuple[Question, Row]] | None:
    """A request's rows, each with its question, built exactly as the engine builds them; None for one
    whose options do not fit in one row (a tournament's)."""
    from laya.encoder.rows import build_rows
    from laya.errors import QuestionError
    from laya.questions import parse_questions

    tok, cfg = checkpoint.tokenizer, checkpoint.config
    try:
        parsed = parse_questions(questions)
        return list(zip(parsed, build_rows(tok, state, parsed, cfg.max_len, cfg.head_max_len)))
    except QuestionError:
        return None


def gate_rows(checkpoint: Checkpoint) -> list[tuple[Question, Row, str]]:
    """The rows of the gate's requests (`laya.encoder.gate_cases`: every input kind, lengths up to the
    row), each with the question it answers and its kind."""
    from laya.encoder.gate_cases import cases

    tok, cfg = checkpoint.tokenizer, checkpoint.config
    found = [(case.kind, _rows_of(checkpoint, case.state, case.questions))
             for case in cases(tok, cfg.max_len, lambda state, qs: _rows_of(checkpoint, state, qs) is not None)]
    return [(q, row, kind) for kind, rows in found for q, row in rows or []]


def held_out_rows(checkpoint: Checkpoint) -> list[tuple[Question, Row, str]]:
    """The rows of the golden cases (`laya.encoder.golden_cases`, written to pin upstream's answers, not
    for the gate): inputs the gate's own rows never were, on which the record reports the drift without
    judging it."""
    from laya.encoder.golden_cases import cases

    tok = checkpoint.tokenizer
    found = [_rows_of(checkpoint, case["state"], case["questions"]) for case in cases(tok.mask_token, tok.sep_token)]
    return [(q, row, "held_out") for rows in found for q, row in rows or []]


def measure(checkpoint: Checkpoint, reference: Forward, candidate: Forward, precision: str,
            extra: dict[str, Forward] | None = None) -> dict[str, Any]:
    """The candidate against the fp32 reference on the gate's rows, with `precision`'s bounds.

    Each row runs alone through the candidate (what the record judges), and the rows also run
    together, in batches of rows of one padded length as a model batches them (what batch dependence
    compares). `extra` names other ways to run the candidate whose drift from the row alone is recorded
    for information (e.g. a padded int8 batch the runtime does not use)."""
    from laya.calibration.temperatures import Temperatures
    from laya.decoding.decode import probabilities
    from laya.encoder.batch import collate, padded_length

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checkpoint's own clamp was reported when it was loaded
        temps = Temperatures.from_raw(checkpoint.config.temperature, checkpoint.config.temperature_by_options,
                                      source="gate")
    triples = gate_rows(checkpoint)
    held_out = held_out_rows(checkpoint)
    pad = checkpoint.tokenizer.pad_id
    batches: dict[int, list[int]] = {}
    for i, (_, row, _) in enumerate(triples):
        batches.setdefault(padded_length(len(row.ids)), []).append(i)
    # batch dependence is a property of how a runtime batches rows, not of what they say: the shortest
    # padded lengths' full batches measure it, at a fraction of a pass over every row
    together_groups: list[list[int]] = []
    for _, members in sorted(batches.items()):
        if sum(map(len, together_groups)) < 2 * TOGETHER:
            together_groups.append(members[:TOGETHER])
    every_row = [[i] for i in range(len(triples))]

    def answers(forward: Forward, groups: list[list[int]], rows: list[tuple[Question, Row, str]] = triples
                ) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.empty(0)] * len(rows)
        for indices in groups:
            logits, _ = forward(collate([rows[i][1] for i in indices], pad))
            for j, i in enumerate(indices):
                question, row = rows[i][0], rows[i][1]
                out[i] = probabilities(logits[j, : len(row.markers)],
                                       temps.for_question(question.qtype, question.n_options))
        return out

    each_held_out = [[i] for i in range(len(held_out))]
    wanted, wanted_held_out = _reference_answers(checkpoint, lambda: (
        answers(reference, every_row), answers(reference, each_held_out, held_out)))
    alone = answers(candidate, every_row)
    batched = [i for group in together_groups for i in group]
    together = answers(candidate, together_groups)
    record = judge(wanted, alone, [together[i] for i in batched], precision, kinds=[kind for _, _, kind in triples],
                   batched=batched)
    for name, forward in (extra or {}).items():
        found = answers(forward, together_groups)
        record[f"{name}_max_dp"] = round(_worst([found[i] for i in batched], [alone[i] for i in batched]), 6)
    if held_out:
        unseen = judge(wanted_held_out, answers(candidate, each_held_out, held_out), [], precision)
        record["held_out"] = {"source": "the golden cases", "rows": len(held_out), "max_dp": unseen["max_dp"],
                              "flipped_margin": unseen["flipped_margin"]}
    return record


Answers = list[np.ndarray]
_last_reference: list[tuple[str, tuple[Answers, Answers]]] = []  # the last checkpoint's fp32 answers


def _reference_answers(checkpoint: Checkpoint, compute: Callable[[], tuple[Answers, Answers]]
                       ) -> tuple[Answers, Answers]:
    """The fp32 answers on the gate's rows and on the held-out ones, computed once per checkpoint (its
    fingerprint: the weights, configs and tokenizer that decide them): a runtime gates several plans,
    eager and compiled, and an export several types, each against fp32, whose runtimes agree to 1e-4 (on
    a full-size checkpoint the reference's pass over every input kind takes minutes)."""
    key = f"{checkpoint.fingerprint}-{STANDARD}"
    if _last_reference and _last_reference[0][0] == key:
        return _last_reference[0][1]
    found = compute()
    _last_reference[:] = [(key, found)]
    return found


def judge(reference: list[np.ndarray], alone: list[np.ndarray], together: list[np.ndarray],
          precision: str, kinds: list[str] | None = None, batched: list[int] | None = None) -> dict[str, Any]:
    """The gate's record of a candidate's answers (each row alone, and inside full batches) against
    fp32's: judged by the gate's bounds (`BOUNDS`, inside the envelope), with the envelope it keeps for
    inputs it never saw, and the largest move per input kind where the rows' kinds are given.
    `together[j]` is row `batched[j]` run inside a batch (default: every row, in order)."""
    bounds = BOUNDS[precision]
    batched = list(range(len(together))) if batched is None else batched
    max_dp = _worst(reference, alone)
    batch_dp = _worst(together, [alone[i] for i in batched]) if together else 0.0
    agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(reference, alone)) / len(reference)
    flipped = max((_margin(a) for a, b in zip(reference, alone) if np.argmax(a) != np.argmax(b)), default=0.0)
    record = {
        "standard": STANDARD, "precision": precision, "rows": len(reference), "max_dp": round(max_dp, 6),
        "flipped_margin": round(flipped, 6), "argmax_agreement": round(agree, 4),
        "batch_dependence_max_dp": round(batch_dp, 6), "bounds": asdict(bounds),
        "envelope": asdict(PROMISED[precision]),
        "passed": bool(max_dp <= bounds.max_dp and flipped < bounds.flip_margin
                       and batch_dp <= bounds.batch_dependence_max_dp)}
    if kinds is not None:
        by_kind: dict[str, float] = {}
        for kind, a, b in zip(kinds, reference, alone):
            by_kind[kind] = max(by_kind.get(kind, 0.0), float(np.max(np.abs(a - b))))
        record["max_dp_by_kind"] = {k: round(v, 6) for k, v in sorted(by_kind.items())}
    return record


def _worst(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def _margin(p: np.ndarray) -> float:
    """fp32's lead of its top answer over the runner-up."""
    top = np.sort(p)[::-1]
    return float(top[0] - top[1]) if len(top) > 1 else 1.0


def cached_gate(key: str, measure_now: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A gate record kept in `$LAYA_CACHE/gates/<key>.json`: measured once per checkpoint, processor
    and framework version, since the measurement costs a few dozen forward passes."""
    import contextlib
    import json

    path = cache_root() / "gates" / f"{key}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and {"passed", "max_dp", "bounds"} <= set(record) \
                and record.get("standard") == STANDARD:
            return record
    except (OSError, ValueError):
        pass
    record = measure_now()
    with contextlib.suppress(OSError):  # a read-only cache only costs the measurement at the next load
        write_json(path, record)
    return record
