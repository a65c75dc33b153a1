"""The FastAPI application: parse, route to an engine, batch, format errors. No model logic here."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders

from laya.api import ALIASES, ApiError, check_size, error_body, parse_systemone, question_error, usage_error
from laya.errors import LayaError, QuestionError
from laya.limits import Limits
from laya.questions import Question
from laya.schema import request_schema
from laya.server import heap
from laya.server.admission import SHED_ROUTES, Admission
from laya.server.batcher import InferenceFailed, MicroBatcher, Overloaded, PassThrough, Unavailable
from laya.server.body import check_media_type, check_tree, decode, parse_json, read_body
from laya.server.metrics import Metrics

log = logging.getLogger("laya.server")
access_log = logging.getLogger("laya.server.access")
REQUEST_ID = "x-typesafe-request-id"
# A client may ask for a shorter deadline than the server's --request-timeout-s (seconds, > 0).
TIMEOUT_HEADER = "x-laya-timeout-s"
STATIC = Path(__file__).parent / "static"
ROUTES = {"/v1/systemone", "/v1/systemone/batch", "/v1/models", "/health", "/ready", "/metrics", "/"}


LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


@dataclass
class ServerConfig:
    api_key: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_wait_ms: float = 0.0  # 0: an idle engine starts at once; what queued while it ran batches
    max_batch_rows: int = 64
    max_pending_rows: int = 512  # rows waiting or running per model before 429
    max_concurrency: int = 64  # decision requests inside the server at once; more are shed at the door
    # Shed at the door while the work inside would take longer than this to drain (None: no bound of
    # its own; a request is shed when the queue cannot drain within its deadline).
    max_queue_ms: float | None = None
    request_timeout_s: float = 30.0  # a request's deadline; a client may ask for less (TIMEOUT_HEADER)
    drain_s: float = 30.0  # on SIGTERM/SIGINT: how long what is in flight may take to finish
    shed_hold_ms: float = 1000.0  # how long a shed 429 is held before it is sent (at most its Retry-After)
    # With engines in processes of their own: the HTTP loop yields the CPU to them under contention.
    http_nice: int = 0
    retry_after_s: int = 1
    limits: Limits = field(default_factory=Limits)
    # With no API key on a loopback bind, only loopback Host names are served (no DNS rebinding).
    loopback_only: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.limits, dict):  # rebuilt from JSON in worker processes
            self.limits = Limits(**self.limits)


def host_name(host: str) -> str:
    """The name part of a Host header (`[::1]:8000` -> `[::1]`, `localhost:8000` -> `localhost`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def guard(headers: dict[str, str], config: ServerConfig) -> tuple[int, str, str] | None:
    """Refusals made before anything else (status, error type, message): a Host that is not a
    loopback name when the server has no key on a loopback bind (DNS rebinding), and a cross-origin
    browser request (another site's page posting to this server)."""
    host = headers.get("host", "")
    if config.loopback_only and not config.api_key and host_name(host) not in LOOPBACK_NAMES:
        return (421, "misdirected_request", f"this server answers only loopback host names without an API key, "
                                            f"not {host[:100]!r}")
    origin = headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1].rstrip("/").lower() != host.strip().lower():
        return (403, "cross_origin_refused", f"requests from the web origin {origin[:100]!r} are refused; "
                                             "call the API from a server or the same origin")
    return None


@dataclass
class Served:
    """What the server has loaded; filled by a background thread so /ready can say 503 meanwhile."""

    engines: dict[str, Any] = field(default_factory=dict)
    batchers: dict[str, MicroBatcher] = field(default_factory=dict)
    default: str | None = None
    ready: bool = False
    load_errors: list[str] = field(default_factory=list)
    draining_since: float | None = None  # monotonic time SIGTERM/SIGINT began the drain

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def begin_drain(self) -> None:
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            log.info("draining: new decision requests get 503, what is in flight finishes")

    def unready(self) -> dict[str, dict[str, Any]]:
        """The models that cannot answer now (an engine process restarting or down), by name."""
        out = {}
        for name, engine in self.engines.items():
            status = engine.status()
            if status.get("state") != "ready":
                out[name] = status
        return out


def request_timeout(raw: str | None, config: ServerConfig) -> tuple[float, str | None]:
    """A request's time budget in seconds and, if the client's header is unusable, why. The header
    may only shorten the server's bound."""
    if raw is None:
        return config.request_timeout_s, None
    try:
        asked = float(raw)
    except ValueError:
        asked = math.nan
    if not math.isfinite(asked) or asked <= 0:
        return config.request_timeout_s, (f"the {TIMEOUT_HEADER} header must be a positive number of seconds, "
                                          f"not {raw[:40]!r}")
    return min(asked, config.request_timeout_s), None


def timeout_error(budget_s: float, config: ServerConfig) -> ApiError:
    which = (f"its {TIMEOUT_HEADER} header" if budget_s < config.request_timeout_s
             else "the server's --request-timeout-s")
    return usage_error(504, "timeout_error", f"the request was not answered within its deadline of {budget_s:g} s "
                                             f"({which}); its remaining work was stopped")


class RequestContext:
    """Pure ASGI middleware: a request id on every response, metrics, one access-log line, and a
    500 with a body (and a logged traceback) for anything that escapes a route.

    Pure ASGI rather than BaseHTTPMiddleware, which wraps `receive` and hides client disconnects.
    """

    def __init__(self, app, metrics: Metrics, config: ServerConfig, admission: Admission, served: Served):
        self.app = app
        self.metrics = metrics
        self.config = config
        self.admission = admission
        self.served = served

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] in SHED_ROUTES:
            began = time.monotonic()
            raw = next((v for k, v in scope.get("headers", ()) if k.lower() == TIMEOUT_HEADER.encode()), None)
            budget, _ = request_timeout(raw.decode("latin-1") if raw is not None else None, self.config)
            if self.served.draining:  # stopping: refused at once, the connection closed after the answer
                self.metrics.request(scope["path"], 503, 0.0)
                return await self.admission.refuse_draining(send, _request_id(scope))
            if not self.admission.try_enter(budget):  # at the door: no body read, no parsing, no log line
                self.metrics.shed(scope["path"])
                return await self.admission.shed(send, _request_id(scope))
            scope.setdefault("state", {})["deadline"] = began + budget
            try:
                return await self._handle(scope, receive, send)
            finally:
                self.admission.leave()
        return await self._handle(scope, receive, send)

    async def _handle(self, scope, receive, send):
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        rid = (headers.get(REQUEST_ID) or "")[:128] or uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["rid"], state["log"] = rid, {}
        status = {"code": 500, "started": False}
        began = time.perf_counter()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.append(REQUEST_ID, rid)
                if self.served.draining:  # no further request on this connection: the server is stopping
                    headers["connection"] = "close"
                status["code"], status["started"] = message["status"], True
            await send(message)

        try:
            refused = guard(headers, self.config)
            if refused is not None:
                code, kind, message = refused
                await send_with_id({"type": "http.response.start", "status": code,
                                    "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body",
                            "body": json.dumps({"detail": {"error_type": kind, "message": message}}).encode()})
                return
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("internal error on %s %s (request %s)", scope["method"], scope["path"], rid)
            if not status["started"]:
                body = json.dumps({"detail": {"error_type": "internal_error",
                                              "message": f"internal error; request id {rid}"}}).encode()
                await send_with_id({"type": "http.response.start", "status": 500,
                                    "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
        finally:
            elapsed = time.perf_counter() - began
            route = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.request(route, status["code"], elapsed)
            if route.startswith("/v1/systemone"):
                access_log.info(json.dumps({"id": rid, "route": route, "status": status["code"],
                                            "ms": round(elapsed * 1000, 2), **state["log"]}))


DRAIN_QUIET_S = 0.3  # the drain ends once nothing is inside and no request came for this long ...
DRAIN_MIN_S = 1.0  # ... or nothing is inside and the drain has lasted this long


def drain_on_signals(served: Served, admission: Admission, drain_s: float) -> None:
    """SIGTERM and SIGINT begin a drain instead of a stop: decision requests get 503 with Retry-After
    (their connections closed after it), /ready says 503, and what is in flight finishes, for at most
    `drain_s`; then the server's own handler stops it. A second signal stops it at once."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def stop(sig: int, frame: Any) -> None:
        handler = previous[sig]
        if callable(handler):
            handler(sig, frame)
        else:
            raise SystemExit(0)

    def finish(sig: int, frame: Any) -> None:
        began = time.monotonic()
        while time.monotonic() - began < drain_s:
            now = time.monotonic()
            if admission.inside == 0 and (now - admission.last_seen >= DRAIN_QUIET_S or now - began >= DRAIN_MIN_S):
                break
            time.sleep(0.02)
        left = admission.inside
        log.info("drained in %.2f s%s; stopping", time.monotonic() - began,
                 f" ({left} requests still in flight after --drain-s {drain_s:g})" if left else "")
        stop(sig, frame)

    def on_signal(sig: int, frame: Any) -> None:
        if served.draining or drain_s <= 0:
            stop(sig, frame)
            return
        served.begin_drain()
        threading.Thread(target=finish, args=(sig, frame), name="laya-drain", daemon=True).start()

    for sig in previous:
        signal.signal(sig, on_signal)


def _request_id(scope) -> bytes | None:
    return next((v for k, v in scope.get("headers", ()) if k.lower() == REQUEST_ID.encode()), None)


def create_app(load: Callable[[], list[Any]], config: ServerConfig | None = None,
               on_load_failure: Callable[[], None] | None = None, drain_signals: bool = False) -> FastAPI:
    """`load` returns the engines to serve (the first is the default); it runs after start-up, so
    /health and /ready answer while models load. If it fails, `on_load_failure` is called.
    `drain_signals`: SIGTERM/SIGINT drain the server (`laya serve` owns its process; an app hosted by
    Ray Serve or a test's thread leaves the signals to its host)."""
    config = config or ServerConfig()
    served = Served()
    metrics = Metrics()

    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()

        def load_all() -> None:
            try:
                engines = load()
                for engine in engines:
                    engine.warmup()
                heap.freeze_loaded()
                frozen.set()
            except Exception as exc:  # reported on /health; `laya serve` stops (on_load_failure)
                if isinstance(exc, LayaError):
                    log.error("loading models failed: %s", exc)
                else:
                    log.exception("loading models failed")
                served.load_errors.append(f"{type(exc).__name__}: {exc}")
                if on_load_failure is not None:
                    on_load_failure()
                return
            loop.call_soon_threadsafe(_activate, engines)

        def _activate(engines: list[Any]) -> None:
            if config.http_nice:  # this thread (the event loop) and the threads it starts from now on
                try:
                    os.nice(config.http_nice)
                except OSError as exc:
                    log.warning("could not lower the HTTP loop's CPU priority: %s", exc)
            for engine in engines:
                metrics.engines[engine.name] = engine.status
                # an engine that batches where it runs (a Ray Serve deployment) gets every job at once
                kind = PassThrough if engine.batches_where_it_runs else MicroBatcher
                batcher = kind(engine, max_wait_ms=config.max_wait_ms, max_rows=config.max_batch_rows,
                                       max_pending_rows=config.max_pending_rows, on_batch=metrics.batch)
                batcher.start()
                served.engines[engine.name] = engine
                served.batchers[engine.name] = batcher
                metrics.queue_depth[engine.name] = lambda b=batcher: b.pending_rows
            served.default = engines[0].name if engines else None
            served.ready = bool(engines)
            log.info("ready: serving %s (default %s)", ", ".join(served.engines), served.default)

        frozen = threading.Event()
        threading.Thread(target=load_all, name="laya-load", daemon=True).start()
        if drain_signals and threading.current_thread() is threading.main_thread():
            drain_on_signals(served, admission, config.drain_s)
        yield
        for batcher in served.batchers.values():
            await batcher.stop()
        for engine in served.engines.values():
            engine.close()  # an engine process is stopped, not restarted
        if frozen.is_set():
            heap.thaw()

    app = FastAPI(title="laya", version="0.1.0", lifespan=lifespan,
                  description="System One decisions (`/v1/systemone`) from laya checkpoints.")
    app.state.served = served
    app.state.metrics = metrics
    app.state.config = config
    def retry_after() -> int:
        """Seconds until the work queued now has drained, at the measured rate (the slowest model)."""
        return max((b.retry_after() for b in served.batchers.values()), default=config.retry_after_s)

    def rows_per_s() -> float | None:
        """The slowest served model's measured drain rate."""
        rates = [b.drain.rows_per_s for b in served.batchers.values() if b.drain.rows_per_s]
        return min(rates) if rates else None

    admission = Admission(config.max_concurrency, retry_after, hold_s=config.shed_hold_ms / 1000.0,
                          rows_per_s=rows_per_s,
                          max_queue_s=math.inf if config.max_queue_ms is None else config.max_queue_ms / 1000.0)
    app.state.admission = admission
    app.add_middleware(RequestContext, metrics=metrics, config=config, admission=admission, served=served)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse(error_body(exc.detail), status_code=exc.status, headers=exc.headers)

    def check_auth(request: Request) -> None:
        if not config.api_key:
            return
        header = request.headers.get("authorization")
        if not header:
            raise usage_error(403, "authentication_error", "missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise usage_error(401, "authentication_error", "invalid API key")

    def resolve(name: str | None) -> str:
        if not served.ready:
            raise usage_error(503, "overloaded_error", "the models are still loading",
                              {"Retry-After": str(max(1, config.retry_after_s))})
        if name is None or name in ALIASES or (name.startswith("jev-") and name not in served.engines):
            return served.default  # type: ignore[return-value]
        if name not in served.engines:
            raise usage_error(404, "api_usage_error",
                              f"unknown model {name!r}; this server serves {', '.join(served.engines)}")
        return name

    async def read_json(request: Request, batch: bool = False) -> Any:
        """The validated request: media type, body and JSON checked, parsed off the event loop."""
        headers = request.headers
        check_media_type(headers.get("content-type"), browser="origin" in headers or "sec-fetch-mode" in headers)
        raw = await read_body(request, config.max_body_bytes)

        def parse() -> Any:
            data = decode(raw, headers.get("content-encoding"), config.max_body_bytes)
            body = parse_json(data)
            if isinstance(body, dict):
                check_size(body, batch, config.limits)  # counted before anything is walked or validated
            check_tree(body, data)
            return parse_systemone(body, batch=batch, limits=config.limits)

        return await run_in_threadpool(parse)

    def overloaded(detail: str, retry_after: int) -> ApiError:
        return usage_error(429, "rate_limit_error", f"too many requests in flight ({detail}); retry after "
                                                    f"{retry_after} s", {"Retry-After": str(retry_after)})

    def unavailable(name: str, exc: Unavailable) -> ApiError:
        metrics.unavailable(name)
        return usage_error(503, "overloaded_error", f"{exc}; retry after {exc.retry_after} s",
                           {"Retry-After": str(exc.retry_after)})

    def deadline_of(request: Request) -> tuple[float, float]:
        """The request's deadline (monotonic) and its budget in seconds; a bad header is a 400."""
        budget, problem = request_timeout(request.headers.get(TIMEOUT_HEADER), config)
        if problem:
            raise usage_error(400, "invalid_request_error", problem)
        deadline = request.scope.get("state", {}).get("deadline")
        return (deadline if deadline is not None else time.monotonic() + budget), budget

    async def answer(request: Request, name: str, states: list[Any], questions: list[Question], **options: Any
                     ) -> list[dict]:
        engine, batcher = served.engines[name], served.batchers[name]
        deadline, budget = deadline_of(request)
        rows = len(states) * len(questions)
        admission.note_rows(rows)
        try:  # admission in rows, before tokenising: under overload a 429 must cost next to nothing
            batcher.reserve(rows)
        except Overloaded as exc:
            raise overloaded(str(exc), exc.retry_after) from exc
        try:
            job = await run_in_threadpool(engine.prepare, states, questions, limits=config.limits,
                                          deadline=deadline, **options)
        except QuestionError as exc:
            batcher.release(rows)
            raise question_error(exc) from exc
        except Unavailable as exc:
            batcher.release(rows)
            raise unavailable(name, exc) from exc
        except BaseException:
            batcher.release(rows)
            raise
        request.state.log.update(model=name, questions=len(questions), states=len(states))
        work = engine.rows(job)  # a tournament takes more rows than states x questions
        batcher.resize(rows, work)
        task = asyncio.ensure_future(batcher.submit(job, work))
        while True:
            done, _ = await asyncio.wait({task}, timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            if done:
                break
            gone = await request.is_disconnected()
            if gone or time.monotonic() >= deadline:  # stop its remaining forward passes / decisions
                job.cancelled.set()
                task.cancel()
                if gone:
                    request.state.log.update(disconnected=True)
                    raise ApiError(499, {"error_type": "client_closed", "message": "the client went away"})
                request.state.log.update(timed_out=True)
                raise timeout_error(budget, config)
        try:
            results, timing = task.result()
        except Overloaded as exc:
            raise overloaded(str(exc), exc.retry_after) from exc
        except Unavailable as exc:
            raise unavailable(name, exc) from exc
        except QuestionError as exc:
            raise question_error(exc) from exc
        except InferenceFailed as exc:
            raise usage_error(500, "internal_error", f"inference failed; request id {request.state.rid}") from exc
        if len(results) != len(states) and job.cancelled.is_set():  # stopped by its deadline where it ran
            request.state.log.update(timed_out=True)
            raise timeout_error(budget, config)
        request.state.log.update(input_tokens=sum(r["usage"]["input_tokens"] for r in results),
                                 queue_ms=round(timing.queue_ms, 2), inference_ms=round(timing.inference_ms, 2),
                                 batch_jobs=timing.batch_jobs, batch_rows=timing.batch_rows)
        for result in results:
            result["model"] = name
        return results

    @app.post("/v1/systemone", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": request_schema(config.limits)}}}})
    async def systemone(request: Request):
        """Answer typed questions (choice, score, noul) about one state."""
        check_auth(request)
        req = await read_json(request)
        name = resolve(req.model)
        (result,) = await answer(request, name, [req.state], req.questions, reuse_prefix=req.reuse_prefix,
                                 tournament=req.tournament)
        return JSONResponse(result)

    @app.post("/v1/systemone/batch", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": request_schema(config.limits, batch=True)}}}})
    async def systemone_batch(request: Request):
        """The same questions over many states, in shared forward passes."""
        check_auth(request)
        req = await read_json(request, batch=True)
        name = resolve(req.model)
        results = await answer(request, name, req.state, req.questions, reuse_prefix=req.reuse_prefix,
                               tournament=req.tournament)
        total = sum(r["usage"]["input_tokens"] for r in results)
        return JSONResponse({"model": name, "results": results,
                             "total_usage": {"input_tokens": total, "output_tokens": 0}})

    @app.get("/v1/models")
    async def models(request: Request):
        """Served models and the jev aliases, in Jev's shape."""
        check_auth(request)
        out = [{"name": n, "description": e.description, "release_date": e.release_date or "2026-01-01"}
               for n, e in served.engines.items()]
        if served.default:
            out += [{"name": alias, "description": f"alias of {served.default}",
                     "release_date": served.engines[served.default].release_date or "2026-01-01"}
                    for alias in ALIASES]
        return {"models": out}

    @app.get("/health")
    async def health():
        """Liveness, what is loaded, on which runtime and device."""
        unready = served.unready()
        status = "draining" if served.draining else "degraded" if unready or served.load_errors else "ok"
        return {"status": status, "ready": served.ready and not unready and not served.draining,
                "default": served.default,
                "models": {n: {**e.describe(), "status": e.status()} for n, e in served.engines.items()},
                "queue_rows": {n: b.pending_rows for n, b in served.batchers.items()},
                "load_errors": served.load_errors}

    @app.get("/ready")
    async def ready():
        """200 while every model can answer; 503 while loading, while a model's engine process is
        restarting or down (naming it and why), and while the server drains to stop."""
        unready = served.unready()
        if served.ready and not unready and not served.draining:
            return {"ready": True}
        body: dict[str, Any] = {"ready": False}
        if served.draining:
            body["draining"] = True
        if not served.ready:
            body["loading"] = not served.load_errors
        if unready:
            body["models"] = {n: {k: v for k, v in st.items() if k in ("state", "reason", "since")}
                              for n, st in unready.items()}
        if served.load_errors:
            body["load_errors"] = served.load_errors
        retry = max([1] + [st.get("retry_after_s", 1) for st in unready.values()])
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(retry)})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def demo():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return Response(status_code=204)

    return app
