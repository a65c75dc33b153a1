"""System One questions, validated and normalised into what a row is built from.

Kept free of any framework: the server's schema, the encoder rows and the decide engine all start
from a `Question`, so a question means the same thing on every engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laya.errors import QuestionError

Loc = tuple[str | int, ...]  # where in a request body: keys and list indexes

QTYPES = ("choice", "score", "noul")  # the question types, in the order the type embedding rows follow

NOUL_FALSE_DEFAULT = "no, the statement does not hold"
NOUL_TRUE_DEFAULT = "yes, the statement holds"


def render_text(value: Any) -> str:
    """Structured text as the model reads it: strings as is, anything else one-line JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


SURROGATE_MSG = "a string holds a lone surrogate (an unpaired \\ud800-\\udfff code point): it is no text"


def unencodable(value: Any) -> Loc | None:
    """Where in `value` (a string, or JSON of them) a string or key holds a lone surrogate, which no
    text encoding carries (a tokenizer refuses it): its location, or None. JSON parsed by the server is
    checked on its bytes already; a library caller, an MCP tool or a JSONL line hands Python strings."""
    stack: list[tuple[Loc, Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return loc
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append(((*loc, key), key))
                stack.append(((*loc, key), child))
        elif isinstance(item, list | tuple):
            stack.extend(((*loc, i), child) for i, child in enumerate(item))
    return None


def serialize_state(state: Any) -> str:
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


@dataclass(frozen=True)
class Question:
    """One question, ready for any engine.

    `keys` are the answer keys in option order (choice labels, score levels "0".., noul
    "false"/"true"); `options` the option texts the encoder reads; `names`/`descriptions` the raw
    pieces, which prompt-based engines render their own way.
    """

    qid: str
    qtype: str
    instructions: str
    keys: tuple[str, ...]
    options: tuple[str, ...]
    names: tuple[str, ...]
    descriptions: tuple[str | None, ...]
    # a score's level texts by level: compared, not hashed (a dict), so a question set can key a
    # cache (the engine process's question slots); every other field says the levels already
    legend: dict[str, Any] | None = field(default=None, hash=False)
    shortlist: int | None = None  # `x_shortlist`: a choice answered on its K options nearest the state

    @property
    def qtype_index(self) -> int:
        return QTYPES.index(self.qtype)

    @property
    def n_options(self) -> int:
        return len(self.options)


MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
TEXT_MSG = "Input should be a valid string, object or array"


@dataclass(frozen=True)
class Problem:
    """One reason a request cannot be answered: where (`loc`, inside the request body), what, and a
    machine-readable `type`. The server renders these as FastAPI's 422 items, the library as a
    `QuestionError`: one list of rules for every surface."""

    loc: Loc
    msg: str
    type: str

    def as_error(self) -> QuestionError:
        qid = self.loc[1] if len(self.loc) > 1 and self.loc[0] == "questions" else None
        where = f"question {qid!r}: " if qid is not None else ""
        if qid is not None and len(self.loc) > 2:
            where += f"{'.'.join(map(str, self.loc[2:]))}: "
        error_type = "invalid_state" if self.loc[:1] == ("state",) else "invalid_question"
        return QuestionError(f"{where}{self.msg}", qid=qid if isinstance(qid, str) else None, error_type=error_type)


def _is_text(value: Any) -> bool:
    return isinstance(value, str | dict | list)


def _count(loc: Loc, what: str, n: int, low: int, high: int, unit: str, problems: list[Problem]) -> bool:
    if n < low:
        problems.append(Problem(loc, f"{what} needs at least {low} {unit}, got {n}", "too_short"))
    elif n > high:
        problems.append(Problem(loc, f"{what} takes at most {high} {unit}, got {n}", "too_long"))
    else:
        return True
    return False


def _choice(loc: Loc, criteria: Any, problems: list[Problem]) -> tuple[list[str], list[str | None]] | None:
    cloc = (*loc, "criteria")
    if criteria is None:
        problems.append(Problem(cloc, "Field required: a choice question takes 'criteria', a map option -> "
                                      "description (or a list of option names)", "missing"))
        return None
    if isinstance(criteria, dict | list):
        names = list(criteria)
        values = list(criteria.values()) if isinstance(criteria, dict) else [None] * len(names)
        for i, name in enumerate(names):
            if not isinstance(name, str):
                problems.append(Problem((*cloc, i), f"option names must be strings, got {type(name).__name__}",
                                        "string_type"))
                return None
        seen: set[str] = set()
        for name in names:
            if name in seen:
                problems.append(Problem(cloc, f"option {name!r} appears twice; option names are the answer keys",
                                        "value_error"))
                return None
            seen.add(name)
    else:
        problems.append(Problem(cloc, "Input should be a valid dictionary of option -> description", "dict_type"))
        return None
    if not _count(cloc, "a choice question", len(names), MIN_OPTIONS, MAX_OPTIONS, "options", problems):
        return None
    ok = True
    for name, value in zip(names, values):
        if value is not None and not _is_text(value):
            problems.append(Problem((*cloc, name), TEXT_MSG + " or null", "text_type"))
            ok = False
    if not ok:
        return None
    return names, [None if v is None or v == "" else render_text(v) for v in values]


def _score(loc: Loc, criteria: Any, problems: list[Problem]) -> list[Any] | None:
    cloc = (*loc, "criteria")
    if isinstance(criteria, dict):
        problems.append(Problem(cloc, "score criteria must be a LIST of level descriptions, level 0 first; "
                                      "the map form is not accepted", "list_type"))
        return None
    if criteria is None:
        problems.append(Problem(cloc, "Field required: a score question takes 'criteria', a list of level "
                                      "descriptions, level 0 first", "missing"))
        return None
    if not isinstance(criteria, list):
        problems.append(Problem(cloc, "Input should be a valid list of level descriptions", "list_type"))
        return None
    if not _count(cloc, "a score question", len(criteria), MIN_LEVELS, MAX_LEVELS, "levels", problems):
        return None
    bad = [i for i, level in enumerate(criteria) if not _is_text(level)]
    for i in bad:
        problems.append(Problem((*cloc, i), TEXT_MSG + " (describe every level)", "text_type"))
    return None if bad else criteria


def _noul(loc: Loc, criteria: Any, labels: Any,
          problems: list[Problem]) -> tuple[dict[str, Any], tuple[str, str]] | None:
    cloc = (*loc, "criteria")
    if criteria is None:
        criteria = {}
    if not isinstance(criteria, dict):
        problems.append(Problem(cloc, "Input should be a valid dictionary with 'true' and/or 'false' (or null)",
                                "dict_type"))
        return None
    ok = True
    lowered: dict[str, Any] = {}
    for key, value in criteria.items():
        low = key.lower() if isinstance(key, str) else None
        if low is None or low not in ("true", "false"):
            problems.append(Problem((*cloc, str(key)), "noul criteria take only the keys 'true' and 'false'",
                                    "extra_forbidden"))
            ok = False
        elif low in lowered:
            problems.append(Problem((*cloc, key), f"noul criteria name {low!r} twice (keys are case-insensitive)",
                                    "value_error"))
            ok = False
        elif value is not None and not _is_text(value):
            problems.append(Problem((*cloc, key), TEXT_MSG + " or null", "text_type"))
            ok = False
        if low is not None:
            lowered[low] = value
    pair = _noul_labels((*loc, "labels"), labels, problems)
    return (lowered, pair) if ok and pair else None


def _noul_labels(loc: Loc, labels: Any, problems: list[Problem]) -> tuple[str, str] | None:
    if labels is None:
        return "false", "true"
    message = "noul 'labels' must map exactly 'false' and 'true' to two different non-empty strings"
    if (not isinstance(labels, dict) or len(labels) != 2 or not all(isinstance(k, str) for k in labels)
            or {k.lower() for k in labels} != {"false", "true"}):
        problems.append(Problem(loc, message, "value_error"))
        return None
    resolved = {k.lower(): v for k, v in labels.items()}
    false_label, true_label = resolved["false"], resolved["true"]
    if not isinstance(false_label, str) or not isinstance(true_label, str):
        problems.append(Problem(loc, message, "string_type"))
        return None
    false_label, true_label = false_label.strip(), true_label.strip()
    if not false_label or not true_label or false_label == true_label:
        problems.append(Problem(loc, message, "value_error"))
        return None
    return false_label, true_label


def check_question(qid: Any, spec: Any, problems: list[Problem]) -> Question | None:
    """Validate one question by the System One contract and normalise it; problems go to `problems`.

    The one rule set of the library, the CLI and the server: 2-255 choice options (a map option ->
    description, or a list of option names), 2-10 score levels as a list, noul criteria with only
    'true'/'false'; every text (instructions, descriptions, levels) a string, object or array."""
    loc: Loc = ("questions", qid)
    if not isinstance(qid, str) or not qid or unencodable(qid) is not None:
        problems.append(Problem(("questions",), "question ids must be non-empty strings of text", "value_error"))
        return None
    if not isinstance(spec, dict):
        problems.append(Problem(loc, "Input should be a valid dictionary (a question definition)", "dict_type"))
        return None
    if "type" not in spec:
        problems.append(Problem((*loc, "type"), "Field required: the question's type (noul, choice or score)",
                                "missing"))
        return None
    if (where := unencodable(spec)) is not None:
        problems.append(Problem((*loc, *where), SURROGATE_MSG, "string_type"))
        return None
    qtype = spec["type"]
    if qtype not in QTYPES:
        shown = qtype if isinstance(qtype, str) and len(qtype) <= 40 else type(qtype).__name__
        problems.append(Problem((*loc, "type"), f"Input tag {shown!r} does not match any of the expected tags: "
                                                "'noul', 'choice', 'score'", "union_tag_invalid"))
        return None
    instructions = spec.get("instructions")
    before = len(problems)
    if instructions is not None and not _is_text(instructions):
        problems.append(Problem((*loc, "instructions"), TEXT_MSG + " or null", "text_type"))
    criteria = spec.get("criteria")
    legend = None
    if qtype == "choice":
        choice = _choice(loc, criteria, problems)
        if choice is None or len(problems) > before:
            return None
        names, descriptions = choice
        keys = list(names)
        options = [n if d is None else f"{n}: {d}" for n, d in zip(names, descriptions)]
    elif qtype == "score":
        levels = _score(loc, criteria, problems)
        if levels is None or len(problems) > before:
            return None
        names = [str(i) for i in range(len(levels))]
        descriptions = [render_text(c) for c in levels]
        keys = list(names)
        options = [f"level {i}: {d}" for i, d in enumerate(descriptions)]
        legend = {str(i): c for i, c in enumerate(levels)}
    else:
        noul = _noul(loc, criteria, spec.get("labels"), problems)
        if noul is None or len(problems) > before:
            return None
        lowered, (false_label, true_label) = noul
        false_text, true_text = lowered.get("false"), lowered.get("true")
        false_text = NOUL_FALSE_DEFAULT if false_text in (None, "") else render_text(false_text)
        true_text = NOUL_TRUE_DEFAULT if true_text in (None, "") else render_text(true_text)
        names = [false_label, true_label]
        descriptions = [false_text, true_text]
        keys = ["false", "true"]
        options = [f"{false_label}: {false_text}", f"{true_label}: {true_text}"]
    shortlist = spec.get("x_shortlist")
    if shortlist is not None and (qtype != "choice" or isinstance(shortlist, bool) or not isinstance(shortlist, int)
                                  or not 1 <= shortlist <= MAX_OPTIONS):
        problems.append(Problem((*loc, "x_shortlist"), f"x_shortlist is a choice question's number of options to "
                                                       f"keep, from 1 to {MAX_OPTIONS}", "shortlist_type"))
        return None
    return Question(
        qid=qid,
        qtype=qtype,
        instructions="" if instructions is None else render_text(instructions),
        keys=tuple(keys),
        options=tuple(options),
        names=tuple(names),
        descriptions=tuple(descriptions),
        legend=legend,
        shortlist=shortlist,
    )


# What an engine's `prepare` takes: a request's questions as sent (id -> question), or already
# validated by the server's parse (a list of `Question`, which `parse_questions` passes through).
Questions = Mapping[str, Any] | list[Question]


def check_questions(questions: Any, problems: list[Problem]) -> list[Question]:
    """All questions of a request in the caller's order (the valid ones; the rest add problems)."""
    if not isinstance(questions, dict):
        problems.append(Problem(("questions",), "Input should be a valid dictionary of id -> question",
                                "dict_type"))
        return []
    if not questions:
        problems.append(Problem(("questions",), "questions must not be empty", "too_short"))
        return []
    parsed = [check_question(qid, spec, problems) for qid, spec in questions.items()]
    return [q for q in parsed if q is not None]


def raise_first(problems: list[Problem]) -> None:
    """The library's rendering: a `QuestionError` naming the first problem (and how many there are)."""
    if problems:
        error = problems[0].as_error()
        if len(problems) > 1:
            error.args = (f"{error.args[0]} (and {len(problems) - 1} more problem"
                          f"{'s' if len(problems) > 2 else ''})",)
        raise error


def parse_question(qid: Any, spec: Any) -> Question:
    """One question, validated and normalised; raises `QuestionError` naming the question."""
    problems: list[Problem] = []
    question = check_question(qid, spec, problems)
    raise_first(problems)
    assert question is not None
    return question


def parse_questions(questions: Any) -> list[Question]:
    """All questions of a request, in the caller's order; raises `QuestionError` on the first problem.
    Questions validated already (the server's parse gives `Question`s to the engines) pass as they are,
    so a request is validated once however many processes it crosses."""
    if isinstance(questions, list | tuple) and questions and all(isinstance(q, Question) for q in questions):
        return list(questions)
    problems: list[Problem] = []
    parsed = check_questions(questions, problems)
    raise_first(problems)
    return parsed


def state_problem(state: Any, loc: Loc = ("state",)) -> Problem | None:
    if state is None:
        return Problem(loc, "state must not be null; pass text, an object or a list", "missing")
    if not _is_text(state):
        return Problem(loc, f"{TEXT_MSG} (the state), got {type(state).__name__}", "text_type")
    if (where := unencodable(state)) is not None:
        return Problem((*loc, *where), SURROGATE_MSG, "string_type")
    return None


def check_state(state: Any) -> None:
    problem = state_problem(state)
    if problem is not None:
        raise problem.as_error()
