"""The `laya` command line.

User mistakes (a missing file, bad JSON, an unknown model, a question that cannot be answered)
print one line on stderr and exit 2; they never print a traceback.

Each subcommand is a module here with `register(sub)` (its parser, its handler as `func`) and the handler;
`common` holds what several share.
"""

from __future__ import annotations

import argparse
import sys

from laya.cli import (
    bench,
    calibrate,
    common,
    decide,
    demo,
    distill,
    evaluate,
    export,
    info,
    mcp,
    plan,
    predict,
    prepare,
    serve,
    train,
)
from laya.cli.bench import cmd_bench
from laya.cli.calibrate import cmd_calibrate
from laya.cli.common import (
    N_CTX_HELP,
    PROBE_HELP,
    READOUT_HELP,
    UsageError,
    read_api_key,
    runtime_options,
)
from laya.cli.decide import cmd_decide
from laya.cli.demo import DEMO_QUESTIONS, DEMO_STATE, cmd_demo
from laya.cli.distill import cmd_distill
from laya.cli.evaluate import cmd_eval, url_keys
from laya.cli.export import cmd_export
from laya.cli.info import cmd_info
from laya.cli.mcp import cmd_mcp
from laya.cli.plan import cmd_plan
from laya.cli.predict import cmd_predict, predict_lines
from laya.cli.prepare import cmd_prepare
from laya.cli.serve import LOOPBACK_BINDS, calibration_args, cmd_serve, nonnegative_float, positive_float, serve_on_ray
from laya.cli.train import cmd_train

__all__ = [
    "DEMO_QUESTIONS", "DEMO_STATE", "LOOPBACK_BINDS", "N_CTX_HELP", "PROBE_HELP", "READOUT_HELP", "UsageError",
    "build_parser", "calibration_args", "cmd_bench", "cmd_calibrate", "cmd_decide", "cmd_demo", "cmd_distill",
    "cmd_eval", "cmd_export", "cmd_info", "cmd_mcp", "cmd_plan", "cmd_predict", "cmd_prepare", "cmd_serve",
    "cmd_train", "main",
    "nonnegative_float", "positive_float", "predict_lines", "read_api_key", "runtime_options", "serve_on_ray",
    "url_keys",
]

# The subcommands in the order `laya --help` lists them.
SUBCOMMANDS = (predict, plan, decide, info, evaluate, serve, prepare, export, train, distill, calibrate, bench, mcp,
               demo)


def build_parser() -> argparse.ArgumentParser:
    """The `laya` parser, each subcommand added by its module's `register`."""
    parser = argparse.ArgumentParser(prog="laya", description="System One decisions from encoder checkpoints")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in SUBCOMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `laya` with `argv` (default: this process's arguments); the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `laya info M` reads naturally; accept the model as a positional argument too.
    if len(argv) >= 2 and argv[0] in ("info", "predict", "decide") and not argv[1].startswith("-"):
        argv = [argv[0], "--model", *argv[1:]]
    args = parser.parse_args(argv)
    if args.command != "serve":  # the server logs with timestamps (laya.server.serve.configure_logging)
        common.log_to_stderr()
    return common.dispatch(args)
