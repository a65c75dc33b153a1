"""`runtime="auto"`: the fastest runtime installed here whose answers stay within its gate, and why.

The rule, in order (the first that loads wins; each refusal on the way is kept in the reason):
1. a pick stored by `laya bench --pick` for this checkpoint on this processor (measured, not guessed);
2. Apple silicon: the Core ML Neural Engine programs for rows that fit them and MLX fp16 for the rest;
3. a CPU with bf16 units: torch bf16, if its accuracy gate passes on this checkpoint;
4. ONNX Runtime fp32 (exported on first use, cached);
5. torch fp32, the reference.
An exported bundle always runs on its own runtime.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laya.errors import LayaError, RuntimeUnavailable
from laya.hardware import Cpu, cpu

if TYPE_CHECKING:
    from laya.checkpoint import Checkpoint
    from laya.runtimes.base import Runtime

log = logging.getLogger("laya")
AUTO = "auto"
ROUTED = "coreml+mlx"


@dataclass
class Candidate:
    runtime: str
    options: dict[str, Any]
    why: str

    @property
    def label(self) -> str:
        precision = self.options.get("precision")
        return f"{self.runtime} {precision}" if precision else self.runtime


@dataclass
class Choice:
    """What auto chose, why, and what it passed over on the way."""

    runtime: str
    options: dict[str, Any]
    reason: str
    passed_over: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = f"auto chose {Candidate(self.runtime, self.options, '').label}: {self.reason}"
        return text + "".join(f"; passed over {p}" for p in self.passed_over)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cache_root() -> Path:
    return Path(os.environ.get("LAYA_CACHE", Path.home() / ".cache" / "laya"))


def pick_path(fingerprint: str, machine: Cpu) -> Path:
    return _cache_root() / "picks" / f"{fingerprint[:16]}-{machine.key}.json"


def store_pick(fingerprint: str, runtime: str, options: dict[str, Any], measured: dict[str, Any],
               machine: Cpu | None = None) -> Path:
    """Write the winner of `laya bench --pick` where auto looks for it."""
    machine = machine or cpu()
    path = pick_path(fingerprint, machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"runtime": runtime, "options": options, "measured": measured, "cpu": machine.model,
              "picked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def stored_pick(fingerprint: str, machine: Cpu) -> dict[str, Any] | None:
    try:
        record = json.loads(pick_path(fingerprint, machine).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("runtime"), str) and isinstance(record.get("options"), dict)
    return record if ok else None


def _onnx_exportable(checkpoint: Checkpoint) -> bool:
    """ONNX Runtime can run this checkpoint: a bundle is cached already, or the exporter is installed."""
    if not _installed("onnxruntime"):
        return False
    if all(_installed(m) for m in ("torch", "onnx", "onnxscript")):
        return True
    from laya.export.onnx import GRAPH_REVISION

    key = f"{checkpoint.fingerprint[:16]}-fp32-r{GRAPH_REVISION}"
    return (_cache_root() / "onnx" / key / "manifest.json").is_file()


def candidates(checkpoint: Checkpoint, machine: Cpu | None = None) -> list[Candidate]:
    machine = machine or cpu()
    out: list[Candidate] = []
    pick = stored_pick(checkpoint.fingerprint, machine)
    if pick is not None:
        measured = pick.get("measured") or {}
        out.append(Candidate(pick["runtime"], pick["options"],
                             f"measured fastest on this machine by `laya bench --pick` ({pick.get('picked_at', '?')}"
                             + (f", {measured['summary']}" if measured.get("summary") else "") + ")"))
    if machine.apple_silicon:
        if _installed("coremltools") and _installed("mlx"):
            out.append(Candidate(ROUTED, {}, "Apple silicon: the Neural Engine programs for rows that fit them, "
                                             "MLX fp16 for the rest"))
        if _installed("mlx"):
            out.append(Candidate("mlx", {"precision": "fp16"}, "Apple silicon: MLX fp16 on the GPU"))
    if machine.bf16_units and _installed("torch"):
        out.append(Candidate("torch", {"precision": "bf16"},
                             f"this CPU has bf16 units ({machine.bf16_units}) and torch bf16 passed its accuracy gate"))
    if _onnx_exportable(checkpoint):
        out.append(Candidate("onnx", {"precision": "fp32"},
                             "ONNX Runtime fp32 is installed" + ("" if machine.bf16_units else
                                                                  f" ({machine.bf16_refusal()})")))
    if _installed("torch"):
        out.append(Candidate("torch", {"precision": "fp32"}, "torch fp32, the reference"))
    if not machine.apple_silicon and _installed("mlx"):
        out.append(Candidate("mlx", {}, "MLX is the only runtime installed that can read this checkpoint"))
    seen, unique = set(), []
    for c in out:
        key = (c.runtime, json.dumps(c.options, sort_keys=True))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def _accepted(runtime: str, options: dict[str, Any]) -> dict[str, Any]:
    """The caller's general options (threads, cache_dir) that this candidate takes."""
    from laya.runtimes.base import runtime_class

    names = set(inspect.signature(runtime_class(runtime).__init__).parameters)
    from laya.loading import EXPORTED_ON_FIRST_USE

    return {k: v for k, v in options.items()
            if k in names or (k == "cache_dir" and runtime in EXPORTED_ON_FIRST_USE)}


def choose(checkpoint: Checkpoint, options: dict[str, Any],
           build: Callable[[str, Checkpoint, dict[str, Any]], Runtime]) -> tuple[Runtime, Choice]:
    """The first candidate that loads (gates included), and the choice with its reason."""
    for fixed in ("precision", "force", "executor", "bundle"):
        if fixed in options:
            raise RuntimeUnavailable(f"runtime='auto' chooses the runtime and its precision itself; to set "
                                     f"{fixed!r}, name a runtime (e.g. runtime='torch', precision='bf16')")
    unknown = sorted(set(options) - {"threads", "cache_dir", "compact"})
    if unknown:
        raise RuntimeUnavailable(f"runtime='auto' takes threads, cache_dir and compact; not {', '.join(unknown)}")
    passed_over: list[str] = []
    found = candidates(checkpoint)
    if options.get("compact"):  # compact prompts exist for the Neural Engine programs only
        found = [c for c in found if c.runtime in ("coreml", ROUTED)]
        if not found:
            raise RuntimeUnavailable("compact prompts run on Core ML's Neural Engine programs, which auto does not "
                                     "choose here (no Apple silicon with coremltools and MLX); name "
                                     "runtime='coreml' to use them, or drop compact")
    for candidate in found:
        try:
            if candidate.runtime == ROUTED:
                runtime = build_routed(checkpoint, options, build)
            else:
                runtime = build(candidate.runtime, checkpoint, {**_accepted(candidate.runtime, options),
                                                                **candidate.options})
        except LayaError as exc:
            passed_over.append(f"{candidate.label} ({_first_line(exc)})")
            continue
        choice = Choice(candidate.runtime, candidate.options, candidate.why, passed_over)
        log.info("%s: %s", checkpoint.path.name, choice.describe())
        return runtime, choice
    raise RuntimeUnavailable("runtime='auto' found no runtime that can run this checkpoint here: "
                             + ("; ".join(passed_over) or "none is installed (pip install 'laya-runtime[torch]')"))


def build_routed(checkpoint: Checkpoint, options: dict[str, Any],
                 build: Callable[[str, Checkpoint, dict[str, Any]], Runtime]) -> Runtime:
    from laya.runtimes.routed import RoutedRuntime

    neural_engine = build("coreml", checkpoint, {"executor": "coreml" if sys.platform == "darwin" else "torch",
                                                 "ane": True, **{k: v for k, v in options.items()
                                                                 if k in ("cache_dir", "compact")}})
    rest = build("mlx", checkpoint, {"precision": "fp16"})
    return RoutedRuntime(neural_engine, rest)


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
