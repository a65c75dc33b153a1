"""The HTTP routes, as plain module-level functions over one `Context` (what the server has loaded,
its configuration, metrics and admission), which `create_app` puts on `app.state.context`.

A decision request goes in a straight line: `read_json` (media type, body, JSON, one validation into
a typed `Request`), `resolve` (the model), `answer` (admission in rows, the engine's `prepare` off the
event loop, the batcher, the deadline and the caller's disconnect watched).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from laya.api import (
    ALIASES,
    STRICT_HEADER,
    ApiError,
    error_body,
    question_error,
    strict_error,
    strict_of,
    usage_error,
)
from laya.auth import key_given
from laya.engine import ForwardingEngine
from laya.errors import QuestionError
from laya.limits import Limits
from laya.plan import HEADROOM, merged
from laya.redaction import redact, redacted
from laya.request import Request, check_size, check_strict, parse_request
from laya.response import SystemOneResponse
from laya.routing.router import AUTO, by_role, roles_of
from laya.schema import chat_schema, request_schema
from laya.server.admission import DECISION_ROUTES, Admission
from laya.server.batcher import InferenceFailed, Overloaded, Unavailable
from laya.server.body import check_media_type, check_tree, decode, decoded_within, parse_json, read_body
from laya.server.call import Call, Reply, endpoint
from laya.server.metrics import Books, Metrics
from laya.server.openai import chat_completions
from laya.server.state import TIMEOUT_HEADER, Served, ServerConfig, request_timeout, timeout_error
from laya.server.work import describe_work, work_s
from laya.structured.gate import apply_gate

STATIC = Path(__file__).parent / "static"
# A body of at most this many bytes (decoded) is parsed, validated and prepared on the event loop:
# tens of microseconds of work, where the hop to a worker thread and back costs about half a
# millisecond on a busy two-core machine. Larger ones go to threads, so none holds the loop long.
INLINE_BYTES = 4096
T = TypeVar("T")


@dataclass
class Context:
    """What every route reads: set once by `create_app`, the same object for the server's life."""

    config: ServerConfig
    served: Served
    metrics: Metrics
    books: Books
    admission: Admission | None = None  # built right after, over this context's retry_after and rows_per_s
    digests: dict[str, str] = field(default_factory=dict)  # served name -> its short model digest
    speeds: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # served name -> its measured speed

    def retry_after(self) -> int:
        """Seconds until the work queued now has drained, at the measured rate (the slowest model)."""
        return max((b.retry_after() for b in self.served.batchers.values()), default=self.config.retry_after_s)

    def rows_per_s(self) -> float | None:
        """The slowest served model's measured drain rate."""
        rates = [b.drain.rows_per_s for b in self.served.batchers.values() if b.drain.rows_per_s]
        return min(rates) if rates else None

    def check_auth(self, request: Call | HTTPRequest, missing: int = 403) -> None:
        """The key, when the server has one. A missing key is a 403 in System One's contract; the
        OpenAI routes pass `missing=401`, what OpenAI's clients expect for both cases."""
        if not self.authorized(request):
            if not request.headers.get("authorization"):
                raise usage_error(missing, "authentication_error",
                                  "missing API key: send 'Authorization: Bearer <key>'")
            raise usage_error(401, "authentication_error", "invalid API key")

    def digest_header(self, name: str) -> dict[str, str] | None:
        """`X-Laya-Model-Digest`: the short digest of the artifacts that answered (`laya.digests`),
        worked out once per served model, not on every answer."""
        if name not in self.digests:
            engine = self.served.engines.get(name)
            if engine is None:
                return None
            self.digests[name] = engine.info.digest
        digest = self.digests[name]
        return {MODEL_DIGEST_HEADER: digest} if digest else None

    def authorized(self, request: Call | HTTPRequest) -> bool:
        return key_given(request.headers.get("authorization"), self.config.api_key)

    def resolve(self, name: str | None) -> str:
        if not self.served.ready:
            raise usage_error(503, "overloaded_error", "the models are still loading",
                              {"Retry-After": str(max(1, self.config.retry_after_s))})
        if name is not None and name.startswith(HOSTED_PREFIX + "jev-"):  # the hosted name, as OpenRouter gives it
            name = name[len(HOSTED_PREFIX):]
        if name is None or name in ALIASES or (name.startswith("jev-") and name not in self.served.engines):
            return self.served.default  # type: ignore[return-value]
        if name not in self.served.engines:
            raise usage_error(404, "api_usage_error",
                              f"unknown model {name!r}; this server serves {', '.join(self.served.engines)}")
        return name

    async def read_json(self, request: Call, batch: bool = False, plan: bool = False) -> Request:
        """The validated request: media type, body and JSON checked, parsed off the event loop. A
        plan's body is a request's (`state`, or `states` as for /batch), counted against the limits
        times `laya.plan.HEADROOM`, so that the plan can say by how much it is over."""
        limits = self.config.limits.times(HEADROOM) if plan else self.config.limits

        def many(body: Any) -> bool:
            return batch or (plan and isinstance(body, dict) and "states" in body and "state" not in body)

        def sized(body: Any) -> Any:
            if isinstance(body, dict):
                check_size(body, many(body), limits)  # counted before anything is walked or validated
            return body

        return await self.read_body(request, sized, lambda body: parse_request(
            body, batch=many(body), limits=limits, from_json=True, sized=True, default_order=self.config.order))

    async def read_body(self, request: Call, first: Callable[[Any], Any], then: Callable[[Any], T]) -> T:
        """A JSON body through `first` (checks before the tree is walked), the tree's bounds, then
        `then` (validation into a typed request): on the event loop for a small body, else on a thread."""
        headers = request.headers
        check_media_type(headers.get("content-type"), browser="origin" in headers or "sec-fetch-mode" in headers)
        raw = await read_body(request, self.config.max_body_bytes)
        encoding = headers.get("content-encoding")
        small = decoded_within(raw, encoding, INLINE_BYTES) if len(raw) <= INLINE_BYTES else None
        request.state.inline = small is not None

        def parse(data: bytes | None) -> T:
            small = data is not None  # a small body's keys are checked as it is parsed
            if data is None:
                data = decode(raw, encoding, self.config.max_body_bytes)
            body = first(parse_json(data, no_duplicates=small))
            check_tree(body, data, duplicates_checked=small)
            return then(body)

        if small is not None:  # tens of microseconds: less than the hop to a thread and back
            return parse(small)
        return await run_in_threadpool(parse, None)

    def overloaded(self, detail: str, retry_after: int) -> ApiError:
        return usage_error(429, "rate_limit_error", f"too many requests in flight ({detail}); retry after "
                                                    f"{retry_after} s", {"Retry-After": str(retry_after)})

    def unavailable(self, name: str, exc: Unavailable) -> ApiError:
        self.metrics.unavailable(name)
        return usage_error(503, "overloaded_error", f"{exc}; retry after {exc.retry_after} s",
                           {"Retry-After": str(exc.retry_after)})

    def deadline_of(self, request: Call) -> tuple[float, float]:
        """The request's deadline (monotonic) and its budget in seconds; a bad header is a 400."""
        budget, problem = request_timeout(request.headers.get(TIMEOUT_HEADER), self.config)
        if problem:
            raise usage_error(400, "invalid_request_error", problem)
        deadline = request.scope["state"].get("deadline")
        return (deadline if deadline is not None else time.monotonic() + budget), budget

    def speed(self, name: str) -> dict[str, Any] | None:
        """The served model's speed as it measured it at warm-up (its description's), read once."""
        if name not in self.speeds:
            self.speeds[name] = self.served.engines[name].describe().get("speed")
        return self.speeds[name]

    def work_deadline(self, request: Call, name: str, req: Request) -> tuple[float, float, str]:
        """The request's deadline, budget and, where its work extended the server's deadline, that work
        in words: a request may take as long as its work needs at the model's measured speed
        (`laya.server.work`), however short --request-timeout-s; a client's own shorter deadline holds."""
        deadline, budget = self.deadline_of(request)
        if not self.config.deadline_follows_work or request.headers.get(TIMEOUT_HEADER) is not None:
            return deadline, budget, ""
        speed = self.speed(name)
        allowed = math.ceil(work_s(req, speed, self.config.limits)) if speed else 0
        if allowed <= budget:
            return deadline, budget, ""
        return deadline + allowed - budget, allowed, describe_work(req, speed, self.config.limits)

    async def answer(self, request: Call, name: str, req: Request) -> list[SystemOneResponse]:
        engine, batcher = self.served.engines[name], self.served.batchers[name]
        deadline, budget, worked = self.work_deadline(request, name, req)
        rows = req.rows
        if self.admission is not None:
            self.admission.note_rows(rows)
        try:  # admission in rows, before tokenising: under overload a 429 must cost next to nothing
            batcher.reserve(rows)
        except Overloaded as exc:
            raise self.overloaded(str(exc), exc.retry_after) from exc
        try:
            if isinstance(engine, ForwardingEngine) or request.state.inline:  # a small request (or one packed
                # for the process that prepares it) is prepared here: cheaper than the hop to a thread
                job = engine.prepare(req, limits=self.config.limits, deadline=deadline)
            else:
                job = await run_in_threadpool(engine.prepare, req, limits=self.config.limits, deadline=deadline)
        except QuestionError as exc:
            batcher.release(rows)
            raise question_error(exc) from exc
        except Unavailable as exc:
            batcher.release(rows)
            raise self.unavailable(name, exc) from exc
        except BaseException:
            batcher.release(rows)
            raise
        request.state.log.update(model=name, questions=len(req.questions), states=len(req.states))
        work = job.n_rows  # what only the model counts: a tournament its row cannot hold, a scan's windows
        batcher.resize(rows, work)
        # awaited in this request's own task (which the watch cancels), not in a task of its own: a
        # task between them cost a turn of the event loop on the way to the engine and one back
        task = asyncio.current_task()
        assert task is not None  # an ASGI request runs in a task
        watch = Watch(request, task, job, deadline)
        try:
            results, timing = await batcher.submit(job, work)
        except asyncio.CancelledError:
            if watch.why is None:  # this request's own task was cancelled (the server is stopping)
                job.cancelled.set()
                raise
            task.uncancel()
            if watch.why == "gone":
                request.state.log.update(disconnected=True)
                raise ApiError(499, {"error_type": "client_closed", "message": "the client went away"}) from None
            request.state.log.update(timed_out=True)
            raise timeout_error(budget, self.config, worked) from None
        except Overloaded as exc:
            raise self.overloaded(str(exc), exc.retry_after) from exc
        except Unavailable as exc:
            raise self.unavailable(name, exc) from exc
        except QuestionError as exc:
            raise question_error(exc) from exc
        except InferenceFailed as exc:
            raise usage_error(500, "internal_error", f"inference failed; request id {request.state.rid}") from exc
        finally:
            watch.close()
        if len(results) != len(req.states) and job.cancelled.is_set():  # stopped by its deadline where it ran
            request.state.log.update(timed_out=True)
            raise timeout_error(budget, self.config, worked)
        request.state.log.update(input_tokens=sum(r.input_tokens for r in results),
                                 queue_ms=round(timing.queue_ms, 2), inference_ms=round(timing.inference_ms, 2),
                                 batch_jobs=timing.batch_jobs, batch_rows=timing.batch_rows)
        for result in results:
            result.model = name
        return results


    async def routed(self, request: Call, states: list[Any], lang: str | None
                     ) -> tuple[dict[str, str], list[Any]]:
        """For "auto": the served model of each role and each state's route (laya.routing.router), or the 404
        of a server that does not serve both an English and a multilingual model (503 while loading)."""
        self.resolve(None)
        roles = roles_of(list(self.served.engines))
        if roles is None:
            raise usage_error(404, "api_usage_error",
                              "model 'auto' chooses between an English and a multilingual model, and this server "
                              f"serves {', '.join(self.served.engines)}: serve both (laya serve -m laya -m "
                              "laya-multilingual, or -m english=PATH -m multilingual=PATH)")
        from laya.routing import route

        def routes_of() -> list[Any]:
            return [route(state, lang=lang) for state in states]  # each reads at most 4000 characters

        return roles, (routes_of() if request.state.inline else await run_in_threadpool(routes_of))

    async def answer_as(self, request: Call, req: Request) -> tuple[str, list[SystemOneResponse]]:
        """`answer` by the model a request names, or, for "auto", each state by the model its script
        and language route it to (laya.routing.router), the route reported on its answer."""
        if req.model != AUTO or AUTO in self.served.engines:
            name = self.resolve(req.model)
            return name, await self.answer(request, name, req)
        roles, routes = await self.routed(request, list(req.states), req.lang)
        out: list[SystemOneResponse | None] = [None] * len(req.states)
        for role, idx in by_role(routes):  # one model after the other: a request's states rarely need both
            name = roles[role]
            share = req.with_states([req.states[i] for i in idx])
            for i, result in zip(idx, await self.answer(request, name, share)):
                result.routed_to, result.route_reason = name, routes[i].reason
                out[i] = result
        request.state.log.update(model=AUTO)
        return AUTO, out  # type: ignore[return-value]

    async def plan(self, request: Call, name: str, req: Request) -> dict[str, Any]:
        """One served model's plan of the request, prepared on a worker thread (or in its engine process)
        within the request's deadline. A plan runs no forward pass, so it takes nothing from the rows
        decisions queue for: the door bounds plans in flight (a share of its own) instead."""
        engine = self.served.engines[name]
        deadline, budget = self.deadline_of(request)
        request.state.log.update(model=name, questions=len(req.questions), states=len(req.states), plan=True)
        try:
            out = await asyncio.wait_for(run_in_threadpool(engine.plan, req, limits=self.config.limits),
                                         timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            request.state.log.update(timed_out=True)
            raise timeout_error(budget, self.config) from None
        except Unavailable as exc:
            raise self.unavailable(name, exc) from exc
        except QuestionError as exc:
            raise question_error(exc) from exc
        out["model"] = name
        return out

    async def plan_auto(self, request: Call, req: Request) -> dict[str, Any]:
        """For "auto": each state planned on the model its route takes (as `answer_as` answers it), in
        the request's order; a figure's worst over the models' plans is the request's."""
        roles, routes = await self.routed(request, list(req.states), req.lang)
        out_states: list[Any] = [None] * len(req.states)
        plans = []
        for role, idx in by_role(routes):
            name = roles[role]
            one = await self.plan(request, name, req.with_states([req.states[i] for i in idx]))
            plans.append(one)
            for i, entry in zip(idx, one["states"]):
                out_states[i] = {**entry, "routed_to": name, "route_reason": routes[i].reason}
        return merged(AUTO, plans, [s for s in out_states if s is not None])



class Watch:
    """Stops a running request's job (its stop flag set, its task cancelled) when its caller goes
    away or its deadline passes, checked every `PERIOD_S` by a timer: a request answered sooner pays
    one timer and nothing else. `why` says what stopped it ("gone", "deadline"), None while it runs."""

    PERIOD_S = 0.05

    def __init__(self, request: Call, task: asyncio.Future, job: Any, deadline: float):
        self.why: str | None = None
        self._request, self._task, self._job, self._deadline = request, task, job, deadline
        self._loop = asyncio.get_running_loop()
        self._check: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._timer = self._loop.call_later(min(self.PERIOD_S, max(0.0, self._deadline - time.monotonic())),
                                            self._poke)

    def _poke(self) -> None:
        self._timer = None
        if self._task.done():
            return
        if time.monotonic() >= self._deadline:
            self._stop("deadline")
            return
        self._check = self._loop.create_task(self._caller_gone())

    async def _caller_gone(self) -> None:
        if await self._request.is_disconnected():
            self._stop("gone")
        elif not self._task.done():
            self._arm()

    def _stop(self, why: str) -> None:
        """Stop its remaining forward passes / decisions, where they run."""
        self.why = why
        self._job.cancelled.set()
        self._task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._check is not None and not self._check.done():
            self._check.cancel()


async def api_error(request: HTTPRequest, exc: ApiError) -> JSONResponse:
    strict = strict_error(request.headers.get(STRICT_HEADER), request.app.state.config.strict)
    return JSONResponse(error_body(exc.detail, strict), status_code=exc.status, headers=exc.headers)


def gate_with(req: Request, strict: bool) -> None:
    """`x_min_confidence` marks answers with `x_` fields, which a strict answer leaves out: the two
    together are refused (422) before any work, never one of them dropped."""
    try:
        check_strict(req.min_confidence, strict)
    except QuestionError as exc:
        raise question_error(exc) from exc


def rendered(results: list[SystemOneResponse], req: Request, strict: bool) -> list[dict[str, Any]]:
    """The answers as JSON, each marked against the request's `x_min_confidence` (`laya.structured.gate`)."""
    out = [r.to_json(strict) for r in results]
    apply_gate(out, req.min_confidence)
    return out


async def systemone(request: Call) -> Reply:
    """Answer typed questions (choice, score, noul) about one state."""
    ctx: Context = request.app.state.context
    ctx.check_auth(request)
    strict = strict_of(request.headers.get(STRICT_HEADER), ctx.config.strict)
    req = await ctx.read_json(request)
    gate_with(req, strict)
    name, (result,) = await ctx.answer_as(request, req)
    (out,) = rendered([result], req, strict)
    return Reply(out, headers=ctx.digest_header(result.routed_to or name))


async def systemone_batch(request: Call) -> Reply:
    """The same questions over many states, in shared forward passes."""
    ctx: Context = request.app.state.context
    ctx.check_auth(request)
    strict = strict_of(request.headers.get(STRICT_HEADER), ctx.config.strict)
    req = await ctx.read_json(request, batch=True)
    gate_with(req, strict)
    name, results = await ctx.answer_as(request, req)
    total = sum(r.input_tokens for r in results)
    return Reply({"model": name, "results": rendered(results, req, strict),
                  "total_usage": {"input_tokens": total, "output_tokens": 0}}, headers=ctx.digest_header(name))


async def systemone_plan(request: Call) -> Reply:
    """What a request would take, before any forward pass: per state and question the rows and
    tokens, the state kept and the end dropped, the limits it is near or over, the runtime."""
    ctx: Context = request.app.state.context
    ctx.check_auth(request)
    req = await ctx.read_json(request, plan=True)
    if req.model == AUTO and AUTO not in ctx.served.engines:
        return Reply(await ctx.plan_auto(request, req))
    name = ctx.resolve(req.model)
    return Reply(await ctx.plan(request, name, req))


MODEL_DIGEST_HEADER = "X-Laya-Model-Digest"
HOSTED_PREFIX = "typesafe/"  # OpenRouter names the hosted model typesafe/jev-<version>
# what /v1/models says of each model, beside its name: what exactly answers and where
PROVENANCE = ("runtime", "precision", "device", "model_digest", "digests", "calibration", "gate", "upgrade")


async def models(request: HTTPRequest):
    """Served models and the jev aliases, in Jev's shape (`models`) and OpenAI's (`object`, `data`) in one
    body, so `client.models.list()` of OpenAI's SDK lists what a System One client lists."""
    ctx: Context = request.app.state.context
    try:
        ctx.check_auth(request, missing=401)
    except ApiError as exc:
        return JSONResponse({**error_body(exc.detail), "error": {"message": exc.detail["message"],
                                                                 "type": exc.detail["error_type"], "param": None,
                                                                 "code": "invalid_api_key"}},
                            status_code=exc.status, headers={"WWW-Authenticate": 'Bearer realm="laya"'})
    out = []
    for n, e in ctx.served.engines.items():
        entry: dict[str, Any] = {"name": n, "description": redact(e.info.description),
                                 "release_date": e.info.release_date}
        described = e.describe()
        entry |= {f"x_{key}": described[key] for key in PROVENANCE if described.get(key) not in (None, "", {})}
        entry["x_limits"] = ctx.config.limits.published()
        if (readout := described.get("readout")) is not None:  # a GGUF's readout profile
            entry["x_readout"] = readout
        out.append(entry)
    if ctx.served.default:
        out += [{"name": alias, "description": f"alias of {ctx.served.default}",
                 "release_date": ctx.served.engines[ctx.served.default].info.release_date}
                for alias in ALIASES]
    roles = roles_of(list(ctx.served.engines))
    if roles and AUTO not in ctx.served.engines:
        out.append({"name": AUTO, "description": f"each state to {roles['english']} or {roles['multilingual']} by "
                                                 "its script and language",
                    "release_date": ctx.served.engines[roles["multilingual"]].info.release_date})
    created = int(ctx.served.started_at)
    return {"models": out, "object": "list",
            "data": [{"id": m["name"], "object": "model", "created": created, "owned_by": "laya"} for m in out]}


async def health(request: HTTPRequest):
    """Liveness: a status word for anyone; with the key (or with none configured) what is loaded, on
    which runtime and device, by names and digests (laya.redaction)."""
    ctx: Context = request.app.state.context
    unready = ctx.served.unready()
    status = "draining" if ctx.served.draining else "degraded" if unready or ctx.served.load_errors else "ok"
    if not ctx.authorized(request):
        return {"status": status}
    return redacted({"status": status, "ready": ctx.served.ready and not unready and not ctx.served.draining,
                     "default": ctx.served.default,
                     "models": {n: {**e.describe(), "status": e.status()} for n, e in ctx.served.engines.items()},
                     "queue_rows": {n: b.pending_rows for n, b in ctx.served.batchers.items()},
                     "limits": ctx.config.limits.published(),
                     "load_errors": ctx.served.load_errors})


async def ready(request: HTTPRequest):
    """200 while every model can answer; 503 while loading, while a model's engine process is
    restarting or down (naming it and why), and while the server drains to stop."""
    ctx: Context = request.app.state.context
    unready = ctx.served.unready()
    if ctx.served.ready and not unready and not ctx.served.draining:
        return {"ready": True}
    body: dict[str, Any] = {"ready": False}
    if ctx.served.draining:
        body["draining"] = True
    if not ctx.served.ready:
        body["loading"] = not ctx.served.load_errors
    if unready:
        body["models"] = {n: {k: v for k, v in st.items() if k in ("state", "reason", "since")}
                          for n, st in unready.items()}
    if ctx.served.load_errors:
        body["load_errors"] = ctx.served.load_errors
    retry = max([1] + [st.get("retry_after_s", 1) for st in unready.values()])
    return JSONResponse(redacted(body), status_code=503, headers={"Retry-After": str(retry)})


async def prometheus(request: HTTPRequest):
    ctx: Context = request.app.state.context
    if not ctx.config.public_metrics:
        ctx.check_auth(request, missing=401)
    ctx.books.flush()
    return PlainTextResponse(ctx.metrics.render(), media_type="text/plain; version=0.0.4")


async def demo(request: HTTPRequest):
    return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))


async def favicon(request: HTTPRequest):
    return Response(status_code=204)


def register(app: FastAPI, limits: Limits) -> None:
    """The routes on `app`; the request schemas in the OpenAPI document are those of `limits`."""

    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    for path in DECISION_ROUTES:  # one handler under the names clients and proxies use
        app.add_api_route(path, endpoint(systemone), methods=["POST"], openapi_extra=body(request_schema(limits)),
                          operation_id=f"decide{path.replace('/', '_')}")
    app.add_api_route("/v1/systemone/batch", endpoint(systemone_batch), methods=["POST"],
                      openapi_extra=body(request_schema(limits, batch=True)))
    app.add_api_route("/v1/systemone/plan", endpoint(systemone_plan), methods=["POST"],
                      openapi_extra=body({"oneOf": [request_schema(limits), request_schema(limits, batch=True)]}))
    app.add_api_route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"],
                      openapi_extra=body(chat_schema()))
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ready", ready, methods=["GET"])
    app.add_api_route("/metrics", prometheus, methods=["GET"], response_class=PlainTextResponse)
    app.add_api_route("/", demo, methods=["GET"], response_class=HTMLResponse, include_in_schema=False)
    app.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)
