"""A job's stop signal: its caller went away, or its deadline passed.

Engines check `job.cancelled.is_set()` between forward passes (encoder) and between decisions
(decide). Folding the deadline into that same check means a request that ran out of time stops
costing work at the next boundary wherever it runs (in the HTTP process, an engine process, a Ray
replica), without a message having to reach it first.
"""

from __future__ import annotations

import time


class StopFlag:
    """`threading.Event`'s `set`/`is_set`, plus a deadline on `time.monotonic()` (None: none)."""

    __slots__ = ("_set", "deadline")

    def __init__(self, deadline: float | None = None):
        self._set = False
        self.deadline = deadline

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set or self.expired

    @property
    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline); negative once it has passed."""
        return None if self.deadline is None else self.deadline - time.monotonic()


def after(seconds: float | None) -> float | None:
    """The monotonic deadline `seconds` from now (None stays None): deadlines cross process
    boundaries as seconds left, since another host's monotonic clock is not ours."""
    return None if seconds is None else time.monotonic() + seconds
