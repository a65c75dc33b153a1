"""What the stack costs around the model: bare forward, `predict`, HTTP at one connection, in one run.

    .venv/bin/python benchmarks/overhead.py [-r onnx] [--repeats 300] [--threads 2] [-- SERVE ARGS...]

The request of issue 25: a generated checkpoint (4 layers, d 128), one state of one sentence, a
3-option choice and a noul (two rows). Printed, as medians (and p99) of `--repeats` calls after a
warm-up, interleaved in rounds of ten (50 ms apart, one warm-up call each): the runtime's `forward`
of the two rows (their batch built once, padded as `predict` pads them; and the same after a pause of
1.5 ms each, about what a server does between two forwards for a sequential client), `Model.predict` in this
process, and over HTTP `POST /v1/systemone` from one keep-alive connection to `laya serve` (its
default: the model in an engine process) started for the run on the loopback interface. Each
figure is also given as what it adds to the bare forward, the quantity the targets are about
(predict <= forward + 0.5 ms, HTTP p50 <= forward + 1.5 ms, p99 <= forward + 5 ms).

HTTP is measured from a raw client (`serving.RawConnection`: one keep-alive socket, the request's
bytes built once, the answer read to its `content-length`), so the figure is the server's. The same
from `http.client` and from an `httpx.Client` is printed beside it, with what each client adds itself
(`http.client` parses every header through the `email` package: about 0.2 ms a request here, which
this benchmark once counted as the server's). With `wrk` on the PATH, its p50 and p99 at one
connection (a client in C, requests back to back for five seconds) are printed too, a check on the
raw client that shares no code with it, set beside forwards timed just before and after it. Beside
them, the same from a second server started with `--single-process` (the model in the server's own
process), with what the engine process costs at p50 and p99; and the floor: the raw client against
`bare_asgi.py` (an ASGI app that only parses the body, keeps a thread busy for the forward's median
and answers a few bytes) under the same uvicorn, so the stack's own cost is what it adds above that:
what is left of the floor over the forward is the HTTP round trip and waking the event loop's code
after a forward pass, which any Python server pays on this machine.

Then the hop to the engine process: the engine's `prepare` + `execute` of the request in this process,
and the same through `RemoteEngine` (the model in a process of its own, as `laya serve` runs it).
The difference is one round trip over the pipe; half of it is one hop one way (target 0.3 ms). Its
floor is measured beside it: a pickled message of the request's size echoed by a spawned process over
the same kind of `multiprocessing` pipe, with nothing done in between (warm), and the same with the far
end busy for the forward's median before it answers, as the engine process is (cold: what the round
trip costs once both sides have waited through a forward pass).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from serving import RawConnection, free_port, wait_ready

HERE = Path(__file__).resolve().parent
QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "payments and refunds", "sales": "plans and pricing", "support": "bugs"}},
    "urgent": {"type": "noul", "instructions": "Does this need action today?"},
}
STATE = "Hi, I was charged twice for my subscription this month. Please refund the extra payment."


PAUSE_S = 0.0015  # about what a server does between two forward passes for one sequential client


def timed(call, repeats: int, warmup: int = 20, pause_s: float = 0.0) -> list[float]:
    """Milliseconds of each of `repeats` calls after `warmup` untimed ones; with `pause_s`, each call
    after that much sleep: a forward as a server meets it, its threads and caches idle for a moment
    first, where back to back they are still warm."""
    for _ in range(warmup):
        call()
    out = []
    for _ in range(repeats):
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def line(name: str, ms: list[float], forward: float | None) -> str:
    p50, p99 = statistics.median(ms), float(np.percentile(ms, 99))
    extra = "" if forward is None else f"   ({p50 - forward:+.2f} / {p99 - forward:+.2f} ms over the forward)"
    return f"  {name:34s} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms{extra}"


def forward_flops(enc, head_layers: int, lengths: list[int], padded: int) -> float:
    """Multiply-adds x 2 of one forward over rows padded to `padded` tokens: the encoder's projections
    and GeGLU, its attention (a window on local layers), the head's layers (attention over the row,
    a 4d ReLU feed-forward). The scorer and act head read a few vectors and are left out."""
    d, inner, n = enc.hidden_size, enc.intermediate_size, len(lengths) * padded
    per_token = enc.num_hidden_layers * (4 * d * d + 3 * d * inner) + head_layers * 12 * d * d
    attention = sum(2 * d * (padded if enc.is_global(i) else min(padded, enc.local_attention + 1))
                    for i in range(enc.num_hidden_layers)) + head_layers * 2 * d * padded
    return 2.0 * n * (per_token + attention)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--runtime", default="onnx")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("serve_args", nargs="*", help="after --: more `laya serve` options")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import laya
    from laya.encoder.batch import collate, padded_length
    from laya.encoder.rows import build_rows
    from laya.native.cpu import cpu
    from laya.questions import parse_questions
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    print(f"processor: {cpu().describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec())
        model = laya.load(str(folder), runtime=args.runtime, threads=args.threads)
        ck = model.checkpoint
        rows = build_rows(ck.tokenizer, STATE, parse_questions(QUESTIONS), ck.config.max_len, ck.config.head_max_len)
        batch = collate(rows, ck.tokenizer.pad_id, length=padded_length(max(len(r.ids) for r in rows)))
        flops = forward_flops(ck.encoder, ck.config.head_layers, [len(r.ids) for r in rows],
                              batch.input_ids.shape[1])
        tiny_rows = build_rows(ck.tokenizer, "ok", parse_questions({"u": {"type": "noul"}}), ck.config.max_len,
                               ck.config.head_max_len)
        tiny = collate(tiny_rows, ck.tokenizer.pad_id, length=padded_length(len(tiny_rows[0].ids)))
        print(f"checkpoint: 4 layers, d 128; runtime {model.runtime.name} {model.runtime.precision}, "
              f"{args.threads} threads; {len(rows)} rows, {int(batch.attention_mask.sum())} tokens, padded to "
              f"{batch.input_ids.shape[1]} each: {flops / 1e6:.0f} MFLOP a forward")

        servers = {"http": start_server(folder, args, []), "single": start_server(folder, args, ["--single-process"]),
                   "bare": start_bare_server()}
        try:
            body = {"model": "enc", "state": STATE, "questions": QUESTIONS}
            payload = json.dumps(body).encode()
            raw = {name: RawConnection(port) for name, (_, port, _) in servers.items()}
            lean = HTTPConnection("127.0.0.1", servers["http"][1], timeout=30)
            with httpx.Client(base_url=f"http://127.0.0.1:{servers['http'][1]}", timeout=30) as client:
                def post() -> None:
                    response = client.post("/v1/systemone", json=body)
                    if response.status_code != 200:
                        raise SystemExit(f"HTTP {response.status_code}: {response.text[:500]}")

                def post_lean() -> None:
                    lean.request("POST", "/v1/systemone", payload, {"content-type": "application/json"})
                    response = lean.getresponse()
                    text = response.read()
                    if response.status != 200:
                        raise SystemExit(f"HTTP {response.status}: {text[:500]!r}")

                def poster(name: str, headers: dict[str, str] | None = None):
                    call = raw[name].poster("/v1/systemone", payload, headers)

                    def post_raw() -> None:
                        status, text = call()
                        if status != 200:
                            raise SystemExit(f"HTTP {status}: {text[:500]!r}")
                    return post_raw

                work_ms = statistics.median(timed(lambda: model.runtime.forward(batch), 50))
                # interleaved in rounds of 10 calls each, so drift of a shared machine touches them all alike
                calls = {"forward": lambda: model.runtime.forward(batch),
                         "tiny": lambda: model.runtime.forward(tiny),
                         "predict": lambda: model.predict(STATE, QUESTIONS), "http": poster("http"),
                         "http.client": post_lean, "httpx": post, "single": poster("single"),
                         "bare": poster("bare", {"x-work-ms": f"{work_ms:.3f}"})}
                times: dict[str, list[float]] = {name: [] for name in [*calls, "paused"]}
                for call in calls.values():
                    timed(call, 0, warmup=20)
                for _ in range(max(1, args.repeats // 10)):
                    for name, call in calls.items():
                        time.sleep(0.05)  # the other side's thread pools go idle first (ONNX Runtime spins)
                        times[name] += timed(call, 10, warmup=1)
                    time.sleep(0.05)
                    times["paused"] += timed(calls["forward"], 10, warmup=0, pause_s=PAUSE_S)
            # wrk runs for seconds on end, so its figure is set beside forwards timed just before and after it
            native = None
            if shutil.which("wrk"):
                before = timed(calls["forward"], 50)
                p50, p99 = wrk_latency(servers["http"][1], payload)
                native = p50, p99, statistics.median(before + timed(calls["forward"], 50))
        finally:
            for server, _, log in servers.values():
                server.terminate()
                server.wait(30)
                log.close()
        forward, predict, http = times["forward"], times["predict"], times["http"]
        f50 = statistics.median(forward)
        print(line("runtime.forward (2 rows)", forward, None)
              + f"   {flops / f50 / 1e6:.0f} GFLOP/s")
        paused = statistics.median(times["paused"])
        print(line(f"runtime.forward after {PAUSE_S * 1000:g} ms pauses", times["paused"], f50)
              + f"   (as a server meets it; HTTP p50 is {statistics.median(times['http']) - paused:+.2f} ms over it)")
        print(line(f"runtime.forward (1 row, {tiny.input_ids.shape[1]} tokens)", times["tiny"], None)
              + "   (the fixed cost of a forward)")
        print(line("Model.predict", predict, f50))
        print(line("HTTP, 1 keep-alive connection", http, f50))
        for name, client in (("http.client", "http.client"), ("httpx", "an httpx.Client")):
            print(line(f"  the same from {client}", times[name], f50)
                  + f"   (the client's own cost: +{statistics.median(times[name]) - statistics.median(http):.2f} ms)")
        if native:
            p50, p99, around = native
            print(f"    the same from wrk, back to back  p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   ({p50 - around:+.2f} /"
                  f" {p99 - around:+.2f} ms over the forward's {around:.2f} ms, timed around it)")
        print(line("  the same, serve --single-process", times["single"], f50)
              + f"   (the engine process costs +{statistics.median(http) - statistics.median(times['single']):.2f}"
              f" / +{float(np.percentile(http, 99) - np.percentile(times['single'], 99)):.2f} ms)")
        floor = statistics.median(times["bare"]) - work_ms  # what HTTP costs any Python server around busy work
        above = {name: statistics.median(times[name]) - f50 - floor for name in ("single", "http")}
        print(line("  the floor: a bare ASGI app", times["bare"], work_ms)
              + f"   (over its {work_ms:.2f} ms of busy work; the stack above the floor: {above['single']:+.2f} ms"
              f" single-process, {above['http']:+.2f} ms with the engine process)")
        f99 = float(np.percentile(forward, 99))
        print(f"  p99 beside the forward's own p99 ({f99:.2f} ms): HTTP {float(np.percentile(http, 99)) - f99:+.2f} ms,"
              f" single-process {float(np.percentile(times['single'], 99)) - f99:+.2f} ms")
        hop(folder, args, model)


def wrk_latency(port: int, payload: bytes, seconds: int = 5) -> tuple[float, float]:
    """p50 and p99 in ms of `wrk` at one connection POSTing `payload` for `seconds`."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                     f"wrk.body = {json.dumps(payload.decode())}\n")
        script.flush()
        command = ["wrk", "-t1", "-c1", f"-d{seconds}s", "--latency", "-s", script.name,
                   f"http://127.0.0.1:{port}/v1/systemone"]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise SystemExit(f"wrk met answers other than 200:\n{out}")
    units = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
    ms = {pct: float(value) * units[unit]
          for pct, value, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)$", out, re.MULTILINE)}
    if set(ms) != {"50", "99"}:
        raise SystemExit(f"wrk's latency lines not found:\n{out}")
    return ms["50"], ms["99"]


def start_server(folder: Path, args: argparse.Namespace, extra: list[str]) -> tuple[subprocess.Popen, int, Any]:
    """`laya serve` of the checkpoint on a free loopback port, ready."""
    return started(["-m", "laya.cli", "serve", "-m", f"enc={folder}", "-r", args.runtime, "--threads",
                    str(args.threads), *extra, *args.serve_args], "the server", 180)


def start_bare_server() -> tuple[subprocess.Popen, int, Any]:
    """`bare_asgi.py` under uvicorn with uvicorn's defaults, as `laya serve` runs it, ready."""
    return started(["-m", "uvicorn", "--app-dir", str(HERE), "bare_asgi:app", "--log-level", "warning",
                    "--no-access-log"], "the bare ASGI server", 60)


def started(command: list[str], what: str, seconds: float) -> tuple[subprocess.Popen, int, Any]:
    """`python COMMAND --port P` on a free loopback port, once /ready answers; its log is kept for a failure."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by the caller
    server = subprocess.Popen([sys.executable, *command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    if not wait_ready(f"http://127.0.0.1:{port}", server, seconds):
        server.kill()
        log.seek(0)
        raise SystemExit(f"{what} did not become ready:\n{log.read()[-3000:]}")
    return server, port, log


def _echo(conn) -> None:
    """The pipe floor's far end: send back what comes, after keeping busy for the milliseconds it names
    (as a forward pass would), until None."""
    from bare_asgi import spin

    while (message := conn.recv()) is not None:
        if message["busy_ms"]:
            spin(message["busy_ms"])
        conn.send(message)


def hop(folder: Path, args: argparse.Namespace, model) -> None:
    """prepare + execute in this process and through the engine process, interleaved."""
    import functools

    from laya.encoder.engine import EncoderEngine
    from laya.engine import ForwardingEngine
    from laya.request import Request
    from laya.server.remote import RemoteEngine
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    local = EncoderEngine(model)
    options = ServeOptions(runtime=args.runtime, threads=args.threads)
    remote = RemoteEngine(functools.partial(load_engine, ModelSpec(str(folder), name="enc"), options))
    loop = asyncio.new_event_loop()
    remote.serve_on(loop)  # as `laya serve` does: replies are read on the loop that awaits them
    try:
        def run(engine) -> None:
            job = engine.prepare(Request.of([STATE], QUESTIONS))
            if isinstance(engine, ForwardingEngine):  # the engine process: one round trip
                loop.run_until_complete(engine.submit(job))
            else:
                engine.execute([job])

        ctx = multiprocessing.get_context("spawn")
        near, far = ctx.Pipe(duplex=True)
        echo = ctx.Process(target=_echo, args=(far,), daemon=True)
        echo.start()
        busy_ms = statistics.median(timed(lambda: run(local), 30))
        message = {"states": [STATE], "questions": QUESTIONS, "pad": "x" * 400}  # about a packed request's size

        def echoed(busy: float):
            def call() -> None:
                near.send({**message, "busy_ms": busy})
                near.recv()
            return call

        calls = {"local": lambda: run(local), "remote": lambda: run(remote), "pipe": echoed(0.0),
                 "pipe_busy": echoed(busy_ms)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():
            timed(call, 0, warmup=20)
        for _ in range(max(1, args.repeats // 10)):
            for name, call in calls.items():
                time.sleep(0.05)
                times[name] += timed(call, 10, warmup=1)
    finally:
        near.send(None)
        echo.join(10)
        remote.close()
        loop.close()
    l50 = statistics.median(times["local"])
    print(line("engine prepare+execute, here", times["local"], None))
    print(line("the same in the engine process", times["remote"], l50))
    one_way = (statistics.median(times["remote"]) - l50) / 2
    print(f"  one hop, one way (half the p50 difference: a request is one round trip): {one_way:.3f} ms")
    floor = statistics.median(times["pipe"]) / 2
    cold = (statistics.median(times["pipe_busy"]) - busy_ms) / 2
    print(f"  the floor: a bare pipe, one way (half a pickled echo's p50): {floor:.3f} ms warm, {cold:.3f} ms"
          f" when the far end was busy {busy_ms:.2f} ms first")


if __name__ == "__main__":
    main()
