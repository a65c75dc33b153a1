"""`laya bench`: time a model on runtimes side by side (interleaved, medians, ratios), and with `--pick`
store the fastest whose gate passed for `runtime="auto"`."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from laya.cli.common import Subparsers, UsageError
from laya.errors import LayaError


def register(sub: Subparsers) -> None:
    """Add `laya bench` to the subparsers `sub`."""
    ben = sub.add_parser("bench", help="time a model on runtimes (interleaved, medians, ratios)")
    ben.add_argument("model", help="checkpoint folder, registered name or Hub id")
    ben.add_argument("--runtime", "-r", action="append",
                     help="runtime[:precision], repeat to compare (the first is the baseline), e.g. -r torch -r onnx "
                          "-r onnx:int8")
    ben.add_argument("--lengths", type=int, nargs="*", default=[128, 512], help="row lengths for one question")
    ben.add_argument("--questions", type=int, nargs="*", default=[4], help="question counts over one state")
    ben.add_argument("--state-tokens", type=int, default=300)
    ben.add_argument("--repeats", type=int, default=10)
    ben.add_argument("--warmup", type=int, default=2)
    ben.add_argument("--threads", type=int)
    ben.add_argument("--force", action="store_true",
                     help="run reduced precisions whose gate failed, and bf16 on a CPU without bf16 units")
    ben.add_argument("--pick", action="store_true",
                     help="measure every candidate runtime installed here (unless -r names them) and store the "
                          "fastest whose gate passed for this checkpoint and processor: runtime='auto' then uses it "
                          "(a longer measurement than the one auto makes itself at a first load)")
    ben.add_argument("--onnx-fp32", help="an exported fp32 bundle to use for -r onnx")
    ben.add_argument("--onnx-int8", help="an exported int8 bundle to use for -r onnx:int8")
    ben.add_argument("--json", help="also write the figures to this file")
    ben.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """`laya bench MODEL -r RUNTIME ...`: the table of timings (and `--json`'s figures)."""
    import laya
    from laya.encoder import bench, choice
    from laya.native.cpu import cpu

    args.onnx_bundle = {"fp32": args.onnx_fp32, "int8": args.onnx_int8}
    print(f"processor    {cpu().describe()}")
    specs = args.runtime or (bench.pick_candidates(force=args.force) if args.pick else ["torch"])
    models, skipped = {}, {}
    for spec in specs:
        name, _, precision = spec.partition(":")
        options = {"threads": args.threads} if args.threads and name not in ("mlx", "auto") else {}
        if precision:
            options["precision"] = precision
        if args.force and name in ("onnx", "torch", "llama"):
            options["force"] = True
        source = args.model
        if name == "onnx" and args.onnx_bundle and precision in ("", "fp32") and args.onnx_bundle.get("fp32"):
            source = args.onnx_bundle["fp32"]
        if name == "onnx" and args.onnx_bundle and precision == "int8" and args.onnx_bundle.get("int8"):
            source = args.onnx_bundle["int8"]
        started = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                models[spec] = laya.load(source, runtime=name, **options)
        except LayaError as exc:  # a refused precision (no bf16 units, a failed gate) is a result, not a crash
            skipped[spec] = str(exc).splitlines()[0]
            print(f"skipped {spec}: {skipped[spec]}", file=sys.stderr)
            continue
        print(f"loaded {spec} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    if not models:
        raise UsageError("no runtime could be loaded: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    results = bench.run(models, args.lengths, args.questions, args.state_tokens, args.repeats, args.warmup)
    bench.report(results)
    bench.report_gates(models, skipped)
    if args.pick:
        spec, path = choice.store_winner(models, results)
        print(f"picked {spec} for {Path(args.model).name} on this machine (used by runtime='auto'): {path}")
    if args.json:
        gates = {k: m.runtime.info().gate for k, m in models.items()}
        Path(args.json).write_text(json.dumps({"results": results, "skipped": skipped, "gates": gates}, indent=2))
    return 0
