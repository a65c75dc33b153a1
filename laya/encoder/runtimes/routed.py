"""Rows split between two runtimes: Core ML's Neural Engine programs for the rows that fit them, another
runtime (MLX on Apple silicon) for the rest, each part in one call. What `runtime="auto"` runs on a
Mac with both installed; also built elsewhere from the Core ML torch executor to test the routing."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from laya.encoder.batch import Batch
from laya.encoder.head_layout import MASKED_LOGIT
from laya.encoder.runtimes.base import Compact, Runtime, RuntimeBase

if TYPE_CHECKING:
    from laya.encoder.runtimes.coreml import CoremlRuntime


class RoutedRuntime(RuntimeBase):
    """Each row to the Neural Engine program it fits, else to `rest`; answers in the batch's order."""

    def __init__(self, neural_engine: CoremlRuntime, rest: Runtime):
        self.neural_engine, self.rest = neural_engine, rest
        self.name = f"{neural_engine.name}+{rest.name}"
        self.precision = f"{neural_engine.precision}+{rest.precision}"
        self.routed = {"neural_engine": 0, "rest": 0}
        self.gate = rest.info().gate

    def compact(self) -> Compact | None:
        return self.neural_engine.compact()

    def fits(self, n_tokens: int, n_markers: int) -> bool:
        return self.neural_engine.bucket_for(n_tokens, n_markers) is not None

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        tokens, markers = batch.attention_mask.sum(-1), batch.marker_mask.sum(-1)
        ane = [i for i in range(batch.size) if self.fits(int(tokens[i]), int(markers[i]))]
        rest = [i for i in range(batch.size) if i not in set(ane)]
        logits = np.full(batch.marker_pos.shape, MASKED_LOGIT, dtype=np.float32)
        acts: list[np.ndarray | None] = [None] * batch.size
        for rows, runtime, kind in ((ane, self.neural_engine, "neural_engine"), (rest, self.rest, "rest")):
            if not rows:
                continue
            part_logits, part_acts = runtime.forward(batch.take(rows))
            for j, i in enumerate(rows):
                k = int(markers[i])
                logits[i, :k] = part_logits[j, :k]
                acts[i] = part_acts[j]
            self.routed[kind] += len(rows)
        return logits, np.stack(cast(list[np.ndarray], acts)).astype(np.float32)  # every row answered
