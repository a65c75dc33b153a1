"""A real uvicorn server on a loopback port, in a background thread, for tests that speak HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


class SteadyLoad:
    """`clients` threads, each posting `body` in a loop on its own keep-alive connection and honouring
    `Retry-After` (capped at `max_wait_s`, so a test does not idle); every outcome is kept as
    `(monotonic time, status or the exception's class name, retry-after header or None)`."""

    def __init__(self, url: str, body: dict, clients: int = 4, max_wait_s: float = 2.0, timeout_s: float = 60.0,
                 path: str = "/v1/systemone"):
        self.url, self.body, self.path = url, body, path
        self.max_wait_s, self.timeout_s = max_wait_s, timeout_s
        self.outcomes: list[tuple[float, int | str, str | None]] = []
        self.spans: list[tuple[float, float, int | str]] = []  # (sent, done, status) of every request
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    r = client.post(self.path, json=self.body)
                    outcome: tuple = (time.monotonic(), r.status_code, r.headers.get("retry-after"))
                except httpx.HTTPError as exc:
                    outcome = (time.monotonic(), type(exc).__name__, None)
                self.outcomes.append(outcome)
                self.spans.append((sent, outcome[0], outcome[1]))
                if outcome[1] in (429, 503) and outcome[2]:
                    self._stop.wait(min(self.max_wait_s, float(outcome[2])))
                elif not isinstance(outcome[1], int):
                    self._stop.wait(0.2)

    def __enter__(self) -> SteadyLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)

    def since(self, t0: float) -> list[tuple[float, int | str, str | None]]:
        return [o for o in list(self.outcomes) if o[0] >= t0]

    def first_ok_after(self, t0: float) -> float | None:
        return next((o[0] for o in list(self.outcomes) if o[0] > t0 and o[1] == 200), None)


class BusyCores:
    """A busy loop on every core (or `n`), each a process of its own that ends by itself after
    `seconds` and is killed on leaving: the machine a server meets beside a build or a test run."""

    LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"

    def __init__(self, seconds: float = 60.0, n: int | None = None):
        self.seconds, self.n = seconds, n or os.cpu_count() or 1
        self.processes: list = []

    def __enter__(self) -> BusyCores:
        try:
            for _ in range(self.n):
                self.processes.append(subprocess.Popen([sys.executable, "-c", self.LOOP, str(self.seconds)]))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait(10)
