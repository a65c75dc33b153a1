"""The error-bound rule (laya.calibration.risk): over 100 seeded calibration draws from a population
whose error rate at every threshold is known exactly, the chosen threshold's true error rate among
the answers it keeps exceeds the bound no more often than 1 - confidence allows; and the coverage it
buys is not vacuous. Plain numpy: no model runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from laya.calibration.risk import GRID, RiskRule, binomial_tail, counts_at, learn_then_test

MAX_ERROR, CONFIDENCE, DRAWS, N = 0.05, 0.9, 100, 1500


def true_error(threshold: float) -> float:
    """Signal s ~ U(0, 1), P(wrong | s) = 0.4 (1 - s)^2: among s >= t the error rate is 0.4 (1 - t)^2 / 3."""
    return 0.4 * (1.0 - threshold) ** 2 / 3.0


def draws():
    rng = np.random.default_rng(7)
    for _ in range(DRAWS):
        s = rng.uniform(0, 1, N)
        yield s, rng.uniform(0, 1, N) < 0.4 * (1 - s) ** 2


def test_the_bound_holds_with_the_confidence_asked_over_100_draws():
    chosen = np.array([learn_then_test(s, w, MAX_ERROR, CONFIDENCE) for s, w in draws()], dtype=float)
    assert not np.isnan(chosen).any()
    violations = np.mean([true_error(t) > MAX_ERROR for t in chosen])
    assert violations <= (1 - CONFIDENCE) + 0.03, violations
    # the coverage bought (the share answered, 1 - t) is near the best any threshold could give:
    # the exact error reaches 0.05 at 1 - t = sqrt(0.375) = 0.61
    coverage = 1 - chosen
    assert 0.45 < coverage.mean() < math.sqrt(0.375), coverage.mean()


def test_the_binomial_tail_is_the_exact_sum():
    for n, k, rate in [(59, 0, 0.05), (100, 5, 0.05), (1000, 37, 0.05), (7, 7, 0.3), (0, 0, 0.1)]:
        exact = sum(math.comb(n, i) * rate ** i * (1 - rate) ** (n - i) for i in range(k + 1))
        assert binomial_tail(np.array([k]), np.array([n]), rate)[0] == pytest.approx(exact, rel=1e-9)


def test_counts_answer_every_signal_at_or_above_the_threshold():
    answered, errors = counts_at(np.array([0.9, 0.5, 0.5, 0.1]), np.array([0, 1, 0, 1]), np.array([1.0, 0.5, 0.0]))
    assert answered.tolist() == [0, 3, 4] and errors.tolist() == [0, 1, 2]


def test_when_no_threshold_can_guarantee_the_bound_none_is_picked_and_every_answer_abstains():
    rng = np.random.default_rng(3)
    s = rng.uniform(0, 1, 40)  # 40 answers cannot show 5% at 95% even without a single error
    assert learn_then_test(s, np.zeros(40, dtype=bool), 0.05, 0.95) is None
    s = rng.uniform(0, 1, 2000)  # half the answers wrong whatever the signal
    assert learn_then_test(s, rng.uniform(0, 1, 2000) < 0.5, 0.05, 0.95) is None
    rule = RiskRule(0.05, 0.95, None)
    assert rule.abstains(1.0)
    assert not RiskRule(0.05, 0.95, 0.7).abstains(0.7) and RiskRule(0.05, 0.95, 0.7).abstains(0.69)


def test_the_walk_stops_at_the_first_threshold_it_cannot_reject():
    """Fixed-sequence testing: a later (more generous) threshold that would pass alone is not reached."""
    s = np.r_[np.full(200, 0.95), np.full(200, 0.85), np.full(2000, 0.75)]
    wrong = np.r_[np.zeros(200), np.ones(200), np.zeros(2000)].astype(bool)
    # down to 0.851: 0 of 200 wrong (rejected); at 0.85: 200 of 400 (not rejected: the walk stops); at
    # 0.75, 200 of 2400 (8.3%) would be rejected on its own, but is never tested
    assert binomial_tail(np.array([200]), np.array([2400]), 0.1)[0] < 0.05
    assert learn_then_test(s, wrong, 0.1, 0.95) == pytest.approx(GRID[GRID >= 0.85][-1] + 0.001)


def test_a_bad_risk_entry_is_a_clear_error():
    for bad, message in [({"max_error": 0, "confidence": 0.9, "threshold": 0.5}, "max_error"),
                         ({"max_error": 0.1, "confidence": 1.0, "threshold": 0.5}, "confidence"),
                         ({"max_error": 0.1, "confidence": 0.9, "threshold": 2}, "threshold"), ("x", "object")]:
        with pytest.raises(ValueError, match=message):
            RiskRule.from_dict(bad, "cal.json")
