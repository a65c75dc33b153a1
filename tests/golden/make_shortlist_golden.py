"""Make the shortlist goldens: upstream's `laya.shortlist.predict_shortlist` with
`embed_fn_from_agent` (laya 0.4.15) over both golden checkpoints.

    .venv/bin/python tests/golden/make_shortlist_golden.py [--upstream-venv DIR]

Runs upstream in its own virtual environment (as `make_golden.py` does) on copies of the committed
golden checkpoints, and records each case's input, the kept labels with their cosine scores, and the
final call's unrounded answers in `shortlist.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_golden import ensure_upstream, run_on_golden_copies  # noqa: E402

INTENTS = ["card arrived late", "card not working", "refund not received", "exchange rate wrong", "top up failed",
           "transfer pending", "pin blocked", "account locked", "cash withdrawal fee", "card payment declined",
           "wrong amount charged", "lost or stolen card", "change personal details", "verify identity",
           "contactless not working", "apple pay not working", "virtual card request", "close account",
           "direct debit", "beneficiary not allowed", "cancel transfer", "get physical card", "card about to expire",
           "terminate account", "unable to verify", "why verify identity", "wrong exchange rate for cash",
           "balance not updated", "pending card payment", "declined transfer"]


def shortlist_cases() -> list[dict]:
    """Choices narrowed to k of n (described and plain, a state object, k at and past n, ties), with
    other questions beside them."""
    described = {label: f"the customer says: {label}" for label in INTENTS}
    return [
        {"id": "banking-plain", "k": 5, "state": "I was charged twice for the same coffee and want my money back",
         "questions": {"intent": {"type": "choice", "instructions": "Which intent?", "criteria": INTENTS}}},
        {"id": "banking-described", "k": 8, "state": "My card stopped working at the shop this morning",
         "questions": {"intent": {"type": "choice", "instructions": "Which intent?", "criteria": described},
                       "urgent": {"type": "noul", "instructions": "Is it urgent?"}}},
        {"id": "object-state", "k": 3, "state": {"message": "please close my account", "tier": "gold"},
         "questions": {"intent": {"type": "choice", "instructions": "Why is the customer writing?",
                                  "criteria": INTENTS[:12]},
                       "anger": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "angry"]}}},
        {"id": "k-equals-n", "k": 4, "state": "where is my new card",
         "questions": {"intent": {"type": "choice", "instructions": "Which?", "criteria": INTENTS[:4]}}},
        {"id": "two-choices", "k": 2, "state": "the exchange rate on my transfer was wrong",
         "questions": {"a": {"type": "choice", "instructions": "Which intent?", "criteria": INTENTS[:10]},
                       "b": {"type": "choice", "instructions": "What is it about?",
                             "criteria": {"money": None, "card": "a card problem", "other": ""}}}},
    ]


RUNNER = r'''
import json, sys
import laya.agent as upstream
from laya.shortlist import embed_fn_from_agent, predict_shortlist
import torch
upstream.round = lambda value, ndigits=None: value
job = json.load(open(sys.argv[1], encoding="utf-8"))
torch.manual_seed(0)
results = {}
for name, spec in job["checkpoints"].items():
    agent = upstream.Agent(spec["path"], device="cpu")
    embed = embed_fn_from_agent(agent)
    out = []
    for case in spec["cases"]:
        result = predict_shortlist(agent, case["state"], case["questions"], embed, k=case["k"])
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
    job, out = run_on_golden_copies(python, RUNNER, shortlist_cases())
    records = [{"checkpoint": name, **case, "response": result["response"]}
               for name, spec in job["checkpoints"].items()
               for case, result in zip(spec["cases"], out["results"][name])]
    golden = {"upstream": {"laya": out["laya"], "function": "laya.shortlist.predict_shortlist",
                           "embed_fn": "laya.shortlist.embed_fn_from_agent(agent)"},
              "checkpoints": {n: f"checkpoints/{n}" for n in job["checkpoints"]}, "cases": records}
    (HERE / "shortlist.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(records)} shortlist cases recorded -> {HERE / 'shortlist.json'}")


if __name__ == "__main__":
    main()
