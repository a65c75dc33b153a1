"""`laya.load`: from a name, a folder or a Hub id to a ready `Model`.

Loading is also where a runtime that runs exported bundles (ONNX, Core ML) gets one when it is
given a checkpoint: the exporter (`laya.encoder.export.<kind>`) builds it on first use into the cache. So
runtimes never import the exporters; the exporters may import the runtimes (their gates run them).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from laya.encoder.bundle import is_bundle, read_manifest
from laya.encoder.checkpoint import WEIGHTS_FILE, Checkpoint, download, load_checkpoint, verify_digests
from laya.encoder.registry import lookup
from laya.encoder.runtimes.base import Runtime, check_options, create_runtime
from laya.errors import CheckpointError, RuntimeUnavailable

# runtime -> the exporter that builds the bundle it runs, when it is given a checkpoint
EXPORTED_ON_FIRST_USE = {"onnx": "laya.encoder.export.onnx", "coreml": "laya.encoder.export.coreml",
                         "llama": "laya.encoder.export.gguf"}


def resolve(
    model: str | os.PathLike, *, revision: str | None = None, subfolder: str | None = None,
    sha256: str | Mapping[str, str] | None = None, local_only: bool = False,
) -> tuple[Path, dict[str, str], str, bool]:
    """Folder, digests to check, display name, and whether the folder is a Hub snapshot, for `model`
    (downloaded from the Hub if needed)."""
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
        return folder, digests, folder.resolve().name, False
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise CheckpointError(f"{text}: no such checkpoint folder")
    entry = lookup(text)
    if entry is not None:
        digests.setdefault(WEIGHTS_FILE, entry.weights_sha256)
        folder = download(entry.repo, revision=revision or entry.revision, subfolder=subfolder or entry.subfolder,
                          local_only=local_only, label=entry.name)
        return folder, digests, entry.name, True
    if text.count("/") == 1 and all(text.split("/")):
        folder = download(text, revision=revision, subfolder=subfolder, local_only=local_only)
        name = text.split("/")[1] + (f"-{subfolder.strip('/').replace('/', '-')}" if subfolder else "")
        return folder, digests, name, True
    raise CheckpointError(
        f"{text!r} is not a checkpoint folder, a registered model (laya, laya-multilingual, "
        "laya-typed-decisions) or a Hub id (owner/name)"
    )


def load_model_checkpoint(model: str | os.PathLike, **kwargs: Any) -> tuple[Checkpoint, str, str | None]:
    """The checkpoint, its display name, and the runtime kind if `model` is a runtime bundle."""
    folder, digests, name, from_hub = resolve(model, **kwargs)
    if digests:  # checked before anything is parsed; a Hub file that does not match leaves the cache
        verify_digests(folder, digests, evict=from_hub)
    if is_bundle(folder):
        manifest = read_manifest(folder)
        checkpoint = load_checkpoint(folder, source=manifest.get("source", os.fspath(model)), weights=False)
        checkpoint.__dict__["sha256"] = manifest.get("source_sha256", "")
        checkpoint.__dict__["fingerprint"] = manifest.get("fingerprint", "")
        return checkpoint, name, manifest.get("kind")
    checkpoint = load_checkpoint(folder, source=os.fspath(model))
    if WEIGHTS_FILE in digests:  # already verified: no second pass over the weights for the fingerprint
        checkpoint.__dict__["sha256"] = digests[WEIGHTS_FILE].lower()
    return checkpoint, name, None


def build_runtime(name: str, checkpoint: Checkpoint, options: dict[str, Any]) -> Runtime:
    """Runtime `name` over `checkpoint`, exporting the bundle it runs on first use where it needs one.

    `cache_dir` (default `$LAYA_CACHE`, else ~/.cache/laya) is where exported bundles are kept."""
    options = dict(options)
    cache_dir = options.pop("cache_dir", None)
    exporter = EXPORTED_ON_FIRST_USE.get(name)
    check_options(name, options)
    if exporter is not None and not is_bundle(checkpoint.path):
        module = importlib.import_module(exporter)
        try:
            options = module.runtime_inputs(checkpoint, options, Path(cache_dir) if cache_dir else None)
        except ModuleNotFoundError as exc:  # the exporter's own dependencies (the [export] extra)
            raise RuntimeUnavailable(
                f"runtime {name!r} runs a bundle exported from the checkpoint on first use, and exporting needs "
                f"{exc.name!r}: pip install 'laya-runtime[export]', or load a bundle exported elsewhere "
                f"(laya export)") from exc
    elif cache_dir is not None:
        raise CheckpointError(f"cache_dir applies only to runtimes that export a bundle on first use "
                              f"({', '.join(EXPORTED_ON_FIRST_USE)}), not to {name!r} on {checkpoint.path}")
    return create_runtime(name, checkpoint, **options)
