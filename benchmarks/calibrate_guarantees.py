"""The worked example of docs/calibration/guarantees.md: prediction sets and an error bound, per language.

The keyword-routing task (`laya.testing.routing_task`): support messages in four languages go to one
of four teams; the German labels come from a sloppy annotator (40% of them another team's). The
generated 2-layer checkpoint is fine-tuned on 4,000 lines with `laya train` (fp32, one thread), then
`laya calibrate` runs on 3,000 fresh lines whose `group` is their language:

    .venv/bin/python benchmarks/calibrate_guarantees.py --out docs/calibration/guarantees

writes the calibration file, the report (JSON, text) and the plots into --out. Minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/calibration/guarantees")
    parser.add_argument("--train-lines", type=int, default=4000)
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--coverage", default="0.9")
    parser.add_argument("--max-error", default="0.05")
    parser.add_argument("--confidence", default="0.95")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import laya
    from laya.cli import main as laya_main
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint
    from laya.testing.routing_task import routing_lines, write_jsonl

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = write_test_checkpoint(Path(tmp) / "source", TestCheckpointSpec(seed=3, num_layers=2))
        train = write_jsonl(Path(tmp) / "train.jsonl", routing_lines(args.train_lines, seed=1))
        model = Path(tmp) / "routing"
        laya.train(source, train, model, quiet=True, plots=False, epochs=args.epochs, encoder_lr=3e-4, head_lr=1e-3,
                   batch_size=8, holdout=0.3, seed=0, device="cpu", precision="fp32", threads=1)
        data = Path(tmp) / "calibrate.jsonl"
        with open(data, "w", encoding="utf-8") as handle:
            for line in routing_lines(args.lines, seed=2):
                handle.write(json.dumps({"state": line["state"], "questions": line["questions"],
                                         "labels": line["labels"], "group": line["language"]}) + "\n")
        code = laya_main(["calibrate", str(model), str(data), "--runtime", "torch", "--out",
                          str(out / "routing.calibration.json"), "--report-dir", str(out), "--coverage", args.coverage,
                          "--max-error", args.max_error, "--confidence", args.confidence, "--group-by", "group",
                          "--holdout", "0.5"])
    raise SystemExit(code)


if __name__ == "__main__":
    main()
