"""Reading a request body safely: its media type, a cap on the bytes received and decompressed,
and JSON that is strictly JSON.

The official SDK zstd-compresses bodies of 1 kB and more; some clients gzip. A small compressed
body can expand enormously, so decompression is streamed and stopped at the cap (a 413), never
materialised whole.

JSON rules (each a 422 naming the problem, never a 5xx): UTF-8 only; no NaN or Infinity literals
and no number that overflows to one; integers of at most 64 digits; nesting at most 64 deep; no
lone surrogate in a string (`"\ud800"`: it is no text); and no duplicate key in an object, since
which of two values a client meant cannot be known.
"""

from __future__ import annotations

import io
import json
import math
import re
import zlib
from typing import TYPE_CHECKING, Any

from laya.api import ApiError, usage_error

if TYPE_CHECKING:
    from laya.server.call import Call

MAX_DEPTH = 64
MAX_INT_DIGITS = 64
JSON_TYPES = ("application/json",)


def check_media_type(content_type: str | None, browser: bool) -> None:
    """Bodies must be JSON (`application/json` or a `+json` type). A body with no Content-Type is
    accepted only from a non-browser client: a web page can send one without a CORS preflight."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in JSON_TYPES or (media.startswith("application/") and media.endswith("+json")):
        return
    if not media and not browser:
        return
    shown = media or "none"
    raise usage_error(415, "unsupported_media_type",
                      f"the body must be JSON sent as 'Content-Type: application/json' (got {shown[:100]!r})")


class _Refused(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key[:100]!r} in an object")
            seen.add(key)
    return out


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _invalid(loc: list, msg: str) -> ApiError:
    return ApiError(422, [{"loc": ["body", *loc], "msg": msg, "type": "json_invalid"}])


# What only the walk of `check_tree` can judge, as it shows in the bytes: a surrogate's escape, a
# number too long for an integer or a float (past 64 digits, or with an exponent).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONG_NUMBER = re.compile(rb"[0-9](?:[eE]|[0-9]{%d})" % MAX_INT_DIGITS)  # one leading class: 5x the speed


def _nothing_to_walk(data: bytes) -> bool:
    """Whether the bytes alone show that the walk would find nothing: no more brackets than the
    depth allowed, no surrogate escape, no long number. True for every ordinary request, so it is
    judged by a few scans in C instead of a walk in Python (a bracket or an escape inside a string
    only sends a body to the walk)."""
    return (data.count(b"[") + data.count(b"{") <= MAX_DEPTH and _SURROGATE_ESCAPE.search(data) is None
            and _LONG_NUMBER.search(data) is None)


def check_tree(value: Any, data: bytes, duplicates_checked: bool = False) -> None:
    """Duplicate keys (unless `parse_json` refused them already), depth, numbers and text of a parsed
    body (`data`, its bytes), iteratively: no recursion a hostile body can exhaust. Called after the
    request's size is checked."""
    if not duplicates_checked and b"{" in data:
        try:
            json.loads(data, object_pairs_hook=_no_duplicates)
        except _Refused as exc:
            raise _invalid([], str(exc)) from exc
    if _nothing_to_walk(data):
        return
    stack: list[tuple[Any, list, int]] = [(value, [], 1)]
    while stack:
        node, loc, depth = stack.pop()
        if isinstance(node, float):
            if not math.isfinite(node):
                raise _invalid(loc, "a number overflows to infinity")
            continue
        if isinstance(node, int) and not isinstance(node, bool):
            if abs(node) >= 10**MAX_INT_DIGITS:
                raise _invalid(loc, f"an integer of more than {MAX_INT_DIGITS} digits")
            continue
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise _invalid(loc, "a string holds a lone surrogate (an unpaired \\ud800-\\udfff escape): "
                                    "not text") from None
            continue
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise _invalid(loc[:MAX_DEPTH], f"JSON nested more than {MAX_DEPTH} deep")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if isinstance(key, str):
                    stack.append((key, loc, depth))
                stack.append((child, [*loc, key] if len(loc) < MAX_DEPTH else loc, depth + 1))


def _too_large(limit: int, what: str) -> ApiError:
    return usage_error(413, "request_too_large", f"the request body {what} more than {limit} bytes")


async def read_body(call: Call, limit: int) -> bytes:
    """The raw body of a `laya.server.call.Call`: refused by its declared length before a byte is
    read, or as soon as more than `limit` bytes have come."""
    declared = call.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, "has")
    return await call.body(limit, lambda: _too_large(limit, "has"))


def decode(data: bytes, encoding: str | None, limit: int) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return data
    if encoding == "zstd":
        import zstandard

        try:
            reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data))
            out = reader.read(limit + 1)
            while len(out) <= limit:
                more = reader.read(limit + 1 - len(out))
                if not more:
                    break
                out += more
        except zstandard.ZstdError as exc:
            raise usage_error(400, "invalid_request_error", f"the zstd body cannot be decoded: {exc}") from exc
    elif encoding in ("gzip", "x-gzip", "deflate"):
        try:
            inflater = zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)
            out = inflater.decompress(data, limit + 1)
        except zlib.error as exc:
            raise usage_error(400, "invalid_request_error", f"the {encoding} body cannot be decoded: {exc}") from exc
    else:
        raise usage_error(415, "invalid_request_error",
                          f"Content-Encoding {encoding!r} is not supported; use zstd, gzip or none")
    if len(out) > limit:
        raise _too_large(limit, "decompresses to")
    return out


def decoded_within(data: bytes, encoding: str | None, limit: int) -> bytes | None:
    """The body decoded, when that is at most `limit` bytes (decompression stops there); else None.
    A body that cannot be decoded is refused as `decode` refuses it."""
    try:
        return decode(data, encoding, limit)
    except ApiError as exc:
        if exc.status == 413:
            return None
        raise


def parse_json(data: bytes, no_duplicates: bool = False) -> Any:
    """The body as JSON (syntax, UTF-8, constants) by the C decoder alone; `check_tree` checks the rest
    once the request's size is known to be within limits. CPU work: the server calls both off the
    event loop, unless the body is a few kilobytes (`laya.server.routes.INLINE_BYTES`). Such a small
    body is parsed once with `no_duplicates`, its objects' keys checked as they are read, rather than
    parsed a second time by `check_tree`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid([], f"the body is not UTF-8 (invalid byte at offset {exc.start})") from exc
    if text.startswith("\ufeff"):
        raise _invalid([], "the body starts with a byte-order mark; send plain UTF-8 JSON")
    try:
        value = json.loads(text, parse_constant=_no_constant,
                           object_pairs_hook=_no_duplicates if no_duplicates else None)
    except _Refused as exc:
        raise _invalid([], str(exc)) from exc
    except json.JSONDecodeError as exc:
        raise _invalid([exc.pos], f"JSON decode error: {exc.msg}") from exc
    except RecursionError as exc:
        raise _invalid([], f"JSON nested more than {MAX_DEPTH} deep") from exc
    except ValueError as exc:  # anything else the decoder refuses, e.g. an integer of thousands of digits
        raise _invalid([], f"not valid JSON ({str(exc)[:200]})") from exc
    return value
