"""Typed decisions: a JSON schema (or a pydantic model) planned into System One questions, and the
answers projected back into the schema's values, as upstream laya 0.4.15 does it (`laya.decide`).

    values = model.decide(state, schema)                  # {"department": "billing", "needs_human": True}
    result = model.decide(state, schema, return_details=True)   # values, probabilities, confidence

Only what a fixed option set can answer is planned: an enum (or const) is a choice, a boolean a
yes/no, an integer with integer bounds a score of at most ten levels. Anything else is refused
before any inference with a `SchemaError` naming the property's path.
"""

from laya.structured.gate import apply_gate, check_min_confidence
from laya.structured.plan import Field, SchemaError, plan_schema, questions_of
from laya.structured.values import DecisionResult, certain_answer, details, project, settle

__all__ = ["DecisionResult", "Field", "certain_answer", "SchemaError", "apply_gate", "check_min_confidence", "details",
           "plan_schema", "project", "questions_of", "settle"]
