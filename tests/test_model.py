"""The library's `predict`: response shape, usage, and answers that do not depend on their company."""

from __future__ import annotations

import json
import math

import pytest
from conftest import load_quiet

import laya
from laya.errors import QuestionError, RuntimeUnavailable

ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None,
                                                                       "support": "bugs"}}
ANGER = {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious", "raging"]}
URGENT = {"type": "noul", "instructions": "Urgent?", "criteria": {"true": "needs action today"}}
STATE = "I was charged twice for my order and nobody answers my emails. Fix it now!"


def test_response_shape(model):
    out = model.predict(STATE, {"team": ROUTE, "anger": ANGER, "urgent": URGENT})
    assert set(out) == {"model", "answers", "usage", "x_usage", "x_precision"}
    assert out["model"] == model.name and out["x_precision"] == model.runtime.precision == "fp32"
    assert list(out["answers"]) == ["team", "anger", "urgent"]
    team, anger, urgent = out["answers"].values()
    assert set(team) == {"type", "choice", "probabilities", "confidence", "x_answer_confidence", "x_act_probability"}
    assert list(team["probabilities"]) == ["billing", "sales", "support"]
    assert math.isclose(sum(team["probabilities"].values()), 1.0, abs_tol=1e-9)
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert set(anger) == {"type", "score", "legend", "probabilities", "confidence", "x_answer_confidence",
                          "x_act_probability"}
    assert anger["score"] == pytest.approx(sum(int(k) * v for k, v in anger["probabilities"].items()))
    assert set(urgent) == {"type", "noul", "x_answer_confidence", "x_act_probability"}
    for answer in out["answers"].values():
        assert 0.0 <= answer["x_act_probability"] <= 1.0
    assert isinstance(out["usage"]["input_tokens"], int) and out["usage"]["output_tokens"] == 0
    json.dumps(out, allow_nan=False)


def test_usage_counts_real_tokens(model):
    from laya.encoder.rows import build_rows
    from laya.questions import parse_questions

    questions = {"team": ROUTE, "urgent": URGENT}
    rows = build_rows(model.tokenizer, STATE, parse_questions(questions), model.max_len, model.head_max_len)
    out = model.predict(STATE, questions)
    assert out["usage"]["input_tokens"] == sum(len(r.ids) for r in rows)


def test_truncation_is_reported(model):
    out = model.predict(STATE * 40, {"team": ROUTE, "urgent": URGENT})
    x = out["x_usage"]
    assert x["state_tokens"] > x["state_tokens_kept"] and x["state_tokens_dropped"] > 0
    assert x["truncated_questions"] == ["team", "urgent"]
    assert model.predict(STATE, {"team": ROUTE})["x_usage"]["truncated_questions"] == []


def test_deterministic(model):
    assert model.predict(STATE, {"team": ROUTE}) == model.predict(STATE, {"team": ROUTE})


def test_independent_of_ids_order_and_company(model):
    """Bit for bit: the reference runtime's answers do not depend on what shares their batch."""
    alone = model.predict(STATE, {"team": ROUTE})["answers"]["team"]
    crowd = model.predict(STATE, {"zz 🙂": ANGER, "other.id": ROUTE, "u": URGENT})["answers"]["other.id"]
    assert alone == crowd
    batch = model.predict_batch(["short", STATE, STATE * 10], {"u": URGENT, "t": ROUTE})
    assert batch[1]["answers"]["t"] == alone
    assert batch[0]["answers"]["u"] == model.predict("short", {"u": URGENT})["answers"]["u"]


def test_many_states_share_batches(model, monkeypatch):
    calls = []
    original = model.runtime.forward
    monkeypatch.setattr(model.runtime, "forward", lambda b: calls.append((b.size, b.length)) or original(b))
    results = model.predict_batch(["state a", "state b", "state c"], {"t": ROUTE, "u": URGENT})
    assert len(results) == 3 and [size for size, _ in calls] == [6]
    calls.clear()
    model.predict_batch(["short", STATE * 10], {"t": ROUTE})
    assert len(calls) == 2 and all(length % 32 == 0 for _, length in calls)  # one batch per length bucket


def test_batches_are_bounded(checkpoint_dir, monkeypatch):
    small = load_quiet(checkpoint_dir)
    small.max_batch_rows = 4
    calls = []
    original = small.runtime.forward
    monkeypatch.setattr(small.runtime, "forward", lambda b: calls.append(b.size) or original(b))
    small.predict_batch([f"state {i}" for i in range(5)], {"t": ROUTE, "u": URGENT})
    assert calls == [4, 4, 2]


def test_bad_requests_raise_before_inference(model, monkeypatch):
    monkeypatch.setattr(model.runtime, "forward", lambda b: pytest.fail("no inference for a bad request"))
    with pytest.raises(QuestionError, match="state must not be null"):
        model.predict(None, {"t": ROUTE})
    with pytest.raises(QuestionError, match="does not match any of the expected tags"):
        model.predict(STATE, {"t": ROUTE, "bad": {"type": "essay"}})
    with pytest.raises(QuestionError, match="list of states"):
        model.predict_batch(STATE, {"t": ROUTE})
    assert model.predict_batch([], {"t": ROUTE}) == []


def test_a_single_option_question_is_refused_as_the_contract_says(model, monkeypatch):
    monkeypatch.setattr(model.runtime, "forward", lambda b: pytest.fail("no inference for a bad request"))
    with pytest.raises(QuestionError, match="at least 2 options, got 1"):
        model.predict(STATE, {"only": {"type": "choice", "instructions": "x", "criteria": ["yes"]}})


def test_unknown_runtime(checkpoint_dir):
    with pytest.raises(RuntimeUnavailable, match="unknown runtime 'tpu'"):
        laya.load(checkpoint_dir, runtime="tpu")


def test_info(model):
    info = model.info()
    assert info["encoder"]["layers"] == 4 and info["max_len"] == 256 and info["head_max_len"] == 96
    assert info["temperatures"]["temperature_by_options"]["choice:11+"] == 0.5
    assert info["parameters"] > 0 and info["runtime"] == "torch"


def test_policy_modules_import_no_framework():
    import subprocess
    import sys

    code = ("import sys, laya, laya.encoder.model, laya.encoder.rows, laya.encoder.batch, laya.decoding.decode, "
            "laya.calibration.temperatures, laya.questions, laya.encoder.checkpoint, laya.cli; "
            "bad = [m for m in ('torch', 'transformers', 'onnxruntime', 'mlx') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_runtime_option(checkpoint_dir):
    with pytest.raises(RuntimeUnavailable, match="takes no option 'bogus'; it takes precision, threads"):
        load_quiet(checkpoint_dir, "torch", bogus=True)
