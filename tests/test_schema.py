"""The OpenAPI document's request schema and the validation give the same verdict: every body of the
table below is accepted by both or refused by both (the few rules JSON Schema cannot state are named
in laya.schema and left out), and the served document is that schema at the server's limits."""

from __future__ import annotations

import httpx
import jsonschema
import pytest
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.api import ApiError
from laya.limits import Limits
from laya.request import parse_request
from laya.schema import request_schema
from laya.server.app import ServerConfig, create_app

LIMITS = Limits(max_questions=4, max_states=3)
NOUL = {"type": "noul"}


def body(question=NOUL, **top):
    return {"state": "s", "questions": {"q": question}, **top}


ACCEPTED = [
    body(),
    body({"type": "noul", "instructions": "Urgent?", "criteria": {"true": "now", "false": None}}),
    body({"type": "noul", "criteria": {"True": ["x"]}, "labels": {"false": "B", "true": "A"}}),
    body({"type": "noul", "criteria": None, "labels": None, "extra": 1}),
    body({"type": "choice", "criteria": {"billing": "money", "sales": None, "support": {"area": "bugs"}}}),
    body({"type": "choice", "criteria": ["billing", "sales"], "instructions": ["a", "list"]}),
    body({"type": "choice", "criteria": {f"o{i}": None for i in range(255)}}),
    body({"type": "score", "criteria": ["low", "high"]}),
    body({"type": "score", "criteria": [{"level": i} for i in range(10)]}),
    {"state": {"ticket": 1}, "questions": {"q": NOUL}},
    {"state": ["turn one", "turn two"], "questions": {"a": NOUL, "b": NOUL, "c": NOUL, "d": NOUL}},
    body(model=None, reuse_prefix=False, tournament=2),
    body(model="jev-latest", reuse_prefix=None, tournament=255, x_unknown="ignored"),
    body(x_overflow="truncate"), body(x_overflow="keep_start"), body(x_overflow="keep_end"), body(x_overflow=None),
    body(x_overflow={"scan": {}}), body(x_overflow={"scan": {"window": 64, "stride": 0, "aggregate": "auto"}}),
    body(x_overflow={"scan": {"window": None, "stride": 32}}),
    body(x_order="both"), body(x_order="rotate:4"), body(x_order="rotate:255"), body(x_order="as_given"),
    body(x_order=None),
    body(x_min_confidence=0.5), body(x_min_confidence=0), body(x_min_confidence=None),
    body(x_min_confidence={"choice:3-5": 0.7, "default": 0.5}),
    body({"type": "choice", "criteria": ["a", "b", "c"], "x_shortlist": 2}),
    body({"type": "noul", "x_shortlist": None}),
]

REFUSED = [
    {"questions": {"q": NOUL}},
    {"state": None, "questions": {"q": NOUL}},
    {"state": 5, "questions": {"q": NOUL}},
    {"state": "s"},
    {"state": "s", "questions": {}},
    {"state": "s", "questions": [NOUL]},
    {"state": "s", "questions": {"": NOUL}},
    {"state": "s", "questions": {f"q{i}": NOUL for i in range(5)}},  # past max_questions
    ["not", "an", "object"],
    body({"instructions": "no type"}),
    body({"type": "essay"}),
    body({"type": "noul", "instructions": 5}),
    body({"type": "noul", "criteria": {"maybe": "x"}}),
    body({"type": "noul", "criteria": ["true"]}),
    body({"type": "noul", "criteria": {"true": 5}}),
    body({"type": "noul", "labels": {"false": "a"}}),
    body({"type": "noul", "labels": {"false": "a", "true": ""}}),
    body({"type": "noul", "labels": {"false": "a", "true": 5}}),
    body({"type": "noul", "labels": {"no": "a", "yes": "b"}}),
    body({"type": "choice"}),
    body({"type": "choice", "criteria": {"only": None}}),
    body({"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}),
    body({"type": "choice", "criteria": ["same", "same"]}),
    body({"type": "choice", "criteria": ["a", 5]}),
    body({"type": "choice", "criteria": {"a": 5, "b": None}}),
    body({"type": "choice", "criteria": "a, b"}),
    body({"type": "score", "criteria": ["one"]}),
    body({"type": "score", "criteria": [str(i) for i in range(11)]}),
    body({"type": "score", "criteria": {"0": "low", "1": "high"}}),
    body({"type": "score", "criteria": ["low", 5]}),
    body({"type": "score", "criteria": ["low", None]}),
    body(model=5),
    body(reuse_prefix="yes"),
    body(tournament=1),
    body(tournament=256),
    body(tournament=True),
    body(tournament=2.5),
    body(x_overflow="sideways"), body(x_overflow=["scan"]), body(x_overflow={"scan": 3}),
    body(x_overflow={"scan": {"window": -1}}), body(x_overflow={"scan": {"window": True}}),
    body(x_overflow={"scan": {"stride": 2.5}}), body(x_overflow={"scan": {"aggregate": "mean"}}),
    body(x_overflow={"scan": {"windows": 3}}), body(x_overflow={"scan": {}, "more": 1}),
    body(x_overflow={"scan": {"window": 40000}}),
    body(x_order="sideways"), body(x_order="rotate:1"), body(x_order="rotate:256"), body(x_order=2),
    body(x_order="rotate:\u00b2"),
    body(x_min_confidence=1.5), body(x_min_confidence=True), body(x_min_confidence="0.5"), body(x_min_confidence={}),
    body(x_min_confidence={"choice:7": 0.5}), body(x_min_confidence={"default": 2}),
    body({"type": "noul", "x_shortlist": 2}), body({"type": "choice", "criteria": ["a", "b"], "x_shortlist": 0}),
    body({"type": "choice", "criteria": ["a", "b"], "x_shortlist": True}),
    body({"type": "choice", "criteria": ["a", "b"], "x_shortlist": 256}),
]

BATCH_ACCEPTED = [{"states": ["a", {"b": 1}, ["c"]], "questions": {"q": NOUL}}]
BATCH_REFUSED = [{"states": [], "questions": {"q": NOUL}}, {"states": ["a"] * 4, "questions": {"q": NOUL}},
                 {"states": "a", "questions": {"q": NOUL}}, {"states": ["a", None], "questions": {"q": NOUL}},
                 {"state": "a", "questions": {"q": NOUL}}]


def validates(value, batch: bool) -> bool:
    try:
        parse_request(value, batch=batch, limits=LIMITS)
        return True
    except ApiError:
        return False


@pytest.mark.parametrize(("value", "batch", "accepted"),
                         [(b, False, True) for b in ACCEPTED] + [(b, False, False) for b in REFUSED]
                         + [(b, True, True) for b in BATCH_ACCEPTED] + [(b, True, False) for b in BATCH_REFUSED])
def test_the_schema_and_the_validation_agree(value, batch, accepted):
    schema = jsonschema.Draft202012Validator(request_schema(LIMITS, batch=batch))
    assert validates(value, batch) is accepted
    assert schema.is_valid(value) is accepted, [e.message[:200] for e in schema.iter_errors(value)]


def test_the_served_document_is_the_schema_at_the_servers_limits():
    jsonschema.Draft202012Validator.check_schema(request_schema(LIMITS))
    with LiveServer(create_app(lambda: [ScriptedEngine()], ServerConfig(limits=LIMITS))) as live:
        paths = httpx.get(live.url + "/openapi.json").json()["paths"]
    for route, batch in (("/v1/systemone", False), ("/v1/systemone/batch", True)):
        served = paths[route]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert served == request_schema(LIMITS, batch=batch)
