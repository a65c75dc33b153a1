"""A real uvicorn server on a loopback port, in a background thread, for tests that speak HTTP."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process, seconds: float = 180) -> None:
    """Wait for a `laya serve` subprocess to answer /ready; fail with its stderr if it exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"the server at {url} never became ready")


class LiveServer:
    def __init__(self, app, ready_timeout: float = 60.0, wait_ready: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.ready_timeout = ready_timeout
        self.wait_ready = wait_ready

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + self.ready_timeout
        path = "/ready" if self.wait_ready else "/health"
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.__exit__()
        raise TimeoutError(f"server at {self.url} not ready")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
