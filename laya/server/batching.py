"""One batching policy for every way a model is served: in this process (`MicroBatcher`), in the engine
process (`laya serve`'s default) and in a Ray replica.

What queued while the engine was busy runs together in one forward pass, up to `max_rows` rows and, where
a budget is set, `max_tokens` tokens (a GPU's pass fills on tokens, not rows); with `max_wait_ms` > 0 a
batch waits that long for company, else what is waiting goes at once. A batch always takes its first job,
whatever its size (the per-request limits bound it), and a job joins while the batch is under both
budgets, so the last one to join may take it over. `laya serve`'s `--max-batch-rows`, `--max-batch-tokens`
and `--max-wait-ms` are these three fields in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Batching:
    max_rows: int = 64
    max_wait_ms: float = 0.0
    max_tokens: int | None = None  # None: rows only

    def has_room(self, rows: int, tokens: int) -> bool:
        """Whether a batch holding `rows` rows and `tokens` tokens takes one more job."""
        return rows < self.max_rows and (self.max_tokens is None or tokens < self.max_tokens)

    @property
    def wait_s(self) -> float:
        return self.max_wait_ms / 1000.0


def tokens_of(job: Any) -> int:
    """The tokens a job's rows read (0 where its engine does not count them ahead: a chat model's)."""
    return int(getattr(job, "n_tokens", 0) or 0)
