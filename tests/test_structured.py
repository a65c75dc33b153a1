"""Schema decisions and long-state scans beyond the goldens: pydantic models, the certain fields, the
bounds a hostile schema meets, the gate's vocabulary, the tie rule of the scan, and `laya decide`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from laya.encoder.windows import Windows, aggregate
from laya.errors import QuestionError
from laya.response import Answer, SystemOneResponse
from laya.structured import SchemaError, apply_gate, check_min_confidence, plan_schema
from laya.structured.plan import MAX_REF_HOPS
from laya.structured.values import project

STATE = "I was charged twice for my subscription; please refund it today."


class Ticket(BaseModel):
    team: Literal["billing", "sales", "support"] = Field(description="Which team?")
    urgent: bool
    priority: int = Field(ge=1, le=3)
    source: Literal["web"] = "web"


def test_a_pydantic_model_plans_as_its_schema():
    assert plan_schema(Ticket) == plan_schema(Ticket.model_json_schema())
    kinds = [(f.name, f.kind) for f in plan_schema(Ticket)]
    assert kinds == [("team", "choice"), ("urgent", "noul"), ("priority", "score"), ("source", "choice")]
    assert plan_schema(Ticket)[0].question == {"type": "choice", "instructions": "Which team?",
                                               "criteria": {"billing": None, "sales": None, "support": None}}


def test_decide_gives_typed_values_and_a_field_of_one_value_is_certain(model):
    values = model.decide(STATE, Ticket)
    assert values["team"] in ("billing", "sales", "support") and isinstance(values["urgent"], bool)
    assert values["priority"] in (1, 2, 3) and values["source"] == "web"
    assert Ticket(**values)
    result = model.decide(STATE, Ticket, return_details=True)
    assert result.values == values
    assert result.probabilities["source"] == {"web": 1.0} and result.answer_confidence["source"] == 1.0
    assert set(result.probabilities["priority"]) == {"0", "1", "2"}  # upstream's 0-based levels
    # the values are the projection of predict's answers
    answers = model.predict(STATE, {f.name: f.question for f in plan_schema(Ticket) if not f.certain})["answers"]
    assert result.answers["team"] == answers["team"]
    only_certain = model.decide(STATE, {"properties": {"a": {"const": 1}, "b": {"enum": [None]}}}, return_details=True)
    assert only_certain.values == {"a": 1, "b": None} and only_certain.usage["input_tokens"] == 0


def test_decide_batch_and_raw_questions(model):
    states = [STATE, {"subject": "login", "body": "the app crashes"}, [{"role": "user", "content": "hi"}]]
    batch = model.decide_batch(states, Ticket)
    assert batch == [model.decide(s, Ticket) for s in states]
    raw = model.decide(STATE, questions={"u": {"type": "noul", "instructions": "Urgent?"}})
    assert raw["u"]["type"] == "noul"
    with pytest.raises(QuestionError, match="pass exactly one of schema= or questions="):
        model.decide(STATE)
    with pytest.raises(QuestionError, match="states must be a sequence of states, not str"):
        model.decide_batch("one state", Ticket)
    with pytest.raises(SchemaError, match="properties.name: a free string"):
        model.decide(STATE, {"properties": {"name": {"type": "string"}}})


def test_a_long_chain_of_refs_is_refused_quickly():
    n = 20000
    defs = {f"D{i}": {"$ref": f"#/$defs/D{i + 1}"} for i in range(n)}
    defs[f"D{n}"] = {"type": "boolean"}
    with pytest.raises(SchemaError, match=f"more than {MAX_REF_HOPS} \\$ref hops"):
        plan_schema({"$defs": defs, "properties": {"x": {"$ref": "#/$defs/D0"}}})
    short = {f"D{i}": {"$ref": f"#/$defs/D{i + 1}"} for i in range(10)} | {"D10": {"type": "boolean"}}
    assert plan_schema({"$defs": short, "properties": {"x": {"$ref": "#/$defs/D0"}}})[0].kind == "noul"


@pytest.mark.parametrize(("value", "message"), [
    (1.5, "min_confidence must be a float in \\[0.0, 1.0\\], got 1.5"), (True, "got True"),
    (float("nan"), "got nan"), ({}, "non-empty dict"), ({"choice:3": 0.5}, "got 'choice:3'"),
    ({"default": "x"}, "got 'x'")])
def test_min_confidence_is_checked(value, message):
    with pytest.raises(QuestionError, match=message):
        check_min_confidence(value)


def test_the_gate_by_bucket():
    response = {"answers": {
        "c": {"type": "choice", "probabilities": {"a": 0.6, "b": 0.3, "c": 0.1}, "x_answer_confidence": 0.6},
        "n": {"type": "noul", "noul": 0.7, "x_answer_confidence": 0.7},
        "z": {"type": "noul", "noul": 0.7}}}
    apply_gate([response], {"choice:3-5": 0.65, "default": 0.5})
    c, n, z = response["answers"].values()
    assert c["x_low_confidence"] and c["x_abstention"] == "abstained" and c["x_abstention_threshold"] == 0.65
    assert "x_low_confidence" not in n and n["x_abstention"] == "passed" and n["x_abstention_threshold"] == 0.5
    assert z["x_abstention"] == "unevaluated"
    apply_gate([response], 0.0)  # a looser gate clears an earlier mark
    assert "x_low_confidence" not in c and c["x_abstention"] == "passed"


@pytest.mark.parametrize(("n", "bucket"), [(5, "choice:3-5"), (6, "choice:6-10"), (10, "choice:6-10"),
                                         (11, "choice:11+")])
def test_a_choice_is_gated_by_the_bucket_of_its_option_count(n, bucket):
    """Each bucket holds both its ends: exactly 10 options is `choice:6-10`, not `11+`."""
    top = 0.5
    probabilities = {f"o{i}": (top if i == 0 else (1 - top) / (n - 1)) for i in range(n)}
    response = {"answers": {"c": {"type": "choice", "probabilities": probabilities, "x_answer_confidence": top}}}
    apply_gate([response], {bucket: 0.6, "default": 0.1})
    c = response["answers"]["c"]
    assert c["x_abstention_threshold"] == 0.6 and c["x_abstention"] == "abstained", (n, c)


def _response(p_yes: float, top: float) -> SystemOneResponse:
    return SystemOneResponse("m", {"n": Answer("noul", p_yes, answer_confidence=max(p_yes, 1 - p_yes)),
                                   "c": Answer("choice", "a", {"a": top, "b": 1 - top}, 0.0, answer_confidence=top)},
                             input_tokens=10, x_usage={"state_tokens": 4, "rows": 2, "truncated_questions": ["c"]})


def test_a_scan_ties_at_four_places_go_to_the_first_window():
    read = Windows(size=4, step=2, n_tokens=8, starts=(0, 2, 4))
    out = aggregate(read, [_response(0.70001, 0.80004), _response(0.70004, 0.80001), _response(0.2, 0.5)])
    assert out.answers["n"].extras["x_window"] == {"index": 0, "token_start": 0, "token_end": 4, "count": 3}
    assert out.answers["c"].extras["x_window"]["index"] == 0
    out = aggregate(read, [_response(0.7, 0.8), _response(0.7002, 0.8002), _response(0.2, 0.5)])
    assert out.answers["n"].extras["x_window"]["index"] == 1 and out.answers["c"].extras["x_window"]["index"] == 1
    assert out.x_usage["windows"] == 3 and out.x_usage["rows"] == 6 and out.x_usage["state_tokens"] == 8
    assert out.x_usage["truncated_questions"] == ["c"] and out.input_tokens == 30


def test_laya_decide(checkpoint_dir, tmp_path, model):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(Ticket.model_json_schema()))
    run = subprocess.run([sys.executable, "-m", "laya.cli", "decide", str(checkpoint_dir), "-r", "torch",
                          "--schema", str(schema), "-s", STATE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == model.decide(STATE, Ticket)
    run = subprocess.run([sys.executable, "-m", "laya.cli", "decide", str(checkpoint_dir), "-r", "torch",
                          "--schema", '{"properties": {"tags": {"type": "array"}}}', "-s", STATE],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().endswith("arrays are not supported; ask one field per element")


@pytest.mark.parametrize(("schema", "needle"), [
    ({"properties": {"a": {"anyOf": 5}}}, "'anyOf' must be an array of schemas, got int"),
    ({"properties": {"a": {"oneOf": True}}}, "'oneOf' must be an array of schemas, got bool"),
    ({"properties": {"a": {"const": "\ud800"}}}, "properties.a.const: a string holds a lone surrogate"),
    ({"properties": {"a\udfff": {"type": "boolean"}}}, "lone surrogate"),
])
def test_a_malformed_schema_is_refused_naming_the_property(schema, needle):
    with pytest.raises(SchemaError, match=re.escape(needle)):
        plan_schema(schema)


def test_a_yes_no_of_one_half_is_yes_as_upstream_projects_it():
    fields = plan_schema({"properties": {"u": {"type": "boolean"}}})
    assert project({"u": {"type": "noul", "noul": 0.5}}, fields) == {"u": True}
    assert project({"u": {"type": "noul", "noul": 0.49994}}, fields) == {"u": False}  # 0.4999 at 4 places
