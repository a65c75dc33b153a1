"""The key is the whole key: an empty `Bearer ` and every strict prefix of the key are refused (401) on
every surface that takes one (`/v1/systemone`, `/metrics`, MCP over HTTP), and `/health` shows them
only its status word. One comparison serves them all (`laya.auth.key_given`); each surface is asked,
so a surface that stops using it is seen too."""

from __future__ import annotations

import asyncio
import http.client
import json
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import need
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.auth import key_given
from laya.server.app import ServerConfig, create_app

KEY = "k3y-of-sixteen-c"
NEAR = ["Bearer ", "Bearer", f"Bearer {KEY[:1]}", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x", KEY]
URGENT = {"type": "noul", "instructions": "Urgent?"}


def test_only_the_whole_key_passes():
    assert key_given(f"Bearer {KEY}", KEY) and key_given(f"bearer {KEY}", KEY)
    for given in NEAR:
        assert not key_given(given, KEY), given
    assert key_given(None, None) and key_given("Bearer anything", "")


@pytest.fixture(scope="module")
def keyed():
    with LiveServer(create_app(lambda: [ScriptedEngine("s")], ServerConfig(api_key=KEY, max_wait_ms=1))) as live:
        yield live


def ask(url: str, method: str, path: str, authorization: str, body: dict | None = None) -> tuple[int, bytes]:
    """One request with the header exactly as given (httpx refuses an `Authorization: Bearer ` with its
    trailing space; a client may still send it)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": authorization, **({"Content-Type": "application/json"} if data else {})}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("given", NEAR)
def test_a_near_key_gets_401_and_only_the_status_word(keyed, given):
    status, text = ask(keyed.url, "POST", "/v1/systemone", given, {"state": "x", "questions": {"u": URGENT}})
    assert status == 401, text
    assert ask(keyed.url, "GET", "/metrics", given)[0] == 401
    status, text = ask(keyed.url, "GET", "/health", given)
    assert status == 200 and json.loads(text) == {"status": "ok"}


def test_the_whole_key_passes_everywhere(keyed):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(keyed.url + "/v1/systemone", json={"state": "x", "questions": {"u": URGENT}}, headers=auth)
    assert r.status_code == 200, r.text
    assert httpx.get(keyed.url + "/metrics", headers=auth).status_code == 200
    assert "models" in httpx.get(keyed.url + "/health", headers=auth).json()


def test_mcp_over_http_refuses_a_near_key():
    need("mcp")
    from starlette.responses import PlainTextResponse

    from laya.apps.mcp import BearerAuth

    app = BearerAuth(PlainTextResponse("in"), KEY)

    async def status(given: str) -> int:
        """Straight to the ASGI app (no client's header checks on the way)."""
        sent: list[dict] = []
        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"authorization", given.encode())],
                 "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": ""}

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent[0]["status"]

    assert asyncio.run(status(f"Bearer {KEY}")) == 200
    for given in NEAR:
        assert asyncio.run(status(given)) == 401, given
