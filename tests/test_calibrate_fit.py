"""Fitting temperatures, choosing abstention thresholds and the report's figures, on synthetic
answers whose true temperatures are known."""

from __future__ import annotations

import numpy as np
import pytest

from laya.calibration.abstention import Abstention, choose_threshold
from laya.calibration.evidence import Evidence
from laya.calibration.fitting import Labelled, fit_temperature, fit_temperatures
from laya.calibration.metrics import auroc, brier, coverage_at_precision, ece, nll
from laya.calibration.temperatures import T_MAX, T_MIN, Temperatures

TRUE = {"choice:2": 0.8, "choice:3-5": 2.0, "choice:6-10": 1.3, "score:3-5": 3.0, "noul:2": 1.6}
SIZES = {"choice:2": 2, "choice:3-5": 4, "choice:6-10": 8, "score:3-5": 5, "noul:2": 2}


def synthetic(rng, key: str, n: int, temperature: float, n_options: int) -> list[Labelled]:
    """Logits of a model, and labels drawn from softmax(logits / T): T is what a fit should recover."""
    qtype = key.split(":")[0]
    out = []
    for _ in range(n):
        z = rng.normal(0.0, 3.0, n_options)
        p = np.exp(z / temperature - np.max(z / temperature))
        p /= p.sum()
        out.append(Labelled(Evidence.single(qtype, z), int(rng.choice(n_options, p=p))))
    return out


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(7)
    data = []
    for key, t in TRUE.items():
        data += synthetic(rng, key, 10000, t, SIZES[key])
    data += synthetic(rng, "choice:11+", 40, 0.6, 12)  # too few to get its own temperature
    return data


def test_fit_recovers_each_bucket_temperature_within_5_percent(samples):
    fit = fit_temperatures(samples, min_bucket=100)
    for key, t in TRUE.items():
        assert fit.by_bucket[key] == pytest.approx(t, rel=0.05), key
    assert fit.counts["choice:11+"] == 40


def test_a_bucket_with_too_few_samples_keeps_its_type_value(samples):
    fit = fit_temperatures(samples, min_bucket=100)
    assert "choice:11+" not in fit.by_bucket and fit.skipped["choice:11+"] == 40
    temps = Temperatures(per_type=(fit.per_type["choice"], fit.per_type["score"], fit.per_type["noul"]),
                         by_bucket=fit.by_bucket)
    assert temps.for_question("choice", 12) == fit.per_type["choice"]
    assert temps.for_question("choice", 4) == fit.by_bucket["choice:3-5"]


def test_fits_stay_inside_the_format_clamp():
    rng = np.random.default_rng(1)
    sharp = synthetic(rng, "choice:3-5", 2000, 0.05, 4)  # far sharper than 0.5 allows
    flat = synthetic(rng, "choice:3-5", 2000, 50.0, 4)
    assert fit_temperature(sharp) == pytest.approx(T_MIN, abs=1e-3)
    assert fit_temperature(flat) == pytest.approx(T_MAX, abs=1e-3)


def test_two_readouts_are_fitted_through_their_average():
    """The decide engine reads yes/no in both orders and averages: the fit sees the same average."""
    rng = np.random.default_rng(3)
    data = []
    for _ in range(3000):
        a, b = rng.normal(0, 3, 2), rng.normal(0, 3, 2)
        ev = Evidence("noul", 2, (((0, 1), a), ((1, 0), b)))
        p = ev.probabilities(2.5)
        data.append(Labelled(ev, int(rng.choice(2, p=p))))
    assert fit_temperature(data) == pytest.approx(2.5, rel=0.08)


def test_threshold_reaches_the_target_precision_and_keeps_the_most():
    rng = np.random.default_rng(0)
    top = rng.uniform(0.34, 1.0, 20000)
    correct = rng.uniform(size=top.size) < top  # calibrated: P(correct) = top
    t = choose_threshold(top, correct, 0.9)
    assert correct[top >= t].mean() >= 0.9
    assert t == pytest.approx(0.8, abs=0.02)  # mean of U(t, 1) is 0.9 at t = 0.8
    assert choose_threshold(top, correct, 1.0) is None or correct[top >= choose_threshold(top, correct, 1.0)].all()
    abst = Abstention(t, 0.9, {"choice:2": 0.99})
    assert abst.extras("choice", 4, np.array([0.7, 0.2, 0.1])) == {"x_abstain": True, "x_threshold": t}
    assert abst.extras("choice", 2, np.array([0.985, 0.015]))["x_abstain"] is True


def test_metrics_on_known_cases():
    probs = [np.array([0.9, 0.1]), np.array([0.6, 0.4]), np.array([0.2, 0.8])]
    labels = [0, 1, 1]
    assert nll(probs, labels) == pytest.approx(-(np.log(0.9) + np.log(0.4) + np.log(0.8)) / 3)
    assert brier(probs, labels) == pytest.approx((2 * 0.01 + 2 * 0.36 + 2 * 0.04) / 3)
    top, correct = np.array([0.9, 0.6, 0.8]), np.array([True, False, True])
    assert ece(top, correct, bins=3) == pytest.approx((0.1 + 0.6 + 0.2) / 3)
    assert auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True])) == pytest.approx(0.75)
    assert auroc(np.array([0.5, 0.5]), np.array([True, False])) == pytest.approx(0.5)
    assert auroc(np.array([0.5]), np.array([True])) is None
    assert coverage_at_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1, 1, 0, 1]), 0.75) == 1.0
    assert coverage_at_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1, 1, 0, 0]), 0.75) == 0.5
