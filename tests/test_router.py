"""`laya.load("auto")` and `"model": "auto"` (issue 27, part 3): each state answered by the
checkpoint its script and language route it to, with the route on the answer. The decisions
themselves are held to upstream's in tests/test_routing.py; here, that they are what runs."""

from __future__ import annotations

import httpx
import pytest
from conftest import load_quiet
from live_server import LiveServer

import laya
from laya.encoder.engine import EncoderEngine
from laya.errors import LayaError, QuestionError
from laya.routing import route
from laya.routing.router import Router, roles_of
from laya.server.app import ServerConfig, create_app

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"},
             "team": {"type": "choice", "instructions": "Which team?",
                      "criteria": {"billing": "refunds", "sales": None, "support": "bugs"}}}
ENGLISH = "I was charged twice for my order and I want a refund today, please help me with this."
GERMAN = "Ich wurde zweimal für meine Bestellung belastet und möchte heute eine Rückerstattung."
HINDI = "मुझसे मेरे ऑर्डर के लिए दो बार शुल्क लिया गया है, कृपया आज ही धनवापसी करें।"
JAPANESE = "注文で二重に請求されました。今日中に返金してください。"


@pytest.fixture(scope="module")
def english(checkpoint_dir):
    return load_quiet(checkpoint_dir, "torch", name="english")


@pytest.fixture(scope="module")
def multilingual(mmbert_dir):
    return load_quiet(mmbert_dir, "torch", name="multilingual")


@pytest.fixture(scope="module")
def router(english, multilingual):
    return laya.load("auto", english=english, multilingual=multilingual)


def same(got: dict, want: dict) -> None:
    assert got["answers"].keys() == want["answers"].keys()
    for qid, answer in want["answers"].items():
        assert got["answers"][qid] == answer, qid
    assert got["usage"] == want["usage"]


def test_load_auto_gives_a_router(router, english, multilingual):
    assert isinstance(router, Router) and router.models == {"english": english, "multilingual": multilingual}
    assert router.default == "multilingual"


@pytest.mark.parametrize(("state", "role"), [(ENGLISH, "english"), (GERMAN, "multilingual"),
                                             (HINDI, "multilingual"), (JAPANESE, "multilingual"),
                                             ("12345 !!!", "multilingual")])
def test_each_state_is_answered_by_the_model_it_routes_to(router, state, role):
    decision = route(state)
    assert decision.model == role
    got = router.predict(state, QUESTIONS)
    model = router.models[role]
    assert got["x_routed_to"] == model.name and got["x_route_reason"] == decision.reason
    same(got, model.predict(state, QUESTIONS))


def test_a_batch_is_split_by_route_and_kept_in_order(router, english, multilingual):
    states = [GERMAN, ENGLISH, HINDI, ENGLISH]
    got = router.predict_batch(states, QUESTIONS)
    assert [g["x_routed_to"] for g in got] == ["multilingual", "english", "multilingual", "english"]
    for g, state in zip(got, states):
        same(g, router.models[route(state).model].predict(state, QUESTIONS))


def test_an_explicit_language_decides(router):
    got = router.predict(ENGLISH, QUESTIONS, lang="de")
    assert got["x_routed_to"] == "multilingual" and got["x_route_reason"] == "explicit lang='de'"
    assert router.predict(GERMAN, QUESTIONS, lang="en")["x_routed_to"] == "english"
    assert router.predict(ENGLISH, QUESTIONS, lang="  ")["x_routed_to"] == "english"  # blank: detection
    with pytest.raises(QuestionError, match="lang must be a language code"):
        router.predict(ENGLISH, QUESTIONS, lang=7)


def test_decide_and_predict_long_route_too(router, multilingual):
    schema = {"type": "object", "properties": {"urgent": {"type": "boolean"}}}
    assert router.decide(GERMAN, schema) == multilingual.decide(GERMAN, schema)
    long = router.predict_long(GERMAN * 20, QUESTIONS, 64)
    assert long["x_routed_to"] == "multilingual" and long["x_usage"]["windows"] > 1


def test_a_bad_default_is_refused_before_loading():
    with pytest.raises(LayaError, match="default must be"):
        laya.load("auto", english="/nowhere", multilingual="/nowhere", default="french")


def test_roles_come_from_the_served_names():
    assert roles_of(["laya", "laya-multilingual"]) == {"english": "laya", "multilingual": "laya-multilingual"}
    assert roles_of(["english", "multilingual", "smollm2"]) == {"english": "english", "multilingual": "multilingual"}
    assert roles_of(["laya", "smollm2"]) is None


# --- over HTTP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(english, multilingual):
    with LiveServer(create_app(lambda: [EncoderEngine(english), EncoderEngine(multilingual)], ServerConfig())) as live:
        yield live


def test_model_auto_routes_each_request(served, english, multilingual):
    for state, model in [(ENGLISH, english), (HINDI, multilingual)]:
        r = httpx.post(served.url + "/v1/systemone", json={"model": "auto", "state": state, "questions": QUESTIONS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["x_routed_to"] == model.name and body["x_route_reason"] == route(state).reason
        direct = model.predict(state, QUESTIONS)
        for qid, answer in direct["answers"].items():
            assert body["answers"][qid]["probabilities" if "probabilities" in answer else "noul"] == \
                pytest.approx(answer["probabilities" if "probabilities" in answer else "noul"], abs=1e-9)
    named = httpx.post(served.url + "/v1/systemone", json={"model": "english", "state": HINDI, "questions": QUESTIONS})
    assert named.status_code == 200 and "x_routed_to" not in named.json()  # a named model is not routed


def test_model_auto_with_an_explicit_language_and_a_batch(served):
    r = httpx.post(served.url + "/v1/systemone", json={"model": "auto", "state": ENGLISH, "questions": QUESTIONS,
                                                       "x_lang": "pt-BR"})
    assert r.status_code == 200 and r.json()["x_routed_to"] == "multilingual"
    assert r.json()["x_route_reason"] == "explicit lang='pt-BR'"
    r = httpx.post(served.url + "/v1/systemone/batch", json={"model": "auto", "states": [GERMAN, ENGLISH, JAPANESE],
                                                             "questions": QUESTIONS})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "auto"
    assert [x["x_routed_to"] for x in r.json()["results"]] == ["multilingual", "english", "multilingual"]
    bad = httpx.post(served.url + "/v1/systemone", json={"model": "auto", "state": ENGLISH, "questions": QUESTIONS,
                                                         "x_lang": "x" * 400})
    assert bad.status_code == 422 and len(bad.content) < 2000 and "x_lang" in bad.text


def test_auto_is_listed_and_the_chat_route_routes(served):
    names = [m["name"] for m in httpx.get(served.url + "/v1/models").json()["models"]]
    assert "auto" in names
    r = httpx.post(served.url + "/v1/chat/completions", json={
        "model": "auto", "messages": [{"role": "user", "content": GERMAN}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "T", "schema": {
            "type": "object", "properties": {"urgent": {"type": "boolean"}}}}}})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "auto" and r.json()["x_laya"]["x_routed_to"] == "multilingual"


def test_a_plan_for_auto_plans_each_state_on_the_model_it_routes_to(served):
    body = {"model": "auto", "states": [GERMAN, ENGLISH, JAPANESE], "questions": QUESTIONS}
    planned = httpx.post(served.url + "/v1/systemone/plan", json=body)
    assert planned.status_code == 200, planned.text
    plan = planned.json()
    answered = httpx.post(served.url + "/v1/systemone/batch", json=body).json()["results"]
    assert plan["model"] == "auto" and set(plan["models"]) == {"english", "multilingual"}
    assert [s["routed_to"] for s in plan["states"]] == [r["x_routed_to"] for r in answered]
    assert [s["route_reason"] for s in plan["states"]] == [r["x_route_reason"] for r in answered]
    assert [s["input_tokens"] for s in plan["states"]] == [r["usage"]["input_tokens"] for r in answered]
    assert plan["input_tokens"] == sum(r["usage"]["input_tokens"] for r in answered) and plan["refused"] is None


def test_auto_without_both_models_is_a_clear_404(english):
    with LiveServer(create_app(lambda: [EncoderEngine(english)], ServerConfig())) as live:
        r = httpx.post(live.url + "/v1/systemone", json={"model": "auto", "state": ENGLISH, "questions": QUESTIONS})
        planned = httpx.post(live.url + "/v1/systemone/plan", json={"model": "auto", "state": ENGLISH,
                                                                   "questions": QUESTIONS})
    assert r.status_code == 404 and "multilingual" in r.json()["detail"]["message"]
    assert planned.status_code == 404 and "multilingual" in planned.json()["detail"]["message"]
