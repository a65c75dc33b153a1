"""Reading a request body safely: a cap on the bytes received and on the bytes decompressed.

The official SDK zstd-compresses bodies of 1 kB and more; some clients gzip. A small compressed
body can expand enormously, so decompression is streamed and stopped at the cap (a 413), never
materialised whole.
"""

from __future__ import annotations

import io
import json
import zlib
from typing import Any

from laya.api import ApiError, usage_error

CHUNK = 64 * 1024


def _too_large(limit: int, what: str) -> ApiError:
    return usage_error(413, "request_too_large", f"the request body {what} more than {limit} bytes")


async def read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, "has")
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > limit:
            raise _too_large(limit, "has")
    return bytes(data)


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


def parse_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except UnicodeDecodeError as exc:
        raise ApiError(422, [{"loc": ["body"], "msg": "the body is not UTF-8", "type": "json_invalid"}]) from exc
    except json.JSONDecodeError as exc:
        raise ApiError(422, [{"loc": ["body", exc.pos], "msg": f"JSON decode error: {exc.msg}",
                              "type": "json_invalid"}]) from exc
    except RecursionError as exc:
        raise ApiError(422, [{"loc": ["body"], "msg": "JSON nested too deeply", "type": "json_invalid"}]) from exc
