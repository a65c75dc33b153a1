"""Arithmetic on the few floats of one decision, done as numpy does it.

On a vector of a handful of values, each numpy call costs far more than its arithmetic (and code runs
cold after every timer tick on a shared VM), so decoding works on plain floats. Where numpy's result
depends on its order of operations (its pairwise summation), the same order is kept here, so the
answers keep their bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_UNROLL, _BLOCK = 8, 128  # numpy's pairwise summation: 8 partial sums, blocks of 128


def pairwise_sum(values: Sequence[float]) -> float:
    """The sum of `values` in the order numpy's `sum` adds a float64 vector (so the two agree to the
    bit): one by one below 8, eight partial sums within a block of 128, halves above."""
    n = len(values)
    if n < _UNROLL:
        total = 0.0
        for v in values:
            total += v
        return total
    if n <= _BLOCK:
        r = list(values[:_UNROLL])
        end = n - n % _UNROLL
        for i in range(_UNROLL, end, _UNROLL):
            for j in range(_UNROLL):
                r[j] += values[i + j]
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for v in values[end:]:
            total += v
        return total
    half = n // 2
    half -= half % _UNROLL
    return pairwise_sum(values[:half]) + pairwise_sum(values[half:])


def floats(z: Any) -> list[float]:
    """A vector (numpy or a sequence) as a list of Python floats, float32 values widened exactly."""
    return z.tolist() if isinstance(z, np.ndarray) else [float(v) for v in z]
