"""Load test of `laya serve`: capacity, concurrency 8 vs one at a time, and 4x overload for 60 s.

    .venv/bin/python benchmarks/load_server.py [--model PATH] [--seconds 60]

Starts the server as a subprocess on a loopback port (never any other address), measures
sequential throughput (the capacity), throughput at concurrency 8, then offers 4x the capacity
open-loop for `--seconds`. Every response must be a 200, or a 429/529 with Retry-After; the
server's resident memory is sampled each second. All loops are bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from serving import free_port, wait_ready

QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "payments and refunds", "sales": "plans and pricing", "support": "bugs"}},
    "urgent": {"type": "noul", "instructions": "Does this need action today?"},
}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def body(i: int) -> dict:
    return {"state": f"Customer {i}: I was charged twice for order {i}. " + "Please help. " * (i % 7),
            "questions": QUESTIONS}


async def closed_loop(url: str, concurrency: int, seconds: float, cap: int = 100_000) -> tuple[int, float, list]:
    done, latencies = 0, []
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=30) as client:
        async def worker(w: int):
            nonlocal done
            i = w
            while time.perf_counter() < deadline and done < cap:
                t0 = time.perf_counter()
                r = await client.post(url, json=body(i))
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                done += 1
                i += concurrency
        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done, time.perf_counter() - start, latencies


def raw_request(port: int, i: int) -> bytes:
    payload = json.dumps(body(i)).encode()
    return (f"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def overload(port: int, rate: float, seconds: float, pid: int, connections: int = 256):
    """Open loop at `rate` req/s over keep-alive connections, with a lean HTTP/1.1 client: a Python
    HTTP library costs more CPU per request than the server's 429, and would measure itself."""
    statuses: Counter = Counter()
    bad: list[str] = []
    memory: list[float] = []
    requests = [raw_request(port, i) for i in range(64)]
    start = time.perf_counter()
    interval = connections / rate

    async def connection(c: int):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n, due = 0, start + c * interval / connections
        try:
            while due - start < seconds:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(requests[(c + n) % len(requests)])
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                status = int(lines[0].split()[1])
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                text = await reader.readexactly(int(headers.get("content-length", 0)))
                statuses[status] += 1
                if status not in (200, 429, 529) or (status != 200 and "retry-after" not in headers):
                    bad.append(f"{status} {text[:200]!r}")
                n += 1
                due += interval
        except (OSError, asyncio.IncompleteReadError) as exc:
            statuses[type(exc).__name__] += 1
        finally:
            writer.close()
        return n

    async def sample():
        while time.perf_counter() - start < seconds:
            memory.append(rss_mb(pid))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    sent = sum(await asyncio.gather(*(connection(c) for c in range(connections))))
    await sampler
    memory.append(rss_mb(pid))
    return sent, statuses, bad, memory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint to serve (default: a generated test checkpoint)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the overload phase")
    parser.add_argument("--measure-seconds", type=float, default=10.0, help="length of each throughput phase")
    parser.add_argument("--max-pending-rows", type=int, default=512)
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    model = args.model
    if model is None:
        from laya.testing.checkpoints import write_test_checkpoint

        model = str(write_test_checkpoint(Path(tmp.name) / "bench-model"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_file = (Path(tmp.name) / "server.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "laya.cli", "serve", "--model", model, "--port", str(port),
                               "--max-pending-rows", str(args.max_pending_rows)],
                              stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        if not wait_ready(base, server, 120, poll_s=0.2):
            print((Path(tmp.name) / "server.log").read_text(), file=sys.stderr)
            return 1
        url = base + "/v1/systemone"
        asyncio.run(closed_loop(url, 1, 2.0))  # warm-up
        n1, t1, lat1 = asyncio.run(closed_loop(url, 1, args.measure_seconds))
        n8, t8, lat8 = asyncio.run(closed_loop(url, 8, args.measure_seconds))
        capacity = n1 / t1
        print(f"one at a time : {capacity:7.1f} req/s  median {statistics.median(lat1) * 1000:6.1f} ms")
        print(f"concurrency 8 : {n8 / t8:7.1f} req/s  median {statistics.median(lat8) * 1000:6.1f} ms  "
              f"({n8 / t8 / capacity:.2f}x one at a time)")
        rate = 4 * max(capacity, n8 / t8)
        sent, statuses, bad, memory = asyncio.run(overload(port, rate, args.seconds, server.pid))
        print(f"overload      : aimed at {rate:.0f} req/s (4x capacity) for {args.seconds:.0f} s; sent {sent} "
              f"requests = {sent / args.seconds:.0f} req/s offered ({sent / args.seconds / capacity:.1f}x capacity)")
        print(f"  statuses    : {dict(sorted(statuses.items(), key=str))}")
        trace = " ".join(f"{m:.0f}" for m in memory[::10])
        print(f"  server RSS  : start {memory[0]:.0f} MB, end {memory[-1]:.0f} MB, max {max(memory):.0f} MB; "
              f"every 10 s: {trace}")
        metrics = httpx.get(base + "/metrics").text
        for line in metrics.splitlines():
            if line.startswith(("laya_batch_jobs_sum", "laya_batch_jobs_count")):
                print("  " + line)
        growth = memory[-1] - memory[0]
        ok = not bad and set(statuses) <= {200, 429, 529} and growth < max(64.0, 0.1 * memory[0])
        if bad:
            print("  unexpected responses:", *bad[:5], sep="\n    ")
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log_file.close()
        tmp.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
