"""What the benchmarks that start `laya serve` share: a free loopback port, and waiting for /ready."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen, seconds: float, poll_s: float = 0.3) -> bool:
    """True once `url` answers /ready; False if the server exits or `seconds` pass first (each caller
    reports that its own way, with its log)."""
    deadline = time.monotonic() + seconds
    while server.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    return False
