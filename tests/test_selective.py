"""The report's selective figures (laya.calibration.selective) and the held-out pipeline that fits
prediction sets and the error-bound rule (laya.calibration.guarantees), on generated answers."""

from __future__ import annotations

import numpy as np
import pytest

from laya.calibration.guarantees import HeldOut, check_sets, fit_guarantees, selective_figures, summary_lines
from laya.calibration.selective import Answered, answered_of, aurc, group_figures, risk_coverage


def test_the_risk_coverage_curve_and_its_area():
    coverage, risk = risk_coverage(np.array([0.9, 0.1, 0.5, 0.7]), np.array([0, 1, 1, 0]))
    assert coverage.tolist() == [0.25, 0.5, 0.75, 1.0] and risk.tolist() == [0, 0, 1 / 3, 0.5]
    assert aurc(np.array([0.9, 0.1, 0.5, 0.7]), np.array([0, 1, 1, 0])) == pytest.approx((0 + 0 + 1 / 3 + 0.5) / 4)
    # the wrong answers last is the floor, first the ceiling
    wrong = np.array([0, 0, 0, 1])
    assert aurc(np.array([4, 3, 2, 1.0]), wrong) < aurc(np.array([1, 2, 3, 4.0]), wrong)
    assert aurc(np.array([]), np.array([])) is None


def test_group_figures_read_x_set_and_x_abstain():
    sure = answered_of([0.1, 0.9], 1, {"x_set": [True], "x_abstain": False}, ("false", "true"), ("lang de",))
    unsure = answered_of([0.5, 0.3, 0.2], 2, {"x_set": ["a", "b"], "x_abstain": True, "x_signal": 0.2},
                         ("a", "b", "c"), ("lang de", "tag x"))
    assert sure.in_set and sure.set_size == 1 and not sure.wrong and sure.signal == 0.9
    assert unsure.in_set is False and unsure.signal == 0.2 and unsure.wrong
    figures = group_figures([sure, unsure])
    assert set(figures) == {"overall", "lang de", "tag x"}
    assert figures["overall"]["set_coverage"] == 0.5 and figures["overall"]["mean_set_size"] == 1.5
    assert figures["overall"]["answered_share"] == 0.5 and figures["overall"]["error_of_answered"] == 0.0
    assert "set_coverage" not in group_figures([Answered(0.9, False, 0.9, ())])["overall"]


def generated_held_out(n_lines: int = 1500, seed: int = 0) -> HeldOut:
    """A 4-option choice per line; the model is right more often when its top probability is high, and
    (what the act head knows) much less often in group "noisy"."""
    rng = np.random.default_rng(seed)
    probs, labels, acts, groups = [], [], [], []
    for _ in range(n_lines):
        z = rng.normal(0, 2.0, 4)
        p = np.exp(z) / np.exp(z).sum()
        noisy = rng.uniform() < 0.3
        right = rng.uniform() < (0.45 if noisy else 1.0) * p.max() ** 0.5
        top = int(np.argmax(p))
        labels.append(top if right else int(rng.choice([i for i in range(4) if i != top])))
        probs.append(p)
        acts.append(float(np.clip((0.2 if noisy else 0.8) + rng.normal(0, 0.1), 0, 1)))
        groups.append("noisy" if noisy else "clean")
    return HeldOut(probs, labels, ["choice"] * n_lines, acts, list(range(n_lines)), groups)


def test_fit_guarantees_uses_the_combined_signal_where_it_separates_better_and_reports_it():
    held = generated_held_out()
    out = fit_guarantees(held, coverage=0.9, max_error=0.25, confidence=0.9, seed=0)
    signal = out.report["signal"]
    assert signal["chosen"] == "combined", signal
    assert signal["auroc"]["combined"] > max(v for k, v in signal["auroc"].items() if k != "combined")
    risk = out.report["risk"]
    assert risk["threshold"] is not None and risk["signal"] == "combined"
    assert risk["error_of_answered"] <= 0.25 and 0.3 < risk["coverage"] < 1.0
    # the threshold is set on the held-out lines the signal was not chosen on
    assert risk["set_on_answers"] + signal["fit_answers"] + signal["compared_on_answers"] == 1500
    conformal = out.report["conformal"]
    assert {"choice:3-5", "choice:3-5|clean", "choice:3-5|noisy"} <= set(conformal["thresholds"])
    for name in ("overall", "group clean", "group noisy"):
        assert 0.87 <= conformal["check"]["mean_coverage"][name] <= 0.95, (name, conformal["check"])
    assert conformal["check"]["mean_set_size"]["group noisy"] > conformal["check"]["mean_set_size"]["group clean"]
    text = "\n".join(summary_lines(out.report | {"selective": selective_figures(held, out.signal_values, 10)}))
    assert "AUROC" in text and "combined" in text and "error bound" in text and "group noisy" in text


def test_no_guarantee_says_so():
    held = generated_held_out(200)
    out = fit_guarantees(held, coverage=None, max_error=0.01, confidence=0.95)
    assert out.risk is not None and out.risk.threshold is None
    assert "no threshold can guarantee" in out.report["risk"]["note"] and out.report["risk"]["coverage"] == 0.0
    assert "conformal" not in out.report


def test_the_check_uses_disjoint_halves():
    held = generated_held_out(300)
    check = check_sets(held, 0.8, seed=1, min_group=50, splits=5)
    assert check["splits"] == 5 and set(check["mean_coverage"]) == {"overall", "group clean", "group noisy"}


def test_groups_come_from_the_group_field_or_the_language():
    from laya.calibration.data import Record
    from laya.calibration.guarantees import group_of, resolve_group_by

    german = Record(1, "Ich wurde doppelt abgebucht und möchte eine Rückerstattung für die Rechnung", {}, [], {})
    tagged = Record(2, "hello", {}, [], {}, lang="pt-BR", group="enterprise")
    assert group_of(german, "lang") == "de" and group_of(tagged, "lang") == "pt-BR"
    assert group_of(tagged, "group") == "enterprise" and group_of(german, "group") is None
    assert group_of(tagged, "none") is None
    assert resolve_group_by([german, tagged], "auto") == "group"
    assert resolve_group_by([german], "auto") == "none" and resolve_group_by([german], "lang") == "lang"


def test_a_bad_group_field_names_the_line(tmp_path):
    import json

    from laya.calibration.data import DataError, read_records

    line = {"state": "x", "questions": {"u": {"type": "noul", "instructions": "Urgent?"}}, "labels": {"u": True}}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(line | {"group": "a"}) + "\n" + json.dumps(line | {"group": 3}) + "\n")
    with pytest.raises(DataError, match='d.jsonl:2: "group" must be a short string'):
        read_records(path)
    path.write_text(json.dumps(line | {"group": "a"}) + "\n")
    assert read_records(path)[0].group == "a"


def test_a_calibration_file_s_extras_combine_the_rules_and_name_the_one_that_abstained():
    from laya.calibration.abstention import Abstention
    from laya.calibration.conformal import ConformalSets
    from laya.calibration.file import Calibration
    from laya.calibration.risk import RiskRule

    sets = ConformalSets(0.9, {"choice:3-5": 0.75})
    both = Calibration("m", {}, conformal=sets, risk=RiskRule(0.05, 0.95, 0.6),
                       abstention=Abstention(0.5, 0.9))
    keys = ("a", "b", "c")
    sure = both.extras(keys, "choice", np.array([0.7, 0.2, 0.1]), None)
    assert sure == {"x_set": ["a"], "x_abstain": False, "x_threshold": 0.5, "x_signal": 0.7}
    middling = both.extras(keys, "choice", np.array([0.55, 0.3, 0.15]), None)
    assert middling["x_abstain"] and middling["x_abstain_rule"] == "max_error 0.05 at confidence 0.95"
    unsure = both.extras(keys, "choice", np.array([0.4, 0.35, 0.25]), 0.9)
    assert unsure["x_abstain"] and unsure["x_set"] == ["a", "b", "c"]
    only_precision = Calibration("m", {}, abstention=Abstention(0.5, 0.9)).extras(keys, "choice", [0.4, 0.3, 0.3], None)
    assert only_precision == {"x_abstain": True, "x_threshold": 0.5, "x_abstain_rule": "target_precision 0.9"}
    # a rule on the act head, on an answer without one (a model with no act head), says nothing
    on_act = Calibration("m", {}, risk=RiskRule(0.05, 0.95, 0.6, "act_probability"))
    assert on_act.extras(keys, "choice", [0.4, 0.3, 0.3], None) == {}
    assert Calibration("m", {}).extras(keys, "choice", [0.4, 0.3, 0.3], None) == {}
