"""Answers cross the pipe to and from the engine process pickled: every field comes back, in a form
that rebuilds them by position (no per-object `fields()` walk on either side)."""

from __future__ import annotations

import copy
import pickle
from dataclasses import fields

import pytest

from laya.response import Answer, SystemOneResponse


def _every_field_set() -> SystemOneResponse:
    score = Answer("score", 1.25, {"0": 0.25, "1": 0.25, "2": 0.5}, 0.4, {"0": "fine", "2": "bad"}, 0.5,
                   {"x_act_probability": 0.1, "x_tournament": {"rounds": [["0", "1"]]}})
    noul = Answer("noul", 0.75, answer_confidence=0.75, extras={"x_abstain": False})
    return SystemOneResponse("m", {"s": score, "u": noul}, 42, {"state_tokens": 7, "rows": 2}, "english", "latin",
                             "bf16")


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_every_field_survives_pickling_and_copying(protocol):
    response = _every_field_set()
    for name in (f.name for f in fields(SystemOneResponse)):  # every field differs from its default
        assert getattr(response, name) != getattr(SystemOneResponse("", {}, 0), name) or name == "model"
    back = pickle.loads(pickle.dumps(response, protocol=protocol))
    assert back == response and back.to_json() == response.to_json()
    assert type(back.answers["s"]) is Answer
    assert copy.deepcopy(response) == response and copy.copy(response.answers["u"]) == response.answers["u"]


def test_answers_pickle_by_position():
    response = _every_field_set()
    rebuild, values = response.answers["s"].__reduce__()
    assert rebuild is Answer and values == tuple(getattr(response.answers["s"], f.name) for f in fields(Answer))
    rebuild, values = response.__reduce__()
    assert rebuild is SystemOneResponse and rebuild(*values) == response
    assert b"answer_confidence" not in pickle.dumps(response)  # no field names on the wire
