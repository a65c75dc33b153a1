"""The HTTP side's end of an engine process's pipe (laya.server.pipe): whole messages both ways in
`multiprocessing.Connection`'s framing, however large; a send never blocks the loop, whatever the
far end has not read waits here; the far end's close (or a torn stream) ends it once; its reading
moves from one loop to another with nothing lost."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading

import pytest

from laya.server.pipe import Pipe, framed, pickled


class Near:
    """A pipe on a loop of its own thread, recording what it is told and on which thread."""

    def __init__(self):
        self.near, self.far = multiprocessing.Pipe(duplex=True)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.got: list = []
        self.threads: set[str] = set()
        self.ends = 0
        self.arrived = threading.Event()
        self.pipe = Pipe(self.near, self.loop, self.message, self.end)

    def message(self, message) -> None:
        self.got.append(message)
        self.threads.add(threading.current_thread().name)
        self.arrived.set()

    def end(self) -> None:
        self.ends += 1
        self.arrived.set()

    def close(self) -> None:
        self.pipe.close()
        self.far.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def near():
    side = Near()
    yield side
    side.close()


def wait_for(condition, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("timed out")


def test_messages_of_any_size_cross_whole_both_ways(near):
    big = bytes(range(256)) * (8 * 4096)  # 8 MiB: many reads and writes each way
    for message in (("ok", 1, "small"), ("ok", 2, big), ("ok", 3, {"nested": [big[:1000], 7]})):
        near.far.send(message)
    wait_for(lambda: len(near.got) == 3)
    assert near.got == [("ok", 1, "small"), ("ok", 2, big), ("ok", 3, {"nested": [big[:1000], 7]})]
    near.pipe.send(("run", 4, big))  # from a thread that is not the loop's
    assert near.far.recv() == ("run", 4, big)


def test_a_message_is_the_bytes_connection_send_writes():
    """Either end pickles with plain `pickle` (`pickled`), not `Connection.send`'s ForkingPickler: the
    same bytes for what crosses (typed answers, timings, refusals), framed the same way."""
    from multiprocessing.reduction import ForkingPickler

    from laya.errors import QuestionError
    from laya.response import Answer, SystemOneResponse
    from laya.server.batcher import Timing

    answer = Answer("choice", "a", {"a": 0.75, "b": 0.25}, 0.5, extras={"x_act_probability": 0.1})
    reply = ("ok", 7, ([SystemOneResponse("m", {"q": answer}, 12, {"rows": 1})], Timing(0.1, 3.2, 2, 1, True)))
    refusal = ("err", 8, QuestionError("too long", qid="q", error_type="question_too_long"))
    for message in (reply, refusal, ("run", 9, (["a state"], 3, 1.5, {"tournament": None}, 12.0))):
        assert pickled(message) == ForkingPickler.dumps(message)
        near, far = multiprocessing.Pipe(duplex=True)
        near.send_bytes(pickled(message))
        assert repr(far.recv()) == repr(message)
        os.write(near.fileno(), framed(message))  # the frame as the HTTP side writes it on its socket
        assert repr(far.recv()) == repr(message)
        near.close()
        far.close()


def test_a_send_the_far_end_does_not_read_waits_here_not_in_the_loop(near):
    big = b"x" * (32 << 20)  # far more than the socket holds
    sent = asyncio.run_coroutine_threadsafe(_send_then_tick(near.pipe, big), near.loop).result(30)
    assert sent == "the loop went on"  # the send returned and the loop ran other work, unread
    assert near.far.recv() == ("run", 1, big) and near.far.recv() == ("run", 2, "after")


async def _send_then_tick(pipe: Pipe, big: bytes) -> str:
    pipe.send(("run", 1, big))
    pipe.send(("run", 2, "after"))  # queued behind the first, in order
    await asyncio.sleep(0)
    return "the loop went on"


def test_the_far_end_closing_ends_it_once(near):
    near.far.send(("ok", 1, "last"))
    near.far.close()
    wait_for(lambda: near.ends == 1)
    assert near.got == [("ok", 1, "last")] and near.pipe.ended
    near.pipe.send(("run", 2, "nobody reads"))  # dropped, not raised: the end already told everyone
    threading.Event().wait(0.05)
    assert near.ends == 1


def test_a_torn_stream_ends_it(near):
    near.far.send_bytes(b"not a pickle")
    wait_for(lambda: near.ends == 1)
    assert near.got == []


def test_reading_moves_to_another_loop_with_nothing_lost(near):
    near.far.send(("ok", 1, "before"))
    wait_for(lambda: len(near.got) == 1)
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, name="the-other-loop", daemon=True)
    thread.start()
    try:
        near.threads.clear()
        near.pipe.move_to(other)
        near.far.send(("ok", 2, "after"))
        wait_for(lambda: len(near.got) == 2)
        assert near.got[1] == ("ok", 2, "after") and near.threads == {"the-other-loop"}
        near.pipe.send(("run", 3, "from here"))
        assert near.far.recv() == ("run", 3, "from here")
    finally:
        near.pipe.move_to(near.loop)
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
        other.close()
