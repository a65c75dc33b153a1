"""`laya.load`: a laya model (a checkpoint folder, a registered name, a Hub repository, an exported bundle
or a laya GGUF) on a runtime, and `load_router`, the English and the multilingual one behind one
`predict`. Re-exported by `laya`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from laya.encoder.model import Model
from laya.errors import CheckpointError, LayaError

if TYPE_CHECKING:
    from laya.routing.router import Router


def load(
    model: str | os.PathLike,
    runtime: str | None = None,
    *,
    revision: str | None = None,
    subfolder: str | None = None,
    sha256: str | Mapping[str, str] | None = None,
    name: str | None = None,
    local_only: bool = False,
    calibration: str | os.PathLike | None = None,
    **runtime_options: Any,
) -> Model:
    """Load a laya checkpoint and put it on `runtime`.

    `model` is a local folder, a registered name (pinned revision and weights digest) or a Hub id
    (`subfolder`, `revision` optional). `sha256` is the weights' digest, or a map of relative paths
    to digests, checked before anything is parsed. `local_only` never contacts the Hub.
    `runtime` defaults to `auto` for a checkpoint (the fastest faithful runtime installed here, timed
    at the first load on this machine and remembered, see `laya.encoder.choice`; `model.choice` says which,
    why and what it measured; `measure=False` or LAYA_AUTO_MEASURE=0 make it follow its fixed rule
    without timing) and to the bundle's own runtime for an exported bundle; runtime options
    (`threads`, `precision`, `force`, ...) go to the runtime. `"auto"` gives a `Router` over the
    English and the multilingual checkpoint (see `load_router`; `english=`, `multilingual=` and
    `default=` name them).
    """
    if isinstance(model, str) and model == "auto":
        if revision is not None or subfolder is not None or sha256 is not None or calibration is not None:
            raise LayaError("\"auto\" loads two checkpoints: name them (english=, multilingual=) and load each "
                            "with its revision, digest or calibration, then pass the models")
        roles = {k: runtime_options.pop(k) for k in ("english", "multilingual", "default") if k in runtime_options}
        router = load_router(**roles, runtime=runtime, local_only=local_only, **runtime_options)
        return router  # type: ignore[return-value]
    from laya.encoder.loading import build_runtime, load_model_checkpoint

    if isinstance(model, str | os.PathLike) and os.fspath(model).lower().endswith(".gguf"):
        model, runtime, name = _laya_gguf(model, runtime, name, runtime_options)
    checkpoint, default_name, bundle_kind = load_model_checkpoint(
        model, revision=revision, subfolder=subfolder, sha256=sha256, local_only=local_only
    )
    if bundle_kind is not None and runtime not in (None, "auto", bundle_kind):
        raise CheckpointError(f"{model} is a {bundle_kind} bundle; load it with runtime={bundle_kind!r}")
    if bundle_kind is not None:
        runtime = bundle_kind
    fitted = None
    if calibration is not None:
        from laya.calibration.file import load_calibration

        fitted = load_calibration(calibration)
        fitted.check_model(checkpoint.fingerprint, os.fspath(model))  # before the runtime is built
        if fitted.identity is not None:  # an upstream file: a checkpoint it does not name warns, as upstream
            import json

            from laya.calibration.upstream import check_identity

            config = json.loads((checkpoint.path / "rl_agent_config.json").read_text(encoding="utf-8"))
            check_identity(fitted.identity, os.fspath(model), subfolder, config)
    choice = None
    if runtime in (None, "auto"):
        from laya.encoder.choice import choose

        runtime_impl, choice = choose(checkpoint, runtime_options, build_runtime)
    else:
        runtime_impl = build_runtime(runtime, checkpoint, runtime_options)
    loaded = Model(checkpoint, runtime_impl, name=name or default_name, calibration=fitted, choice=choice)
    if choice is not None and choice.deferred:
        _upgrade_in_background(loaded, runtime_options)
    return loaded


def _upgrade_in_background(model: Model, options: dict[str, Any]) -> None:
    """Start preparing auto's pick beside the exact runtime that answers meanwhile (`laya.encoder.upgrade`)."""
    from laya.encoder.choice import load_stored_pick
    from laya.encoder.loading import build_runtime
    from laya.encoder.upgrade import Upgrade

    checkpoint = model.checkpoint
    model.upgrade = Upgrade(checkpoint, options, lambda: load_stored_pick(checkpoint, options, build_runtime),
                            answering=model.choice.key if model.choice else "")
    model.upgrade.start(model.swap)


def _laya_gguf(path: str | os.PathLike, runtime: str | None, name: str | None, options: dict[str, Any]
               ) -> tuple[str, str | None, str]:
    """A laya decision GGUF (llama.cpp's laya format), unpacked once into the cache: by default the llama
    runtime runs it in the file's own types; a runtime named otherwise runs its weights dequantized, and so
    does the default where llama.cpp is not installed (a GGUF needs no compiler: `laya[torch,gguf]`)."""
    import importlib.util
    from pathlib import Path

    from laya.encoder.gguf_file import is_laya_gguf, unpack

    if not is_laya_gguf(path):
        raise CheckpointError(f"{path}: not a laya decision GGUF (a chat GGUF is read by the decide engine: "
                              "laya serve -m, laya predict -m, or laya.decide.llama.open_gguf)")
    unpacked = unpack(path, Path(options.pop("cache_dir")) / "gguf" if options.get("cache_dir") else None)
    name = name or Path(path).stem
    if runtime == "llama" or (runtime in (None, "auto") and importlib.util.find_spec("llama_cpp") is not None):
        return os.fspath(unpacked.bundle), None, name
    return os.fspath(unpacked.checkpoint), runtime, name


def load_router(english: str | os.PathLike | Model = "laya",
                multilingual: str | os.PathLike | Model = "laya-multilingual", *,
                default: str = "multilingual", **load_options: Any) -> Router:
    """The two checkpoints behind one `predict` that sends each state to the one that can read it
    (upstream's Router rules, `laya.routing.router`). Each may be a loaded `Model` or what `load` takes;
    `load_options` (runtime, local_only, ...) apply to both."""
    from laya.routing.router import Router

    if default not in ("english", "multilingual"):  # before two checkpoints are loaded for nothing
        raise LayaError(f"default must be 'english' or 'multilingual', got {default!r}")

    def loaded(spec: Any) -> Model:
        return spec if isinstance(spec, Model) else load(spec, **load_options)

    return Router(loaded(english), loaded(multilingual), default=default)
