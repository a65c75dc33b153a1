"""Ready in seconds, fast when ready (laya/encoder/upgrade.py): the first load answers from torch fp32 while
auto's pick is prepared in a process of its own, and the swap never splits a batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import load_quiet
from live_server import free_port, wait_ready

from laya.encoder import choice as auto
from laya.encoder.runtimes.base import RuntimeBase
from laya.encoder.upgrade import BACKGROUND_ENV, Upgrade

QUESTIONS = {"a": {"type": "noul", "instructions": "Urgent?"},
             "b": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "money", "sales": None}},
             "c": {"type": "score", "instructions": "Anger?", "criteria": ["calm", "cross", "furious"]}}


class Recording(RuntimeBase):
    """A runtime that runs another one, names itself `precision`, and logs every forward pass; the first
    pass may be held until the test lets it go (a batch in flight)."""

    def __init__(self, inner, precision: str, log: list[str], hold: threading.Event | None = None):
        self.inner, self.name, self.precision, self.log, self.hold = inner, inner.name, precision, log, hold
        self.entered = threading.Event()

    def forward(self, batch):
        self.log.append(self.precision)
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(30), "the test never let the held forward pass go"
            self.hold = None
        return self.inner.forward(batch)


def test_a_swap_waits_for_the_batch_in_flight(checkpoint_dir):
    model = load_quiet(checkpoint_dir, "torch")
    model.max_batch_rows = 1  # three questions: three forward passes for one request
    log: list[str] = []
    release = threading.Event()
    old = Recording(model.runtime, "fp32", log, hold=release)
    model.runtime = old
    answers: list[dict] = []
    request = threading.Thread(target=lambda: answers.append(model.predict("refund twice please", QUESTIONS)))
    request.start()
    assert old.entered.wait(30)
    model.swap(Recording(load_quiet(checkpoint_dir, "torch").runtime, "swapped-in", log), None)
    release.set()
    request.join(30)
    assert log == ["fp32"] * 3, "a request in flight at the swap was answered by two runtimes"
    assert answers[0]["x_precision"] == "fp32"
    after = model.predict("refund twice please", QUESTIONS)
    assert log[3:] == ["swapped-in"] * 3 and after["x_precision"] == "swapped-in"


STORE_A_PICK = """
import sys
from laya.encoder.choice import store_pick
store_pick(sys.argv[1], "torch", {"precision": "fp32"}, {"by": "test", "summary": "faked"})
"""


@pytest.fixture
def background(monkeypatch, tmp_path):
    """Auto measuring, in the background, on a cache of its own (no pick stored)."""
    monkeypatch.setenv("LAYA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(auto.MEASURE_ENV, "1")
    monkeypatch.setenv(BACKGROUND_ENV, "1")


def test_the_first_load_answers_at_once_and_swaps_in_the_pick(background, checkpoint_dir, monkeypatch):
    from laya.encoder.checkpoint import load_checkpoint

    fingerprint = load_checkpoint(checkpoint_dir).fingerprint
    monkeypatch.setattr(Upgrade, "command", lambda self: [sys.executable, "-c", STORE_A_PICK, fingerprint])
    model = load_quiet(checkpoint_dir, None, threads=1)
    assert model.choice.deferred and (model.runtime.name, model.runtime.precision) == ("packed", "fp32")
    assert not model.runtime.compiled  # exact, and ready in seconds: nothing compiled on the way
    first = model.predict("refund twice please", QUESTIONS)  # answered before the upgrade is done
    assert first["x_precision"] == "fp32"
    assert model.upgrade.wait(60), model.upgrade.status()
    status = model.upgrade.status()
    assert status["state"] == "swapped" and status["target"] == "torch fp32", status
    assert model.runtime.name == "torch" and model.info()["upgrade"]["state"] == "swapped"
    second = model.predict("refund twice please", QUESTIONS)
    for qid, answer in first["answers"].items():
        for key, p in answer.get("probabilities", {}).items():
            assert second["answers"][qid]["probabilities"][key] == pytest.approx(p, abs=1e-4)
    # the next load finds the pick stored and starts on it
    again = load_quiet(checkpoint_dir, None, threads=1)
    assert not again.choice.deferred and again.upgrade is None and again.runtime.name == "torch"


def test_a_failed_preparation_keeps_the_exact_runtime_and_says_why(background, checkpoint_dir, monkeypatch):
    monkeypatch.setattr(Upgrade, "command",
                        lambda self: [sys.executable, "-c", "import sys; sys.exit('no compiler here')"])
    model = load_quiet(checkpoint_dir, None, threads=1)
    assert model.upgrade.wait(60)
    status = model.upgrade.status()
    assert status["state"] == "failed" and "no compiler here" in status["reason"], status
    assert model.runtime.name == "packed" and model.predict("refund", QUESTIONS)["x_precision"] == "fp32"


def test_the_load_waits_for_the_pick_when_asked(background, checkpoint_dir, monkeypatch):
    monkeypatch.setattr(auto, "_exact_for_now", lambda *a: pytest.fail("deferred with background=False"))
    monkeypatch.setattr(auto, "_timing", lambda checkpoint, models, not_timed: (auto.REFERENCE, {"summary": "t"}))
    monkeypatch.setattr(auto, "measured_candidates", lambda machine, exact=False: [
        auto.Candidate("torch", {"precision": "fp32"}, "")])
    model = load_quiet(checkpoint_dir, None, threads=1, background=False)
    assert not model.choice.deferred and model.upgrade is None


FAKE_PREPARE = """
import sys
from laya.encoder import upgrade
from laya.encoder.checkpoint import load_checkpoint
from laya.encoder.runtimes.base import RuntimeBase

def command(self):  # the pick stored once the test says go (a file appears), as `laya prepare` would store it
    fingerprint = load_checkpoint(self.checkpoint.path).fingerprint
    wait = "import os, time\\nwhile not os.path.exists(sys.argv[2]): time.sleep(0.1)\\n"
    return [sys.executable, "-c", STORE_A_PICK.replace("import sys\\n", "import sys\\n" + wait), fingerprint,
            {go!r}]

STORE_A_PICK = {store!r}
upgrade.Upgrade.command = command
"""


@pytest.mark.slow
def test_a_server_answers_while_it_upgrades_and_says_so(checkpoint_dir, tmp_path):
    """`laya serve` on a checkpoint its cache has never seen, auto measuring in the background: it answers
    from the first request on, the engine process swaps in the pick, and /v1/models, /health and the
    answers say so. (The preparing process is faked through the engine process's sitecustomize: the
    real one compiles for minutes; tests/test_upgrade.py's other tests and the benchmark run it.)"""
    site = tmp_path / "site"
    site.mkdir()
    go = tmp_path / "go"
    (site / "sitecustomize.py").write_text(FAKE_PREPARE.format(store=STORE_A_PICK, go=str(go)))
    port = free_port()
    env = {**os.environ, auto.MEASURE_ENV: "1", BACKGROUND_ENV: "1", "LAYA_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    server = subprocess.Popen([sys.executable, "-m", "laya.cli", "serve", "-m", f"enc={checkpoint_dir}",
                               "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    body = {"model": "enc", "state": "refund twice please", "questions": QUESTIONS}
    try:
        wait_ready(url, server)
        began = time.monotonic()
        seen: list[tuple[str, str]] = []
        while time.monotonic() - began < 120:
            r = httpx.post(url + "/v1/systemone", json=body, timeout=60)
            assert r.status_code == 200, r.text
            upgrade = httpx.get(url + "/v1/models").json()["models"][0]["x_upgrade"]
            seen.append((upgrade["state"], r.json()["x_precision"]))
            if upgrade["state"] != "preparing":
                break
            go.touch()  # answered while preparing: now let the preparation end
            time.sleep(0.5)
        assert seen[0] == ("preparing", "fp32") and seen[-1][0] == "swapped", seen
        health = httpx.get(url + "/health").json()
        described = health["models"]["enc"]
        assert described["upgrade"]["state"] == "swapped" and described["runtime"] == "torch"
        assert "preparing" not in json.dumps(health) and str(tmp_path) not in json.dumps(health)
        answer = httpx.post(url + "/v1/systemone", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["x_precision"] == "fp32"
    finally:
        server.terminate()
        server.wait(30)


def test_prepare_refuses_what_it_cannot_prepare(tmp_path, capsys):
    from laya.cli import main

    gguf = tmp_path / "chat.gguf"
    gguf.write_bytes(b"GGUF")
    assert main(["prepare", str(gguf)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no pick to prepare" in err
