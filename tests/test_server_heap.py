"""The server freezes what loading left in its heap, so a request's garbage collection walks only
what requests made (a full collection over a loaded heap stalled a request by seconds), and gives it
back when it stops."""

from __future__ import annotations

import gc

import httpx
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.server.app import create_app


def test_the_loaded_heap_is_out_of_the_collectors_way_while_serving_and_given_back_after():
    held = [{"loaded": [i]} for i in range(200_000)]  # what a model's load leaves behind
    assert gc.get_freeze_count() == 0
    with LiveServer(create_app(lambda: [ScriptedEngine()])) as live:
        assert httpx.post(live.url + "/v1/systemone", json={"state": "s", "questions": {"u": {"type": "noul"}}}
                          ).status_code == 200
        frozen = gc.get_freeze_count()
        walked = len(gc.get_objects())  # what a full collection would walk now
        assert frozen >= 2 * len(held), frozen
        assert walked < len(held), walked
    assert gc.get_freeze_count() == 0
    assert len(gc.get_objects()) > 2 * len(held)
    del held
