"""A request is validated once, at the server's door: the engines get the typed questions that
validation produced, not the body's dictionaries to validate again."""

from __future__ import annotations

from typing import Any

import httpx
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.questions import Question, parse_questions
from laya.request import Request
from laya.server.app import create_app

QUESTIONS = {"u": {"type": "noul", "instructions": "Urgent?"},
             "t": {"type": "choice", "criteria": {"billing": "money", "sales": None}}}


class Recording(ScriptedEngine):
    def __init__(self):
        super().__init__()
        self.received: list[Any] = []

    def prepare(self, request, **options):
        self.received.append(request)
        return super().prepare(request, **options)


def test_the_engine_gets_the_questions_the_server_validated():
    engine = Recording()
    with LiveServer(create_app(lambda: [engine])) as live:
        assert httpx.post(live.url + "/v1/systemone", json={"state": "s", "questions": QUESTIONS}).status_code == 200
        assert httpx.post(live.url + "/v1/systemone/batch",
                          json={"states": ["a", "b"], "questions": QUESTIONS}).status_code == 200
    for got in engine.received[-2:]:
        assert isinstance(got, Request) and all(isinstance(q, Question) for q in got.questions)
        assert list(got.questions) == parse_questions(QUESTIONS)


def test_validated_questions_pass_through_and_raw_ones_are_validated():
    parsed = parse_questions(QUESTIONS)
    assert parse_questions(parsed) == parsed
    assert parse_questions(parsed) is not parsed  # a copy: the caller's list is never the engine's
