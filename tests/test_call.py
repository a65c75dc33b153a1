"""The decision routes' own request and answer (laya/server/call.py): the bytes and headers Starlette's
`JSONResponse` gives, the first of a repeated header, and the same routes reached through FastAPI
(under a prefix) answering as the direct path does."""

from __future__ import annotations

import httpx
import pytest
from fake_engine import ScriptedEngine
from live_server import LiveServer
from starlette.responses import JSONResponse

from laya.api import ApiError
from laya.server.app import ServerConfig, create_app
from laya.server.call import Reply, endpoint, headers_of
from laya.server.routes import systemone

CONTENT = {"answers": {"é": 0.1234567890123457, "x": [1, 2.5, None, True, -0.0]}, "text": "naïve ✓ \u2028 \"q\" </>"}
URGENT = {"type": "noul", "instructions": "Urgent?"}


@pytest.mark.parametrize(("status", "headers"), [(200, None), (429, {"Retry-After": "3"}), (503, {"X-A": "1"})])
def test_a_reply_is_what_a_json_response_would_send(status, headers):
    reference = JSONResponse(CONTENT, status_code=status, headers=headers)
    reply = Reply(CONTENT, status, headers)
    body = reply.body()
    assert body == reference.body
    assert reply.raw_headers(body) == reference.raw_headers
    response = reply.response()
    assert (response.status_code, response.body, response.raw_headers) == (status, reference.body,
                                                                           reference.raw_headers)


def test_a_reply_refuses_what_json_cannot_carry():
    with pytest.raises(ValueError):
        Reply({"p": float("nan")}).body()


def test_an_error_reply_carries_the_errors_status_body_and_headers():
    reply = Reply.error(ApiError(429, {"error_type": "rate_limit_error", "message": "m"}, {"Retry-After": "2"}))
    assert (reply.status, reply.headers) == (429, {"Retry-After": "2"})
    assert reply.content == {"detail": {"error_type": "rate_limit_error", "message": "m"}}


def test_headers_are_lower_case_and_keep_the_first_of_a_repeated_name():
    scope = {"headers": [(b"Content-Type", b"application/json"), (b"content-type", b"text/plain"),
                         (b"X-Laya-Timeout-S", b"2")]}
    assert headers_of(scope) == {"content-type": "application/json", "x-laya-timeout-s": "2"}
    assert headers_of({}) == {}


def test_an_endpoint_keeps_the_routes_name_and_docstring():
    wrapped = endpoint(systemone)
    assert (wrapped.__name__, wrapped.__doc__) == ("systemone", systemone.__doc__)


def under_prefix(app, prefix: str):
    """`app` behind a path prefix, as a proxy with a root path or Starlette's `Mount` hands it on:
    the path kept whole, `root_path` naming the prefix. Other paths pass through unchanged."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(prefix + "/"):
            scope = {**scope, "root_path": prefix}
        await app(scope, receive, send)

    return wrapped


def test_the_decision_routes_under_a_prefix_answer_as_the_direct_path_does():
    app = create_app(lambda: [ScriptedEngine()], ServerConfig())
    bodies = [
        ({"state": "the server is down", "questions": {"u": URGENT}}, {}),
        ({"state": 5, "questions": {"u": URGENT}}, {}),  # not a state: 422
        ({"state": "x", "questions": {"u": URGENT}}, {"content-type": "text/plain"}),  # 415
        ({"states": ["a", "b"], "questions": {"u": URGENT}}, {"batch": "1"}),
    ]
    statuses = []
    with LiveServer(under_prefix(app, "/laya")) as live:
        for body, headers in bodies:
            route = "/v1/systemone/batch" if headers.pop("batch", None) else "/v1/systemone"
            kwargs = {"content": httpx.Request("POST", "/", json=body).content,
                      "headers": {"content-type": "application/json", **headers}}
            direct = httpx.post(live.url + route, **kwargs)
            prefixed = httpx.post(live.url + "/laya" + route, **kwargs)
            assert direct.status_code == prefixed.status_code, (body, direct.text, prefixed.text)
            assert direct.json() == prefixed.json()
            statuses.append(prefixed.status_code)
            for answer in (direct, prefixed):
                assert answer.headers["content-type"] == "application/json"
                assert len(answer.headers["x-typesafe-request-id"]) == 32
        assert httpx.get(live.url + "/laya/v1/systemone").status_code == 405  # FastAPI's, for another method
    assert statuses == [200, 422, 415, 200]
