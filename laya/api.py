"""The System One HTTP contract, without a web framework: request validation and error shapes.

Validation errors come back in FastAPI's shape (`{"detail": [{"loc", "msg", "type"}]}`) so every
client that parses them keeps working; other refusals use `{"detail": {"error_type", "message"}}`.
Nothing here knows about models: the engines take the validated request from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laya.config import QTYPES
from laya.errors import QuestionError

MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_TOKENS_ALL = 65536  # the state plus every question
MAX_TOKENS_ONE = 32768  # the state plus the longest question
ALIASES = ("jev-latest", "jev-preview")


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


def _err(loc: list, msg: str, kind: str, value: Any = None) -> dict[str, Any]:
    out = {"loc": ["body", *loc], "msg": msg, "type": kind}
    if value is not None and isinstance(value, str | int | float | bool):
        out["input"] = value
    return out


def _is_text(value: Any) -> bool:
    return isinstance(value, str | dict | list)


TEXT_MSG = "Input should be a valid string, object or array"


@dataclass(frozen=True)
class SystemOneRequest:
    model: str | None
    state: Any
    questions: dict[str, Any]
    reuse_prefix: bool = True  # decide engine: false prefills the request whole, leaving the kept state


def _check_count(loc: list, what: str, n: int, low: int, high: int, unit: str, errors: list[dict]) -> None:
    if n < low:
        errors.append(_err(loc, f"{what} needs at least {low} {unit}, got {n}", "too_short"))
    elif n > high:
        errors.append(_err(loc, f"{what} takes at most {high} {unit}, got {n}", "too_long"))


def _check_question(qid: str, spec: Any, errors: list[dict]) -> None:
    loc = ["questions", qid]
    if not isinstance(spec, dict):
        errors.append(_err(loc, "Input should be a valid dictionary", "dict_type"))
        return
    qtype = spec.get("type")
    if "type" not in spec:
        errors.append(_err([*loc, "type"], "Field required", "missing"))
        return
    if qtype not in QTYPES:
        errors.append(_err([*loc, "type"], f"Input tag {qtype!r} does not match any of the expected tags: "
                                           "'noul', 'choice', 'score'", "union_tag_invalid"))
        return
    instructions = spec.get("instructions")
    if instructions is not None and not _is_text(instructions):
        errors.append(_err([*loc, "instructions"], TEXT_MSG, "text_type"))
    criteria = spec.get("criteria")
    cloc = [*loc, "criteria"]
    if qtype == "choice":
        if isinstance(criteria, list):
            names = criteria
            if any(not isinstance(n, str) for n in names):
                errors.append(_err(cloc, "option names must be strings", "string_type"))
            values: list = []
        elif isinstance(criteria, dict):
            names, values = list(criteria), list(criteria.values())
        elif criteria is None:
            errors.append(_err(cloc, "Field required", "missing"))
            return
        else:
            errors.append(_err(cloc, "Input should be a valid dictionary of option -> description", "dict_type"))
            return
        _check_count(cloc, "a choice question", len(names), MIN_OPTIONS, MAX_OPTIONS, "options", errors)
        if isinstance(criteria, list) and len(set(map(str, names))) != len(names):
            errors.append(_err(cloc, "option names must be unique", "value_error"))
        for name, value in zip(names, values):
            if value is not None and not _is_text(value):
                errors.append(_err([*cloc, name], TEXT_MSG + " or null", "text_type"))
    elif qtype == "score":
        if isinstance(criteria, dict):
            errors.append(_err(cloc, "score criteria must be a LIST of level descriptions, level 0 first; "
                                     "the map form is not accepted", "list_type"))
            return
        if criteria is None:
            errors.append(_err(cloc, "Field required", "missing"))
            return
        if not isinstance(criteria, list):
            errors.append(_err(cloc, "Input should be a valid list", "list_type"))
            return
        _check_count(cloc, "a score question", len(criteria), MIN_LEVELS, MAX_LEVELS, "levels", errors)
        for i, level in enumerate(criteria):
            if not _is_text(level):
                errors.append(_err([*cloc, i], TEXT_MSG, "text_type"))
    else:
        if criteria is None:
            return
        if not isinstance(criteria, dict):
            errors.append(_err(cloc, "Input should be a valid dictionary with 'true' and/or 'false'", "dict_type"))
            return
        for key, value in criteria.items():
            if str(key).lower() not in ("true", "false"):
                errors.append(_err([*cloc, key], "noul criteria take only the keys 'true' and 'false'",
                                   "extra_forbidden"))
            elif value is not None and not _is_text(value):
                errors.append(_err([*cloc, key], TEXT_MSG + " or null", "text_type"))


def parse_systemone(body: Any, *, batch: bool = False) -> SystemOneRequest:
    """Validate a `/v1/systemone` body (or a `/batch` one, with `states`); raises a 422 `ApiError`."""
    errors: list[dict] = []
    if not isinstance(body, dict):
        raise ApiError(422, [_err([], "Input should be a valid dictionary", "dict_type")])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        errors.append(_err(["model"], "Input should be a valid string", "string_type"))
    key = "states" if batch else "state"
    if key not in body:
        errors.append(_err([key], "Field required", "missing"))
    state = body.get(key)
    if batch:
        if key in body and not isinstance(state, list):
            errors.append(_err([key], "Input should be a valid list of states", "list_type"))
        elif isinstance(state, list):
            if not state:
                errors.append(_err([key], "states must not be empty", "too_short"))
            for i, one in enumerate(state):
                if not _is_text(one):
                    errors.append(_err([key, i], TEXT_MSG, "text_type"))
    elif key in body and not _is_text(state):
        errors.append(_err([key], TEXT_MSG, "text_type"))
    questions = body.get("questions")
    if "questions" not in body:
        errors.append(_err(["questions"], "Field required", "missing"))
    elif not isinstance(questions, dict):
        errors.append(_err(["questions"], "Input should be a valid dictionary of id -> question", "dict_type"))
    elif not questions:
        errors.append(_err(["questions"], "questions must not be empty", "too_short"))
    else:
        for qid, spec in questions.items():
            if not qid:
                errors.append(_err(["questions", qid], "question ids must not be empty", "value_error"))
            _check_question(qid, spec, errors)
    reuse = body.get("reuse_prefix")
    if reuse is not None and not isinstance(reuse, bool):
        errors.append(_err(["reuse_prefix"], "Input should be a valid boolean", "bool_type"))
    if errors:
        raise ApiError(422, errors)
    return SystemOneRequest(model=model, state=state, questions=questions, reuse_prefix=reuse is not False)


def question_error(exc: QuestionError) -> ApiError:
    """A refusal from the engine (e.g. options that do not fit the row) as a 422."""
    if exc.error_type == "max_tokens_exceeded":
        return usage_error(413, "max_tokens_exceeded", str(exc))
    loc = ["questions", exc.qid] if exc.qid else (["state"] if exc.error_type == "invalid_state" else [])
    return ApiError(422, [_err(loc, str(exc), exc.error_type)])


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
