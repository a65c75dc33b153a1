"""What the machinery between the socket and the engine costs: `laya serve` against a minimal front over
the same engine process, interleaved, at one keep-alive connection.

    .venv/bin/python benchmarks/lean_front.py [--rounds 50] [--checks]

The minimal front is uvloop and httptools' parser under a protocol of a few lines. It parses and
validates the body with the same `laya.request.parse_request`, sends the job through the same
`RemoteEngine` (the model in an engine process, as `laya serve` runs it), renders the answer with the
same `to_json` and writes head and body at once. Its HTTP loop runs at the same `nice` +10. It has no
uvicorn, ASGI or Starlette objects, no admission, request id, deadline watch, metrics or access log,
and it answers nothing but this request: a measuring instrument, not a server. With `--checks` it also
runs the body's hostile-input checks `laya serve` runs (media type, size, duplicate keys, the tree's
bounds), so the difference shows what they cost apart from the rest.

Printed: p50/p90/p99 of each server (two of each, interleaved in rounds of ten after a 50 ms pause, as
`overhead.py` times them), through `serving.RawConnection`. The answers of every server are checked
equal before anything is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from overhead import QUESTIONS, STATE, started, timed
from serving import RawConnection

HTTP_NICE = 10  # as `laya serve` lowers its HTTP loop's priority once the engines are loaded


class LeanFront:
    """The protocol of one connection: one request at a time, answered by the engine process."""

    def __init__(self, engine, limits, checks: bool):
        self.engine, self.limits, self.checks = engine, limits, checks

    def __call__(self) -> asyncio.Protocol:
        import httptools

        front = self

        class Connection(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                self.transport, self.parser, self.body, self.url = transport, httptools.HttpRequestParser(self), [], b""

            def data_received(self, data: bytes) -> None:
                self.parser.feed_data(data)

            def on_url(self, url: bytes) -> None:
                self.url = url

            def on_body(self, body: bytes) -> None:
                self.body.append(body)

            def on_message_complete(self) -> None:
                body, self.body = b"".join(self.body), []
                if self.url == b"/v1/systemone":
                    asyncio.get_running_loop().create_task(front.answer(self.transport, body))
                elif self.url == b"/ready":  # as `serving.wait_ready` asks once the engine is up
                    self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                else:
                    self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

        return Connection()

    async def answer(self, transport, body: bytes) -> None:
        from laya.request import check_size, parse_request
        from laya.server.body import check_media_type, check_tree, decoded_within, parse_json

        if self.checks:
            check_media_type("application/json", browser=False)
            small = decoded_within(body, None, 4096)
            tree = parse_json(small, no_duplicates=True)
            check_size(tree, False, self.limits)
            check_tree(tree, small, duplicates_checked=True)
        else:
            tree = json.loads(body)
        request = parse_request(tree, batch=False, limits=self.limits, from_json=True, sized=True)
        job = self.engine.prepare(request, limits=self.limits)
        (result,), _ = await self.engine.submit(job)
        result.model = "enc"
        out = json.dumps(result.to_json(), ensure_ascii=False, separators=(",", ":")).encode()
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                        % len(out) + out)


async def serve(folder: str, port: int, checks: bool) -> None:
    from laya.limits import Limits
    from laya.server.remote import RemoteEngine
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    loop = asyncio.get_running_loop()
    engine = RemoteEngine(functools.partial(load_engine, ModelSpec(folder, name="enc"),
                                            ServeOptions(runtime="onnx", threads=2)))
    engine.serve_on(loop)
    os.nice(HTTP_NICE)
    server = await loop.create_server(LeanFront(engine, Limits(), checks), "127.0.0.1", port)
    await server.serve_forever()


def start(kind: str, folder: Path, checks: bool) -> tuple[subprocess.Popen, RawConnection, Any]:
    """`laya serve` (as `overhead.py` starts it) or the lean front over the checkpoint, ready."""
    if kind == "laya":
        command = ["-m", "laya.cli", "serve", "-m", f"enc={folder}", "-r", "onnx", "--threads", "2"]
    else:
        command = [__file__, "--serve", str(folder), *(["--checks"] if checks else [])]
    process, port, log = started(command, "laya serve" if kind == "laya" else "the lean front", 180)
    return process, RawConnection(port), log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--checks", action="store_true", help="the lean front runs the body's hostile-input checks")
    parser.add_argument("--serve", metavar="FOLDER", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(serve(args.serve, args.port, args.checks))
        return
    warnings.simplefilter("ignore")
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec())
        lean = "lean front" + (" + checks" if args.checks else "")
        servers = {name: start(kind, folder, args.checks) for name, kind in
                   (("laya serve", "laya"), (lean, "lean"), ("laya serve #2", "laya"), (f"{lean} #2", "lean"))}
        try:
            body = json.dumps({"model": "enc", "state": STATE, "questions": QUESTIONS}).encode()
            posts = {name: connection.poster("/v1/systemone", body) for name, (_, connection, _) in servers.items()}
            answers = {}
            for name, post in posts.items():
                for _ in range(30):
                    status, raw = post()
                    if status != 200:
                        raise SystemExit(f"{name} answered {status}: {raw[:300]!r}")
                answers[name] = json.loads(raw)["answers"]
            if any(a != answers["laya serve"] for a in answers.values()):
                raise SystemExit("the servers' answers differ; nothing timed")
            times: dict[str, list[float]] = {name: [] for name in posts}
            for _ in range(args.rounds):
                for name, post in posts.items():
                    time.sleep(0.05)
                    times[name] += timed(post, 10, warmup=1)
        finally:
            for process, connection, log in servers.values():
                connection.close()
                process.terminate()
                process.wait(30)
                log.close()
    base = statistics.median(times["laya serve"] + times["laya serve #2"])
    for name, ms in times.items():
        p50, p90, p99 = (float(np.percentile(ms, q)) for q in (50, 90, 99))
        print(f"  {name:24s} p50 {p50:6.2f} ms  p90 {p90:6.2f}  p99 {p99:6.2f}  ({p50 - base:+.2f} ms against "
              f"laya serve's {base:.2f})")


if __name__ == "__main__":
    main()
