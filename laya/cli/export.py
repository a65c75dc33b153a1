"""`laya export`: a checkpoint written as a runtime bundle (ONNX, MLX, Core ML or an encoder GGUF), each
reduced precision checked by its gate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from laya.cli.common import Subparsers, UsageError


def register(sub: Subparsers) -> None:
    """Add `laya export` to the subparsers `sub`."""
    exp = sub.add_parser("export", help="export a checkpoint to a runtime bundle")
    exp.add_argument("format", choices=["onnx", "mlx", "coreml", "gguf"],
                     help="bundle format (gguf: the encoder for llama.cpp, run by -r llama)")
    exp.add_argument("model", help="checkpoint folder, registered name or Hub id")
    exp.add_argument("out", help="output folder (gguf: the output file, *.gguf)")
    exp.add_argument("--int8", action="store_true",
                     help="onnx: int8 encoder matmuls (per-token activations, layer 0 fp32), gated against fp32")
    exp.add_argument("--precision", choices=["fp16", "fp32"],
                     help="mlx: weight dtype; coreml: compute precision of the general program (default fp16)")
    exp.add_argument("--ane", action="store_true",
                     help="coreml: also the fixed-shape Neural Engine programs (buckets 64, 96, 128; 256 multilingual)")
    exp.add_argument("--type", choices=["f32", "f16", "q8_0"],
                     help="gguf: weight type (default f32; q8_0: the feed-forward matrices of the later half of the "
                          "layers in Q8_0, the rest f16), gated against fp32 unless f32")
    exp.add_argument("--revision")
    exp.add_argument("--subfolder")
    exp.add_argument("--sha256")
    exp.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    """`laya export FORMAT MODEL OUT`: the bundle written to OUT, whose path is printed."""
    from laya.encoder.loading import load_model_checkpoint

    checkpoint, _, kind = load_model_checkpoint(args.model, revision=args.revision, subfolder=args.subfolder,
                                                sha256=args.sha256)
    if kind is not None:
        raise UsageError(f"{args.model} is already a {kind} bundle; export from the checkpoint")
    out = Path(args.out)
    if args.format == "onnx":
        from laya.encoder.export.onnx import export_bundle

        def progress(message: str) -> None:
            print(f"export: {message}", file=sys.stderr, flush=True)

        manifest = export_bundle(checkpoint, out, int8=args.int8, progress=progress)
        gate = manifest.get("gate")
        if gate:
            verdict = "PASSED" if gate["passed"] else "FAILED (the runtime refuses this bundle unless forced)"
            from laya.encoder.gate import describe

            print(f"int8 gate {verdict}: {describe(gate)}", file=sys.stderr)
        print(out)
        return 0
    if args.format == "gguf":
        from laya.encoder.export.laya_gguf import export as export_gguf
        from laya.encoder.gate import describe

        if args.int8 or args.precision or args.ane:
            raise UsageError("--int8, --precision and --ane are for other bundles; a GGUF takes --type f32, f16 "
                             "or q8_0")
        if out.suffix != ".gguf":
            raise UsageError(f"{out}: a GGUF is one file: name it *.gguf")

        def tell(message: str) -> None:
            print(f"export: {message}", file=sys.stderr, flush=True)

        written = export_gguf(checkpoint, out, args.type or "f32", progress=tell)
        gate = written.get("gate")
        if gate:
            verdict = "PASSED" if gate["passed"] else "FAILED (laya refuses to run this file unless forced)"
            print(f"{written['type']} gate {verdict}: {describe(gate)} (against {gate['reference']})",
                  file=sys.stderr)
        print(out)
        return 0
    if args.type:
        raise UsageError("--type is for GGUF bundles (laya export gguf)")
    if args.format == "mlx":
        from laya.encoder.export.mlx import export_bundle as export_mlx

        if args.int8:
            raise UsageError("--int8 is for ONNX bundles; MLX bundles are fp16 or fp32 (--precision)")
        export_mlx(checkpoint, out, precision=args.precision or "fp16")
        print(out)
        return 0
    if args.format == "coreml":
        from laya.encoder.export.coreml import export_bundle as export_coreml

        if args.int8:
            raise UsageError("--int8 is for ONNX bundles; Core ML bundles are fp16 or fp32 (--precision)")

        def say(message: str) -> None:
            print(f"export: {message}", file=sys.stderr, flush=True)

        export_coreml(checkpoint, out, precision=args.precision or "fp16", ane=args.ane, progress=say)
        print(out)
        return 0
    raise UsageError(f"unknown export format {args.format!r}")
