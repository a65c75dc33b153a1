"""The abstain signal (laya.calibration.signal): the logistic combination is fitted by Newton's
method, kept only when it beats every single signal on answers it was not fitted on, and stored and
read back. Seeded numpy on generated features: no model runs."""

from __future__ import annotations

import numpy as np
import pytest

from laya.calibration.signal import Signal, choose_signal, features, fit_combined, fit_logistic


def test_newton_recovers_the_weights_of_a_logistic_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 2))
    y = rng.uniform(size=20000) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - 0.7 * x[:, 1] + 0.3)))
    assert fit_logistic(x, y.astype(float)) == pytest.approx([1.5, -0.7, 0.3], abs=0.06)


def rows(n: int, seed: int, act_informative: bool = True):
    """Answers whose rightness depends on the top probability and, independently, on the act head."""
    rng = np.random.default_rng(seed)
    top = rng.uniform(0.34, 1.0, n)
    act = rng.uniform(0, 1, n)
    logit = 6 * (top - 0.67) + (4 * (act - 0.5) if act_informative else 0)
    right = rng.uniform(size=n) < 1 / (1 + np.exp(-logit))
    out = [features([t, (1 - t) * 0.6, (1 - t) * 0.4], a) for t, a in zip(top, act)]
    return out, right


def test_the_combination_is_used_when_it_separates_better_than_each_signal():
    fit, fit_right = rows(600, 1)
    test, test_right = rows(600, 2)
    signal, report = choose_signal(fit, fit_right, test, test_right)
    assert signal.kind == "combined" and report["chosen"] == "combined"
    aurocs = report["auroc"]
    assert set(aurocs) == {"act_probability", "top_probability", "margin", "exp_neg_entropy",
                           "inverse_option_count", "combined"}
    assert aurocs["combined"] > max(v for k, v in aurocs.items() if k != "combined" and v is not None) + 0.03
    assert aurocs["inverse_option_count"] == 0.5  # every answer has three options: no information


def test_a_combination_that_does_not_beat_the_best_single_signal_is_not_used():
    """Fitted where the act head carries information and compared where it carries none (and the
    coefficients then only add noise): the best single signal wins."""
    fit, fit_right = rows(600, 1)
    test, test_right = rows(600, 2, act_informative=False)
    signal, report = choose_signal(fit, fit_right, test, test_right)
    best = report["best_single"]
    assert report["auroc"]["combined"] < report["auroc"][best]
    assert signal.kind == best != "combined" and report["chosen"] == best


def test_the_combined_signal_round_trips_and_bad_ones_are_clear_errors():
    fit, right = rows(300, 4)
    signal = fit_combined(fit, right)
    again = Signal.from_dict(signal.to_dict(), "cal.json")
    assert again == signal and 0 < again.value(fit[0]) < 1
    assert Signal.from_dict({"kind": "margin"}, "c").value({"margin": 0.25}) == 0.25
    with pytest.raises(ValueError, match="signal kind"):
        Signal.from_dict({"kind": "vibes"}, "cal.json")
    with pytest.raises(ValueError, match="do not fit together"):
        Signal.from_dict(signal.to_dict() | {"weights": [1.0]}, "cal.json")


def test_features_are_oriented_so_that_higher_means_more_confident():
    sure, unsure = features([0.9, 0.05, 0.05], 0.9), features([0.4, 0.35, 0.25], 0.2)
    assert all(sure[k] > unsure[k] for k in sure if k != "inverse_option_count")
    assert "act_probability" not in features([0.5, 0.5], None)
    assert features([0.5, 0.5], None)["exp_neg_entropy"] == pytest.approx(0.5)
