"""The request every engine takes: what a caller asked, validated once, typed and frozen.

`parse_request` turns a System One body (`/v1/systemone`, or `/batch` with `states`) into a `Request`,
refusing with FastAPI's 422 shape (every problem listed) or a 413 past the server's limits. The
engine process, Ray replicas, JSONL, MCP and the CLI pass the `Request` itself to
`Engine.prepare`, which refuses what only the model can judge (rows that do not fit, a mode the
engine has no use for) and never validates the request again. A request's options are one frozen
`Options`: adding one is adding a field here and reading it where it acts.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from laya.api import MAX_TOKENS_ONE, ApiError, question_error, render_problems
from laya.errors import QuestionError
from laya.limits import LimitExceeded, Limits
from laya.questions import Problem, Question, check_questions, parse_questions, state_problem
from laya.tournament import group_problem, tournament_rows

MAX_LANG_CHARS = 35  # BCP 47's longest registered tags are shorter
AGGREGATES = ("auto",)

# `min_confidence` / `x_min_confidence`: the caller's own abstention gate, one number in [0, 1] or a map from
# option-count buckets ("choice:3-5", "noul:2", ... and "default") to numbers; `laya.structured.gate` applies it
KINDS = ("choice", "score", "noul")
SIZES = ("2", "3-5", "6-10", "11+")
DEFAULT_KEY = "default"
BUCKETS = frozenset(f"{kind}:{size}" for kind in KINDS for size in SIZES) | {DEFAULT_KEY}

Threshold = float | dict[str, float]


def _one(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise QuestionError(f"min_confidence must be a float in [0.0, 1.0], got {value!r}"[:300],
                            error_type="invalid_min_confidence")
    return float(value)


def check_min_confidence(value: Any) -> Threshold | None:
    """The threshold validated (None stays None), or a `QuestionError` naming what is wrong; an unknown
    bucket is refused, since a bucket the caller believes is gated but is not would gate nothing."""
    if value is None:
        return None
    if isinstance(value, dict):
        if not value:
            raise QuestionError("a min_confidence map must be a non-empty dict of bucket -> float",
                                error_type="invalid_min_confidence")
        out = {}
        for key, threshold in value.items():
            if not isinstance(key, str) or key not in BUCKETS:
                raise QuestionError(f"min_confidence map keys must be a bucket like 'choice:3-5' or 'default', "
                                    f"got {key!r}"[:300], error_type="invalid_min_confidence")
            out[key] = _one(threshold)
        return out
    return _one(value)


def check_strict(min_confidence: Threshold | None, strict: bool) -> None:
    """A strict answer has no `x_` field, so it cannot carry the gate's marks: both at once is refused
    rather than one of them dropped."""
    if strict and min_confidence is not None:
        raise QuestionError("min_confidence marks answers with x_ fields (x_low_confidence, x_abstention), which a "
                            "strict answer (X-Laya-Strict, --strict, strict=True) leaves out: ask for one of them",
                            error_type="invalid_min_confidence")


@dataclass(frozen=True)
class Scan:
    """A request's `window`/`stride`/`aggregate` (None or <= 0: the default)."""

    window: int | None = None
    stride: int | None = None
    aggregate: str = "auto"


# what to do with a state longer than the row holds: None (truncate, the default), "keep_start",
# "keep_end", or a scan over windows
Overflow = str | Scan | None


OVERFLOW_MODES = ("truncate", "keep_start", "keep_end")
AS_GIVEN = "as_given"  # `x_order`: each choice read in the order given (the default); see laya.orders
MAX_ROTATIONS = 255


def order_problem(order: Any) -> str | None:
    """Why `order` is not an `x_order` value (None when it is one): `as_given`, `both` (as given and
    reversed) or `rotate:K` (K cyclic rotations)."""
    if order in (AS_GIVEN, "both"):
        return None
    if isinstance(order, str) and order.startswith("rotate:"):
        count = order.removeprefix("rotate:")
        if count.isascii() and count.isdigit() and 2 <= int(count) <= MAX_ROTATIONS:
            return None
    return (f"x_order must be 'as_given', 'both' or 'rotate:K' with K from 2 to {MAX_ROTATIONS}, got "
            f"{order!r}")[:300]


def order_count(order: str, n_options: int) -> int:
    """How many orders `x_order` reads a choice of `n_options` in (`laya.orders.permutations`' count)."""
    if order == "both":
        return 2
    if order.startswith("rotate:"):
        return min(int(order.removeprefix("rotate:")), n_options)
    return 1


@dataclass(frozen=True)
class Options:
    """What a request asks beyond its states and questions, each option read by the engine it concerns."""

    reuse_prefix: bool = True  # decide engine: false prefills the request whole, leaving the kept state
    tournament: int | None = None  # answer choices of more options by elimination in groups of this size
    overflow: Overflow = None  # encoder engine: a state longer than the row truncated (which end) or scanned
    order: str = AS_GIVEN  # each choice read in these option orders, its probabilities averaged (laya.orders)

    def __post_init__(self) -> None:
        if (message := group_problem(self.tournament)) is not None:
            raise QuestionError(message, error_type="invalid_tournament")
        if self.overflow is not None and self.overflow not in OVERFLOW_MODES and not isinstance(self.overflow, Scan):
            raise QuestionError(f"overflow must be one of {', '.join(OVERFLOW_MODES)} or a Scan, got "
                                f"{self.overflow!r}"[:300], error_type="invalid_overflow")
        if (message := order_problem(self.order)) is not None:
            raise QuestionError(message, error_type="invalid_order")


DEFAULT_OPTIONS = Options()


@dataclass(frozen=True)
class Request:
    """States and validated questions, in the caller's order, and the options; `batch` says whether
    the caller sent `states` (a /batch body) or one `state`."""

    states: tuple[Any, ...]
    questions: tuple[Question, ...]
    options: Options = DEFAULT_OPTIONS
    model: str | None = None
    lang: str | None = None  # "model": "auto": the caller's language code, decisive when it names one
    batch: bool = False
    # `x_min_confidence`: applied to the answers where they are rendered as JSON (`laya.structured.gate`),
    # never by an engine, so it stays out of `options` (what engines read, and an engine process keys by)
    min_confidence: Threshold | None = None

    @classmethod
    def of(cls, states: list[Any], questions: Any, *, reuse_prefix: bool = True, tournament: int | None = None,
           overflow: Overflow = None, order: str = AS_GIVEN) -> Request:
        """A request from library values (`Model.prepare`'s): a list of states, the API's question mapping
        (or parsed questions) and options, refused (QuestionError) where the API would refuse them."""
        from laya.questions import check_state

        for state in states:
            check_state(state)
        options = Options(reuse_prefix=reuse_prefix, tournament=tournament, overflow=overflow, order=order)
        return cls(tuple(states), tuple(parse_questions(questions)), options, batch=True)

    @property
    def state(self) -> Any:
        """The one state of a request that sent `state`."""
        return self.states[0]

    @property
    def rows(self) -> int:
        """The rows it asks for: one per state and question, every group and final row of a tournament it
        asks for (`tournament`) counted, a choice's as many times as it is read in orders (`x_order`); what
        only the model can count (a choice whose markers overflow the row, a scan's windows, a chat model's
        other questions read again with each order) the engine's job adds."""
        group, order = self.options.tournament, self.options.order
        per_state = sum((tournament_rows(q.n_options, group) if group and q.n_options > group else 1)
                        * order_count(order, q.n_options) if q.qtype == "choice" else 1 for q in self.questions)
        return len(self.states) * per_state

    def with_states(self, states: list[Any]) -> Request:
        """The same questions and options over some of the states (a model's share of an "auto" request)."""
        return replace(self, states=tuple(states))


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


def parse_request(body: Any, *, batch: bool = False, limits: Limits | None = None, from_json: bool = False,
                  sized: bool = False, default_order: str = AS_GIVEN) -> Request:
    """Validate a `/v1/systemone` body (or a `/batch` one, with `states`); raises a 422 `ApiError`, or
    a 413 when the request asks for more than `limits` (counted before anything is validated).
    `from_json`: the body is what `json.loads` made, so its question sets may be remembered by their
    `repr` (`VALIDATED`), which tells JSON values apart but not every Python object. `sized`: the
    caller counted the body against `limits` already (`check_size`, before walking it)."""
    problems: list[Problem] = []
    if not isinstance(body, dict):
        raise ApiError(422, render_problems([Problem((), "Input should be a valid dictionary", "dict_type")]))
    if not sized:
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
    options = options_of(body, problems, default_order)
    threshold = threshold_of(body, problems)
    lang = body.get("x_lang")
    if lang is not None and (not isinstance(lang, str) or len(lang) > MAX_LANG_CHARS):
        problems.append(Problem(("x_lang",), f"x_lang must be a language code such as 'en' or 'pt-BR' (at most "
                                             f"{MAX_LANG_CHARS} characters)", "string_type"))
    if problems:
        raise ApiError(422, render_problems(problems))
    states = tuple(state or ()) if batch else (state,)
    return Request(states, tuple(parsed), options, model=model, lang=lang, batch=batch, min_confidence=threshold)


def threshold_of(body: dict[str, Any], problems: list[Problem]) -> Threshold | None:
    """`x_min_confidence`: a number in [0, 1] or a map of option-count buckets to numbers (None: no gate)."""
    try:
        return check_min_confidence(body.get("x_min_confidence"))
    except QuestionError as exc:
        problems.append(Problem(("x_min_confidence",), str(exc), "min_confidence_type"))
        return None


def options_of(body: dict[str, Any], problems: list[Problem], default_order: str = AS_GIVEN) -> Options:
    """The body's options (`reuse_prefix`, `tournament`, `x_overflow`, `x_order`, else the server's
    `default_order`), each problem listed."""
    before = len(problems)
    reuse = body.get("reuse_prefix")
    if reuse is not None and not isinstance(reuse, bool):
        problems.append(Problem(("reuse_prefix",), "Input should be a valid boolean", "bool_type"))
    tournament = body.get("tournament")
    if (message := group_problem(tournament)) is not None:
        problems.append(Problem(("tournament",), message, "int_type"))
    overflow = overflow_of(body.get("x_overflow"), problems) if "x_overflow" in body else None
    order = body.get("x_order")
    if order is None:
        order = default_order
    elif (message := order_problem(order)) is not None:
        problems.append(Problem(("x_order",), message, "order_type"))
    if len(problems) > before:
        return DEFAULT_OPTIONS
    return Options(reuse_prefix=reuse is not False, tournament=tournament, overflow=overflow, order=order)


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


def check_size(body: dict[str, Any], batch: bool, limits: Limits) -> None:
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
