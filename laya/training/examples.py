"""Training examples: one encoder row per labelled question, with its target distribution.

Choice questions are augmented by shuffling their options (names, descriptions and target move
together), so the model learns the options rather than their positions; score levels and yes/no
keep their order, which carries meaning.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from laya.calibration.data import DataError, Record
from laya.encoder.batch import Batch, collate
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.rows import build_rows
from laya.errors import QuestionError
from laya.questions import Question


@dataclass(frozen=True)
class Example:
    record: Record
    question: Question
    target: tuple[float, ...]  # a distribution over the question's options, in its order

    @property
    def label(self) -> int:
        return int(np.argmax(self.target))


def examples_of(records: Sequence[Record]) -> list[Example]:
    out = []
    for record in records:
        for q in record.parsed:
            if q.qid in record.soft:
                out.append(Example(record, q, record.soft[q.qid]))
            elif q.qid in record.labels:
                target = [0.0] * q.n_options
                target[record.labels[q.qid]] = 1.0
                out.append(Example(record, q, tuple(target)))
    return out


def shuffled(example: Example, rng: random.Random) -> Example:
    """The same example with its choice options in a random order."""
    q = example.question
    if q.qtype != "choice":
        return example
    order = list(range(q.n_options))
    rng.shuffle(order)
    moved = dataclasses.replace(q, keys=tuple(q.keys[i] for i in order), options=tuple(q.options[i] for i in order),
                                names=tuple(q.names[i] for i in order),
                                descriptions=tuple(q.descriptions[i] for i in order))
    return Example(example.record, moved, tuple(example.target[i] for i in order))


def batch_of(checkpoint: Checkpoint, examples: Sequence[Example]) -> tuple[Batch, np.ndarray]:
    """The examples' rows, collated, and their targets padded to the batch's marker count."""
    cfg, tok = checkpoint.config, checkpoint.tokenizer
    rows = []
    for ex in examples:
        try:
            rows += build_rows(tok, ex.record.state, [ex.question], cfg.max_len, cfg.head_max_len)
        except QuestionError as exc:
            raise DataError(f"line {ex.record.line}: {exc}") from exc
    batch = collate(rows, tok.pad_id)
    targets = np.zeros(batch.marker_mask.shape, dtype=np.float32)
    for i, ex in enumerate(examples):
        targets[i, : len(ex.target)] = ex.target
    return batch, targets


def check_rows(checkpoint: Checkpoint, examples: Sequence[Example]) -> None:
    """Refuse, naming the line, any example whose options do not all fit the model's row."""
    for start in range(0, len(examples), 256):
        batch_of(checkpoint, examples[start : start + 256])
