"""The engine process's side of a request: one round trip carries it (prepared, batched and run
there), an idle engine starts at once, what queued while it was busy runs together, a refusal comes
back as itself, and a request cancelled while it waits is never run."""

from __future__ import annotations

import asyncio
import functools

import pytest
from fake_engine import ScriptedEngine

from laya.errors import QuestionError
from laya.request import Request
from laya.server.batching import Batching
from laya.server.remote import RemoteEngine

URGENT = {"u": {"type": "noul", "instructions": "Urgent?"}}


@pytest.fixture(scope="module")
def slow_remote():
    """A scripted engine taking 0.25 s a state, in a process of its own."""
    engine = RemoteEngine(functools.partial(ScriptedEngine, name="slow", delay=0.25))
    yield engine
    engine.close()


def test_prepare_only_packs_the_request(slow_remote):
    job = slow_remote.prepare(Request.of(["crash"], URGENT))  # the engine there would refuse it while preparing
    assert job.n_rows == 1 and job.token == 0 and job.link is None  # nothing was sent yet
    with pytest.raises(KeyError, match="an unexpected bug"):
        asyncio.run(slow_remote.submit(job))


def test_an_idle_engine_starts_at_once_and_what_queued_meanwhile_runs_together(slow_remote):
    async def scenario():
        first = asyncio.ensure_future(slow_remote.submit(slow_remote.prepare(Request.of(["first"], URGENT))))
        await asyncio.sleep(0.1)  # the first is running: these three queue behind it
        later = [asyncio.ensure_future(slow_remote.submit(slow_remote.prepare(Request.of([s], URGENT)))) for s in "abc"]
        return await first, await asyncio.gather(*later)

    (results, timing), later = asyncio.run(scenario())
    assert results[0].answers["u"].value == 0.5 and results[0].to_json()["answers"]["u"]["noul"] == 0.5
    assert timing.batch_jobs == 1 and timing.queue_ms < 100  # it waited for no company
    assert {t.batch_jobs for _, t in later} == {3}  # one forward pass (here: one execute) for the three
    assert sum(t.leads_batch for _, t in later) == 1  # the batch is counted once
    assert all(t.queue_ms > 50 for _, t in later)  # they waited for the first to finish


def test_the_engine_process_holds_a_batch_to_max_batch_tokens():
    """What queued while the engine was busy runs together up to `--max-batch-tokens` as well as rows:
    three requests of 10 tokens under a budget of 20 run as two and one."""
    engine = RemoteEngine(functools.partial(ScriptedEngine, name="tokens", delay=0.25),
                          batching=Batching(max_tokens=20))
    try:
        async def scenario():
            first = asyncio.ensure_future(engine.submit(engine.prepare(Request.of(["first"], URGENT))))
            await asyncio.sleep(0.1)
            later = [asyncio.ensure_future(engine.submit(engine.prepare(Request.of([s], URGENT)))) for s in "abc"]
            return await first, await asyncio.gather(*later)

        _, later = asyncio.run(scenario())
    finally:
        engine.close()
    assert sorted(t.batch_jobs for _, t in later) == [1, 2, 2]


def test_laya_serve_gives_its_engine_processes_the_batch_bounds_it_was_given(monkeypatch):
    """`--max-batch-tokens` (with `--max-batch-rows` and `--max-wait-ms`) reaches the engine process, where
    the default `laya serve` batches (its HTTP side passes every job through)."""
    from laya.cli import main
    from laya.server import remote
    from laya.server import serve as serving

    made: dict = {}
    monkeypatch.delenv("LAYA_API_KEY", raising=False)
    monkeypatch.setattr(remote, "RemoteEngine", lambda load, batching: made.update(batching=batching))
    monkeypatch.setattr(serving, "serve", lambda options, **kw: serving.serve_engine(options.models[0], options))
    assert main(["serve", "-m", "enc=nowhere", "--max-batch-tokens", "512", "--max-batch-rows", "32",
                 "--max-wait-ms", "2"]) == 0
    assert made["batching"] == Batching(max_rows=32, max_wait_ms=2.0, max_tokens=512)


def test_a_refusal_found_while_running_comes_back_as_itself(slow_remote):
    with pytest.raises(QuestionError, match="refused while running"):
        asyncio.run(slow_remote.submit(slow_remote.prepare(Request.of(["refuse"], URGENT))))


def test_a_request_cancelled_while_it_waits_is_not_run(slow_remote):
    async def scenario():
        first = asyncio.ensure_future(slow_remote.submit(slow_remote.prepare(Request.of(["first"], URGENT))))
        await asyncio.sleep(0.1)
        waiting = slow_remote.prepare(Request.of(["second"], URGENT))
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
            first = asyncio.ensure_future(engine.submit(engine.prepare(Request.of(["a"], URGENT))))
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(engine.submit(engine.prepare(Request.of(["b"], URGENT))))
            return await first, await second

        (_, one), (_, two) = asyncio.run(scenario())
        assert one.batch_jobs == two.batch_jobs == 2
    finally:
        engine.close()


def test_a_request_cancelled_while_it_runs_stops_there(slow_remote):
    """The cancel is read between states (forward passes) while the engine process runs it, with no
    thread there to read a message: it is on the board the HTTP side writes."""
    async def scenario():
        job = slow_remote.prepare(Request.of([f"s{i}" for i in range(10)], URGENT))  # 10 x 0.25 s
        running = asyncio.ensure_future(slow_remote.submit(job))
        await asyncio.sleep(0.4)
        job.cancelled.set()
        return await running

    results, timing = asyncio.run(scenario())
    assert results == [] and timing.inference_ms < 1500  # stopped after 2 or 3 states of 10
    answered, _ = asyncio.run(slow_remote.submit(slow_remote.prepare(Request.of(["next"], URGENT))))
    assert list(answered[0].answers) == ["u"]


def test_question_sets_kept_in_slots_answer_as_asked_past_every_slot():
    """From the pipe's loop a question set the engine process holds goes as its slot number; past
    QUESTION_SLOTS sets the least recently used slot is given again, and each answer is still that of
    the questions asked (the scripted engine answers by their ids)."""
    from laya.questions import parse_questions
    from laya.server.remote import QUESTION_SLOTS

    engine = RemoteEngine(functools.partial(ScriptedEngine, name="slots"))
    loop = asyncio.new_event_loop()
    engine.serve_on(loop)
    sent = []
    pipe = engine._link.pipe
    send = pipe.send
    pipe.send = lambda message: (sent.append(message[2][1]), send(message))[1]
    try:
        n = QUESTION_SLOTS + 40
        order = [*range(n), *range(50), *range(n - 50, n), 0, 0, 90, n, 90]
        for i in order:
            questions = parse_questions({f"q{i}": {"type": "noul"}, "u": URGENT["u"]})  # a fresh copy each time
            results, _ = loop.run_until_complete(engine.submit(engine.prepare(Request.of([f"s{i}"], questions))))
            assert list(results[0].answers) == [f"q{i}", "u"], i
        kinds = ["slot" if isinstance(q, int) else "kept" for q in sent]
        # the first n are new; 0..49 were pushed out by the last 40 and then each other (least recently
        # used first), so they come again; the last 50 and the repeated 0 are held; 90, the oldest
        # there, asked once more, is then not the one a new set pushes out
        assert kinds == ["kept"] * n + ["kept"] * 50 + ["slot"] * 50 + ["slot"] * 2 + ["slot", "kept", "slot"]
        assert len(engine._link.known) == QUESTION_SLOTS
    finally:
        engine.close()
        loop.close()


def test_large_requests_prepared_aside_and_small_ones_between_them_are_all_answered():
    """A request of long states is prepared on the engine process's preparing thread, which wakes the
    main thread when it is done; small ones are prepared where they are read. Mixed and concurrent,
    every one is answered (a missed wake-up would leave one waiting for ever), each with its own states."""
    from laya.server.engine_loop import SMALL_PREPARE_CHARS

    engine = RemoteEngine(functools.partial(ScriptedEngine, name="aside", delay=0.01))
    loop = asyncio.new_event_loop()
    engine.serve_on(loop)
    long = "x" * (SMALL_PREPARE_CHARS + 1)

    async def scenario():
        jobs = [engine.prepare(Request.of([long] * (1 + i % 3) if i % 2 else [f"s{i}"], URGENT)) for i in range(12)]
        return await asyncio.wait_for(asyncio.gather(*(engine.submit(job) for job in jobs)), 30)

    try:
        for _ in range(3):
            answered = loop.run_until_complete(scenario())
            assert [len(results) for results, _ in answered] == [1 + i % 3 if i % 2 else 1 for i in range(12)]
    finally:
        engine.close()
        loop.close()


def test_a_slot_holds_its_limits_too():
    """The questions and the limits they were asked under travel as one slot: the same questions
    under other limits take a slot of their own, so each request is held to its own limits (a plan's
    are four times the server's) whatever was asked before it."""
    from laya.limits import LimitExceeded, Limits
    from laya.questions import parse_questions
    from laya.request import DEFAULT_OPTIONS

    engine = RemoteEngine(functools.partial(ScriptedEngine, name="limits"))
    loop = asyncio.new_event_loop()
    engine.serve_on(loop)
    tight, loose = Limits(max_rows=1), Limits()
    questions = parse_questions({"a": {"type": "noul"}, **URGENT})  # two rows a state

    def ask(limits: Limits) -> str:
        job = engine.prepare(Request.of(["state"], parse_questions({"a": {"type": "noul"}, **URGENT})), limits=limits)
        try:
            loop.run_until_complete(engine.submit(job))
        except LimitExceeded:
            return "refused"
        return "answered"

    try:
        assert [ask(lim) for lim in (loose, tight, loose, tight, loose)] == \
            ["answered", "refused", "answered", "refused", "answered"]
        kept = [(tuple(questions), DEFAULT_OPTIONS, tight), (tuple(questions), DEFAULT_OPTIONS, loose)]
        assert list(engine._link.known) == kept  # loose asked last
    finally:
        engine.close()
        loop.close()


def test_every_question_type_crosses_kept_then_by_slot():
    """A score question's levels (a dict) do not stop its set from keying a slot: each type crosses
    whole the first time and as a slot number after (it crashed the hop with a TypeError once)."""
    from laya.questions import parse_questions

    engine = RemoteEngine(functools.partial(ScriptedEngine, name="types"))
    loop = asyncio.new_event_loop()
    engine.serve_on(loop)
    try:
        spec = {"c": {"type": "choice", "instructions": "Which team?", "criteria": {"a": "billing", "b": "sales"}},
                "s": {"type": "score", "instructions": "How bad?", "criteria": ["fine", "bad", {"x": "worse"}]},
                "u": URGENT["u"]}
        for _ in range(2):
            questions = parse_questions(spec)
            results, _ = loop.run_until_complete(engine.submit(engine.prepare(Request.of(["state"], questions))))
            assert list(results[0].answers) == ["c", "s", "u"]
        assert list(engine._link.known.values()) == [0]  # one set, one slot, asked twice
    finally:
        engine.close()
        loop.close()
