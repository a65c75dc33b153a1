"""A request's default deadline follows the work it asks for (issue 64): the server's
--request-timeout-s is a floor, and a request whose rows or prompt tokens need longer at the model's
measured speed gets that long; the engine process's watchdog allows it the same. The 255-option
choice over a state as long as the model reads, through `laya serve` with its default settings, is
answered on both engines."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import load_quiet, smollm2
from fake_engine import ScriptedEngine
from live_server import LiveServer, free_port, wait_ready

from laya.encoder.engine import EncoderEngine
from laya.limits import Limits
from laya.request import Request, Scan
from laya.server.app import TIMEOUT_HEADER, ServerConfig, create_app
from laya.server.remote import RemoteEngine, RestartPolicy
from laya.server.work import WORK_FACTOR, decide_tokens, encoder_rows, work_s
from laya.testing import checkpoints as testgen

URGENT = {"type": "noul", "instructions": "Urgent?"}
ROOT = Path(__file__).resolve().parent.parent


def teams(n: int = 255) -> dict:
    return {"type": "choice", "instructions": "Which team should take it?", "criteria": [f"team {i}" for i in range(n)]}


def request(states: list, questions: dict, **options) -> Request:
    return Request.of(states, questions, **options)


# ---------------------------------------------------------------------------------------------- the bound


def test_the_encoder_bound_counts_every_row_a_tournament_an_order_or_a_scan_may_take():
    limits = Limits()
    assert encoder_rows(request(["s"], {"q": teams()}), 1024, limits) == 17  # 16 groups and the final row
    assert encoder_rows(request(["s"], {"q": teams(), "u": URGENT}), 1024, limits) == 18
    assert encoder_rows(request(["s", "t"], {"q": teams(16)}), 1024, limits) == 2  # one row each: no tournament
    assert encoder_rows(request(["s"], {"q": teams(20)}, tournament=4), 1024, limits) == 8  # 5 groups, 2, final
    assert encoder_rows(request(["s"], {"q": teams()}, order="both"), 1024, limits) == 34
    scanned = encoder_rows(request(["x" * 1600], {"u": URGENT}, overflow=Scan()), 1024, limits)
    assert scanned == 101  # at most a window every 16 tokens, a token at most a byte
    assert encoder_rows(request(["s"] * 256, {"q": teams()}), 1024, limits) == limits.max_rows  # refused past it


def test_the_bound_holds_what_the_model_plans(tmp_path_factory):
    """Never below the rows the encoder's own plan counts for the same request."""
    spec = testgen.TestCheckpointSpec(flavour="mmbert", max_len=1024, head_max_len=256, seed=5)
    engine = EncoderEngine(load_quiet(testgen.write_test_checkpoint(tmp_path_factory.mktemp("ck") / "w", spec)))
    long_state = " ".join(["parcel"] * 3000)
    for req in (request([long_state], {"q": teams()}), request(["short"], {"q": teams(), "u": URGENT}),
                request([long_state], {"q": teams(40)}, order="both"),
                request([long_state], {"u": URGENT}, overflow=Scan())):
        planned = engine.plan(req)
        assert planned["refused"] is None
        assert encoder_rows(req, 1024, Limits()) >= planned["rows"] > 0, planned["rows"]


def test_the_decide_bound_holds_what_the_model_plans():
    """Never below the prompt tokens SmolLM2's plan counts: one prompt, and a tournament the context forces."""
    from laya.decide.engine import DecideEngine
    from laya.decide.llama import open_gguf

    engine = DecideEngine(open_gguf(smollm2(), n_ctx=2048))
    text = (ROOT / "laya" / "testing" / "corpus.txt").read_text(encoding="utf-8")
    for req in (request([text[:1000]], {"q": teams(), "u": URGENT}),
                request([(text * 3)[:5000]], {"q": teams()})):
        planned = engine.plan(req)
        assert planned["refused"] is None, planned["refused"]
        assert decide_tokens(req, 2048, Limits()) >= planned["input_tokens"] > 0


def test_the_longest_one_prompt_state_leaves_room_for_the_answer_tokens():
    """A prompt that fits the context while the collision tree's answer tokens after it do not was planned
    as one decision and failed inside llama.cpp (a 500): it is a tournament (or a 413) now."""
    from laya.decide.engine import DecideEngine
    from laya.decide.llama import open_gguf

    engine = DecideEngine(open_gguf(smollm2(), n_ctx=512))
    question = {"q": teams(20)}  # "team 0" ... "team 19": every label starts with the same token

    def state(n: int) -> str:
        return " ".join(["parcel"] * n)

    def whole(n: int) -> bool:
        plan = engine.plan(request([state(n)], question))
        return plan["refused"] is None and plan["states"][0]["decisions"] == 1

    low, high = 1, 1024
    while low + 1 < high:
        mid = (low + high) // 2
        low, high = (mid, high) if whole(mid) else (low, mid)
    for n in (low, high):  # the longest one-prompt state, and one word more
        answer = engine.model.predict(state(n), question)["answers"]["q"]
        assert len(answer["probabilities"]) == 20


def test_no_measured_speed_no_allowance():
    req = request(["s"], {"q": teams()})
    assert work_s(req, None, Limits()) == 0.0
    assert work_s(req, {"row_s": 0.5, "max_len": 1024}, Limits()) == pytest.approx(WORK_FACTOR * 17 * 0.5)
    tokens = decide_tokens(req, 8192, Limits())
    assert work_s(req, {"token_s": 0.001, "n_ctx": 8192}, Limits()) == pytest.approx(WORK_FACTOR * tokens * 0.001)


# ------------------------------------------------------------------------------------------- the deadline


class TimedEngine(ScriptedEngine):
    """The scripted engine with a measured speed: `row_s` seconds a row (its `delay` a state)."""

    def __init__(self, name: str = "timed", delay: float = 0.0, row_s: float = 0.0):
        super().__init__(name=name, delay=delay)
        self.row_s = row_s

    def describe(self) -> dict:
        return {"kind": "scripted", "speed": {"row_s": self.row_s, "max_len": 512}}


def batch(url: str, n: int, **kwargs) -> httpx.Response:
    return httpx.post(url + "/v1/systemone/batch", json={"states": [f"s{i}" for i in range(n)],
                                                         "questions": {"u": URGENT}}, timeout=60, **kwargs)


def test_a_request_gets_the_time_its_work_needs_past_the_servers_deadline():
    engine = TimedEngine(delay=0.15, row_s=0.15)  # 8 states: 1.2 s of work, 4.8 s allowed
    with LiveServer(create_app(lambda: [engine], ServerConfig(max_wait_ms=1, request_timeout_s=0.5))) as live:
        r = batch(live.url, 8)
        assert r.status_code == 200, r.text
        assert len(r.json()["results"]) == 8
        # a client's own deadline holds, however much work it asks for
        r = batch(live.url, 8, headers={TIMEOUT_HEADER: "0.4"})
        assert r.status_code == 504 and TIMEOUT_HEADER in r.json()["detail"]["message"]
    fixed = ServerConfig(max_wait_ms=1, request_timeout_s=0.5, deadline_follows_work=False)
    with LiveServer(create_app(lambda: [engine], fixed)) as live:  # laya serve --fixed-deadline
        r = batch(live.url, 8)
        assert r.status_code == 504 and "--request-timeout-s" in r.json()["detail"]["message"]


def test_the_504_past_a_work_deadline_names_the_work():
    engine = TimedEngine(delay=0.5, row_s=0.01)  # 8 states: 4 s of work, measured as 0.08 s
    with LiveServer(create_app(lambda: [engine], ServerConfig(max_wait_ms=1, request_timeout_s=0.2))) as live:
        started = time.monotonic()
        r = batch(live.url, 8)
        assert r.status_code == 504, r.text
        message = r.json()["detail"]["message"]
        assert "deadline of 1 s" in message and "up to 8 rows" in message, message
        assert "--request-timeout-s of 0.2 s" in message
        assert time.monotonic() - started < 3.0  # stopped at the work's deadline, not when the work ended


def test_the_engine_process_watchdog_allows_the_work_its_deadline_does():
    """A job that keeps its engine process silent (and working: spending CPU) longer than the watchdog's
    own silence bound, within what its work may take at the measured speed, is answered, not killed."""
    policy = RestartPolicy(hang_min_s=0.5, hang_factor=1.0)
    remote = RemoteEngine(functools.partial(TimedEngine, name="remote", row_s=0.3), policy=policy)
    try:
        with LiveServer(create_app(lambda: [remote], ServerConfig(max_wait_ms=1))) as live:
            r = httpx.post(live.url + "/v1/systemone/batch", timeout=60,  # 1.8 s of CPU, 7.2 s allowed
                           json={"states": ["spin:0.3"] * 6, "questions": {"u": URGENT}})
            assert r.status_code == 200, r.text
            assert remote.restarts == 0
    finally:
        remote.close()


# ---------------------------------------------------------------------------- through `laya serve`, 255 options

# Large enough that its 17 full rows keep two cores busy for tens of seconds (past the old 10 s watchdog)
ENCODER_SPEC = testgen.TestCheckpointSpec(flavour="mmbert", hidden_size=512, num_layers=16, num_heads=8,
                                          intermediate_size=768, local_attention=128, max_len=1024, head_max_len=256,
                                          seed=3)


def serve(model: list[str], log) -> tuple[subprocess.Popen, str]:
    """`laya serve --model MODEL` with every server setting its default."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "laya.cli", "serve", "--model", *model, "--port", str(port)],
                               env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, seconds=600)
    except BaseException:
        stop(process)
        raise
    return process, url


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def longest_state(url: str, text: str, question: dict) -> str:
    """The longest state (in words of `text`) a chat model reads with `question` in one prompt: its
    context all but full (a longer one plays the choice as a tournament of groups, or is refused)."""
    words = text.split()

    def state(n: int) -> str:
        return " ".join((words * (1 + n // len(words)))[:n])

    def whole(n: int) -> bool:
        plan = httpx.post(url + "/v1/systemone/plan", json={"state": state(n), "questions": {"q": question}},
                          timeout=120).json()
        return plan["refused"] is None and plan["states"][0]["decisions"] == 1

    low, high = 1, 64
    while whole(high):
        low, high = high, high * 2
    while low + 1 < high:
        mid = (low + high) // 2
        low, high = (mid, high) if whole(mid) else (low, mid)
    return state(low)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["encoder", "decide"])
def test_255_options_over_the_longest_state_through_laya_serve(engine, tmp_path):
    """The System One MUST (2 to 255 options) with the longest state the model reads, default settings:
    a 200 on a 2-core machine, however long its work takes there."""
    if engine == "encoder":  # the reference runtime, as the issue served it (auto's first-load timing aside)
        model = [str(testgen.write_test_checkpoint(tmp_path / "mmbert-mid", ENCODER_SPEC)), "--runtime", "torch"]
    else:
        model = [smollm2()]
    with (tmp_path / "serve.log").open("w") as log:
        _ask_255_options(engine, *serve(model, log))


def _ask_255_options(engine: str, process: subprocess.Popen, url: str) -> None:
    try:
        text = (ROOT / "laya" / "testing" / "corpus.txt").read_text(encoding="utf-8")
        question = teams()
        state = longest_state(url, text, question) if engine == "decide" else " ".join(text.split() * 8)
        r = httpx.post(url + "/v1/systemone", json={"state": state, "questions": {"q": question}}, timeout=900)
        assert r.status_code == 200, r.text
        answer = r.json()["answers"]["q"]
        assert list(answer["probabilities"]) == list(question["criteria"])  # every option, in the request's order
        assert sum(answer["probabilities"].values()) == pytest.approx(1.0)
        if engine == "encoder":  # the state fills the row: the rest is cut by the model's rule, and said
            assert r.json()["x_usage"]["state_tokens_dropped"] > 0
        else:  # one prompt in the context SmolLM2 was trained for (8192 tokens, no --n-ctx), not a tournament
            assert "x_tournament" not in answer and r.json()["usage"]["input_tokens"] > 4096
    finally:
        stop(process)
