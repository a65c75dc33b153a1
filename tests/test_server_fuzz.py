"""Malformed requests never get a 5xx: at least 1,000 generated bodies against the real app."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laya.engines import EncoderEngine
from laya.server.app import create_app

scalars = st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=False) | st.text(max_size=12)
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
    with TestClient(create_app(lambda: [EncoderEngine(model)]), raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 30
        while c.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield c


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=request | values)
def test_no_5xx_for_generated_bodies(client, body):
    r = client.post("/v1/systemone", content=json.dumps(body))
    assert r.status_code < 500, (body, r.text)
    assert r.headers["x-typesafe-request-id"]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200), encoding=st.sampled_from([None, "gzip", "zstd", "deflate", "br", "identity"]))
def test_no_5xx_for_garbage_bytes(client, raw, encoding):
    headers = {"content-encoding": encoding} if encoding else {}
    r = client.post("/v1/systemone", content=raw, headers=headers)
    assert r.status_code < 500


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.fixed_dictionaries({"states": st.lists(texts | values, max_size=3) | values}, optional={
    "questions": st.dictionaries(st.text(max_size=8), question, max_size=3)}))
def test_no_5xx_for_batch_bodies(client, body):
    assert client.post("/v1/systemone/batch", content=json.dumps(body)).status_code < 500
