"""Where reduced precision's error comes from: each part of the encoder in bf16 alone, and the splits.

    .venv/bin/python benchmarks/precision_errors.py [--shape base|small] [--adversarial] [--layers]

Runs the accuracy gate's fixed rows (laya.gate.gate_rows) through the fp32 reference once, then
through variants of torch's bf16 path, each with one part of the computation in bf16 and the rest in
fp32, and prints the largest change of any answer probability against fp32 (the gate's max |dp|)
for each: the projections (Wqkv's query, key and value thirds, the attention output, GeGLU's Wi and
Wo), attention itself (QK^T, softmax, PV), GeGLU's product, and with `--layers` each encoder layer
alone. Then the splits the
runtime can use, with the full gate (agreement and batch dependence too). Accuracy only: on a
processor without bf16 units torch emulates bf16 exactly (fp32 arithmetic on bf16-rounded inputs), so
the errors are the same there, only slower.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SHAPES = {
    "base": dict(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
                 local_attention=128, max_len=1024, head_max_len=256, seed=3),
    "small": dict(flavour="mmbert", hidden_size=256, num_layers=6, num_heads=4, intermediate_size=384,
                  local_attention=128, max_len=1024, head_max_len=256, seed=3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--adversarial", action="store_true", help="the adversarial generator (testgen.ADVERSARIAL)")
    parser.add_argument("--checkpoint", type=Path, help="an existing checkpoint instead of a generated one")
    parser.add_argument("--layers", action="store_true", help="also each encoder layer alone in bf16")
    parser.add_argument("--splits-only", action="store_true",
                        help="only the splits (on the full shape a gate takes minutes)")
    parser.add_argument("--int8", action="store_true", help="also ONNX int8, as exported and with Wqkv in fp32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import torch
    from laya.models.testgen import ADVERSARIAL, TestCheckpointSpec, write_test_checkpoint

    from laya.encoder.checkpoint import load_checkpoint
    from laya.encoder.runtimes import pytorch as tr
    from laya.gate import measure
    from laya.hardware import cpu

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint:
            folder = args.checkpoint
        else:
            spec = dict(SHAPES[args.shape], **(ADVERSARIAL if args.adversarial else {}))
            folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec(**spec))
        checkpoint = load_checkpoint(folder)
        print(f"processor: {cpu().describe()}")
        print(f"checkpoint: {folder} ({args.shape}{', adversarial' if args.adversarial else ''})")
        reference = tr.TorchRuntime(checkpoint, precision="fp32")

        def variant(parts: set[str], layers: set[int] | None = None) -> tr.TorchRuntime:
            run = tr.TorchRuntime.__new__(tr.TorchRuntime)
            run.net = tr.cast_bf16(copy.deepcopy(reference.net), parts=parts, layers=layers)
            run.precision, run.gate = "bf16", None
            return run

        def gate(run: tr.TorchRuntime) -> dict:
            started = time.perf_counter()
            record = measure(checkpoint, reference.forward, run.forward, "bf16")
            record["seconds"] = round(time.perf_counter() - started, 1)
            return record

        every = set(tr.BF16_PARTS)
        n = checkpoint.encoder.num_hidden_layers
        print("\none part in bf16 (every layer but the first), the rest fp32:")
        for part in () if args.splits_only else tr.BF16_PARTS:
            r = gate(variant({part}))
            print(f"  {part:10s} max |dp| {r['max_dp']:.4f}  batch dependence {r['batch_dependence_max_dp']:.4f}")
        if args.layers:
            print("\none layer in bf16 (every part), the rest fp32:")
            for i in range(n):
                r = gate(variant(every, {i}))
                print(f"  layer {i:2d} max |dp| {r['max_dp']:.4f}")
        print("\nsplits:")
        splits = {"everything but layer 0 (bf16 revision 2)": (every, None),
                  "the projections (attention, GeGLU's product fp32)": (every - {"attention", "geglu"}, None),
                  "the projections but queries and keys": (every - {"attention", "geglu", "wq", "wk"}, None)}
        for name, (parts, layers) in splits.items():
            r = gate(variant(parts, layers))
            print(f"  {name}: max |dp| {r['max_dp']:.4f}, agreement {r['argmax_agreement']:.3f}, batch dependence "
                  f"{r['batch_dependence_max_dp']:.4f}, {'passes' if r['passed'] else 'FAILS'} ({r['seconds']} s)")
        if args.int8:
            import laya.export.onnx as onnx_export

            for kept in (frozenset(), frozenset({"Wqkv"})):
                onnx_export.INT8_FP32_PROJECTIONS = kept
                r = onnx_export.export_bundle(checkpoint, Path(tmp) / f"int8-{len(kept)}", int8=True)["gate"]
                print(f"  ONNX int8{', Wqkv in fp32' if kept else ''}: max |dp| {r['max_dp']:.4f}, agreement "
                      f"{r['argmax_agreement']:.3f}, batch dependence {r['batch_dependence_max_dp']:.4f}, "
                      f"{'passes' if r['passed'] else 'FAILS'}")
        print(f"\nin the runtime (BF16_PARTS_USED = {sorted(tr.BF16_PARTS_USED)}):")
        r = gate(variant(set(tr.BF16_PARTS_USED)))
        print(f"  max |dp| {r['max_dp']:.4f}, agreement {r['argmax_agreement']:.3f}, batch dependence "
              f"{r['batch_dependence_max_dp']:.4f}, {'passes' if r['passed'] else 'FAILS'}")


if __name__ == "__main__":
    main()
