"""One batching policy (`laya.server.batching`): `--max-batch-rows`, `--max-batch-tokens` and `--max-wait-ms`
mean the same in every mode. The same requests, queued in the same order while the engine is busy,
run in the same batches in this process (`laya serve --single-process`), in the engine process (the
default) and in a Ray replica, each built from the server's own settings."""

from __future__ import annotations

import asyncio
import functools

import pytest
from conftest import need
from fake_engine import ScriptedEngine

from laya.engine import Timing
from laya.limits import UNLIMITED
from laya.request import Request
from laya.server.batching import Batching
from laya.server.state import ServerConfig

URGENT = {"u": {"type": "noul", "instructions": "Urgent?"}}
BOTH = {**URGENT, "v": {"type": "noul", "instructions": "Angry?"}}
BUSY_S = 0.3  # the first request's forward pass, while the others queue
# after the first, requests of 1, 1, 2 and 1 rows (one short state each, so every mode prepares them in
# arrival order; ten tokens a row): how each policy batches them
LATER = [("a", URGENT), ("b", URGENT), ("c", BOTH), ("d", URGENT)]
CASES = [
    (dict(max_batch_rows=3), [3, 3, 3, 1]),  # rows only: a+b+c (4 rows: the last to join may go over), d
    (dict(max_batch_rows=3, max_batch_tokens=15), [2, 2, 1, 1]),  # a+b (20 tokens), c, d
    (dict(max_batch_rows=64, max_batch_tokens=35), [3, 3, 3, 1]),  # a+b+c (40 tokens), d
    (dict(max_batch_rows=2), [2, 2, 1, 1]),
]


def test_the_policy_takes_a_job_while_the_batch_is_under_both_budgets():
    policy = Batching(max_rows=4, max_tokens=100, max_wait_ms=5)
    assert policy.has_room(3, 99) and not policy.has_room(4, 0) and not policy.has_room(0, 100)
    assert Batching(max_rows=4).has_room(3, 10**9) and policy.wait_s == 0.005
    assert ServerConfig(max_batch_rows=8, max_batch_tokens=64, max_wait_ms=3).batching == Batching(8, 3, 64)


async def _queue_while_busy(submit) -> list[int]:
    """The first request, then `LATER` in order while it runs; each later request's batch size (jobs)."""
    first = asyncio.ensure_future(submit("first", URGENT))
    await asyncio.sleep(BUSY_S / 3)
    later = []
    for state, questions in LATER:
        later.append(asyncio.ensure_future(submit(state, questions)))
        await asyncio.sleep(0.01)  # arrival order is the queue's order
    await first
    return [timing.batch_jobs for _, timing in await asyncio.gather(*later)]


@pytest.mark.parametrize(("settings", "batches"), CASES)
def test_in_this_process(settings, batches):
    """`laya serve --single-process`: the batcher the server builds for an engine from its settings."""
    from laya.server.app import activate
    from laya.server.metrics import Metrics
    from laya.server.state import Served

    engine = ScriptedEngine(name="here", delay=BUSY_S)
    served = Served()

    async def scenario():
        activate([engine], served, Metrics(), ServerConfig(**settings))
        batcher = served.batchers["here"]

        async def submit(state, questions):
            job = engine.prepare(Request.of([state], questions))
            batcher.reserve(job.n_rows)
            return await batcher.submit(job, job.n_rows)

        try:
            return await _queue_while_busy(submit)
        finally:
            await batcher.stop()

    assert asyncio.run(scenario()) == batches


@pytest.mark.parametrize(("settings", "batches"), CASES)
def test_in_the_engine_process(settings, batches):
    """`laya serve` (the default): the engine process, given the server's settings as `serve_engine` gives them."""
    from laya.server.remote import RemoteEngine

    engine = RemoteEngine(functools.partial(ScriptedEngine, name="there", delay=BUSY_S),
                          batching=ServerConfig(**settings).batching)
    try:
        async def submit(state, questions):
            return await engine.submit(engine.prepare(Request.of([state], questions)))

        assert asyncio.run(_queue_while_busy(submit)) == batches
    finally:
        engine.close()


@pytest.mark.parametrize(("settings", "batches"), CASES)
def test_in_a_ray_replica(settings, batches, monkeypatch):
    """`laya serve --ray`: a replica built from the `ModelConfig` that `laya serve`'s settings make."""
    need("ray", "the [ray] extra is not installed")
    from laya.server import heap, ray_app
    from laya.server.serve import ModelSpec, ServeOptions

    monkeypatch.setattr(ray_app, "load_engine", lambda spec, options: ScriptedEngine(name="replica", delay=BUSY_S))
    options = ServeOptions(models=[ModelSpec.parse("replica=nowhere")], server=ServerConfig(**settings))
    (model,) = ray_app.from_options(options).models
    replica = ray_app.ModelReplica.func_or_class(model)  # freezes the heap, as a replica's own process should

    async def submit(state, questions):
        outcome = await replica.answer(Request.of([state], questions), UNLIMITED)
        assert outcome[0] == "ok", outcome
        return outcome[1], Timing(**outcome[2])

    try:
        assert asyncio.run(_queue_while_busy(submit)) == batches
    finally:
        heap.thaw()  # this process is the test run's: later tests count on a heap no server holds
