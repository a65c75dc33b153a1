"""`runtime="onnx"`: ONNX Runtime on the CPU, from an exported bundle (no torch needed to run it).

It runs a bundle: the checkpoint itself when it is one, or `bundle` (what `laya.load` exports on
first use into a cache keyed by the checkpoint's fingerprint). An int8 bundle whose export gate
failed is refused unless `force=True`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.batch import Batch
from laya.encoder.bundle import open_bundle
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.runtimes.base import RuntimeBase
from laya.errors import CheckpointError
from laya.native.placement import Placement, plan

INPUTS = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
PRECISIONS = ("fp32", "int8")


def pad_markers(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's act features take the top two options: give it at least two marker slots."""
    extra = 2 - feed["marker_pos"].shape[1]
    if extra <= 0:
        return feed
    feed = dict(feed)
    feed["marker_pos"] = np.pad(feed["marker_pos"], ((0, 0), (0, extra)))
    feed["marker_mask"] = np.pad(feed["marker_mask"], ((0, 0), (0, extra)))
    return feed


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise CheckpointError(f"ONNX precision must be one of {PRECISIONS}, got {precision!r}")


def _session(path: Path, threads: int | None) -> tuple[Any, Placement | None]:
    """The session, and where its threads run when its pool takes every core (`placement`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    placement = plan(threads)
    options.intra_op_num_threads = placement.threads if placement else int(threads or 0)
    if placement is not None and placement.pool:
        options.add_session_config_entry("session.intra_op_thread_affinities", placement.affinities())
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The pool's threads spin between the operators of a forward pass (quick to pick the next one
    # up), but not after it: by default they spin on for tens of milliseconds, a whole core that the
    # server, the client beside it or the next request's tokenising then waits for.
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), placement


class OnnxRuntime(RuntimeBase):
    name = "onnx"

    def __init__(self, checkpoint: Checkpoint, precision: str = "fp32", threads: int | None = None,
                 force: bool = False, bundle: str | Path | None = None):
        check_precision(precision)
        folder, manifest = open_bundle(checkpoint, bundle, "onnx", "fp32", force=force)
        self.gate = manifest.get("gate")
        self.session, self.placement = _session(folder / manifest["graph"], threads)
        self.precision = manifest["precision"]
        self.manifest = manifest
        self.folder = folder

    @classmethod
    def from_graph(cls, path: Path, precision: str, threads: int | None = None) -> OnnxRuntime:
        """A runtime over a bare graph file (the exporter's gate uses it before the bundle exists)."""
        runtime = cls.__new__(cls)
        runtime.session, runtime.placement = _session(path, threads)
        runtime.precision, runtime.manifest, runtime.folder, runtime.gate = precision, {}, path.parent, None
        return runtime

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        if self.precision == "int8":
            return self._rows_alone(batch)
        return self._run(batch)

    def _run(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        feed = pad_markers({name: getattr(batch, name) for name in INPUTS})
        if self.placement is None:
            logits, act = self.session.run(["logits", "act_logits"], feed)
        else:
            with self.placement.pinned():
                logits, act = self.session.run(["logits", "act_logits"], feed)
        return logits[:, : batch.n_markers].astype(np.float32, copy=False), act.astype(np.float32, copy=False)

    def _rows_alone(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """int8 scales each token's activations by that token's own range, so padding and other rows
        never enter a row's scales; but a padded batch still changes the last bits of fp32 sums, which a
        rounding to int8 can carry further. So each row runs alone, unpadded: its answer is the same
        whatever else was asked."""
        def one(i: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
            logits, act = self._run(batch.take([i]))
            return logits[0, :k], act[0]

        return batch.per_row(one)
