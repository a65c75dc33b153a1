"""The engine process's side of a request: one round trip carries it (prepared, batched and run
there), an idle engine starts at once, what queued while it was busy runs together, a refusal comes
back as itself, and a request cancelled while it waits is never run."""

from __future__ import annotations

import asyncio
import functools

import pytest
from fake_engine import ScriptedEngine

from laya.errors import QuestionError
from laya.server.remote import Batching, RemoteEngine

URGENT = {"u": {"type": "noul", "instructions": "Urgent?"}}


@pytest.fixture(scope="module")
def slow_remote():
    """A scripted engine taking 0.25 s a state, in a process of its own."""
    engine = RemoteEngine(functools.partial(ScriptedEngine, name="slow", delay=0.25))
    yield engine
    engine.close()


def test_prepare_only_packs_the_request(slow_remote):
    job = slow_remote.prepare(["crash"], URGENT)  # the engine there would refuse it while preparing
    assert slow_remote.rows(job) == 1 and job.token == 0 and job.link is None  # nothing was sent yet
    with pytest.raises(KeyError, match="an unexpected bug"):
        asyncio.run(slow_remote.submit(job))


def test_an_idle_engine_starts_at_once_and_what_queued_meanwhile_runs_together(slow_remote):
    async def scenario():
        first = asyncio.ensure_future(slow_remote.submit(slow_remote.prepare(["first"], URGENT)))
        await asyncio.sleep(0.1)  # the first is running: these three queue behind it
        later = [asyncio.ensure_future(slow_remote.submit(slow_remote.prepare([s], URGENT))) for s in "abc"]
        return await first, await asyncio.gather(*later)

    (results, timing), later = asyncio.run(scenario())
    assert results[0].answers["u"].value == 0.5 and results[0].to_json()["answers"]["u"]["noul"] == 0.5
    assert timing.batch_jobs == 1 and timing.queue_ms < 100  # it waited for no company
    assert {t.batch_jobs for _, t in later} == {3}  # one forward pass (here: one execute) for the three
    assert sum(t.leads_batch for _, t in later) == 1  # the batch is counted once
    assert all(t.queue_ms > 50 for _, t in later)  # they waited for the first to finish


def test_a_refusal_found_while_running_comes_back_as_itself(slow_remote):
    with pytest.raises(QuestionError, match="refused while running"):
        asyncio.run(slow_remote.submit(slow_remote.prepare(["refuse"], URGENT)))


def test_a_request_cancelled_while_it_waits_is_not_run(slow_remote):
    async def scenario():
        first = asyncio.ensure_future(slow_remote.submit(slow_remote.prepare(["first"], URGENT)))
        await asyncio.sleep(0.1)
        waiting = slow_remote.prepare(["second"], URGENT)
        second = asyncio.ensure_future(slow_remote.submit(waiting))
        await asyncio.sleep(0.05)  # it has reached the engine process and waits there
        waiting.cancelled.set()  # tells the engine process
        return await first, await second

    (_, first), (results, timing) = asyncio.run(scenario())
    assert results == [] and timing.batch_jobs == 0  # skipped where it waited: no execute ran for it


def test_max_wait_makes_an_idle_engine_wait_for_company():
    engine = RemoteEngine(functools.partial(ScriptedEngine, name="patient"), batching=Batching(max_wait_ms=300))
    try:
        async def scenario():
            first = asyncio.ensure_future(engine.submit(engine.prepare(["a"], URGENT)))
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(engine.submit(engine.prepare(["b"], URGENT)))
            return await first, await second

        (_, one), (_, two) = asyncio.run(scenario())
        assert one.batch_jobs == two.batch_jobs == 2
    finally:
        engine.close()
