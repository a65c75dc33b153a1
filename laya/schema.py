"""The JSON Schema of a System One request, built from the rules `laya.questions` and `laya.api`
validate with (their bounds, the server's limits), for the OpenAPI document: what the document says
a server accepts is what it accepts. A test holds the two to the same verdict on a table of bodies.

A few rules are beyond JSON Schema and are stated in descriptions only: noul criteria keys and label
keys are case-insensitive but may not repeat ("true" and "True"), the two labels must differ once
stripped, and the token budgets are counted as the rows are built.
"""

from __future__ import annotations

from typing import Any

from laya.api import MAX_TOKENS_ONE
from laya.limits import Limits
from laya.questions import MAX_LEVELS, MAX_OPTIONS, MIN_LEVELS, MIN_OPTIONS
from laya.request import AS_GIVEN, BUCKETS
from laya.tournament import MAX_GROUP, MIN_GROUP

TEXT: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array"}],
                        "description": "structured text: a string, a JSON object or a JSON array"}
OPTIONAL_TEXT: dict[str, Any] = {"anyOf": [*TEXT["anyOf"], {"type": "null"}]}
PROBABILITY = {"type": "number", "minimum": 0, "maximum": 1}
THRESHOLD: dict[str, Any] = {
    "anyOf": [PROBABILITY, {"type": "object", "minProperties": 1, "propertyNames": {"enum": sorted(BUCKETS)},
                            "additionalProperties": PROBABILITY}, {"type": "null"}],
    "description": "an answer whose top probability is below this (one number, or one per option-count bucket "
                   "such as choice:3-5, and default) is marked x_low_confidence; every answer gets x_abstention"}
ROTATE = "^rotate:0*([2-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-5])$"  # rotate:2 .. rotate:255 (MAX_ROTATIONS)
NOT_A_CHOICE = {"type": "null", "description": "x_shortlist is for choice questions"}
TRUE_OR_FALSE = {"pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"}
INSTRUCTIONS = {**OPTIONAL_TEXT, "description": "what to decide, in words"}


def question_schema() -> dict[str, Any]:
    noul = {"type": "object", "title": "noul", "required": ["type"], "properties": {
        "type": {"const": "noul"}, "instructions": INSTRUCTIONS,
        "criteria": {"anyOf": [{"type": "null"}, {
            "type": "object", "propertyNames": TRUE_OR_FALSE, "additionalProperties": OPTIONAL_TEXT,
            "description": "what 'true' and 'false' mean (keys case-insensitive, each at most once)"}]},
        "labels": {"anyOf": [{"type": "null"}, {
            "type": "object", "minProperties": 2, "maxProperties": 2, "propertyNames": TRUE_OR_FALSE,
            "additionalProperties": {"type": "string", "pattern": "\\S"},
            "description": "the names the answer uses for false and true (two different non-empty strings)"}]},
        "x_shortlist": NOT_A_CHOICE}}
    choice = {"type": "object", "title": "choice", "required": ["type", "criteria"], "properties": {
        "type": {"const": "choice"}, "instructions": INSTRUCTIONS,
        "criteria": {"oneOf": [
            {"type": "object", "minProperties": MIN_OPTIONS, "maxProperties": MAX_OPTIONS,
             "additionalProperties": OPTIONAL_TEXT, "description": "option name -> description (or null)"},
            {"type": "array", "minItems": MIN_OPTIONS, "maxItems": MAX_OPTIONS, "uniqueItems": True,
             "items": {"type": "string"}, "description": "option names"}]},
        "x_shortlist": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_OPTIONS,
                        "description": "answer on the K options nearest the state (a laya encoder's embeddings), "
                                       "the rest at probability 0"}}}
    score = {"type": "object", "title": "score", "required": ["type", "criteria"], "properties": {
        "type": {"const": "score"}, "instructions": INSTRUCTIONS,
        "criteria": {"type": "array", "minItems": MIN_LEVELS, "maxItems": MAX_LEVELS, "items": TEXT,
                     "description": "level descriptions, level 0 first"},
        "x_shortlist": NOT_A_CHOICE}}
    return {"oneOf": [noul, choice, score], "discriminator": {"propertyName": "type"}}


def request_schema(limits: Limits | None = None, *, batch: bool = False) -> dict[str, Any]:
    """`/v1/systemone` (or, with `batch`, `/v1/systemone/batch`) as this server accepts it."""
    limits = limits or Limits()
    states = ({"states": {"type": "array", "minItems": 1, "maxItems": limits.max_states, "items": TEXT}}
              if batch else {"state": TEXT})
    return {
        "type": "object", "title": "SystemOneBatchRequest" if batch else "SystemOneRequest",
        "required": [*states, "questions"],
        "properties": {
            "model": {"type": ["string", "null"],
                      "description": "jev-latest, jev-preview, a served model, or auto (each state to the English "
                                     "or the multilingual model by its script and language)"},
            **states,
            "questions": {"type": "object", "minProperties": 1, "maxProperties": limits.max_questions,
                          "propertyNames": {"minLength": 1}, "additionalProperties": question_schema()},
            "reuse_prefix": {"type": ["boolean", "null"],
                             "description": "decide engine: false prefills the request whole, leaving the kept "
                                            "state alone (default true)"},
            "tournament": {"anyOf": [{"type": "integer", "minimum": MIN_GROUP, "maximum": MAX_GROUP},
                                     {"type": "null"}],
                           "description": "encoder engine: answer every choice of more options by elimination "
                                          "in groups of this size"},
            "x_overflow": {"anyOf": [
                {"enum": ["truncate", "keep_start", "keep_end"]},
                {"type": "object", "required": ["scan"], "additionalProperties": False, "properties": {
                    "scan": {"type": "object", "additionalProperties": False, "properties": {
                        "window": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOKENS_ONE},
                        "stride": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOKENS_ONE},
                        "aggregate": {"const": "auto"}}}}},
                {"type": "null"}],
                "description": "encoder engine: a state longer than the row is truncated (the default: its start "
                               "kept, a conversation's end), keeps its start or its end, or is scanned in "
                               "overlapping windows (0 or none: the model's defaults), each answer from its "
                               "deciding window (x_window)"},
            "x_order": {"anyOf": [{"enum": [AS_GIVEN, "both"]}, {"type": "string", "pattern": ROTATE},
                                  {"type": "null"}],
                        "description": "each choice read in these option orders, its probabilities averaged: "
                                       "as_given (the server's default unless it sets one), both (as given and "
                                       "reversed) or rotate:K (K cyclic rotations)"},
            "x_min_confidence": THRESHOLD,
            "x_lang": {"type": ["string", "null"], "maxLength": 35,
                       "description": "with \"model\": \"auto\": the state's language code (decisive when it "
                                      "names a language; blank lets detection decide)"},
        },
    }


def chat_schema() -> dict[str, Any]:
    """`/v1/chat/completions` as this server accepts it: a conversation and a json_schema format."""
    content = {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}
    return {
        "type": "object", "title": "ChatCompletionRequest", "required": ["messages", "response_format"],
        "properties": {
            "model": {"type": ["string", "null"]},
            "messages": {"type": "array", "minItems": 1, "maxItems": 1024, "items": {
                "type": "object", "required": ["role"], "properties": {
                    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]}, "content": content}}},
            "response_format": {"type": "object", "required": ["type", "json_schema"], "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {"type": "object", "required": ["schema"], "properties": {
                    "name": {"type": "string"}, "strict": {"type": ["boolean", "null"]},
                    "schema": {"type": "object", "description": "an object whose properties are enums, "
                                                                "booleans or integers with integer bounds"}}}}},
            "n": {"const": 1}, "stream": {"enum": [False, None]},
            "x_min_confidence": {**THRESHOLD, "description": "fields whose top probability is below this come back "
                                                            "null"},
        },
    }
