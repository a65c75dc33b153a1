"""Decoding logits into answers: fields per type, softmax over the real options, full precision."""

from __future__ import annotations

import numpy as np
import pytest

from laya.heads import decode
from laya.questions import parse_question


def test_temperature_divides_the_logits():
    z = np.array([2.0, 0.0, -1.0], dtype=np.float32)
    p = decode.probabilities(z, 2.0)
    z64 = z.astype(np.float64)
    expected = np.exp(z64 / 2.0) / np.exp(z64 / 2.0).sum()
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    assert p.dtype == np.float64


def test_choice_answer():
    q = parse_question("team", {"type": "choice", "instructions": "x", "criteria": {"billing": None, "sales": None}})
    answer = decode.answer(q, np.array([0.123456789, 0.876543211]), {"x_act_probability": 0.5})
    assert (answer.qtype, answer.value, answer.extras) == ("choice", "sales", {"x_act_probability": 0.5})
    out = answer.to_json()
    assert list(out) == ["type", "choice", "probabilities", "confidence", "x_answer_confidence", "x_act_probability"]
    assert out == {"type": "choice", "choice": "sales", "probabilities": {"billing": 0.123456789, "sales": 0.876543211},
                   "confidence": pytest.approx(0.753086422), "x_answer_confidence": 0.876543211,
                   "x_act_probability": 0.5}


def test_score_answer():
    q = parse_question("a", {"type": "score", "instructions": "x", "criteria": ["Calm", "Frustrated", "Very angry"]})
    out = decode.answer(q, np.array([0.0, 0.95, 0.05])).to_json()
    assert list(out) == ["type", "score", "legend", "probabilities", "confidence", "x_answer_confidence"]
    assert out["score"] == pytest.approx(1.05)
    assert out["legend"] == {"0": "Calm", "1": "Frustrated", "2": "Very angry"}
    assert out["probabilities"] == {"0": 0.0, "1": 0.95, "2": 0.05}
    assert out["confidence"] == pytest.approx(0.925)


def test_noul_answer_is_p_true_without_confidence():
    q = parse_question("u", {"type": "noul"})
    out = decode.answer(q, np.array([0.05, 0.95])).to_json()
    assert out["noul"] == 0.95 and "confidence" not in out
    assert out["x_answer_confidence"] == 0.95


def test_act_probability_is_the_first_output():
    assert decode.act_probability(np.array([0.0, 0.0])) == pytest.approx(0.5)
    assert decode.act_probability(np.array([10.0, 0.0])) > 0.99
