"""`laya decide`: the values of a JSON schema decided from a state (laya.structured), printed as JSON."""

from __future__ import annotations

import argparse
import json

from laya.cli import common
from laya.cli.common import Subparsers, is_file, json_arg, state_arg


def register(sub: Subparsers) -> None:
    """Add `laya decide` to the subparsers `sub`."""
    decide = sub.add_parser("decide", help="decide the values of a JSON schema from a state and print them")
    common.add_model_args(decide)
    decide.add_argument("--schema", required=True,
                        help="a JSON schema (enums, booleans, bounded integers): a file, @file or inline JSON")
    decide.add_argument("--state", "-s", required=True, help="state text, or @file (@- for stdin)")
    decide.add_argument("--state-json", action="store_true", help="parse the state as JSON (object or list)")
    decide.add_argument("--min-confidence", type=float, metavar="P",
                        help="a field whose answer's top probability is below P comes back as null")
    decide.add_argument("--details", action="store_true",
                        help="print the values with each field's probabilities, confidence and raw answer")
    decide.add_argument("--pretty", action="store_true", help="indent the JSON output")
    decide.set_defaults(func=cmd_decide)


def cmd_decide(args: argparse.Namespace) -> int:
    """`laya decide -m M --schema S -s STATE`: the decided values (with `--details`, how each was read)."""
    value = args.schema
    if not value.startswith("@") and not value.lstrip().startswith("{") and is_file(value):
        value = "@" + value
    schema = json_arg(value, "--schema")
    state = state_arg(args.state, args.state_json)
    model = common.load_model(args)
    out = model.decide(state, schema, return_details=args.details, min_confidence=args.min_confidence)
    print(json.dumps(out.to_json() if args.details else out, ensure_ascii=False, indent=2 if args.pretty else None))
    return 0
