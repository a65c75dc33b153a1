"""Bucketed temperatures, their clamping, and the confidence figures."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from laya.calibration.temperatures import Temperatures, bucket_key, bucket_of, clamp
from laya.decoding.confidence import choice_confidence, score_confidence

ENGLISH = {"choice:2": 1.9064, "choice:3-5": 1.7602, "choice:6-10": 1.0, "choice:11+": 0.1006,
           "score:3-5": 1.2514, "noul:2": 1.9834}


@pytest.mark.parametrize(("k", "bucket"), [(1, "2"), (2, "2"), (3, "3-5"), (5, "3-5"), (6, "6-10"),
                                           (10, "6-10"), (11, "11+"), (255, "11+")])
def test_buckets_by_option_count(k, bucket):
    assert bucket_of(k) == bucket
    assert bucket_key("score", k) == f"score:{bucket}"


@pytest.mark.parametrize(("raw", "applied"), [(0.1006, 0.5), (9, 5.0), (1.25, 1.25), (True, 1.0), (False, 1.0),
                                               (math.nan, 1.0), (math.inf, 1.0), ("2", 1.0), (None, 1.0)])
def test_clamp(raw, applied):
    assert clamp(raw) == applied


def test_bucket_wins_over_type_and_values_are_clamped():
    with pytest.warns(RuntimeWarning, match=r"choice:11\+=0.1006 -> 0.5"):
        t = Temperatures.from_raw([1.6369, 1.2514, 1.9834], ENGLISH, source="english")
    assert t.for_question("choice", 2) == 1.9064
    assert t.for_question("choice", 4) == 1.7602
    assert t.for_question("choice", 20) == 0.5
    assert t.for_question("score", 11) == 1.2514  # no score:11+ bucket: the type's value
    assert t.for_question("noul", 2) == 1.9834


def test_bad_values_warn_and_become_one():
    with pytest.warns(RuntimeWarning) as record:
        t = Temperatures.from_raw([True, "x", float("nan")], {"noul:2": None}, source="cfg")
    text = str(record[0].message)
    assert "temperature[0]=True -> 1" in text and "noul:2=None -> 1" in text
    assert t.per_type == (1.0, 1.0, 1.0) and t.by_bucket == {"noul:2": 1.0}


def test_good_values_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Temperatures.from_raw([1, 2.5, 5], {"choice:2": 0.5}, source="cfg")


def test_choice_confidence_is_jevs():
    assert choice_confidence(np.array([0.88, 0.12])) == pytest.approx(0.76)
    assert choice_confidence(np.full(4, 0.25)) == pytest.approx(0.0)
    assert choice_confidence(np.array([1.0, 0, 0])) == pytest.approx(1.0)


def test_score_confidence_is_jevs():
    # the API spec's example: p = (0, 0.95, 0.05), k = 1, D = 2/3 -> 1 - 0.05 / (2/3) = 0.925
    assert score_confidence(np.array([0.0, 0.95, 0.05])) == pytest.approx(0.925)
    assert score_confidence(np.array([0.5, 0.0, 0.5])) == pytest.approx(0.0)  # floored at 0
    assert score_confidence(np.array([0.0, 0.0, 1.0])) == pytest.approx(1.0)
