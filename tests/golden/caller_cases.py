"""The golden cases of what upstream gives a caller besides `predict` (issue 27): schema decisions
(planning, values, details, `min_confidence`) and long states (`predict_long`'s windows and answers).

Plain data, imported by the golden maker (which runs upstream) and by nothing else; the tests read
the recorded `caller.json`, which holds each case's input beside upstream's output.
"""

from __future__ import annotations

from cases import CONVERSATION, LONG_TEXT, ROUTE, URGENT

ANGER = {"type": "score", "instructions": "How angry is the user?", "criteria": ["calm", "annoyed", "furious"]}

TICKET = {  # what pydantic v2 writes for a model with an Enum, Literals, an Optional and bounded ints
    "$defs": {"Team": {"description": "The team enum's docstring", "enum": ["billing", "sales", "support"],
                       "title": "Team", "type": "string"}},
    "properties": {
        "team": {"$ref": "#/$defs/Team", "description": "Which team should handle this ticket?"},
        "urgent": {"description": "Does it need action today?", "title": "Urgent", "type": "boolean"},
        "priority": {"maximum": 3, "minimum": 1, "title": "Priority", "type": "integer"},
        "channel": {"anyOf": [{"enum": ["email", "phone", None], "type": "string"}, {"type": "null"}],
                    "default": None, "title": "Channel"},
        "tier": {"enum": [0, 1, 2], "title": "Tier", "type": "integer"},
        "flagged": {"enum": [True, False], "title": "Flagged"},
        "stars": {"maximum": 5, "minimum": 1, "title": "Stars", "type": "number"},
    },
    "required": ["team", "urgent", "priority", "tier", "flagged", "stars"],
    "title": "Ticket", "type": "object",
}
V1_STYLE = {  # pydantic v1: `definitions`, a described ref wrapped in allOf, a nullable type list
    "definitions": {"Mood": {"description": "An enumeration.", "enum": ["calm", "angry"], "title": "Mood"}},
    "properties": {
        "mood": {"allOf": [{"$ref": "#/definitions/Mood"}], "description": "How does the user feel?"},
        "refund": {"type": ["boolean", "null"]},
        "score": {"type": "integer", "minimum": -2, "maximum": 2, "description": "Sentiment from -2 to 2"},
        "one": {"const": "only"},
        "truth": {"enum": [True]},
    },
    "type": "object",
}
REFUSED = {
    "not-object": ["a", "list"],
    "no-properties": {"type": "object"},
    "top-array": {"type": "array", "properties": {"a": {"type": "boolean"}}},
    "empty-properties": {"properties": {}},
    "too-many": {"properties": {f"p{i}": {"type": "boolean"} for i in range(33)}},
    "prop-not-object": {"properties": {"a": 3}},
    "free-string": {"properties": {"name": {"type": "string"}}},
    "array": {"properties": {"tags": {"type": "array", "items": {"type": "string"}}}},
    "nested": {"properties": {"inner": {"type": "object", "properties": {"x": {"type": "boolean"}}}}},
    "union": {"properties": {"x": {"anyOf": [{"type": "boolean"}, {"type": "integer"}]}}},
    "type-union": {"properties": {"x": {"type": ["boolean", "integer"]}}},
    "unbounded-int": {"properties": {"n": {"type": "integer"}}},
    "float-bounds": {"properties": {"n": {"type": "integer", "minimum": 0.5, "maximum": 3}}},
    "bool-bounds": {"properties": {"n": {"type": "integer", "minimum": True, "maximum": 3}}},
    "exclusive": {"properties": {"n": {"type": "integer", "exclusiveMinimum": 0, "maximum": 3}}},
    "reversed": {"properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}},
    "too-many-levels": {"properties": {"n": {"type": "integer", "minimum": 0, "maximum": 10}}},
    "enum-scalar": {"properties": {"e": {"enum": "abc"}}},
    "enum-empty": {"properties": {"e": {"enum": []}}},
    "enum-too-many": {"properties": {"e": {"enum": list(range(33))}}},
    "enum-duplicates": {"properties": {"e": {"enum": [1, "1"]}}},
    "ref-missing": {"properties": {"e": {"$ref": "#/$defs/Nope"}}},
    "ref-remote": {"properties": {"e": {"$ref": "https://example.com/schema.json"}}},
    "ref-cycle": {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                  "properties": {"e": {"$ref": "#/$defs/A"}}},
    "null-only": {"properties": {"e": {"type": "null"}}},
    "no-type": {"properties": {"e": {"description": "what?"}}},
}
STATES = ["I was charged twice for my subscription; please refund it today.",
          {"subject": "Login broken", "body": "The app crashes when I sign in. I am furious."},
          CONVERSATION]


def schema_cases() -> list[dict]:
    out = [{"id": "ticket", "schema": TICKET, "states": STATES},
           {"id": "ticket-gated", "schema": TICKET, "states": STATES, "min_confidence": 0.6},
           {"id": "ticket-gated-map", "schema": TICKET, "states": STATES[:2],
            "min_confidence": {"choice:3-5": 0.5, "noul:2": 0.9, "default": 0.3}},
           {"id": "v1-style", "schema": V1_STYLE, "states": STATES[:2]}]
    out += [{"id": f"refused-{name}", "schema": schema, "states": STATES[:1]} for name, schema in REFUSED.items()]
    return out


NON_ASCII = ("Der Kunde möchte sein Geld zurück, weil die Lieferung beschädigt ankam. 客户要求退款，因为包裹损坏了。 "
             "Клиент хочет вернуть деньги. 🙂🚀 ")


def long_cases() -> list[dict]:
    two = {"team": ROUTE, "urgent": URGENT}
    return [
        {"id": "text-default", "state": LONG_TEXT * 8, "questions": two},
        {"id": "text-three-types", "state": LONG_TEXT * 5 + "I am furious, cancel it now!", "questions":
            {"team": ROUTE, "anger": ANGER, "urgent": URGENT}},
        {"id": "text-window-stride", "state": LONG_TEXT * 6, "questions": two, "window": 60, "stride": 25},
        {"id": "text-window-only", "state": LONG_TEXT * 4, "questions": {"urgent": URGENT}, "window": 40},
        {"id": "text-window-clamped", "state": LONG_TEXT * 6, "questions": two, "window": 5000},
        {"id": "text-stride-equal", "state": LONG_TEXT * 4, "questions": two, "window": 50, "stride": 50},
        {"id": "text-stride-past", "state": LONG_TEXT * 4, "questions": two, "window": 50, "stride": 80},
        {"id": "text-fits", "state": LONG_TEXT, "questions": two},
        {"id": "text-fits-window", "state": LONG_TEXT, "questions": two, "window": 500},
        {"id": "text-explicit-small", "state": LONG_TEXT, "questions": two, "window": 20},
        {"id": "non-ascii", "state": NON_ASCII * 6, "questions": two, "window": 37, "stride": 19},
        {"id": "object", "state": {"ticket": LONG_TEXT * 4, "meta": {"id": 7, "tags": ["a", "b"]}},
         "questions": two},
        {"id": "conversation", "state": CONVERSATION * 3, "questions": {"team": ROUTE, "anger": ANGER}},
        {"id": "many-options", "state": LONG_TEXT * 5, "questions": {"q": {
            "type": "choice", "instructions": "Topic?",
            "criteria": {f"topic {i}": f"the description of topic number {i}" for i in range(12)}}}},
        {"id": "aggregate-other", "state": LONG_TEXT * 4, "questions": two, "aggregate": "mean"},
    ]


# --- calibration files ---------------------------------------------------------------------------

CAL_QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "payments and refunds", "sales": "plans and pricing", "support": "bugs"}},
    "urgent": {"type": "noul", "instructions": "Does it need action today?"},
    "anger": ANGER,
}
_TOPICS = [("billing", "I was charged twice for my order", True, 2),
           ("billing", "the refund never arrived", False, 1),
           ("sales", "how much is the team plan", False, 0),
           ("sales", "can I get a discount for ten seats", False, 0),
           ("support", "the app crashes when I log in", True, 2),
           ("support", "the export button does nothing", False, 1)]
_TAILS = ["", " please help", " today", " thanks", " this is the third time", " as soon as possible", " asap!!",
          " no rush"]


def calibration_records() -> list[dict]:
    """Labelled lines (laya's calibration format, which upstream's records are built from too)."""
    out = []
    for i in range(96):
        team, text, urgent, anger = _TOPICS[i % len(_TOPICS)]
        tail = _TAILS[(i * 5) % len(_TAILS)]
        if i % 7 == 3:  # some labels the state does not support, so the model is wrong some of the time
            team = _TOPICS[(i + 2) % len(_TOPICS)][0]
        out.append({"state": f"{text}{tail} (ticket {i})", "questions": CAL_QUESTIONS,
                    "labels": {"team": team, "urgent": urgent if i % 5 else not urgent, "anger": anger}})
    return out


HAND_FILE = {  # temperatures upstream forgives (clamped, a numeric string, a bool) and a binning map
    "version": 2, "temperature": ["1.5", 0.1, True],
    "temperature_by_options": {"choice:3-5": 2.5, "score:3-5": 9.0, "noul:2": 0.8, "nonsense:7": 3.0},
    "model_id_or_path": "somewhere/else", "subfolder": None, "config": {"encoder": "another"},
    "binning_map": {"choice:3-5": {"bins": 4, "values": [0.1, 0.3, 0.55, 0.8]},
                    "noul:2": {"bins": 3, "values": [0.2, 0.5, 0.9]}},
}
VERSION_1_FILE = {"temperature": [0.7, 1.9, 3.0], "temperature_by_options": None}
MALFORMED_FILES = {
    "not-object": [1, 2, 3],
    "version-float": {"version": 1.5, "temperature": [1, 1, 1]},
    "version-text": {"version": "two", "temperature": [1, 1, 1]},
    "temperature-short": {"temperature": [1, 1]},
    "temperature-object": {"temperature": {"a": 1, "b": 2, "c": 3}},
    "by-options-list": {"temperature": [1, 1, 1], "temperature_by_options": [1]},
    "binning-list": {"temperature": [1, 1, 1], "binning_map": [1]},
    "binning-entry": {"temperature": [1, 1, 1], "binning_map": {"noul:2": 3}},
    "binning-bins": {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 0, "values": []}}},
    "binning-length": {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5]}}},
    "binning-range": {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5, 1.5]}}},
    "binning-text": {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5, "x"]}}},
}
CAL_STATES = ["I was charged twice for my order please help", "the app crashes when I log in asap!!",
              {"subject": "pricing", "body": "how much is the team plan for ten seats"},
              "The customer was charged twice for the same order and wants a refund today. " * 12]
CAL_GATES = [None, 0.5, {"choice:3-5": 0.45, "noul:2": 0.6, "default": 0.4}]
