"""`laya calibrate`: fit temperatures and an abstention threshold on labelled decisions (laya.calibration),
written in laya's format or upstream's."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laya.cli import common
from laya.cli.common import N_CTX_HELP, READOUT_HELP, Subparsers, UsageError
from laya.engines import is_gguf


def register(sub: Subparsers) -> None:
    """Add `laya calibrate` to the subparsers `sub`."""
    from laya.decide.profiles import PROFILES as READOUT_CHOICES  # the readout profiles' one list

    cal = sub.add_parser("calibrate", help="fit temperatures and an abstention threshold on labelled decisions")
    cal.add_argument("model", help="checkpoint folder, registered name, Hub id, bundle, or chat .gguf file")
    cal.add_argument("data", help='JSONL: {"state", "questions", "labels": {qid: answer}} per line')
    cal.add_argument("--out", default="calibration.json", help="the calibration file to write")
    cal.add_argument("--readout", choices=READOUT_CHOICES, help=READOUT_HELP + "; a calibration is fitted on one")
    cal.add_argument("--report-dir", help="also write the report (JSON, text) and the two plots (PNG) here")
    cal.add_argument("--target-precision", type=float, help="choose an abstention threshold for this precision")
    cal.add_argument("--coverage", type=float,
                     help="prediction sets (x_set) holding the right answer with at least this probability "
                          "(split conformal on the held-out answers, per bucket and group)")
    cal.add_argument("--max-error", type=float,
                     help="abstain (x_abstain) so that the error rate of the answers given is at most this, "
                          "with probability --confidence (Learn then Test on the held-out answers)")
    cal.add_argument("--confidence", type=float, default=0.95, help="the confidence of --max-error's bound")
    cal.add_argument("--group-by", default="auto", choices=["auto", "group", "lang", "none"],
                     help="groups of the prediction sets and the report: a line's \"group\" field, its language "
                          "(its \"lang\", else as the router detects it), none; auto: group, else lang if given")
    cal.add_argument("--min-group", type=int, default=100,
                     help="held-out answers a group needs for its own prediction-set threshold")
    cal.add_argument("--holdout", type=float, default=0.3, help="share of lines held out for the report")
    cal.add_argument("--seed", type=int, default=0, help="seed of the train/held-out split")
    cal.add_argument("--min-bucket", type=int, default=100,
                     help="fewest training answers for a bucket (and held-out answers for a bucket threshold)")
    cal.add_argument("--bins", type=int, default=10, help="equal-mass bins of the ECE and the reliability diagram")
    cal.add_argument("--buckets", choices=["auto", "on", "off"], default="auto",
                     help="fit per option-count bucket too (auto: checkpoints yes, GGUF models per type only)")
    cal.add_argument("--format", choices=["laya", "upstream"], default="laya",
                     help="the file to write: laya's (temperatures, abstention, the model's fingerprint) or upstream "
                          "laya's (version 2: the whole temperature state, the checkpoint it names, an optional "
                          "binning map), which upstream's Agent(calibration=...) and laya.load(calibration=) read")
    cal.add_argument("--binning", action="store_true",
                     help="with --format upstream: also fit upstream's histogram binning of the top probability")
    cal.add_argument("--binning-min-bucket", type=int, default=200,
                     help="answers a bucket needs for a binning map (upstream's default 200)")
    cal.add_argument("--runtime", "-r", help="runtime of a laya checkpoint")
    cal.add_argument("--threads", type=int)
    cal.add_argument("--n-ctx", type=int, default=None, help=N_CTX_HELP)
    cal.add_argument("--revision")
    cal.add_argument("--subfolder")
    cal.add_argument("--sha256")
    cal.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """`laya calibrate MODEL DATA`: the calibration file (and, with `--report-dir`, the report and plots)."""
    from laya.calibration.data import read_records
    from laya.calibration.run import calibrate, text_summary

    records = read_records(args.data)  # every line checked before the model loads
    for name in ("coverage", "max_error", "confidence"):
        value = getattr(args, name)
        if value is not None and not 0.0 < value < 1.0:
            raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, got {value}")
    if args.format == "upstream" and (args.coverage is not None or args.max_error is not None):
        raise UsageError("--coverage and --max-error are written in laya's format; leave out --format upstream")
    if args.binning and args.format != "upstream":
        raise UsageError("--binning writes upstream's binning_map; add --format upstream")
    if is_gguf(args.model) and args.format == "upstream":
        raise UsageError("--format upstream is upstream laya's file for laya checkpoints; a GGUF is calibrated in "
                         "laya's own format")
    from laya.decide.engine import DecideEngine
    from laya.encoder.engine import EncoderEngine

    engine = common.make_engine(args)  # opened as every command opens a model (`open_engine`)
    if not isinstance(engine, EncoderEngine | DecideEngine):
        raise UsageError(f"{args.model}: not a model laya calibrates")
    model: Any = engine.model
    if is_gguf(args.model):
        fingerprint, buckets = model.fingerprint, args.buckets == "on"
    else:
        fingerprint, buckets = model.checkpoint.fingerprint, args.buckets != "off"
    try:
        outcome = calibrate(model, records, fingerprint=fingerprint, holdout=args.holdout, seed=args.seed,
                            buckets=buckets, min_bucket=args.min_bucket, target_precision=args.target_precision,
                            bins=args.bins, progress=_progress(), data_name=Path(args.data).name,
                            binning_min_bucket=args.binning_min_bucket if args.binning else None,
                            coverage=args.coverage, max_error=args.max_error, confidence=args.confidence,
                            group_by=args.group_by, min_group=args.min_group)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.format == "upstream":
        from laya.calibration import upstream

        assert outcome.temperatures is not None  # calibrate always returns the fitted temperatures
        config = json.loads((model.checkpoint.path / "rl_agent_config.json").read_text(encoding="utf-8"))
        upstream.save(args.out, upstream.payload(outcome.temperatures, model_id_or_path=args.model,
                                                 subfolder=args.subfolder, config=config, binning=outcome.binning))
    else:
        outcome.calibration.save(args.out)
    summary = text_summary(outcome.report)
    if args.report_dir:
        from laya.calibration.plots import coverage_plot, reliability_diagram

        folder = Path(args.report_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "calibration-report.json").write_text(json.dumps(outcome.report, indent=2) + "\n")
        (folder / "calibration-report.txt").write_text(summary + "\n")
        reliability_diagram(outcome.heldout_before, outcome.heldout_after, args.bins, folder / "reliability.png")
        coverage_plot(outcome.heldout_before, outcome.heldout_after, folder / "coverage.png", args.target_precision)
        _guarantee_plots(outcome, folder, args.max_error)
    print(summary)
    print(f"wrote {args.out}" + (f" and the report in {args.report_dir}" if args.report_dir else ""), file=sys.stderr)
    return 0


def _guarantee_plots(outcome: Any, folder: Path, max_error: float | None) -> None:
    """risk-coverage.png always; sets.png with prediction sets."""
    from laya.calibration.guarantees import curves
    from laya.calibration.plots import risk_coverage_plot, sets_plot

    assert outcome.held is not None and outcome.guarantees is not None
    risk_coverage_plot(curves(outcome.held, outcome.guarantees.signal_values), folder / "risk-coverage.png",
                       max_error)
    conformal = outcome.report.get("conformal")
    if conformal:
        check = conformal["check"]
        sets_plot(check["mean_coverage"], check["mean_set_size"], conformal["coverage"], folder / "sets.png")


def _progress() -> Callable[[int, int], None]:
    """The progress line on stderr: rewritten in place on a terminal, else a line per tenth."""
    started = time.perf_counter()
    tty = sys.stderr.isatty()
    shown = [-1]

    def progress(done: int, total: int) -> None:
        tenth = done * 10 // total
        if tty or tenth != shown[0]:
            shown[0] = tenth
            rate = done / max(1e-9, time.perf_counter() - started)
            end = "\n" if done == total or not tty else ""
            print(f"\rcalibrate: {done}/{total} lines ({rate:.1f}/s)", end=end, file=sys.stderr, flush=True)

    return progress
