"""The server under hostile input: each class of abuse sent to a live server (a generated checkpoint
and a chat GGUF) is answered 4xx with a small body, never 5xx, within a few benign requests' time
(measured in the same run, so the bound holds on any processor and under any load), and a normal
request sent meanwhile is answered about as fast as alone."""

from __future__ import annotations

import gzip
import json
import statistics
import threading
import time

import httpx
import pytest
import zstandard
from conftest import need
from live_server import LiveServer

from laya.encoder.engine import EncoderEngine
from laya.limits import Limits
from laya.server.app import ServerConfig, create_app

URGENT = {"type": "noul", "instructions": "Urgent?"}
NORMAL = {"state": "I was charged twice, please refund me.", "questions": {"u": URGENT}}
JSON = {"content-type": "application/json"}
LIMITS = Limits(max_questions=64, max_states=256, max_rows=1024, max_tokens=20000, max_decisions=512)
# A hostile request may take at most this many benign requests (the median of those timed alone in the
# same run) plus a constant. Measured on a 2-core AVX2 machine: the slowest (3.5 MB of options to
# validate) took 3.3 benign requests, and 8.4 with the cores oversubscribed (load 4.4). What the bound
# is there to catch (decompressing past the body cap, validating states past max_states) grows with the
# attack's size, not with the machine's pace.
HOSTILE_BENIGN_FACTOR, HOSTILE_SLACK_S = 20, 0.05


def dumps(value) -> bytes:
    return json.dumps(value).encode()


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def hostile() -> list[tuple[str, str, bytes, dict, tuple[int, ...]]]:
    """(name, route, body, headers, accepted statuses)."""
    sv1, batch = "/v1/systemone", "/v1/systemone/batch"
    many_states = b'{"questions": {"u": {"type": "noul"}}, "states": [' + b",".join([b"5"] * 300_000) + b"]}"
    bad_options = {"q": {"type": "choice", "criteria": {f"option {i}" + "x" * 200: 5 for i in range(255)}}}
    huge_id = {"x" * 1_000_000: {"type": "essay"}}
    return [
        ("zstd body of 300,000 invalid states", batch, zstd(many_states), {**JSON, "content-encoding": "zstd"},
         (413,)),
        ("zstd bomb past the body cap", sv1, zstd(b" " * (64 << 20)), {**JSON, "content-encoding": "zstd"}, (413,)),
        ("gzip bomb past the body cap", sv1, gzip.compress(b"[" * (32 << 20)), {**JSON, "content-encoding": "gzip"},
         (413,)),
        ("lone surrogate in the state", sv1, b'{"state": "\\ud800", "questions": {"u": {"type": "noul"}}}', JSON,
         (422,)),
        ("lone surrogate in a question id", sv1, b'{"state": "s", "questions": {"\\udfff": {"type": "noul"}}}', JSON,
         (422,)),
        ("a number of 5,000 digits", sv1, b'{"state": ' + b"9" * 5000 + b', "questions": {}}', JSON, (422,)),
        ("a float that overflows", sv1, b'{"state": 1e999, "questions": {"u": {"type": "noul"}}}', JSON, (422,)),
        ("NaN literal", sv1, b'{"state": NaN, "questions": {"u": {"type": "noul"}}}', JSON, (422,)),
        ("Infinity literal", sv1, b'{"state": "s", "questions": {"u": {"type": "noul", "x": -Infinity}}}', JSON,
         (422,)),
        ("nesting 200,000 deep", sv1, b'{"state": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", JSON, (422,)),
        ("nesting 100 deep", sv1, dumps({"state": json.loads("[" * 100 + "]" * 100), "questions": {"u": URGENT}}),
         JSON, (422,)),
        ("duplicate keys", sv1, b'{"state": "a", "state": "b", "questions": {"u": {"type": "noul"}}}', JSON, (422,)),
        ("invalid UTF-8", sv1, b'{"state": "\xff\xfe", "questions": {}}', JSON, (422,)),
        ("a byte-order mark", sv1, "\ufeff".encode() + dumps(NORMAL), JSON, (422,)),
        ("text/plain (a cross-site simple request)", sv1, dumps(NORMAL), {"content-type": "text/plain"}, (415,)),
        ("a form body", sv1, b"state=x", {"content-type": "application/x-www-form-urlencoded"}, (415,)),
        ("multipart", sv1, b"--b\r\n\r\nx\r\n--b--", {"content-type": "multipart/form-data; boundary=b"}, (415,)),
        ("no content type from a browser", sv1, dumps(NORMAL), {"origin": "http://127.0.0.1", "content-type": ""},
         (403, 415)),
        ("another site's page", sv1, dumps(NORMAL), {**JSON, "origin": "http://evil.example"}, (403,)),
        ("DNS rebinding (a foreign Host)", sv1, dumps(NORMAL), {**JSON, "host": "evil.example:8000"}, (421,)),
        ("10,000 questions", sv1, dumps({"state": "s", "questions": {f"q{i}": URGENT for i in range(10_000)}}), JSON,
         (413,)),
        ("rows past the limit", batch,
         dumps({"states": ["s"] * 200, "questions": {f"q{i}": URGENT for i in range(10)}}), JSON, (413,)),
        ("tokens past the limit", batch, dumps({"states": ["refund " * 300] * 100, "questions": {"u": URGENT}}), JSON,
         (413,)),
        ("thousands of validation errors", sv1, dumps({"state": "s", "questions": {f"q{i}": bad_options["q"]
                                                                                   for i in range(64)}}), JSON, (422,)),
        ("a megabyte question id", sv1, dumps({"state": "s", "questions": huge_id}), JSON, (422,)),
        ("a megabyte model name", sv1, dumps({**NORMAL, "model": "m" * 1_000_000}), JSON, (404,)),
        ("an unknown content encoding", sv1, dumps(NORMAL), {**JSON, "content-encoding": "br"}, (415,)),
        ("corrupt gzip", sv1, b"\x1f\x8b\x08garbage", {**JSON, "content-encoding": "gzip"}, (400,)),
        ("a body past the cap", sv1, b" " * (9 << 20), JSON, (413,)),
        ("wrong types everywhere", sv1, dumps({"state": {"a": [1, {"b": None}]}, "model": [], "questions": {
            "a": [], "b": {"type": 3}, "c": {"type": "score", "criteria": "x"}}}), JSON, (422,)),
    ]


@pytest.fixture(scope="module")
def live(model):
    config = ServerConfig(limits=LIMITS, max_body_bytes=8 << 20)
    with LiveServer(create_app(lambda: [EncoderEngine(model)], config)) as server:
        yield server


def timed(url: str, body: bytes, headers: dict, route: str = "/v1/systemone") -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    r = httpx.post(url + route, content=body, headers=headers, timeout=30)
    return r, time.perf_counter() - started


def benign_alone(url: str) -> float:
    r, seconds = timed(url, dumps(NORMAL), JSON)
    assert r.status_code == 200, r.text
    return seconds


def test_every_hostile_request_is_a_small_fast_4xx_and_normal_requests_keep_their_pace(live):
    benign = [benign_alone(live.url) for _ in range(15)]
    during: list[float] = []
    answered = []
    for name, route, body, headers, statuses in hostile():
        benign.append(benign_alone(live.url))  # the machine's pace right now, alone
        result: dict = {}

        def attack(route=route, body=body, headers=headers, result=result):
            result["r"], result["s"] = timed(live.url, body, headers, route)

        thread = threading.Thread(target=attack)
        thread.start()
        time.sleep(0.005)
        r, seconds = timed(live.url, dumps(NORMAL), JSON)
        during.append(seconds)
        thread.join(30)
        assert r.status_code == 200, (name, r.text)
        answered.append((name, statuses, result["r"], result["s"]))
    alone = statistics.median(benign)
    allowed = HOSTILE_BENIGN_FACTOR * alone + HOSTILE_SLACK_S
    failures = [(name, r.status_code, round(seconds, 3), len(r.content), r.text[:200])
                for name, statuses, r, seconds in answered
                if r.status_code not in statuses or seconds > allowed or len(r.content) >= 64 * 1024]
    slowest = max(answered, key=lambda a: a[3])
    pace = (f"a benign request alone: median {alone * 1000:.1f} ms of {len(benign)}; a hostile one allowed "
            f"{allowed * 1000:.0f} ms; slowest {slowest[0]!r} {slowest[3] * 1000:.0f} ms")
    assert not failures, (pace, failures)
    assert statistics.median(during) <= 2 * alone + 0.005, (pace, during)
    print(f"\n{pace}")


def test_error_bodies_list_twenty_errors_and_count_them_all(live):
    body = {"state": "s", "questions": {f"q{i}": {"type": "score", "criteria": ["one"]} for i in range(50)}}
    r = httpx.post(live.url + "/v1/systemone", json=body)
    assert r.status_code == 422 and len(r.json()["detail"]) == 20 and r.json()["x_error_count"] == 50


def test_limits_are_named_in_the_413(live):
    body = {"state": "s", "questions": {f"q{i}": URGENT for i in range(65)}}
    r = httpx.post(live.url + "/v1/systemone", json=body)
    detail = r.json()["detail"]
    assert r.status_code == 413 and detail["error_type"] == "max_questions_exceeded"
    assert detail["x_limit"] == {"flag": "--max-questions", "value": 64} and "--max-questions" in detail["message"]


def test_states_are_counted_before_any_is_validated(live):
    body = b'{"questions": {"u": {"type": "noul"}}, "states": [' + b",".join([b"null"] * 257) + b"]}"
    r, seconds = timed(live.url, body, JSON, "/v1/systemone/batch")
    assert r.status_code == 413 and r.json()["detail"]["error_type"] == "max_states_exceeded"


def test_loopback_names_and_json_from_non_browsers_are_served(live):
    port = live.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert httpx.post(live.url + "/v1/systemone", json=NORMAL, headers={"host": host}).status_code == 200
    plain = httpx.post(live.url + "/v1/systemone", content=dumps(NORMAL))  # no content type, not a browser
    assert plain.status_code == 200
    same_origin = httpx.post(live.url + "/v1/systemone", json=NORMAL, headers={"origin": live.url})
    assert same_origin.status_code == 200  # the demo page


def test_with_an_api_key_any_host_name_is_served(model):
    config = ServerConfig(api_key="k", limits=LIMITS)
    with LiveServer(create_app(lambda: [EncoderEngine(model)], config)) as server:
        r = httpx.post(server.url + "/v1/systemone", json=NORMAL,
                       headers={"host": "laya.internal", "authorization": "Bearer k"})
        assert r.status_code == 200


@pytest.fixture(scope="module")
def decide_live(tmp_path_factory):
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.decide.engine import DecideEngine
    from laya.decide.llama import open_gguf
    from laya.testing.chat_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    engine = DecideEngine(open_gguf(path, name="chat", n_ctx=1024, threads=2))
    with LiveServer(create_app(lambda: [engine], ServerConfig(limits=LIMITS))) as server:
        yield server


def test_the_decide_engine_counts_decisions_and_tokens(decide_live):
    many = {"states": ["s"] * 9, "questions": {f"q{i}": URGENT for i in range(30)}}  # 9 x 30 x 2 readouts
    r = httpx.post(decide_live.url + "/v1/systemone/batch", json=many)
    assert r.status_code == 413 and r.json()["detail"]["error_type"] == "max_decisions_exceeded"
    long = {"states": ["refund " * 120] * 40, "questions": {"u": URGENT}}
    r = httpx.post(decide_live.url + "/v1/systemone/batch", json=long)
    assert r.status_code == 413 and r.json()["detail"]["error_type"] == "max_tokens_exceeded"


def test_x_prefill_reports_nothing_about_other_callers(decide_live):
    httpx.post(decide_live.url + "/v1/systemone", json={"state": "another caller's long state " * 20,
                                                        "questions": {"u": URGENT}})
    r = httpx.post(decide_live.url + "/v1/systemone", json={**NORMAL, "reuse_prefix": False})
    prefill = r.json()["answers"]["u"]["x_prefill"]
    assert all("kept_state_bytes" not in p for p in prefill)
    assert all(p["reused_tokens"] == 0 and p["stored_state_bytes"] == 0 for p in prefill)
