"""Shortlists equal upstream's: `laya.predict_shortlist` with the checkpoint's own encoder keeps the
options upstream 0.4.15's `predict_shortlist(agent, ..., embed_fn_from_agent(agent))` keeps, with
the same cosine scores, and answers them with the same probabilities (goldens in
tests/golden/shortlist.json, made by tests/golden/make_shortlist_golden.py)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import load_quiet, need
from live_server import LiveServer

import laya
from laya.decoding.confidence import choice_confidence
from laya.encoder.shortlist import cached_embed_fn, option_text, query_text, shortlist_choice, widened
from laya.response import Answer

GOLDEN = Path(__file__).parent / "golden"
CASES = json.loads((GOLDEN / "shortlist.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=["modernbert", "mmbert"])
def golden_model(request):
    return request.param, load_quiet(GOLDEN / "checkpoints" / request.param)


def test_the_kept_options_scores_and_answers_are_upstreams(golden_model):
    name, model = golden_model
    cases = [c for c in CASES["cases"] if c["checkpoint"] == name]
    assert len(cases) == 5
    for case in cases:
        got = laya.predict_shortlist(model, case["state"], case["questions"], k=case["k"])
        want = case["response"]
        for qid, meta in want["shortlist"].items():
            mine = got["shortlist"][qid]
            assert mine["labels"] == meta["labels"], (case["id"], qid)
            assert (mine["k"], mine["n"], mine["passthrough"]) == (meta["k"], meta["n"], meta["passthrough"])
            if meta["scores"] is None:
                assert mine["scores"] is None
            else:
                assert mine["scores"] == pytest.approx(meta["scores"], abs=1e-5), (case["id"], qid)
        for qid, answer in want["answers"].items():
            if answer["type"] == "noul":
                assert got["answers"][qid]["noul"] == pytest.approx(answer["noul"], abs=1e-4)
                continue
            assert list(got["answers"][qid]["probabilities"]) == list(answer["probabilities"])  # rank order
            for key, p in answer["probabilities"].items():
                assert got["answers"][qid]["probabilities"][key] == pytest.approx(p, abs=1e-4), (case["id"], qid)


def test_the_texts_are_upstreams():
    assert query_text({"a": 1}, "Which?") == 'Which?\n{"a": 1}' and query_text("hi", "") == "hi"
    assert [option_text(k, v) for k, v in {"alpha": "first", "beta": "", "gamma": None, "delta": {"d": 1},
                                            "eps": 0}.items()] == ["alpha: first", "beta", "gamma",
                                                                   'delta: {"d": 1}', "eps: 0"]


def test_ties_keep_the_earlier_option_and_k_past_n_passes_through():
    def embed(texts):  # the state, then options at equal angles, one opposite, one zero
        table = {"s": [1.0, 0.0], "a": [0.0, 1.0], "b": [1.0, 1.0], "c": [1.0, 1.0], "d": [-1.0, 0.0], "e": [0.0, 0.0]}
        return np.array([table[t] for t in texts])

    labels, scores = shortlist_choice("s", ["a", "b", "c", "d", "e"], embed, k=3)
    assert labels == ["b", "c", "a"] and scores[0] == scores[1]
    assert shortlist_choice("s", ["a", "b"], embed, k=2) == (["a", "b"], None)
    with pytest.raises(ValueError, match="k must be"):
        shortlist_choice("s", ["a", "b"], embed, k=0)
    with pytest.raises(ValueError, match="twice"):
        shortlist_choice("s", ["a", "a", "b"], embed, k=1)


def test_the_cache_embeds_each_text_once():
    calls = []

    def embed(texts):
        calls.append(list(texts))
        return np.array([[float(len(t)), 1.0] for t in texts])

    cached = cached_embed_fn(embed, maxsize=3)
    first = cached(["x", "yy", "x"])
    again = cached(["yy", "x"])
    assert calls == [["x", "yy"]] and np.array_equal(first[1], again[0])
    cached(["x"])
    assert len(calls) == 1  # still kept
    cached(["a", "b", "c"])  # three more push out the two least recently used
    cached(["x"])
    assert calls[-1] == ["x"]


INTENTS = CASES["cases"][0]["questions"]["intent"]["criteria"]


def test_x_shortlist_through_the_engine_the_server_jsonl_and_the_plan(golden_model, tmp_path):
    """`x_shortlist: K` on a choice: the kept options are `predict_shortlist`'s, answered as it answers
    them; the answer lists every option asked (the eliminated at 0, in the order asked) with
    `x_shortlist`; the plan says the shortlist's size and cost; a chat model and /batch refuse it."""
    need("fastapi")
    from laya.apps import jsonl
    from laya.encoder.engine import EncoderEngine
    from laya.server.app import create_app

    name, model = golden_model
    state = "I was charged twice for the same coffee and want my money back"
    question = {"type": "choice", "instructions": "Which intent?", "criteria": INTENTS, "x_shortlist": 5}
    want = laya.predict_shortlist(model, state, {"intent": {k: v for k, v in question.items() if k != "x_shortlist"}},
                                  k=5)
    body = {"state": state, "questions": {"intent": question, "urgent": {"type": "noul", "instructions": "Urgent?"}}}
    with LiveServer(create_app(lambda: [EncoderEngine(model)])) as live:
        got = httpx.post(live.url + "/v1/systemone", json=body, timeout=60).json()["answers"]["intent"]
        plan = httpx.post(live.url + "/v1/systemone/plan", json=body, timeout=60).json()
        batch = httpx.post(live.url + "/v1/systemone/batch", json={**body, "states": [state, "x"]}, timeout=60)
        bad = httpx.post(live.url + "/v1/systemone", timeout=60, json={**body, "questions": {
            "u": {"type": "noul", "instructions": "Urgent?", "x_shortlist": 3}}})
    assert got["x_shortlist"]["kept"] == want["shortlist"]["intent"]["labels"]
    assert got["x_shortlist"]["scores"] == pytest.approx(want["shortlist"]["intent"]["scores"])
    assert list(got["probabilities"]) == INTENTS and sum(got["probabilities"].values()) == pytest.approx(1.0)
    for label in INTENTS:
        expected = want["answers"]["intent"]["probabilities"].get(label, 0.0)
        assert got["probabilities"][label] == pytest.approx(expected, abs=1e-6)
    assert got["choice"] == want["answers"]["intent"]["choice"]
    assert plan["states"][0]["questions"]["intent"]["x_shortlist"] == {"k": 5, "n": len(INTENTS),
                                                                       "embedded_texts": len(INTENTS) + 1}
    assert batch.status_code == 422 and "one request each" in batch.text
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "x_shortlist"
    out = tmp_path / "out.jsonl"
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(body) + "\n", encoding="utf-8")
    jsonl.run(jsonl.read_lines(source, None), out, jsonl.local_answer(EncoderEngine(model)), total=1, progress=False)
    line = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert line["response"]["answers"]["intent"]["x_shortlist"]["kept"] == got["x_shortlist"]["kept"]


def test_a_chat_model_refuses_a_shortlist():
    from scripted_backend import ScriptedBackend

    from laya.decide.engine import DecideEngine
    from laya.decide.model import DecideModel
    from laya.errors import QuestionError
    from laya.request import Request

    engine = DecideEngine(DecideModel(ScriptedBackend(n_ctx=4000), "scripted"))
    with pytest.raises(QuestionError, match="x_shortlist"):
        engine.prepare(Request.of(["x"], {"t": {"type": "choice", "criteria": ["a", "b", "c"], "x_shortlist": 2}}))


def test_a_shortlisted_answers_confidence_is_over_every_option_asked():
    """Two of four options kept: the answer lists all four (the eliminated at 0), and its confidence is
    over the four, not over the two the model read."""
    kept = Answer("choice", "b", {"b": 0.8, "d": 0.2}, choice_confidence([0.8, 0.2]), answer_confidence=0.8)
    out = widened(kept, {"kept": ["b", "d"], "k": 2, "n": 4}, ["a", "b", "c", "d"])
    assert out.probabilities == {"a": 0.0, "b": 0.8, "c": 0.0, "d": 0.2}
    assert out.confidence == pytest.approx(choice_confidence([0.0, 0.8, 0.0, 0.2]))
    assert out.confidence == pytest.approx((0.8 - 0.25) / 0.75)
    assert out.extras["x_shortlist"]["n"] == 4
