"""`laya predict`: answer questions about one state, or a JSONL file of requests (here or on a running
server)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from laya.apps.outbound import read_key_file
from laya.cli import common
from laya.cli.common import (
    PROBE_HELP,
    READOUT_HELP,
    Subparsers,
    UsageError,
    json_arg,
    order_arg,
    overflow_arg,
    state_arg,
)
from laya.request import AS_GIVEN


def register(sub: Subparsers) -> None:
    """Add `laya predict` to the subparsers `sub`."""
    from laya.decide.profiles import PROFILES as READOUT_CHOICES  # the readout profiles' one list

    predict = sub.add_parser("predict", help="answer questions about a state (or a JSONL file of requests)")
    common.add_model_args(predict, required=False)
    predict.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP)
    predict.add_argument("--decide-probe", metavar="FILE", help=PROBE_HELP)
    predict.add_argument("--state", "-s", help="state text, or @file (@- for stdin)")
    predict.add_argument("--state-json", action="store_true", help="parse the state as JSON (object or list)")
    predict.add_argument("--questions", "-q",
                         help="questions JSON, or @file.json (in a JSONL run: for the lines that have none)")
    predict.add_argument("--input", "-i", metavar="IN.jsonl",
                         help="one request per line (a System One body, or a JSON string state); with -o")
    predict.add_argument("--output", "-o", metavar="OUT.jsonl",
                         help="one answer or error per input line, in order; ids already there are skipped")
    predict.add_argument("--url", help="JSONL run: send the lines to this running laya serve instead of loading")
    predict.add_argument("--api-key-file", metavar="PATH",
                         help="with --url: a file holding that server's key (never read from LAYA_API_KEY)")
    predict.add_argument("--concurrency", type=int, metavar="N", help="with --url: requests in flight (default 4)")
    predict.add_argument("--no-progress", action="store_true", help="JSONL run: no progress on stderr")
    predict.add_argument("--pretty", action="store_true", help="indent the JSON output")
    predict.add_argument("--tournament", type=int, metavar="G",
                         help="answer every choice of more than G options by elimination in groups of G (choices "
                              "too large for the model's row always are, in groups of 16)")
    predict.add_argument("--min-confidence", type=float, metavar="P",
                         help="mark answers whose top probability is below P (x_low_confidence, x_abstention)")
    predict.add_argument("--overflow", choices=["truncate", "keep_start", "keep_end", "scan"],
                         help="a state longer than the model's row: truncate (the default: its start kept, a "
                              "conversation's end), keep_start, keep_end, or scan it in overlapping windows")
    predict.add_argument("--window", type=int, metavar="N", help="with --overflow scan: state tokens per window")
    predict.add_argument("--stride", type=int, metavar="N", help="with --overflow scan: tokens between windows")
    predict.add_argument("--order", type=order_arg, metavar="ORDER",
                         help="read each choice in these option orders and average them (x_order): as_given (the "
                              "default), both (as given and reversed) or rotate:K")
    predict.add_argument("--strict", action="store_true",
                         help="answers with the contract's fields only, no x_ extension (a JSONL run's too)")
    predict.set_defaults(func=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    """`laya predict -m M -s STATE -q QUESTIONS`: one response, as JSON on stdout."""
    if args.input is not None or args.output is not None:
        return predict_lines(args)
    for flag, value in (("--url", args.url), ("--concurrency", args.concurrency)):
        if value is not None:
            raise UsageError(f"{flag} is for a JSONL run: add -i IN.jsonl -o OUT.jsonl")
    for flag, value in (("--model", args.model), ("--state", args.state), ("--questions", args.questions)):
        if value is None:
            raise UsageError(f"{flag} is required (or -i IN.jsonl -o OUT.jsonl for many requests)")
    questions = json_arg(args.questions, "--questions")
    state = state_arg(args.state, args.state_json)
    model = common.load_model(args)
    overflow = overflow_arg(args)
    response = model.predict(state, questions, tournament=args.tournament, min_confidence=args.min_confidence,
                             overflow=overflow, order=args.order or AS_GIVEN, strict=args.strict)
    print(json.dumps(response, ensure_ascii=False, indent=2 if args.pretty else None))
    return 0


def predict_lines(args: argparse.Namespace) -> int:
    """`laya predict -i IN.jsonl -o OUT.jsonl`: one request per line (laya.apps.jsonl); exit 1 if any failed."""
    from laya.apps import jsonl

    if args.input is None or args.output is None:
        raise UsageError("a JSONL run takes both -i IN.jsonl and -o OUT.jsonl")
    for flag, value in (("--state", args.state), ("--state-json", args.state_json or None),
                        ("--tournament", args.tournament), ("--min-confidence", args.min_confidence),
                        ("--overflow", args.overflow), ("--window", args.window), ("--stride", args.stride),
                        ("--order", args.order)):
        if value is not None:
            raise UsageError(f"{flag} is per request in a JSONL run: put it in the lines (\"state\", "
                             "\"tournament\", \"x_min_confidence\", \"x_overflow\", \"x_order\")")
    source, out = Path(args.input), Path(args.output)
    if not source.is_file():
        raise UsageError(f"-i {source}: no such file")
    if source.resolve() == out.resolve():
        raise UsageError("-o must not be the input file")
    questions = json_arg(args.questions, "--questions") if args.questions is not None else None
    if args.url is not None:
        if args.model is not None:
            raise UsageError("--url sends the lines to a running server, which has its models: drop --model "
                             "(or put \"model\" in the lines)")
        answer = jsonl.remote_answer(args.url, read_key_file(args.api_key_file, "--api-key-file"),
                                     args.concurrency or 4, strict=args.strict)
        chunk = max(jsonl.CHUNK, 4 * (args.concurrency or 4))
    else:
        if args.model is None:
            raise UsageError("--model is required (or --url to use a running laya serve)")
        answer, chunk = jsonl.local_answer(common.make_engine(args), strict=args.strict), jsonl.CHUNK
    try:
        tally = jsonl.run(jsonl.read_lines(source, questions), out, answer, total=jsonl.count_lines(source),
                          chunk=chunk, progress=not args.no_progress)
    finally:
        getattr(answer, "close", lambda: None)()
    print(f"laya: {tally.answered} answered, {tally.failed} failed, {tally.skipped} already in {out}",
          file=sys.stderr)
    return 1 if tally.failed else 0
