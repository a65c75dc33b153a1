"""The calibration file `laya calibrate` writes and `laya.load(..., calibration=)` applies.

It sits beside a model and never rewrites it. Its temperatures replace the model's own for every
question type it fitted (that type's bucket values included: they were fitted to other data); types it
did not fit keep the model's values. It names the model it was fitted on (the checkpoint's
fingerprint, or the GGUF file's sha256) and is refused on any other model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from laya.calibration.abstention import Abstention
from laya.calibration.conformal import ConformalSets
from laya.calibration.risk import RiskRule
from laya.calibration.signal import Signal, features
from laya.calibration.temperatures import Temperatures, clamp
from laya.errors import CheckpointError
from laya.questions import QTYPES

FORMAT = "laya-calibration"
VERSION = 1


@dataclass(frozen=True)
class Calibration:
    model: str  # the fingerprint of what it was fitted on
    temperature: dict[str, float]  # per question type
    temperature_by_options: dict[str, float] = field(default_factory=dict)
    abstention: Abstention | None = None
    fitted: dict[str, Any] = field(default_factory=dict)  # data, split, seed, counts: for people
    path: str = ""
    # an upstream file (laya.calibration.upstream): the whole temperature state, its binning map, and
    # the checkpoint it names (version 2), checked with a warning rather than refused
    whole: Temperatures | None = None
    binning: dict[str, tuple[float, ...]] | None = None
    identity: dict[str, Any] | None = None
    # optional (a file without them loads as before): prediction sets, the error-bound rule, its signal
    conformal: ConformalSets | None = None
    risk: RiskRule | None = None
    signal: Signal | None = None

    def extras(self, keys: Sequence[str], qtype: str, p: Any, act: float | None) -> dict[str, Any]:
        """The `x_` fields this file adds to one answer from its calibrated probabilities `p`:
        `x_set` (conformal), `x_abstain` / `x_threshold` (target precision), and from the error-bound
        rule `x_abstain` (either rule abstaining), `x_abstain_rule` (the rule that did) and `x_signal`."""
        out: dict[str, Any] = {}
        if self.conformal is not None:
            out |= self.conformal.extras(keys, qtype, p)
        if self.abstention is not None:
            out |= self.abstention.extras(qtype, len(p), np.asarray(p))
            if out["x_abstain"]:
                out["x_abstain_rule"] = f"target_precision {self.abstention.target_precision:g}"
        if self.risk is not None:
            signal = self.signal or Signal(self.risk.signal)
            feats = features(p, act)
            if all(name in feats for name in signal.needs()):
                value = signal.value(feats)
                out["x_signal"] = value
                if self.risk.abstains(value):
                    out["x_abstain"] = True
                    out["x_abstain_rule"] = self.risk.name
                out.setdefault("x_abstain", False)
        return out

    def over(self, base: Temperatures) -> Temperatures:
        """`base` with this file's fitted types replaced (an upstream file replaces everything)."""
        if self.whole is not None:
            return self.whole
        per_type = tuple(self.temperature.get(q, base.per_type[i]) for i, q in enumerate(QTYPES))
        kept = {k: v for k, v in base.by_bucket.items() if k.split(":")[0] not in self.temperature}
        return Temperatures(per_type=per_type, by_bucket=kept | dict(self.temperature_by_options))  # type: ignore[arg-type]

    def check_model(self, fingerprint: str, what: str) -> None:
        if self.model and fingerprint and self.model != fingerprint:
            raise CheckpointError(f"{self.path}: this calibration was fitted on another model than {what} "
                                  f"(fitted on {self.model[:16]}..., this one is {fingerprint[:16]}...)")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "version": VERSION, "model": self.model,
                               "temperature": dict(self.temperature),
                               "temperature_by_options": dict(self.temperature_by_options)}
        if self.abstention is not None:
            out["abstention"] = self.abstention.to_dict()
        for key, part in (("conformal", self.conformal), ("risk", self.risk), ("signal", self.signal)):
            if part is not None:
                out[key] = part.to_dict()
        out["fitted"] = self.fitted
        return out

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_calibration(path: str | os.PathLike) -> Calibration:
    where = os.fspath(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot read the calibration file ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{where}: not a JSON calibration file ({exc})") from exc
    from laya.calibration import upstream

    if upstream.is_upstream(data):
        whole, binning, identity = upstream.read(data, where)
        return Calibration(model="", temperature={}, path=where, whole=whole, binning=binning, identity=identity)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not a laya calibration file (no \"format\": \"{FORMAT}\") nor an upstream "
                              "laya one (a \"temperature\" list)")
    if data.get("version") != VERSION:
        raise CheckpointError(f"{where}: calibration version {data.get('version')!r} is not supported ({VERSION})")

    def temps(key: str, allowed) -> dict[str, float]:
        raw = data.get(key) or {}
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: {key} must be an object")
        out = {}
        for name, value in raw.items():
            if not allowed(name):
                raise CheckpointError(f"{where}: {key} has an unknown key {name!r}")
            if isinstance(value, bool) or not isinstance(value, int | float) or clamp(value) != value:
                raise CheckpointError(f"{where}: {key}[{name!r}] = {value!r} is not a temperature in [0.5, 5]")
            out[str(name)] = float(value)
        return out

    from laya.calibration.temperatures import BUCKETS

    per_type = temps("temperature", lambda k: k in QTYPES)
    by_bucket = temps("temperature_by_options",
                      lambda k: isinstance(k, str) and k.partition(":")[0] in QTYPES and k.partition(":")[2] in BUCKETS)
    def part(key: str, kind: Any) -> Any:
        try:
            return None if data.get(key) is None else kind.from_dict(data[key], where)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from exc

    return Calibration(model=str(data.get("model") or ""), temperature=per_type, temperature_by_options=by_bucket,
                       abstention=part("abstention", Abstention), fitted=dict(data.get("fitted") or {}), path=where,
                       conformal=part("conformal", ConformalSets), risk=part("risk", RiskRule),
                       signal=part("signal", Signal))
