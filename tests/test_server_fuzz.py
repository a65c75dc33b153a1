"""Malformed requests never get a 5xx, on any route that takes a body: generated bodies (requests, garbage
bytes, batches, plans, chat completions with schemas of every shape) against the real app, every error
body small."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from generators import batch, chat, chat_schema, request, values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laya.encoder.engine import EncoderEngine
from laya.server.app import create_app


@pytest.fixture(scope="module")
def client(model):
    # a loopback Host: the server refuses other host names when it has no API key
    with TestClient(create_app(lambda: [EncoderEngine(model)]), raise_server_exceptions=False,
                    base_url="http://127.0.0.1") as c:
        deadline = time.monotonic() + 30
        while c.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield c


def check(r) -> None:
    assert r.status_code < 500, r.text[:2000]
    assert r.status_code != 421, "the fuzz must reach the routes"
    assert len(r.content) < 64 * 1024
    assert r.headers["x-typesafe-request-id"]


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=request | values)
def test_no_5xx_for_generated_bodies(client, body):
    check(client.post("/v1/systemone", content=json.dumps(body), headers={"content-type": "application/json"}))


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200), encoding=st.sampled_from([None, "gzip", "zstd", "deflate", "br", "identity"]))
def test_no_5xx_for_garbage_bytes(client, raw, encoding):
    headers = {"content-encoding": encoding} if encoding else {}
    check(client.post("/v1/systemone", content=raw, headers=headers))


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=batch)
def test_no_5xx_for_batch_bodies(client, body):
    check(client.post("/v1/systemone/batch", content=json.dumps(body), headers={"content-type": "application/json"}))


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=request | batch | values)
def test_no_5xx_for_plan_bodies(client, body):
    check(client.post("/v1/systemone/plan", content=json.dumps(body), headers={"content-type": "application/json"}))


def check_chat(r) -> None:
    check(r)
    if r.status_code >= 400:  # OpenAI's error shape, which its clients read
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text[:500]


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=chat | values)
def test_no_5xx_for_chat_completion_bodies(client, body):
    check_chat(client.post("/v1/chat/completions", content=json.dumps(body),
                           headers={"content-type": "application/json"}))


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=chat_schema)
def test_no_5xx_for_schemas_of_every_shape_on_the_chat_route(client, body):
    """A valid completion but for its schema: every branch of the schema walk, with wrong values."""
    check_chat(client.post("/v1/chat/completions", content=json.dumps(body),
                           headers={"content-type": "application/json"}))
