"""How laya calls a server it is pointed at (`predict --url`, `plan --url`, `eval`, `distill`, `mcp --url`).

- A key goes only where it was given: each URL's key comes from that URL's own option (a file), never
  from `LAYA_API_KEY`, which is the key `laya serve` protects itself with; sending it to whatever URL a
  command names would hand it to a teacher or a benchmark target that should not have it.
- A key never crosses the network in clear: over plain `http://` it is sent only to a loopback host.
- An answer is read up to `MAX_RESPONSE_BYTES`: a server (or something pretending to be one) cannot make
  the caller hold an unbounded body in memory.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from laya.errors import LayaError

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
LOOPBACK_HOSTS = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def read_key_file(path: str | None, option: str) -> str | None:
    """The key held in the file `option` names (one non-empty line), or None without one."""
    if path is None:
        return None
    try:
        key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise LayaError(f"{option} {path}: cannot read it ({exc})") from exc
    if not key or "\n" in key:
        raise LayaError(f"{option} {path}: the file must hold one non-empty line, the key")
    return key


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key_transport(url: str, key: str | None, option: str) -> None:
    """Refuse to send `key` to `url` in clear: plain http to another machine."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LayaError(f"{url[:200]!r} is not an http(s) URL")
    if key and parts.scheme == "http" and not is_loopback(parts.hostname):
        raise LayaError(f"refusing to send the key of {option} to {parts.hostname} over plain http (anyone on the "
                        "way could read it): use https://, or a loopback address")


@dataclass(frozen=True)
class Answered:
    """A server's answer, its body read whole but within the cap."""

    status_code: int
    headers: Any
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def request(client: Any, method: str, path: str, cap: int | None = None, **kwargs: Any) -> Answered:
    """`client.request(method, path, ...)` (an httpx.Client) with the body read up to `cap` bytes
    (`MAX_RESPONSE_BYTES` unless told)."""
    cap = MAX_RESPONSE_BYTES if cap is None else cap
    with client.stream(method, path, **kwargs) as r:
        content = bytearray()
        for chunk in r.iter_bytes():
            content += chunk
            if len(content) > cap:
                raise LayaError(f"{r.url} answered more than {cap} bytes: refused (a laya server's answers are "
                                "far smaller)")
        return Answered(r.status_code, r.headers, bytes(content))


async def request_async(client: Any, method: str, path: str, cap: int | None = None,
                        **kwargs: Any) -> Answered:
    """`request` on an httpx.AsyncClient."""
    cap = MAX_RESPONSE_BYTES if cap is None else cap
    async with client.stream(method, path, **kwargs) as r:
        content = bytearray()
        async for chunk in r.aiter_bytes():
            content += chunk
            if len(content) > cap:
                raise LayaError(f"{r.url} answered more than {cap} bytes: refused (a laya server's answers are "
                                "far smaller)")
        return Answered(r.status_code, r.headers, bytes(content))


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
