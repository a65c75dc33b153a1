"""Runtime bundles (ONNX, MLX, Core ML, llama.cpp GGUF) and their one manifest format.

A bundle folder holds the runtime's graph or weights, a copy of the checkpoint's configs and
tokenizer (so the same rows and decoding apply), and `manifest.json`: format version, source
checkpoint and its digest, special ids, budgets, temperatures, precision and any gate figures
measured at export. No timestamps: exporting twice writes the same bytes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laya.encoder.cache import cache_root
from laya.encoder.checkpoint import CONFIG_FILE, ENCODER_CONFIG, TOKENIZER_DIR, Checkpoint
from laya.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "laya-bundle"
FORMAT_VERSION = 1


def is_bundle(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def bundle_to_run(checkpoint: Checkpoint, bundle: str | os.PathLike | None, runtime: str,
                  export: str | None = None) -> Path:
    """The bundle a runtime runs: the checkpoint itself when it is one, else `bundle` (what loading
    exported on first use). A runtime never exports: it says how to get one (`laya export <export>`,
    the runtime's name unless given)."""
    if is_bundle(checkpoint.path):
        return checkpoint.path
    if bundle is None:
        raise CheckpointError(f"{checkpoint.path}: the {runtime} runtime runs an exported bundle; load the checkpoint "
                              f"with laya.load(..., runtime={runtime!r}) (which exports one on first use) or run "
                              f"`laya export {export or runtime}`")
    return Path(bundle)


def open_bundle(checkpoint: Checkpoint, bundle: str | os.PathLike | None, kind: str, exact: str, *,
                force: bool = False, export: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The folder and manifest of the `kind` bundle a runtime runs (see `bundle_to_run`), checked: its
    kind, that it was exported from `checkpoint` (when the checkpoint's weights are at hand), and, for a
    precision other than `exact`, that its accuracy gate passed at export unless `force`."""
    from laya.encoder.gate import GateFailed, describe

    folder = bundle_to_run(checkpoint, bundle, kind, export=export)
    manifest = read_manifest(folder)
    if manifest.get("kind") != kind:
        raise CheckpointError(f"{folder}: a {manifest.get('kind')!r} bundle, not a {kind} one")
    if checkpoint.weights and manifest.get("fingerprint") != checkpoint.fingerprint:
        raise CheckpointError(f"{folder}: exported from another checkpoint than {checkpoint.path} "
                              "(weights, configs or tokenizer differ)")
    gate = manifest.get("gate")
    if manifest["precision"] != exact and not (gate and gate.get("passed")) and not force:
        raise GateFailed(
            f"{folder}: this {manifest['precision']} bundle failed its accuracy gate at export ("
            f"{describe(gate) if gate else 'no gate recorded'}); its answers drift from fp32 beyond the "
            f"documented bound. Use the {exact} bundle, or pass force=True to accept it", gate or {})
    return folder, manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable bundle manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a laya bundle manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: bundle format version {manifest.get('format_version')!r} is not "
                              f"supported (this laya reads version {FORMAT_VERSION})")
    return manifest


def base_manifest(checkpoint: Checkpoint, kind: str, precision: str) -> dict[str, Any]:
    tok, cfg = checkpoint.tokenizer, checkpoint.config
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "precision": precision,
        "source": checkpoint.source,
        "source_sha256": checkpoint.sha256,
        "special_ids": {"cls": tok.cls_id, "sep": tok.sep_id, "mask": tok.mask_id, "pad": tok.pad_id},
        "max_len": cfg.max_len,
        "head_max_len": cfg.head_max_len,
        "temperature": list(cfg.temperature),
        "temperature_by_options": dict(cfg.temperature_by_options),
    }


def copy_checkpoint_files(checkpoint: Checkpoint, out: Path) -> None:
    """The configs and tokenizer a runtime needs beside its graph (never the weights)."""
    (out / "encoder").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(checkpoint.path / CONFIG_FILE, out / CONFIG_FILE)
    shutil.copyfile(checkpoint.path / ENCODER_CONFIG, out / ENCODER_CONFIG)
    if (out / TOKENIZER_DIR).exists():
        shutil.rmtree(out / TOKENIZER_DIR)
    shutil.copytree(checkpoint.path / TOKENIZER_DIR, out / TOKENIZER_DIR)


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def cache_folder(kind: str, key: str, cache_dir: Path | None = None) -> Path:
    """Where `cached_export` keeps the bundle `key` of `kind` (complete when its manifest is there)."""
    return (cache_dir or cache_root() / kind) / key


def cached_export(kind: str, key: str, build: Callable[[Path], Any], cache_dir: Path | None = None) -> Path:
    """A bundle exported on first use into `$LAYA_CACHE/<kind>/<key>` (default ~/.cache/laya), built once
    (`build_once`)."""
    folder = cache_folder(kind, key, cache_dir)
    if (folder / MANIFEST).is_file():
        return folder
    logging.getLogger("laya").info("exporting a %s bundle on first use into %s (once: later loads reuse it)",
                                   kind, folder)
    build_once(folder, MANIFEST, build)
    return folder


def build_once(folder: Path, done: str, build: Callable[[Path], Any]) -> None:
    """`build` `folder`, complete when it holds the file `done`.

    Each process builds in a temporary folder of its own and renames it into place when complete, so
    an interrupted build is never taken for a finished one and concurrent processes (server workers)
    never write into each other's files: the first rename wins and the others discard their copy."""
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=root))
    try:
        build(tmp)
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / done).is_file():  # not another process's finished build: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
