"""Question validation: every malformed question is refused with a message naming it."""

from __future__ import annotations

import pytest

from laya.errors import QuestionError
from laya.questions import check_state, parse_question, parse_questions


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "multiple"}, "unknown type"),
        ({"instructions": "x"}, "unknown type"),
        ("not an object", "must be an object"),
        ({"type": "choice", "instructions": "x"}, "takes 'criteria'"),
        ({"type": "choice", "instructions": "x", "criteria": {}}, "at least one option"),
        ({"type": "choice", "instructions": "x", "criteria": ["a", "a"]}, "appears twice"),
        ({"type": "choice", "instructions": "x", "criteria": ["a", None]}, "must be a string"),
        ({"type": "choice", "instructions": "x", "criteria": [["a"]]}, "must be a string"),
        ({"type": "score", "instructions": "x", "criteria": {"0": "low", "1": "high"}}, "list of level"),
        ({"type": "score", "instructions": "x", "criteria": []}, "at least one level"),
        ({"type": "score", "instructions": "x", "criteria": ["a", None]}, "level 1 is null"),
        ({"type": "noul", "instructions": "x", "criteria": ["yes"]}, "takes 'criteria'"),
        ({"type": "noul", "instructions": "x", "criteria": {"maybe": "?"}}, "only have the keys"),
        ({"type": "noul", "instructions": "x", "labels": {"true": "A"}}, "labels"),
        ({"type": "noul", "instructions": "x", "labels": {"true": "A", "false": "A"}}, "labels"),
        ({"type": "noul", "instructions": object()}, "'instructions' must be"),
    ],
)
def test_malformed_questions_are_refused_by_name(spec, message):
    with pytest.raises(QuestionError, match=message) as info:
        parse_question("my-question", spec)
    assert "my-question" in str(info.value)


def test_questions_must_be_a_non_empty_map():
    with pytest.raises(QuestionError, match="map"):
        parse_questions([{"type": "noul"}])
    with pytest.raises(QuestionError, match="empty"):
        parse_questions({})
    with pytest.raises(QuestionError, match="id"):
        parse_questions({"": {"type": "noul"}})


def test_missing_or_null_instructions_read_as_empty():
    assert parse_question("q", {"type": "noul"}).instructions == ""
    assert parse_question("q", {"type": "noul", "instructions": None, "criteria": None}).instructions == ""


def test_unknown_fields_are_ignored():
    plain = parse_question("q", {"type": "noul", "instructions": "x"})
    assert parse_question("q", {"type": "noul", "instructions": "x", "temperature": 0, "x_trace": 1}) == plain


def test_answer_keys_and_legend():
    choice = parse_question("q", {"type": "choice", "instructions": "x", "criteria": {"ä 🙂": None, "b": "d"}})
    assert choice.keys == ("ä 🙂", "b")
    score = parse_question("q", {"type": "score", "instructions": "x", "criteria": ["a", {"b": 1}]})
    assert score.keys == ("0", "1") and score.legend == {"0": "a", "1": {"b": 1}}
    assert parse_question("q", {"type": "noul"}).keys == ("false", "true")


@pytest.mark.parametrize("state", [None, 3, 2.5, True])
def test_state_must_be_text_object_or_list(state):
    with pytest.raises(QuestionError, match="state"):
        check_state(state)
