"""The decide engine behind /v1/systemone, beside a laya checkpoint; and the default models of `laya serve`."""

from __future__ import annotations

import httpx
import pytest
from conftest import need, smollm2
from live_server import LiveServer

need("llama_cpp", "the [llama] extra is not installed")

from laya.decide.engine import DecideEngine  # noqa: E402
from laya.decide.llama import LlamaBackend  # noqa: E402
from laya.decide.model import DecideModel  # noqa: E402
from laya.encoder.engine import EncoderEngine  # noqa: E402
from laya.server.app import create_app  # noqa: E402
from laya.server.serve import ServeOptions, load_engines  # noqa: E402
from laya.testing.chat_gguf import write_tiny_gguf  # noqa: E402

ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None}}


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    decide = DecideEngine(DecideModel(LlamaBackend(path, n_ctx=1024, n_threads=2), "tiny-chat", source=str(path)))
    with LiveServer(create_app(lambda: [decide, EncoderEngine(model)])) as live:
        yield live


def test_decide_answers_with_its_extras(server, model):
    body = {"state": "I was charged twice", "questions": {"t": ROUTE, "u": {"type": "noul", "instructions": "Urgent?"},
                                                          "a": {"type": "score", "criteria": ["0", "1", "2"]}}}
    r = httpx.post(server.url + "/v1/systemone", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == "tiny-chat"
    t = out["answers"]["t"]
    assert set(t["probabilities"]) == {"billing", "sales"} and 0 <= t["x_outside_mass"] <= 1
    assert t["x_prefill"][0]["prefilled_tokens"] > 0
    assert out["answers"]["u"]["x_prefill"][0]["reused_tokens"] > 0  # the state was kept from the first question
    again = httpx.post(server.url + "/v1/systemone", json={**body, "reuse_prefix": False}, timeout=60).json()
    assert all(r["reused_tokens"] == 0 for r in again["answers"]["t"]["x_prefill"])
    assert again["answers"]["t"]["probabilities"] == t["probabilities"]
    other = httpx.post(server.url + "/v1/systemone", json={**body, "model": model.name}, timeout=60).json()
    assert other["model"] == model.name
    listed = httpx.get(server.url + "/v1/models").json()["models"]
    assert [m["name"] for m in listed] == ["tiny-chat", model.name, "jev-latest", "jev-preview"]
    readout = {"name": "first-token", "calibrated": False, "from": "default"}
    assert listed[0]["x_readout"] == readout and "x_readout" not in listed[1]  # a GGUF's readout, said
    assert t["x_readout"] == readout
    health = httpx.get(server.url + "/health").json()["models"]["tiny-chat"]
    assert health["runtime"] == "llama.cpp" and health["readout"] == readout


def test_options_sharing_first_tokens_are_answered_and_bad_fields_are_422(server):
    colliding = {f"same {i}": None for i in range(30)}
    r = httpx.post(server.url + "/v1/systemone", json={"state": "x", "questions": {
        "q": {"type": "choice", "criteria": colliding}}})
    assert r.status_code == 200 and list(r.json()["answers"]["q"]["probabilities"]) == list(colliding)
    assert r.json()["answers"]["q"]["x_levels"] >= 2
    r = httpx.post(server.url + "/v1/systemone", json={"state": "x", "reuse_prefix": "no", "questions": {"t": ROUTE}})
    assert r.status_code == 422


def test_prompt_longer_than_the_context_is_413(server):
    r = httpx.post(server.url + "/v1/systemone", json={"state": "word " * 3000, "questions": {"t": ROUTE}}, timeout=60)
    assert r.status_code == 413 and r.json()["detail"]["error_type"] == "max_tokens_exceeded"


def test_default_models_of_laya_serve(caplog, monkeypatch, tmp_path):
    from huggingface_hub import constants

    smollm2()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # laya-multilingual is not cached here
    with caplog.at_level("INFO", logger="laya.server"):
        engines = load_engines(ServeOptions(n_ctx=1024))
    assert [e.info.name for e in engines] == ["smollm2-135m-instruct"]
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("default models"))
    assert "loaded smollm2-135m-instruct" in line and "could not load laya-multilingual" in line
