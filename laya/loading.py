"""`laya.load`: from a name, a folder or a Hub id to a ready `Model`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from laya.bundle import is_bundle, read_manifest
from laya.checkpoint import WEIGHTS_FILE, Checkpoint, download, load_checkpoint
from laya.errors import CheckpointError
from laya.models.registry import lookup


def resolve(
    model: str | os.PathLike, *, revision: str | None = None, subfolder: str | None = None,
    sha256: str | Mapping[str, str] | None = None, local_only: bool = False,
) -> tuple[Path, dict[str, str], str]:
    """Folder, digests to check and display name for `model`, downloading from the Hub if needed."""
    digests: dict[str, str] = {}
    if isinstance(sha256, str):
        digests[WEIGHTS_FILE] = sha256
    elif sha256:
        digests.update(sha256)
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.exists():
        folder = path / subfolder if subfolder else path
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: not a checkpoint folder")
        return folder, digests, folder.resolve().name
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise CheckpointError(f"{text}: no such checkpoint folder")
    entry = lookup(text)
    if entry is not None:
        digests.setdefault(WEIGHTS_FILE, entry.weights_sha256)
        folder = download(entry.repo, revision=revision or entry.revision, subfolder=subfolder or entry.subfolder,
                          local_only=local_only)
        return folder, digests, entry.name
    if text.count("/") == 1 and all(text.split("/")):
        folder = download(text, revision=revision, subfolder=subfolder, local_only=local_only)
        name = text.split("/")[1] + (f"-{subfolder.strip('/').replace('/', '-')}" if subfolder else "")
        return folder, digests, name
    raise CheckpointError(
        f"{text!r} is not a checkpoint folder, a registered model (laya, laya-multilingual, "
        "laya-typed-decisions) or a Hub id (owner/name)"
    )


def load_model_checkpoint(model: str | os.PathLike, **kwargs: Any) -> tuple[Checkpoint, str, str | None]:
    """The checkpoint, its display name, and the runtime kind if `model` is a runtime bundle."""
    folder, digests, name = resolve(model, **kwargs)
    if is_bundle(folder):
        manifest = read_manifest(folder)
        checkpoint = load_checkpoint(folder, sha256=digests, source=manifest.get("source", os.fspath(model)),
                                     weights=False)
        checkpoint.__dict__["sha256"] = manifest.get("source_sha256", "")
        checkpoint.__dict__["fingerprint"] = manifest.get("fingerprint", "")
        return checkpoint, name, manifest.get("kind")
    return load_checkpoint(folder, sha256=digests, source=os.fspath(model)), name, None
