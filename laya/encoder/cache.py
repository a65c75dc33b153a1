"""Where laya keeps what it makes once and reuses: auto's picks, gate records, compiled programs, exported
bundles and unpacked GGUFs, each kind in a folder of its own under one root. One root, so that
`LAYA_CACHE` moves all of it (a container's volume, a test's temporary folder) and nothing is left behind
in the home directory."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$LAYA_CACHE`, else ~/.cache/laya (read on every call: a test or a process may set it late)."""
    return Path(os.environ.get("LAYA_CACHE", Path.home() / ".cache" / "laya"))
