"""Labelled decisions for calibration: one JSON object per line.

`{"state": ..., "questions": {...}, "labels": {qid: answer}}`: a choice label is an option name, a
score label a level index, a noul label true/false. Every line is checked before any model runs;
a mistake names the line and the question.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya.errors import QuestionError
from laya.questions import Question, check_state, parse_questions


class DataError(QuestionError):
    """A labelled-data file that cannot be used, naming the line."""


@dataclass(frozen=True)
class Record:
    line: int
    state: Any
    questions: dict[str, Any]
    parsed: list[Question]
    labels: dict[str, int]  # qid -> index of the right option


def label_index(q: Question, value: Any) -> int:
    if q.qtype == "choice":
        if not isinstance(value, str) or value not in q.keys:
            raise ValueError(f"choice label must be one of the option names {list(q.keys)}, got {value!r}")
        return q.keys.index(value)
    if q.qtype == "score":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < q.n_options:
            raise ValueError(f"score label must be a level index 0..{q.n_options - 1}, got {value!r}")
        return value
    if not isinstance(value, bool):
        raise ValueError(f"noul label must be true or false, got {value!r}")
    return q.keys.index("true" if value else "false")


def read_records(path: str | os.PathLike) -> list[Record]:
    where = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{where}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text ({exc})") from exc
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{at}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(data, dict) or not {"state", "questions", "labels"} <= set(data):
            raise DataError(f"{at}: each line needs \"state\", \"questions\" and \"labels\"")
        try:
            check_state(data["state"])
            parsed = parse_questions(data["questions"])
        except QuestionError as exc:
            raise DataError(f"{at}: {exc}") from exc
        labels = data["labels"]
        if not isinstance(labels, dict) or not labels:
            raise DataError(f"{at}: \"labels\" must map question ids to answers")
        by_id = {q.qid: q for q in parsed}
        indices = {}
        for qid, value in labels.items():
            if qid not in by_id:
                raise DataError(f"{at}: label for {qid!r}, which is not one of the questions {list(by_id)}")
            try:
                indices[qid] = label_index(by_id[qid], value)
            except ValueError as exc:
                raise DataError(f"{at}: question {qid!r}: {exc}") from exc
        records.append(Record(number, data["state"], data["questions"], parsed, indices))
    if not records:
        raise DataError(f"{where}: no labelled decisions in the file")
    return records
