"""`laya eval`: the benchmark of methods (seed 001). A method is one model file, read one way, on one
engine: a laya checkpoint on a runtime (`checkpoint:onnx`), a GGUF read by a readout profile
(`chat.gguf:answer-slot`), or any System One endpoint (`https://host/...`, another `laya serve` or a
hosted one, with its key). Every method answers the same labelled states (the calibration format,
`laya.calibration.data`, with optional `"tags"` and `"lang"` to slice by), and the figures that tell
them apart come out side by side: accuracy per question and all answers right, NLL, Brier, ECE,
the coverage a target precision leaves (the abstention it buys), milliseconds per query and tokens.

The answers are kept per method in a work folder, one JSONL line per labelled state (`laya.apps.jsonl`'s
format, keyed by the line and a hash of what it asks), so an interrupted run resumes where it
stopped and a re-run with more methods asks only the new ones. Queries run one at a time locally
(ms per query is the latency of one decision, not a batch's share); a URL takes `--concurrency`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from laya.apps import jsonl
from laya.calibration.data import Record
from laya.calibration.metrics import coverage_at_precision, summarise
from laya.calibration.selective import Answered, answered_of, group_figures
from laya.calibration.selective import lines as selective_lines
from laya.engine import Engine
from laya.errors import LayaError
from laya.questions import parse_questions

RUNTIMES = ("auto", "torch", "onnx", "mlx", "coreml", "llama")
MAX_CONCURRENCY = 64


@dataclass(frozen=True)
class Method:
    spec: str  # as given on the command line (the report's name for it)
    source: str  # checkpoint, GGUF path or URL
    runtime: str | None = None  # encoder checkpoints: the runtime
    readout: str | None = None  # GGUFs: the readout profile
    model: str | None = None  # a URL's served model (`URL#model=NAME`), else its default
    calibration: str | None = None  # a local model's calibration file (a server applies its own)

    @property
    def remote(self) -> bool:
        return self.source.startswith(("http://", "https://"))

    @property
    def slug(self) -> str:
        """The method's file name in the work folder."""
        tail = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.spec)[-60:].strip("-") or "method"
        return f"{tail}-{hashlib.sha256(self.spec.encode()).hexdigest()[:10]}"


def parse_method(spec: str) -> Method:
    """`URL[#model=NAME]` (a server's base URL, or its /v1/systemone), `path.gguf[:READOUT]` or
    `checkpoint[:RUNTIME]`."""
    from laya.engines import is_gguf, split_readout

    if spec.startswith(("http://", "https://")):
        url, _, fragment = spec.partition("#")
        model = fragment.removeprefix("model=") or None if fragment.startswith("model=") else None
        if fragment and model is None:
            raise LayaError(f"-m {spec[:200]}: a URL takes '#model=NAME' after it, nothing else")
        return Method(spec, url.rstrip("/").removesuffix("/v1/systemone"), model=model)
    if is_gguf(spec):
        path, readout = split_readout(spec)
        if readout is not None:
            from laya.decide.metadata import profile_name

            readout = profile_name(readout, f"-m {spec}")
        return Method(spec, path, readout=readout)
    head, colon, runtime = spec.rpartition(":")
    if colon and runtime in RUNTIMES:
        return Method(spec, head, runtime=runtime)
    return Method(spec, spec)


def local_engine(method: Method, threads: int | None, decide_probe: str | None = None) -> Engine:
    """A local method's engine, loaded as `laya serve --single-process` loads it (eval and distill)."""
    from laya.engines import open_engine

    return open_engine(method.source, threads=threads, runtime=method.runtime, readout=method.readout,
                       decide_probe=decide_probe, calibration=method.calibration)


def _lines(records: Sequence[Record], model: str | None, order: str | None = None) -> Iterator[jsonl.Line]:
    for record in records:
        body = {"state": record.state, "questions": record.questions, **({"model": model} if model else {}),
                **({"x_order": order} if order else {})}
        yield jsonl.Line(record.line, key_of(record, order), body)


def key_of(record: Record, order: str | None = None) -> str:
    """A labelled state's id in the work files: its line and a hash of what it asks, in which option
    order and with which `x_order` (an edited line is asked again)."""
    asked = [record.state, record.questions] + ([order] if order else [])
    digest = hashlib.sha256(json.dumps(asked, ensure_ascii=False).encode()).hexdigest()[:16]
    return f"{record.line}:{digest}"


def reversed_record(record: Record) -> Record:
    """The record with every choice's options listed in the reverse order (labels are by option
    name, so they still hold): what order sensitivity compares the record with."""
    questions = {qid: _reversed(q) for qid, q in record.questions.items()}
    return replace(record, questions=questions, parsed=parse_questions(questions))


def _reversed(question: Any) -> Any:
    if not isinstance(question, dict) or question.get("type") != "choice":
        return question
    criteria = question.get("criteria")
    if isinstance(criteria, dict):
        return {**question, "criteria": dict(reversed(list(criteria.items())))}
    if isinstance(criteria, list):
        return {**question, "criteria": criteria[::-1]}
    return question


def order_sensitivity(records: Sequence[Record], given: dict[str, dict[str, Any]],
                      turned: dict[str, dict[str, Any]], order: str | None = None) -> dict[str, Any]:
    """How much a method's choices depend on the option order: per choice question answered both ways,
    the largest change of an option's probability between the order given and the reverse; their
    largest and their mean."""
    changes = []
    for record in records:
        one, other = given.get(key_of(record, order)), turned.get(key_of(reversed_record(record), order))
        if not (one and other and "response" in one and "response" in other):
            continue
        for q in record.parsed:
            if q.qtype != "choice":
                continue
            a = one["response"]["answers"][q.qid]["probabilities"]
            b = other["response"]["answers"][q.qid]["probabilities"]
            changes.append(max(abs(float(a[k]) - float(b[k])) for k in q.keys))
    return {"questions": len(changes), "max": max(changes, default=math.nan),
            "mean": float(np.mean(changes)) if changes else math.nan}


def timed(answer: jsonl.Answer) -> jsonl.Answer:
    """Each line's outcome with the milliseconds it took (lines are answered one per call here)."""

    def run(lines: list[jsonl.Line]) -> list[dict[str, Any]]:
        started = time.perf_counter()
        outcomes = answer(lines)
        ms = (time.perf_counter() - started) * 1000.0 / max(1, len(lines))
        return [{**o, "ms": o.get("ms", ms)} for o in outcomes]

    return run


def run_method(method: Method, records: Sequence[Record], work: Path, *, concurrency: int = 1,
               api_key: str | None = None, threads: int | None = None, progress: bool = True,
               decide_probe: str | None = None, order: str | None = None) -> dict[str, Any]:
    """The method's outcome for every record (by `key_of`), asking only those not in its work file
    (`decide_probe`: a GGUF's decisions' lens lines go to that file; `order`: every request's
    `x_order`)."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise LayaError(f"--concurrency must be from 1 to {MAX_CONCURRENCY}, got {concurrency}")
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{method.slug}.jsonl"
    keys = {key_of(r, order) for r in records}
    done = jsonl.outcomes(out)
    todo = [r for r in records if key_of(r, order) not in done]
    if todo:
        if method.remote:
            answer = jsonl.remote_answer(method.source, api_key, concurrency, timed=True)
            chunk = concurrency
        else:
            answer, chunk = jsonl.local_answer(local_engine(method, threads, decide_probe)), 1
        try:
            jsonl.run(_lines(todo, method.model, order), out, timed(answer), total=len(todo), chunk=chunk,
                      progress=progress)
        finally:
            getattr(answer, "close", lambda: None)()
    return {k: v for k, v in jsonl.outcomes(out).items() if k in keys}


def probabilities(question: Any, answer: dict[str, Any]) -> np.ndarray:
    """An answer's probabilities in the question's option order (a yes/no as [false, true])."""
    if question.qtype == "noul":
        p = float(answer["noul"])
        return np.array([1.0 - p, p])
    given = answer["probabilities"]
    return np.array([float(given[k]) for k in question.keys])


def figures(records: Sequence[Record], outcomes: dict[str, dict[str, Any]], *, precision: float = 0.9,
            bins: int = 10, order: str | None = None) -> dict[str, Any]:
    """Every figure of one method over the labelled records it answered."""
    probs: dict[str, list[np.ndarray]] = {}
    labels: dict[str, list[int]] = {}
    every_p, every_y, all_right, ms, tokens, failed = [], [], [], [], [], 0
    slices: dict[str, dict[str, list[bool]]] = {"tag": {}, "lang": {}}
    selective: list[Answered] = []
    for record in records:
        outcome = outcomes.get(key_of(record, order))
        if outcome is None or "response" not in outcome:
            failed += 1
            continue
        answers = outcome["response"]["answers"]
        right = True
        for q in record.parsed:
            if q.qid not in record.labels:
                continue
            p, y = probabilities(q, answers[q.qid]), record.labels[q.qid]
            probs.setdefault(q.qid, []).append(p)
            labels.setdefault(q.qid, []).append(y)
            every_p.append(p)
            every_y.append(y)
            right &= int(np.argmax(p)) == y
            selective.append(answered_of(p, y, answers[q.qid], q.keys, groups_of(record)))
        all_right.append(right)
        for tag in record.tags:
            slices["tag"].setdefault(tag, []).append(right)
        if record.lang:
            slices["lang"].setdefault(record.lang, []).append(right)
        ms.append(float(outcome.get("ms", math.nan)))
        tokens.append(int(outcome["response"].get("usage", {}).get("input_tokens", 0)))
    overall = summarise(every_p, every_y, bins=bins)
    top = np.array([float(np.max(p)) for p in every_p])
    correct = np.array([int(np.argmax(p)) == y for p, y in zip(every_p, every_y)])
    return {
        "answered": len(all_right), "failed": failed,
        "accuracy": overall["accuracy"], "all_right": float(np.mean(all_right)) if all_right else math.nan,
        "nll": overall["nll"], "brier": overall["brier"], "ece": overall["ece"],
        "coverage": {"precision": precision, "coverage": coverage_at_precision(top, correct, precision)},
        "ms": {"p50": _quantile(ms, 0.5), "p90": _quantile(ms, 0.9)},
        "tokens": {"mean": float(np.mean(tokens)) if tokens else math.nan, "total": int(sum(tokens))},
        "questions": {qid: {k: v for k, v in summarise(probs[qid], labels[qid], bins=bins).items()
                            if k in ("n", "accuracy", "nll", "brier", "ece")} for qid in probs},
        "by": {kind: {name: {"n": len(v), "all_right": float(np.mean(v))} for name, v in sorted(groups.items())}
               for kind, groups in slices.items() if groups},
        "selective": group_figures(selective, bins),
    }


def groups_of(record: Record) -> tuple[str, ...]:
    """The groups the selective figures are kept per: a line's group, language and tags."""
    return ((f"group {record.group}",) if record.group else ()) + ((f"lang {record.lang}",) if record.lang else ()) \
        + tuple(f"tag {t}" for t in record.tags)


def risk_curves(records: Sequence[Record], outcomes: dict[str, dict[str, Any]], order: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(abstain signal, wrong) of every labelled answer a method gave, for its risk-coverage curve."""
    got = []
    for record in records:
        outcome = outcomes.get(key_of(record, order))
        if outcome is None or "response" not in outcome:
            continue
        for q in record.parsed:
            if q.qid in record.labels:
                p = probabilities(q, outcome["response"]["answers"][q.qid])
                got.append(answered_of(p, record.labels[q.qid], outcome["response"]["answers"][q.qid], q.keys, ()))
    return np.array([a.signal for a in got]), np.array([a.wrong for a in got])


def _quantile(values: list[float], q: float) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.quantile(finite, q)) if finite else math.nan


def report(records: Sequence[Record], results: dict[str, dict[str, dict[str, Any]]], *, data: str,
           precision: float, order: str | None = None) -> dict[str, Any]:
    return {"data": data, "records": len(records), **({"order": order} if order else {}),
            "methods": {spec: figures(records, outcomes, precision=precision, order=order)
                        for spec, outcomes in results.items()}}


def markdown(rep: dict[str, Any]) -> str:
    """The report as one Markdown table (and the slices below it)."""
    precision = next(iter(rep["methods"].values()))["coverage"]["precision"] if rep["methods"] else 0.9
    head = ["method", "answered", "accuracy", "all right", "NLL", "Brier", "ECE", f"coverage @{precision:g}",
            "ms p50", "ms p90", "tokens"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, f in rep["methods"].items():
        rows.append("| " + " | ".join([
            f"`{spec}`", f"{f['answered']}" + (f" ({f['failed']} failed)" if f["failed"] else ""),
            _num(f["accuracy"]), _num(f["all_right"]), _num(f["nll"]), _num(f["brier"]), _num(f["ece"]),
            _num(f["coverage"]["coverage"]), _num(f["ms"]["p50"], 1), _num(f["ms"]["p90"], 1),
            _num(f["tokens"]["mean"], 0)]) + " |")
    lines = [f"{rep['records']} labelled states from {rep['data']}" + (f", x_order {rep['order']}" if rep.get("order")
                                                                         else ""), "", *rows]
    for spec, f in rep["methods"].items():
        if (found := f.get("order_sensitivity")) is not None:
            lines.append(f"\n`{spec}`, order sensitivity (largest change of an option's probability, options "
                         f"reversed): max {_num(found['max'])}, mean {_num(found['mean'])} over "
                         f"{found['questions']} choices")
    for spec, f in rep["methods"].items():
        if f.get("selective"):
            lines.append(f"\n`{spec}`, per group (AURC in order of x_signal where answers carry it, else the top "
                         "probability; set coverage where they carry x_set):")
            lines += selective_lines(f["selective"])
    for spec, f in rep["methods"].items():
        for kind, groups in f["by"].items():
            parts = ", ".join(f"{name} {g['all_right']:.3f} (n {g['n']})" for name, g in groups.items())
            lines.append(f"\n`{spec}`, all right by {kind}: {parts}")
    return "\n".join(lines) + "\n"


def _num(value: float, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def regressions(rep: dict[str, Any], baseline: dict[str, Any], max_drop: float) -> list[str]:
    """What fell by more than `max_drop` against `baseline` (an earlier `--json` report), per method
    both name: accuracy and all right; a method the baseline has and this run lacks is one too."""
    out = []
    for spec, before in baseline.get("methods", {}).items():
        now = rep["methods"].get(spec)
        if now is None:
            out.append(f"{spec}: in the baseline, not in this run")
            continue
        for key in ("accuracy", "all_right"):
            old, new = before.get(key), now.get(key)
            if isinstance(old, float) and isinstance(new, float) and old - new > max_drop:
                out.append(f"{spec}: {key} {old:.4f} -> {new:.4f} (a drop of {old - new:.4f} > {max_drop:g})")
    return out


def plot(rep: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against milliseconds per query, one point per method."""
    from laya.calibration.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for spec, f in rep["methods"].items():
        ax.scatter([f["ms"]["p50"]], [f["accuracy"]])
        ax.annotate(spec[-40:], (f["ms"]["p50"], f["accuracy"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("ms per query (p50)")
    ax.set_ylabel("accuracy")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.set_title(f"{rep['records']} labelled states")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def lens(method: Method, records: Sequence[Record], path: str | Path, threads: int | None = None) -> dict[str, Any]:
    """The encoder lens of a local laya checkpoint over the records (`laya.encoder.lens`): one JSON line
    per answered question appended to `path`, and where the answers settle."""
    from laya.encoder.lens import layer_probabilities, settles_at

    if method.remote or method.readout is not None or method.source.lower().endswith(".gguf"):
        raise LayaError(f"--lens reads laya checkpoints; {method.spec} is not one (--decide-probe reads a GGUF's)")
    from laya.encoder.engine import EncoderEngine

    engine = local_engine(method, threads)
    if not isinstance(engine, EncoderEngine):
        raise LayaError(f"--lens reads laya checkpoints; {method.spec} is not one")
    model = engine.model
    settled = []
    with open(path, "a", encoding="utf-8") as out:
        for record in records:
            for qid, layers in layer_probabilities(model, record.state, record.questions).items():
                at = settles_at(layers)
                settled.append(at)
                out.write(json.dumps({"method": method.spec, "line": record.line, "question": qid,
                                      "settles_at": at, "layers": layers}) + "\n")
    n_layers = model.checkpoint.encoder.num_hidden_layers
    return {"layers": n_layers, "answers": len(settled),
            "settles_at_mean": float(np.mean(settled)) if settled else math.nan,
            "settled_by_layer": [float(np.mean([s <= k for s in settled])) if settled else math.nan
                                 for k in range(1, n_layers + 1)]}
