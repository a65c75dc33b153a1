"""laya: a runtime for encoder-based System One decision models.

    import laya
    model = laya.load("path/to/checkpoint")             # or "laya-multilingual", or "owner/repo"
    model.predict("I was charged twice", {"team": {"type": "choice", "instructions": "Route it",
                                                   "criteria": {"billing": None, "sales": None}}})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from laya.errors import CheckpointError, LayaError, QuestionError, RuntimeUnavailable
from laya.model import Model

__version__ = "0.1.0"
__all__ = ["CheckpointError", "LayaError", "Model", "QuestionError", "RuntimeUnavailable", "load"]


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
    `runtime` defaults to `torch` for a checkpoint and to the bundle's own runtime for an exported
    bundle; runtime options (`threads`, `precision`, `force`, ...) go to the runtime.
    """
    from laya.loading import build_runtime, load_model_checkpoint

    checkpoint, default_name, bundle_kind = load_model_checkpoint(
        model, revision=revision, subfolder=subfolder, sha256=sha256, local_only=local_only
    )
    if bundle_kind is not None and runtime not in (None, bundle_kind):
        raise CheckpointError(f"{model} is a {bundle_kind} bundle; load it with runtime={bundle_kind!r}")
    runtime = runtime or bundle_kind or "torch"
    fitted = None
    if calibration is not None:
        from laya.calibration.file import load_calibration

        fitted = load_calibration(calibration)
        fitted.check_model(checkpoint.fingerprint, os.fspath(model))  # before the runtime is built
    runtime_impl = build_runtime(runtime, checkpoint, runtime_options)
    return Model(checkpoint, runtime_impl, name=name or default_name, calibration=fitted)
