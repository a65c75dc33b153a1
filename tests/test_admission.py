"""The door and the queue count work in rows, not requests: `Admission` (laya/server/admission.py)
driven directly with a fixed drain rate, the micro-batcher's row reservation, and the app's wiring."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.engine import EngineInfo
from laya.server.admission import Admission
from laya.server.app import ServerConfig, create_app
from laya.server.batcher import MicroBatcher, Overloaded
from laya.server.batching import Batching

RATE = 100.0  # rows a second, as measured by the batchers


def door(rate: float | None = RATE, **kwargs) -> Admission:
    return Admission(kwargs.pop("limit", 64), lambda: 1, hold_s=0.0, rows_per_s=lambda: rate, **kwargs)


def requests_of(adm: Admission, rows: int, count: int = 200) -> Admission:
    for _ in range(count):
        adm.note_rows(rows)
    return adm


def enter_until_shed(adm: Admission, budget_s: float) -> int:
    n = 0
    while adm.try_enter(budget_s):
        n += 1
        assert n < 1000
    return n


def test_the_door_counts_the_rows_requests_bring():
    adm = requests_of(door(), 50)
    assert adm.rows_per_request == pytest.approx(50, rel=0.01)
    assert adm.queued_s() == 0.0
    assert adm.try_enter(1.2)  # alone
    assert adm.queued_s() == pytest.approx(0.5, rel=0.01)  # one 50-row request at 100 rows/s
    assert adm.queued_s(extra=1) == pytest.approx(1.0, rel=0.01)
    assert adm.try_enter(1.2)  # it would be answered after 1.0 s: within its 1.2 s deadline
    assert not adm.try_enter(1.2)  # 1.5 s behind the two inside: shed
    assert adm.inside == 2 and adm.queued_s() == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize(("rows", "admitted"), [(1, 125), (10, 12), (50, 2), (120, 1)])
def test_how_many_get_in_follows_the_request_size(rows, admitted):
    """Within a 1.25 s deadline at 100 rows/s the k-th newcomer (k inside) needs (k + 1) x rows / 100
    <= 1.25; a request alone always gets in."""
    adm = requests_of(door(limit=1000), rows)
    assert enter_until_shed(adm, 1.25) == admitted
    assert admitted == max(1, math.floor(1.25 * RATE / rows))


def test_the_mean_follows_a_mix_of_sizes():
    adm = door()
    for _ in range(200):
        adm.note_rows(10)
        adm.note_rows(90)
    assert adm.rows_per_request == pytest.approx(50, abs=2.5)
    adm = requests_of(adm, 4)  # the traffic changes: the door follows it
    assert adm.rows_per_request == pytest.approx(4, rel=0.01)


def test_the_operators_queue_bound_counts_rows_too():
    adm = requests_of(door(max_queue_s=0.6), 50)
    assert adm.try_enter() and adm.try_enter()  # 0.5 s inside when the second comes: within 0.6 s
    assert not adm.try_enter()  # 1.0 s inside: past the bound, whatever the deadline
    adm.leave()
    assert adm.try_enter()


def test_no_measured_rate_sheds_only_at_the_concurrency_limit():
    adm = requests_of(door(rate=None, limit=3), 500)
    assert adm.queued_s(extra=5) == 0.0
    assert enter_until_shed(adm, 0.001) == 3
    adm.leave()
    assert adm.try_enter(0.001) and adm.inside == 3


def test_a_request_alone_is_let_in_whatever_its_size_and_deadline():
    adm = requests_of(door(rate=1.0, max_queue_s=0.0), 1000)
    assert adm.try_enter(0.001)
    assert not adm.try_enter(math.inf)


class _Engine:
    info = EngineInfo("stub", "encoder", "", "")


@pytest.fixture
def batcher():
    b = MicroBatcher(_Engine(), max_pending_rows=100)
    yield b
    b._executor.shutdown(wait=False)


def test_the_queue_reserves_rows(batcher):
    batcher.reserve(60)
    batcher.drain.add(10, 1.0)  # 10 rows a second
    with pytest.raises(Overloaded) as refused:
        batcher.reserve(50)  # 110 rows > 100
    assert refused.value.retry_after == 6  # 60 rows at 10 rows/s
    assert batcher.pending_rows == 60
    batcher.reserve(40)  # exactly 100
    assert batcher.pending_rows == 100 and batcher.full
    with pytest.raises(Overloaded):
        batcher.reserve(1)
    batcher.release(60)
    assert batcher.pending_rows == 40 and not batcher.full
    batcher.resize(40, 55)  # a prepared job takes more rows than it reserved (a tournament)
    assert batcher.pending_rows == 55
    with pytest.raises(Overloaded):
        batcher.reserve(46)
    batcher.reserve(45)
    assert batcher.pending_rows == 100


def test_a_request_alone_is_reserved_whatever_its_rows(batcher):
    batcher.reserve(1000)
    assert batcher.pending_rows == 1000
    with pytest.raises(Overloaded):
        batcher.reserve(1)


URGENT = {"type": "noul", "instructions": "Urgent?"}


def test_the_app_tells_the_door_each_requests_rows():
    app = create_app(lambda: [ScriptedEngine()], ServerConfig(max_wait_ms=1))
    body = {"states": [f"s{i}" for i in range(4)], "questions": {f"q{j}": URGENT for j in range(3)}}
    with LiveServer(app) as live:
        for _ in range(30):
            assert httpx.post(live.url + "/v1/systemone/batch", json=body, timeout=30).status_code == 200
    assert 6 < app.state.admission.rows_per_request <= 12  # a running mean of 12-row requests, from 1


class _Gated:
    """An engine whose first forward pass waits for a gate: what queues meanwhile is seen batching."""

    info = EngineInfo("gated", "encoder", "", "")

    def __init__(self):
        import threading

        self.gate, self.started, self.batches = threading.Event(), threading.Event(), []

    def execute(self, jobs):
        self.batches.append(list(jobs))
        self.started.set()
        self.gate.wait(10)
        return [[{"job": job}] for job in jobs]


@pytest.mark.parametrize(("wait_ms", "batches"), [(None, [["a"], ["b", "c"]]), (200.0, [["a", "b"], ["c"]])])
def test_an_idle_engine_starts_at_once_and_batches_what_queued_while_it_ran(wait_ms, batches):
    """By default the worker never waits for company (a lone request pays no wait): the first job runs
    the moment it comes, and what comes while it runs shares the next forward pass. With max_wait_ms
    set, the first job waits that long for company instead."""
    engine = _Gated()

    async def scenario():
        b = MicroBatcher(engine) if wait_ms is None else MicroBatcher(engine, batching=Batching(max_wait_ms=wait_ms))
        b.start()
        try:
            first = asyncio.ensure_future(b.submit("a", 1))
            for _ in range(5):  # the worker takes "a" (and, waiting for none, sends it to the engine)
                await asyncio.sleep(0)
            second = asyncio.ensure_future(b.submit("b", 1))
            while not engine.started.is_set():
                await asyncio.sleep(0.001)
            third = asyncio.ensure_future(b.submit("c", 1))
            await asyncio.sleep(0.05)  # queued while the engine is busy
            engine.gate.set()
            return [await f for f in (first, second, third)]
        finally:
            await b.stop()

    results = asyncio.run(scenario())
    assert engine.batches == batches
    assert [timing.batch_jobs for _, timing in results] == [len(next(b for b in batches if job in b))
                                                           for job in "abc"]


@pytest.mark.parametrize("refuse", ["shed", "refuse_draining"])
def test_an_answer_at_the_door_says_its_length(refuse):
    """The door's 429 and 503 are written whole with their length, not chunked: a lean client (or a
    load balancer counting bytes) reads them as it reads any answer."""
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    asyncio.run(getattr(door(), refuse)(send, b"rid-1"))
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] in (429, 503) and headers[b"x-typesafe-request-id"] == b"rid-1"
    assert headers[b"content-length"] == b"%d" % len(body["body"]) and b"retry-after" in headers


@pytest.mark.parametrize("refuse", ["shed", "refuse_draining"])
def test_an_answer_at_the_door_without_a_client_id_gets_one_made_as_every_other(refuse):
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    asyncio.run(getattr(door(), refuse)(send, None))
    rid = dict(sent[0]["headers"])[b"x-typesafe-request-id"]
    assert len(rid) == 32 and int(rid, 16) >= 0


@pytest.mark.parametrize("refuse", ["shed", "refuse_draining"])
def test_the_door_echoes_a_long_client_id_cut_as_every_answer_does(refuse):
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    asyncio.run(getattr(door(), refuse)(send, b"r" * 300))
    assert dict(sent[0]["headers"])[b"x-typesafe-request-id"] == b"r" * 128


def test_plans_hold_a_share_of_the_door_of_their_own():
    adm = door(rate=None, limit=16)
    assert adm.plan_limit == 2
    assert adm.try_enter(plan=True) and adm.try_enter(plan=True)
    assert not adm.try_enter(plan=True)  # the plans' share is full
    assert all(adm.try_enter() for _ in range(14)) and not adm.try_enter()  # decisions keep the rest
    adm.leave(plan=True)
    assert adm.plans_inside == 1 and adm.try_enter(plan=True)  # its place in the share is free again
    assert not adm.try_enter(plan=True) and not adm.try_enter()  # the share and the door are full


def test_a_flood_of_large_plans_meets_429_while_decisions_keep_going(model):
    """Twelve clients planning large requests as fast as they can beside two steady decision clients:
    the plans meet 429 at the door, no decision does, and the decisions keep answering."""
    from live_server import SteadyLoad

    from laya.encoder.engine import EncoderEngine

    app = create_app(lambda: [EncoderEngine(model)], ServerConfig(max_concurrency=8))  # sheds held 1 s
    decision = {"state": "refund please", "questions": {"u": URGENT}}
    plan = {"states": ["refund " * 200] * 16, "questions": {f"q{i}": URGENT for i in range(8)}}
    with LiveServer(app) as live:
        with SteadyLoad(live.url, decision, clients=2, max_wait_s=0.05) as alone:
            import time

            time.sleep(2.0)
        with SteadyLoad(live.url, plan, clients=12, max_wait_s=0.05, path="/v1/systemone/plan") as plans, \
                SteadyLoad(live.url, decision, clients=2, max_wait_s=0.05) as beside:
            time.sleep(4.0)
    assert {o[1] for o in alone.outcomes} == {200}
    assert {o[1] for o in beside.outcomes} == {200}, sorted({str(o[1]) for o in beside.outcomes})
    statuses = [o[1] for o in plans.outcomes]
    assert statuses.count(429) > 0 and statuses.count(200) > 0, sorted(set(map(str, statuses)))
    rate_alone, rate_beside = len(alone.outcomes) / 2.0, len(beside.outcomes) / 4.0
    assert rate_beside >= 0.25 * rate_alone, (rate_alone, rate_beside)


class _Counted:
    def __init__(self, name: str, n_tokens: int):
        self.name, self.n_tokens = name, n_tokens

    def __repr__(self) -> str:
        return self.name


@pytest.mark.parametrize(("max_tokens", "batches"), [(None, [["a"], ["b", "c", "d"]]),
                                                     (300, [["a"], ["b", "c"], ["d"]])])
def test_a_batch_holds_a_token_budget_as_well_as_rows(max_tokens, batches):
    """With a token budget (`--max-batch-tokens`, for a GPU, which fills on tokens), jobs join a
    forward batch while it holds fewer tokens than the budget; without one, only rows bound it."""
    engine = _Gated()
    jobs = {name: _Counted(name, 200) for name in "abcd"}

    async def scenario():
        b = MicroBatcher(engine, batching=Batching(max_tokens=max_tokens))
        b.start()
        try:
            first = asyncio.ensure_future(b.submit(jobs["a"], 1))
            while not engine.started.is_set():
                await asyncio.sleep(0.001)
            rest = [asyncio.ensure_future(b.submit(jobs[n], 1)) for n in "bcd"]
            await asyncio.sleep(0.05)  # queued while the engine is busy
            engine.gate.set()
            return [await f for f in (first, *rest)]
        finally:
            await b.stop()

    asyncio.run(scenario())
    assert [[job.name for job in batch] for batch in engine.batches] == batches
