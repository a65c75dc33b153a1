"""`laya export mlx`: a checkpoint's tensors as an MLX bundle (fp16 or fp32), no torch needed to run it.

The bundle keeps the checkpoint's tensor names, so the one name mapping stays in `laya.encoder.runtimes.mlx`.
"""

from __future__ import annotations

from pathlib import Path

from laya.encoder.checkpoint import Checkpoint
from laya.encoder.runtimes.mlx import WEIGHTS
from laya.errors import CheckpointError


def export_bundle(checkpoint: Checkpoint, out: Path, precision: str = "fp16") -> dict:
    """Write an MLX bundle into `out` and return its manifest."""
    import mlx.core as mx

    from laya.encoder.bundle import base_manifest, copy_checkpoint_files, write_manifest

    if precision not in ("fp16", "fp32"):
        raise CheckpointError(f"MLX bundle precision must be fp16 or fp32, got {precision!r}")
    copy_checkpoint_files(checkpoint, out)
    dtype = mx.float16 if precision == "fp16" else mx.float32
    tensors = {k: mx.array(v).astype(dtype) for k, v in sorted(checkpoint.weights.items())}
    mx.save_safetensors(str(out / WEIGHTS), tensors)
    manifest = base_manifest(checkpoint, "mlx", precision)
    manifest["weights"] = WEIGHTS
    write_manifest(out, manifest)
    return manifest
