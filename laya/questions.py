"""System One questions, validated and normalised into what a row is built from.

Kept free of any framework: the server's schema, the encoder rows and the decide engine all start
from a `Question`, so a question means the same thing on every engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from laya.config import QTYPES
from laya.errors import QuestionError

NOUL_FALSE_DEFAULT = "no, the statement does not hold"
NOUL_TRUE_DEFAULT = "yes, the statement holds"


def render_text(value: Any) -> str:
    """Structured text as the model reads it: strings as is, anything else one-line JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


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
    legend: dict[str, Any] | None = None

    @property
    def qtype_index(self) -> int:
        return QTYPES.index(self.qtype)

    @property
    def n_options(self) -> int:
        return len(self.options)


def _fail(qid: str, message: str) -> QuestionError:
    return QuestionError(f"question {qid!r}: {message}", qid=qid)


def _instructions(qid: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | int | float | bool):
        return json.dumps(value, ensure_ascii=False)
    raise _fail(qid, f"'instructions' must be text, an object or a list, got {type(value).__name__}")


def _label(qid: str, index: int, label: Any) -> str:
    if isinstance(label, str):
        return label
    if isinstance(label, int | float) and not isinstance(label, bool):
        return str(label)
    raise _fail(qid, f"choice option {index} must be a string, got {label!r}")


def _choice(qid: str, criteria: Any) -> tuple[list[str], list[str | None]]:
    if isinstance(criteria, list):
        pairs = [(_label(qid, i, c), None) for i, c in enumerate(criteria)]
    elif isinstance(criteria, dict):
        pairs = [(_label(qid, i, k), v) for i, (k, v) in enumerate(criteria.items())]
    else:
        raise _fail(qid, "a choice question takes 'criteria' as a map option -> description (or a list of options)")
    if not pairs:
        raise _fail(qid, "a choice question needs at least one option")
    names = [name for name, _ in pairs]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _fail(qid, f"option {name!r} appears twice; option names are the answer keys")
        seen.add(name)
    descriptions = [None if v is None or v == "" else render_text(v) for _, v in pairs]
    return names, descriptions


def _noul_labels(qid: str, labels: Any) -> tuple[str, str]:
    if labels is None:
        return "false", "true"
    if not isinstance(labels, dict) or {str(k).lower() for k in labels} != {"false", "true"}:
        raise _fail(qid, "noul 'labels' must map exactly 'false' and 'true' to two different texts")
    resolved = {str(k).lower(): v for k, v in labels.items()}
    false_label, true_label = resolved["false"], resolved["true"]
    if not isinstance(false_label, str) or not isinstance(true_label, str):
        raise _fail(qid, "noul 'labels' must be strings")
    false_label, true_label = false_label.strip(), true_label.strip()
    if not false_label or not true_label or false_label == true_label:
        raise _fail(qid, "noul 'labels' must be two different non-empty strings")
    return false_label, true_label


def parse_question(qid: Any, spec: Any) -> Question:
    """Validate one question definition and normalise it; raises `QuestionError` naming the question."""
    if not isinstance(qid, str) or not qid:
        raise QuestionError(f"question id must be a non-empty string, got {qid!r}")
    if not isinstance(spec, dict):
        raise _fail(qid, f"definition must be an object, got {type(spec).__name__}")
    qtype = spec.get("type")
    if qtype not in QTYPES:
        raise _fail(qid, f"unknown type {qtype!r}; use one of {', '.join(QTYPES)}")
    instructions = _instructions(qid, spec.get("instructions"))
    criteria = spec.get("criteria")
    legend = None
    if qtype == "choice":
        names, descriptions = _choice(qid, criteria)
        keys = list(names)
        options = [n if d is None else f"{n}: {d}" for n, d in zip(names, descriptions)]
    elif qtype == "score":
        if not isinstance(criteria, list):
            raise _fail(qid, "a score question takes 'criteria' as a list of level descriptions, level 0 first")
        if not criteria:
            raise _fail(qid, "a score question needs at least one level")
        if any(c is None for c in criteria):
            raise _fail(qid, f"score level {criteria.index(None)} is null; describe every level")
        names = [str(i) for i in range(len(criteria))]
        descriptions = [render_text(c) for c in criteria]
        keys = list(names)
        options = [f"level {i}: {d}" for i, d in enumerate(descriptions)]
        legend = {str(i): c for i, c in enumerate(criteria)}
    else:
        if criteria is None:
            criteria = {}
        if not isinstance(criteria, dict):
            raise _fail(qid, "a noul question takes 'criteria' as an object with 'true' and/or 'false', or omits it")
        lowered = {str(k).lower(): v for k, v in criteria.items()}
        if not set(lowered) <= {"true", "false"}:
            raise _fail(qid, f"noul 'criteria' may only have the keys 'true' and 'false', got {sorted(lowered)}")
        false_label, true_label = _noul_labels(qid, spec.get("labels"))
        false_text, true_text = lowered.get("false"), lowered.get("true")
        false_text = NOUL_FALSE_DEFAULT if false_text in (None, "") else render_text(false_text)
        true_text = NOUL_TRUE_DEFAULT if true_text in (None, "") else render_text(true_text)
        names = [false_label, true_label]
        descriptions = [false_text, true_text]
        keys = ["false", "true"]
        options = [f"{false_label}: {false_text}", f"{true_label}: {true_text}"]
    return Question(
        qid=qid,
        qtype=qtype,
        instructions=instructions,
        keys=tuple(keys),
        options=tuple(options),
        names=tuple(names),
        descriptions=tuple(descriptions),
        legend=legend,
    )


def parse_questions(questions: Any) -> list[Question]:
    """All questions of a request, in the caller's order."""
    if not isinstance(questions, dict):
        raise QuestionError(f"questions must be a map of id -> question, got {type(questions).__name__}")
    if not questions:
        raise QuestionError("questions must not be empty")
    return [parse_question(qid, spec) for qid, spec in questions.items()]


def check_state(state: Any) -> None:
    if state is None:
        raise QuestionError("state must not be null; pass text, an object or a list", error_type="invalid_state")
    if not isinstance(state, str | dict | list):
        raise QuestionError(
            f"state must be text, an object or a list, got {type(state).__name__}", error_type="invalid_state"
        )
