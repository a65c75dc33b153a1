"""Shape buckets for a runtime that serves fixed shapes (`runtime="cuda"`'s CUDA graphs), in pure Python.

A CUDA graph replays kernels recorded for one shape on buffers fixed at capture, and a capture costs a
forward pass or more: one made on a request path stalls that request and everyone queued behind it. So
every shape a warm server can meet is known in advance and captured at warm-up:

- tokens: rounded up to 16-token buckets up to 256 (short rows, where a few padded tokens are a large
  share), then to 64-token buckets up to the checkpoint's `max_len` (the last bucket is `max_len` itself);
- rows: rounded up to a power of two, up to `max_rows` (the last bucket is `max_rows` itself).

`pack` splits a batch into passes, one per token bucket (a short row never pays for a long row's
length), and splits a bucket's rows where rounding them up to a power of two would waste more than a
quarter of the pass. `GraphCache` is the per-bucket store of static buffers and captured programs,
with the capture injected, so that its capture-once semantics are tested without a GPU.

Nothing here imports a framework: the runtime supplies the buffers and the capture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

SHORT_STEP = 16  # token bucket width up to SHORT_LIMIT
SHORT_LIMIT = 256
LONG_STEP = 64  # token bucket width above it
DEFAULT_MAX_ROWS = 64
ROW_WASTE = 0.25  # a pass whose padded rows would exceed this share of it is split instead

Key = tuple[int, int]  # (rows, tokens) of a bucket


def token_buckets(max_len: int) -> list[int]:
    """Every token bucket of a checkpoint whose rows hold at most `max_len` tokens, ascending."""
    if max_len < 1:
        raise ValueError(f"max_len must be positive, got {max_len}")
    out = list(range(SHORT_STEP, min(max_len, SHORT_LIMIT) + 1, SHORT_STEP))
    out += list(range(SHORT_LIMIT + LONG_STEP, max_len + 1, LONG_STEP))
    if not out or out[-1] != max_len:
        out.append(max_len)  # a max_len off the grid is a bucket of its own
    return out


def row_buckets(max_rows: int = DEFAULT_MAX_ROWS) -> list[int]:
    """Every row bucket up to `max_rows`: the powers of two below it, then `max_rows` itself."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be positive, got {max_rows}")
    out, n = [], 1
    while n < max_rows:
        out.append(n)
        n *= 2
    return out + [max_rows]


def _round_up(n: int, buckets: list[int], what: str) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} {what} exceed the largest bucket ({buckets[-1]})")


def bucket_of(n_rows: int, n_tokens: int, max_rows: int = DEFAULT_MAX_ROWS, max_len: int = 512) -> Key:
    """The (rows, tokens) shape a pass of `n_rows` rows of at most `n_tokens` tokens is padded to."""
    if n_rows < 1 or n_tokens < 1:
        raise ValueError(f"a pass needs at least one row of one token, got {n_rows} rows of {n_tokens}")
    return _round_up(n_rows, row_buckets(max_rows), "rows"), _round_up(n_tokens, token_buckets(max_len), "tokens")


def all_buckets(max_rows: int = DEFAULT_MAX_ROWS, max_len: int = 512) -> list[Key]:
    """Every shape a batch can be padded to: what a warm-up captures, so no request ever captures."""
    return [(r, t) for t in token_buckets(max_len) for r in row_buckets(max_rows)]


@dataclass(frozen=True)
class Pass:
    """One forward pass: `members` (indices into the batch, ascending) padded to `rows` x `tokens`."""

    rows: int
    tokens: int
    members: tuple[int, ...]

    @property
    def key(self) -> Key:
        return self.rows, self.tokens


def _row_chunks(n: int, max_rows: int, row_waste: float) -> list[int]:
    """How many rows each pass of a bucket's `n` rows takes: as few passes as keep padded rows at most
    `row_waste` of each (9 rows: 8 + 1, not 16 with 7 wasted; 3 rows: one pass of 4)."""
    sizes = row_buckets(max_rows)
    out = []
    while n > 0:
        take = min(n, max_rows)
        padded = _round_up(take, sizes, "rows")
        if (padded - take) / padded > row_waste:
            take = max(b for b in sizes if b <= take)  # an exact bucket: no padded row
        out.append(take)
        n -= take
    return out


def pack(lengths: Sequence[int], max_rows: int = DEFAULT_MAX_ROWS, max_len: int = 512,
         row_waste: float = ROW_WASTE) -> list[Pass]:
    """The passes that run rows of these token `lengths`: rows grouped by token bucket (shortest first),
    each group split into passes of at most `max_rows` rows with at most `row_waste` of them padding."""
    tokens = token_buckets(max_len)
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(_round_up(max(1, int(n)), tokens, "tokens"), []).append(i)
    out = []
    for t in sorted(groups):
        members, start = groups[t], 0
        for take in _row_chunks(len(members), max_rows, row_waste):
            chunk = tuple(members[start : start + take])
            out.append(Pass(_round_up(take, row_buckets(max_rows), "rows"), t, chunk))
            start += take
    return out


def padding_waste(passes: Sequence[Pass], lengths: Sequence[int]) -> float:
    """The share of the computed token slots that are padding (padded tokens and padded rows)."""
    computed = sum(p.rows * p.tokens for p in passes)
    real = sum(int(lengths[i]) for p in passes for i in p.members)
    return 1.0 - real / computed if computed else 0.0


S = TypeVar("S")  # a bucket's static buffers
Out = TypeVar("Out")  # what a replay hands back


class GraphCache(Generic[S, Out]):
    """One captured program per bucket, made once: the first request for a bucket allocates its static
    buffers (`allocate(key)`) and captures the program over them (`capture(key, buffers)`, which returns
    the replay); every later request of that bucket fills the same buffers and replays.

    `warm(keys)` captures every bucket up front and then freezes the cache, so that a bucket missed at
    warm-up is an error, never a capture on a request path."""

    def __init__(self, allocate: Callable[[Key], S], capture: Callable[[Key, S], Callable[[], Out]]):
        self._allocate, self._capture = allocate, capture
        self._entries: dict[Key, tuple[S, Callable[[], Out]]] = {}
        self.captures = 0
        self.frozen = False

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def warm(self, keys: Iterable[Key], freeze: bool = True) -> None:
        for key in keys:
            self.entry(key)
        self.frozen = freeze

    def entry(self, key: Key) -> tuple[S, Callable[[], Out]]:
        found = self._entries.get(key)
        if found is None:
            if self.frozen:
                raise KeyError(f"bucket {key} was not captured at warm-up (the cache is frozen)")
            buffers = self._allocate(key)
            found = (buffers, self._capture(key, buffers))
            self._entries[key] = found
            self.captures += 1
        return found

    def run(self, key: Key, fill: Callable[[S], None]) -> Out:
        """Fill the bucket's static buffers with this pass's inputs, then replay its program."""
        buffers, replay = self.entry(key)
        fill(buffers)
        return replay()
