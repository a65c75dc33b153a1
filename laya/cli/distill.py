"""`laya distill`: train a fast checkpoint on a slow teacher's answers (laya.apps.distill), the teacher here
or behind a URL with its own key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from laya.apps.outbound import read_key_file
from laya.cli.common import Subparsers, UsageError, add_training_args, json_arg, training_settings


def register(sub: Subparsers) -> None:
    """Add `laya distill` to the subparsers `sub`."""
    dst = sub.add_parser("distill", help="train a fast checkpoint on a slow teacher's answers to your states")
    dst.add_argument("states", help="JSONL: a state per line (text or JSON), or {\"state\", \"labels\"?}")
    dst.add_argument("--teacher", required=True,
                     help="a System One URL[#model=NAME] (with --teacher-key), a chat .gguf[:READOUT] or a checkpoint")
    dst.add_argument("--student", required=True, help="the checkpoint to train (folder, registered name or Hub id)")
    dst.add_argument("--questions", "-q", required=True, help="the questions: inline JSON or @file")
    dst.add_argument("--out", required=True, help="folder of the student checkpoint (teacher/ and report/ inside)")
    dst.add_argument("--teacher-key", metavar="PATH",
                     help="a file holding the teacher URL's key (never read from LAYA_API_KEY)")
    dst.add_argument("--concurrency", type=int, default=4, help="requests in flight to a teacher URL")
    dst.add_argument("--rate", type=float, help="at most this many requests a second to a teacher URL")
    dst.add_argument("--hard-weight", type=float, default=0.5,
                     help="weight of a state's own labels, where given, against the teacher's probabilities")
    dst.add_argument("--student-layers", type=int, metavar="N",
                     help="cut the student to N encoder layers before training (the global and sliding-window "
                          "kinds kept in their places); --student may be the teacher's own checkpoint")
    dst.add_argument("--min-agreement", type=float, metavar="A",
                     help="write the student only if its held-out top-1 agreement with the teacher reaches A "
                          "(0 to 1) on every question")
    add_training_args(dst)
    dst.add_argument("--quiet", action="store_true", help="no progress")
    dst.set_defaults(func=cmd_distill)


def cmd_distill(args: argparse.Namespace) -> int:
    """`laya distill --teacher T --student S STATES.jsonl -q Q --out DIR`."""
    from laya.apps import distill
    from laya.apps.evaluation import parse_method

    questions = json_arg(args.questions, "--questions")
    teacher = parse_method(args.teacher)
    if args.teacher_key is not None and not teacher.remote:
        raise UsageError("--teacher-key is the key of a teacher URL; this teacher runs here")
    key = read_key_file(args.teacher_key, "--teacher-key")
    report = distill.distill(args.teacher, args.student, args.states, questions, args.out, api_key=key,
                             concurrency=args.concurrency, rate=args.rate, hard_weight=args.hard_weight,
                             threads=args.threads, progress=not args.quiet, student_layers=args.student_layers,
                             min_agreement=args.min_agreement, **training_settings(args))
    print(distill.summary(report))
    print(f"wrote {args.out} (report in {Path(args.out) / 'report' / distill.REPORT})", file=sys.stderr)
    return 0
