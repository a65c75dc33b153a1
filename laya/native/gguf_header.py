"""The scalar metadata of a GGUF file, read from its header without loading it: what the decide
engine needs before it sizes a llama.cpp context (the context the model was trained for, the shape
of its key/value cache). Arrays (the tokenizer's vocabulary) are skipped, not read."""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from laya.errors import CheckpointError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_KEYS = 1 << 16


def read_scalars(path: str | os.PathLike) -> dict[str, Any]:
    """Every scalar key of the header (numbers, booleans, strings); a file that is not a GGUF
    raises `CheckpointError`."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(data)
    except (OSError, ValueError, struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable GGUF header ({exc})") from exc


def _parse(data: Any) -> dict[str, Any]:
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version < 2 or n_kv > MAX_KEYS:
        raise ValueError(f"unsupported header (version {version}, {n_kv} keys)")
    at, out = 24, {}

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", data, at)
        return bytes(data[at + 8 : at + 8 + n]).decode("utf-8"), at + 8 + n

    def skip(kind: int, at: int) -> int:
        if kind in _SCALARS:
            return at + struct.calcsize(_SCALARS[kind])
        if kind == STRING:
            (n,) = struct.unpack_from("<Q", data, at)
            return at + 8 + n
        if kind == ARRAY:
            inner, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if inner in _SCALARS:
                return at + count * struct.calcsize(_SCALARS[inner])
            for _ in range(count):
                at = skip(inner, at)
            return at
        raise ValueError(f"unknown value type {kind}")

    for _ in range(n_kv):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        if kind in _SCALARS:
            (out[key],) = struct.unpack_from(_SCALARS[kind], data, at)
        elif kind == STRING:
            out[key], _ = string(at)
        at = skip(kind, at)
    return out
