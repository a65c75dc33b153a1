"""Compact prompts for the Neural Engine: what share of the golden rows fits a Neural Engine bucket
with and without compact mode, and how far compaction moves the answers from the exact ones.

    .venv/bin/python benchmarks/compact_prompts.py

Runs the Core ML runtime with its fp32 torch programs (`executor="torch"`, the graphs the bundles are
converted from; rows routed to the buckets as on a Mac) over the golden cases of both golden
checkpoints, once exact and once with `compact=True`. Prints a table and writes nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden"


def probs(answer: dict) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([1.0 - answer["noul"], answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def main() -> None:
    import laya
    from laya.errors import QuestionError

    record = json.loads((GOLDEN / "answers.json").read_text(encoding="utf-8"))
    print("| checkpoint | rows | on the Neural Engine, exact | with compact | compacted rows | "
          "max abs dp | median abs dp (compacted) | top answer changed |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rel in record["checkpoints"].items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exact = laya.load(GOLDEN / rel, runtime="coreml", executor="torch")
            compact = laya.load(GOLDEN / rel, runtime="coreml", executor="torch", compact=True)
        dps, changed, compacted_rows = [], 0, 0
        for case in record["cases"]:
            if case["checkpoint"] != name:
                continue
            try:
                want = exact.predict(case["state"], case["questions"])
            except QuestionError:
                continue
            got = compact.predict(case["state"], case["questions"])
            shortened = got["x_usage"].get("compacted", {})
            compacted_rows += len(shortened)
            for qid in shortened:
                a, b = probs(got["answers"][qid]), probs(want["answers"][qid])
                dps.append(float(np.max(np.abs(a - b))))
                changed += int(np.argmax(a) != np.argmax(b))
        rows = sum(exact.runtime.routed.values())
        print(f"| {name} | {rows} | {exact.runtime.routed['ane'] / rows:.0%} | "
              f"{compact.runtime.routed['ane'] / rows:.0%} | {compacted_rows} | {max(dps, default=0):.3f} | "
              f"{statistics.median(dps) if dps else 0:.3f} | {changed} of {len(dps)} |")


if __name__ == "__main__":
    sys.exit(main())
