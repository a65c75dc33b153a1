"""Golden parity with upstream laya 0.4.15 (recorded by tests/golden/make_golden.py).

For every case: the same rows token for token, the same choice, probabilities within 1e-4, the same
`usage.input_tokens`, and a refusal wherever upstream refused.
"""

from __future__ import annotations

import json

import pytest
from conftest import GOLDEN, load_quiet

from laya.encoder.rows import build_rows
from laya.errors import QuestionError
from laya.questions import parse_questions

TOLERANCE = 1e-4
RECORD = json.loads((GOLDEN / "answers.json").read_text(encoding="utf-8"))
CASES = RECORD["cases"]


@pytest.fixture(scope="module")
def golden_models():
    return {name: load_quiet(GOLDEN / rel) for name, rel in RECORD["checkpoints"].items()}


def test_enough_varied_cases():
    assert len({c["id"] for c in CASES}) >= 40
    kinds = {q["type"] for c in CASES for q in c["questions"].values()}
    assert kinds == {"choice", "score", "noul"}
    assert any("error" in c for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['checkpoint']}:{c['id']}" for c in CASES])
def test_matches_upstream(case, golden_models):
    model = golden_models[case["checkpoint"]]
    if "error" in case:
        with pytest.raises(QuestionError, match="option markers fit"):
            model.predict(case["state"], case["questions"])
        return
    questions = parse_questions(case["questions"])
    rows = build_rows(model.tokenizer, case["state"], questions, model.max_len, model.head_max_len)
    assert [list(r.ids) for r in rows] == [r["ids"] for r in case["rows"]]
    assert [list(r.markers) for r in rows] == [r["markers"] for r in case["rows"]]

    ours = model.predict(case["state"], case["questions"])
    theirs = case["response"]
    assert ours["usage"]["input_tokens"] == theirs["usage"]["input_tokens"]
    assert list(ours["answers"]) == list(theirs["answers"])
    for qid, expected in theirs["answers"].items():
        got = ours["answers"][qid]
        assert got["type"] == expected["type"]
        if expected["type"] == "noul":
            assert got["noul"] == pytest.approx(expected["noul"], abs=TOLERANCE)
        else:
            assert got["probabilities"].keys() == {str(k) for k in expected["probabilities"]}
            for key, p in expected["probabilities"].items():
                assert got["probabilities"][str(key)] == pytest.approx(p, abs=TOLERANCE), key
        if expected["type"] == "choice":
            assert got["choice"] == str(expected["choice"])
        if expected["type"] == "score":
            assert got["score"] == pytest.approx(expected["score"], abs=10 * TOLERANCE)
        assert got["x_answer_confidence"] == pytest.approx(expected["answer_confidence"], abs=TOLERANCE)
        assert got["x_act_probability"] == pytest.approx(expected["action"]["act_probability"], abs=TOLERANCE)
