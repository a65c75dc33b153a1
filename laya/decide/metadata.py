"""Which readout profile reads a GGUF, and with what temperature.

A decision-trained model ships saying how it is read (seed 001: "The metadata JSON that ships with a
model names the profile"), so that is where the choice comes from first; the operator can override it:

1. `--readout NAME` or `-m name=path.gguf:NAME` (`laya serve`, `laya predict`);
2. a metadata JSON beside the file: `<file stem>.json` (`decider-0.8b-q8_0.gguf` ->
   `decider-0.8b-q8_0.json`), as dohnuts' `--metadata` files are written (`"profile": "decider"`,
   `"temperature": 1.03`), or our own key `"readout"`; else decider's own `decider_config.json` in the
   same folder (its `"temperature"` and `"temperature_by_type"`; read at its answer slot);
3. keys in the GGUF itself: `laya.readout` and `laya.readout.temperature`;
4. else `first-token`, the readout of an ordinary chat model.

Profile names of the other engines are taken as ours (`decider` is read at its answer slot, `hmm` by
letters). The temperature belongs to the profile it came with: an override to another profile drops it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya.decide.profiles import PROFILES
from laya.errors import CheckpointError

GGUF_READOUT, GGUF_TEMPERATURE = "laya.readout", "laya.readout.temperature"
# the profile names other engines ship in their metadata, as the profile that reads them
ALIASES = {"decider": "answer-slot", "hmm": "letters", "pcd": "json-field", "pcdserver": "json-field",
           "first_token": "first-token", "answer_slot": "answer-slot", "json_field": "json-field"}
MAX_METADATA_BYTES = 1 << 20


DECIDER_CONFIG = "decider_config.json"
QTYPES = ("choice", "score", "noul")


@dataclass(frozen=True)
class ReadoutChoice:
    name: str
    # the model's own temperature per question type (None: 1.0 unless a calibration says otherwise)
    temperatures: dict[str, float] | None = None
    source: str = "default"  # "--readout", the metadata JSON's file name, "GGUF metadata" or "default"


def profile_name(value: object, where: str) -> str:
    """`value` as one of PROFILES (accepting the other engines' names), or a CheckpointError naming `where`."""
    text = str(value).strip().lower() if isinstance(value, str) else ""
    name = ALIASES.get(text, text)
    if name not in PROFILES:
        raise CheckpointError(f"{where}: readout {str(value)[:80]!r} is none of {', '.join(PROFILES)} "
                              f"(or {', '.join(sorted(ALIASES))})")
    return name


def _temperature(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"{where}: temperature must be a positive number, got {str(value)[:40]!r}")
    return float(value)


def _temperatures(data: Mapping[str, Any], where: str) -> dict[str, float] | None:
    """`temperature` for every type, `temperature_by_type` over it."""
    base = _temperature(data.get("temperature"), where)
    by_type = data.get("temperature_by_type")
    if by_type is not None and not isinstance(by_type, dict):
        raise CheckpointError(f"{where}: temperature_by_type must map question types to numbers")
    out: dict[str, Any] = {q: base for q in QTYPES} if base is not None else {}
    for qtype, value in (by_type or {}).items():
        if qtype not in QTYPES:
            raise CheckpointError(f"{where}: temperature_by_type names {str(qtype)[:40]!r}, not one of {QTYPES}")
        out[qtype] = _temperature(value, where)
    return {q: out.get(q, 1.0) for q in QTYPES} if out else None


def metadata_path(gguf: str | os.PathLike) -> Path:
    path = Path(gguf)
    return path.with_name(path.stem + ".json")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{path}: a model's metadata JSON is at most {MAX_METADATA_BYTES} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON object ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: the metadata must be a JSON object")
    return data


def choose_readout(gguf: str | os.PathLike, gguf_metadata: Mapping[str, Any], override: str | None = None
                   ) -> ReadoutChoice:
    """The readout of the GGUF at `gguf` (its metadata read once, at load)."""
    found: ReadoutChoice | None = None
    path = metadata_path(gguf)
    data = _read_json(path)
    decider = Path(gguf).with_name(DECIDER_CONFIG)
    if data is not None and ("readout" in data or "profile" in data):
        key = "readout" if "readout" in data else "profile"
        found = ReadoutChoice(profile_name(data[key], f"{path} ({key})"), _temperatures(data, str(path)), path.name)
    elif (config := _read_json(decider)) is not None:
        found = ReadoutChoice("answer-slot", _temperatures(config, str(decider)), DECIDER_CONFIG)
    elif GGUF_READOUT in gguf_metadata:
        where = f"{gguf} ({GGUF_READOUT})"
        raw_t = gguf_metadata.get(GGUF_TEMPERATURE)
        try:
            t = float(raw_t) if isinstance(raw_t, str) else raw_t
        except ValueError:
            t = raw_t
        found = ReadoutChoice(profile_name(gguf_metadata[GGUF_READOUT], where),
                              _temperatures({"temperature": t}, where), "GGUF metadata")
    if override is not None:
        name = profile_name(override, "--readout")
        return ReadoutChoice(name, found.temperatures if found and found.name == name else None, "--readout")
    return found or ReadoutChoice("first-token")
