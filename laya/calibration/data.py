"""Labelled decisions for calibration and training: one JSON object per line, or a CSV file.

`{"state": ..., "questions": {...}, "labels": {qid: answer}}`: a choice label is an option name, a
score label a level index, a noul label true/false. Upstream's training files are read unchanged:
`"expected"` is another name for `"labels"`, and `"gold": {qid: distribution}` gives a probability
per option (a list in option order, or a map from answer key) whose top option is the label. A CSV
file with a text column and a label column becomes one choice question over the labels it holds.
Every line is checked before any model runs; a mistake names the line and the question.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    soft: dict[str, tuple[float, ...]] = field(default_factory=dict)  # qid -> gold distribution, when given
    tags: tuple[str, ...] = ()  # "tags": what `laya eval` slices its figures by
    lang: str | None = None  # "lang": the state's language, another slice
    group: str | None = None  # "group": the stratum its prediction sets and report figures are kept per


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


def gold_distribution(q: Question, value: Any) -> tuple[float, ...]:
    """A gold distribution over q's options: a list in option order or a map from answer key."""
    if isinstance(value, dict):
        unknown = [k for k in value if k not in q.keys]
        if unknown:
            raise ValueError(f"gold keys must be answer keys {list(q.keys)}, got {unknown[:3]}")
        value = [value.get(k, 0.0) for k in q.keys]
    if not isinstance(value, list) or len(value) != q.n_options:
        raise ValueError(f"gold must give {q.n_options} probabilities (a list in option order or a map)")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in value):
        raise ValueError("gold probabilities must be finite numbers >= 0")
    total = float(sum(value))
    if total <= 0:
        raise ValueError("gold probabilities must not all be 0")
    return tuple(float(v) / total for v in value)


def json_lines(path: str | os.PathLike) -> Iterator[tuple[int, str, Any]]:
    """(line number, "file:line" for messages, the parsed value) of each non-blank line of a JSONL
    file; a line that is not JSON raises `DataError` naming it."""
    where = os.fspath(path)
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            yield number, at, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{at}: not valid JSON ({exc.msg} at column {exc.colno})") from exc


def read_records(path: str | os.PathLike) -> list[Record]:
    where = os.fspath(path)
    if where.lower().endswith(".csv"):
        raise DataError(f"{where}: a CSV file; read it with read_csv_records (laya train reads both)")
    records = []
    for number, at, data in json_lines(path):
        keys = {"labels", "expected", "gold"} & set(data) if isinstance(data, dict) else set()
        if not isinstance(data, dict) or not {"state", "questions"} <= set(data) or len(keys) != 1:
            raise DataError(f"{at}: each line needs \"state\", \"questions\" and one of \"labels\" (or "
                            "upstream's \"expected\") or \"gold\"")
        try:
            check_state(data["state"])
            parsed = parse_questions(data["questions"])
        except QuestionError as exc:
            raise DataError(f"{at}: {exc}") from exc
        key = keys.pop()
        given = data[key]
        if not isinstance(given, dict) or not given:
            raise DataError(f"{at}: \"{key}\" must map question ids to answers")
        by_id = {q.qid: q for q in parsed}
        indices, soft = {}, {}
        for qid, value in given.items():
            if qid not in by_id:
                raise DataError(f"{at}: {key} for {qid!r}, which is not one of the questions {list(by_id)}")
            try:
                if key == "gold":
                    soft[qid] = gold_distribution(by_id[qid], value)
                    indices[qid] = max(range(len(soft[qid])), key=soft[qid].__getitem__)
                else:
                    indices[qid] = label_index(by_id[qid], value)
            except ValueError as exc:
                raise DataError(f"{at}: question {qid!r}: {exc}") from exc
        tags, lang = data.get("tags", []), data.get("lang")
        if not isinstance(tags, list) or not all(isinstance(t, str) and 0 < len(t) <= 100 for t in tags):
            raise DataError(f"{at}: \"tags\" must be a list of short strings")
        if lang is not None and not (isinstance(lang, str) and 0 < len(lang) <= 35):
            raise DataError(f"{at}: \"lang\" must be a language tag such as \"en\"")
        group = data.get("group")
        if group is not None and not (isinstance(group, str) and 0 < len(group) <= 100):
            raise DataError(f"{at}: \"group\" must be a short string such as \"de\" or \"enterprise\"")
        records.append(Record(number, data["state"], data["questions"], parsed, indices, soft, tuple(tags), lang,
                              group))
    if not records:
        raise DataError(f"{where}: no labelled decisions in the file")
    return records


def _read_text(path: str | os.PathLike) -> str:
    where = os.fspath(path)
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(f"{where}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text ({exc})") from exc


CSV_QUESTION = "label"


def read_csv_records(path: str | os.PathLike, text_column: str = "text", label_column: str = "label",
                     instructions: str = "Which label fits this text?") -> list[Record]:
    """One choice question (id "label") over the labels the file holds, in order of first appearance."""
    where = os.fspath(path)
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    missing = [c for c in (text_column, label_column) if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{where}: no column {' or '.join(map(repr, missing))}; the header has "
                        f"{reader.fieldnames or 'no columns'} (choose with --text-column / --label-column)")
    rows = []
    try:
        for row in reader:
            text, label = (row.get(text_column) or "").strip(), (row.get(label_column) or "").strip()
            line = reader.line_num
            if not text or not label:
                raise DataError(f"{where}:{line}: empty {text_column if not text else label_column}")
            rows.append((line, text, label))
    except csv.Error as exc:
        raise DataError(f"{where}:{reader.line_num}: not valid CSV ({exc})") from exc
    labels = list(dict.fromkeys(label for _, _, label in rows))
    question = {CSV_QUESTION: {"type": "choice", "instructions": instructions,
                               "criteria": {label: None for label in labels}}}
    try:
        parsed = parse_questions(question)
    except QuestionError as exc:
        raise DataError(f"{where}: the labels of column {label_column!r} do not make a choice question: {exc}") \
            from exc
    records = [Record(line, text, question, parsed, {CSV_QUESTION: labels.index(label)}) for line, text, label in rows]
    if not records:
        raise DataError(f"{where}: no labelled rows in the file")
    return records


def read_labelled(path: str | os.PathLike, **csv_options: Any) -> list[Record]:
    """JSONL, or CSV by its extension."""
    if os.fspath(path).lower().endswith(".csv"):
        return read_csv_records(path, **csv_options)
    return read_records(path)
