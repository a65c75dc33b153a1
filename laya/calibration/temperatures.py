"""Bucketed temperatures: which T divides a question's logits.

The key is `"<type>:<bucket>"` with buckets by option count (`2`, `3-5`, `6-10`, `11+`); a bucket
temperature wins over the per-type one. Every value is clamped to [0.5, 5.0] at load: the English
checkpoint ships `choice:11+ = 0.1006`, a 10x sharpener that would publish a coin flip as a
certainty. A value that is not a number becomes 1.0, with a warning naming it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laya.questions import QTYPES

T_MIN = 0.5
T_MAX = 5.0
BUCKETS = ("2", "3-5", "6-10", "11+")


def bucket_of(n_options: int) -> str:
    if n_options <= 2:
        return "2"
    if n_options <= 5:
        return "3-5"
    if n_options <= 10:
        return "6-10"
    return "11+"


def bucket_key(qtype: str, n_options: int) -> str:
    return f"{qtype}:{bucket_of(n_options)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def clamp(value: Any) -> float:
    """A usable temperature: numbers confined to [T_MIN, T_MAX]; anything else 1.0."""
    if not _is_number(value):
        return 1.0
    return min(T_MAX, max(T_MIN, float(value)))


@dataclass(frozen=True)
class Temperatures:
    per_type: tuple[float, float, float] = (1.0, 1.0, 1.0)
    by_bucket: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, per_type: Sequence[Any], by_bucket: Mapping[str, Any], source: str) -> Temperatures:
        """Clamp raw values, warning once about every value that was replaced or moved."""
        entries = [(f"temperature[{i}]", raw) for i, raw in enumerate(per_type)]
        entries += [(str(k), v) for k, v in by_bucket.items()]
        changed = [
            f"{name}={raw!r} -> {clamp(raw):g}"
            for name, raw in entries
            if not _is_number(raw) or float(raw) != clamp(raw)
        ]
        if changed:
            warnings.warn(
                f"laya: {source} has temperatures that are not numbers or lie outside [{T_MIN}, {T_MAX}]; "
                f"using {', '.join(changed)}",
                RuntimeWarning,
                stacklevel=3,
            )
        return cls(
            per_type=tuple(clamp(t) for t in per_type),  # type: ignore[arg-type]
            by_bucket={str(k): clamp(v) for k, v in by_bucket.items()},
        )

    def for_question(self, qtype: str, n_options: int) -> float:
        return self.by_bucket.get(bucket_key(qtype, n_options), self.per_type[QTYPES.index(qtype)])

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": list(self.per_type), "temperature_by_options": dict(self.by_bucket)}
