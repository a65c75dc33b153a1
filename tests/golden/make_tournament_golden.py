"""Make the tournament goldens: upstream's `laya.shortlist.predict_tournament` (laya 0.4.15, group 16)
on choices of 40, 100 and 255 options over both golden checkpoints.

    .venv/bin/python tests/golden/make_tournament_golden.py [--upstream-venv DIR]

Runs upstream in its own virtual environment (as `make_golden.py` does) on copies of the committed
golden checkpoints, and records each case's input, the finalists, the rounds and the final call's
unrounded answers in `tournament.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_golden import ensure_upstream, run_on_golden_copies  # noqa: E402

LONG = "the description of this option, long enough that many of them no longer fit in one row"


def tournament_cases() -> list[dict]:
    """Choices too large for one row (and one that fits, answered in one call), with other questions."""
    def labels(n: int, stem: str) -> dict:
        return {f"{stem} {i}": f"{LONG} ({i})" for i in range(n)}

    urgent = {"type": "noul", "instructions": "Is this urgent?"}
    return [
        {"id": "t40", "state": "I was charged twice for the same order and want a refund today.",
         "questions": {"route": {"type": "choice", "instructions": "Which queue?", "criteria": labels(40, "queue")}}},
        {"id": "t100", "state": "The login page shows an error after the last update.",
         "questions": {"topic": {"type": "choice", "instructions": "Which topic?", "criteria": labels(100, "topic")},
                       "urgent": urgent}},
        {"id": "t255", "state": ["hello", "my parcel never arrived and I am angry"],
         "questions": {"team": {"type": "choice", "instructions": "Which team?",
                                "criteria": [f"team {i}" for i in range(255)]}}},
        {"id": "t255-described", "state": {"message": "cancel my subscription", "plan": "pro"},
         "questions": {"team": {"type": "choice", "instructions": "Which team?", "criteria": labels(255, "team")},
                       "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "angry"]}}},
    ]


RUNNER = r'''
import json, sys
import laya.agent as upstream
from laya.shortlist import predict_tournament
import torch
upstream.round = lambda value, ndigits=None: value
job = json.load(open(sys.argv[1], encoding="utf-8"))
torch.manual_seed(0)
results = {}
for name, spec in job["checkpoints"].items():
    agent = upstream.Agent(spec["path"], device="cpu")
    out = []
    for case in spec["cases"]:
        result = predict_tournament(agent, case["state"], case["questions"], group_size=16)
        out.append({"id": case["id"], "response": result})
    results[name] = out
json.dump({"results": results, "laya": __import__("laya").__version__}, open(sys.argv[2], "w", encoding="utf-8"),
          ensure_ascii=False)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-venv", type=Path, default=HERE.parents[1] / ".venv-upstream")
    args = parser.parse_args()
    python = ensure_upstream(args.upstream_venv)
    job, out = run_on_golden_copies(python, RUNNER, tournament_cases())
    records = [{"checkpoint": name, **case, "response": result["response"]}
               for name, spec in job["checkpoints"].items()
               for case, result in zip(spec["cases"], out["results"][name])]
    golden = {"upstream": {"laya": out["laya"], "function": "laya.shortlist.predict_tournament", "group_size": 16},
              "checkpoints": {n: f"checkpoints/{n}" for n in job["checkpoints"]}, "cases": records}
    (HERE / "tournament.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(records)} tournament cases recorded -> {HERE / 'tournament.json'}")


if __name__ == "__main__":
    main()
