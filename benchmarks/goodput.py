"""Goodput under overload: `laya serve` offered 8, 64, 256 and 1,024 closed-loop connections.

    .venv/bin/python benchmarks/goodput.py [--connections 8 64 256 1024] [--seconds 15] [-- SERVE ARGS...]

Each connection of `wrk` (Debian's package; installed with apt-get when missing and root) posts one
small two-question request, and the next one as soon as the answer comes back, whatever it was: a
429 is retried at once, with no back-off, as naive or misbehaving clients do. One server (a generated
checkpoint, torch runtime) serves every row of the table, in one run. Goodput is 200 responses per
second; the latency of the answered (200) requests is the server's own (its /metrics histogram, read
before and after each row), so the load generator's CPU does not blur it. Only the loopback
interface is used; every run is bounded in time.

Pass/fail (printed): goodput at 256 and 1,024 connections >= 80% of goodput at 8; p99 of answered
requests <= 1 s at 64 connections; zero connection errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serving import free_port, wait_ready

QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "payments and refunds", "sales": "plans and pricing", "support": "bugs"}},
    "urgent": {"type": "noul", "instructions": "Does this need action today?"},
}
BODY = {"state": "Hi, I was charged twice for my subscription this month. Please refund the extra payment.",
        "questions": QUESTIONS}
LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("LAYA_GOODPUT_BODY"), "r")
wrk.body = f:read("*a")
f:close()
c200, c429, c503, cother = 0, 0, 0, 0
function response(status, headers, body)
  if status == 200 then c200 = c200 + 1
  elseif status == 429 then c429 = c429 + 1
  elseif status == 503 then c503 = c503 + 1
  else cother = cother + 1 end
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local t = {c200 = 0, c429 = 0, c503 = 0, cother = 0}
  for _, th in ipairs(threads) do
    for k, _ in pairs(t) do t[k] = t[k] + th:get(k) end
  end
  io.write(string.format('GOODPUT {"c200": %d, "c429": %d, "c503": %d, "other": %d, "seconds": %.3f, ' ..
    '"connect": %d, "read": %d, "write": %d, "timeout": %d}\n', t.c200, t.c429, t.c503, t.cother,
    summary.duration / 1e6, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.timeout))
end
"""


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which("wrk")
    if not found:
        sys.exit("goodput: wrk not found; install Debian's wrk package")
    return found


def workspace(prefix: str, model: str | None, lua: str) -> tuple[Path, str, Path, Path]:
    """A fresh folder holding the wrk script, the request body and (unless `model` names one) a
    generated checkpoint: (folder, model, script, body)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    if model is None:
        from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

        model = str(write_test_checkpoint(work / "ck", TestCheckpointSpec()))
    script, body = work / "post.lua", work / "body.json"
    script.write_text(lua)
    body.write_text(json.dumps(BODY))
    return work, model, script, body


def histogram(url: str) -> dict[float, int]:
    """Cumulative bucket counts of answered /v1/systemone requests, from /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    pattern = r'laya_request_seconds_bucket\{route="/v1/systemone",outcome="ok",le="([^"]+)"\} (\d+)'
    for edge, count in re.findall(pattern, text):
        out[float("inf") if edge == "+Inf" else float(edge)] = int(count)
    return out


def quantile(before: dict[float, int], after: dict[float, int], q: float) -> float:
    """The upper edge of the bucket holding quantile q of the requests answered between two reads."""
    delta = {edge: after.get(edge, 0) - before.get(edge, 0) for edge in after}
    total = delta.get(float("inf"), 0)
    if not total:
        return float("nan")
    for edge in sorted(delta):
        if delta[edge] >= q * total:
            return edge
    return float("inf")


def run_wrk(wrk: str, url: str, connections: int, seconds: float, script: Path, body: Path) -> dict:
    cmd = [wrk, "-t1", f"-c{connections}", f"-d{int(round(seconds))}s", "--timeout", "10s", "-s", str(script),
           url + "/v1/systemone"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60,
                         env={**os.environ, "LAYA_GOODPUT_BODY": str(body)})
    line = next((x for x in out.stdout.splitlines() if x.startswith("GOODPUT ")), None)
    if line is None:
        sys.exit(f"goodput: wrk failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    return json.loads(line[len("GOODPUT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="*", default=[8, 64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--model", help="checkpoint to serve (default: a generated one)")
    parser.add_argument("serve_args", nargs="*", help="extra `laya serve` arguments (after --)")
    args = parser.parse_args()
    wrk = ensure_wrk()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,024 connections need more than 1,024 files

    work, model, script, body = workspace("laya-goodput-", args.model, LUA)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    laya = str(Path(sys.executable).parent / "laya")
    log = (work / "server.log").open("w")
    server = subprocess.Popen([laya, "serve", "-m", model, "--port", str(port), *args.serve_args],
                              stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        if not wait_ready(url, server, 120):
            sys.exit(f"goodput: the server did not start; see {work / 'server.log'}")
        run_wrk(wrk, url, 8, args.warmup, script, body)
        for connections in args.connections:
            before = histogram(url)
            result = run_wrk(wrk, url, connections, args.seconds, script, body)
            after = histogram(url)
            seconds = result["seconds"]
            rows.append({"connections": connections, "ok_per_s": result["c200"] / seconds,
                         "shed_per_s": (result["c429"] + result["c503"]) / seconds,
                         "other_per_s": result["other"] / seconds, "p50_s": quantile(before, after, 0.50),
                         "p99_s": quantile(before, after, 0.99),
                         "connection_errors": result["connect"] + result["read"] + result["write"] + result["timeout"],
                         **{k: result[k] for k in ("connect", "read", "write", "timeout")}})
            time.sleep(1.0)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"\nlaya serve {' '.join(args.serve_args)} - goodput, {args.seconds:.0f} s per row, wrk closed loop, "
          "no back-off\n")
    print("| connections | 200/s | 429/s | other/s | p50 answered | p99 answered | connection errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['connections']} | {r['ok_per_s']:.0f} | {r['shed_per_s']:.0f} | {r['other_per_s']:.0f} | "
              f"<= {r['p50_s'] * 1000:.0f} ms | <= {r['p99_s'] * 1000:.0f} ms | {r['connection_errors']} |")
    by = {r["connections"]: r for r in rows}
    checks = []
    if 8 in by:
        base = by[8]["ok_per_s"]
        for n in (256, 1024):
            if n in by:
                checks.append((f"goodput at {n} >= 80% of goodput at 8", by[n]["ok_per_s"] >= 0.8 * base,
                               f"{by[n]['ok_per_s'] / base:.0%}"))
    if 64 in by:
        checks.append(("p99 of answered requests <= 1 s at 64", by[64]["p99_s"] <= 1.0, f"{by[64]['p99_s']} s"))
    checks.append(("zero connection errors", all(r["connection_errors"] == 0 for r in rows),
                   str([r["connection_errors"] for r in rows])))
    print()
    for name, ok, figure in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name} ({figure})")
    (work / "goodput.json").write_text(json.dumps(rows, indent=2))
    print(f"\nraw figures: {work / 'goodput.json'}")
    sys.exit(0 if all(ok for _, ok, _ in checks) else 1)


if __name__ == "__main__":
    main()
