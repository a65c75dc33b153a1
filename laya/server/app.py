"""The FastAPI application: the guard and admission at the door, one access-log line per request, loading
and draining. The routes are `laya.server.routes`; no model logic here."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import FastAPI

from laya.api import STRICT_HEADER, ApiError, strict_error
from laya.auth import key_given
from laya.engine import AnyEngine, ForwardingEngine
from laya.errors import LayaError
from laya.server import heap, openai, routes
from laya.server.admission import DECISION_ROUTES, PLAN_ROUTE, SHED_ROUTES, Admission
from laya.server.batcher import MicroBatcher, PassThrough
from laya.server.call import Call, Reply, headers_of
from laya.server.metrics import Books, Metrics
from laya.server.request_ids import CLIENT_ID_CHARS, REQUEST_ID, REQUEST_ID_RAW, new_request_id, raw_request_id
from laya.server.routes import Context
from laya.server.state import TIMEOUT_HEADER, Served, ServerConfig, request_timeout
from laya.version import __version__

log = logging.getLogger("laya.server")
access_log = logging.getLogger("laya.server.access")
ROUTES = {*DECISION_ROUTES, "/v1/systemone/batch", "/v1/systemone/plan", "/v1/chat/completions", "/v1/models",
          "/health", "/ready", "/metrics", "/"}
# The decision routes, called straight from `RequestContext` (which `LayaApp` puts in front of
# FastAPI) instead of through FastAPI's and Starlette's layers of middleware, routing and endpoint
# wrapping (error, telemetry and body-limit middleware, exception handlers, exit stacks, the router,
# the route's request handler): 0.36 ms of a decision's ~4 ms around the model on a two-core machine
# (interleaved A/B). They read a `Call` and return a `Reply` (laya.server.call), not Starlette's
# request and response objects. FastAPI still registers them, for the OpenAPI document and for every
# other method or a mounted prefix on these paths.
DIRECT = {**{("POST", path): routes.systemone for path in DECISION_ROUTES},
          ("POST", "/v1/systemone/batch"): routes.systemone_batch,
          ("POST", PLAN_ROUTE): routes.systemone_plan, ("POST", "/v1/chat/completions"): openai.chat_completions}


LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
DOCS = frozenset({"/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"})


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


class LayaApp(FastAPI):
    """The FastAPI app with `RequestContext` in front of it, outside FastAPI's and Starlette's own
    layers (error, telemetry and body-limit middleware): a decision request goes from uvicorn
    straight to its route; every other request goes through `RequestContext` into FastAPI as usual."""

    front: RequestContext | None = None

    async def __call__(self, scope, receive, send):
        if self.front is not None and scope["type"] == "http":
            scope["app"] = self
            return await self.front(scope, receive, send)
        return await super().__call__(scope, receive, send)


class RequestContext:
    """In front of the app (pure ASGI): a request id on every response, metrics, one access-log
    line, and a 500 with a body (and a logged traceback) for anything that escapes a route.

    Pure ASGI rather than BaseHTTPMiddleware, which wraps `receive` and hides client disconnects.
    `app` is the FastAPI app's own stack, for every route that is not a decision route.
    """

    def __init__(self, app, metrics: Metrics, config: ServerConfig, admission: Admission, served: Served,
                 books: Books):
        self.app = app
        self.books = books
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
                return await self.admission.refuse_draining(send, raw_request_id(scope), scope["path"])
            if not self.admission.try_enter(budget, plan=scope["path"] == PLAN_ROUTE):  # at the door: no body
                self.metrics.shed(scope["path"])  # read, no parsing, no log line
                return await self.admission.shed(send, raw_request_id(scope), scope["path"])
            scope.setdefault("state", {})["deadline"] = began + budget
            try:
                return await self._handle(scope, receive, send)
            finally:
                self.admission.leave(plan=scope["path"] == PLAN_ROUTE, since=began)
        return await self._handle(scope, receive, send)

    async def _handle(self, scope, receive, send):
        headers = headers_of(scope)
        rid = (headers.get(REQUEST_ID) or "")[:CLIENT_ID_CHARS] or new_request_id()
        state = scope.setdefault("state", {})
        state["rid"], state["log"] = rid, {}
        status = [500, False]  # the status sent, and whether the response has begun
        began = time.perf_counter()
        try:
            refused = guard(headers, self.config)
            route = DIRECT.get((scope["method"], scope["path"]))
            if refused is not None:
                code, kind, message = refused
                await self._reply(send, Reply({"detail": {"error_type": kind, "message": message}}, code), rid, status)
            elif route is not None:
                try:
                    reply = await route(Call(scope, receive, headers))
                except ApiError as exc:
                    reply = Reply.error(exc, strict_error(headers.get(STRICT_HEADER), self.config.strict))
                await self._reply(send, reply, rid, status)
            elif scope["path"] in DOCS and not self.config.public_docs \
                    and not key_given(headers.get("authorization"), self.config.api_key):
                body = {"detail": {"error_type": "authentication_error", "message": "the API documents need the "
                                   "key: send 'Authorization: Bearer <key>' (or serve with --public-docs)"}}
                await self._reply(send, Reply(body, 401, {"WWW-Authenticate": 'Bearer realm="laya"'}), rid, status)
            else:
                await self.app(scope, receive, self._with_id(send, rid, status))
        except Exception:
            log.exception("internal error on %s %s (request %s)", scope["method"], scope["path"], rid)
            if not status[1]:
                body = {"detail": {"error_type": "internal_error", "message": f"internal error; request id {rid}"}}
                await self._reply(send, Reply(body, 500), rid, status)
        finally:
            elapsed = time.perf_counter() - began
            route = scope["path"] if scope["path"] in ROUTES else "other"
            logged = route.startswith(("/v1/systemone", "/v1/chat")) or route in DECISION_ROUTES
            line = ({"id": rid, "route": route, "status": status[0], "ms": round(elapsed * 1000, 2),
                     **state["log"]} if logged else None)
            self.books.add(route, status[0], elapsed, line)

    def _finish(self, raw: list[tuple[bytes, bytes]], rid: str) -> list[tuple[bytes, bytes]]:
        """A response's headers with the request id, and `connection: close` while the server drains
        (no further request on this connection)."""
        raw.append((REQUEST_ID_RAW, rid.encode("latin-1")))
        if self.served.draining:
            raw = [h for h in raw if h[0].lower() != b"connection"] + [(b"connection", b"close")]
        return raw

    async def _reply(self, send, reply: Reply, rid: str, status: list) -> None:
        """A decision route's answer (or a refusal) as two ASGI messages, rendered before either is sent."""
        body = reply.body()
        start = {"type": "http.response.start", "status": reply.status,
                 "headers": self._finish(reply.raw_headers(body), rid)}
        status[0], status[1] = reply.status, True
        await send(start)
        await send({"type": "http.response.body", "body": body})

    def _with_id(self, send, rid: str, status: list):
        """`send` for a route FastAPI answers: the same headers added, the status noted."""

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = self._finish(list(message.get("headers", ())), rid)
                status[0], status[1] = message["status"], True
            await send(message)

        return send_with_id


DRAIN_QUIET_S = 0.3  # the drain ends once nothing is inside and no request came for this long ...
DRAIN_MIN_S = 1.0  # ... or nothing is inside and the drain has lasted this long


def drain_on_signals(served: Served, admission: Admission, drain_s: float) -> None:
    """SIGTERM and SIGINT begin a drain instead of a stop: decision requests get 503 with Retry-After
    (their connections closed after it), /ready says 503, and what is in flight finishes, for at most
    `drain_s`; then the server's own handler stops it. A second signal stops it at once."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def stop(sig: int, frame: Any) -> None:
        handler = previous[signal.Signals(sig)]
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


def activate(engines: list[AnyEngine], served: Served, metrics: Metrics, config: ServerConfig) -> None:
    """Serve the loaded engines, on the event loop (their batchers start there): the first is the default."""
    if config.http_nice:  # this thread (the event loop) and the threads it starts from now on
        try:
            os.nice(config.http_nice)
        except OSError as exc:
            log.warning("could not lower the HTTP loop's CPU priority: %s", exc)
    for engine in engines:
        name = engine.info.name
        metrics.engines[name] = engine.status
        # an engine that batches where it runs (the engine process, a Ray Serve deployment) gets
        # every job at once
        batcher: MicroBatcher = (
            PassThrough(engine, max_pending_rows=config.max_pending_rows, on_batch=metrics.batch)
            if isinstance(engine, ForwardingEngine) else
            MicroBatcher(engine, batching=config.batching, max_pending_rows=config.max_pending_rows,
                         on_batch=metrics.batch))
        batcher.start()
        served.engines[name] = engine
        served.batchers[name] = batcher
        metrics.queue_depth[name] = partial(getattr, batcher, "pending_rows")
    served.default = engines[0].info.name if engines else None
    served.ready = bool(engines)
    log.info("ready: serving %s (default %s)", ", ".join(served.engines), served.default)


def create_app(load: Callable[[], list[AnyEngine]], config: ServerConfig | None = None,
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
            loop.call_soon_threadsafe(activate, engines, served, metrics, config)

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
        context.books.flush()

    app = LayaApp(title="laya", version=__version__, lifespan=lifespan,
                  description="System One decisions (`/v1/systemone`) from laya checkpoints.")
    app.state.served = served
    app.state.metrics = metrics
    app.state.config = config
    context = Context(config, served, metrics, Books(metrics, access_log))
    context.admission = Admission(
        config.max_concurrency, context.retry_after, hold_s=config.shed_hold_ms / 1000.0,
        rows_per_s=context.rows_per_s,
        max_queue_s=math.inf if config.max_queue_ms is None else config.max_queue_ms / 1000.0)
    admission = context.admission
    context.books.busy = lambda: admission.inside > 0
    app.state.context = context
    app.state.admission = admission
    app.front = RequestContext(partial(FastAPI.__call__, app), metrics=metrics, config=config,
                               admission=admission, served=served, books=context.books)
    app.add_exception_handler(ApiError, routes.api_error)  # type: ignore[arg-type]  # Starlette types any Exception
    routes.register(app, config.limits)
    return app
