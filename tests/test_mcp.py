"""`laya mcp` driven by the MCP SDK's own clients, as an agent harness drives it: a subprocess over
stdio and over streamable HTTP, on the generated checkpoint and on the SmolLM2 GGUF, and in front
of a running `laya serve` (`--url`).

Each server process runs one scripted session (a module fixture) and the tests read its transcript:
a process start and a model load cost seconds, the assertions nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from conftest import load_quiet, need, smollm2
from live_server import free_port, wait_ready

need("mcp", "the MCP SDK is not installed (the [mcp] extra)")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from laya.apps.mcp import LOAD_DELAY_ENV, QID, choice_body, noul_body, score_body  # noqa: E402

MCP = [sys.executable, "-m", "laya.cli", "mcp"]
TOOLS = {"choice", "score", "noul", "predict", "decide", "plan", "models"}
STATE = "Hi, I was charged twice for my subscription this month and I want the extra payment refunded."
LEVELS = ["calm", "annoyed", "angry"]
CHOICE = {"state": STATE, "question": "Which team should handle this message?",
          "options": {"billing": "payments, invoices and refunds", "sales": "new plans", "support": "bugs"}}
SCORE = {"state": STATE, "question": "How upset is the customer?", "levels": LEVELS}
SCALE = {"state": STATE, "question": "How urgent is this?", "minimum": 1, "maximum": 4}
NOUL = {"state": STATE, "question": "Does the customer ask for a refund?"}
REQUEST = {"state": STATE, "questions": {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "sales", "support"]},
    "urgent": {"type": "noul", "instructions": "Does this need action today?"},
    "anger": {"type": "score", "instructions": "How upset?", "criteria": LEVELS}}}
SCHEMA = {"type": "object", "properties": {
    "team": {"enum": ["billing", "sales", "support"], "description": "Which team should handle it?"},
    "refund": {"type": "boolean", "description": "Is a refund requested?"},
    "urgency": {"type": "integer", "minimum": 1, "maximum": 3, "description": "How urgent, 1 to 3?"},
    "kind": {"const": "ticket"}}}
CALLS = {"choice": ("choice", CHOICE), "score": ("score", SCORE), "scale": ("score", SCALE), "noul": ("noul", NOUL),
         "predict": ("predict", {"request": REQUEST}), "decide": ("decide", {"state": STATE, "schema": SCHEMA}),
         "plan": ("plan", {"request": REQUEST})}
# bad calls, and the words their error must contain
INVALID = {
    "option_type": ("predict", {"request": {"state": "x", "questions": {"q": {"type": "maybe"}}}}, "'maybe'"),
    "empty_options": ("choice", {**CHOICE, "options": []}, "at least 2 options"),
    "missing_state": ("noul", {"question": "Urgent?"}, "state"),
    "null_state": ("predict", {"request": {"state": None, "questions": REQUEST["questions"]}}, "state"),
    "too_long": ("noul", {**NOUL, "state": "refund " * 70000}, "max_tokens_exceeded"),
    "bad_schema": ("decide", {"state": STATE, "schema": {"type": "array"}}, "invalid_schema"),
    "bad_scale": ("score", {**SCALE, "maximum": 40}, "2 to 10"),
    "unknown_model": ("predict", {"request": {**REQUEST, "model": "nope"}}, "nope"),
    "plan_type": ("plan", {"request": {"state": "x", "questions": {"q": {"type": "maybe"}}}}, "'maybe'"),
}
TIMEOUT_S = 120


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment (the test session's cache, auto's fixed rule) without a key."""
    env = {k: v for k, v in os.environ.items() if k not in ("LAYA_API_KEY", LOAD_DELAY_ENV)}
    env.update(extra)
    return env


def stdio(*args: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[*MCP[1:], *args], env=child_env(**env))


async def session(client: Client, calls: dict[str, tuple[str, dict]], invalid: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"tools": (await client.list_tools()).tools}
    for key, (tool, args) in calls.items():
        out[key] = await client.call_tool(tool, args)
    for key, (tool, args, _) in (INVALID if invalid else {}).items():
        out[key] = await client.call_tool(tool, args)
    out["models"] = await client.call_tool("models", {})
    return out


def run(scenario: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    async def bounded() -> dict[str, Any]:
        with anyio.fail_after(TIMEOUT_S):
            return await scenario()

    return anyio.run(bounded)


def body_of(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The System One request a tool call stands for (what the same request to `predict` is)."""
    if tool == "choice":
        return choice_body(args["state"], args["question"], args["options"])
    if tool == "score":
        levels = args.get("levels") or [str(v) for v in range(args["minimum"], args["maximum"] + 1)]
        return score_body(args["state"], args["question"], levels)
    if tool == "noul":
        return noul_body(args["state"], args["question"])
    return args["request"]


def assert_close(got: Any, want: Any, where: str = "") -> None:
    """Equal, floats within 1e-6 (timings, `*_ms`, aside: they are the machine's, not the model's)."""
    if where.endswith("_ms"):
        return
    if isinstance(want, float) or isinstance(got, float):
        assert abs(float(got) - float(want)) <= 1e-6, f"{where}: {got} != {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def result(call: Any) -> dict[str, Any]:
    assert not call.is_error, call.content[0].text
    return call.structured_content


def check_against(transcript: dict[str, Any], predict: Callable[[dict], dict], decide: Callable | None) -> None:
    """Every tool's answer is the reference's for the same request."""
    for key, (tool, args) in CALLS.items():
        got = result(transcript[key])
        if tool == "decide":
            if decide is not None:
                assert_close(got, decide(args["state"], args["schema"]), key)
            assert got["values"]["kind"] == "ticket" and isinstance(got["values"]["refund"], bool)
            assert got["values"]["urgency"] in (1, 2, 3) and got["values"]["team"] in ("billing", "sales", "support")
            continue
        if tool == "plan":  # what the forward pass then uses: exactly, or at most where a prefix is reused
            want = predict(args["request"])
            assert got["object"] == "systemone.plan" and got["refused"] is None and got["rows"] == 3, key
            assert got["input_tokens"] >= want["usage"]["input_tokens"], key
            if got["input_tokens_exact"]:
                assert got["input_tokens"] == want["usage"]["input_tokens"], key
                assert got["states"][0]["state_tokens_kept"] == want["x_usage"]["state_tokens_kept"], key
            continue
        want = predict(body_of(tool, args))
        if tool == "predict":
            assert_close({k: v for k, v in got.items() if k != "x_usage"}, {k: v for k, v in want.items()
                                                                            if k != "x_usage"}, key)
            continue
        answer = dict(got)
        answer.pop("model")
        value = answer.pop("value", None)
        assert_close(answer, want["answers"][QID], key)
        if "minimum" in args:
            p = answer["probabilities"]
            assert value == args["minimum"] + max(range(len(p)), key=lambda i: round(p[str(i)], 4))


def check_errors(transcript: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    for key, (_, _, words) in INVALID.items():
        if key in skip:
            continue
        call = transcript[key]
        assert call.is_error, f"{key}: not an error: {call.structured_content}"
        assert words in call.content[0].text, f"{key}: {call.content[0].text!r} does not name {words!r}"


# --- stdio, the generated checkpoint, a slow load ----------------------------------------------------------

DELAY_S = 4.0


@pytest.fixture(scope="module")
def reference(checkpoint_dir):
    return load_quiet(checkpoint_dir)


def reference_predict(model) -> Callable[[dict], dict]:
    return lambda body: model.predict(body["state"], body["questions"])


@pytest.fixture(scope="module")
def stdio_run(checkpoint_dir, spawned) -> dict[str, Any]:
    """One session against `laya mcp -m CHECKPOINT` whose load takes DELAY_S longer than it does."""
    params = stdio("-m", str(checkpoint_dir), "--runtime", "torch", **{LOAD_DELAY_ENV: str(DELAY_S)})

    async def scenario() -> dict[str, Any]:
        started = time.monotonic()
        async with Client(params) as client:
            out: dict[str, Any] = {"handshake_s": time.monotonic() - started}
            out["early_tools"] = (await client.list_tools()).tools
            out["early_models"] = await client.call_tool("models", {})
            progress: list[tuple[float, str | None]] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append((value, message))

            out["first"] = await client.call_tool("choice", CHOICE, progress_callback=on_progress)
            out["first_s"] = time.monotonic() - started
            out["progress"] = progress
            out.update(await session(client, CALLS))
            return out

    return run(scenario)


def test_the_handshake_and_the_tool_list_answer_while_the_model_loads(stdio_run):
    assert {t.name for t in stdio_run["early_tools"]} == TOOLS
    (entry,) = result(stdio_run["early_models"])["models"]
    assert entry["state"] == "loading" and "loading_s" in entry
    assert stdio_run["handshake_s"] < stdio_run["first_s"]


def test_the_tools_are_described_and_typed_for_an_agent(stdio_run):
    tools = {t.name: t for t in stdio_run["early_tools"]}
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40
    choice = tools["choice"].input_schema
    assert set(choice["required"]) == {"state", "question", "options"}
    assert all(p.get("description") for p in choice["properties"].values())
    assert "ctx" not in choice["properties"]
    assert set(tools["decide"].input_schema["required"]) == {"state", "schema"}
    assert set(tools["predict"].input_schema["required"]) == {"request"}


def test_a_call_during_the_load_waits_with_progress_then_answers(stdio_run, reference):
    progress = stdio_run["progress"]
    assert len(progress) >= 2, progress  # about one a second while loading
    assert [p for p, _ in progress] == sorted(p for p, _ in progress)
    assert all("loading" in (m or "") for _, m in progress)
    got = result(stdio_run["first"])
    want = reference.predict(STATE, choice_body(**{k: CHOICE[k] for k in ("state", "question", "options")})
                             ["questions"])["answers"][QID]
    assert_close({k: v for k, v in got.items() if k != "model"}, want, "first")


def test_every_tool_answers_as_the_model_does(stdio_run, reference):
    check_against(stdio_run, reference_predict(reference),
                  lambda state, schema: reference.decide(state, schema, return_details=True).to_json())
    (entry,) = result(stdio_run["models"])["models"]
    assert entry["state"] == "ready" and entry["engine"] == "encoder" and entry["name"] == reference.name


def test_a_bad_call_is_a_tool_error_naming_the_problem(stdio_run):
    check_errors(stdio_run)
    assert "questions.q.type" in stdio_run["option_type"].content[0].text  # where, inside the request


# --- streamable HTTP, with a key ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spawned(checkpoint_dir, tmp_path_factory):
    """`laya mcp --http` and `laya serve` started together, before the stdio session, so their loads
    overlap it; the fixtures below wait for each when its tests come."""
    folder = tmp_path_factory.mktemp("keys")
    (folder / "mcp").write_text("s3cret-mcp\n")
    (folder / "serve").write_text("s3rve\n")
    ports = {"mcp": free_port(), "serve": free_port()}
    processes = {
        "mcp": subprocess.Popen([*MCP, "-m", str(checkpoint_dir), "--runtime", "torch", "--http", "--port",
                                 str(ports["mcp"]), "--api-key-file", str(folder / "mcp")],
                                env=child_env(), stderr=subprocess.PIPE, text=True),
        "serve": subprocess.Popen([sys.executable, "-m", "laya.cli", "serve", "-m", f"enc={checkpoint_dir}",
                                   "--single-process", "--port", str(ports["serve"]), "--api-key-file",
                                   str(folder / "serve")], env=child_env(), stderr=subprocess.PIPE, text=True)}
    try:
        yield {name: (processes[name], ports[name], folder / name) for name in processes}
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def http_server(spawned):
    process, port, key = spawned["mcp"]
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"laya mcp --http exited: {process.stderr.read()}")
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return url, key.read_text().strip()


@pytest.fixture(scope="module")
def http_run(http_server) -> dict[str, Any]:
    url, key = http_server
    calls = {**CALLS, "gated": ("noul", {**NOUL, "min_confidence": 0.999})}

    async def scenario() -> dict[str, Any]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300))
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            return await session(client, calls, invalid=True)

    return run(scenario)


def test_http_without_the_key_is_401(http_server):
    url, key = http_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"accept": "application/json, text/event-stream"}
    for auth in ({}, {"authorization": "Bearer wrong"}, {"authorization": key}):
        r = httpx.post(url, json=hello, headers={**headers, **auth}, timeout=10)
        assert r.status_code == 401, (auth, r.status_code)
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = httpx.post(url, json=hello, headers={**headers, "authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200


def test_http_answers_as_the_model_does(http_run, reference):
    assert {t.name for t in http_run["tools"]} == TOOLS
    check_against(http_run, reference_predict(reference),
                  lambda state, schema: reference.decide(state, schema, return_details=True).to_json())
    check_errors(http_run)


def test_min_confidence_marks_an_unsure_answer_over_http(http_run):
    gated = result(http_run["gated"])
    assert gated["x_abstention_threshold"] == 0.999
    assert gated["x_abstention"] == "abstained" and gated["x_low_confidence"] is True


# --- --url: a thin front for a running laya serve ---------------------------------------------------------------


@pytest.fixture(scope="module")
def served(spawned):
    process, port, key = spawned["serve"]
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process)
    return url, key


@pytest.fixture(scope="module")
def url_run(served) -> dict[str, Any]:
    url, key = served

    async def scenario() -> dict[str, Any]:
        async with Client(stdio("--url", url, "--url-key-file", str(key))) as client:
            out = await session(client, CALLS)
        async with Client(stdio("--url", url)) as keyless:
            out["keyless"] = await keyless.call_tool("noul", NOUL)
        return out

    return run(scenario)


def test_url_fronts_a_running_server(url_run, served):
    url, key = served
    headers = {"authorization": f"Bearer {key.read_text().strip()}"}

    def server_predict(body: dict) -> dict:
        r = httpx.post(url + "/v1/systemone", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    check_against(url_run, server_predict, None)
    check_errors(url_run)
    models = result(url_run["models"])["models"]
    assert {m["name"] for m in models} >= {"enc"} and all(m["state"] == "ready" for m in models)


def test_url_without_the_key_names_the_refusal(url_run):
    call = url_run["keyless"]
    assert call.is_error and "API key" in call.content[0].text


# --- the SmolLM2 GGUF (the decide engine) ------------------------------------------------------------------------


# the decide engine reads one prompt per option: seconds per call on a small shared machine
@pytest.fixture(scope="module")
def gguf_path() -> str:
    return str(smollm2())


@pytest.fixture(scope="module")
def gguf_run(gguf_path) -> dict[str, Any]:
    calls = {k: CALLS[k] for k in ("choice", "noul", "decide", "plan")}

    async def scenario() -> dict[str, Any]:
        async with Client(stdio("-m", gguf_path)) as client:
            out = await session(client, calls, invalid=False)
            for key in ("empty_options", "option_type", "missing_state"):
                tool, args, _ = INVALID[key]
                out[key] = await client.call_tool(tool, args)
            return out

    return run(scenario)


@pytest.mark.slow
def test_a_gguf_answers_as_its_decide_engine_does(gguf_run, gguf_path):
    from laya.decide.llama import open_gguf

    model = open_gguf(gguf_path)
    model.predict("warm-up", {"w": {"type": "noul", "instructions": "Is this a warm-up?"}})  # as the server warms up
    for key in ("choice", "noul"):
        tool, args = CALLS[key]
        want = model.predict(args["state"], body_of(tool, args)["questions"])["answers"][QID]
        got = result(gguf_run[key])
        got.pop("model")
        got.pop("value", None)
        assert_close(got, want, key)
    decided = result(gguf_run["decide"])
    assert decided["values"]["kind"] == "ticket" and set(decided["values"]) == set(SCHEMA["properties"])
    (entry,) = result(gguf_run["models"])["models"]
    assert entry["engine"] == "decide" and entry["state"] == "ready"
    planned = result(gguf_run["plan"])
    assert planned["engine"] == "decide" and planned["runtime"] == "llama.cpp" and planned["refused"] is None
    assert planned["states"][0]["decisions"] >= 3 and planned["states"][0]["context"] >= 2048
    for key in ("empty_options", "option_type", "missing_state"):
        assert gguf_run[key].is_error and INVALID[key][2] in gguf_run[key].content[0].text


def test_a_client_closing_during_a_compile_ends_the_process_cleanly(checkpoint_dir, tmp_path):
    """The client goes away while the model still compiles (native threads of its own in flight): the
    process exits 0, not with C++'s "terminate called without an active exception" (SIGABRT)."""
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "noul", "arguments": NOUL}}
    process = subprocess.Popen([*MCP, "-m", str(checkpoint_dir), "--runtime", "packed"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=child_env(LAYA_CACHE=str(tmp_path / "fresh-cache")))
    assert process.stdin is not None
    for message in (initialize, {"jsonrpc": "2.0", "method": "notifications/initialized"}, call):
        process.stdin.write((json.dumps(message) + "\n").encode())
    process.stdin.flush()
    time.sleep(4)  # the compile takes tens of seconds: it is in flight now
    process.stdin.close()
    process.wait(timeout=120)
    err = process.stderr.read()
    assert process.returncode == 0, err.decode()[-2000:]
    assert b"terminate called" not in err
