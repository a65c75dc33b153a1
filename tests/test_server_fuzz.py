"""Malformed requests never get a 5xx: 10,000 generated bodies (requests, garbage bytes, batches)
against the real app, every error body small."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laya.encoder.engine import EncoderEngine
from laya.server.app import create_app

# lone surrogates and huge integers are what JSON can carry and text cannot: they must be 4xx too
surrogates = st.sampled_from(["\ud800", "a\udfff", "\udbff\ud800x"])
scalars = (st.none() | st.booleans() | st.integers(-5, 300) | st.integers(min_value=10**70, max_value=10**80)
           | st.floats(allow_nan=False) | st.text(max_size=12) | surrogates)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=4), max_leaves=12)
texts = st.text(max_size=40) | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
criteria = (st.dictionaries(st.text(max_size=10), st.none() | texts | values, max_size=8)
            | st.lists(st.text(max_size=10) | values, max_size=12) | values)
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["choice", "score", "noul", "box", "", "CHOICE"]) | values},
    optional={"instructions": texts | values, "criteria": criteria, "labels": values},
)
request = st.fixed_dictionaries(
    {},
    optional={"state": texts | values | st.lists(texts, max_size=3), "model": st.none() | st.text(max_size=12) | values,
              "questions": st.dictionaries(st.text(max_size=8), question | values, max_size=4) | values},
)


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


@settings(max_examples=8000, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=request | values)
def test_no_5xx_for_generated_bodies(client, body):
    check(client.post("/v1/systemone", content=json.dumps(body), headers={"content-type": "application/json"}))


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200), encoding=st.sampled_from([None, "gzip", "zstd", "deflate", "br", "identity"]))
def test_no_5xx_for_garbage_bytes(client, raw, encoding):
    headers = {"content-encoding": encoding} if encoding else {}
    check(client.post("/v1/systemone", content=raw, headers=headers))


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.fixed_dictionaries({"states": st.lists(texts | values, max_size=3) | values}, optional={
    "questions": st.dictionaries(st.text(max_size=8), question, max_size=3)}))
def test_no_5xx_for_batch_bodies(client, body):
    check(client.post("/v1/systemone/batch", content=json.dumps(body), headers={"content-type": "application/json"}))
