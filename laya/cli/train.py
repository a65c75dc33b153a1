"""`laya train`: fine-tune a checkpoint on labelled decisions (laya.training), writing a checkpoint in the
published format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from laya.cli.common import Subparsers, add_training_args, training_settings


def register(sub: Subparsers) -> None:
    """Add `laya train` to the subparsers `sub`."""
    trn = sub.add_parser("train", help="fine-tune a checkpoint on labelled decisions; writes a checkpoint in the "
                                       "published format with refitted temperatures and a trained act head")
    trn.add_argument("model", help="checkpoint folder, registered name or Hub id")
    trn.add_argument("data", help="JSONL (labels, upstream's expected, or gold per line) or CSV (text and label "
                                  "columns)")
    trn.add_argument("--out", required=True, help="folder of the fine-tuned checkpoint (epochs/ and report/ inside)")
    add_training_args(trn)
    trn.add_argument("--resume", action="store_true", help="continue from the last epoch checkpoint in --out")
    trn.add_argument("--text-column", default="text", help="CSV: the column holding the text")
    trn.add_argument("--label-column", default="label", help="CSV: the column holding the label")
    trn.add_argument("--target-precision", type=float, default=0.9,
                     help="precision the stored per-bucket abstention thresholds aim at")
    trn.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")
    trn.add_argument("--quiet", action="store_true", help="no progress bar")
    trn.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """`laya train MODEL DATA --out DIR`: the fine-tuned checkpoint, and its summary on stdout."""
    from laya.training.loop import Settings
    from laya.training.run import summary, train

    settings = Settings(**training_settings(args), threads=args.threads)
    report = train(args.model, args.data, args.out, settings=settings, resume=args.resume,
                   text_column=args.text_column, label_column=args.label_column,
                   target_precision=args.target_precision, quiet=args.quiet, plots=not args.no_plots)
    print(summary(report))
    print(f"wrote {args.out} (report in {Path(args.out) / 'report'})", file=sys.stderr)
    return 0
