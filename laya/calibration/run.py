"""`laya calibrate`: run a model over labelled decisions, fit temperatures, choose an abstention
threshold, and measure everything before and after on a held-out split.

Works on both engines through `Evidence`: the model is run once, and every temperature the fit
tries re-decodes the same evidence. The split is by line (all questions of one state go to the same
side) and seeded.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laya.calibration.abstention import Abstention, choose_threshold
from laya.calibration.data import Record
from laya.calibration.file import Calibration
from laya.calibration.fitting import MIN_BUCKET_SAMPLES, FitResult, Labelled, fit_temperatures
from laya.calibration.guarantees import (
    Guarantees,
    HeldOut,
    fit_guarantees,
    group_of,
    resolve_group_by,
    selective_figures,
    summary_lines,
)
from laya.calibration.metrics import DEFAULT_BINS, coverage_at_precision, summarise
from laya.calibration.temperatures import Temperatures, bucket_key

RECORDS_PER_CALL = 64  # encoder models: lines whose rows share forward passes


@dataclass
class Outcome:
    calibration: Calibration
    report: dict[str, Any]
    # held-out answers before and after, for plots: (top probability, correct) arrays
    heldout_before: tuple[np.ndarray, np.ndarray]
    heldout_after: tuple[np.ndarray, np.ndarray]
    binning: dict[str, dict[str, Any]] | None = None  # upstream's histogram binning, when asked for
    temperatures: Temperatures | None = None  # the model's temperatures after calibration
    held: HeldOut | None = None  # the held-out answers after calibration, with their lines and groups
    guarantees: Guarantees | None = None  # prediction sets and the error-bound rule, when asked for


def collect(model: Any, records: Sequence[Record], progress: Callable[[int, int], None] | None = None
            ) -> list[list[Labelled]]:
    """Per record, the labelled evidence of each labelled question (one model run per record)."""
    out: list[list[Labelled]] = []
    if hasattr(model, "evidence_one"):  # the decide engine: one state at a time on one live context
        for i, record in enumerate(records):
            evidence, _, _ = model.evidence_one(record.state, record.parsed)
            out.append(_labelled(record, evidence))
            if progress:
                progress(i + 1, len(records))
        return out
    for start in range(0, len(records), RECORDS_PER_CALL):
        chunk = records[start : start + RECORDS_PER_CALL]
        evidence = model.evidence([model.prepare([r.state], r.questions) for r in chunk])
        out += [_labelled(record, per_request[0]) for record, per_request in zip(chunk, evidence)]
        if progress:
            progress(min(start + RECORDS_PER_CALL, len(records)), len(records))
    return out


def _labelled(record: Record, evidence) -> list[Labelled]:
    return [Labelled(ev, record.labels[q.qid]) for q, ev in zip(record.parsed, evidence) if q.qid in record.labels]


def split(n: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"the held-out share must be between 0 and 1, got {holdout}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    cut = n - max(1, round(n * holdout))
    if cut < 1:
        raise ValueError(f"{n} labelled lines cannot be split into a training and a held-out part")
    return sorted(order[:cut]), sorted(order[cut:])


def decode_all(samples: Sequence[Labelled], temps: Temperatures) -> list[np.ndarray]:
    return [s.evidence.probabilities(temps.for_question(s.evidence.qtype, s.evidence.n_options)) for s in samples]


def measure(samples: Sequence[Labelled], temps: Temperatures, bins: int) -> dict[str, Any]:
    """Figures overall, per type and per bucket."""
    probs = decode_all(samples, temps)
    labels = [s.label for s in samples]
    acts = [s.evidence.act_probability for s in samples]
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.evidence.qtype, []).append(i)
        groups.setdefault(bucket_key(s.evidence.qtype, s.evidence.n_options), []).append(i)

    def figures(idx: Sequence[int]) -> dict[str, Any]:
        return summarise([probs[i] for i in idx], [labels[i] for i in idx], [acts[i] for i in idx], bins)

    return {"overall": figures(range(len(samples))), "groups": {k: figures(v) for k, v in sorted(groups.items())}}


def top_and_correct(samples: Sequence[Labelled], temps: Temperatures) -> tuple[np.ndarray, np.ndarray]:
    probs = decode_all(samples, temps)
    top = np.array([float(np.max(p)) for p in probs])
    correct = np.array([int(np.argmax(p)) == s.label for p, s in zip(probs, samples)])
    return top, correct


def calibrate(model: Any, records: Sequence[Record], *, fingerprint: str, holdout: float = 0.3, seed: int = 0,
              buckets: bool = True, min_bucket: int = MIN_BUCKET_SAMPLES, target_precision: float | None = None,
              bins: int = DEFAULT_BINS, precision_levels: Sequence[float] = (0.9, 0.95),
              progress: Callable[[int, int], None] | None = None, data_name: str = "",
              binning_min_bucket: int | None = None, coverage: float | None = None,
              max_error: float | None = None, confidence: float = 0.95, group_by: str = "auto",
              min_group: int | None = None) -> Outcome:
    """`binning_min_bucket` also fits upstream's histogram binning (on the training answers, over the
    fitted temperatures) for every bucket with that many answers. `coverage` fits prediction sets and
    `max_error` / `confidence` the error-bound rule on the held-out answers (laya.calibration.guarantees),
    per group of `group_by` (`group`, `lang`, `none` or `auto`)."""
    if target_precision is not None and not 0.0 < target_precision <= 1.0:
        raise ValueError(f"the target precision must be in (0, 1], got {target_precision}")
    train_idx, test_idx = split(len(records), holdout, seed)
    evidence = collect(model, records, progress)
    train = [s for i in train_idx for s in evidence[i]]
    test = [s for i in test_idx for s in evidence[i]]
    if not train or not test:
        raise ValueError("no labelled answers on one side of the split; label more questions")
    before: Temperatures = model.temperatures
    fit: FitResult = fit_temperatures(train, buckets=buckets, min_bucket=min_bucket)
    fitted = Calibration(model=fingerprint, temperature=dict(fit.per_type), temperature_by_options=dict(fit.by_bucket))
    after = fitted.over(before)

    top_b, correct_b = top_and_correct(test, before)
    top_a, correct_a = top_and_correct(test, after)
    report: dict[str, Any] = {
        "data": data_name,
        "split": {"seed": seed, "holdout": holdout, "train_lines": len(train_idx), "heldout_lines": len(test_idx),
                  "train_answers": len(train), "heldout_answers": len(test)},
        "fit": {"per_type": fit.per_type, "by_bucket": fit.by_bucket, "counts": fit.counts,
                "left_on_the_model's_value": fit.skipped, "min_bucket_samples": min_bucket, "buckets": buckets},
        "temperatures": {"before": before.to_dict(), "after": after.to_dict()},
        "ece_bins": bins,
        "heldout": {"before": measure(test, before, bins), "after": measure(test, after, bins)},
        "coverage_at_precision": {
            str(level): {"before": coverage_at_precision(top_b, correct_b, level),
                         "after": coverage_at_precision(top_a, correct_a, level)} for level in precision_levels},
    }
    held = held_out(records, evidence, test_idx, after, resolve_group_by(records, group_by))
    extra = fit_guarantees(held, coverage=coverage, max_error=max_error, confidence=confidence, seed=seed,
                           **({} if min_group is None else {"min_group": min_group}))
    report |= extra.report | {"groups_by": resolve_group_by(records, group_by),
                              "selective": selective_figures(held, extra.signal_values, bins)}
    abstention = None
    if target_precision is not None:
        threshold = choose_threshold(top_a, correct_a, target_precision)
        by_bucket = {}
        keys = sorted({bucket_key(s.evidence.qtype, s.evidence.n_options) for s in test})
        for key in keys:
            idx = [i for i, s in enumerate(test) if bucket_key(s.evidence.qtype, s.evidence.n_options) == key]
            if len(idx) >= min_bucket:
                value = choose_threshold(top_a[idx], correct_a[idx], target_precision)
                if value is not None:
                    by_bucket[key] = value
        if threshold is None:
            report["abstention"] = {"target_precision": target_precision, "threshold": None,
                                    "note": "no threshold reaches the target precision on the held-out answers"}
        else:
            abstention = Abstention(threshold, target_precision, by_bucket)
            kept = np.array([top_a[i] >= abstention.threshold_for(s.evidence.qtype, s.evidence.n_options)
                             for i, s in enumerate(test)])
            report["abstention"] = abstention.to_dict() | {
                "chosen_on": "held-out answers (after calibration)",
                "coverage": float(kept.mean()),
                "precision_of_answered": float(correct_a[kept].mean()) if kept.any() else None,
            }
    calibration = Calibration(model=fingerprint, temperature=fitted.temperature,
                              temperature_by_options=fitted.temperature_by_options, abstention=abstention,
                              conformal=extra.conformal, risk=extra.risk, signal=extra.signal,
                              fitted={"data": data_name, "split": report["split"], "counts": fit.counts,
                                      "min_bucket_samples": min_bucket})
    binning = None
    if binning_min_bucket is not None:
        from laya.calibration.upstream import fit_binning

        binning = fit_binning(train, after, min_bucket=binning_min_bucket)
        report["binning"] = {"buckets": sorted(binning), "min_bucket_answers": binning_min_bucket,
                             "fitted_on": "training answers (after calibration)"}
    return Outcome(calibration, report, (top_b, correct_b), (top_a, correct_a), binning, after, held, extra)


def held_out(records: Sequence[Record], evidence: Sequence[Sequence[Labelled]], test_idx: Sequence[int],
             temps: Temperatures, group_by: str) -> HeldOut:
    """The held-out answers decoded at `temps`, each with its line and group."""
    samples = [(i, s) for i in test_idx for s in evidence[i]]
    groups = {i: group_of(records[i], group_by) for i in test_idx}
    return HeldOut(decode_all([s for _, s in samples], temps), [s.label for _, s in samples],
                   [s.evidence.qtype for _, s in samples], [s.evidence.act_probability for _, s in samples],
                   [i for i, _ in samples], [groups[i] for i, _ in samples])


def text_summary(report: dict[str, Any]) -> str:
    """The report for a terminal: one line per group, before -> after."""
    lines = []
    s = report["split"]
    lines.append(f"held-out: {s['heldout_answers']} answers from {s['heldout_lines']} lines "
                 f"(trained on {s['train_answers']} answers; seed {s['seed']}); ECE with {report['ece_bins']} "
                 "equal-mass bins")
    before, after = report["heldout"]["before"], report["heldout"]["after"]
    header = f"{'group':12s} {'n':>6s}  {'accuracy':>17s}  {'NLL':>15s}  {'Brier':>15s}  {'ECE':>15s}"
    lines.append(header)

    def row(name: str, b: dict, a: dict) -> str:
        def pair(key: str) -> str:
            return f"{b[key]:.4f} -> {a[key]:.4f}"

        return (f"{name:12s} {b['n']:6d}  {pair('accuracy'):>17s}  {pair('nll'):>15s}  {pair('brier'):>15s}  "
                f"{pair('ece'):>15s}")

    lines.append(row("overall", before["overall"], after["overall"]))
    for key in after["groups"]:
        lines.append(row(key, before["groups"][key], after["groups"][key]))
    temps = report["fit"]
    fitted = ", ".join(f"{k} {v:.4f}" for k, v in {**temps["per_type"], **temps["by_bucket"]}.items()) or "none"
    lines.append(f"fitted temperatures: {fitted}")
    if temps["left_on_the_model's_value"]:
        left = ", ".join(f"{k} ({n})" for k, n in temps["left_on_the_model's_value"].items())
        lines.append(f"too few answers to fit (kept the model's value): {left}")
    for level, cov in report["coverage_at_precision"].items():
        lines.append(f"coverage at precision {float(level):.0%}: {cov['before']:.1%} -> {cov['after']:.1%}")
    overall = after["overall"]
    signals = [f"top probability {overall['auroc_top_probability']:.3f}"] if overall["auroc_top_probability"] else []
    if overall.get("auroc_act_probability") is not None:
        signals.append(f"act probability {overall['auroc_act_probability']:.3f}")
    if signals:
        lines.append("AUROC separating right from wrong answers: " + ", ".join(signals))
    ab = report.get("abstention")
    if ab:
        if ab.get("threshold") is None:
            lines.append(f"abstention: {ab['note']} ({ab['target_precision']:.0%})")
        else:
            lines.append(f"abstention: answer when top probability >= {ab['threshold']:.4f} "
                         f"(target precision {ab['target_precision']:.0%}): coverage {ab['coverage']:.1%}, "
                         f"precision {ab['precision_of_answered']:.1%} on held-out"
                         + (f"; {len(ab['by_bucket'])} bucket thresholds" if ab["by_bucket"] else ""))
    return "\n".join(lines + summary_lines(report))
