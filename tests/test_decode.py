"""Decoding logits into answers: fields per type, softmax over the real options, full precision."""

from __future__ import annotations

import numpy as np
import pytest

from laya.decoding import decode
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


def test_pairwise_sum_adds_in_numpys_order():
    """Decoding sums on plain floats; numpy's pairwise order keeps the answers' bits (a sequential sum
    differs from numpy's from 8 values on)."""
    from laya.decoding.floats import pairwise_sum

    rng = np.random.default_rng(3)
    for n in [*range(1, 300), 511, 1000, 4099]:
        values = np.exp(rng.normal(size=n) * 6)
        assert pairwise_sum(values.tolist()) == float(values.sum()), n


def test_decoding_on_floats_equals_the_numpy_formulas():
    """Probabilities to a few ulps (numpy has its own `exp` on AVX-512), then every figure derived from
    them exactly as numpy computes it."""
    from laya.decoding.confidence import choice_confidence, score_confidence

    rng = np.random.default_rng(4)
    for n in (2, 3, 7, 8, 9, 17, 128, 129, 255):
        z = (rng.normal(size=n) * 4).astype(np.float32)
        p = decode.probabilities(z, 1.7602)
        z64 = z.astype(np.float64) / 1.7602
        e = np.exp(z64 - z64.max())
        np.testing.assert_allclose(p, e / e.sum(), rtol=1e-13, atol=0)
        levels = np.arange(n, dtype=np.float64)
        k = int(np.argmax(p))
        spread = float(np.mean(np.abs(levels - (n - 1) / 2.0)))
        assert score_confidence(p) == min(1.0, max(0.0, 1.0 - float(np.sum(p * np.abs(levels - k))) / spread))
        assert choice_confidence(p) == min(1.0, max(0.0, (float(np.max(p)) - 1.0 / n) / (1.0 - 1.0 / n)))
        if n <= 11:
            q = parse_question("s", {"type": "score", "instructions": "x", "criteria": [f"l{i}" for i in range(n)]})
            assert decode.answer(q, p).value == float(np.sum(np.arange(n) * p))
        q = parse_question("c", {"type": "choice", "instructions": "x", "criteria": {f"o{i}": None for i in range(n)}})
        assert decode.answer(q, p).value == f"o{k}"
    act = np.array([1.25, -0.5], dtype=np.float32)
    e = np.exp(act.astype(np.float64) - float(act.max()))
    assert decode.act_probability(act) == pytest.approx(float(e[0] / e.sum()), rel=1e-13)
