"""`laya calibrate --coverage / --max-error`: prediction sets and the error-bound rule, fitted on the
held-out answers (the temperatures were fitted on the others).

Who sees which answers, so that each guarantee is spent on one thing only:
- the conformal thresholds: every held-out answer (their score, 1 - p(right), depends only on the
  temperatures, fitted elsewhere);
- the abstain signal: the held-out lines are cut in two (seeded); on the first part the combination
  is fitted on one half and compared with the single signals on the other;
- the error-bound threshold (Learn then Test): the second part only, which chose nothing before.
The report's coverage and set-size figures come from repeated random halves of the held-out answers
(thresholds from one half, measured on the other), since a threshold measured on its own data says
nothing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laya.calibration.conformal import MIN_GROUP, ConformalSets, fit_sets, qualifying
from laya.calibration.data import Record
from laya.calibration.risk import RiskRule, learn_then_test
from laya.calibration.selective import Answered, group_figures
from laya.calibration.selective import lines as selective_lines
from laya.calibration.signal import Signal, choose_signal, features
from laya.calibration.temperatures import bucket_key

CHECK_SPLITS = 20  # random halves behind the report's coverage figures


@dataclass
class HeldOut:
    """The held-out answers under the calibrated temperatures, one entry per answer."""

    probs: list[np.ndarray]
    labels: list[int]
    qtypes: list[str]
    acts: list[float | None]
    lines: list[int]  # which held-out line each answer came from
    groups: list[str | None]

    @property
    def p_true(self) -> np.ndarray:
        return np.array([float(p[y]) for p, y in zip(self.probs, self.labels)])

    @property
    def wrong(self) -> np.ndarray:
        return np.array([int(np.argmax(p)) != y for p, y in zip(self.probs, self.labels)])

    def subset(self, idx: Sequence[int]) -> HeldOut:
        return HeldOut(*([getattr(self, k)[i] for i in idx] for k in
                         ("probs", "labels", "qtypes", "acts", "lines", "groups")))


@dataclass
class Guarantees:
    conformal: ConformalSets | None = None
    risk: RiskRule | None = None
    signal: Signal | None = None
    report: dict[str, Any] = field(default_factory=dict)
    signal_values: np.ndarray | None = None  # every held-out answer's abstain signal, for the plots


def group_of(record: Record, how: str) -> str | None:
    """A record's group: its `group` field, or its language (its `lang`, else the router's detection)."""
    if how == "group":
        return record.group
    if how == "lang":
        if record.lang:
            return record.lang
        from laya.routing.language import analyse

        return analyse(record.state).get("language") or None
    return None


def resolve_group_by(records: Sequence[Record], how: str) -> str:
    """`auto`: the lines' `group` field where any line has one, else their `lang`, else no groups."""
    if how != "auto":
        return how
    if any(r.group for r in records):
        return "group"
    return "lang" if any(r.lang for r in records) else "none"


def _halves(lines: Sequence[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """Answer indices of two halves of the distinct lines."""
    distinct = sorted(set(lines))
    rng.shuffle(distinct)
    first = set(distinct[: len(distinct) // 2])
    return [i for i, ln in enumerate(lines) if ln in first], [i for i, ln in enumerate(lines) if ln not in first]


def fit_guarantees(held: HeldOut, *, coverage: float | None, max_error: float | None, confidence: float,
                   seed: int = 0, min_group: int = MIN_GROUP) -> Guarantees:
    out = Guarantees()
    if coverage is not None:
        out.conformal = fit_sets(held.qtypes, [len(p) for p in held.probs], held.p_true, coverage, held.groups,
                                 min_group)
        out.report["conformal"] = out.conformal.to_dict() | {
            "fitted_on": "every held-out answer",
            "every_option": sorted(k for k, v in out.conformal.thresholds.items() if v is None),
            "every_option_why": "(n+1)(1-alpha) > n: too few held-out answers for a smaller set to keep the "
                                "guarantee, so the set is every option",
            "check": check_sets(held, coverage, seed, min_group)}
    if max_error is not None:
        if not 0.0 < max_error < 1.0:
            raise ValueError(f"the maximum error must be between 0 and 1, got {max_error}")
        out.signal, out.risk, out.report["risk"], out.report["signal"] = _risk(held, max_error, confidence, seed)
        rows = [features(p, a) for p, a in zip(held.probs, held.acts)]
        out.signal_values = np.array([out.signal.value(r) for r in rows])
    return out


def _risk(held: HeldOut, max_error: float, confidence: float, seed: int
          ) -> tuple[Signal, RiskRule, dict[str, Any], dict[str, Any]]:
    rng = random.Random(seed + 1)
    choose, test = _halves(held.lines, rng)
    fit, compare = _halves([held.lines[i] for i in choose], rng)
    fit, compare = [choose[i] for i in fit], [choose[i] for i in compare]
    if not (fit and compare and test):
        raise ValueError(f"--max-error needs at least 4 held-out lines (three parts of them are used), got "
                         f"{len(set(held.lines))}")
    rows = [features(p, a) for p, a in zip(held.probs, held.acts)]
    right = ~held.wrong
    signal, signal_report = choose_signal([rows[i] for i in fit], right[fit], [rows[i] for i in compare],
                                          right[compare])
    values = np.array([signal.value(rows[i]) for i in test])
    wrong = held.wrong[test]
    threshold = learn_then_test(values, wrong, max_error, confidence)
    rule = RiskRule(max_error, confidence, threshold, signal.kind)
    report: dict[str, Any] = rule.to_dict() | {"set_on_answers": len(test), "set_on": "the second part of the "
                                               "held-out lines (the signal was chosen on the first)"}
    if threshold is None:
        report["note"] = (f"no threshold can guarantee an error rate <= {max_error:g} at confidence "
                          f"{confidence:g} on these {len(test)} answers: every answer abstains")
        report |= {"coverage": 0.0, "error_of_answered": None}
    else:
        kept = values >= threshold
        report |= {"coverage": float(kept.mean()),
                   "error_of_answered": float(wrong[kept].mean()) if kept.any() else None}
    return signal, rule, report, signal_report


def check_sets(held: HeldOut, coverage: float, seed: int, min_group: int,
               splits: int = CHECK_SPLITS) -> dict[str, Any]:
    """Mean coverage and set size over random halves: thresholds from one half, measured on the other;
    overall and per group (groups measured with their own threshold where they have one)."""
    rng = random.Random(seed + 2)
    covered: dict[str, list[float]] = {}
    sizes: dict[str, list[float]] = {}
    p_true = held.p_true
    for _ in range(splits):
        cal, test = _halves(held.lines, rng)
        if not cal or not test:
            break
        sets = fit_sets([held.qtypes[i] for i in cal], [len(held.probs[i]) for i in cal], p_true[cal], coverage,
                        [held.groups[i] for i in cal], min_group)
        by: dict[str, list[tuple[bool, int]]] = {}
        for i in test:
            p, g = held.probs[i], held.groups[i]
            chosen = qualifying(p, sets.threshold(held.qtypes[i], len(p), g))
            hit = (held.labels[i] in chosen, len(chosen))
            for key in ("overall", *([f"group {g}"] if g is not None else [])):
                by.setdefault(key, []).append(hit)
        for key, hits in by.items():
            covered.setdefault(key, []).append(float(np.mean([h for h, _ in hits])))
            sizes.setdefault(key, []).append(float(np.mean([n for _, n in hits])))
    return {"splits": len(covered.get("overall", [])), "target": coverage,
            "mean_coverage": {k: float(np.mean(v)) for k, v in covered.items()},
            "mean_set_size": {k: float(np.mean(v)) for k, v in sizes.items()}}


def selective_figures(held: HeldOut, signal: np.ndarray | None, bins: int) -> dict[str, dict[str, Any]]:
    """Risk-coverage (AURC, ordered by the abstain signal, else the top probability) and ECE, overall,
    per type, per bucket and per group, over the held-out answers."""
    answers = []
    for i, (p, y) in enumerate(zip(held.probs, held.labels)):
        top = int(np.argmax(p))
        groups = (held.qtypes[i], bucket_key(held.qtypes[i], len(p)),
                  *([f"group {held.groups[i]}"] if held.groups[i] is not None else []))
        answers.append(Answered(float(p[top]), top != y, float(p[top]) if signal is None else float(signal[i]),
                                groups))
    return group_figures(answers, bins)


def curves(held: HeldOut, signal: np.ndarray | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(signal, wrong) overall and per group, for the risk-coverage plot."""
    values = np.array([float(np.max(p)) for p in held.probs]) if signal is None else signal
    wrong = held.wrong
    out = {"overall": (values, wrong)}
    for g in sorted({g for g in held.groups if g is not None}):
        idx = [i for i, h in enumerate(held.groups) if h == g]
        out[f"group {g}"] = (values[idx], wrong[idx])
    return out


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The terminal's lines about prediction sets, the abstain signal and the error-bound rule."""
    lines = []
    if report.get("selective"):
        order = "the abstain signal" if report.get("signal") else "the top probability"
        lines.append(f"per group, held-out (AURC answering in order of {order}):")
        lines += selective_lines(report["selective"])
    conformal = report.get("conformal")
    if conformal:
        check = conformal["check"]
        per = ", ".join(f"{k} {v:.1%} (size {check['mean_set_size'][k]:.2f})"
                        for k, v in check["mean_coverage"].items())
        lines.append(f"prediction sets for coverage {conformal['coverage']:.0%}: over {check['splits']} random "
                     f"halves of the held-out answers, mean coverage {per}")
        if conformal["every_option"]:
            lines.append(f"  every option (too few held-out answers for a smaller set): "
                         f"{', '.join(conformal['every_option'])}")
    signal = report.get("signal")
    if signal:
        shown = ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in signal["auroc"].items())
        lines.append(f"abstain signal AUROC (right vs wrong, {signal['compared_on_answers']} answers): {shown}; "
                     f"using {signal['chosen']}")
    risk = report.get("risk")
    if risk:
        if risk["threshold"] is None:
            lines.append(f"error bound: {risk['note']}")
        else:
            lines.append(f"error bound: answer when {risk['signal']} >= {risk['threshold']:.3f}: error <= "
                         f"{risk['max_error']:g} with confidence {risk['confidence']:g}; it answers "
                         f"{risk['coverage']:.1%} (error {risk['error_of_answered']:.1%} on the "
                         f"{risk['set_on_answers']} answers that set it)")
    return lines
