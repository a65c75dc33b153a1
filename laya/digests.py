"""The sha256 of a file, read in blocks: the one digest both wings name their artifacts by (a checkpoint's
weights, a GGUF), so a calibration file or a provenance record can say exactly what it belongs to."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
