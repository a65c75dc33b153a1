"""Upstream laya's calibration files (0.4.15, `Agent.save_calibration` / `load_calibration`), read and
written so they apply here exactly as upstream applies them.

The file is the whole calibration state, not a patch: `temperature` ([choice, score, noul]) and
`temperature_by_options` replace the model's own entirely (each value clamped to [0.5, 5], a value
that is not a number read as 1.0, with a warning), and `binning_map` (per bucket, `bins` equal-width
bins over [0, 1] and the recalibrated value of each) rewrites an answer's top probability
(`x_answer_confidence`, what `min_confidence` gates and a scan ranks windows by), never its
probabilities. A file with no version is version 1; version 2 names the checkpoint it was fitted on
(`model_id_or_path`, `subfolder`, `config` without its temperatures), and a mismatch warns but loads.
Malformed files are refused naming the field, in upstream's words.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from laya.calibration.temperatures import Temperatures, bucket_key
from laya.errors import CheckpointError
from laya.questions import QTYPES

VERSION = 2
BINS = 15
MIN_BINNING_BUCKET = 200
IDENTITY_SKIP = ("temperature", "temperature_by_options")

Binning = dict[str, tuple[float, ...]]


def is_upstream(data: Any) -> bool:
    """Ours say `"format"`; a file with a `temperature` and no format, or not an object at all, is read
    (and, when malformed, refused) in upstream's words."""
    return not isinstance(data, dict) or ("format" not in data and "temperature" in data)


def _number_or_raw(value: Any) -> Any:
    """What upstream's clamp reads: anything `float()` takes (a numeric string too), bools excepted."""
    if isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return value


def _version(data: dict[str, Any], where: str) -> int:
    version = data.get("version", 1)
    if version is None:
        return 1
    bad = CheckpointError(f"{where}: calibration JSON version must be an integer, got {version!r}"[:400])
    if isinstance(version, bool) or not isinstance(version, int | float | str):
        raise bad
    if isinstance(version, float) and not version.is_integer():
        raise bad
    try:
        return int(version)
    except (TypeError, ValueError, OverflowError) as exc:
        raise bad from exc


def _binning(raw: Any, where: str) -> Binning | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: calibration JSON binning_map must be an object of bucket -> "
                              f"{{bins, values}}, got {type(raw).__name__}")
    out: Binning = {}
    for name, entry in raw.items():
        label = f"{where}: calibration JSON binning_map[{str(name)[:80]!r}]"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{label} must be an object with \"bins\" and \"values\", got {type(entry).__name__}")
        bins, values = entry.get("bins"), entry.get("values")
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise CheckpointError(f"{label} must have an integer \"bins\" >= 1, got {bins!r}"[:400])
        if not isinstance(values, list | tuple) or len(values) != bins:
            raise CheckpointError(f"{label} must have \"values\" of length \"bins\" ({bins})")
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
            raise CheckpointError(f"{label} values must be numbers, got {values!r}"[:400])
        if not all(math.isfinite(v) for v in values):
            raise CheckpointError(f"{label} values must be finite, got {values!r}"[:400])
        if not all(0.0 <= v <= 1.0 for v in values):
            raise CheckpointError(f"{label} values must be in [0, 1], got {values!r}"[:400])
        out[str(name)] = tuple(float(v) for v in values)
    return out


def read(data: Any, where: str) -> tuple[Temperatures, Binning | None, dict[str, Any] | None]:
    """(the temperatures, the binning map, the recorded identity when version >= 2) of a file's JSON."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: calibration JSON must be an object, got {type(data).__name__}")
    version = _version(data, where)
    temps = data.get("temperature")
    if not isinstance(temps, list | tuple) or len(temps) != len(QTYPES):
        raise CheckpointError(f"{where}: calibration JSON must contain temperature: [3 floats]")
    by_options = data.get("temperature_by_options")
    if by_options is None:
        by_options = {}
    if not isinstance(by_options, dict):
        raise CheckpointError(f"{where}: calibration JSON temperature_by_options must be an object of bucket -> "
                              f"float, got {type(by_options).__name__}")
    binning = _binning(data.get("binning_map"), where)
    temperatures = Temperatures.from_raw([_number_or_raw(t) for t in temps],
                                         {str(k): _number_or_raw(v) for k, v in by_options.items()}, source=where)
    identity = None
    if version >= VERSION:
        identity = {k: data.get(k) for k in ("model_id_or_path", "subfolder", "config")}
    return temperatures, binning, identity


def config_identity(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    return {str(k): config[k] for k in config if k not in IDENTITY_SKIP}


def check_identity(identity: dict[str, Any] | None, model_id_or_path: str | None, subfolder: str | None,
                   config: Mapping[str, Any] | None) -> None:
    """Upstream's warning when a file names another checkpoint than the one it is loaded on."""
    if identity is None:
        return
    current = (model_id_or_path, subfolder, config_identity(config))
    recorded = (identity.get("model_id_or_path"), identity.get("subfolder"), identity.get("config"))
    if recorded == current:
        return
    note = " Checkpoint config identity differs." if recorded[2] != current[2] else ""
    warnings.warn(f"calibration was fitted for model_id_or_path={recorded[0]!r} subfolder={recorded[1]!r} but this "
                  f"model is model_id_or_path={current[0]!r} subfolder={current[1]!r}.{note} Loading the "
                  "temperatures anyway.", UserWarning, stacklevel=4)


def apply_binning(confidence: float, bucket: str, binning: Binning) -> float:
    """A top probability recalibrated by its bucket's bins (a bucket with no entry passes through)."""
    values = binning.get(bucket)
    if not values:
        return float(confidence)
    bins = len(values)
    return values[min(bins - 1, max(0, int(float(confidence) * bins)))]


def fit_binning(samples: Sequence[Any], temperatures: Temperatures, bins: int = BINS,
                min_bucket: int = MIN_BINNING_BUCKET) -> dict[str, dict[str, Any]]:
    """Upstream's histogram binning over labelled evidence: per bucket with at least `min_bucket`
    answers, each of `bins` equal-width bins of the calibrated top probability maps to the share of
    right answers in it (an empty bin to its centre)."""
    by_bucket: dict[str, list[tuple[float, int]]] = {}
    for s in samples:
        ev = s.evidence
        p = ev.probabilities(max(1e-3, temperatures.for_question(ev.qtype, ev.n_options)))
        by_bucket.setdefault(bucket_key(ev.qtype, ev.n_options), []).append(
            (float(np.max(p)), int(int(np.argmax(p)) == s.label)))
    out: dict[str, dict[str, Any]] = {}
    for key, pairs in by_bucket.items():
        if len(pairs) < min_bucket:
            continue
        conf = np.asarray([c for c, _ in pairs], dtype=float)
        right = np.asarray([r for _, r in pairs], dtype=float)
        idx = np.clip((conf * bins).astype(int), 0, bins - 1)
        out[key] = {"bins": bins, "values": [float(right[idx == b].mean()) if (idx == b).any() else (b + 0.5) / bins
                                              for b in range(bins)]}
    return out


def payload(temperatures: Temperatures, *, model_id_or_path: str | None, subfolder: str | None,
            config: Mapping[str, Any] | None, binning: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"version": VERSION, "temperature": [float(t) for t in temperatures.per_type],
                           "temperature_by_options": {str(k): float(v) for k, v in temperatures.by_bucket.items()},
                           "model_id_or_path": model_id_or_path, "subfolder": subfolder,
                           "config": config_identity(config)}
    if binning is not None:
        out["binning_map"] = binning
    return out


def save(path: str | os.PathLike, body: dict[str, Any]) -> None:
    """Written as upstream writes it (indent 2, a final newline), atomically, keeping the file's mode."""
    destination = os.path.realpath(path)
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(destination), prefix=".calibration.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(body, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        if Path(destination).exists():
            os.chmod(temporary, os.stat(destination).st_mode & 0o777)
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
