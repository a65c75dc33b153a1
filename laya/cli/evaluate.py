"""`laya eval`: the benchmark of methods (models, readouts, runtimes, servers) over the same labelled states,
side by side, with a baseline to catch regressions."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from laya.apps.outbound import read_key_file
from laya.cli.common import PROBE_HELP, Subparsers, UsageError, order_arg
from laya.engines import is_gguf


def register(sub: Subparsers) -> None:
    """Add `laya eval` to the subparsers `sub`."""
    ev = sub.add_parser("eval", help="the benchmark of methods: several models (and readouts, runtimes, servers) "
                                     "over the same labelled states")
    ev.add_argument("data", help='JSONL: {"state", "questions", "labels": {qid: answer}, "tags"?, "lang"?} per line')
    ev.add_argument("--method", "-m", action="append", required=True,
                    help="checkpoint[:RUNTIME], chat.gguf[:READOUT], or a System One URL[#model=NAME]; repeat")
    ev.add_argument("--calibration", metavar="FILE", help="a calibration file from `laya calibrate` for the local "
                                                          "methods: answers carry its prediction sets and abstentions, "
                                                          "and the report their figures per group")
    ev.add_argument("--json", metavar="FILE", help="also write the figures as JSON (a later run's --baseline)")
    ev.add_argument("--plot", metavar="FILE.png", help="accuracy against ms per query, one point per method")
    ev.add_argument("--risk-plot", metavar="FILE.png",
                    help="risk-coverage curves, one per method (answering in order of x_signal, else the top "
                         "probability), with their AURC")
    ev.add_argument("--work", metavar="DIR", help="where each method's answers are kept, so a run resumes "
                                                 "(default: beside --json, else .laya-eval)")
    ev.add_argument("--baseline", metavar="REPORT.json", help="exit 1 if a method fell by more than --max-drop")
    ev.add_argument("--max-drop", type=float, default=0.02, help="accuracy (or all-right rate) a method may lose")
    ev.add_argument("--target-precision", type=float, default=0.9,
                    help="the precision the coverage figure keeps (the abstention it would buy)")
    ev.add_argument("--concurrency", type=int, default=1, help="requests in flight to a URL (local: one at a time)")
    ev.add_argument("--url-key", action="append", metavar="URL=PATH", default=[],
                    help="a file holding the key of the method URL (each URL only its own; repeat)")
    ev.add_argument("--threads", type=int, help="CPU threads of local models")
    ev.add_argument("--decide-probe", metavar="FILE", help=PROBE_HELP)
    ev.add_argument("--lens", metavar="FILE", help="laya checkpoints: append each answer's per-layer lens to FILE "
                                                   "(the head applied to every encoder layer's states) and print "
                                                   "the layer at which answers settle")
    ev.add_argument("--order", type=order_arg, help="every request's x_order: both or rotate:K (each choice read "
                                                    "in those option orders, its probabilities averaged)")
    ev.add_argument("--order-sensitivity", action="store_true",
                    help="ask each record again with every choice's options reversed and report, per method, the "
                         "largest change of an option's probability")
    ev.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    ev.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """`laya eval DATA -m METHOD ...`: every method over the same labelled states, side by side."""
    from laya.apps import evaluation
    from laya.calibration.data import read_records

    records = read_records(args.data)  # every line checked before any model loads
    methods = [evaluation.parse_method(m) for m in args.method]
    if args.calibration:  # every local method answers with the file (sets, the error bound, its signal)
        if remote := [m.spec for m in methods if m.remote]:
            raise UsageError(f"--calibration applies to local methods; {remote[0]} is a server, which applies its "
                             "own (laya serve --calibration)")
        methods = [dataclasses.replace(m, calibration=args.calibration) for m in methods]
    if len({m.spec for m in methods}) != len(methods):
        raise UsageError("a method is named twice")
    if not 0 < args.target_precision <= 1:
        raise UsageError("--target-precision must be in (0, 1]")
    baseline = None
    if args.baseline is not None:
        try:
            baseline = json.loads(Path(args.baseline).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--baseline {args.baseline}: not a readable report ({exc})") from exc
    if args.lens and all(m.remote or is_gguf(m.source) for m in methods):
        raise UsageError("--lens reads laya checkpoints, and no method is one (--decide-probe FILE reads a GGUF's)")
    work = Path(args.work or (Path(args.json).with_suffix(".work") if args.json else ".laya-eval"))
    keys = url_keys(args.url_key, methods)
    results, sensitivity = {}, {}
    for method in methods:
        if not args.no_progress:
            print(f"laya: {method.spec}", file=sys.stderr)
        asking = dict(concurrency=args.concurrency, api_key=keys.get(method.spec), threads=args.threads,
                      progress=not args.no_progress, decide_probe=args.decide_probe, order=args.order)
        results[method.spec] = evaluation.run_method(method, records, work, **asking)
        if args.order_sensitivity:
            turned = [evaluation.reversed_record(r) for r in records]
            sensitivity[method.spec] = evaluation.order_sensitivity(
                records, results[method.spec], evaluation.run_method(method, turned, work, **asking), args.order)
    rep = evaluation.report(records, results, data=args.data, precision=args.target_precision, order=args.order)
    for spec, found in sensitivity.items():
        rep["methods"][spec]["order_sensitivity"] = found
    if args.lens:
        for method in methods:
            if not (method.remote or is_gguf(method.source)):
                found = evaluation.lens(method, records, args.lens, threads=args.threads)
                rep["methods"][method.spec]["lens"] = found
                print(f"laya: {method.spec}: answers settle at layer {found['settles_at_mean']:.2f} of "
                      f"{found['layers']} on average ({found['answers']} answers; {args.lens})", file=sys.stderr)
    print(evaluation.markdown(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.plot:
        evaluation.plot(rep, args.plot)
    if args.risk_plot:
        from laya.calibration.plots import risk_coverage_plot

        risk_coverage_plot({spec: evaluation.risk_curves(records, outcomes, args.order)
                            for spec, outcomes in results.items()}, args.risk_plot, title="Risk vs coverage")
    silent = [spec for spec, f in rep["methods"].items() if f["answered"] == 0]
    for spec in silent:
        print(f"laya: {spec} answered none of the {len(records)} states (see {work})", file=sys.stderr)
    if baseline is not None:
        dropped = evaluation.regressions(rep, baseline, args.max_drop)
        for line in dropped:
            print(f"laya: regression: {line}", file=sys.stderr)
        if dropped:
            return 1
    return 1 if silent else 0


def url_keys(values: list[str], methods: list[Any]) -> dict[str, str]:
    """`--url-key URL=PATH` (repeatable) -> {method spec: key}: each URL's key read from its own file."""
    urls = {m.source: m.spec for m in methods if m.remote}
    out: dict[str, str] = {}
    for value in values:
        url, sep, path = value.partition("=")
        url = url.rstrip("/").removesuffix("/v1/systemone")
        if not sep or not path:
            raise UsageError(f"--url-key {value[:200]!r}: give URL=PATH (a file holding that URL's key)")
        specs = [spec for source, spec in urls.items() if source == url]
        if not specs:
            raise UsageError(f"--url-key {url[:200]!r}: no method -m names that URL")
        key = read_key_file(path, f"--url-key {url}")
        for spec in specs:
            out[spec] = key  # type: ignore[assignment]
    return out
