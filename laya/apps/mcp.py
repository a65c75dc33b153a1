"""`laya mcp`: the System One decisions as tools of a Model Context Protocol server (the official SDK).

An agent reaches a model through seven tools: `choice`, `score` and `noul` (one question each),
`predict` (a whole System One request), `decide` (a JSON schema's typed values), `plan` (what a
request would take, before it runs: `laya.plan`) and `models`.
Every request goes through the server's own validation (`laya.request.parse_request`) and limits
(`laya.limits.Limits`), and is answered on the same paths as a JSONL run (`laya.apps.jsonl`): here by an
engine (`local_answer`), or, with `--url`, by a running `laya serve` (`remote_answer`). A request
the server would refuse with a 4xx is a tool error (`isError`) carrying the server's message; no
request takes the server down.

The handshake and the tool list answer at once: the model loads in a background thread started
with the server, and a tool called during the load waits for it, sending a progress notification
about every second (an agent harness otherwise sees a call that hangs without a word).

Transports: stdio (the default, what agent harnesses launch), or streamable HTTP (`--http`, bound
to 127.0.0.1 unless told), where a configured key (`--api-key-file` or `LAYA_API_KEY`, as for
`laya serve`) is required as `Authorization: Bearer <key>`, else 401. In front of a running server
(`--url`), that server's key comes from `--url-key-file` alone (laya.apps.outbound).

Test seam: `build_server` takes the load function, and the environment variable
`LAYA_MCP_LOAD_DELAY_S` (seconds) makes the command's load sleep first, so tests can reach the
server while its model is still loading without a model that is slow to load.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import anyio
from pydantic import Field

from laya.api import ApiError, question_error
from laya.apps.jsonl import Line, api_failure, failure, local_answer, remote_answer, server_failure
from laya.apps.outbound import bearer, request_async
from laya.errors import LayaError, QuestionError
from laya.limits import Limits
from laya.plan import HEADROOM
from laya.redaction import redact
from laya.request import parse_request

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as exc:  # the [mcp] extra
    raise LayaError("`laya mcp` needs the MCP SDK: pip install 'laya-runtime[mcp]'") from exc

LOAD_DELAY_ENV = "LAYA_MCP_LOAD_DELAY_S"  # test seam: the command's load sleeps this long first
PROGRESS_EVERY_S = 1.0
QID = "answer"  # the question id of the one-question tools
DEFAULT_PORT = 8765
LOOPBACK = ("127.0.0.1", "localhost", "::1")

State = Annotated[str | dict[str, Any] | list[Any], Field(
    description="What to decide about: text (a message, a document, a conversation transcript) or a JSON object "
                "or array (a ticket, a record, a list of turns), read as it is")]
Question = Annotated[str, Field(description="The question, in plain words, e.g. 'Which team should handle this?'")]
MinConfidence = Annotated[float | None, Field(
    ge=0.0, le=1.0, description="Optional abstention gate in [0, 1]: an answer whose top probability is below it "
                                "is marked x_low_confidence (x_abstention 'abstained'); treat it as 'not sure'")]


# --- the model, loading in the background -----------------------------------------------------------


class Loader:
    """The model's load, started once in a daemon thread, so the protocol answers while it runs;
    callers wait on it (with progress) instead of getting a refusal."""

    def __init__(self, load: Callable[[], Any], source: str) -> None:
        self.load, self.source = load, source
        self.engine: Any = None
        self.error: str | None = None
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            self.started = time.monotonic()
            self.thread = threading.Thread(target=self._run, name="laya-mcp-load", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            engine = self.load()
            engine.warmup()  # first-call costs paid here, not by the agent's first question
            self.engine = engine
        except Exception as exc:  # noqa: BLE001 - any load failure is reported to every caller
            self.error = f"{self.source} could not be loaded: {exc}"
        finally:
            self.done.set()

    @property
    def state(self) -> str:
        if not self.done.is_set():
            return "loading"
        return "ready" if self.engine is not None else "failed"

    async def wait(self, ctx: Context | None) -> Any:
        """The engine, once loaded; meanwhile a progress notification every `PROGRESS_EVERY_S`."""
        self.start()
        while not self.done.is_set():
            elapsed = time.monotonic() - self.started
            if ctx is not None:
                await ctx.report_progress(round(elapsed, 1), None, f"loading {self.source} ({elapsed:.0f} s)")
            await anyio.to_thread.run_sync(self.done.wait, PROGRESS_EVERY_S)
        if self.engine is None:
            raise ToolError(self.error or f"{self.source} could not be loaded")
        return self.engine


def delayed(load: Callable[[], Any], delay_s: float | None = None) -> Callable[[], Any]:
    """`load`, after the test seam's sleep (`LAYA_MCP_LOAD_DELAY_S`) when it is set."""
    if delay_s is None:
        raw = os.environ.get(LOAD_DELAY_ENV)
        delay_s = float(raw) if raw else 0.0
    if delay_s <= 0:
        return load

    def slow() -> Any:
        time.sleep(delay_s)
        return load()

    return slow


# --- who answers: an engine here, or a running laya serve --------------------------------------------


def _raise_failure(error: dict[str, Any]) -> None:
    """A System One refusal as the tool error the agent reads: its kind and the server's message."""
    message = re.sub(r"(^|; )body\.", r"\1", str(error.get("message", "")))  # paths inside the request
    raise ToolError(f"{error.get('type', 'invalid_request')}: {message}")


def _outcome(outcome: dict[str, Any]) -> dict[str, Any]:
    if "error" in outcome:
        _raise_failure(outcome["error"])
    return outcome["response"]


class Backend(Protocol):
    async def respond(self, body: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        """The System One response to a request body; a `ToolError` naming the problem otherwise."""

    async def plan(self, body: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        """What the request would take (`laya.plan`), with no forward pass; a `ToolError` if invalid."""

    async def models(self) -> list[dict[str, Any]]: ...

    @property
    def name(self) -> str | None: ...


def _parsed(body: dict[str, Any], limits: Limits, plan: bool = False) -> Any:
    """The request validated as the server validates it (a plan's against its headroom), or the tool
    error naming the problem."""
    try:
        return parse_request(body, limits=limits.times(HEADROOM) if plan else limits)
    except ApiError as exc:
        _raise_failure(api_failure(exc))


@dataclass
class LocalBackend:
    """An engine in this process (the encoder's or the decide engine), answered through
    `laya.apps.jsonl.local_answer`: validation, limits and budgets as in the server. One request runs at
    a time: a llama.cpp context is not shared between threads."""

    loader: Loader
    limits: Limits = field(default_factory=Limits)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str | None:
        return self.loader.engine.info.name if self.loader.engine is not None else None

    async def respond(self, body: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        engine = await self.loader.wait(ctx)
        answer = local_answer(engine, self.limits)

        def run() -> dict[str, Any]:
            with self.lock:
                try:
                    return answer([Line(1, 1, body)])[0]
                except QuestionError as exc:  # raised by one job's execute (local_answer lets it through)
                    return {"error": api_failure(question_error(exc))}
                except LayaError as exc:
                    return {"error": failure(422, "invalid_request", str(exc))}

        return _outcome(await anyio.to_thread.run_sync(run))

    async def plan(self, body: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        req = _parsed(body, self.limits, plan=True)
        engine = await self.loader.wait(ctx)

        def run() -> dict[str, Any]:
            with self.lock:
                return engine.plan(req, limits=self.limits)

        return await anyio.to_thread.run_sync(run)

    async def models(self) -> list[dict[str, Any]]:
        loader, engine = self.loader, self.loader.engine
        entry: dict[str, Any] = {"name": engine.info.name if engine is not None else None,
                                 "source": redact(str(loader.source)), "state": loader.state}
        if engine is not None:
            described = engine.describe()
            entry.update(engine=described.get("kind"), runtime=described.get("runtime"),
                         description=engine.info.description)
        elif loader.error:
            entry["error"] = redact(loader.error)
        else:
            entry["loading_s"] = round(time.monotonic() - loader.started, 1)
        return [entry]


@dataclass
class RemoteBackend:
    """A running `laya serve` (`--url`): each request validated here first (the same parse and
    limits), then POSTed to /v1/systemone with the key by `laya.apps.jsonl.remote_answer`, which retries
    a 429 or 503 after its Retry-After and gives a 4xx as the server words it."""

    url: str
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        self.answer = remote_answer(self.url, self.api_key, concurrency=4)

    @property
    def name(self) -> str | None:
        return None

    async def respond(self, body: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        _parsed(body, self.limits)
        return _outcome(await anyio.to_thread.run_sync(lambda: self.answer([Line(1, 1, body)])[0]))

    async def plan(self, body: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        import httpx

        _parsed(body, self.limits, plan=True)
        try:
            async with httpx.AsyncClient(base_url=self.url.rstrip("/"), headers=bearer(self.api_key),
                                         timeout=60) as client:
                r = await request_async(client, "POST", "/v1/systemone/plan", json=body)
        except (httpx.HTTPError, LayaError) as exc:
            raise ToolError(f"unreachable: {self.url} cannot be reached: {exc}") from exc
        if r.status_code != 200:
            _raise_failure(server_failure(r))
        return r.json()

    async def models(self) -> list[dict[str, Any]]:
        import httpx

        try:
            async with httpx.AsyncClient(base_url=self.url.rstrip("/"), headers=bearer(self.api_key),
                                         timeout=10) as client:
                listed = await request_async(client, "GET", "/v1/models")
                ready = await request_async(client, "GET", "/ready")
        except (httpx.HTTPError, LayaError) as exc:
            raise ToolError(f"unreachable: {self.url} cannot be reached: {exc}") from exc
        if listed.status_code != 200:
            raise ToolError(f"{self.url}/v1/models answered {listed.status_code}: {listed.text[:300]}")
        state = "ready" if ready.status_code == 200 else "loading"
        return [{"name": m.get("name"), "engine": "laya serve", "url": self.url, "state": state,
                 "description": m.get("description")} for m in listed.json().get("models", [])]

    def close(self) -> None:
        self.answer.close()  # type: ignore[attr-defined]


# --- the requests the one-question tools send ----------------------------------------------------------


def _instructions(question: str, instructions: str | None) -> str:
    return question if not instructions else f"{question}\n\n{instructions}"


def choice_body(state: Any, question: str, options: list[str] | dict[str, str | None],
                instructions: str | None = None) -> dict[str, Any]:
    return {"state": state, "questions": {QID: {"type": "choice", "instructions": _instructions(question, instructions),
                                                "criteria": options}}}


def score_levels(levels: list[str] | None, minimum: int | None, maximum: int | None) -> list[str]:
    """A score's levels, lowest first: as given, or the integers minimum..maximum (as `decide` plans an
    integer field). Both or neither: a mix is refused by the question's own validation."""
    if levels is not None:
        if minimum is not None or maximum is not None:
            raise ToolError("invalid_question: give either levels or minimum and maximum, not both")
        return levels
    if minimum is None or maximum is None:
        raise ToolError("invalid_question: a score needs levels (a list, lowest first) or both minimum and maximum")
    if maximum < minimum:
        raise ToolError(f"invalid_question: maximum {maximum} is below minimum {minimum}")
    if maximum - minimum + 1 > 10:
        raise ToolError(f"invalid_question: {maximum - minimum + 1} levels; a score takes 2 to 10 (narrow the range)")
    return [str(v) for v in range(minimum, maximum + 1)]


def score_body(state: Any, question: str, levels: list[str], instructions: str | None = None) -> dict[str, Any]:
    return {"state": state, "questions": {QID: {"type": "score", "instructions": _instructions(question, instructions),
                                                "criteria": levels}}}


def noul_body(state: Any, question: str, instructions: str | None = None) -> dict[str, Any]:
    return {"state": state, "questions": {QID: {"type": "noul", "instructions": _instructions(question,
                                                                                             instructions)}}}


def _gate(min_confidence: float | None) -> Any:
    from laya.structured.gate import check_min_confidence

    try:
        return check_min_confidence(min_confidence)
    except QuestionError as exc:
        raise ToolError(f"invalid_min_confidence: {exc}") from exc


def one_answer(response: dict[str, Any], min_confidence: float | None) -> dict[str, Any]:
    """The one question's answer, gated by `min_confidence` as `Model.predict` gates it, with the model."""
    from laya.structured.gate import apply_gate

    apply_gate([response], _gate(min_confidence))
    return {**response["answers"][QID], "model": response.get("model")}


# --- decide: a schema's values --------------------------------------------------------------------------


async def decide_values(backend: Backend, state: Any, schema: dict[str, Any], min_confidence: float | None,
                        ctx: Context | None) -> dict[str, Any]:
    """`Model.decide(state, schema, return_details=True)`, step for step, with the questions answered
    by `backend`: so a chat GGUF and a remote server decide a schema too, within the same limits."""
    from laya.questions import check_state
    from laya.structured.plan import plan_schema, questions_of
    from laya.structured.values import details, settle

    threshold = _gate(min_confidence)
    try:
        fields = plan_schema(schema)
    except QuestionError as exc:
        raise ToolError(f"invalid_schema: {exc}") from exc
    asked = questions_of([f for f in fields if not f.certain])
    if asked:
        response = await backend.respond({"state": state, "questions": asked}, ctx)
    else:  # every field has one possible value: nothing to read
        try:
            check_state(state)
        except QuestionError as exc:
            raise ToolError(f"invalid_state: {exc}") from exc
        response = {"model": backend.name, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}
    return details(settle(response, fields, threshold), response).to_json()


# --- the server -----------------------------------------------------------------------------------------

INSTRUCTIONS = """\
laya answers questions about a state (a text, a conversation, a JSON record) with calibrated
probabilities, in milliseconds, without generating text. Use `choice` to pick one of a few labels,
`score` for a rating on a small scale, `noul` for a yes/no, `decide` to fill a JSON schema's enum,
boolean and bounded-integer fields at once, `predict` for several questions in one call (the full
System One request). Read the probabilities: a top probability near 1/len(options) means the model
does not know; pass min_confidence to get such answers marked x_low_confidence and decide yourself
(or ask a human) then. `models` says what is served and whether it is still loading."""


def build_server(backend: Backend, *, name: str = "laya") -> MCPServer:
    """The MCP server over `backend`, its seven tools registered (nothing loads here: the backend's
    loader is started by whoever runs the server, or by the first call)."""
    server = MCPServer(name, instructions=INSTRUCTIONS, log_level="WARNING")
    for tool in _tools(backend):
        server.add_tool(tool, description=tool.__doc__)
    return server


def _tools(backend: Backend) -> list[Callable[..., Awaitable[Any]]]:
    return _question_tools(backend) + _request_tools(backend)


def _question_tools(backend: Backend) -> list[Callable[..., Awaitable[Any]]]:
    """One question per call, each typed: what an agent reaches for first."""

    async def choice(state: State, question: Question,
                     options: Annotated[list[str] | dict[str, str | None], Field(
                         description="2 to 255 options: a list of labels, or a map label -> what the label "
                                     "means (descriptions help the model)")],
                     instructions: Annotated[str | None, Field(
                         description="Optional guidance added after the question (criteria, edge cases)")] = None,
                     min_confidence: MinConfidence = None, ctx: Context | None = None) -> dict[str, Any]:
        """Pick ONE option for a state: routing, intent, category, sentiment label. Returns `choice` (the
        chosen label), `probabilities` (label -> probability, summing to 1) and `confidence`."""
        response = await backend.respond(choice_body(state, question, options, instructions), ctx)
        return one_answer(response, min_confidence)

    async def score(state: State, question: Question,
                    levels: Annotated[list[str] | None, Field(
                        description="2 to 10 level descriptions, lowest first (level 0 = the first), e.g. "
                                    "['calm', 'annoyed', 'angry']; or give minimum and maximum instead")] = None,
                    minimum: Annotated[int | None, Field(description="Lowest value of an integer scale")] = None,
                    maximum: Annotated[int | None, Field(
                        description="Highest value of an integer scale (at most 10 values in all)")] = None,
                    instructions: Annotated[str | None, Field(
                        description="Optional guidance added after the question")] = None,
                    min_confidence: MinConfidence = None, ctx: Context | None = None) -> dict[str, Any]:
        """Rate a state on an ordered scale of 2-10 levels: urgency, severity, satisfaction, quality.
        Returns `score` (the expected level, 0-based, fractional), `probabilities` per level ("0", "1",
        ...), `legend` (level -> description) and, for a minimum/maximum scale, `value` (the most
        probable value on that scale)."""
        body = score_body(state, question, score_levels(levels, minimum, maximum), instructions)
        out = one_answer(await backend.respond(body, ctx), min_confidence)
        if minimum is not None and out.get("probabilities"):
            from laya.structured.values import score_level

            out["value"] = minimum + score_level(out)
        return out

    async def noul(state: State, question: Annotated[str, Field(
                       description="A yes/no question or a statement to check, e.g. 'Does the customer ask for a "
                                   "refund?'")],
                   instructions: Annotated[str | None, Field(
                       description="Optional guidance added after the question")] = None,
                   min_confidence: MinConfidence = None, ctx: Context | None = None) -> dict[str, Any]:
        """Answer a yes/no question about a state. Returns `noul`, the probability of YES (0 to 1; 0.5 means
        undecided); read `noul >= 0.5` as yes."""
        response = await backend.respond(noul_body(state, question, instructions), ctx)
        return one_answer(response, min_confidence)

    return [choice, score, noul]


def _request_tools(backend: Backend) -> list[Callable[..., Awaitable[Any]]]:
    """Whole requests, schemas, plans and the models: the System One contract itself."""

    async def predict(request: Annotated[dict[str, Any], Field(
                          description="A System One request body: {\"state\": ..., \"questions\": {id: {\"type\": "
                                      "\"choice\"|\"score\"|\"noul\", \"instructions\": ..., \"criteria\": ...}}, "
                                      "optional \"tournament\", \"x_overflow\", \"x_order\", \"x_min_confidence\", "
                                      "\"reuse_prefix\" (docs/request-options.md)}; choice criteria are a map option "
                                      "-> description or a list of options (optional \"x_shortlist\": K), score "
                                      "criteria a list of levels, noul criteria optional {\"true\", \"false\"} "
                                      "descriptions")],
                      ctx: Context | None = None) -> dict[str, Any]:
        """Several questions about one state in one call (they share the model's reading of the state):
        the full System One request, answered as `laya serve`'s POST /v1/systemone answers it. Returns
        {"model", "answers": {id: answer}, "usage"}."""
        return await backend.respond(request, ctx)

    async def decide(state: State, schema: Annotated[dict[str, Any], Field(
                         description="A JSON schema object with 'properties': enum (or const / Literal) fields become "
                                     "choices, booleans yes/no questions, integers with minimum and maximum (at most "
                                     "10 values) scores; each property's 'description' is its question")],
                     min_confidence: MinConfidence = None, ctx: Context | None = None) -> dict[str, Any]:
        """Fill a JSON schema's fields from a state in one call: structured extraction of labels, flags and
        ratings. Returns `values` (field -> typed value; None where gated by min_confidence),
        `probabilities` and `confidence` per field, and the raw `answers`."""
        return await decide_values(backend, state, schema, min_confidence, ctx)

    async def plan(request: Annotated[dict[str, Any], Field(
                       description="A System One request body, as for predict")],
                   ctx: Context | None = None) -> dict[str, Any]:
        """What a request would take before running it: per question the rows and tokens (per option
        too), how much of the state is kept and which end is dropped, which server limits it is near
        or over, the refusal it would get, and the runtime that would answer. Nothing is computed by
        the model: call it to check a large state or many options before predict."""
        return await backend.plan(request, ctx)

    async def models() -> dict[str, Any]:
        """What this server answers with: each model's name, engine, and state ('loading', 'ready' or
        'failed', with the error). Tools called while a model loads wait for it, reporting progress."""
        return {"models": await backend.models()}

    return [predict, decide, plan, models]


# --- HTTP: bearer auth in front of the SDK's streamable HTTP app -----------------------------------------


class BearerAuth:
    """An ASGI wrapper: with a key, every HTTP request must carry `Authorization: Bearer <key>` (401
    otherwise, compared in constant time); lifespan events pass through to the SDK's app."""

    def __init__(self, app: Any, api_key: str | None) -> None:
        self.app, self.key = app, api_key or None

    def allowed(self, scope: dict[str, Any]) -> bool:
        from laya.auth import key_given

        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        return key_given(header.decode("latin-1"), self.key)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.allowed(scope):
            from starlette.responses import JSONResponse

            response = JSONResponse({"error": "unauthorized", "message": "missing or invalid API key: send "
                                                                         "'Authorization: Bearer <key>'"},
                                    status_code=401, headers={"WWW-Authenticate": 'Bearer realm="laya"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def serve_http(server: MCPServer, host: str, port: int, api_key: str | None) -> None:
    """The streamable HTTP transport at http://HOST:PORT/mcp, behind the key (when there is one)."""
    import uvicorn

    app = BearerAuth(server.streamable_http_app(host=host), api_key)
    print(f"laya: MCP over streamable HTTP at http://{host}:{port}/mcp" + (" (bearer key required)" if api_key
                                                                           else ""), file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()


def run(*, load: Callable[[], Any] | None, source: str | None, url: str | None, api_key: str | None,
        url_key: str | None = None, http: bool = False, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
        limits: Limits | None = None) -> None:
    """`laya mcp`: a server over a model loaded here (`load`, started in the background now) or over a
    running `laya serve` (`url`, sent `url_key`), on stdio or HTTP (behind `api_key`)."""
    limits = limits or Limits()
    backend: Backend
    if url is not None:
        backend = RemoteBackend(url, url_key, limits)
    else:
        assert load is not None
        loader = Loader(delayed(load), source or "the model")
        backend = LocalBackend(loader, limits)
        loader.start()
    server = build_server(backend)
    try:
        if http:
            if host not in LOOPBACK:
                print(f"laya: warning: MCP listening on {host}, reachable from other machines"
                      + ("" if api_key else " WITHOUT an API key"), file=sys.stderr)
            serve_http(server, host, port, api_key)
        else:
            server.run("stdio")
    finally:
        getattr(backend, "close", lambda: None)()
