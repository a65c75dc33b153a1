"""Fitting temperatures by minimising the negative log-likelihood of labelled answers.

One temperature per question type, then one per option-count bucket (`choice:3-5`, ...) where the
bucket has at least `min_bucket` training answers; a smaller bucket keeps its type's value. Every
fitted value lies in the format's [0.5, 5.0] (the search never leaves it). For a single readout the
NLL is convex in 1/T; the decide engine averages two readouts for yes/no, so the search is a
coarse grid followed by golden-section refinement, which needs no convexity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from laya.calibration.evidence import Evidence
from laya.calibration.temperatures import T_MAX, T_MIN, bucket_key
from laya.questions import QTYPES

# A bucket gets its own temperature only with at least this many training answers.
MIN_BUCKET_SAMPLES = 100
# A type gets a fitted temperature only with at least this many; otherwise it keeps the model's own.
MIN_TYPE_SAMPLES = 30


@dataclass(frozen=True)
class Labelled:
    evidence: Evidence
    label: int  # index of the right option


@dataclass
class FitResult:
    per_type: dict[str, float] = field(default_factory=dict)
    by_bucket: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # training answers per type and per bucket
    skipped: dict[str, int] = field(default_factory=dict)  # buckets/types left unfitted: their counts


class _Objective:
    """Mean NLL of samples as a function of T. Single-readout samples (every encoder answer, most
    decide answers) are evaluated together as one padded matrix; the rest one by one."""

    def __init__(self, samples: Sequence[Labelled]):
        simple = [s for s in samples if len(s.evidence.readouts) == 1]
        self.rest = [s for s in samples if len(s.evidence.readouts) != 1]
        self.n = len(samples)
        width = max((s.evidence.n_options for s in simple), default=1)
        self.z = np.full((len(simple), width), -np.inf)
        self.label = np.zeros(len(simple), dtype=np.int64)
        for i, s in enumerate(simple):
            keys, z = s.evidence.readouts[0]
            self.z[i, list(keys)] = z
            self.label[i] = s.label
        self.z -= self.z.max(axis=1, keepdims=True)
        self.z_true = self.z[np.arange(len(simple)), self.label]

    def __call__(self, temperature: float) -> float:
        total = 0.0
        if len(self.z):
            scaled = self.z / temperature
            total += float(np.sum(np.log(np.exp(scaled).sum(axis=1)) - self.z_true / temperature))
        for s in self.rest:
            total -= math.log(max(s.evidence.probabilities(temperature)[s.label], 1e-300))
        return total / self.n


def fit_temperature(samples: Sequence[Labelled], *, grid: int = 24, tol: float = 1e-5) -> float:
    """The T in [T_MIN, T_MAX] minimising the mean NLL of `samples`."""
    if not samples:
        raise ValueError("fit_temperature needs at least one labelled answer")
    objective = _Objective(samples)
    lo, hi = math.log(T_MIN), math.log(T_MAX)
    xs = np.linspace(lo, hi, grid)
    values = [objective(math.exp(x)) for x in xs]
    best = int(np.argmin(values))
    a, b = xs[max(0, best - 1)], xs[min(grid - 1, best + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = objective(math.exp(c)), objective(math.exp(d))
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = objective(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = objective(math.exp(d))
    x = (a + b) / 2
    return float(min(T_MAX, max(T_MIN, math.exp(x))))


def fit_temperatures(samples: Sequence[Labelled], *, buckets: bool = True,
                     min_bucket: int = MIN_BUCKET_SAMPLES, min_type: int = MIN_TYPE_SAMPLES) -> FitResult:
    """Per type, then per bucket (if `buckets`) where there are enough samples."""
    result = FitResult()
    for qtype in QTYPES:
        group = [s for s in samples if s.evidence.qtype == qtype]
        if not group:
            continue
        result.counts[qtype] = len(group)
        if len(group) >= min_type:
            result.per_type[qtype] = fit_temperature(group)
        else:
            result.skipped[qtype] = len(group)
        if not buckets:
            continue
        keys = sorted({bucket_key(qtype, s.evidence.n_options) for s in group})
        for key in keys:
            members = [s for s in group if bucket_key(qtype, s.evidence.n_options) == key]
            result.counts[key] = len(members)
            if len(members) >= min_bucket:
                result.by_bucket[key] = fit_temperature(members)
            else:
                result.skipped[key] = len(members)
    return result
