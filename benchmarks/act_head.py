"""The trained act head against the top probability, per task and training seed.

    .venv/bin/python benchmarks/act_head.py [--tasks routing uniform app] [--seeds 0 1 2] [--lines 4000]

Each (task, seed) is one `laya train` run of the generated 2-layer checkpoint (d 128) on the task's
lines (`laya.testing.routing_task`), fp32, one thread, 10 epochs, 64% of the lines held out (half fit
the act head and the temperatures, half measure). Printed per run: held-out accuracy, the AUROC at
telling right answers from wrong ones on the measuring half of the act probability and of the top
probability (as served, tempered; and untempered, as the act head reads it), which head was kept
and why. Slow (minutes per run): a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

TASKS = ("routing", "uniform", "app")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import laya
    from laya.native.cpu import cpu
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint
    from laya.testing.routing_task import app_footer_lines, routing_lines, uniform_noise_lines, write_jsonl

    makers = {"routing": routing_lines, "uniform": uniform_noise_lines, "app": app_footer_lines}
    print(f"processor: {cpu().describe()}")
    print(f"{'task':8s} {'seed':>4s} {'acc':>6s} {'act':>7s} {'top':>7s} {'top(u)':>7s} {'gain':>7s}  kept")
    with tempfile.TemporaryDirectory() as tmp:
        source = write_test_checkpoint(Path(tmp) / "source", TestCheckpointSpec(seed=3, num_layers=2))
        for task in args.tasks:
            data = write_jsonl(Path(tmp) / f"{task}.jsonl", makers[task](args.lines, seed=1))
            for seed in args.seeds:
                started = time.perf_counter()
                report = laya.train(source, data, Path(tmp) / f"{task}-{seed}", quiet=True, plots=False,
                                    epochs=args.epochs, encoder_lr=3e-4, head_lr=1e-3, batch_size=8, holdout=0.64,
                                    seed=seed, device="cpu", precision="fp32", threads=1)
                act = report["act_head"]
                gain = act["auroc"] - max(act["auroc_top_probability"], act["auroc_top_probability_untempered"])
                print(f"{task:8s} {seed:4d} {report['heldout']['after']['accuracy']:6.3f} {act['auroc']:7.4f} "
                      f"{act['auroc_top_probability']:7.4f} {act['auroc_top_probability_untempered']:7.4f} "
                      f"{gain:+7.4f}  {act['chosen']} ({time.perf_counter() - started:.0f} s)", flush=True)
                print("    " + json.dumps(act.get("says")), flush=True)


if __name__ == "__main__":
    main()
