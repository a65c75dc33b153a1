"""Strict answers (`laya serve --strict`, a request's `X-Laya-Strict` header): every body holds the
System One contract's fields and nothing else, checked against the contract written as a JSON schema
with no extra property allowed anywhere, for every question type, both engines, /batch and errors."""

from __future__ import annotations

import httpx
import pytest
from conftest import need
from live_server import LiveServer

for _module in ("fastapi", "llama_cpp", "jsonschema"):
    need(_module)

import jsonschema  # noqa: E402

from laya.decide.engine import DecideEngine  # noqa: E402
from laya.decide.llama import LlamaBackend  # noqa: E402
from laya.decide.model import DecideModel  # noqa: E402
from laya.encoder.engine import EncoderEngine  # noqa: E402
from laya.limits import Limits  # noqa: E402
from laya.server.app import create_app  # noqa: E402
from laya.server.state import ServerConfig  # noqa: E402
from laya.testing.chat_gguf import write_tiny_gguf  # noqa: E402

PROBABILITIES = {"type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1}}
ANSWER = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["type", "noul"],
     "properties": {"type": {"const": "noul"}, "noul": {"type": "number", "minimum": 0, "maximum": 1}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "choice", "probabilities", "confidence"],
     "properties": {"type": {"const": "choice"}, "choice": {"type": "string"}, "probabilities": PROBABILITIES,
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1}}},
    {"type": "object", "additionalProperties": False,
     "required": ["type", "score", "legend", "probabilities", "confidence"],
     "properties": {"type": {"const": "score"}, "score": {"type": "number"}, "probabilities": PROBABILITIES,
                    "legend": {"type": "object", "additionalProperties": {"type": "string"}},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1}}},
]}
USAGE = {"type": "object", "additionalProperties": False, "required": ["input_tokens", "output_tokens"],
         "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}}}
RESPONSE = {"type": "object", "additionalProperties": False, "required": ["model", "answers", "usage"],
            "properties": {"model": {"type": "string"}, "usage": USAGE,
                           "answers": {"type": "object", "additionalProperties": ANSWER}}}
BATCH = {"type": "object", "additionalProperties": False, "required": ["model", "results", "total_usage"],
         "properties": {"model": {"type": "string"}, "results": {"type": "array", "items": RESPONSE},
                        "total_usage": USAGE}}
ERROR = {"type": "object", "additionalProperties": False, "required": ["detail"], "properties": {"detail": {"oneOf": [
    {"type": "array", "items": {"type": "object", "additionalProperties": False, "required": ["loc", "msg", "type"],
                                "properties": {"loc": {"type": "array"}, "msg": {"type": "string"},
                                               "type": {"type": "string"}}}},
    {"type": "object", "additionalProperties": False, "required": ["error_type", "message"],
     "properties": {"error_type": {"type": "string"}, "message": {"type": "string"}}},
    {"type": "string"}]}}}

QUESTIONS = {"t": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None}},
             "u": {"type": "noul", "instructions": "Urgent?"},
             "a": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "angry"]}}
STRICT = {"X-Laya-Strict": "1"}


def engines(model, path):
    return [EncoderEngine(model),
            DecideEngine(DecideModel(LlamaBackend(path, n_ctx=1024, n_threads=2), "tiny-chat", source=str(path)))]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def server(model, tiny_gguf):
    """Not strict by default: a request asks with its header."""
    config = ServerConfig(limits=Limits(max_states=2))
    with LiveServer(create_app(lambda: engines(model, tiny_gguf), config)) as live:
        yield live


@pytest.fixture(scope="module")
def strict_server(model, tiny_gguf):
    config = ServerConfig(limits=Limits(max_states=2), strict=True)
    with LiveServer(create_app(lambda: engines(model, tiny_gguf), config)) as live:
        yield live


def post(server, path: str, body, headers=None) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers or {}, timeout=120)


@pytest.mark.parametrize("name", ["encoder", "tiny-chat"])
def test_a_strict_answer_holds_only_the_contracts_fields(server, strict_server, model, name):
    target = model.name if name == "encoder" else name
    body = {"model": target, "state": "I was charged twice and I am furious", "questions": QUESTIONS}
    loose = post(server, "/v1/systemone", body)
    assert loose.status_code == 200, loose.text
    with pytest.raises(jsonschema.ValidationError):  # the extensions are there by default
        jsonschema.validate(loose.json(), RESPONSE)
    for answer in (post(server, "/v1/systemone", body, STRICT), post(strict_server, "/v1/systemone", body)):
        assert answer.status_code == 200, answer.text
        jsonschema.validate(answer.json(), RESPONSE)
        assert set(answer.json()["answers"]) == set(QUESTIONS)
        for qid, value in answer.json()["answers"].items():  # the same numbers, only fewer fields
            assert value == {k: v for k, v in loose.json()["answers"][qid].items() if not k.startswith("x_")}
    batch = {"model": target, "states": ["charged twice", "hello"], "questions": QUESTIONS}
    path = "/v1/systemone/batch"
    for answer in (post(server, path, batch, STRICT), post(strict_server, path, batch)):
        assert answer.status_code == 200, answer.text
        jsonschema.validate(answer.json(), BATCH)


@pytest.mark.parametrize("body, status", [
    ({"state": "x", "questions": {"t": {"type": "choice", "criteria": ["only one"]}}, "extra": [1] * 3}, 422),
    ({"state": "x"}, 422),
    ({"states": ["a", "b", "c"], "questions": QUESTIONS}, 413),  # a limit's x_limit goes
    ({"model": "nobody", "state": "x", "questions": QUESTIONS}, 404),
])
def test_a_strict_error_holds_only_the_contracts_fields(server, strict_server, body, status):
    path = "/v1/systemone/batch" if "states" in body else "/v1/systemone"
    loose = post(server, path, body)
    assert loose.status_code == status, loose.text
    for refused in (post(server, path, body, STRICT), post(strict_server, path, body)):
        assert refused.status_code == status, refused.text
        jsonschema.validate(refused.json(), ERROR)
    if status == 413:
        assert "x_limit" in loose.json()["detail"]


def test_the_header_decides_for_its_request(strict_server):
    body = {"state": "charged twice", "questions": {"u": QUESTIONS["u"]}}
    loose = post(strict_server, "/v1/systemone", body, {"X-Laya-Strict": "0"})
    assert loose.status_code == 200 and any(k.startswith("x_") for k in loose.json()["answers"]["u"])
    bad = post(strict_server, "/v1/systemone", body, {"X-Laya-Strict": "maybe"})
    assert bad.status_code == 400 and "X-Laya-Strict" in bad.json()["detail"]["message"]
