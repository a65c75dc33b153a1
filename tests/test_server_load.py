"""The server under concurrency: shared forward passes with unchanged answers, a bounded queue,
isolated failures, abandoned requests and readiness."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import pytest
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.encoder.engine import EncoderEngine
from laya.server.app import ServerConfig, create_app

ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None,
                                                                       "support": "bugs"}}
ANGER = {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]}
URGENT = {"type": "noul", "instructions": "Urgent?"}


async def fire(url: str, bodies: list[dict], timeout: float = 30) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await asyncio.gather(*(client.post(url + "/v1/systemone", json=b) for b in bodies))


def ask(url: str, state: str) -> httpx.Response:
    return httpx.post(url + "/v1/systemone", json={"state": state, "questions": {"u": URGENT}}, timeout=30)


def batched_jobs(url: str) -> tuple[int, int]:
    """(forward batches, batches that held more than one request) from /metrics."""
    text = httpx.get(url + "/metrics").text
    one = int(re.search(r'laya_batch_jobs_bucket\{le="1"\} (\d+)', text).group(1))
    total = int(re.search(r"laya_batch_jobs_count (\d+)", text).group(1))
    return total, total - one


def test_coalesced_answers_equal_answers_alone(model):
    states = [f"customer {i}: I was charged twice, order {i}" + " please help" * i for i in range(8)]
    with LiveServer(create_app(lambda: [EncoderEngine(model)], ServerConfig(max_wait_ms=50))) as live:
        alone = [httpx.post(live.url + "/v1/systemone", json={"state": s, "questions": {"t": ROUTE}}).json()
                 for s in states]
        before = batched_jobs(live.url)
        # the same question renamed, reordered among others, all at once
        bodies = [{"state": s, "questions": {"u": URGENT, f"renamed-{i}": ROUTE, "a": ANGER}}
                  for i, s in enumerate(states)]
        together = asyncio.run(fire(live.url, bodies))
        after = batched_jobs(live.url)
    assert after[1] > before[1], "the concurrent requests were never coalesced"
    for i, (single, response) in enumerate(zip(alone, together)):
        assert response.status_code == 200
        assert response.json()["answers"][f"renamed-{i}"] == single["answers"]["t"]


def test_full_queue_answers_429_with_retry_after():
    engine = ScriptedEngine(delay=0.3)
    config = ServerConfig(max_pending_rows=2, max_wait_ms=1, max_batch_rows=1)
    with LiveServer(create_app(lambda: [engine], config)) as live:
        responses = asyncio.run(fire(live.url, [{"state": f"s{i}", "questions": {"u": URGENT}} for i in range(8)]))
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 429}, codes
    for r in responses:
        if r.status_code == 429:
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert r.json()["detail"]["error_type"] == "rate_limit_error"


def test_an_internal_failure_is_a_500_and_isolated():
    engine = ScriptedEngine(delay=0.05)
    with LiveServer(create_app(lambda: [engine], ServerConfig(max_wait_ms=30))) as live:
        bodies = [{"state": s, "questions": {"u": URGENT}} for s in ("a", "boom", "b")]
        responses = asyncio.run(fire(live.url, bodies))
        after = httpx.post(live.url + "/v1/systemone", json={"state": "c", "questions": {"u": URGENT}})
    codes = [r.status_code for r in responses]
    assert codes == [200, 500, 200]
    assert responses[1].json()["detail"]["error_type"] == "internal_error"
    assert responses[1].headers["x-typesafe-request-id"] in responses[1].json()["detail"]["message"]
    assert after.status_code == 200


def test_a_refusal_found_while_running_is_a_422_for_that_request_only():
    with LiveServer(create_app(lambda: [ScriptedEngine(delay=0.05)], ServerConfig(max_wait_ms=30))) as live:
        responses = asyncio.run(fire(live.url, [{"state": s, "questions": {"u": URGENT}} for s in ("a", "refuse")]))
    assert [r.status_code for r in responses] == [200, 422]
    assert "refused while running" in responses[1].json()["detail"][0]["msg"]


def test_an_unexpected_exception_is_a_500_with_body_and_request_id(caplog):
    with LiveServer(create_app(lambda: [ScriptedEngine()])) as live:
        r = httpx.post(live.url + "/v1/systemone", json={"state": "crash", "questions": {"u": URGENT}})
        assert r.status_code == 500 and r.json()["detail"]["error_type"] == "internal_error"
        assert r.headers["x-typesafe-request-id"] in r.json()["detail"]["message"]
        assert ask(live.url, "x").status_code == 200
    assert "an unexpected bug" in caplog.text


def test_abandoned_request_is_not_run():
    engine = ScriptedEngine(delay=0.5)
    with LiveServer(create_app(lambda: [engine], ServerConfig(max_wait_ms=1, max_batch_rows=1))) as live:
        first = threading.Thread(target=lambda: httpx.post(live.url + "/v1/systemone",
                                                           json={"state": "first", "questions": {"u": URGENT}}))
        first.start()
        time.sleep(0.1)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(live.url + "/v1/systemone", json={"state": "abandoned", "questions": {"u": URGENT}},
                       timeout=0.2)
        first.join()
        time.sleep(0.8)
        assert ask(live.url, "last").status_code == 200
    assert "abandoned" not in engine.executed
    assert engine.executed == ["first", "last"]


def test_abandoned_running_work_stops_between_steps():
    """A request that times out while its states are being answered stops costing the machine: its
    remaining work is skipped and the next request does not wait for it."""
    engine = ScriptedEngine(delay=0.2)
    with LiveServer(create_app(lambda: [engine], ServerConfig(max_wait_ms=1))) as live:
        states = [f"s{i}" for i in range(20)]  # 4 s of work if it ran to the end
        with pytest.raises(httpx.TimeoutException):
            httpx.post(live.url + "/v1/systemone/batch", json={"states": states, "questions": {"u": URGENT}},
                       timeout=0.5)
        started = time.monotonic()
        assert ask(live.url, "next").status_code == 200
        waited = time.monotonic() - started
    ran = [s for s in engine.executed if s in states]
    assert len(ran) < 8, ran
    left = (len(states) - len(ran)) * engine.delay  # what the abandoned request still had to run
    assert waited < left, f"the next request waited {waited:.2f} s behind abandoned work ({left:.1f} s of it)"


def test_not_ready_until_loaded():
    gate = threading.Event()

    def load():
        gate.wait(10)
        return [ScriptedEngine()]

    with LiveServer(create_app(load), wait_ready=False) as live:
        assert httpx.get(live.url + "/ready").status_code == 503
        r = httpx.post(live.url + "/v1/systemone", json={"state": "x", "questions": {"u": URGENT}})
        assert r.status_code == 503 and r.headers["retry-after"]
        gate.set()
        deadline = time.monotonic() + 5
        while httpx.get(live.url + "/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert ask(live.url, "x").status_code == 200


def test_load_failure_is_reported():
    def load():
        raise FileNotFoundError("no such checkpoint")

    with LiveServer(create_app(load), wait_ready=False) as live:
        time.sleep(0.2)
        assert httpx.get(live.url + "/ready").status_code == 503
        assert "no such checkpoint" in httpx.get(live.url + "/health").json()["load_errors"][0]
