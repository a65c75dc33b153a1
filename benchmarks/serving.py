"""What the benchmarks that start `laya serve` share: a free loopback port, and waiting for /ready."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

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


class RawConnection:
    """One keep-alive HTTP/1.1 connection that does nothing a client need not do, so that a latency
    measured through it is the server's: the request's bytes are built once, and an answer is read
    to its `content-length` with no header parsing beyond the status and that length. `http.client`
    parses every header through the `email` package, which costs about 0.2 ms a request where code
    runs cold (measured beside it in `overhead.py`). It speaks only what `laya serve` answers with
    (a `content-length`, no chunks) and says so when an answer is otherwise."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self._host = f"127.0.0.1:{port}".encode()
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def poster(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Callable[[], tuple[int, bytes]]:
        """A call that POSTs `body` to `path` and returns the answer's status and body."""
        lines = [f"POST {path} HTTP/1.1".encode(), b"host: " + self._host, b"content-type: application/json",
                 *(f"{name}: {value}".encode() for name, value in (headers or {}).items()),
                 b"content-length: " + str(len(body)).encode()]
        request = b"\r\n".join(lines) + b"\r\n\r\n" + body
        sock = self._sock

        def post() -> tuple[int, bytes]:
            sock.sendall(request)
            data = b""
            while (end := data.find(b"\r\n\r\n")) < 0:
                data += _received(sock)
            head = data[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            if not head.startswith(b"http/1.1 ") or at < 0:
                raise ValueError(f"not an answer this client reads (no content-length): {head[:200]!r}")
            eol = head.find(b"\r\n", at + 2)
            length = int(head[at + 17:eol if eol > 0 else len(head)])
            while len(data) < end + 4 + length:
                data += _received(sock)
            if len(data) > end + 4 + length:
                raise ValueError("the server sent more than one answer's bytes")
            return int(head[9:12]), data[end + 4:]
        return post

    def close(self) -> None:
        self._sock.close()


def _received(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the server closed the connection mid-answer")
    return chunk
