"""`benchmarks/serving.RawConnection`, the client `benchmarks/overhead.py` times HTTP through, reads an
answer to exactly its end however the bytes arrive, and says so when an answer is not one it reads."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from serving import RawConnection  # noqa: E402


def serve_once(pieces: list[list[bytes]]) -> int:
    """A loopback server for one connection that answers its n-th request with the n-th list of
    pieces, each sent on its own (so an answer arrives split where the test says), then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for answer in pieces:
                request = b""
                while b"\r\n\r\n" not in request or not request.endswith(b"}"):
                    request += conn.recv(65536)
                for piece in answer:
                    conn.sendall(piece)
                    threading.Event().wait(0.01)

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1]


def test_an_answer_split_anywhere_is_read_whole_and_the_next_starts_clean():
    body = b'{"answers": {"a": 1}}'
    head = b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: %d\r\nContent-Type: application/json\r\n\r\n" % len(body)
    refusal = b'{"detail": "no"}'
    port = serve_once([[head[:7], head[7:30], head[30:] + body[:5], body[5:]],
                       [b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: %d\r\n\r\n" % len(refusal) + refusal],
                       [head + body]])
    raw = RawConnection(port, timeout=5)
    post = raw.poster("/v1/systemone", b'{"x": 1}', {"x-request-id": "t"})
    try:
        assert post() == (200, body)
        assert post() == (422, refusal)
        assert post() == (200, body)
    finally:
        raw.close()


@pytest.mark.parametrize("answer, message", [
    ([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"], "no content-length"),
    ([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"], "closed the connection"),
    ([b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}{}"], "more than one answer"),
])
def test_an_answer_it_cannot_read_is_an_error_not_a_figure(answer, message):
    raw = RawConnection(serve_once([answer]), timeout=5)
    try:
        with pytest.raises((ValueError, ConnectionError), match=message):
            raw.poster("/", b'{"x": 1}')()
    finally:
        raw.close()
