"""What upstream gives a caller, over HTTP (issue 27): typed structured output through the official
`openai` client (`POST /v1/chat/completions` with a json_schema format), and the per-request overflow
policy of `/v1/systemone` (`x_overflow`: truncate, keep_start, keep_end, a scan in windows)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Literal

import httpx
import openai
import pytest
from live_server import LiveServer
from pydantic import BaseModel, Field

from laya.encoder.engine import EncoderEngine
from laya.limits import Limits
from laya.request import Scan
from laya.server.app import ServerConfig, create_app

KEY = "sk-test-structured"
URGENT = {"type": "noul", "instructions": "Urgent?"}
ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None}}
LONG = "The customer was charged twice for the same order and wants a refund today. " * 40


class Team(StrEnum):
    billing = "billing"
    sales = "sales"
    support = "support"


class Ticket(BaseModel):
    team: Team = Field(description="Which team should handle this ticket?")
    urgent: bool
    priority: int = Field(ge=1, le=3)
    channel: Literal["email", "phone"] | None = None


MESSAGES = [{"role": "system", "content": "You route support tickets."},
            {"role": "user", "content": "I was charged twice for my subscription, please refund it today!"}]


@pytest.fixture(scope="module")
def keyed(model):
    config = ServerConfig(api_key=KEY, limits=Limits(max_rows=64, max_questions=8))
    with LiveServer(create_app(lambda: [EncoderEngine(model)], config)) as live:
        yield live


@pytest.fixture(scope="module")
def client(keyed):
    return openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def conversation_state() -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in MESSAGES]


def test_the_openai_client_gets_typed_structured_output(client, model):
    completion = client.chat.completions.parse(model=model.name, messages=MESSAGES, response_format=Ticket)
    ticket = completion.choices[0].message.parsed
    assert isinstance(ticket, Ticket)
    want = model.decide(conversation_state(), Ticket, return_details=True)
    assert ticket.model_dump(mode="json") == want.values
    assert completion.choices[0].finish_reason == "stop" and completion.usage.completion_tokens == 0
    assert completion.usage.prompt_tokens == want.usage["input_tokens"] > 0
    extra = completion.model_extra["x_laya"]
    assert extra["schema"] == "Ticket"
    assert set(extra["probabilities"]) == {"team", "urgent", "priority", "channel"}
    for field, p in want.probabilities.items():
        assert extra["probabilities"][field] == pytest.approx(p, abs=1e-12)
        assert extra["answer_confidence"][field] == pytest.approx(want.answer_confidence[field], abs=1e-12)
    assert sum(extra["probabilities"]["team"].values()) == pytest.approx(1.0)


def test_min_confidence_nulls_low_fields(client, model):
    completion = client.chat.completions.create(
        model=model.name, messages=MESSAGES, extra_body={"x_min_confidence": 0.999},
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": {
            "type": "object", "properties": {"team": {"enum": ["billing", "sales", "support"]}}}}})
    assert json.loads(completion.choices[0].message.content) == {"team": None}
    answer = completion.model_extra["x_laya"]["answers"]["team"]
    assert answer["x_abstention"] == "abstained" and answer["x_abstention_threshold"] == 0.999


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"response_format": {"type": "text"}}, "response_format must be"),
    ({"response_format": {"type": "json_object"}}, "does not write free text"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"name": {"type": "string"}}}}}}, "properties.name: a free string"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 50}}}}}},
     "51 levels exceeds MAX_SCORE_LEVELS=10"),
    ({"stream": True, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "stream is not supported"),
    ({"n": 2, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "n must be 1"),
    ({"extra_body": {"x_min_confidence": 2}, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"u": {"type": "boolean"}}}}}},
     "min_confidence must be a float in [0.0, 1.0]"),
])
def test_what_is_not_a_decision_is_a_400_the_client_names(client, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="any", messages=MESSAGES, **kwargs)
    assert needle in caught.value.message
    assert len(caught.value.response.content) < 1000


def test_images_tools_and_bad_messages_are_refused(keyed):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"u": {"type": "boolean"}}}}}
    bodies = [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
        {"messages": [], "response_format": fmt},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        {"messages": [{"role": "user", "content": 3}]},
    ]
    for body in bodies:
        r = httpx.post(keyed.url + "/v1/chat/completions", json={"response_format": fmt, **body},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_the_key_and_the_limits_hold(keyed, client):
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.parse(model="x", messages=MESSAGES, response_format=Ticket)
    many = {f"f{i}": {"type": "boolean"} for i in range(10)}  # past the server's --max-questions 8
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="x", messages=MESSAGES, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": many}}})
    assert caught.value.status_code == 413 and "--max-questions" in caught.value.message


class Case(BaseModel):
    kind: Literal["ticket"]  # the official client sends this as a one-value enum / const
    team: Team


class Constant(BaseModel):
    kind: Literal["ticket"]
    version: Literal[2]


def test_a_literal_field_is_filled_without_inference(client, model):
    completion = client.chat.completions.parse(model=model.name, messages=MESSAGES, response_format=Case)
    case = completion.choices[0].message.parsed
    assert case.kind == "ticket" and case.team in Team
    assert completion.model_extra["x_laya"]["probabilities"]["kind"] == {"ticket": 1.0}
    assert case.model_dump(mode="json") == model.decide(conversation_state(), Case)
    only = client.chat.completions.parse(model=model.name, messages=MESSAGES, response_format=Constant)
    assert only.choices[0].message.parsed == Constant(kind="ticket", version=2)
    assert only.usage.prompt_tokens == 0 and only.model == model.name  # nothing was read


def test_the_openai_client_lists_the_models(client, model):
    listed = client.models.list()
    names = [m.id for m in listed.data]
    assert names[0] == model.name and "jev-latest" in names
    assert all(m.object == "model" and m.owned_by == "laya" and m.created > 0 for m in listed.data)


def test_a_missing_key_is_a_401_for_openai_clients(keyed):
    """OpenAI's clients read 401 as an authentication error (a 403 would be 'permission denied')."""
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    for path, method in (("/v1/chat/completions", httpx.post), ("/v1/models", httpx.get)):
        r = method(keyed.url + path, timeout=30)  # no Authorization header at all
        assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}, path
        assert "missing API key" in r.json()["error"]["message"]


def test_the_doors_refusals_are_in_openais_shape_on_its_route(model):
    """The door's 429 and the drain's 503 are written before any route runs: on the chat route they
    carry OpenAI's error shape (its clients raise RateLimitError / InternalServerError with the message)."""
    from fastapi.testclient import TestClient

    app = create_app(lambda: [EncoderEngine(model)], ServerConfig(max_concurrency=1, shed_hold_ms=0))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        while c.get("/ready").status_code != 200:
            pass
        app.state.admission.inside = 1  # the door is full
        shed = c.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert shed.status_code == 429 and shed.json()["error"]["type"] == "overloaded_error"
        assert "detail" in c.post("/v1/systemone", json={"state": "x", "questions": {"u": URGENT}}).json()
        app.state.admission.inside = 0
        app.state.context.served.begin_drain()
        drained = c.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert drained.status_code == 503 and "shutting down" in drained.json()["error"]["message"]


def post(server, body):
    return httpx.post(server.url + "/v1/systemone", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def test_overflow_policies_over_http(keyed, model):
    questions = {"u": URGENT, "t": ROUTE}
    for policy in ("truncate", "keep_start", "keep_end"):
        r = post(keyed, {"state": LONG, "questions": questions, "x_overflow": policy})
        assert r.status_code == 200, r.text
        want = model.predict(LONG, questions, overflow=None if policy == "truncate" else policy)
        assert r.json()["answers"] == want["answers"]
    start = model.prepare([LONG], questions, overflow="keep_start").rows[0][0]
    end = model.prepare([LONG], questions, overflow="keep_end").rows[0][0]
    assert start.state_tokens_dropped > 0 and start.ids != end.ids
    conversation = [{"role": "user", "content": LONG}]
    assert model.prepare([conversation], questions).states[0].keep_end  # a conversation keeps its end by default
    assert not model.prepare([conversation], questions, overflow="keep_start").states[0].keep_end


def test_a_scan_over_http_names_its_window_and_counts_every_row(keyed, model):
    questions = {"u": URGENT, "t": ROUTE}
    body = {"state": LONG, "questions": questions, "x_overflow": {"scan": {"window": 120, "stride": 60}}}
    r = post(keyed, body)
    assert r.status_code == 200, r.text
    got = r.json()
    want = model.predict_long(LONG, questions, window=120, stride=60)
    assert got["answers"] == want["answers"]
    windows = got["x_usage"]["windows"]
    assert windows > 5 and got["x_usage"]["rows"] == 2 * windows
    for answer in got["answers"].values():
        w = answer["x_window"]
        assert w["count"] == windows and 0 <= w["index"] < windows and w["token_end"] - w["token_start"] <= 120
    assert got["usage"]["input_tokens"] == sum(len(r.ids) for rows in model.prepare(
        [LONG], questions, overflow=Scan(120, 60)).rows for r in rows)
    # the server's row limit bounds a scan (64 rows: 2 questions x 32 windows at most)
    r = post(keyed, {**body, "x_overflow": {"scan": {"window": 20, "stride": 1}}})
    assert r.status_code == 413 and "--max-rows" in r.text and len(r.content) < 1000


@pytest.mark.parametrize("overflow", ["sideways", {"scan": {"window": -1}}, {"scan": {"window": True}},
                                      {"scan": {"aggregate": "mean"}}, {"scan": {"windows": 3}}, {"scan": 3},
                                      {"scan": {}, "extra": 1}, ["scan"]])
def test_bad_overflow_is_a_422(keyed, overflow):
    r = post(keyed, {"state": "x", "questions": {"u": URGENT}, "x_overflow": overflow})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", "x_overflow"]


def test_a_stride_past_the_window_is_a_422_naming_it(keyed):
    r = post(keyed, {"state": LONG, "questions": {"u": URGENT}, "x_overflow": {"scan": {"window": 30, "stride": 40}}})
    assert r.status_code == 422 and "stride=40 steps past the 30-token window" in r.text
