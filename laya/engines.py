"""The one place that tells a chat GGUF from a laya model: `open_engine(source, ...)` gives the engine
that reads `source`, whoever asks (`laya serve`, the engine process, Ray replicas, `laya eval`,
`laya predict`). A `.gguf` file is a chat model for the decide engine, unless it is a laya decision
model in llama.cpp's format (`modern-bert.decision.type = "laya"`), which the encoder engine reads;
anything else names a laya checkpoint (a folder, a bundle, a registry name, a Hub repository).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from laya.digests import digests_of
from laya.engine import Engine
from laya.errors import LayaError


@dataclass(frozen=True)
class EngineOptions:
    """How one model is loaded; each option is read by the engine it concerns."""

    name: str | None = None  # the served name (default: the model's own)
    calibration: str | None = None  # a calibration file for this model
    threads: int | None = None
    local_only: bool = False  # laya checkpoints: no Hub download
    runtime: str | None = None  # laya checkpoints: auto unless told (a bundle picks its own)
    precision: str | None = None  # laya checkpoints: the runtime's precision; with auto only "fp32" (exact)
    compact: bool = False  # Core ML: shorten long rows to the largest Neural Engine bucket (reported)
    force: bool = False  # laya checkpoints: run a reduced precision past its failed gate (said in its answers)
    revision: str | None = None  # laya checkpoints from the Hub: the commit, branch or tag
    subfolder: str | None = None  # laya checkpoints from the Hub: the folder in the repository
    sha256: str | None = None  # laya checkpoints: the weights' expected sha256
    n_ctx: int | None = None  # chat GGUFs: the context (None: the model's trained one, as memory allows)
    readout: str | None = None  # chat GGUFs: the readout of one given without a `path.gguf:READOUT` suffix
    prefix_cache: str = "auto"  # chat GGUFs: kept state, auto | on | off
    decide_probe: str | None = None  # chat GGUFs: the file each decision's logit lens is appended to


def open_engine(source: str, **options: Any) -> Engine:
    """The engine that reads `source`, loaded with `options` (`EngineOptions`' fields; any other name is
    refused, naming it)."""
    known = {f.name for f in fields(EngineOptions)}
    if unknown := sorted(set(options) - known):
        raise LayaError(f"open_engine takes no option {unknown[0]!r} (it takes {', '.join(sorted(known))})")
    opts = EngineOptions(**options)
    if is_gguf(source):
        return _decide_engine(source, opts)
    return _encoder_engine(source, opts)


def _decide_engine(source: str, opts: EngineOptions) -> Engine:
    from laya.decide.engine import DecideEngine
    from laya.decide.llama import open_gguf

    path, readout = split_readout(source)
    model = open_gguf(path, name=opts.name, n_ctx=opts.n_ctx, threads=opts.threads, prefix_cache=opts.prefix_cache,
                      calibration=opts.calibration, readout=readout or opts.readout, decide_probe=opts.decide_probe)
    files = {"gguf": Path(path)} | _calibration_file(opts)
    return DecideEngine(model, description=f"{Path(path).name} read by its {model.profile.name} readout",
                        release_date=release_date_of(Path(path)), digests=digests_of(files),
                        calibration=Path(opts.calibration).name if opts.calibration else "")


def _encoder_engine(source: str, opts: EngineOptions) -> Engine:
    from laya.encoder.engine import EncoderEngine
    from laya.encoder.load import load
    from laya.encoder.registry import lookup

    runtime_options: dict[str, Any] = {"threads": opts.threads} if opts.threads else {}
    if opts.precision:
        runtime_options["precision"] = opts.precision
    if opts.compact:
        runtime_options["compact"] = True
    if opts.force:
        runtime_options["force"] = True
    model = load(source, runtime=opts.runtime, name=opts.name, local_only=opts.local_only,
                 calibration=opts.calibration, revision=opts.revision, subfolder=opts.subfolder,
                 sha256=opts.sha256, **runtime_options)
    entry = lookup(source)
    folder = model.checkpoint.path
    artifact = next((p for p in (Path(source), folder / "model.safetensors", folder / "manifest.json") if p.is_file()),
                    folder)
    return EncoderEngine(model, description=entry.description if entry else f"laya checkpoint {Path(source).name}",
                         release_date=release_date_of(artifact),
                         digests=digests_of(artifact_files(Path(source), folder) | _calibration_file(opts)),
                         calibration=Path(opts.calibration).name if opts.calibration else "")


def artifact_files(source: Path, folder: Path) -> dict[str, Path]:
    """The artifacts a laya model answers from, by role: a laya GGUF; a checkpoint's weights, config and
    tokenizer; else (an exported bundle) its folder."""
    from laya.encoder.checkpoint import CONFIG_FILE, TOKENIZER_DIR, WEIGHTS_FILE

    if source.is_file():
        return {"gguf": source}
    files = {"weights": folder / WEIGHTS_FILE, "config": folder / CONFIG_FILE, "tokenizer": folder / TOKENIZER_DIR}
    found = {role: path for role, path in files.items() if path.exists()}
    return found or {"bundle": folder}


def _calibration_file(opts: EngineOptions) -> dict[str, Path]:
    return {"calibration": Path(opts.calibration)} if opts.calibration else {}


def release_date_of(artifact: Path) -> str:
    """The date the file that answers was written (its modification time, UTC: a GGUF, a checkpoint's
    weights, a bundle's manifest): what Jev's `release_date` can truthfully say of a model laya did not
    publish itself."""
    try:
        stamp = artifact.stat().st_mtime
    except OSError:
        return datetime.date.today().isoformat()
    return datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC).date().isoformat()


def is_gguf(source: str) -> bool:
    """Whether `source` is a chat GGUF for the decide engine (`path.gguf`, or `path.gguf:READOUT`
    naming its readout profile), not a laya decision GGUF or any other laya model."""
    path, readout = split_readout(source)
    if not path.lower().endswith(".gguf"):
        return False
    from laya.encoder.gguf_file import is_laya_gguf

    return readout is not None or not is_laya_gguf(path)


def split_readout(source: str) -> tuple[str, str | None]:
    """`path.gguf:READOUT` as (`path.gguf`, `READOUT`); anything else as (itself, None)."""
    head, colon, readout = source.rpartition(":")
    if colon and head.lower().endswith(".gguf") and readout and not any(c in readout for c in "/\\."):
        return head, readout
    return source, None
