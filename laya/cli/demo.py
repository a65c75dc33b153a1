"""`laya demo`: a sample routing request answered by the best model this machine can reach, so a new install
shows the pipeline working (with a random-weight checkpoint when no model is reachable)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from laya.cli.common import Subparsers
from laya.errors import LayaError

DEMO_STATE = "Hi, I was charged twice for my subscription this month and I want the extra payment refunded."
DEMO_QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this message?",
             "criteria": {"billing": "payments, invoices and refunds", "sales": "new plans and pricing",
                          "support": "technical problems"}},
    "urgent": {"type": "noul", "instructions": "Does this need action today?"},
    "anger": {"type": "score", "instructions": "How upset is the customer?",
              "criteria": ["calm", "annoyed", "angry"]},
}


def register(sub: Subparsers) -> None:
    """Add `laya demo` to the subparsers `sub`."""
    demo = sub.add_parser("demo", help="answer a sample routing request (falls back to a random-weight model)")
    demo.add_argument("--model", "-m", default="laya-multilingual", help="model to try first")
    demo.add_argument("--demo-dir", default="~/.cache/laya/demo-checkpoint",
                      help="where the random-weight fallback checkpoint is written")
    demo.add_argument("--online", action="store_true", help="download the model from the Hub if not cached")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Answer a routing request with the best model this machine can reach."""
    import laya
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    try:
        model = laya.load(args.model, local_only=not args.online)
        note = f"model {model.name} ({model.checkpoint.source})"
    except LayaError as exc:
        folder = Path(args.demo_dir).expanduser()
        if not (folder / "model.safetensors").exists():
            write_test_checkpoint(folder, TestCheckpointSpec(seed=0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            model = laya.load(folder, name="laya-demo-random")
        note = (f"{args.model} is not reachable here ({exc}).\nUsing a generated checkpoint with RANDOM weights "
                f"at {folder}: the pipeline is real, the answers are meaningless.")
    print(note, file=sys.stderr)
    print(f"state: {DEMO_STATE}", file=sys.stderr)
    print(json.dumps(model.predict(DEMO_STATE, DEMO_QUESTIONS), ensure_ascii=False, indent=2))
    return 0
