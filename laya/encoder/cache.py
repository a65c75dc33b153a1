"""Where laya keeps what it makes once and reuses: auto's picks, gate records, compiled programs, exported
bundles and unpacked GGUFs, each kind in a folder of its own under one root. One root, so that
`LAYA_CACHE` moves all of it (a container's volume, a test's temporary folder) and nothing is left behind
in the home directory. Every kind is written whole or not at all and built by one process at a time, so
server workers sharing the cache never read each other's half-written files."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """`$LAYA_CACHE`, else ~/.cache/laya (read on every call: a test or a process may set it late)."""
    return Path(os.environ.get("LAYA_CACHE", Path.home() / ".cache" / "laya"))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held by one process at a time on this machine (an flock on `path`); where no lock can be taken (no
    fcntl, a read-only cache) the work just runs, since a lock only saves doing it twice."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+")  # noqa: SIM115 - held across the yield
    except (ImportError, OSError):
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_json(path: Path, record: Any) -> None:
    """`record` at `path` as sorted JSON, written beside it and renamed into place: a reader in another
    process sees the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".partial")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
