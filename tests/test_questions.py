"""Question validation: every malformed question is refused with a message naming it."""

from __future__ import annotations

import pytest

from laya.api import ApiError
from laya.errors import QuestionError
from laya.questions import check_state, parse_question, parse_questions
from laya.request import parse_request

# The one rule set (System One contract where upstream laya is looser): each malformed question, the
# problem's location inside the request, and a piece of the message the library raises.
MALFORMED = [
    ({"type": "multiple"}, ("type",), "does not match any of the expected tags"),
    ({"instructions": "x"}, ("type",), "Field required"),
    ("not an object", (), "valid dictionary"),
    ({"type": "choice", "instructions": "x"}, ("criteria",), "takes 'criteria'"),
    ({"type": "choice", "instructions": "x", "criteria": {}}, ("criteria",), "at least 2 options"),
    ({"type": "choice", "instructions": "x", "criteria": {"only": None}}, ("criteria",), "at least 2 options"),
    ({"type": "choice", "criteria": {str(i): None for i in range(256)}}, ("criteria",), "at most 255 options"),
    ({"type": "choice", "instructions": "x", "criteria": ["a", "a"]}, ("criteria",), "appears twice"),
    ({"type": "choice", "instructions": "x", "criteria": ["a", None]}, ("criteria", 1), "must be strings"),
    ({"type": "choice", "instructions": "x", "criteria": [1, 2, 3]}, ("criteria", 0), "must be strings"),
    ({"type": "choice", "instructions": "x", "criteria": [["a"], "b"]}, ("criteria", 0), "must be strings"),
    ({"type": "choice", "criteria": {"a": 0, "b": None}}, ("criteria", "a"), "valid string, object or array"),
    ({"type": "choice", "criteria": "a, b"}, ("criteria",), "valid dictionary"),
    ({"type": "score", "instructions": "x", "criteria": {"0": "low", "1": "high"}}, ("criteria",), "LIST"),
    ({"type": "score", "instructions": "x", "criteria": []}, ("criteria",), "at least 2 levels"),
    ({"type": "score", "instructions": "x", "criteria": ["one"]}, ("criteria",), "at least 2 levels"),
    ({"type": "score", "criteria": [str(i) for i in range(11)]}, ("criteria",), "at most 10 levels"),
    ({"type": "score", "instructions": "x", "criteria": ["a", None]}, ("criteria", 1), "describe every level"),
    ({"type": "score", "instructions": "x", "criteria": ["a", 3.5]}, ("criteria", 1), "describe every level"),
    ({"type": "noul", "instructions": "x", "criteria": ["yes"]}, ("criteria",), "'true' and/or 'false'"),
    ({"type": "noul", "instructions": "x", "criteria": {"maybe": "?"}}, ("criteria", "maybe"), "only the keys"),
    ({"type": "noul", "criteria": {"true": "a", "TRUE": "b"}}, ("criteria", "TRUE"), "twice"),
    ({"type": "noul", "criteria": {"true": 1}}, ("criteria", "true"), "valid string, object or array"),
    ({"type": "noul", "instructions": "x", "labels": {"true": "A"}}, ("labels",), "labels"),
    ({"type": "noul", "instructions": "x", "labels": {"true": "A", "false": "A"}}, ("labels",), "labels"),
    ({"type": "noul", "instructions": 42}, ("instructions",), "valid string, object or array"),
    ({"type": "noul", "instructions": object()}, ("instructions",), "valid string, object or array"),
]


@pytest.mark.parametrize(("spec", "where", "message"), MALFORMED)
def test_malformed_questions_are_refused_by_name(spec, where, message):
    with pytest.raises(QuestionError, match=message) as info:
        parse_question("my-question", spec)
    assert "my-question" in str(info.value) and info.value.qid == "my-question"


@pytest.mark.parametrize(("spec", "where", "message"), MALFORMED)
def test_the_server_refuses_exactly_what_the_library_refuses(spec, where, message):
    """One validator: the HTTP schema reports the same problem, at its location in the body."""
    if spec == {"type": "noul", "instructions": object()}:
        return  # not JSON: no HTTP body can carry it
    with pytest.raises(ApiError) as info:
        parse_request({"state": "s", "questions": {"my-question": spec}})
    assert info.value.status == 422
    first = info.value.detail[0]
    assert first["loc"] == ["body", "questions", "my-question", *where] and message in first["msg"]


@pytest.mark.parametrize("spec", [
    {"type": "choice", "criteria": {"a": None, "b": ""}},
    {"type": "choice", "criteria": ["a", "b"], "instructions": {"task": "route"}},
    {"type": "choice", "criteria": {str(i): None for i in range(255)}},
    {"type": "score", "criteria": ["low", {"label": "high"}]},
    {"type": "score", "criteria": [str(i) for i in range(10)]},
    {"type": "noul", "criteria": None, "instructions": None},
    {"type": "noul", "criteria": {"True": ["x"]}, "labels": {"false": "B", "true": "A"}},
])
def test_both_surfaces_accept_the_same_valid_questions(spec):
    question = parse_question("q", spec)
    request = parse_request({"state": "s", "questions": {"q": spec}})
    assert parse_questions(request.questions) == [question]


def test_every_problem_is_listed_by_the_server_and_counted_by_the_library():
    questions = {"a": {"type": "choice", "criteria": ["x"]}, "b": {"type": "score", "criteria": ["y"]}}
    with pytest.raises(ApiError) as info:
        parse_request({"state": "s", "questions": questions})
    assert [d["loc"][2] for d in info.value.detail] == ["a", "b"]
    with pytest.raises(QuestionError, match=r"question 'a'.*\(and 1 more problem\)"):
        parse_questions(questions)


def test_questions_must_be_a_non_empty_map():
    with pytest.raises(QuestionError, match="dictionary of id -> question"):
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


def test_a_remembered_question_set_is_the_one_asked_and_a_refused_one_is_never_remembered():
    """The server remembers validated question sets by their JSON (laya.request.VALIDATED): values that
    differ only in type (1, 1.0, true, "1") or key order are different sets, each validated on its
    own; a set with a problem is refused every time it comes."""
    from laya.request import ValidatedQuestions

    remember = ValidatedQuestions(size=4)
    base = {"a": {"type": "choice", "criteria": {"x": "one", "y": "two"}}, "b": {"type": "noul"}}
    first = remember(base, problems := [])
    assert not problems and first == parse_questions(base)
    again = remember({"a": {"type": "choice", "criteria": {"x": "one", "y": "two"}}, "b": {"type": "noul"}}, [])
    assert again == first and again is not first  # a list of its own, the same frozen questions
    swapped = remember({"b": base["b"], "a": base["a"]}, [])
    assert [q.qid for q in swapped] == ["b", "a"]
    for level in (1, 1.0, True):  # a level that is no text is refused, whatever its JSON type
        refused = {"s": {"type": "score", "criteria": ["low", level]}}
        assert remember(refused, problems := []) == [] and problems
        assert remember(refused, problems := []) == [] and problems  # refused again, never remembered
    assert remember({"s": {"type": "score", "criteria": ["low", "1"]}}, problems := []) and not problems
    for i in range(6):  # least recently used out first; the set asked again is still answered right
        assert [q.qid for q in remember({f"q{i}": {"type": "noul"}}, [])] == [f"q{i}"]
    assert remember(base, []) == first
    with pytest.raises(ApiError):  # the server's path refuses as the library does
        parse_request({"state": "s", "questions": {"s": {"type": "score", "criteria": ["low", 2]}}},
                        from_json=True)


@pytest.mark.parametrize("state", ["a\ud800b", {"key\udfff": 1}, ["fine", {"x": ["\udbff"]}]])
def test_a_state_with_a_lone_surrogate_is_refused_before_the_tokenizer(state):
    """No text encoding carries a lone surrogate: JSON parsed by the server is checked on its bytes, but a
    library caller, an MCP tool or a JSONL line hands Python strings."""
    with pytest.raises(QuestionError, match="lone surrogate"):
        check_state(state)
    with pytest.raises(QuestionError, match="lone surrogate"):
        parse_questions({"q": {"type": "choice", "criteria": {"a": None, "b": "x\ud800"}}})
    check_state("an ordinary state, with ünïcödé and 😀")
