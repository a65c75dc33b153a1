"""Prediction sets (laya.calibration.conformal): the coverage guarantee over 100 seeded random
calibration/test splits of a generated labelled set, overall and per group, and the finite-sample
rank that buys it. Plain numpy on generated probabilities: no model runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from laya.calibration.conformal import ConformalSets, conformal_quantile, fit_sets, qualifying

ALPHA = 0.1
SPLITS = 100


def labelled_set(seed: int = 0):
    """Two groups of 4-option answers (an easy and a hard one) and a bucket of 2-option answers,
    with labels drawn from probabilities the model only partly knows (it is overconfident)."""
    rng = np.random.default_rng(seed)
    parts = []
    for group, n, k, sharpness in [("easy", 120, 4, 3.0), ("hard", 120, 4, 0.8), ("easy", 120, 2, 2.0)]:
        z = rng.normal(0, 1.5, (n, k))
        truth = np.exp(z * sharpness) / np.exp(z * sharpness).sum(1, keepdims=True)
        labels = np.array([rng.choice(k, p=t) for t in truth])
        model = np.exp(2.0 * z) / np.exp(2.0 * z).sum(1, keepdims=True)
        padded = np.zeros((n, 4))
        padded[:, :k] = model
        parts.append((padded, labels, [k] * n, [group] * n))
    probs = np.concatenate([p for p, *_ in parts])
    labels = np.concatenate([y for _, y, *_ in parts])
    n_options = [k for *_, ks, _ in parts for k in ks]
    groups = [g for *_, gs in parts for g in gs]
    return probs, labels, n_options, groups


def run_splits(use_groups: bool = True):
    """Per split: covered (bool per test answer), set size, and the test answers' groups."""
    probs, labels, n_options, groups = labelled_set()
    p_true = probs[np.arange(len(labels)), labels]
    options = np.arange(probs.shape[1])[None, :] < np.array(n_options)[:, None]
    rng = np.random.default_rng(1)
    covered, sizes, members = [], [], []
    for _ in range(SPLITS):
        order = rng.permutation(len(labels))
        cal, test = order[: len(order) // 2], order[len(order) // 2 :]
        sets = fit_sets(["choice"] * len(cal), [n_options[i] for i in cal], p_true[cal], 1 - ALPHA,
                        [groups[i] for i in cal] if use_groups else None, min_group=40)
        t = np.array([sets.threshold("choice", n_options[i], groups[i] if use_groups else None) for i in test],
                     dtype=float)
        t = np.where(np.isnan(t), 1.0, t)  # None: every option
        inside = (1 - probs[test] <= t[:, None] + 1e-12) & options[test]
        covered.append(inside[np.arange(len(test)), labels[test]])
        sizes.append(inside.sum(1))
        members.append(np.array([groups[i] for i in test]))
    return np.array(covered), np.array(sizes), np.array(members)


def test_mean_coverage_lies_between_the_target_and_three_points_above_overall_and_per_group():
    covered, sizes, groups = run_splits()
    overall = covered.mean()
    assert 1 - ALPHA <= overall <= 1 - ALPHA + 0.03, overall
    for name in ("easy", "hard"):
        per_split = [c[g == name].mean() for c, g in zip(covered, groups)]
        assert 1 - ALPHA <= np.mean(per_split) <= 1 - ALPHA + 0.03, (name, np.mean(per_split))
    # as small as the scores allow: well under every option (4 and 2), larger where the model is poorer
    assert sizes.mean() < 2.5
    assert np.mean(sizes[groups == "hard"]) > np.mean(sizes[groups == "easy"])


def test_without_groups_the_hard_group_is_under_covered():
    """What Mondrian buys: one threshold for both groups covers the hard one less than promised."""
    covered, _, groups = run_splits(use_groups=False)
    assert np.mean([c[g == "hard"].mean() for c, g in zip(covered, groups)]) < 1 - ALPHA - 0.01


def test_the_rank_is_the_finite_sample_one():
    s = np.arange(1, 20) / 20.0  # 19 scores
    # (n+1)(1-alpha) = 18 -> the 18th smallest, not the 0.9 empirical quantile (17.1 -> 18th too) or the 17th
    assert conformal_quantile(s, 0.1) == pytest.approx(18 / 20)
    s = np.arange(1, 100) / 100.0  # 99 scores: 100 * 0.9 = 90 exactly (floating point says 90.00000000000001)
    assert conformal_quantile(s, 0.1) == pytest.approx(90 / 100)
    assert conformal_quantile(np.arange(1, 10) / 10.0, 0.05) is None  # 10 * 0.95 > 9


def test_too_few_answers_give_every_option_and_an_unseen_bucket_too():
    sets = fit_sets(["choice"] * 5 + ["noul"] * 40, [3] * 5 + [2] * 40, np.linspace(0.5, 1, 45), 0.9)
    assert sets.thresholds["choice:3-5"] is None and sets.thresholds["noul:2"] is not None
    assert sets.members("choice", 4, [0.7, 0.2, 0.06, 0.04]) == [0, 1, 2, 3]
    assert sets.members("score", 3, [0.1, 0.2, 0.7]) == [2, 1, 0]  # never seen: no guarantee short of all
    assert qualifying([0.2, 0.5, 0.3], 0.75) == [1, 2]  # most probable first


def test_a_served_answer_without_its_group_gets_the_bucket_s_most_generous_threshold():
    sets = ConformalSets(0.9, {"choice:3-5": 0.5, "choice:3-5|de": 0.8, "choice:3-5|en": 0.3})
    assert sets.threshold("choice", 3) == 0.8
    assert sets.threshold("choice", 3, "en") == 0.3
    assert sets.threshold("choice", 3, "fr") == 0.8
    with_unknown = ConformalSets(0.9, {"choice:3-5": 0.5, "choice:3-5|de": None})
    assert with_unknown.threshold("choice", 3) is None
    noul = ConformalSets(0.9, {"noul:2": 0.5})
    assert noul.extras(("false", "true"), "noul", [0.45, 0.55])["x_set"] == [True]
    assert noul.extras(("false", "true"), "noul", [0.5, 0.5])["x_set"] == [False, True]
    assert sets.extras(("a", "b", "c"), "choice", [0.1, 0.6, 0.3])["x_set"] == ["b", "c"]


def test_a_bad_conformal_entry_is_a_clear_error():
    for bad, message in [({"coverage": 1.5, "thresholds": {}}, "coverage"),
                         ({"coverage": 0.9}, "thresholds"),
                         ({"coverage": 0.9, "thresholds": {"choice:2": "x"}}, "choice:2")]:
        with pytest.raises(ValueError, match=message):
            ConformalSets.from_dict(bad, "cal.json")
    assert math.isclose(ConformalSets.from_dict({"coverage": 0.9, "thresholds": {"noul:2": None}}, "c").coverage, 0.9)
