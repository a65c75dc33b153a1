"""`laya prepare`: auto's pick for a checkpoint made ahead of time (for images, Ray nodes and deploys).

It does in the foreground what a first load does in the background (`laya.encoder.upgrade`): compile the
fast candidates, gate them, time them against the reference and store the winner in the cache, keyed by
the checkpoint, the processor and the library versions. A later `laya serve`, `laya.load` or replica on a
machine of the same processor kind with the same versions then starts on the pick at once. The
background upgrade runs this very command at the lowest CPU priority (`--nice`, `--parent-pid`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator

from laya.cli import common
from laya.cli.common import Subparsers, UsageError
from laya.engines import is_gguf


def register(sub: Subparsers) -> None:
    """Add `laya prepare` to the subparsers `sub`."""
    prep = sub.add_parser("prepare", help="compile, gate and time auto's pick for a checkpoint ahead of time, and "
                                          "store it in the cache (LAYA_CACHE) for this processor kind")
    prep.add_argument("model", help="checkpoint folder, registered name or Hub id")
    prep.add_argument("--precision", choices=["fp32"], help="keep auto to the exact runtimes (as laya serve "
                                                            "--precision fp32)")
    common.add_source_args(prep)
    prep.add_argument("--cache-dir", help="where exported bundles are kept (default: LAYA_CACHE)")
    prep.add_argument("--json", action="store_true", help="print the choice as JSON")
    # the background upgrade's own: its CPU priority, and the process whose end ends this one
    prep.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    prep.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    prep.set_defaults(func=cmd_prepare)


def _end_with(parent: int) -> None:
    """Exit as soon as `parent` is gone (this process is then an orphan): a prepare nobody waits for
    would only take CPU from what the machine serves next."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, name="laya-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _one_at_a_time(model: str) -> Iterator[None]:
    """One preparation of a model at a time on this machine: the engine processes of several server
    workers each start one, and the second finds the first's pick stored instead of compiling again."""
    import hashlib

    from laya.encoder.cache import cache_root, locked

    name = hashlib.sha256(os.path.abspath(model).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    with locked(cache_root() / "picks" / f".prepare-{name}.lock"):
        yield


def cmd_prepare(args: argparse.Namespace) -> int:
    """`laya prepare MODEL`: the pick, made and stored; prints what auto chose and why."""
    if is_gguf(args.model):
        raise UsageError(f"{args.model}: a GGUF runs on llama.cpp in its own types; there is no pick to prepare "
                         "(laya prepare readies laya checkpoints for runtime auto)")
    if args.parent_pid is not None:
        _end_with(args.parent_pid)
    if args.nice:
        with contextlib.suppress(OSError):
            os.nice(args.nice)
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads takes a positive number")
    import laya

    options = {k: v for k, v in (("threads", args.threads), ("cache_dir", args.cache_dir),
                                 ("precision", args.precision)) if v is not None}
    began = time.monotonic()
    with _one_at_a_time(args.model):
        model = laya.load(args.model, runtime="auto", revision=args.revision, subfolder=args.subfolder,
                          sha256=args.sha256, measure=True, background=False, **options)
    choice = model.choice
    if choice is None:  # an exported bundle runs on its own runtime
        raise UsageError(f"{args.model} is an exported bundle: it runs on its own runtime, with nothing to pick")
    record = {"model": model.name, "runtime": choice.runtime, "options": choice.options,
              "precision": model.runtime.precision, "reason": choice.describe(),
              "seconds": round(time.monotonic() - began, 1),
              "gate": model.runtime.info().gate}
    print(json.dumps(record, indent=2) if args.json else
          f"{model.name}: {choice.describe()} ({record['seconds']} s)")
    return 0
