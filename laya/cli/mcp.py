"""`laya mcp`: the decision tools for agents as an MCP server (laya.apps.mcp), on stdio or HTTP, answering
with a model here or a running `laya serve`."""

from __future__ import annotations

import argparse
import os
import sys

from laya.apps.outbound import read_key_file
from laya.cli import common
from laya.cli.common import READOUT_HELP, Subparsers, UsageError, read_api_key, refuse_api_key_flag


def register(sub: Subparsers) -> None:
    """Add `laya mcp` to the subparsers `sub`."""
    from laya.decide.profiles import PROFILES as READOUT_CHOICES  # the readout profiles' one list

    mcp = sub.add_parser("mcp", help="the decision tools for agents: an MCP server (stdio, or --http)")
    common.add_model_args(mcp, required=False)
    mcp.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP)
    mcp.add_argument("--http", action="store_true",
                     help="serve MCP over streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="with --http: address to bind (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, help="with --http: port (default 8765)")
    mcp.add_argument("--api-key-file", metavar="PATH",
                     help="with --http: a file holding the key clients must send as a bearer token (or LAYA_API_KEY)")
    mcp.add_argument("--url-key-file", metavar="PATH",
                     help="with --url: a file holding that server's key (never read from LAYA_API_KEY)")
    mcp.add_argument("--api-key", help=argparse.SUPPRESS)
    mcp.add_argument("--url", help="front a running laya serve at this URL instead of loading a model")
    mcp.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    """`laya mcp`: the decision tools for agents over MCP (laya.apps.mcp), on stdio or HTTP; the model
    loads in the background (or, with --url, a running laya serve answers)."""
    from laya.apps.mcp import run

    refuse_api_key_flag(args)
    if args.url is not None and args.model is not None:
        raise UsageError("--url answers with the running server's models: drop --model")
    if args.url is None and args.model is None:
        raise UsageError("--model is required (or --url to front a running laya serve)")
    if not args.http and (args.host != "127.0.0.1" or args.port is not None):
        raise UsageError("--host and --port are for --http (stdio is the default transport)")
    if args.url_key_file is not None and args.url is None:
        raise UsageError("--url-key-file is the key of the server --url names")
    api_key = read_api_key(args.api_key_file) if args.http else None
    url_key = read_key_file(args.url_key_file, "--url-key-file")
    load = None if args.model is None else (lambda: common.make_engine(args))
    run(load=load, source=args.model, url=args.url, api_key=api_key, url_key=url_key, http=args.http,
        host=args.host, **({"port": args.port} if args.port is not None else {}))
    # The client went away; the engine is closed. A model still loading in the background (an export or a
    # compile in flight, with native threads of its own) must not be torn down by the interpreter's exit:
    # C++ destroys joinable threads with std::terminate ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
