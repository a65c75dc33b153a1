"""The sha256 of a file, read in blocks: the one digest both wings name their artifacts by (a checkpoint's
weights, a GGUF), so a calibration file or a provenance record can say exactly what it belongs to."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def digest_tree(path: Path) -> str:
    """A file's sha256, or for a folder (a tokenizer's, a bundle's) the sha256 of its files' relative
    names and digests in order: one figure that changes when any file in it does."""
    if path.is_file():
        return sha256_of(path)
    listing = hashlib.sha256()
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        listing.update(f"{item.relative_to(path).as_posix()}\t{sha256_of(item)}\n".encode())
    return listing.hexdigest()


def digests_of(files: Mapping[str, Path]) -> dict[str, str]:
    """The sha256 of each artifact that answers, by its role (weights, config, tokenizer, gguf,
    calibration): what `/v1/models` publishes so an operator can tell exactly what is loaded."""
    return {role: digest_tree(path) for role, path in files.items() if path.exists()}


def short_digest(digests: Mapping[str, str]) -> str:
    """Twelve hex digits naming the whole set (roles and digests): the model digest an answer carries."""
    joined = "".join(f"{role}={value}\n" for role, value in sorted(digests.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:12] if digests else ""
