"""The app over an engine that batches where it runs (a Ray Serve deployment): each job is sent on at
once, side by side; admission still counts rows; a model with no replica answering is a 503 with
Retry-After, a failure a 500 with a body, a refusal keeps its status; every reservation is given back."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.engine import Timing
from laya.server.app import ServerConfig, create_app
from laya.server.batcher import Unavailable

URGENT = {"type": "noul", "instructions": "Urgent?"}


class RemoteBatching(ScriptedEngine):
    """The scripted engine behind an async `submit` (a `ForwardingEngine`), as RayEngine is: `gone` plays
    no replica alive."""

    def __init__(self, delay: float):
        super().__init__(name="remote", delay=delay)
        self.in_flight = self.most_in_flight = 0

    def serve_on(self, loop):
        """(Its replies come to whichever loop awaits them.)"""

    async def submit(self, job):
        if "gone" in job.states:
            raise Unavailable("no replica of remote answered within 1 s", 7)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            results = await asyncio.to_thread(self.execute, [job])
        finally:
            self.in_flight -= 1
        return results[0], Timing(inference_ms=self.delay * 1000, batch_rows=job.n_rows, batch_jobs=1)


@pytest.fixture(scope="module")
def remote():
    engine = RemoteBatching(delay=0.3)
    app = create_app(lambda: [engine], ServerConfig(max_pending_rows=8))
    with LiveServer(app) as live:
        live.engine, live.app = engine, app
        yield live


def post(server, state, timeout=30):
    return httpx.post(server.url + "/v1/systemone", json={"state": state, "questions": {"u": URGENT}},
                      timeout=timeout)


def test_jobs_go_on_side_by_side_and_the_rows_are_given_back(remote):
    async def many():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*[client.post(remote.url + "/v1/systemone", json={
                "state": f"s{i}", "questions": {"u": URGENT}}) for i in range(4)])

    replies = asyncio.run(many())
    assert [r.status_code for r in replies] == [200] * 4
    assert remote.engine.most_in_flight == 4  # not one batch at a time as the in-process batcher runs them
    assert remote.app.state.served.batchers["remote"].pending_rows == 0


def test_no_replica_is_a_503_with_retry_after_a_failure_a_500_a_refusal_its_own_status(remote):
    gone = post(remote, "gone")
    assert gone.status_code == 503 and gone.headers["retry-after"] == "7"
    detail = gone.json()["detail"]
    assert detail["error_type"] == "overloaded_error" and "no replica" in detail["message"]
    boom = post(remote, "boom")
    assert boom.status_code == 500 and boom.json()["detail"]["error_type"] == "internal_error"
    assert post(remote, "refuse").status_code == 422
    assert post(remote, "fine").status_code == 200
    assert remote.app.state.served.batchers["remote"].pending_rows == 0
