"""What several subcommands share: the one-line error (exit 2), `@file` and JSON arguments, keys, the model
and training option groups, and loading the model or engine a command answers with."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from laya.errors import LayaError

if TYPE_CHECKING:
    from laya.encoder.model import Model
    from laya.engine import Engine
    from laya.request import Overflow


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what `register(sub)` is given


class UsageError(LayaError):
    """A command-line argument that cannot be used as given."""


PROBE_HELP = ("GGUF models: append one JSON line per decision to FILE, with its per-layer logit lens (the choice "
              "logits read from each layer's last-token state; diagnostic: doubles each prefill)")
N_CTX_HELP = ("context of GGUF models in tokens (default: the context each was trained for, as far as 1 GiB of "
              "key/value cache holds it)")
READOUT_HELP = ("GGUF models: how the model is asked and read (default: what its metadata names, else first-token: "
                "a chat model; answer-slot: a decider-trained model; json-field: pcdServer's JSON object; letters: "
                "the option letter of a Hmm model)")


def read_arg(value: str, what: str) -> str:
    """`@path` reads a file ("-" is stdin); anything else is the value itself."""
    if not value.startswith("@"):
        return value
    target = value[1:]
    if target == "-":
        return sys.stdin.read()
    path = Path(target).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UsageError(f"{what}: file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc}") from exc


def is_file(value: str) -> bool:
    """Whether `value` names a readable file (a name too long or malformed for the file system is not one)."""
    try:
        return Path(value).expanduser().is_file()
    except (OSError, ValueError):
        return False


def json_arg(value: str, what: str) -> Any:
    """The JSON in `value` (inline, or `@path`), or a `UsageError` naming the flag and where it broke."""
    text = read_arg(value, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc


def state_arg(value: str, as_json: bool) -> Any:
    """`--state` as text, or parsed as JSON with `--state-json`."""
    return json_arg(value, "--state") if as_json else read_arg(value, "--state")


def read_api_key(path: str | None) -> str | None:
    """The key from `--api-key-file` or `LAYA_API_KEY`, which is then removed from this process's
    environment so no child (a server worker, a compiler) inherits it."""
    from laya.apps.outbound import read_key_file

    env_key = os.environ.pop("LAYA_API_KEY", None)
    if path is None:
        return env_key or None
    return read_key_file(path, "--api-key-file")


def refuse_api_key_flag(args: argparse.Namespace) -> None:
    """`--api-key KEY` is refused with the reason: argv is public."""
    if args.api_key is not None:
        raise LayaError("--api-key would show the key to every user of this machine (ps, /proc); put it in a "
                        "file readable only by you and pass --api-key-file PATH, or set LAYA_API_KEY")


def runtime_options(args: argparse.Namespace) -> dict[str, Any]:
    """The runtime options (`--threads`, `--precision`, `--force`) given, as `laya.load` takes them."""
    options: dict[str, Any] = {}
    if getattr(args, "threads", None):
        options["threads"] = args.threads
    if getattr(args, "precision", None):
        options["precision"] = args.precision
    if getattr(args, "force", False):
        options["force"] = True
    return options


def load_model(args: argparse.Namespace) -> Model:
    """The model `--model` names, loaded with the model options (`add_model_args`)."""
    import laya

    return laya.load(args.model, runtime=args.runtime, revision=args.revision, subfolder=args.subfolder,
                     sha256=args.sha256, calibration=getattr(args, "calibration", None), **runtime_options(args))


def make_engine(args: argparse.Namespace) -> Engine:
    """The engine a JSONL run answers with, as `open_engine` (the one GGUF rule) reads `--model`, with the
    options this command has."""
    from laya.engines import open_engine

    given = {"threads": args.threads, "readout": getattr(args, "readout", None),
             "decide_probe": getattr(args, "decide_probe", None), "calibration": getattr(args, "calibration", None),
             "runtime": getattr(args, "runtime", None), "precision": getattr(args, "precision", None),
             "force": getattr(args, "force", False), "revision": getattr(args, "revision", None),
             "subfolder": getattr(args, "subfolder", None), "sha256": getattr(args, "sha256", None),
             "n_ctx": getattr(args, "n_ctx", None)}
    return open_engine(args.model, **{k: v for k, v in given.items() if v not in (None, False)})


def overflow_arg(args: argparse.Namespace) -> Overflow:
    """`--overflow` (and a scan's `--window` / `--stride`) as `Model.prepare` takes it."""
    if args.overflow == "scan":
        from laya.request import Scan

        return Scan(args.window, args.stride)
    if args.window is not None or args.stride is not None:
        raise UsageError("--window and --stride size a scan; add --overflow scan")
    return args.overflow


def order_arg(value: str) -> str:
    """`--order` checked as a request's `x_order` is (as_given, both, rotate:K)."""
    from laya.request import order_problem

    if (message := order_problem(value)) is not None:
        raise argparse.ArgumentTypeError(message)
    return value


def add_model_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The options `load_model` reads: which model, on which runtime, at which precision."""
    parser.add_argument("--model", "-m", required=required, help="checkpoint folder, registered name or Hub id")
    parser.add_argument("--runtime", "-r", default=None,
                        help="runtime: auto (default: the fastest faithful runtime installed here), packed, torch, "
                             "onnx, llama, mlx, coreml (a bundle picks its own)")
    parser.add_argument("--precision", help="runtime precision, e.g. bf16 or int8 for packed, int8 for onnx; with "
                                            "auto, fp32 keeps to the exact path")
    parser.add_argument("--force", action="store_true",
                        help="accept a reduced precision whose accuracy gate failed, or bf16 on a CPU without bf16 "
                             "units")
    add_source_args(parser)
    parser.add_argument("--calibration", help="a calibration file from `laya calibrate` to apply")


def add_source_args(parser: argparse.ArgumentParser) -> None:
    """Where a checkpoint comes from and how it runs: the Hub revision, subfolder and digest, the threads."""
    parser.add_argument("--revision", help="Hub revision (commit, branch or tag)")
    parser.add_argument("--subfolder", help="checkpoint subfolder inside the Hub repository or folder")
    parser.add_argument("--sha256", help="expected sha256 of model.safetensors, checked before parsing")
    parser.add_argument("--threads", type=int, help="CPU threads for the runtime")


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """`laya train`'s settings (`laya.training.loop.Settings`), also `laya distill`'s."""
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--encoder-lr", type=float, default=2.5e-5)
    parser.add_argument("--head-lr", type=float, default=1e-4)
    parser.add_argument("--min-lr", type=float, default=1e-6, help="end of the cosine schedule")
    parser.add_argument("--warmup", type=float, default=0.06, help="share of the steps with a linear warm-up")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--freeze-encoder", action="store_true", help="train the decision head only")
    parser.add_argument("--no-augment", action="store_true", help="keep choice options in their given order")
    parser.add_argument("--holdout", type=float, default=0.2,
                        help="share of lines held out: half fits the act head and temperatures, half measures")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto (CUDA, Apple MPS, else CPU), cpu, cuda, cuda:1, mps")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="autocast (auto: bf16 where the device computes it natively, fp16 on older GPUs)")
    parser.add_argument("--threads", type=int, help="CPU threads")


def training_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The options `add_training_args` added, as `laya.training.loop.Settings` takes them."""
    return dict(epochs=args.epochs, batch_size=args.batch_size, encoder_lr=args.encoder_lr, head_lr=args.head_lr,
                min_lr=args.min_lr, weight_decay=args.weight_decay, warmup=args.warmup,
                freeze_encoder=args.freeze_encoder, augment=not args.no_augment, holdout=args.holdout,
                seed=args.seed, device=args.device, precision=args.precision)


def log_to_stderr() -> None:
    """What the library logs (auto's choice and reason, an export on first use) goes to stderr, once."""
    import logging

    class Stderr(logging.StreamHandler):
        def emit(self, record: logging.LogRecord) -> None:
            self.stream = sys.stderr  # whatever stderr is now (tests and embedders replace it)
            super().emit(record)

    logger = logging.getLogger("laya")
    if not logger.handlers:
        handler = Stderr()
        handler.setFormatter(logging.Formatter("laya: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def dispatch(args: argparse.Namespace) -> int:
    """Run the subcommand `args` names: its warnings as `laya: warning:` lines (each once), a `LayaError` as one
    `laya: error:` line and exit 2, Ctrl-C as exit 130."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return int(args.func(args) or 0)
            finally:
                for seen in {str(w.message): w for w in caught}.values():
                    print(f"laya: warning: {seen.message}", file=sys.stderr)
    except LayaError as exc:
        print(f"laya: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
