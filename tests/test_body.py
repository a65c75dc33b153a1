"""Body decoding (laya/server/body.py): a compressed body is cut at the cap while it inflates, so a
bomb of gigabytes costs a few times the cap in memory (measured), never its inflated size."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import zlib

import pytest
import zstandard
from starlette.requests import ClientDisconnect

from laya.api import ApiError
from laya.server.body import decode, read_body
from laya.server.call import Call

MiB = 1 << 20
CAP = 8 * MiB  # --max-body-mb's default


def gzip_bomb(inflated_mib: int, wbits: int = 31) -> bytes:
    """A gzip (wbits 31) or zlib (15) stream of `inflated_mib` MiB of zeros, made in milliseconds:
    after a full flush the compressor's state is reset, so every further MiB compresses to the same
    bytes, repeated here. The stream is left unfinished (no trailer), as an attacker would send it:
    an inflater that is not cut at the cap materialises all of it."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, wbits)
    mib = bytes(MiB)
    head = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH) == again
    return head + again * (inflated_mib - 1)


def zstd_bomb(inflated_mib: int) -> bytes:
    """A zstd frame of `inflated_mib` MiB of zeros written by hand: RLE blocks of 128 KiB (4 bytes
    each), no content size in the header, so nothing tells the decoder the size up front."""
    block = 128 * 1024
    header = b"\x28\xb5\x2f\xfd" + bytes([0x00, 0x38])  # magic; no FCS, no checksum; window 2**17
    rle = ((block << 3) | (1 << 1)).to_bytes(3, "little") + b"\x00"
    last = ((block << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\x00"
    n = inflated_mib * MiB // block
    return header + rle * (n - 1) + last


def test_the_bombs_are_what_they_claim():
    assert zstandard.ZstdDecompressor().decompressobj().decompress(zstd_bomb(1)) == bytes(MiB)
    assert zlib.decompressobj(47).decompress(gzip_bomb(3)) == bytes(3 * MiB)
    assert zlib.decompressobj(15).decompress(gzip_bomb(2, wbits=15)) == bytes(2 * MiB)
    assert len(gzip_bomb(4096)) < 5 * MiB and len(zstd_bomb(16384)) < MiB  # they pass the raw-body cap


# Run apart, under an address-space limit of 1 GiB above what it already maps (on Linux): a decoder that
# is not cut at the cap fails there with a MemoryError instead of taking the machine's memory.
CHILD = r"""
import json, sys, tracemalloc
sys.path.insert(0, sys.argv[1])
from test_body import CAP, decode, gzip_bomb, zstd_bomb, ApiError
try:  # Linux; elsewhere the peak is measured all the same, without the guard
    import resource
    vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
except (ImportError, OSError, ValueError, StopIteration):
    pass
out = []
for encoding, blob in (("gzip", gzip_bomb(4096)), ("deflate", gzip_bomb(4096, wbits=15)),
                       ("zstd", zstd_bomb(16384))):
    tracemalloc.start()
    try:
        decode(blob, encoding, CAP)
        status = 200
    except ApiError as exc:
        status = exc.status
    except MemoryError:
        status = "MemoryError"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out.append({"encoding": encoding, "compressed": len(blob), "status": status, "peak": peak})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bombs(request):
    here = str(request.path.parent)
    done = subprocess.run([sys.executable, "-c", CHILD, here], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {r["encoding"]: r for r in json.loads(done.stdout.splitlines()[-1])}


@pytest.mark.parametrize(("encoding", "inflated_gib"), [("gzip", 4), ("deflate", 4), ("zstd", 16)])
def test_a_bomb_is_cut_at_the_cap_while_it_inflates(bombs, encoding, inflated_gib):
    bomb = bombs[encoding]
    assert bomb["status"] == 413, bomb
    # memory: the output up to the cap, the input still to inflate, and the last copy; not gigabytes
    assert bomb["peak"] < 2 * CAP + 2 * bomb["compressed"] + 4 * MiB, bomb
    assert bomb["peak"] < 4 * CAP, bomb


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate", "zstd"])
def test_the_cap_is_exact(encoding):
    def pack(data: bytes) -> bytes:
        if encoding == "zstd":
            return zstandard.ZstdCompressor().compress(data)
        if encoding == "deflate":
            return zlib.compress(data)
        return gzip.compress(data)

    limit = 100_000
    at = b'{"state": "' + b"x" * (limit - 13) + b'"}'
    assert len(at) == limit
    assert decode(pack(at), encoding, limit) == at
    with pytest.raises(ApiError) as refused:
        decode(pack(at + b" "), encoding, limit)
    assert refused.value.status == 413
    assert decode(pack(b"{}"), encoding.upper(), limit) == b"{}"


def test_identity_unknown_and_corrupt_bodies():
    assert decode(b"{}", None, 10) == b"{}" and decode(b"{}", " identity ", 10) == b"{}"
    with pytest.raises(ApiError) as unknown:
        decode(b"{}", "br", 10)
    assert unknown.value.status == 415
    for encoding in ("gzip", "deflate", "zstd"):
        with pytest.raises(ApiError) as corrupt:
            decode(b"not compressed at all", encoding, 1000)
        assert corrupt.value.status == 400, encoding


def _call(chunks: int, size: int, declared: str | None = None) -> Call:
    """A request whose body comes as `chunks` ASGI messages of `size` bytes; `sent` counts them."""

    async def receive():
        receive.sent += 1
        return {"type": "http.request", "body": b" " * size, "more_body": receive.sent < chunks}

    receive.sent = 0
    return Call({"type": "http"}, receive, {"content-length": declared} if declared is not None else {})


def test_the_raw_body_is_cut_at_the_cap_while_it_arrives():
    request = _call(chunks=1000, size=64 * 1024)  # 64 MB, no length declared
    with pytest.raises(ApiError) as refused:
        asyncio.run(read_body(request, MiB))
    assert refused.value.status == 413
    assert request.receive.sent == MiB // (64 * 1024) + 1  # stopped at the first chunk past the cap
    declared = _call(chunks=1, size=10, declared=str(MiB + 1))
    with pytest.raises(ApiError):
        asyncio.run(read_body(declared, MiB))
    assert declared.receive.sent == 0  # refused by its Content-Length before a byte is read
    assert asyncio.run(read_body(_call(chunks=16, size=64 * 1024), MiB)) == b" " * MiB
    assert asyncio.run(read_body(_call(chunks=1, size=0), MiB)) == b""


def test_a_caller_gone_while_its_body_comes_is_a_disconnect():
    messages = iter([{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}])

    async def receive():
        return next(messages)

    with pytest.raises(ClientDisconnect):
        asyncio.run(read_body(Call({"type": "http"}, receive, {}), MiB))


@pytest.mark.parametrize(("text", "refused"), [
    ('{"n": %s}' % ("9" * 64), None),
    ('{"n": %s}' % ("9" * 65), "more than 64 digits"),
    ('{"state": "ref 12345 on 2026-11-03 for $49.99", "n": [1.5e3, 7E-2]}', None),
    ('{"n": 1e999}', "overflows to infinity"),
    ('{"n": -1E400}', "overflows to infinity"),
    ('{"s": "\\ud800"}', "lone surrogate"),
    ('{"s": "\\ud83d\\ude00 and 123456789012345678901234567890"}', None),
])
def test_what_only_the_walk_can_judge_is_judged(text, refused):
    """The byte scans that let an ordinary body skip the walk must send every body the walk would
    refuse to it: a long integer, an exponent that overflows, a lone surrogate."""
    from laya.server.body import check_tree, parse_json

    data = text.encode()
    value = parse_json(data, no_duplicates=True)
    if refused is None:
        check_tree(value, data, duplicates_checked=True)
        return
    with pytest.raises(ApiError) as exc:
        check_tree(value, data, duplicates_checked=True)
    assert exc.value.status == 422 and refused in json.dumps(exc.value.detail)


def test_an_ordinary_body_skips_the_walk_and_a_doubtful_one_does_not():
    from laya.server.body import _nothing_to_walk

    assert _nothing_to_walk(b'{"state": "Order 12345, $49.99 on 2026-11-03", "questions": {"u": {"type": "noul"}}}')
    for doubtful in (b'{"n": 1e5}', b'{"n": 2E-3}', b'{"n": %s}' % (b"1" * 65), b'{"s": "\\uD800"}',
                     b"[" * 65 + b"]" * 65):
        assert not _nothing_to_walk(doubtful), doubtful
