"""The HTTP side's end of an engine process's pipe: whole pickled messages, read and written on an
event loop.

Why not `multiprocessing.Connection` and a reader thread: a reply read by a thread has to wake
that thread, then the event loop, then the coroutine; read here, the loop's own poll wakes on the
socket and settles the coroutine's future directly. On the project's 2-core machines that removed
about 0.1 ms from each hop (`benchmarks/overhead.py`). A send never blocks the loop: what the far
end has not read yet waits in a buffer here and goes when the socket is writable.

The framing is `multiprocessing.Connection`'s (a 4-byte big-endian length, or -1 and an 8-byte
length past 2 GiB, then the pickle), so the engine process reads and writes its end with a plain
`Connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
READ_BYTES = 1 << 16


def pickled(message: Any) -> bytes:
    """`message` as either end writes it: plain `pickle` at its default protocol, the bytes
    `Connection.send` would write. `Connection.send` pickles through `ForkingPickler`, which adds
    reducers for sockets and file descriptors (no message holds one) and copies its dispatch table for
    every message: a reply's pickling took 35 us against 21 us this way, where the code runs cold after
    a forward pass (2-core Xeon), and each request is pickled once each way."""
    return pickle.dumps(message)


def framed(message: Any) -> bytes:
    """`message` pickled and framed as `Connection.send` frames it."""
    data = pickled(message)
    n = len(data)
    head = _SHORT.pack(n) if n <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(n)
    return head + data


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this code runs on `loop`'s thread, inside it."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _here(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop`'s state may be touched from this thread: on it, or nobody runs it (a server's
    loop after it stopped)."""
    return on_loop(loop) or not loop.is_running()


def run_on(loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> None:
    """`call()` on `loop`'s thread, and back once it ran (at once when already there, or when
    nobody runs the loop)."""
    if _here(loop):
        call()
        return
    done, failed = threading.Event(), []

    def step() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)
        finally:
            done.set()

    loop.call_soon_threadsafe(step)
    done.wait()
    if failed:
        raise failed[0]


_own: asyncio.AbstractEventLoop | None = None
_own_lock = threading.Lock()


def own_loop() -> asyncio.AbstractEventLoop:
    """A loop on a thread of its own, for pipes whose owner serves no loop yet (an engine being
    loaded, a test or a benchmark driving one from plain code); `laya serve` moves its pipes to the
    server's loop once they are in service."""
    global _own
    with _own_lock:
        if _own is None or _own.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="laya-pipes", daemon=True).start()
            _own = loop
        return _own


class Pipe:
    """One duplex socket to an engine process, served by one event loop.

    `on_message(message)` and `on_end()` (the far end closed, or the socket failed; once) are called
    on that loop. `send` may be called from any thread.
    """

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop, on_message: Callable[[Any], None],
                 on_end: Callable[[], None]):
        self.sock = socket.socket(fileno=os.dup(conn.fileno()))
        conn.close()
        self.sock.setblocking(False)
        self._fd = self.sock.fileno()
        self._on_message, self._on_end = on_message, on_end
        self._in = bytearray()
        self._out = bytearray()
        self.ended = False
        self.loop = loop
        run_on(loop, self._attach)

    def _attach(self) -> None:
        if self.ended:
            return
        self.loop.add_reader(self._fd, self._readable)
        if self._out:
            self.loop.add_writer(self._fd, self._writable)

    def _detach(self) -> None:
        self.loop.remove_reader(self._fd)
        self.loop.remove_writer(self._fd)

    def move_to(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve the pipe from `loop` from now on (what it holds unread or unsent comes along)."""
        if loop is self.loop:
            return
        run_on(self.loop, self._detach)
        self.loop = loop
        run_on(loop, self._attach)

    def send(self, message: Any) -> None:
        """Queue `message` for the far end: pickled here, written by the loop (at once when called
        on it and the socket has room)."""
        data = framed(message)
        if _here(self.loop):
            self._write(data)
        else:
            self.loop.call_soon_threadsafe(self._write, data)

    def _write(self, data: bytes) -> None:
        if self.ended:
            return  # the reader's end tells every waiting caller
        if self._out:
            self._out += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._end()
            return
        if sent < len(data):
            self._out += memoryview(data)[sent:]
            self.loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._end()
            return
        del self._out[:sent]
        if not self._out:
            self.loop.remove_writer(self._fd)

    def _readable(self) -> None:
        try:
            chunk = self.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._end()
            return
        buf = self._in
        buf += chunk
        while True:
            if len(buf) < 4:
                return
            (n,) = _SHORT.unpack_from(buf)
            start = 4
            if n == -1:
                if len(buf) < 12:
                    return
                (n,) = _LONG.unpack_from(buf, 4)
                start = 12
            if len(buf) < start + n:
                return
            try:
                with memoryview(buf)[start : start + n] as view:
                    message = pickle.loads(view)
            except Exception:  # noqa: BLE001 - a torn or foreign stream: the pipe is no use any more
                self._end()
                return
            del buf[: start + n]
            self._on_message(message)

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        with contextlib.suppress(Exception):
            self._detach()
        self.sock.close()
        self._on_end()

    def close(self) -> None:
        """Close our end (from any thread); the far end sees it as the end of its input."""
        if self.loop.is_closed():  # nothing watches the socket any more
            self.ended = True
            self.sock.close()
            return
        run_on(self.loop, self._end)
