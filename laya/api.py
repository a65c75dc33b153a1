"""The System One HTTP contract's error shapes and token budgets, without a web framework.

Validation errors come back in FastAPI's shape (`{"detail": [{"loc", "msg", "type"}]}`) so every
client that parses them keeps working; other refusals use `{"detail": {"error_type", "message"}}`.
Requests are validated in `laya.request`. Nothing here knows about models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laya.errors import QuestionError
from laya.limits import LimitExceeded
from laya.questions import Problem

MAX_TOKENS_ALL = 65536  # the state plus every question
MAX_TOKENS_ONE = 32768  # the state plus the longest question
ALIASES = ("jev-latest", "jev-preview")
MAX_LISTED_ERRORS = 20  # validation errors listed in a 422; the body also says how many there were
MAX_ERROR_TEXT = 300  # characters of any message or location part echoed back (user text included)


@dataclass
class ApiError(Exception):
    """An HTTP error with its status and body `detail`."""

    status: int
    detail: Any
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}"


def usage_error(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> ApiError:
    return ApiError(status, {"error_type": error_type, "message": message}, headers or {})


def render_problems(problems: list[Problem]) -> list[dict[str, Any]]:
    """FastAPI's 422 items, from the one rule set the library also uses."""
    return [{"loc": ["body", *p.loc], "msg": p.msg, "type": p.type} for p in problems]


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_ERROR_TEXT:
        return value[: MAX_ERROR_TEXT - 3] + "..."
    return value


def error_body(detail: Any, strict: bool = False) -> dict[str, Any]:
    """The body of an error response, bounded whatever the request: at most MAX_LISTED_ERRORS items
    (plus `x_error_count`, the total), every message and location part clipped. `strict`: no `x_`
    extension (the count, a limit's flag), only the contract's error shape."""
    if isinstance(detail, list):
        items = [{k: ([_clip(x) for x in v] if k == "loc" else _clip(v)) for k, v in item.items()}
                 for item in detail[:MAX_LISTED_ERRORS]]
        return {"detail": items} if strict else {"detail": items, "x_error_count": len(detail)}
    if isinstance(detail, dict):
        return {"detail": {k: _clip(v) for k, v in detail.items() if not (strict and k.startswith("x_"))}}
    return {"detail": _clip(detail)}


STRICT_HEADER = "x-laya-strict"
STRICT_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
                 "off": False}


def strict_of(header: str | None, default: bool) -> bool:
    """Whether a request's answer keeps to the contract's fields only: its `X-Laya-Strict` header
    (1/0, true/false, yes/no, on/off), else the server's `--strict`; any other value is a 400."""
    if header is None:
        return default
    value = STRICT_VALUES.get(header.strip().lower())
    if value is None:
        raise usage_error(400, "invalid_request_error", "X-Laya-Strict must be 1 or 0 (true/false, yes/no, on/off)")
    return value


def strict_error(header: str | None, default: bool) -> bool:
    """Whether an error body keeps to the contract's shape: as `strict_of`, an unreadable header
    taken as absent (the error answering it is that header's own 400)."""
    return STRICT_VALUES.get(header.strip().lower(), default) if header is not None else default


def question_error(exc: QuestionError) -> ApiError:
    """A refusal from the engine (e.g. options that do not fit the row) as a 422; work over a limit
    or a token budget as a 413."""
    if isinstance(exc, LimitExceeded):
        return ApiError(413, {"error_type": exc.error_type, "message": str(exc),
                              "x_limit": {"flag": exc.flag, "value": exc.limit}})
    if exc.error_type == "max_tokens_exceeded":
        return usage_error(413, "max_tokens_exceeded", str(exc))
    loc = ["questions", exc.qid] if exc.qid else (["state"] if exc.error_type == "invalid_state" else [])
    return ApiError(422, render_problems([Problem(tuple(loc), str(exc), exc.error_type)]))


def check_budgets(state_tokens: int, question_tokens: list[int]) -> None:
    """The API's token budgets: refused, never silently truncated."""
    total = state_tokens + sum(question_tokens)
    longest = state_tokens + max(question_tokens, default=0)
    if total > MAX_TOKENS_ALL:
        raise QuestionError(f"the state and questions take {total} tokens; the limit is {MAX_TOKENS_ALL}",
                            error_type="max_tokens_exceeded")
    if longest > MAX_TOKENS_ONE:
        raise QuestionError(f"the state and the longest question take {longest} tokens; the limit is "
                            f"{MAX_TOKENS_ONE}", error_type="max_tokens_exceeded")
