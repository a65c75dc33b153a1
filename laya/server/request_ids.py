"""The request id every answer carries (`x-typesafe-request-id`): the client's own, or one made here."""

from __future__ import annotations

import itertools
import os

REQUEST_ID = "x-typesafe-request-id"
REQUEST_ID_RAW = REQUEST_ID.encode("latin-1")
CLIENT_ID_CHARS = 128  # of a client's own id, what is echoed back and logged


class _Ids:
    """This process's random half of a request id, and its count of requests."""

    prefix = os.urandom(8).hex()
    count = itertools.count(1)

    @classmethod
    def renew(cls) -> None:  # a forked child counts apart from its parent
        cls.prefix, cls.count = os.urandom(8).hex(), itertools.count(1)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_Ids.renew)


def new_request_id() -> str:
    """32 hex digits, as a uuid4's: the process's random half and its count, unique across processes
    and restarts. A uuid4 per request was a getrandom() call and a UUID object, 17 us where the code
    runs cold against 5.5 for this."""
    return f"{_Ids.prefix}{next(_Ids.count):016x}"


def raw_request_id(scope) -> bytes | None:
    """The client's id in a request's raw headers, if it sent one."""
    return next((v for k, v in scope.get("headers", ()) if k.lower() == REQUEST_ID_RAW), None)


def given_or_new(given: bytes | None) -> bytes:
    """The id an answer carries: the client's (cut to `CLIENT_ID_CHARS`), or a new one."""
    return given[:CLIENT_ID_CHARS] if given else new_request_id().encode()
