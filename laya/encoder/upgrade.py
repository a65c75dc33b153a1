"""Ready in seconds, fast when ready: the exact runtime answers while auto's pick is prepared beside it.

Auto's measured pick (`laya.encoder.choice`) compiles, gates and times its candidates: minutes on a
full-size checkpoint the first time it meets it on a machine, where upstream answers after a few
seconds of loading. So at that first load auto answers at once from an exact runtime (the packed
network in fp32, eager: within 1e-4 of the reference, no gate needed, no compiling, half the
reference's memory; else torch fp32) and prepares its pick in a process of its own
at the lowest CPU priority (`laya prepare`, the same work as `laya prepare MODEL` does ahead of time).
When that process has stored a pick, the picked runtime is loaded from the cache (the compiled program
and the gate record are there) and swapped into the model between two batches: `Model.answer` reads
its runtime once per batch, so no request is answered half by one and half by the other, and every
answer names the precision that answered it.

The process is ended with its parent (it watches its parent's pid). A failure of any step leaves the
exact runtime answering and says why in `status()`; it is not retried until the next load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya.encoder.checkpoint import Checkpoint
    from laya.encoder.choice import Choice
    from laya.encoder.runtimes.base import Runtime

log = logging.getLogger("laya")
BACKGROUND_ENV = "LAYA_AUTO_BACKGROUND"  # "0" (or false, no, off): auto measures at the load, blocking
NICE = 19  # the preparing process's CPU priority: the lowest, so serving always comes first
# the pick the preparing process stored, loaded from the cache (None: none stored)
LoadPick = Callable[[], "tuple[Runtime, Choice] | None"]


def in_background(option: bool | None = None) -> bool:
    """Whether auto prepares its pick in the background: the load option if given, else
    `LAYA_AUTO_BACKGROUND` (on unless 0, false, no or off)."""
    return switched_on(option, BACKGROUND_ENV)


def switched_on(option: bool | None, env: str) -> bool:
    """A load option where given, else the environment variable `env`, on unless 0, false, no or off."""
    if option is not None:
        return bool(option)
    return os.environ.get(env, "1").strip().lower() not in ("0", "false", "no", "off")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Upgrade:
    """One model's background upgrade: the preparing process, then the swap (see the module's docstring)."""

    def __init__(self, checkpoint: Checkpoint, options: dict[str, Any], load_pick: LoadPick, answering: str):
        """`options` are the load's runtime options (threads, cache_dir, precision="fp32"); `answering` is
        the key (`Choice.key`) of the runtime answering until the swap."""
        self.checkpoint, self.options, self.load_pick, self.answering = checkpoint, dict(options), load_pick, answering
        self.state, self.reason, self.since = "preparing", "compiling, gating and timing the candidates", now_iso()
        self.began = time.monotonic()
        self.seconds: float | None = None  # from the start to the swap (or the verdict)
        self.target = ""  # the runtime swapped in (or kept)
        self.done = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self._process: subprocess.Popen[bytes] | None = None

    def status(self) -> dict[str, Any]:
        """The upgrade as /health, /v1/models and `laya info` show it."""
        out: dict[str, Any] = {"state": self.state, "reason": self.reason, "since": self.since}
        if self.target:
            out["target"] = self.target
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 1)
        return out

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` (on the upgrade's thread) once the upgrade has a verdict."""
        self._listeners.append(listener)
        if self.done.is_set():
            listener()

    def start(self, swap: Callable[[Runtime, Choice], None]) -> None:
        """Prepare in the background; `swap(runtime, choice)` puts the pick in place once loaded."""
        threading.Thread(target=self._run, args=(swap,), name="laya-upgrade", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the upgrade has a verdict (for `laya prepare`-less scripts and tests)."""
        return self.done.wait(timeout)

    def close(self) -> None:
        """Stop the preparing process, if it still runs."""
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()

    def command(self) -> list[str]:
        """The preparing process: `laya prepare` over the checkpoint folder, at the lowest priority."""
        args = [sys.executable, "-m", "laya.cli", "prepare", os.fspath(self.checkpoint.path), "--nice", str(NICE),
                "--parent-pid", str(os.getpid())]
        if self.options.get("precision") == "fp32":
            args += ["--precision", "fp32"]
        if self.options.get("threads"):
            args += ["--threads", str(self.options["threads"])]
        if self.options.get("cache_dir"):
            args += ["--cache-dir", os.fspath(self.options["cache_dir"])]
        return args

    def _run(self, swap: Callable[[Runtime, Choice], None]) -> None:
        _lower_this_thread()
        try:
            problem = self._prepare()
            if problem:
                self._verdict("failed", problem)
                return
            self._load_pick(swap)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the exact runtime answering
            log.exception("auto: the background upgrade of %s failed", self.checkpoint.path.name)
            self._verdict("failed", f"{type(exc).__name__}: {exc}")

    def _prepare(self) -> str:
        """Run the preparing process to its end: "" when it stored a pick, else why not."""
        log.info("auto: answering exactly while the pick for %s is prepared in the background",
                 self.checkpoint.path.name)
        self._process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        _, err = self._process.communicate()
        if self._process.returncode == 0:
            return ""
        lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
        return f"the preparing process ended with status {self._process.returncode}" + (
            f": {lines[-1][:300]}" if lines else "")

    def _load_pick(self, swap: Callable[[Runtime, Choice], None]) -> None:
        loaded = self.load_pick()
        if loaded is None:
            self._verdict("failed", "the preparing process stored no pick that loads here (is the cache writable?)")
            return
        runtime, choice = loaded
        self.target = choice.label
        if choice.key == self.answering:
            self._verdict("kept", f"{choice.label}, the exact runtime answering now, was the fastest faithful one")
            return
        swap(runtime, choice)
        self._verdict("swapped", f"{choice.label} answers from now on: {choice.reason}")

    def _verdict(self, state: str, reason: str) -> None:
        self.state, self.reason, self.since = state, reason, now_iso()
        self.seconds = time.monotonic() - self.began
        (log.warning if state == "failed" else log.info)("auto: upgrade of %s %s after %.1f s: %s",
                                                          self.checkpoint.path.name, state, self.seconds, reason)
        self.done.set()
        for listener in self._listeners:
            with contextlib.suppress(Exception):
                listener()


def _lower_this_thread() -> None:
    """Put the upgrade's own thread (loading the pick) at the lowest priority too, where the system lets a
    thread have its own (Linux); elsewhere it runs as it is."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
