"""laya: a runtime for encoder-based System One decision models.

    import laya
    model = laya.load("path/to/checkpoint")             # or "laya-multilingual", or "owner/repo"
    router = laya.load("auto")                          # English or multilingual, chosen per state
    model.predict("I was charged twice", {"team": {"type": "choice", "instructions": "Route it",
                                                   "criteria": {"billing": None, "sales": None}}})
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from laya.encoder.load import load, load_router
from laya.encoder.model import Model
from laya.engines import open_engine
from laya.errors import CheckpointError, LayaError, QuestionError, RuntimeUnavailable
from laya.version import __version__

__all__ = ["CheckpointError", "LayaError", "Model", "QuestionError", "Router", "RuntimeUnavailable", "__version__",
           "cached_embed_fn", "embed_fn_from_model", "load", "load_router", "open_engine", "predict_shortlist",
           "train"]
SHORTLIST = ("cached_embed_fn", "embed_fn_from_model", "predict_shortlist", "shortlist_choice")

if TYPE_CHECKING:
    from laya.routing.router import Router


def train(model: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike, *, resume: bool = False,
          text_column: str = "text", label_column: str = "label", target_precision: float = 0.9,
          quiet: bool = False, plots: bool = True, **settings: Any) -> dict[str, Any]:
    """Fine-tune `model` on labelled decisions (`data`: JSONL or CSV) into the checkpoint folder `out`.

    `settings` are `laya.training.loop.Settings` fields (epochs, batch_size, encoder_lr, head_lr,
    freeze_encoder, holdout, seed, device, precision, ...). Returns the report, also written to
    `out/report/`. Needs the [train] extra."""
    import dataclasses

    from laya.training.loop import Settings
    from laya.training.run import train as run

    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(Settings)})
    if unknown:
        raise LayaError(f"unknown training setting {', '.join(unknown)}; the settings are "
                        f"{', '.join(f.name for f in dataclasses.fields(Settings))}")
    return run(model, data, out, settings=Settings(**settings), resume=resume, text_column=text_column,
               label_column=label_column, target_precision=target_precision, quiet=quiet, plots=plots)


def __getattr__(name: str) -> Any:
    if name == "Router":  # imported on use: routing's tables are not needed by a plain `load`
        from laya.routing.router import Router

        return Router
    if name in SHORTLIST:
        from laya.encoder import shortlist

        return getattr(shortlist, name)
    raise AttributeError(f"module 'laya' has no attribute {name!r}")
