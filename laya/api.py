"""The System One HTTP contract, without a web framework: request validation and error shapes.

Validation errors come back in FastAPI's shape (`{"detail": [{"loc", "msg", "type"}]}`) so every
client that parses them keeps working; other refusals use `{"detail": {"error_type", "message"}}`.
Nothing here knows about models: the engines take the validated request from here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from laya.encoder.tournament import group_problem
from laya.encoder.windows import AGGREGATES, Overflow, Scan
from laya.errors import QuestionError
from laya.limits import LimitExceeded, Limits
from laya.questions import Problem, Question, check_questions, state_problem
from laya.router import MAX_LANG_CHARS

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


def error_body(detail: Any) -> dict[str, Any]:
    """The body of an error response, bounded whatever the request: at most MAX_LISTED_ERRORS items
    (plus `x_error_count`, the total), every message and location part clipped."""
    if isinstance(detail, list):
        items = [{k: ([_clip(x) for x in v] if k == "loc" else _clip(v)) for k, v in item.items()}
                 for item in detail[:MAX_LISTED_ERRORS]]
        return {"detail": items, "x_error_count": len(detail)}
    if isinstance(detail, dict):
        return {"detail": {k: _clip(v) for k, v in detail.items()}}
    return {"detail": _clip(detail)}


class ValidatedQuestions:
    """`check_questions`, remembered for question sets that passed (least recently used out first):
    routers send the same questions with every state, and validating them again was a third of
    reading a small request. Keyed by the parsed JSON's `repr`, which tells any two JSON values
    apart (a string from a number, 1 from 1.0 and from true, every key and its order); sets whose
    key is longer than `max_chars` are validated every time, so the memory stays bounded."""

    def __init__(self, size: int = 256, max_chars: int = 16384):
        self.size, self.max_chars = size, max_chars
        self._known: OrderedDict[str, tuple[Question, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, questions: Any, problems: list[Problem]) -> list[Question]:
        if not isinstance(questions, dict):
            return check_questions(questions, problems)
        key = repr(questions)
        if len(key) > self.max_chars:
            return check_questions(questions, problems)
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
                return list(known)
        found: list[Problem] = []
        parsed = check_questions(questions, found)
        problems += found
        if not found:
            with self._lock:
                self._known[key] = tuple(parsed)
                while len(self._known) > self.size:
                    self._known.popitem(last=False)
        return parsed


VALIDATED = ValidatedQuestions()


@dataclass(frozen=True)
class SystemOneRequest:
    model: str | None
    state: Any  # the state, or the list of states of a /batch request
    questions: list[Question]  # validated, in the caller's order: the engines take them as they are
    reuse_prefix: bool = True  # decide engine: false prefills the request whole, leaving the kept state
    tournament: int | None = None  # encoder engine: answer choices of more options by elimination in groups
    overflow: Overflow = None  # encoder engine: a state longer than the row truncated (which end) or scanned
    lang: str | None = None  # "model": "auto": the caller's language code, decisive when it names one


def parse_systemone(body: Any, *, batch: bool = False, limits: Limits | None = None,
                    from_json: bool = False) -> SystemOneRequest:
    """Validate a `/v1/systemone` body (or a `/batch` one, with `states`); raises a 422 `ApiError`, or
    a 413 when the request asks for more than `limits` (counted before anything is validated).
    `from_json`: the body is what `json.loads` made, so its question sets may be remembered by their
    `repr` (`VALIDATED`), which tells JSON values apart but not every Python object."""
    problems: list[Problem] = []
    if not isinstance(body, dict):
        raise ApiError(422, render_problems([Problem((), "Input should be a valid dictionary", "dict_type")]))
    check_size(body, batch, limits or Limits())
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        problems.append(Problem(("model",), "Input should be a valid string", "string_type"))
    key = "states" if batch else "state"
    state = body.get(key)
    if key not in body:
        problems.append(Problem((key,), "Field required", "missing"))
    elif batch:
        if not isinstance(state, list):
            problems.append(Problem((key,), "Input should be a valid list of states", "list_type"))
        elif not state:
            problems.append(Problem((key,), "states must not be empty", "too_short"))
        else:
            problems += [p for i, one in enumerate(state) if (p := state_problem(one, (key, i))) is not None]
    elif (problem := state_problem(state)) is not None:
        problems.append(problem)
    parsed: list[Question] = []
    if "questions" not in body:
        problems.append(Problem(("questions",), "Field required", "missing"))
    else:
        parsed = (VALIDATED if from_json else check_questions)(body["questions"], problems)
    reuse = body.get("reuse_prefix")
    if reuse is not None and not isinstance(reuse, bool):
        problems.append(Problem(("reuse_prefix",), "Input should be a valid boolean", "bool_type"))
    tournament = body.get("tournament")
    if (message := group_problem(tournament)) is not None:
        problems.append(Problem(("tournament",), message, "int_type"))
    overflow = overflow_of(body.get("x_overflow"), problems) if "x_overflow" in body else None
    lang = body.get("x_lang")
    if lang is not None and (not isinstance(lang, str) or len(lang) > MAX_LANG_CHARS):
        problems.append(Problem(("x_lang",), f"x_lang must be a language code such as 'en' or 'pt-BR' (at most "
                                             f"{MAX_LANG_CHARS} characters)", "string_type"))
    if problems:
        raise ApiError(422, render_problems(problems))
    return SystemOneRequest(model=model, state=state, questions=parsed, reuse_prefix=reuse is not False,
                            tournament=tournament, overflow=overflow, lang=lang)


OVERFLOW_MODES = ("truncate", "keep_start", "keep_end")
SCAN_KEYS = ("window", "stride", "aggregate")


def overflow_of(value: Any, problems: list[Problem]) -> Overflow:
    """`x_overflow`: "truncate" (the default: a state's start kept, a conversation's end),
    "keep_start", "keep_end", or `{"scan": {"window", "stride", "aggregate"}}` (all optional)."""
    loc = ("x_overflow",)
    if value is None or (isinstance(value, str) and value in OVERFLOW_MODES):
        return None if value in (None, "truncate") else value
    if not isinstance(value, dict) or set(value) != {"scan"}:
        problems.append(Problem(loc, "x_overflow must be 'truncate', 'keep_start', 'keep_end' or "
                                     "{\"scan\": {\"window\": ..., \"stride\": ..., \"aggregate\": \"auto\"}}",
                                "overflow_type"))
        return None
    scan = value["scan"]
    if not isinstance(scan, dict):
        problems.append(Problem((*loc, "scan"), "Input should be a valid dictionary", "dict_type"))
        return None
    before = len(problems)
    for key in scan:
        if key not in SCAN_KEYS:
            problems.append(Problem((*loc, "scan", str(key)), "Extra inputs are not permitted; a scan takes "
                                                                "window, stride and aggregate", "extra_forbidden"))
    for key in ("window", "stride"):
        got = scan.get(key)
        if got is not None and (not isinstance(got, int) or isinstance(got, bool) or got < 0 or got > MAX_TOKENS_ONE):
            problems.append(Problem((*loc, "scan", key), f"{key} must be a whole number of tokens from 0 (the "
                                                         f"default) to {MAX_TOKENS_ONE}", "int_type"))
    aggregate = scan.get("aggregate", "auto")
    if aggregate not in AGGREGATES:
        problems.append(Problem((*loc, "scan", "aggregate"), "aggregate must be 'auto' (a yes/no from its "
                                                             "strongest window, a choice or score from its most "
                                                             "confident one)", "literal_error"))
    if len(problems) > before:
        return None
    return Scan(window=scan.get("window"), stride=scan.get("stride"), aggregate=aggregate)


def check_size(body: dict, batch: bool, limits: Limits) -> None:
    """States, questions and rows counted before any of them is validated (a 413 past a limit)."""
    states = body.get("states") if batch else None
    questions = body.get("questions")
    n_states = len(states) if isinstance(states, list) else 1
    n_questions = len(questions) if isinstance(questions, dict) else 0
    try:
        if batch:
            limits.check("states", n_states)
        limits.check("questions", n_questions)
        limits.check("rows", n_states * n_questions)
    except LimitExceeded as exc:
        raise question_error(exc) from exc


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
