"""The one comparison of a caller's key with the key a server was given, for every surface that takes
one (the HTTP routes, MCP over HTTP)."""

from __future__ import annotations

import hmac


def key_given(authorization: str | None, api_key: str | None) -> bool:
    """Whether a request may pass a server's key: none configured, or `Authorization: Bearer <key>`
    carrying it (compared in constant time)."""
    if not api_key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())
