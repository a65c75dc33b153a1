"""`runtime="coreml"`: Core ML bundles on Apple platforms, with the Neural Engine for compact prompts.

Each row goes to the smallest Neural Engine bucket it fits (tokens <= L, options <= 32 slots) when
the bundle has them, else to the general program; never truncated. The general program runs on
`compute_units` (CPU or CPU+GPU: never the Neural Engine, where its plain layout is known to answer
wrongly without raising). The host does, in fp32, what the Neural Engine programs leave to it: the
embedding gather, the type vector, the additive masks and the act head.

`executor` says what runs the programs:
- `coreml` (the default, macOS only): Core ML itself, with `compute_units` for the general program
  and `cpuAndNeuralEngine` for the Neural Engine buckets.
- `mil`: laya's numpy evaluator of the saved programs (`laya.encoder.runtimes.mil`); slow, runs anywhere:
  how the bundles are verified without a Mac.
- `torch`: the torch modules the programs are converted from, in fp32 (built from the checkpoint by
  `laya.encoder.export.coreml.torch_programs`, which `laya.load` calls).

Elsewhere than macOS, `executor="coreml"` is refused with a message naming the platform.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from laya.encoder.batch import Batch
from laya.encoder.bundle import bundle_to_run, read_manifest
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.numpy_head import act_features
from laya.encoder.runtimes.base import Compact, RuntimeBase
from laya.encoder.runtimes.mil import erf
from laya.errors import CheckpointError, RuntimeUnavailable

EXECUTORS = ("coreml", "mil", "torch")
# The general program has the plain (B, L, C) layout, which gives wrong answers on the Neural Engine
# without raising: it never runs there. Only the channel-first bucket programs do.
COMPUTE_UNITS = {"cpu_only": "CPU_ONLY", "cpu_and_gpu": "CPU_AND_GPU"}
NEURAL_ENGINE = "CPU_AND_NE"
MASK = -1e4

Predictor = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class HostParts:
    """The fp32 pieces the host computes around a Neural Engine program."""

    def __init__(self, tensors: Mapping[str, np.ndarray], local_window: int, pad_id: int):
        self.embeddings = tensors["encoder.embeddings.tok_embeddings.weight"]
        self.type_emb = np.asarray(tensors["type_emb.weight"], np.float32)
        self.act = [np.asarray(tensors[f"act_head.{n}"], np.float32)
                    for n in ("0.weight", "0.bias", "2.weight", "2.bias")]
        self.half_window = local_window // 2
        self.pad_id = pad_id

    def inputs(self, ids: np.ndarray, markers: np.ndarray, qtype: int, length: int,
               slots: int) -> dict[str, np.ndarray]:
        n = len(ids)
        padded = np.full(length, self.pad_id, dtype=np.int64)
        padded[:n] = ids
        emb = np.asarray(self.embeddings[padded], np.float32).T[None, :, None, :]
        keys = np.where(np.arange(length) < n, 0.0, MASK).astype(np.float32)
        far = np.abs(np.arange(length)[:, None] - np.arange(length)[None, :]) > self.half_window
        local = keys[None, :] + np.where(far, MASK, 0.0)
        one_hot = np.zeros((1, length, slots), np.float32)
        one_hot[0, markers, np.arange(len(markers))] = 1.0
        return {"embeddings": emb, "type_vector": self.type_emb[qtype][None, :, None, None],
                "global_mask": keys[None, None, None, :], "local_mask": local[None, None].astype(np.float32),
                "markers": one_hot}

    def act_logits(self, cls: np.ndarray, logits: np.ndarray) -> np.ndarray:
        w0, b0, w2, b2 = self.act
        x = np.concatenate([np.asarray(cls, np.float32).reshape(-1), act_features(logits)]).astype(np.float64)
        h = x @ w0.T.astype(np.float64) + b0
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        return (h @ w2.T.astype(np.float64) + b2).astype(np.float32)


@dataclass
class Programs:
    """What the runtime routes rows to: the general program and the Neural Engine buckets.

    Built from a bundle's saved programs here, or by `laya.encoder.export.coreml.torch_programs` from the
    torch modules the programs are converted from (the fp32 check of the conversion)."""

    general: Predictor
    lengths: list[int]
    max_markers: int
    buckets: dict[int, Predictor] = field(default_factory=dict)
    slots: int = 0
    host: HostParts | None = None


def check_options(executor: str, compute_units: str) -> None:
    """Refusals that do not depend on the bundle, made before anything is exported."""
    if executor not in EXECUTORS:
        raise RuntimeUnavailable(f"Core ML executor must be one of {EXECUTORS}, got {executor!r}")
    if compute_units not in COMPUTE_UNITS:
        raise RuntimeUnavailable(
            f"compute_units of the general program must be one of {sorted(COMPUTE_UNITS)}, got {compute_units!r}: "
            "its plain layout gives wrong answers on the Neural Engine, so it never runs there (the "
            "Neural Engine bucket programs do, for rows that fit them)")
    if executor == "coreml" and sys.platform != "darwin":
        raise RuntimeUnavailable(
            f"Core ML predicts only on macOS (and iOS); this is {platform.system()} {platform.machine()}. "
            "Use runtime='onnx' or 'torch' here, or executor='mil' to run a bundle's programs slowly in numpy "
            "for verification")


class CoremlRuntime(RuntimeBase):
    name = "coreml"

    def __init__(self, checkpoint: Checkpoint, compute_units: str = "cpu_and_gpu", executor: str = "coreml",
                 ane: bool = True, precision: str = "fp16", bundle: str | os.PathLike | None = None,
                 programs: Programs | None = None, compact: bool = False):
        check_options(executor, compute_units)
        self.compact_mode = compact
        self.executor, self.compute_units = executor, compute_units
        self.routed = {"ane": 0, "general": 0}  # rows sent to each kind of program
        self.pad_id = checkpoint.tokenizer.pad_id
        if executor == "torch":
            if programs is None:
                raise CheckpointError("executor='torch' runs the torch graphs the programs are converted from: "
                                      "load the checkpoint (not a bundle) with laya.load(..., runtime='coreml')")
            self.programs, self.precision, self.manifest, self.folder = programs, "fp32", {}, checkpoint.path
            return
        folder = bundle_to_run(checkpoint, bundle, "coreml")
        manifest = read_manifest(folder)
        if manifest.get("kind") != "coreml":
            raise CheckpointError(f"{folder}: a {manifest.get('kind')!r} bundle, not a Core ML one")
        if checkpoint.weights and manifest.get("fingerprint") != checkpoint.fingerprint:
            raise CheckpointError(f"{folder}: exported from another checkpoint than {checkpoint.path}")
        self.manifest, self.folder = manifest, folder
        self.precision = manifest["precision"]
        general = manifest["general"]
        self.programs = Programs(general=self._program(folder / general["program"], compute_units),
                                 lengths=list(general["lengths"]), max_markers=int(general["max_markers"]))
        ane_part = manifest.get("ane")
        if ane and ane_part:
            from safetensors.numpy import load_file

            self.programs.slots = int(ane_part["slots"])
            self.programs.host = HostParts(load_file(str(folder / ane_part["host_weights"])),
                                           checkpoint.encoder.local_attention, self.pad_id)
            for bucket in ane_part["buckets"]:
                self.programs.buckets[int(bucket["length"])] = self._program(folder / bucket["program"], NEURAL_ENGINE)

    def _program(self, path: Path, units: str) -> Predictor:
        """`units`: a COMPUTE_UNITS key, or NEURAL_ENGINE for the channel-first bucket programs."""
        if self.executor == "mil":
            from laya.encoder.runtimes.mil import Program

            return Program(path).run
        import coremltools as ct

        model = ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, COMPUTE_UNITS.get(units, units)))
        return lambda feeds: {k: np.asarray(v) for k, v in model.predict(feeds).items()}

    def compact(self) -> Compact | None:
        """Compact mode (opt-in): rows are shortened to the largest Neural Engine bucket (see
        `laya.encoder.rows.compact_row`), so compact prompts run there instead of the general program."""
        if not (self.compact_mode and self.programs.buckets):
            return None
        return Compact(max(self.programs.buckets), self.programs.slots)

    # running
    def bucket_for(self, n_tokens: int, n_markers: int) -> int | None:
        """The smallest Neural Engine bucket a row fits, or None (the general program takes it)."""
        if n_markers > self.programs.slots:
            return None
        return next((length for length in sorted(self.programs.buckets) if n_tokens <= length), None)

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        return batch.per_row(lambda i, n, k: self._row(batch.input_ids[i, :n], batch.marker_pos[i, :k],
                                                       int(batch.qtype[i])))

    def _row(self, ids: np.ndarray, markers: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
        bucket = self.bucket_for(len(ids), len(markers))
        if bucket is None:
            self.routed["general"] += 1
            return self._general(ids, markers, qtype)
        programs = self.programs
        assert programs.host is not None  # a bundle with buckets has its host parts
        out = programs.buckets[bucket](programs.host.inputs(ids, markers, qtype, bucket, programs.slots))
        z = np.asarray(out["logits"], np.float32).reshape(-1)[: len(markers)]
        self.routed["ane"] += 1
        return z, programs.host.act_logits(out["cls"], z)

    def _general(self, ids: np.ndarray, markers: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
        n, k = len(ids), len(markers)
        lengths, max_markers = self.programs.lengths, self.programs.max_markers
        if k > max_markers:
            raise CheckpointError(f"a question with {k} options exceeds the Core ML program's {max_markers}")
        length = next((x for x in lengths if x >= n), None)
        if length is None:
            raise CheckpointError(f"a row of {n} tokens is longer than the Core ML program's {lengths[-1]}")
        padded = np.full((1, length), self.pad_id, dtype=np.int32)
        padded[0, :n] = ids
        out = self.programs.general({"input_ids": padded, "n_tokens": np.array([n], np.int32),
                            "marker_pos": np.asarray(markers, np.int32)[None, :], "qtype": np.array([qtype], np.int32)})
        return (np.asarray(out["logits"], np.float32).reshape(-1)[:k],
                np.asarray(out["act_logits"], np.float32).reshape(-1))
