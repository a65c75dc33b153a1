"""Registered names download from the Hub for real: a Hub stand-in on the loopback interface serves a
generated checkpoint at the registered commit, and `huggingface_hub` reaches it through `HF_ENDPOINT`.

Each load runs in a fresh process (huggingface_hub reads its endpoint and offline switch at import),
with its own Hugging Face cache. The registry entry keeps the real repository and commit; only its
weights digest is the generated checkpoint's (the real weights cannot be served here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_standin import HubStandIn
from live_server import free_port

from laya.encoder.checkpoint import sha256_of
from laya.encoder.registry import REGISTRY

ENTRY = REGISTRY["laya-multilingual"]
QUESTIONS = {"u": {"type": "noul", "instructions": "Urgent?"}}


def run_load(hf_home: Path, endpoint: str, pin: str | None, *, offline: bool = False, name: str = "laya-multilingual",
             sha256: str | None = None) -> subprocess.CompletedProcess:
    """`laya.load(name)` then one prediction, in a fresh process; prints the response as JSON."""
    code = (
        "import dataclasses, json, warnings; warnings.simplefilter('ignore')\n"
        "import laya\n"
        "from laya.encoder import registry\n"
        f"pin = {pin!r}\n"
        "if pin:\n"
        "    entry = registry.REGISTRY['laya-multilingual']\n"
        "    registry.REGISTRY['laya-multilingual'] = dataclasses.replace(entry, weights_sha256=pin)\n"
        f"kwargs = {{'sha256': {sha256!r}}} if {sha256!r} else {{}}\n"
        f"m = laya.load({name!r}, runtime='torch', **kwargs)\n"  # the download is under test, not auto's compiling
        f"print(json.dumps({{'name': m.name, 'response': m.predict('refund please', {QUESTIONS!r})}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)


def cached_weights(hf_home: Path) -> list[Path]:
    repo = hf_home / "hub" / f"models--{ENTRY.repo.replace('/', '--')}"
    return sorted(p for p in repo.rglob("model.safetensors")) if repo.exists() else []


@pytest.fixture(scope="module")
def served(mmbert_dir):
    digest = sha256_of(mmbert_dir / "model.safetensors")
    return mmbert_dir, digest


def test_first_load_downloads_with_progress_then_the_cache_answers_without_a_request(served, tmp_path):
    folder, digest = served
    with HubStandIn(ENTRY.repo, ENTRY.revision, folder) as hub:
        first = run_load(tmp_path, hub.url, digest)
        assert first.returncode == 0, first.stderr
        downloads = hub.count(f"/{ENTRY.repo}/resolve/")
        assert downloads >= 1 and hub.count(f"/{ENTRY.repo}/resolve/{ENTRY.revision}/model.safetensors") >= 1
        assert "100%" in first.stderr or "it/s" in first.stderr  # huggingface_hub's progress bars
        answer = json.loads(first.stdout)
        assert answer["name"] == "laya-multilingual" and 0.0 <= answer["response"]["answers"]["u"]["noul"] <= 1.0
        assert cached_weights(tmp_path), "the download goes into the standard Hugging Face cache"

        before = len(hub.requests)
        again = run_load(tmp_path, hub.url, digest)
        assert again.returncode == 0, again.stderr
        assert len(hub.requests) == before, hub.requests[before:]  # a pinned commit in the cache: no request
        offline = run_load(tmp_path, hub.url, digest, offline=True)
        assert offline.returncode == 0, offline.stderr
        assert len(hub.requests) == before
        assert json.loads(again.stdout)["response"] == json.loads(offline.stdout)["response"] == answer["response"]


def test_a_wrong_pin_is_refused_and_leaves_nothing_a_later_load_takes_as_good(served, tmp_path):
    folder, digest = served
    with HubStandIn(ENTRY.repo, ENTRY.revision, folder) as hub:
        wrong = run_load(tmp_path, hub.url, "0" * 64)
        assert wrong.returncode != 0
        assert "does not match the expected " + "0" * 64 in wrong.stderr
        assert not cached_weights(tmp_path), "the refused file must leave the cache"
        refused_downloads = hub.count(f"/{ENTRY.repo}/resolve/{ENTRY.revision}/model.safetensors")
        # offline, nothing cached passes for the model
        offline = run_load(tmp_path, hub.url, digest, offline=True)
        assert offline.returncode != 0 and "HF_HUB_OFFLINE" in offline.stderr
        # with the right pin the weights are fetched again, not taken from the cache
        right = run_load(tmp_path, hub.url, digest)
        assert right.returncode == 0, right.stderr
        assert hub.count(f"/{ENTRY.repo}/resolve/{ENTRY.revision}/model.safetensors") > refused_downloads


def test_the_pin_is_checked_before_any_weight_is_parsed(served, tmp_path):
    folder, digest = served
    tampered = {"model.safetensors": b"\x00" * 64}  # not even a safetensors header
    with HubStandIn(ENTRY.repo, ENTRY.revision, folder, tamper=tampered) as hub:
        out = run_load(tmp_path, hub.url, digest)
    assert out.returncode != 0
    assert "sha256" in out.stderr and "does not match" in out.stderr
    assert "not a readable safetensors" not in out.stderr
    assert not cached_weights(tmp_path)


def test_an_unreachable_hub_is_one_clear_error_naming_the_model(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    out = run_load(tmp_path, closed, None)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "laya-multilingual" in last and "cannot be reached" in last and "HF_ENDPOINT" in last
    assert closed in last


def test_the_cli_and_the_server_say_it_in_one_line(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path), HF_ENDPOINT=closed)
    laya_cli = [sys.executable, "-m", "laya.cli"]
    for args in (["predict", "-m", "laya-multilingual", "-s", "x", "-q", json.dumps(QUESTIONS)],
                 ["serve", "-m", "laya-multilingual", "--port", str(free_port())]):
        out = subprocess.run(laya_cli + args, capture_output=True, text=True, timeout=180, env=env)
        assert out.returncode == 2, (args, out.stderr)
        lines = [line for line in out.stderr.strip().splitlines() if line.startswith("laya: error:")]
        assert len(lines) == 1 and "laya-multilingual" in lines[0] and "cannot be reached" in lines[0], out.stderr


def test_a_refused_hub_is_known_at_once_and_a_reachable_one_is_left_to_huggingface_hub(served, monkeypatch, tmp_path):
    """A port that refuses connections is answered from the cache (here empty: LocalEntryNotFoundError, the
    error the loader turns into its one line) without huggingface_hub's retries; a Hub that answers, and
    a branch revision, go to snapshot_download as before."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    from laya.encoder.checkpoint import _cached_if_unreachable

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    kwargs = {"revision": "main", "allow_patterns": ["*.json"], "token": None, "cache_dir": str(tmp_path)}
    with pytest.raises(LocalEntryNotFoundError):
        _cached_if_unreachable(ENTRY.repo, kwargs, f"http://127.0.0.1:{free_port()}")
    folder, _ = served
    with HubStandIn(ENTRY.repo, ENTRY.revision, folder) as hub:
        assert _cached_if_unreachable(ENTRY.repo, kwargs, hub.url) is None
