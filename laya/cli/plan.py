"""`laya plan`: what a request would take, asked before it is sent (from the model here or a running
server), so a script can check it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from laya.apps.outbound import bearer, check_key_transport, read_key_file, request
from laya.cli import common
from laya.cli.common import READOUT_HELP, Subparsers, UsageError, json_arg, order_arg, overflow_arg, state_arg
from laya.errors import LayaError, QuestionError
from laya.limits import Limits


def register(sub: Subparsers) -> None:
    """Add `laya plan` to the subparsers `sub`."""
    from laya.decide.profiles import PROFILES as READOUT_CHOICES  # the readout profiles' one list

    pln = sub.add_parser("plan", help="what a request would take (rows, tokens, state kept, limits), no forward pass")
    common.add_model_args(pln, required=False)
    pln.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP)
    pln.add_argument("--state", "-s", required=True, help="state text, or @file (@- for stdin)")
    pln.add_argument("--state-json", action="store_true", help="parse the state as JSON (object or list)")
    pln.add_argument("--questions", "-q", required=True, help="questions JSON, or @file.json")
    pln.add_argument("--url", help="ask this running laya serve (POST /v1/systemone/plan) instead of loading")
    pln.add_argument("--api-key-file", metavar="PATH",
                     help="with --url: a file holding that server's key (never read from LAYA_API_KEY)")
    pln.add_argument("--tournament", type=int, metavar="G", help="as for predict")
    pln.add_argument("--overflow", choices=["truncate", "keep_start", "keep_end", "scan"], help="as for predict")
    pln.add_argument("--window", type=int, metavar="N", help="with --overflow scan: state tokens per window")
    pln.add_argument("--stride", type=int, metavar="N", help="with --overflow scan: tokens between windows")
    pln.add_argument("--order", type=order_arg, metavar="ORDER",
                     help="as for predict: each choice's rows counted once per order")
    pln.add_argument("--pretty", action="store_true", help="indent the JSON output")
    pln.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    """`laya plan`: what a request would take (rows, tokens, the state kept, the limits near or over,
    the runtime), from the model here or from a running server (`--url`), with no forward pass.
    Exit 1 when the request would be refused, so a script can check before it sends."""
    if (args.model is None) == (args.url is None):
        raise UsageError("give --model (plan with the model here) or --url (ask a running laya serve)")
    questions = json_arg(args.questions, "--questions")
    state = state_arg(args.state, args.state_json)
    overflow = overflow_arg(args)
    if args.url is not None:
        out = _remote_plan(args, {"state": state, "questions": questions,
                                  **({"tournament": args.tournament} if args.tournament is not None else {}),
                                  **({"x_overflow": _overflow_body(overflow)} if overflow is not None else {}),
                                  **({"x_order": args.order} if args.order is not None else {})})
    else:
        from laya.plan import report
        from laya.request import AS_GIVEN, Request

        engine = common.make_engine(args)
        try:
            out = engine.plan(Request.of([state], questions, tournament=args.tournament, overflow=overflow,
                                         order=args.order or AS_GIVEN), limits=Limits())
        except QuestionError as exc:  # refused before the engine: the report says so, as a server's 422 would
            out = report(engine.info.name, engine.describe(), Limits(), states=[], exact=True, refused=exc,
                         figures={"states": 1, "questions": len(questions) if isinstance(questions, dict) else 0})
    print(json.dumps(out, ensure_ascii=False, indent=2 if args.pretty else None))
    return 1 if out.get("refused") else 0


def _overflow_body(overflow: Any) -> Any:
    """`--overflow` as a request body says it (`x_overflow`)."""
    from laya.request import Scan

    if isinstance(overflow, Scan):
        return {"scan": {**({"window": overflow.window} if overflow.window is not None else {}),
                         **({"stride": overflow.stride} if overflow.stride is not None else {})}}
    return overflow


def _remote_plan(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    key = read_key_file(args.api_key_file, "--api-key-file")
    check_key_transport(args.url, key, "--api-key-file")
    try:
        with httpx.Client(base_url=args.url.rstrip("/"), headers=bearer(key), timeout=60) as client:
            r = request(client, "POST", "/v1/systemone/plan", json=body)
    except httpx.HTTPError as exc:
        raise LayaError(f"{args.url} cannot be reached: {exc}") from None
    if r.status_code != 200:
        from laya.apps.jsonl import server_failure

        error = server_failure(r)
        raise LayaError(f"{args.url} answered {r.status_code} ({error['type']}): {error['message']}")
    return r.json()
