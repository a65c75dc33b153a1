"""What the server says about itself leaves as names and digests, never as its file system or processes.

A path in an answer tells a caller how the host is laid out (home folders, user names, mount points)
and a process id helps whoever tries to signal or trace it; an operator reads both in the server's
own log. So every answer that describes the server (`/health`, `/ready`, `/v1/models`) passes
through `redacted`: an absolute path in any text becomes its last part, and no field carries a pid.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

# An absolute path (POSIX, home-relative or a Windows drive), up to the first character that cannot be
# part of one in a message: whitespace, quotes, brackets, separators of a list.
_PATH = re.compile(r"(?<![\w.~/:])(?:~|[A-Za-z]:)?(?:[/\\][^\s'\"`,;()\[\]{}<>|]+)+")
_QUOTED = re.compile(r"""(['"])((?:~|[A-Za-z]:)?[/\\][^'"\n]*)\1""")  # a quoted path may hold spaces
PRIVATE_KEYS = frozenset({"pid", "process", "path", "cwd"})


def redact(text: str) -> str:
    """`text` with every absolute path shortened to its last part (`/home/u/models/laya` -> `laya`)."""
    def last(path: str) -> str:
        return PurePath(path.replace("\\", "/")).name or "/"

    text = _QUOTED.sub(lambda m: m.group(1) + last(m.group(2)) + m.group(1), text)
    return _PATH.sub(lambda m: last(m.group(0)), text)


def redacted(value: Any) -> Any:
    """A JSON value with every string redacted and every private key (a pid, a path) left out."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items() if k not in PRIVATE_KEYS}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value
