"""Ray Serve against `laya serve`: throughput at concurrency 8, and the latency Ray adds per request.

    .venv/bin/python benchmarks/ray_serve.py [--seconds 20] [--model CHECKPOINT] [--runtime torch]

One run, one machine, loopback only. Rows, each measured by `wrk` (Debian's package) posting the same
small two-question request in a closed loop (the next as soon as the answer is back):

- `laya serve --threads 1` (the model in its engine process, one thread), 8 connections and 1;
- Ray Serve with 1 replica of one thread, 8 connections and 1;
- Ray Serve with 2 replicas of one thread each, 8 connections.

Throughput is 200 answers per second; latencies are wrk's, client side, of every request (median and
p99). "Ray adds" is Ray's median / p99 at one connection minus `laya serve`'s: the proxy and ingress
hops a request takes on Ray Serve. Both servers run the same runtime (`--runtime`, torch by default)
on the same generated checkpoint unless `--model` names another.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from goodput import BODY, ensure_wrk, free_port, workspace

LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("LAYA_BENCH_BODY"), "r")
wrk.body = f:read("*a")
f:close()
ok, other = 0, 0
function response(status, headers, body)
  if status == 200 then ok = ok + 1 else other = other + 1 end
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local o, x = 0, 0
  for _, th in ipairs(threads) do o = o + th:get("ok"); x = x + th:get("other") end
  io.write(string.format('BENCH {"ok": %d, "other": %d, "seconds": %.3f, "p50_ms": %.2f, "p99_ms": %.2f, ' ..
    '"errors": %d}\n', o, x, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def wait_answering(url: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.post(url + "/v1/systemone", json=BODY, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"ray_serve bench: nothing answered at {url}")


def measure(wrk: str, url: str, connections: int, seconds: float, script: Path, body: Path) -> dict:
    subprocess.run([wrk, "-t1", f"-c{connections}", "-d2s", "-s", str(script), url + "/v1/systemone"],
                   capture_output=True, env={**os.environ, "LAYA_BENCH_BODY": str(body)}, timeout=60)  # warm-up
    out = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--timeout", "30s", "-s",
                          str(script), url + "/v1/systemone"], capture_output=True, text=True,
                         env={**os.environ, "LAYA_BENCH_BODY": str(body)}, timeout=seconds + 90)
    line = next((x for x in out.stdout.splitlines() if x.startswith("BENCH ")), None)
    if line is None:
        sys.exit(f"ray_serve bench: wrk failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    result = json.loads(line[len("BENCH "):])
    result["per_s"] = result["ok"] / result["seconds"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--model", help="checkpoint to serve (default: a generated one)")
    parser.add_argument("--runtime", default="torch")
    args = parser.parse_args()
    wrk = ensure_wrk()
    work, model, script, body = workspace("laya-ray-bench-", args.model, LUA)
    rows: dict[str, dict] = {}

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "serve.log").open("w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "laya"), "serve", "-m", model, "--runtime",
                               args.runtime, "--threads", "1", "--port", str(port)], stdout=log, stderr=log)
    try:
        wait_answering(url)
        rows["laya serve, 1 thread, 8 connections"] = measure(wrk, url, 8, args.seconds, script, body)
        rows["laya serve, 1 thread, 1 connection"] = measure(wrk, url, 1, args.seconds, script, body)
    finally:
        server.terminate()
        server.wait(timeout=60)

    from ray import serve

    from laya.server.app import ServerConfig
    from laya.server.ray_app import APP_NAME, ModelConfig, RayAppConfig, application, connect

    connect(None, num_cpus=max(2, os.cpu_count() or 1))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve.start(http_options={"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": 65})
    try:
        for replicas in (1, 2):
            config = RayAppConfig(models=[ModelConfig(source=model, runtime=args.runtime, threads=1,
                                                      num_replicas=replicas)], server=ServerConfig())
            serve.run(application(config), name=APP_NAME, route_prefix="/")
            wait_answering(url)
            time.sleep(3)  # a replaced replica set settles
            rows[f"Ray Serve, {replicas} replica(s) x 1 thread, 8 connections"] = measure(
                wrk, url, 8, args.seconds, script, body)
            if replicas == 1:
                rows["Ray Serve, 1 replica x 1 thread, 1 connection"] = measure(wrk, url, 1, args.seconds, script,
                                                                                body)
    finally:
        serve.shutdown()
        import ray

        ray.shutdown()

    print(f"\nRay Serve vs laya serve - {os.cpu_count()} cores, {args.runtime}, {args.seconds:.0f} s per row, "
          "wrk closed loop\n")
    print("| setup | answers/s | median | p99 | not 200 | connection errors |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['per_s']:.1f} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['other']} | "
              f"{r['errors']} |")
    base = rows["laya serve, 1 thread, 8 connections"]["per_s"]
    one, two = (rows[f"Ray Serve, {n} replica(s) x 1 thread, 8 connections"]["per_s"] for n in (1, 2))
    alone, on_ray = rows["laya serve, 1 thread, 1 connection"], rows["Ray Serve, 1 replica x 1 thread, 1 connection"]
    print(f"\nthroughput at 8 connections: Ray 1 replica {one / base:.2f}x laya serve, 2 replicas {two / base:.2f}x "
          f"({two / one:.2f}x one replica)")
    print(f"Ray adds per request at one connection: median {on_ray['p50_ms'] - alone['p50_ms']:+.1f} ms, "
          f"p99 {on_ray['p99_ms'] - alone['p99_ms']:+.1f} ms")
    (work / "ray_serve.json").write_text(json.dumps(rows, indent=2))
    print(f"\nraw figures: {work / 'ray_serve.json'}")


if __name__ == "__main__":
    main()
