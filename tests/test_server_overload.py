"""Overload: requests past the door's limits are shed before their body is read, with a Retry-After
that follows the measured drain rate; an engine in its own process answers bit for bit as in-process."""

from __future__ import annotations

import asyncio
import functools
import time

import httpx
import pytest
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.encoder.engine import EncoderEngine
from laya.server.app import ServerConfig, create_app
from laya.server.batcher import DrainRate
from laya.server.serve import ModelSpec, ServeOptions, load_engine

URGENT = {"type": "noul", "instructions": "Urgent?"}
ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None}}


async def fire(url: str, bodies: list, timeout: float = 30) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await asyncio.gather(*(client.post(url + "/v1/systemone", json=b) for b in bodies))


def test_requests_past_the_concurrency_limit_are_shed_at_the_door_without_reading_the_body():
    engine = ScriptedEngine(delay=0.4)
    config = ServerConfig(max_concurrency=2, shed_hold_ms=0, max_wait_ms=1)
    with LiveServer(create_app(lambda: [engine], config)) as live:
        async def scenario():
            async with httpx.AsyncClient(timeout=30) as client:
                inside = [asyncio.ensure_future(client.post(live.url + "/v1/systemone",
                                                            json={"state": f"s{i}", "questions": {"u": URGENT}}))
                          for i in range(2)]
                await asyncio.sleep(0.15)
                # a body far past the cap: a 413 if it were read, a 429 at the door
                shed = await client.post(live.url + "/v1/systemone", content=b" " * (9 << 20),
                                         headers={"content-type": "application/json"})
                shed_done = [t.done() for t in inside]
                return shed, shed_done, await asyncio.gather(*inside)

        shed, inside_done_at_shed, inside = asyncio.run(scenario())
        metrics = httpx.get(live.url + "/metrics").text
    assert [r.status_code for r in inside] == [200, 200]
    # refused while the two inside were still running (no hold, no body read), not after them
    assert shed.status_code == 429 and inside_done_at_shed == [False, False]
    assert shed.json()["detail"]["error_type"] == "overloaded_error"
    assert 1 <= int(shed.headers["retry-after"]) <= 60 and shed.headers["x-typesafe-request-id"]
    assert 'laya_requests_total{route="/v1/systemone",status="429"} 1' in metrics


def test_a_shed_request_is_held_up_to_its_retry_after():
    engine = ScriptedEngine(delay=0.6)
    config = ServerConfig(max_concurrency=1, shed_hold_ms=300, max_wait_ms=1)
    with LiveServer(create_app(lambda: [engine], config)) as live:
        async def scenario():
            async with httpx.AsyncClient(timeout=30) as client:
                first = asyncio.ensure_future(client.post(live.url + "/v1/systemone",
                                                          json={"state": "a", "questions": {"u": URGENT}}))
                await asyncio.sleep(0.1)
                started = time.perf_counter()
                shed = await client.post(live.url + "/v1/systemone", json={"state": "b", "questions": {"u": URGENT}})
                return shed, time.perf_counter() - started, await first

        shed, seconds, first = asyncio.run(scenario())
    assert first.status_code == 200 and shed.status_code == 429 and seconds >= 0.28


def test_retry_after_follows_the_drain_rate():
    rate = DrainRate()
    assert rate.seconds_for(100) == 1  # nothing measured yet
    rate.add(10, 1.0)  # 10 rows a second
    assert rate.seconds_for(100) == 10 and rate.seconds_for(5) == 1 and rate.seconds_for(10_000) == 60


def test_the_queue_budget_sheds_while_queued_work_is_too_slow_to_drain():
    engine = ScriptedEngine(delay=0.2)
    config = ServerConfig(max_concurrency=100, max_queue_ms=300, shed_hold_ms=0, max_wait_ms=1, max_batch_rows=1)
    with LiveServer(create_app(lambda: [engine], config)) as live:
        asyncio.run(fire(live.url, [{"state": "warm", "questions": {"u": URGENT}}]))  # measures the rate: 5/s
        responses = asyncio.run(fire(live.url, [{"state": f"s{i}", "questions": {"u": URGENT}} for i in range(12)]))
    codes = [r.status_code for r in responses]
    assert codes.count(200) >= 2 and codes.count(429) >= 4, codes
    assert all(r.status_code in (200, 429) for r in responses)


@pytest.fixture(scope="module")
def remote_live(checkpoint_dir):
    from laya.server.remote import RemoteEngine

    # the runtime of the in-process `model` it is compared with bit for bit
    engine = RemoteEngine(functools.partial(load_engine, ModelSpec(str(checkpoint_dir), name="remote"),
                                            ServeOptions(runtime="torch")))
    with LiveServer(create_app(lambda: [engine], ServerConfig(max_wait_ms=20))) as live:
        yield live
    engine.close()


def test_an_engine_in_its_own_process_answers_bit_for_bit(remote_live, model):
    states = [f"customer {i}: charged twice" + " please" * i for i in range(6)]
    responses = asyncio.run(fire(remote_live.url, [{"state": s, "questions": {"t": ROUTE, "u": URGENT}}
                                                   for s in states]))
    for state, r in zip(states, responses):
        assert r.status_code == 200, r.text
        want = model.predict(state, {"t": ROUTE, "u": URGENT})
        assert r.json()["answers"] == want["answers"] and r.json()["model"] == "remote"
    assert httpx.get(remote_live.url + "/health").json()["models"]["remote"]["instance"]


def test_refusals_cross_the_process_boundary_intact(remote_live):
    huge = {"state": "refund " * 70_000, "questions": {"u": URGENT}}  # past the System One token budget
    r = httpx.post(remote_live.url + "/v1/systemone", json=huge)
    assert r.status_code == 413 and r.json()["detail"]["error_type"] == "max_tokens_exceeded"
    long = {"states": ["refund " * 300] * 200, "questions": {q: URGENT for q in "uvwx"}}  # 800 rows of 256
    r = httpx.post(remote_live.url + "/v1/systemone/batch", json=long)
    assert r.status_code == 413 and r.json()["detail"]["x_limit"]["flag"] == "--max-request-tokens"


def test_an_engine_that_cannot_load_fails_in_the_parent(tmp_path):
    from laya.errors import LayaError
    from laya.server.remote import RemoteEngine

    with pytest.raises(LayaError, match="not a checkpoint folder|no such checkpoint"):
        RemoteEngine(functools.partial(load_engine, ModelSpec(str(tmp_path / "missing")), ServeOptions()))


def test_direct_encoder_engine_still_serves(model):
    with LiveServer(create_app(lambda: [EncoderEngine(model)])) as live:
        r = httpx.post(live.url + "/v1/systemone", json={"state": "x", "questions": {"u": URGENT}})
        assert r.status_code == 200


def test_an_exception_the_pipe_cannot_carry_becomes_a_remote_failure():
    from laya.errors import QuestionError
    from laya.server.engine_loop import RemoteFailure, portable

    class Local(Exception):  # defined in a function: pickle cannot find it
        pass

    carried = portable(Local("boom"))
    assert isinstance(carried, RemoteFailure) and "Local: boom" in str(carried)
    refusal = QuestionError("no", qid="q", error_type="invalid_question")
    assert portable(refusal) is refusal
