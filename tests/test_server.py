"""The /v1/systemone server over real HTTP: the contract, errors, limits, auth and the official clients."""

from __future__ import annotations

import gzip
import json
import logging
import os

import httpx
import pytest
from live_server import LiveServer

from laya.encoder.engine import EncoderEngine
from laya.server.app import ServerConfig, create_app

KEY = "sk-test-123"
ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None,
                                                                       "support": "bugs"}}
ANGER = {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]}
URGENT = {"type": "noul", "instructions": "Urgent?"}
STATE = "I was charged twice and nobody answers. Refund me now!"


@pytest.fixture(scope="module")
def server(model, mm_model):
    app = create_app(lambda: [EncoderEngine(model, description="tiny test model", release_date="2026-11-30"),
                              EncoderEngine(mm_model)], ServerConfig(max_wait_ms=20))
    with LiveServer(app) as live:
        yield live


@pytest.fixture(scope="module")
def keyed(model):
    with LiveServer(create_app(lambda: [EncoderEngine(model)], ServerConfig(api_key=KEY))) as live:
        yield live


def post(server, body, **kwargs):
    return httpx.post(server.url + "/v1/systemone", json=body, timeout=30, **kwargs)


def test_answers_every_question_type(server, model):
    r = post(server, {"model": "jev-latest", "state": STATE, "questions": {"t": ROUTE, "a": ANGER, "u": URGENT}})
    assert r.status_code == 200, r.text
    assert r.headers["x-typesafe-request-id"]
    body = r.json()
    assert set(body) <= {"model", "answers", "usage"} | {k for k in body if k.startswith("x_")}
    assert body["model"] == model.name
    assert list(body["answers"]) == ["t", "a", "u"]
    t, a, u = body["answers"].values()
    assert set(t) - {k for k in t if k.startswith("x_")} == {"type", "choice", "probabilities", "confidence"}
    assert set(a) - {k for k in a if k.startswith("x_")} == {"type", "score", "legend", "probabilities", "confidence"}
    assert set(u) - {k for k in u if k.startswith("x_")} == {"type", "noul"}
    assert a["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert abs(sum(t["probabilities"].values()) - 1) < 1e-9 and 0 <= t["confidence"] <= 1
    assert type(body["usage"]["input_tokens"]) is int and body["usage"]["output_tokens"] == 0
    # the same answers as the library
    assert body["answers"] == model.predict(STATE, {"t": ROUTE, "a": ANGER, "u": URGENT})["answers"]


@pytest.mark.parametrize("state", ["text", {"user": "bob", "msg": "héllo"}, [{"role": "user", "content": "hi"}], ""])
def test_state_forms(server, state):
    assert post(server, {"state": state, "questions": {"u": URGENT}}).status_code == 200


def test_request_forms(server):
    questions = {
        "plain": {"type": "noul"},  # no instructions, no criteria
        "nulls": {"type": "noul", "instructions": None, "criteria": None},
        "one-sided": {"type": "noul", "instructions": "Paid?", "criteria": {"true": "the invoice is paid"}},
        "structured": {"type": "choice", "instructions": {"task": "route", "langs": ["en", "de"]},
                       "criteria": {"billing": {"handles": ["refunds"]}, "sales": ["plans", "pricing"], "x": None}},
        "ids with spaces.and.dots 한국어 🙂": URGENT,
        "score-structured": {"type": "score", "instructions": ["rate", 1], "criteria": ["low", {"mid": 1}, ["hi"]]},
    }
    body = {"model": None, "state": STATE, "questions": questions, "temperature": 0.2, "x_trace_id": "abc",
            "seed": 1, "facts": []}
    r = post(server, {**body, "questions": {**questions, "extra": {**URGENT, "unknown_field": 1}}})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert list(answers)[:-1] == list(questions)  # ids come back byte for byte
    assert list(answers["structured"]["probabilities"]) == ["billing", "sales", "x"]
    assert answers["score-structured"]["legend"] == {"0": "low", "1": {"mid": 1}, "2": ["hi"]}


def test_non_ascii_option_names_round_trip(server):
    names = {"결제 💳": None, "Verkäufe": "Preise", "support/Ω": None}
    r = post(server, {"state": STATE, "questions": {"q": {"type": "choice", "instructions": "x", "criteria": names}}})
    assert list(r.json()["answers"]["q"]["probabilities"]) == list(names)


def test_models_route_and_named_models(server, model, mm_model):
    listed = httpx.get(server.url + "/v1/models").json()["models"]
    assert [m["name"] for m in listed] == [model.name, mm_model.name, "jev-latest", "jev-preview"]
    served, aliases = listed[:2], listed[2:]
    contract = {"name", "description", "release_date"}
    assert all({"x_runtime", "x_precision", "x_device", "x_limits"} <= set(m) and contract <= set(m)
               and all(k.startswith("x_") for k in set(m) - contract) for m in served)  # see test_provenance
    assert [(m["x_runtime"], m["x_precision"]) for m in served] == [("torch", "fp32")] * 2
    assert all(set(m) == {"name", "description", "release_date"} for m in aliases)
    for name, expected in ((mm_model.name, mm_model.name), ("jev-preview", model.name), ("jev-2026-09", model.name)):
        assert post(server, {"model": name, "state": "x", "questions": {"u": URGENT}}).json()["model"] == expected


def test_health_ready_metrics_docs(server):
    health = httpx.get(server.url + "/health").json()
    assert health["ready"] and health["models"][health["default"]]["runtime"] == "torch"
    assert httpx.get(server.url + "/ready").json() == {"ready": True}
    post(server, {"state": "x", "questions": {"u": URGENT}})
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("laya_requests_total", "laya_errors_total", "laya_request_seconds_bucket", "laya_batch_rows_bucket",
                 "laya_queue_depth"):
        assert name in metrics
    spec = httpx.get(server.url + "/openapi.json").json()
    schema = spec["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["state", "questions"]
    assert httpx.get(server.url + "/docs").status_code == 200


def test_batch_route(server, model):
    r = httpx.post(server.url + "/v1/systemone/batch", json={"states": ["a", STATE], "questions": {"t": ROUTE}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == 2
    assert body["results"][1]["answers"] == model.predict(STATE, {"t": ROUTE})["answers"]
    assert body["total_usage"]["input_tokens"] == sum(x["usage"]["input_tokens"] for x in body["results"])


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"questions": {"u": URGENT}}, ["body", "state"]),
        ({"state": "x"}, ["body", "questions"]),
        ({"state": "x", "questions": {}}, ["body", "questions"]),
        ({"state": None, "questions": {"u": URGENT}}, ["body", "state"]),
        ({"state": 5, "questions": {"u": URGENT}}, ["body", "state"]),
        ({"state": "x", "questions": {"q": {"instructions": "x"}}}, ["body", "questions", "q", "type"]),
        ({"state": "x", "questions": {"q": {"type": "essay"}}}, ["body", "questions", "q", "type"]),
        ({"state": "x", "questions": {"q": {"type": "choice", "instructions": "x"}}},
         ["body", "questions", "q", "criteria"]),
        ({"state": "x", "questions": {"q": {"type": "choice", "criteria": {"only": None}}}},
         ["body", "questions", "q", "criteria"]),
        ({"state": "x", "questions": {"q": {"type": "choice", "criteria": {str(i): None for i in range(256)}}}},
         ["body", "questions", "q", "criteria"]),
        ({"state": "x", "questions": {"q": {"type": "score", "criteria": {"0": "a", "1": "b"}}}},
         ["body", "questions", "q", "criteria"]),
        ({"state": "x", "questions": {"q": {"type": "score", "criteria": ["a"]}}},
         ["body", "questions", "q", "criteria"]),
        ({"state": "x", "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}},
         ["body", "questions", "q", "criteria"]),
        ({"state": "x", "questions": {"q": {"type": "noul", "criteria": {"maybe": "x"}}}},
         ["body", "questions", "q", "criteria", "maybe"]),
        ({"state": "x", "questions": {"q": {"type": "noul", "instructions": 5}}},
         ["body", "questions", "q", "instructions"]),
        ({"state": "x", "questions": ["not", "a", "map"]}, ["body", "questions"]),
        ({"state": "x", "questions": {"q": "noul"}}, ["body", "questions", "q"]),
        ({"state": "x", "model": 7, "questions": {"u": URGENT}}, ["body", "model"]),
    ],
)
def test_schema_errors_are_fastapi_shaped_422(server, body, loc):
    r = post(server, body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail[0]["loc"] == loc
    assert isinstance(detail[0]["msg"], str) and isinstance(detail[0]["type"], str)
    assert r.headers["x-typesafe-request-id"]


def test_bad_json_and_non_object(server):
    r = httpx.post(server.url + "/v1/systemone", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert post(server, ["a", "list"]).status_code == 422
    assert httpx.post(server.url + "/v1/systemone", content=b"\xff\xfe").status_code == 422


def test_markers_that_do_not_fit_are_answered_by_a_tournament(server):
    options = {f"option number {i} with a rather long name": f"description {i}" for i in range(120)}
    r = post(server, {"state": "x", "questions": {"big": {"type": "choice", "instructions": "x", "criteria": options}}})
    assert r.status_code == 200, r.text
    answer = r.json()["answers"]["big"]
    assert list(answer["probabilities"]) == list(options) and answer["x_tournament"]["groups"] == [8]
    assert abs(sum(answer["probabilities"].values()) - 1) < 1e-9


def test_unknown_model_is_404(server):
    r = post(server, {"model": "gpt-4", "state": "x", "questions": {"u": URGENT}})
    assert r.status_code == 404
    assert r.json()["detail"]["error_type"] == "api_usage_error" and "gpt-4" in r.json()["detail"]["message"]


def test_token_budget(server):
    big = "refund " * 70000
    r = post(server, {"state": big, "questions": {"u": URGENT}})
    assert r.status_code == 413 and r.json()["detail"]["error_type"] == "max_tokens_exceeded"


def test_compressed_bodies(server):
    import zstandard

    raw = json.dumps({"state": STATE, "questions": {"u": URGENT}}).encode()
    for encoding, data in (("zstd", zstandard.ZstdCompressor().compress(raw)), ("gzip", gzip.compress(raw))):
        r = httpx.post(server.url + "/v1/systemone", content=data,
                       headers={"content-type": "application/json", "content-encoding": encoding})
        assert r.status_code == 200, (encoding, r.text)
    bomb = zstandard.ZstdCompressor(level=19).compress(b" " * (64 * 1024 * 1024))
    r = httpx.post(server.url + "/v1/systemone", content=bomb, headers={"content-encoding": "zstd"})
    assert r.status_code == 413
    r = httpx.post(server.url + "/v1/systemone", content=gzip.compress(b"[" * (20 * 1024 * 1024)),
                   headers={"content-encoding": "gzip"})
    assert r.status_code == 413
    r = httpx.post(server.url + "/v1/systemone", content=b"xx", headers={"content-encoding": "br"})
    assert r.status_code == 415
    r = httpx.post(server.url + "/v1/systemone", content=b"not zstd", headers={"content-encoding": "zstd"})
    assert r.status_code == 400


def test_body_too_large(server):
    r = httpx.post(server.url + "/v1/systemone", content=b" " * (9 * 1024 * 1024))
    assert r.status_code == 413


def test_auth(keyed, caplog):
    body = {"state": "x", "questions": {"u": URGENT}}
    with caplog.at_level(logging.DEBUG):
        missing = post(keyed, body)
        wrong = post(keyed, body, headers={"Authorization": "Bearer nope"})
        right = post(keyed, body, headers={"Authorization": f"Bearer {KEY}"})
    assert missing.status_code == 403 and missing.json()["detail"]["error_type"] == "authentication_error"
    assert wrong.status_code == 401 and wrong.json()["detail"]["error_type"] == "authentication_error"
    assert right.status_code == 200
    assert KEY not in caplog.text
    # /v1/models is OpenAI's route too: 401 for a missing key, with both clients' error shapes
    listed = httpx.get(keyed.url + "/v1/models")
    assert listed.status_code == 401 and listed.headers["www-authenticate"].startswith("Bearer")
    assert listed.json()["detail"]["error_type"] == listed.json()["error"]["type"] == "authentication_error"
    assert httpx.get(keyed.url + "/health").status_code == 200


def test_a_key_guards_what_it_should(keyed, model):
    """With a key: /ready and the demo page answer anyone, /health says only its status word; /metrics,
    the docs and the OpenAPI document need the key (unless served public); no answer names a path or a pid."""
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(keyed.url + "/ready").status_code == 200 and httpx.get(keyed.url + "/").status_code == 200
    assert httpx.get(keyed.url + "/health").json() == {"status": "ok"}
    for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):
        refused = httpx.get(keyed.url + path)
        assert refused.status_code == 401 and "key" in refused.text, path
        assert httpx.get(keyed.url + path, headers=auth).status_code == 200, path
    full = httpx.get(keyed.url + "/health", headers=auth).json()
    assert full["models"][model.name]["runtime"] == "torch"
    listed = httpx.get(keyed.url + "/v1/models", headers=auth).text
    for text in (json.dumps(full), listed):
        assert str(model.checkpoint.path) not in text and str(model.checkpoint.path.parent) not in text
        assert f'"process": {os.getpid()}' not in text and '"pid"' not in text


def test_metrics_and_docs_can_be_served_public(model):
    config = ServerConfig(api_key=KEY, public_metrics=True, public_docs=True)
    with LiveServer(create_app(lambda: [EncoderEngine(model)], config)) as live:
        assert httpx.get(live.url + "/metrics").status_code == 200
        assert httpx.get(live.url + "/openapi.json").status_code == 200
        assert httpx.post(live.url + "/v1/systemone", json={"state": "x", "questions": {"u": URGENT}}).status_code \
            == 403


def test_official_sdk_with_zstd(keyed, model):
    from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

    with TypeSafeClient(api_key=KEY, base_url=keyed.url, compression="zstd") as client:
        result = client.system_one(
            state="x " * 400 + STATE,  # over 1 kB: the SDK compresses it
            questions={"u": Noul(instructions="Urgent?"),
                       "t": Choice(instructions="Which team?", criteria={"billing": "refunds", "sales": None}),
                       "a": Score(instructions="How angry?", criteria=["calm", "annoyed", "furious"])},
        )
        assert 0 <= result.nouls["u"].noul <= 1
        assert result.choices["t"].choice in ("billing", "sales")
        assert set(result.scores["a"].probabilities) == {0, 1, 2}
        assert result.usage.input_tokens > 0
        assert result.request_id
        assert result.model == model.name
        models = client.models.list()
        assert "jev-latest" in [m.name for m in models.models]


def test_pydantic_ai_typesafe_and_system_one_models(keyed):
    from typing import Literal

    from pydantic import BaseModel, Field
    from pydantic_ai import Agent
    from pydantic_ai.models.system_one import SystemOneModel
    from pydantic_ai.models.typesafe import TypeSafeModel
    from pydantic_ai.providers.system_one import SystemOneProvider
    from pydantic_ai.providers.typesafe import TypeSafeProvider

    class Ticket(BaseModel):
        """Triage a support ticket."""

        team: Literal["billing", "sales", "support"] = Field(description="Which team should handle it?")
        urgent: bool = Field(description="Does it need action today?")

    for model in (TypeSafeModel("jev-latest", provider=TypeSafeProvider(api_key=KEY, base_url=keyed.url)),
                  SystemOneModel("jev-latest", provider=SystemOneProvider(base_url=keyed.url, api_key=KEY))):
        result = Agent(model, output_type=Ticket).run_sync(STATE)
        assert isinstance(result.output, Ticket)
        assert result.output.team in ("billing", "sales", "support")


def test_jev_lite(keyed):
    from jev_lite import TypeSafe

    with TypeSafe(api_key=KEY, base_url=keyed.url) as client:
        result = client.system_one.create(
            state=STATE, model="jev-latest",
            questions={"u": {"type": "noul", "instructions": "Urgent?", "criteria": None},
                       "t": {"type": "choice", "instructions": None, "criteria": {"billing": None, "sales": None}}},
        )
        assert 0 <= result.answers["u"].noul <= 1
        assert result.answers["t"].choice in ("billing", "sales")
        assert result.request_id


def test_a_stopping_server_closes_each_connection_after_its_answer(model):
    app = create_app(lambda: [EncoderEngine(model)], ServerConfig())
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert client.get("/health").headers.get("connection") != "close"
        app.state.served.begin_drain()  # as SIGTERM begins it
        r = client.get("/health")
        assert r.json()["status"] == "draining"
        assert r.headers.get_list("connection") == ["close"]
        assert r.headers["x-typesafe-request-id"]


def test_request_ids_differ_across_requests_processes_and_forks():
    """A request without an id gets 32 hex digits of its own: the process's random half and a count;
    a forked child (or another worker) has a random half of its own."""
    import os
    import subprocess
    import sys

    from laya.server.request_ids import new_request_id

    ids = [new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    made_elsewhere = "from laya.server.request_ids import new_request_id as n; print(n())"
    other = subprocess.run([sys.executable, "-c", made_elsewhere], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other[:16] != ids[0][:16]
    if hasattr(os, "fork"):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, new_request_id().encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 64).decode()[:16] not in (ids[0][:16], other[:16])


def test_a_long_client_id_is_echoed_cut_to_128_characters(server):
    r = post(server, {"state": STATE, "questions": {"u": URGENT}}, headers={"x-typesafe-request-id": "r" * 300})
    assert r.status_code == 200 and r.headers["x-typesafe-request-id"] == "r" * 128


@pytest.mark.parametrize("path", ["/api/alpha/decisions", "/v1/decisions"])
def test_the_decisions_routes_answer_as_systemone_under_the_hosted_names(keyed, model, monkeypatch, path):
    """OpenRouter's route and name for the hosted model (and the `/v1/decisions` proxies ask for): the same
    handler, door, key and errors as /v1/systemone; the official SDK pointed at the route."""
    from typesafe_sdk import Choice, Noul, TypeSafeClient
    from typesafe_sdk._core import endpoints

    monkeypatch.setattr(endpoints, "SYSTEM_ONE_PATH", path)
    questions = {"u": {"type": "noul", "instructions": "Urgent?"},
                 "t": {"type": "choice", "instructions": "Which team?",
                       "criteria": {"billing": "refunds", "sales": ""}}}
    auth = {"authorization": f"Bearer {KEY}"}
    reference = httpx.post(keyed.url + "/v1/systemone", json={"state": STATE, "questions": questions}, headers=auth)
    for name in ("typesafe/jev-1.13", "jev-1.13", "jev-latest"):
        r = httpx.post(keyed.url + path, json={"model": name, "state": STATE, "questions": questions}, headers=auth)
        assert r.status_code == 200 and r.json()["answers"] == reference.json()["answers"], r.text
        assert r.json()["model"] == model.name and r.headers["x-typesafe-request-id"]
    with TypeSafeClient(api_key=KEY, base_url=keyed.url) as client:
        result = client.system_one(state=STATE, model="typesafe/jev-1.13",
                                   questions={"u": Noul(instructions="Urgent?"),
                                              "t": Choice(instructions="Which team?",
                                                          criteria={"billing": "refunds", "sales": ""})})
        assert result.choices["t"].probabilities == pytest.approx(
            reference.json()["answers"]["t"]["probabilities"], abs=1e-9)
    # the same key, the same refusals
    assert httpx.post(keyed.url + path, json={"state": STATE, "questions": questions}).status_code == 403
    bad = httpx.post(keyed.url + path, json={"state": STATE, "questions": {}}, headers=auth)
    assert bad.status_code == 422 and "detail" in bad.json()
    unknown = httpx.post(keyed.url + path, json={"model": "typesafe/other", "state": STATE, "questions": questions},
                         headers=auth)
    assert unknown.status_code == 404 and unknown.json()["detail"]["error_type"] == "api_usage_error"
