"""Order-free choices (`x_order`): each choice question read in several option orders, its calibrated
probabilities averaged per option. Held here: `both` is the mean of the two answers computed apart,
`rotate:K` with K the number of options does not depend on where the caller's list starts, the parts
of one request go through one `execute` (one batch) and are counted as rows, both engines do it, and
the server takes the option (and a default) and refuses a bad one."""

from __future__ import annotations

import warnings

import httpx
import pytest
from conftest import need
from live_server import LiveServer

from laya.decoding.confidence import choice_confidence
from laya.encoder.engine import EncoderEngine
from laya.errors import QuestionError
from laya.orders import averaged, permutations
from laya.questions import parse_question
from laya.request import Request
from laya.response import Answer

OPTIONS = {"billing": "refunds and charges", "sales": "new plans", "tech": "it does not work", "legal": None}
STATE = "I was charged twice for one order and nobody answers my emails"


def choice(keys) -> dict:
    return {"t": {"type": "choice", "instructions": "Which team?", "criteria": {k: OPTIONS[k] for k in keys}},
            "u": {"type": "noul", "instructions": "Urgent?"}}


def answer(engine, keys, order="as_given") -> dict:
    (job_answers,) = engine.execute([engine.prepare(Request.of([STATE], choice(keys), order=order))])
    return {qid: a.to_json() for qid, a in job_answers[0].answers.items()}


def test_the_orders_read():
    assert permutations("both", 4) == [(0, 1, 2, 3), (3, 2, 1, 0)]
    assert permutations("rotate:4", 4) == [(0, 1, 2, 3), (1, 2, 3, 0), (2, 3, 0, 1), (3, 0, 1, 2)]
    assert [p[0] for p in permutations("rotate:3", 6)] == [0, 2, 4]  # spread evenly
    assert len(permutations("rotate:9", 3)) == 3 and permutations("as_given", 3) == [(0, 1, 2)]
    for bad in ("rotate:1", "rotate:256", "rotate:x", "reversed", 2, "rotate:²"):
        with pytest.raises(QuestionError, match="x_order"):
            Request.of([STATE], choice(OPTIONS), order=bad)


@pytest.mark.parametrize("which", ["encoder", "decide"])
def test_both_is_the_mean_of_the_two_orders_computed_apart(which, request):
    engine = request.getfixturevalue(which)
    keys = list(OPTIONS)
    given, reverse = answer(engine, keys), answer(engine, keys[::-1])
    both = answer(engine, keys, "both")
    for key in keys:
        mean = (given["t"]["probabilities"][key] + reverse["t"]["probabilities"][key]) / 2
        assert both["t"]["probabilities"][key] == pytest.approx(mean, abs=1e-6)
    assert given["t"]["probabilities"] != reverse["t"]["probabilities"]  # the order matters, or this proves nothing
    assert both["t"]["choice"] == max(keys, key=lambda k: both["t"]["probabilities"][k])
    assert both["t"]["x_order"] == {"mode": "both", "orders": 2}
    assert both["u"]["noul"] == given["u"]["noul"] and "x_order" not in both["u"]  # a noul has no order


@pytest.mark.parametrize("which", ["encoder", "decide"])
def test_every_rotation_makes_the_answer_independent_of_where_the_list_starts(which, request):
    engine = request.getfixturevalue(which)
    keys = list(OPTIONS)
    answers = [answer(engine, keys[s:] + keys[:s], f"rotate:{len(keys)}")["t"]["probabilities"] for s in range(4)]
    for other in answers[1:]:
        assert other == pytest.approx(answers[0], abs=1e-6)
    plain = [answer(engine, keys[s:] + keys[:s])["t"]["probabilities"] for s in range(4)]
    assert max(abs(p["billing"] - plain[0]["billing"]) for p in plain) > 1e-4  # as given, they differ


def test_the_parts_run_in_one_batch_and_count_as_rows(encoder):
    calls = []
    real = encoder.model.answer

    def counted(jobs):
        calls.append(len(jobs))
        return real(jobs)

    encoder.model.answer = counted
    try:
        job = encoder.prepare(Request.of([STATE, "hello"], choice(OPTIONS), order="rotate:4"))
        assert job.n_rows == 2 * 2 + 3 * 2  # as given: both questions; three more orders of the choice
        (answers,) = encoder.execute([job])
    finally:
        del encoder.model.answer
    assert calls == [4] and len(answers) == 2
    assert answers[0].input_tokens > encoder.execute([encoder.prepare(Request.of([STATE], choice(OPTIONS)))])[0][0]\
        .input_tokens


def test_the_server_takes_the_option_and_a_default(model):
    need("fastapi")
    from laya.server.app import create_app
    from laya.server.state import ServerConfig

    body = {"state": STATE, "questions": choice(OPTIONS)}
    with warnings.catch_warnings(), \
            LiveServer(create_app(lambda: [EncoderEngine(model)], ServerConfig(order="both"))) as live:
        warnings.simplefilter("ignore", RuntimeWarning)
        default = httpx.post(live.url + "/v1/systemone", json=body, timeout=60).json()
        asked = httpx.post(live.url + "/v1/systemone", json=body | {"x_order": "rotate:4"}, timeout=60).json()
        plain = httpx.post(live.url + "/v1/systemone", json=body | {"x_order": "as_given"}, timeout=60).json()
        bad = httpx.post(live.url + "/v1/systemone", json=body | {"x_order": "sideways"}, timeout=60)
    assert default["answers"]["t"]["x_order"] == {"mode": "both", "orders": 2}
    assert asked["answers"]["t"]["x_order"] == {"mode": "rotate:4", "orders": 4}
    assert "x_order" not in plain["answers"]["t"]
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "x_order"]


def test_an_averaged_answer_has_its_confidence_recomputed_from_the_averaged_probabilities():
    """Not the first order's figure carried over: the confidence of the probabilities the answer shows."""
    question = parse_question("t", {"type": "choice", "instructions": "Which team?", "criteria": ["a", "b", "c"]})
    first = {"a": 0.7, "b": 0.2, "c": 0.1}
    second = {"a": 0.3, "b": 0.6, "c": 0.1}
    readings = [Answer("choice", max(p, key=p.get), p, choice_confidence(list(p.values())),
                       answer_confidence=max(p.values())) for p in (first, second)]
    out = averaged(question, readings, "both")
    assert out.value == "a" and out.probabilities == pytest.approx({"a": 0.5, "b": 0.4, "c": 0.1})
    assert out.confidence == pytest.approx(choice_confidence([0.5, 0.4, 0.1])) == pytest.approx(0.25)
    assert out.answer_confidence == pytest.approx(0.5)
