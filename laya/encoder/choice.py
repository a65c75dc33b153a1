"""`runtime="auto"`: the fastest runtime installed here whose answers stay within the precision standard.

At the first load of a checkpoint on a machine, auto answers at once from torch fp32 (exact) and
prepares its pick in the background (`laya.encoder.upgrade`: a process of its own at the lowest CPU
priority, then a swap between batches; `background=False` or LAYA_AUTO_BACKGROUND=0 make the load wait
for the pick instead, and `laya prepare MODEL` makes it ahead of time). Making the pick, auto times its
faithful candidates (`laya.encoder.bench`'s
`pick_candidates`: torch fp32, the reference, and every other runtime and precision installed here
whose accuracy gate passes, `laya.encoder.gate`; packed int8 only where packed bf16 does not pass) on the
rows it will serve, a short one (128 tokens) and a
long one (512, both capped by the checkpoint's row), interleaved, within a budget (`BUDGET_S`, 20 s,
or `LAYA_AUTO_MEASURE_BUDGET_S`), and keeps the fastest: a candidate wins only if the geometric mean
of its medians' ratios to torch fp32 is below 1 (ties go to torch fp32), so auto is never slower than
the reference in its own measurement. The pick is stored per checkpoint, processor, library versions
and precision setting (`store_pick`); later loads use it without timing. `laya bench --pick` writes
the same record after a longer measurement (every candidate, packed int8 always and the exported ONNX int8
and llama.cpp types included), and auto uses it the same way.

`precision="fp32"` keeps auto to the exact runtimes (within 1e-4 of the reference): no reduced
precision is timed or chosen.

With measuring off (`LAYA_AUTO_MEASURE=0`, or `laya.load(..., measure=False)`), or where torch is
missing, the fixed rule decides, in order (the first that loads wins; each refusal on the way is kept
in the reason):
1. a pick stored by `laya bench --pick` for this checkpoint on this processor (measured, not guessed);
2. Apple silicon: the Core ML Neural Engine programs for rows that fit them and MLX fp16 for the rest;
3. a CPU with bf16 units: the packed runtime in bf16, if its gate passes on this checkpoint;
4. ONNX Runtime fp32 (exported on first use, cached);
5. the packed runtime in fp32;
6. torch fp32, the reference.
An exported bundle always runs on its own runtime.

Where torch sees a CUDA device, the cuda runtime comes before all of this (`cuda_candidates`): bf16 on
compute capability 8.0 or later if its gate passes on this checkpoint, else fp32 (fp32 only with
`precision="fp32"`); a GPU outruns every CPU runtime, so it is not timed against them. Without CUDA
nothing changes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laya.encoder.cache import cache_root, locked, write_json
from laya.encoder.upgrade import in_background, now_iso, switched_on
from laya.errors import LayaError, RuntimeUnavailable
from laya.native.cpu import Cpu, cpu

if TYPE_CHECKING:
    from laya.encoder.checkpoint import Checkpoint
    from laya.encoder.model import Model
    from laya.encoder.runtimes.base import Runtime

    Build = Callable[[str, Checkpoint, dict[str, Any]], Runtime]  # how a runtime is built (laya.encoder.loading's)

log = logging.getLogger("laya")
ROUTED = "coreml+mlx"
ROUTED_WHY = "Apple silicon: the Neural Engine programs for rows that fit them, MLX fp16 for the rest"
REFERENCE = "torch fp32"  # the label of the candidate every measurement compares with
MEASURE_ENV = "LAYA_AUTO_MEASURE"  # "0" (or false, no, off): no timing at first load, the fixed rule
BUDGET_S = 20.0  # auto's timing at first load, warm-up included (loading the candidates is not)
BUDGET_ENV = "LAYA_AUTO_MEASURE_BUDGET_S"  # another budget, in seconds
ROW_LENGTHS = (128, 512)  # the short and the long row auto times, capped by the checkpoint's max_len
MEASURED_BY = "auto"  # `measured["by"]` of a pick auto made (`laya bench --pick` writes its own name)
# The libraries whose versions a stored pick was measured under: another version of any of them (or
# of laya) may run at another speed, so the pick is measured again.
VERSIONED = {"torch": ("torch",), "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-silicon"),
             "onnx": ("onnx",), "onnxscript": ("onnxscript",), "mlx": ("mlx",), "coremltools": ("coremltools",)}


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
    measured: dict[str, Any] | None = None  # the timing behind a measured pick (medians per candidate)
    # the exact runtime answers for now, and the pick is prepared in the background (`laya.encoder.upgrade`)
    deferred: bool = False

    @property
    def label(self) -> str:
        return Candidate(self.runtime, self.options, "").label

    @property
    def key(self) -> str:
        """The runtime and every option it was built with (two builds of one label may differ: eager or
        compiled)."""
        return f"{self.runtime} {json.dumps(self.options, sort_keys=True)}"

    def describe(self) -> str:
        text = f"auto chose {Candidate(self.runtime, self.options, '').label}: {self.reason}"
        return text + "".join(f"; passed over {p}" for p in self.passed_over)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def measurement(self) -> dict[str, Any] | None:
        """The measurement in brief, for /health and `laya info`: medians per candidate, not every row
        of a `laya bench --pick` run."""
        if not self.measured:
            return None
        return {k: v for k, v in self.measured.items() if k != "results"}

    def measurement_lines(self) -> list[str]:
        """One line per timed candidate: its medians per row shape and its ratio to torch fp32."""
        m = self.measured or {}
        shapes = "/".join(str(n) for n in m.get("lengths", [])) or " / ".join(m.get("scenarios", []))
        ratios = m.get("vs_reference", {})
        lines = []
        for label, medians in (m.get("medians_ms") or {}).items():
            ratio = f" ({ratios[label]:.2f}x {REFERENCE})" if label in ratios and label != REFERENCE else ""
            lines.append(f"{label:12s} {_ms(medians)} ms on {shapes}{'-token rows' if m.get('lengths') else ''}"
                         + ratio)
        return lines


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


EXACT = ("fp32", "f32")  # the precisions of the exact runtimes (`precision="fp32"` keeps auto to them)


def pick_path(fingerprint: str, machine: Cpu, exact: bool = False) -> Path:
    return cache_root() / "picks" / f"{fingerprint[:16]}-{machine.key}{'-fp32' if exact else ''}.json"


def _dist_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_versions() -> dict[str, str | None]:
    """laya's version and those of the frameworks its runtimes run on (None: not installed). A stored
    pick is only reused under the very same versions: a new torch or ONNX Runtime changes the speeds,
    and so does a new revision of the graphs laya exports (a dev install keeps its version number)."""
    from laya.encoder.export.onnx import GRAPH_REVISION
    from laya.version import __version__

    return {"laya": f"{__version__}+onnx.r{GRAPH_REVISION}",
            **{key: _dist_version(names) for key, names in VERSIONED.items()}}


def store_pick(fingerprint: str, runtime: str, options: dict[str, Any], measured: dict[str, Any],
               machine: Cpu | None = None, exact: bool = False) -> Path:
    """Write a measured winner (auto's at first load, or `laya bench --pick`'s) where auto looks for it,
    with the library versions it was measured under."""
    machine = machine or cpu()
    path = pick_path(fingerprint, machine, exact)
    write_json(path, {"runtime": runtime, "options": options, "measured": measured, "cpu": machine.model,
                      "versions": library_versions(), "picked_at": now_iso()})
    return path


def stored_pick(fingerprint: str, machine: Cpu, exact: bool = False) -> dict[str, Any] | None:
    """The pick stored for this checkpoint and processor, if it was measured under the library versions
    installed now (a record without versions predates them and is measured again)."""
    try:
        record = json.loads(pick_path(fingerprint, machine, exact).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("runtime"), str) and isinstance(record.get("options"), dict)
    if not ok or record.get("versions") != library_versions():
        return None
    return record


def store_winner(models: dict[str, Model], results: list[dict[str, Any]]) -> tuple[str, Any]:
    """`laya bench --pick`: the fastest faithful runtime of `laya.encoder.bench.run`'s `results` (geometric
    mean of its speed-ups over the scenarios), stored where auto looks for its pick. It lives here, beside
    `store_pick`, because what it writes is auto's record: the timing (`laya.encoder.bench`) stays below
    auto and never imports it."""
    from laya.encoder.bench import faithful

    speed = {}
    for spec, model in models.items():
        if not faithful(model) or model.choice is not None:
            continue
        ups = [r["speedup"] for r in results if r["runtime"] == spec]
        speed[spec] = statistics.geometric_mean(ups)
    if not speed:
        raise ValueError("no faithful runtime was measured")
    winner = max(speed, key=lambda label: speed[label])
    model = models[winner]
    name, _, precision = winner.partition(":")
    summary = ", ".join(f"{k} {v:.2f}x" for k, v in sorted(speed.items(), key=lambda kv: -kv[1]))
    medians = {f"{spec.partition(':')[0]} {models[spec].runtime.precision}":
               [round(r["median_ms"], 3) for r in results if r["runtime"] == spec] for spec in speed}
    path = store_pick(model.checkpoint.fingerprint, name, {"precision": model.runtime.precision},
                      {"by": "laya bench --pick", "summary": f"speed vs {next(iter(models))}: {summary}",
                       "scenarios": list(dict.fromkeys(r["scenario"] for r in results)), "medians_ms": medians,
                       "results": [r for r in results if r["runtime"] == winner]})
    return winner, path


def _by_auto(pick: dict[str, Any]) -> bool:
    return (pick.get("measured") or {}).get("by") == MEASURED_BY


def _stored_candidate(pick: dict[str, Any]) -> Candidate:
    measured = pick.get("measured") or {}
    summary = f": {measured['summary']}" if measured.get("summary") else ""
    if _by_auto(pick):
        why = f"picked when auto first loaded it on this machine ({pick.get('picked_at', '?')}){summary}"
    else:
        why = (f"measured fastest on this machine by `laya bench --pick` ({pick.get('picked_at', '?')}"
               + (f", {measured['summary']}" if measured.get("summary") else "") + ")")
    return Candidate(pick["runtime"], pick["options"], why)


def budget_s() -> float:
    """The timing budget: `LAYA_AUTO_MEASURE_BUDGET_S` when it is a positive number, else `BUDGET_S`."""
    try:
        value = float(os.environ.get(BUDGET_ENV, ""))
    except ValueError:
        return BUDGET_S
    return value if 0 < value < float("inf") else BUDGET_S


def measuring(option: bool | None = None) -> bool:
    """Whether auto times its candidates at first load: the load option if given, else
    `LAYA_AUTO_MEASURE` (on unless 0, false, no or off)."""
    return switched_on(option, MEASURE_ENV)


def _cached(checkpoint: Checkpoint, runtime: str, precision: str, cache_dir: str | os.PathLike | None = None) -> bool:
    """A complete bundle of this checkpoint for `runtime` at `precision` is in the export cache."""
    import importlib

    from laya.encoder.bundle import MANIFEST, cache_folder
    from laya.encoder.loading import EXPORTED_ON_FIRST_USE

    bundle_key = importlib.import_module(EXPORTED_ON_FIRST_USE[runtime]).bundle_key
    folder = cache_folder(runtime, bundle_key(checkpoint, precision), Path(cache_dir) if cache_dir else None)
    return (folder / MANIFEST).is_file()


# candidates auto times only once exported: their export runs an accuracy gate (minutes on a full shape)
GATED_AT_EXPORT = {("onnx", "int8"), ("llama", "f16"), ("llama", "q8_0")}


def _onnx_exportable(checkpoint: Checkpoint) -> bool:
    """ONNX Runtime can run this checkpoint: a bundle is cached already, or the exporter is installed."""
    if not _installed("onnxruntime"):
        return False
    return all(_installed(m) for m in ("torch", "onnx", "onnxscript")) or _cached(checkpoint, "onnx", "fp32")


def candidates(checkpoint: Checkpoint, machine: Cpu | None = None, exact: bool = False) -> list[Candidate]:
    """The fixed rule's candidates, in order (see the module's docstring); `exact`: fp32 ones only. A
    pick auto measured itself is not among them: the rule is what runs when measuring is off."""
    machine = machine or cpu()
    out: list[Candidate] = []
    pick = stored_pick(checkpoint.fingerprint, machine, exact)
    if pick is not None and not _by_auto(pick):
        out.append(_stored_candidate(pick))
    if machine.apple_silicon and not exact:
        if _installed("coremltools") and _installed("mlx"):
            out.append(Candidate(ROUTED, {}, ROUTED_WHY))
        if _installed("mlx"):
            out.append(Candidate("mlx", {"precision": "fp16"}, "Apple silicon: MLX fp16 on the GPU"))
    if machine.bf16_units and _installed("torch"):
        out.append(Candidate("packed", {"precision": "bf16"},
                             f"this CPU has bf16 units ({machine.bf16_units}) and packed bf16 stayed within the "
                             "precision standard on this checkpoint"))
    if _onnx_exportable(checkpoint):
        out.append(Candidate("onnx", {"precision": "fp32"},
                             "ONNX Runtime fp32 is installed" + ("" if machine.bf16_units or exact else
                                                                  f" ({machine.bf16_refusal()})")))
    if _installed("torch"):
        out.append(Candidate("packed", {"precision": "fp32"}, "the packed runtime in fp32 (torch is installed)"))
        out.append(Candidate("torch", {"precision": "fp32"}, "torch fp32, the reference"))
    if not machine.apple_silicon and _installed("mlx"):
        out.append(Candidate("mlx", {}, "MLX is the only runtime installed that can read this checkpoint"))
    seen, unique = set(), []
    for c in out:
        key = (c.runtime, json.dumps(c.options, sort_keys=True))
        if key not in seen and (not exact or c.options.get("precision", "fp32") in EXACT):
            seen.add(key)
            unique.append(c)
    return unique


def _accepted(runtime: str, options: dict[str, Any]) -> dict[str, Any]:
    """The caller's general options (threads, cache_dir) that this candidate takes."""
    from laya.encoder.runtimes.base import runtime_class

    names = set(inspect.signature(runtime_class(runtime)).parameters)
    from laya.encoder.loading import EXPORTED_ON_FIRST_USE

    return {k: v for k, v in options.items()
            if k in names or (k == "cache_dir" and runtime in EXPORTED_ON_FIRST_USE)}


# gated and timed at a first load only where the first is not faithful here: packed int8's three int8 products
# per projection ran at half packed bf16's speed where both answer (an AMX Xeon), and gating it takes minutes
STANDS_IN_FOR = {("packed", "int8"): "packed bf16"}


def measured_candidates(machine: Cpu, exact: bool = False) -> list[Candidate]:
    """What auto times at first load: `laya bench --pick`'s candidates (torch fp32 first), and on Apple
    silicon the route the fixed rule would try first. `exact`: the fp32 ones only. Where the processor
    has bf16 units the packed runtime is timed in bf16, not also in fp32 (a minute of compiling each)."""
    from laya.encoder.bench import pick_candidates

    out = []
    if machine.apple_silicon and _installed("coremltools") and _installed("mlx") and not exact:
        out.append(Candidate(ROUTED, {}, ROUTED_WHY))
    for spec in pick_candidates(machine=machine):
        name, _, precision = spec.partition(":")
        precision = precision or ("f32" if name == "llama" else "fp32")
        if exact and precision not in EXACT:
            continue
        if name == "packed" and precision == "fp32" and machine.bf16_units and not exact:
            continue
        out.append(Candidate(name, {"precision": precision}, ""))
    out.sort(key=lambda c: c.label != REFERENCE)
    return out


def row_lengths(checkpoint: Checkpoint) -> list[int]:
    """The row shapes auto times: a short and a long row, capped by the checkpoint's row."""
    return sorted({min(n, checkpoint.config.max_len) for n in ROW_LENGTHS})


def _ms(medians: list[float]) -> str:
    return " / ".join(f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" for v in medians)


def _build(candidate: Candidate, checkpoint: Checkpoint, options: dict[str, Any], build: Build) -> Runtime:
    if candidate.runtime == ROUTED:
        return build_routed(checkpoint, options, build)
    return build(candidate.runtime, checkpoint, {**_accepted(candidate.runtime, options), **candidate.options})


def _chosen(checkpoint: Checkpoint, runtime: Runtime, candidate: Candidate, passed_over: list[str],
            reason: str | None = None, measured: dict[str, Any] | None = None, deferred: bool = False
            ) -> tuple[Runtime, Choice]:
    """`runtime`, built from `candidate`, as auto's choice (for `reason`, else the candidate's own), logged."""
    choice = Choice(candidate.runtime, candidate.options, candidate.why if reason is None else reason, passed_over,
                    measured=measured, deferred=deferred)
    log.info("%s: %s", checkpoint.path.name, choice.describe())
    return runtime, choice


def _reuse_stored(checkpoint: Checkpoint, options: dict[str, Any], build: Build, machine: Cpu, exact: bool,
                  passed_over: list[str]) -> tuple[Runtime, Choice] | None:
    """The pick stored for this checkpoint, loaded, or None (none stored, or it no longer loads)."""
    pick = stored_pick(checkpoint.fingerprint, machine, exact)
    if pick is None:
        return None
    stored = _stored_candidate(pick)
    try:
        runtime = _build(stored, checkpoint, options, build)
    except LayaError as exc:
        passed_over.append(f"{stored.label}, the stored pick ({_first_line(exc)})")
        return None
    return _chosen(checkpoint, runtime, stored, passed_over, measured=pick.get("measured"))


def _faithful_candidates(checkpoint: Checkpoint, options: dict[str, Any], build: Build, machine: Cpu, exact: bool
                         ) -> tuple[dict[str, tuple[Candidate, Any]], dict[str, str]]:
    """Every candidate auto times that loads and passes its gate (label -> candidate and model), and why
    each other one is not timed."""
    from laya.encoder import bench
    from laya.encoder.model import Model

    built: dict[str, tuple[Candidate, Any]] = {}
    not_timed: dict[str, str] = {}
    for candidate in measured_candidates(machine, exact):
        precision = str(candidate.options.get("precision"))
        faster = STANDS_IN_FOR.get((candidate.runtime, precision))
        if faster in built:
            not_timed[candidate.label] = f"{faster} passed its gate here, and is faster where both pass"
        elif (candidate.runtime, precision) in GATED_AT_EXPORT \
                and not _cached(checkpoint, candidate.runtime, precision, options.get("cache_dir")):
            not_timed[candidate.label] = ("not exported yet: its export and accuracy gate take minutes on a full-size "
                                          "checkpoint; `laya bench --pick` exports, gates and times it)")
        else:
            try:
                runtime = _build(candidate, checkpoint, options, build)
            except LayaError as exc:
                not_timed[candidate.label] = _first_line(exc)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the checkpoint's own warnings come with the loaded model
                    model = Model(checkpoint, runtime)
                if bench.faithful(model):
                    built[candidate.label] = (candidate, model)
                else:
                    not_timed[candidate.label] = "its accuracy gate failed"
        if candidate.label in not_timed:
            log.info("auto: not timing %s: %s", candidate.label, not_timed[candidate.label])
    return built, not_timed


def _timing(checkpoint: Checkpoint, models: dict[str, Any], not_timed: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """Time the faithful candidates against the reference: the winner's label and the record kept."""
    from laya.encoder import bench

    lengths = row_lengths(checkpoint)
    shapes = "/".join(map(str, lengths))
    measured: dict[str, Any] = {"by": MEASURED_BY, "lengths": lengths, "not_timed": not_timed}
    if len(models) == 1:
        measured["summary"] = (f"{REFERENCE}, the reference, is the only faithful runtime that loaded here"
                               + (f" (not timed: {', '.join(not_timed)})" if not_timed else ""))
        return REFERENCE, measured
    budget_total = budget_s()
    log.info("auto: timing %s on %s-token rows of %s (at most %g s, once per checkpoint, processor and library "
             "versions; %s=0 turns this off)", ", ".join(models), shapes, checkpoint.path.name, budget_total,
             MEASURE_ENV)
    timed = bench.time_rows(models, lengths, budget_total)
    medians = {label: [round(v * 1000, 3) for v in values] for label, values in timed.medians.items()}
    ratios = {label: round(statistics.geometric_mean(
        [max(v, 1e-9) / max(r, 1e-9) for v, r in zip(values, medians[REFERENCE])]), 4)
        for label, values in medians.items()}
    winner = REFERENCE
    for label in medians:  # strictly faster than the reference, or the reference (ties included)
        if ratios[label] < ratios[winner]:
            winner = label
    for label, values in medians.items():
        log.info("auto: timing %s on %s-token rows ... %s ms%s", label, shapes, _ms(values),
                 " (the reference)" if label == REFERENCE else f" ({ratios[label]:.2f}x)")
    verdict = (f"{winner} was fastest ({ratios[winner]:.2f}x the time of {REFERENCE}, geometric mean over the rows)"
               if winner != REFERENCE else f"none was faster than {REFERENCE}, the reference")
    figures = ", ".join(f"{label} {_ms(values)} ms" for label, values in medians.items())
    budget = (f"; stopped after {timed.repeats} of {timed.planned} repeats: over the {budget_total:g} s budget"
              if timed.repeats < timed.planned else
              f"; over the {budget_total:g} s budget with 1 repeat" if timed.over_budget else "")
    if timed.over_budget:
        log.info("auto: %s", budget.lstrip("; "))
    if timed.redone or timed.busy_kept:
        budget += (f"; {timed.redone} round{'s' if timed.redone != 1 else ''} timed again (the machine was busy)"
                   + (f", {timed.busy_kept} kept while busy (the stretched budget ran out)" if timed.busy_kept else ""))
    measured.update({"tokens": timed.tokens, "medians_ms": medians, "vs_reference": ratios,
                     "redone": timed.redone, "busy_kept": timed.busy_kept,
                     "repeats": timed.repeats, "planned_repeats": timed.planned, "over_budget": timed.over_budget,
                     "budget_s": budget_total, "elapsed_s": round(timed.elapsed_s, 3),
                     "summary": f"{verdict}; medians {figures} on {shapes}-token rows, {timed.repeats} "
                                f"repeat{'s' if timed.repeats != 1 else ''} after a warm-up{budget}"
                                + (f"; not timed: {', '.join(not_timed)}" if not_timed else "")})
    return winner, measured


def _measured_choice(checkpoint: Checkpoint, options: dict[str, Any], build: Build, machine: Cpu,
                     passed_over: list[str], exact: bool = False) -> tuple[Runtime, Choice] | None:
    """The fastest faithful candidate timed now (and stored); None leaves the choice to the fixed rule (no
    torch to measure against), with the reason in `passed_over`."""
    if not _installed("torch"):
        passed_over.append(f"timing the candidates ({REFERENCE}, the reference they are timed against, is not "
                           "installed)")
        return None
    built, not_timed = _faithful_candidates(checkpoint, options, build, machine, exact)
    passed_over += [f"{label} ({why})" for label, why in not_timed.items()]
    if REFERENCE not in built:
        passed_over.append(f"timing the candidates ({REFERENCE}, the reference, did not load)")
        return None
    with locked(cache_root() / "picks" / ".timing.lock"):  # timings take turns: never measure each other
        pick = stored_pick(checkpoint.fingerprint, machine, exact)  # another process may have timed it meanwhile
        if pick is not None and _stored_candidate(pick).label in built:
            stored = _stored_candidate(pick)
            return _chosen(checkpoint, built[stored.label][1].runtime, stored, passed_over,
                           measured=pick.get("measured"))
        winner, measured = _timing(checkpoint, {label: model for label, (_, model) in built.items()}, not_timed)
        candidate, model = built[winner]
        try:
            path = store_pick(checkpoint.fingerprint, candidate.runtime, candidate.options, measured, machine, exact)
            log.info("auto: stored the pick (%s) in %s", winner, path)
        except OSError as exc:  # a read-only cache costs the timing again at the next load
            log.warning("auto: could not store the pick: %s", exc)
    reason = f"picked at this first load on this machine: {measured['summary']}"
    return _chosen(checkpoint, model.runtime, candidate, passed_over, reason, measured=measured)


def choose(checkpoint: Checkpoint, options: dict[str, Any], build: Build) -> tuple[Runtime, Choice]:
    """The stored or measured pick (see the module's docstring), else the first candidate of the fixed
    rule that loads (gates included), and the choice with its reason."""
    options = dict(options)
    measure, background = options.pop("measure", None), options.pop("background", None)
    for name, value in (("measure", measure), ("background", background)):
        if value is not None and not isinstance(value, bool):
            raise RuntimeUnavailable(f"{name} takes True or False, not {value!r}")
    precision = options.pop("precision", None)
    if precision not in (None, "fp32"):
        raise RuntimeUnavailable(f"runtime='auto' chooses the precision itself within the precision standard; "
                                 f"precision='fp32' keeps it to the exact path, but {precision!r} is not a choice "
                                 "it takes: name a runtime for that (e.g. runtime='packed', precision='bf16')")
    exact = precision == "fp32"
    for fixed in ("force", "executor", "bundle"):
        if fixed in options:
            raise RuntimeUnavailable(f"runtime='auto' chooses the runtime itself; to set {fixed!r}, name a runtime "
                                     "(e.g. runtime='packed', precision='bf16')")
    unknown = sorted(set(options) - {"threads", "cache_dir", "compact"})
    if unknown:
        raise RuntimeUnavailable(f"runtime='auto' takes threads, cache_dir, compact, measure, background and "
                                 "precision='fp32'; "
                                 f"not {', '.join(unknown)}")
    passed_over: list[str] = []
    machine = cpu()
    if not options.get("compact"):  # a GPU first, before any timing or rule (compact: the Neural Engine's)
        done = _first_that_loads(cuda_candidates(exact), checkpoint, options, build, passed_over)
        if done is not None:
            return done
    if measuring(measure) and not options.get("compact"):  # compact prompts: the Neural Engine, by rule
        done = _reuse_stored(checkpoint, options, build, machine, exact, passed_over)
        if done is None and in_background(background):
            done = _exact_for_now(checkpoint, options, build, passed_over)
        if done is None:
            done = _measured_choice(checkpoint, options, build, machine, passed_over, exact)
        if done is not None:
            return done
    found = candidates(checkpoint, machine, exact)
    if options.get("compact"):  # compact prompts exist for the Neural Engine programs only
        found = [c for c in found if c.runtime in ("coreml", ROUTED)]
        if not found:
            raise RuntimeUnavailable("compact prompts run on Core ML's Neural Engine programs, which auto does not "
                                     "choose here (no Apple silicon with coremltools and MLX); name "
                                     "runtime='coreml' to use them, or drop compact")
    done = _first_that_loads(found, checkpoint, options, build, passed_over)
    if done is not None:
        return done
    raise RuntimeUnavailable("runtime='auto' found no runtime that can run this checkpoint here: "
                             + ("; ".join(passed_over) or "none is installed (pip install 'laya-runtime[torch]')"))


def _exact_for_now(checkpoint: Checkpoint, options: dict[str, Any], build: Build, passed_over: list[str]
                   ) -> tuple[Runtime, Choice] | None:
    """An exact runtime that loads in seconds, to answer while the pick is prepared in the background
    (`laya.encoder.upgrade`): the packed network in fp32, eager (no compiling; the parity suite holds it
    to 1e-4 of the reference, and it keeps half the reference's memory, the embeddings as stored), else
    torch fp32; None where torch is missing (the measured pick needs it anyway)."""
    if not _installed("torch"):
        return None
    later = ("answers at once while the fastest faithful runtime is compiled, gated and timed in the background "
             "and swapped in when ready")
    first = "the first load of this checkpoint on this machine:"
    now = [Candidate("packed", {"precision": "fp32", "compiled": False}, f"{first} packed fp32 (exact, eager) {later}"),
           Candidate("torch", {"precision": "fp32"}, f"{first} torch fp32 (exact, the reference) {later}")]
    return _first_that_loads(now, checkpoint, options, build, passed_over, deferred=True)


def load_stored_pick(checkpoint: Checkpoint, options: dict[str, Any], build: Build) -> tuple[Runtime, Choice] | None:
    """The pick stored for this checkpoint (by `laya prepare`, the background upgrade or `laya bench
    --pick`), loaded with the load's own options, or None."""
    options = dict(options)
    exact = options.pop("precision", None) == "fp32"
    for name in ("measure", "background"):
        options.pop(name, None)
    return _reuse_stored(checkpoint, options, build, cpu(), exact, [])


def cuda_candidates(exact: bool = False) -> list[Candidate]:
    """The cuda runtime's candidates where torch sees a CUDA device (none elsewhere): bf16 where the GPU
    has bf16 tensor cores (compute capability 8.0 or later) and `exact` is not asked, then fp32. Asking
    torch imports it, which auto's other candidates do anyway where it is installed."""
    if not _installed("torch"):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    major, minor = torch.cuda.get_device_capability()
    gpu = f"torch sees a CUDA device (compute capability {major}.{minor})"
    out = []
    if major >= 8 and not exact:
        out.append(Candidate("cuda", {"precision": "bf16"}, f"{gpu} with bf16 tensor cores, and cuda bf16 stayed "
                                                            "within the precision standard on this checkpoint"))
    out.append(Candidate("cuda", {"precision": "fp32"}, f"{gpu}: cuda fp32, exact"))
    return out


def _first_that_loads(found: list[Candidate], checkpoint: Checkpoint, options: dict[str, Any], build: Build,
                      passed_over: list[str], deferred: bool = False) -> tuple[Runtime, Choice] | None:
    """The first of `found` that loads (its gate included), or None with each refusal in `passed_over`;
    `deferred`: it answers only while the pick is prepared."""
    for candidate in found:
        try:
            runtime = _build(candidate, checkpoint, options, build)
        except LayaError as exc:
            purpose = " to answer while the pick is prepared" if deferred else ""
            passed_over.append(f"{candidate.label}{purpose} ({_first_line(exc)})")
            continue
        return _chosen(checkpoint, runtime, candidate, passed_over, deferred=deferred)
    return None


def build_routed(checkpoint: Checkpoint, options: dict[str, Any], build: Build) -> Runtime:
    from laya.encoder.runtimes.coreml import CoremlRuntime
    from laya.encoder.runtimes.routed import RoutedRuntime

    neural_engine = build("coreml", checkpoint, {"executor": "coreml" if sys.platform == "darwin" else "torch",
                                                 "ane": True, **{k: v for k, v in options.items()
                                                                 if k in ("cache_dir", "compact")}})
    rest = build("mlx", checkpoint, {"precision": "fp16"})
    assert isinstance(neural_engine, CoremlRuntime)
    return RoutedRuntime(neural_engine, rest)


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
