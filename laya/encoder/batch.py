"""Rows padded into the five arrays every runtime takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from laya.encoder.head_layout import MASKED_LOGIT
from laya.encoder.rows import Row

# row i, its token count n and option count k -> its k option logits and its act logits
RowAnswer = Callable[[int, int, int], "tuple[np.ndarray, np.ndarray]"]


@dataclass(frozen=True)
class Batch:
    """`input_ids`/`attention_mask` [N, L] int64, `marker_pos`/`marker_mask` [N, K], `qtype` [N]."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    marker_pos: np.ndarray
    marker_mask: np.ndarray
    qtype: np.ndarray

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def n_markers(self) -> int:
        return int(self.marker_pos.shape[1])

    def take(self, rows: list[int]) -> Batch:
        """The given rows, trimmed to their own longest row and marker count."""
        n = int(self.attention_mask[rows].sum(-1).max())
        k = int(self.marker_mask[rows].sum(-1).max())
        return Batch(input_ids=self.input_ids[rows, :n], attention_mask=self.attention_mask[rows, :n],
                     marker_pos=self.marker_pos[rows, :k], marker_mask=self.marker_mask[rows, :k],
                     qtype=self.qtype[rows])

    def per_row(self, answer: RowAnswer) -> tuple[np.ndarray, np.ndarray]:
        """Answers made one row at a time, each from its own unpadded tokens, so that no row's answer
        depends on what shares its batch: option logits [N, K] (MASKED_LOGIT past a row's options) and
        act logits [N, n_act]."""
        lengths, counts = self.attention_mask.sum(1), self.marker_mask.sum(1)
        logits = np.full(self.marker_mask.shape, MASKED_LOGIT, dtype=np.float32)
        acts = []
        for i in range(self.size):
            n, k = int(lengths[i]), int(counts[i])
            logits[i, :k], act = answer(i, n, k)
            acts.append(act)
        return logits, np.stack(acts).astype(np.float32, copy=False)


LENGTH_STEP = 32


def padded_length(n_tokens: int, step: int = LENGTH_STEP) -> int:
    """The length a row of `n_tokens` is always padded to.

    Attention kernels block their work by the padded length, so a row padded to different lengths
    can differ in the last bits. Padding every row to its own canonical bucket (and batching rows
    of one bucket together) makes a row's answer independent of what shares its batch.
    """
    return -(-n_tokens // step) * step


def collate(rows: list[Row], pad_id: int, length: int | None = None) -> Batch:
    """Pad `rows` to the longest (or to `length`, for runtimes with fixed shapes). Each array is
    built in one go from padded Python lists: per-row slice assignments into preallocated arrays
    were a dozen numpy calls for two rows, ~0.15 ms where the code runs cold."""
    if not rows:
        raise ValueError("collate needs at least one row")
    longest = max(len(r.ids) for r in rows)
    n_len = longest if length is None else length
    if n_len < longest:
        raise ValueError(f"a row of {longest} tokens does not fit a batch of length {n_len}")
    k = max(len(r.markers) for r in rows)
    ids, att, pos, mask = [], [], [], []
    for row in rows:
        n, m = len(row.ids), len(row.markers)
        ids.append([*row.ids, *[pad_id] * (n_len - n)])
        att.append([1] * n + [0] * (n_len - n))
        pos.append([*row.markers, *[0] * (k - m)])
        mask.append([True] * m + [False] * (k - m))
    return Batch(input_ids=np.array(ids, dtype=np.int64), attention_mask=np.array(att, dtype=np.int64),
                 marker_pos=np.array(pos, dtype=np.int64), marker_mask=np.array(mask, dtype=bool),
                 qtype=np.array([r.qtype for r in rows], dtype=np.int64))
