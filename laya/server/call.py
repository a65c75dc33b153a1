"""A decision request as its route reads it, and the answer it gives, without Starlette's objects.

Why: the decision routes are the server's hot path, and on a small machine what a request costs
around the model is mostly the code it wakes up, not the work that code does. Starlette's `Request`
(its headers parsed again on every lookup, a body stream as an async generator, a `State` object
built on first use) and `JSONResponse` (rendering, header lists, then its own ASGI sends through our
wrapper) were one layer of that between uvicorn and the route. `Call` carries what the routes read:
the headers as one dict, built once by the front (`laya.server.app.RequestContext`), the request's
state (its id, its access-log fields, its deadline) and the body read straight from ASGI `receive`.
A route returns a `Reply`, which the front sends as two ASGI messages.

The same routes serve a request that reaches them through FastAPI (another method on these paths
is FastAPI's 405; a mounted prefix is routed by FastAPI): `endpoint` wraps a route for it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

from starlette.datastructures import State
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from laya.api import STRICT_HEADER, ApiError, error_body, strict_error


class Call:
    """One request on a decision route. `headers`: lower-case names to values, the first value of
    a repeated header (as Starlette's `Headers.get` reads it). `state`: the request's own fields
    (`rid`, `log`, `deadline`, `inline`, `many`) over the ASGI scope's "state" dict, as Starlette's
    `request.state` is, so the front and a route reached through FastAPI see the same ones."""

    __slots__ = ("scope", "receive", "headers", "state")

    def __init__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                 headers: dict[str, str]):
        self.scope, self.receive, self.headers = scope, receive, headers
        self.state = State(scope.setdefault("state", {}))

    @property
    def app(self) -> Any:
        return self.scope["app"]

    async def body(self, limit: int, too_large: Callable[[], Exception]) -> bytes:
        """The body, refused (`too_large()`) as soon as more than `limit` bytes have come."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise too_large()
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def is_disconnected(self) -> bool:
        """Whether the caller has gone: asked only by a request's watch, after 50 ms, through
        Starlette's check (which reads a waiting `http.disconnect` without blocking)."""
        return await Request(self.scope, self.receive).is_disconnected()


def headers_of(scope: dict[str, Any]) -> dict[str, str]:
    """A request's headers as `Call.headers` holds them."""
    out: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        name = key.decode("latin-1").lower()
        if name not in out:
            out[name] = value.decode("latin-1")
    return out


class Reply:
    """A route's JSON answer: its content, status and extra headers. Rendered as Starlette's
    `JSONResponse` renders it (the same bytes), so the direct path and FastAPI's answer alike."""

    __slots__ = ("content", "status", "headers")

    def __init__(self, content: Any, status: int = 200, headers: dict[str, str] | None = None):
        self.content, self.status, self.headers = content, status, headers

    @classmethod
    def error(cls, exc: ApiError, strict: bool = False) -> Reply:
        return cls(error_body(exc.detail, strict), exc.status, exc.headers)

    def body(self) -> bytes:
        return json.dumps(self.content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8")

    def raw_headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
        """Its headers as ASGI sends them: the extra ones, then length and type."""
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (self.headers or {}).items()]
        raw += [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
        return raw

    def response(self) -> Response:
        """The same answer as a Starlette response, for a route reached through FastAPI."""
        return Response(self.body(), self.status, self.headers, media_type="application/json")


Route = Callable[[Call], Awaitable[Reply]]


def endpoint(route: Route) -> Callable[[Request], Awaitable[Response]]:
    """`route` as a FastAPI endpoint (its name and docstring kept for the OpenAPI document)."""

    async def run(request: Request) -> Response:
        scope = cast(dict[str, Any], request.scope)  # the ASGI scope, typed a MutableMapping by Starlette
        call = Call(scope, cast(Callable[[], Awaitable[dict[str, Any]]], request.receive), headers_of(scope))
        try:
            reply = await route(call)
        except ApiError as exc:
            reply = Reply.error(exc, strict_error(call.headers.get(STRICT_HEADER), request.app.state.config.strict))
        return reply.response()

    run.__name__, run.__qualname__, run.__doc__ = route.__name__, route.__qualname__, route.__doc__
    return run
