"""How far each reduced-precision plan of the packed runtime moves answers from fp32, on hard checkpoints.

    .venv/bin/python benchmarks/precision_errors.py [--shape base|small] [--weights adversarial|conditioned|raw]

Runs the gate's fixed rows (laya.encoder.gate.gate_rows) through the fp32 network once, then through every
plan the packed runtime's gates can choose (bf16 with every encoder layer reduced, and with the first
kept in fp32; the same for int8; fp16), eagerly, and prints each plan's gate record against the
precision standard. Accuracy only: on a processor without bf16 units torch emulates bf16 (fp32
arithmetic on bf16-rounded values), so the figures are the same there, only slower. `adversarial`
weights (laya.testing.checkpoints.ADVERSARIAL: content-dependent attention, answers mid-range) are the
gate tests' hard case; `raw` ones make attention one-hot at the full shape, where every reduced
precision fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WEIGHTS = {"adversarial": {"attention_logit_std": 4.0, "scorer_gain": 1.0},
           "conditioned": {"attention_logit_std": 1.0, "scorer_gain": 1.0}, "raw": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["base", "small"], default="small")
    parser.add_argument("--weights", choices=sorted(WEIGHTS), default="adversarial")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import torch
    from vs_upstream import SHAPES

    from laya.encoder.checkpoint import load_checkpoint
    from laya.encoder.gate import describe, measure
    from laya.encoder.runtimes.packed import RowByRow, _eager
    from laya.encoder.runtimes.rownet import Plan, RowNet
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec(**SHAPES[args.shape],
                                                                              **WEIGHTS[args.weights]))
        checkpoint = load_checkpoint(folder)
        embeddings = torch.from_numpy(checkpoint.weights.stored("encoder.embeddings.tok_embeddings.weight"))

        def forward(plan: Plan):
            return RowByRow(_eager(RowNet(checkpoint, plan).eval()), embeddings).forward

        reference = forward(Plan())
        print(f"{args.shape} shape, {args.weights} weights: each plan against fp32 on the gate's rows")
        for precision, attention in (("bf16", "bf16"), ("int8", "bf16"), ("fp16", "fp16")):
            for kept in (0, 1):
                plan = Plan(precision, attention, kept)
                record = measure(checkpoint, reference, forward(plan), precision)
                verdict = "holds" if record["passed"] else "fails"
                print(f"  {plan.describe():70s} {verdict}: {describe(record)}", flush=True)


if __name__ == "__main__":
    main()
