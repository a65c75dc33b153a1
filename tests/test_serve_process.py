"""`laya serve` as a process: keys never on the command line or in a child's environment, workers
that cannot load end the server, and the default engine process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from live_server import free_port, wait_ready

from laya.cli import read_api_key
from laya.errors import LayaError

SERVE = [sys.executable, "-m", "laya.cli", "serve"]
URGENT = {"type": "noul", "instructions": "Urgent?"}


def test_the_key_on_the_command_line_is_refused_with_the_reason(checkpoint_dir):
    out = subprocess.run([*SERVE, "-m", str(checkpoint_dir), "--api-key", "secret", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--api-key-file" in out.stderr and "ps" in out.stderr
    assert "secret" not in out.stderr


def test_the_key_from_the_environment_leaves_it(monkeypatch, tmp_path):
    monkeypatch.setenv("LAYA_API_KEY", "from-env")
    assert read_api_key(None) == "from-env" and "LAYA_API_KEY" not in os.environ
    key = tmp_path / "key"
    key.write_text("from-file\n")
    assert read_api_key(str(key)) == "from-file"
    key.write_text("")
    with pytest.raises(LayaError, match="one non-empty line"):
        read_api_key(str(key))


@pytest.mark.slow
def test_workers_serve_with_a_key_file_and_an_engine_process_each(checkpoint_dir, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "LAYA_API_KEY"}
    server = subprocess.Popen([*SERVE, "-m", f"enc={checkpoint_dir}", "--api-key-file", str(key), "--workers", "2",
                               "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        # each worker becomes ready on its own: wait until many connections in a row reach a ready one
        deadline, streak = time.monotonic() + 120, 0
        while streak < 20 and time.monotonic() < deadline:
            with httpx.Client() as fresh:  # a new connection each time, so either worker may take it
                streak = streak + 1 if fresh.get(url + "/ready").status_code == 200 else 0
        body = {"state": "refund please", "questions": {"u": URGENT}}
        assert httpx.post(url + "/v1/systemone", json=body).status_code == 403
        r = httpx.post(url + "/v1/systemone", json=body, headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["model"] == "enc"
        assert httpx.get(url + "/health").json() == {"status": "ok"}  # without the key: a status word
        health = httpx.get(url + "/health", headers={"authorization": "Bearer s3cret"}).json()
        assert health["models"]["enc"]["instance"]  # the model runs in its own process
        # the key is in no process's command line or environment
        for pid in _descendants(server.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert b"s3cret" not in cmdline and b"s3cret" not in environ
            # `laya serve` without --ray never imports ray (its extension module is mapped by any import)
            assert "_raylet" not in Path(f"/proc/{pid}/maps").read_text(), f"process {pid} imported ray"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _descendants(pid: int) -> list[int]:
    out = [pid]
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    for child in children.split():
        out += _descendants(int(child))
    return out


@pytest.mark.slow
def test_a_worker_that_cannot_load_ends_the_server_with_the_error(tmp_path):
    out = subprocess.run([*SERVE, "-m", str(tmp_path / "missing"), "--workers", "2", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stderr
    assert "laya: error: could not load the models" in out.stderr and "missing" in out.stderr
