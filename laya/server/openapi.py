"""JSON schemas of the request bodies, for the OpenAPI document (validation is `laya.api`'s)."""

TEXT = {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array", "items": {}}],
        "description": "structured text: a string, a JSON object or a JSON array"}
OPTIONAL_TEXT = {"anyOf": [*TEXT["anyOf"], {"type": "null"}]}

QUESTION = {
    "oneOf": [
        {"type": "object", "title": "noul", "required": ["type"], "properties": {
            "type": {"const": "noul"}, "instructions": OPTIONAL_TEXT,
            "criteria": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                "true": OPTIONAL_TEXT, "false": OPTIONAL_TEXT}, "additionalProperties": False}]}}},
        {"type": "object", "title": "choice", "required": ["type", "criteria"], "properties": {
            "type": {"const": "choice"}, "instructions": OPTIONAL_TEXT,
            "criteria": {"type": "object", "minProperties": 2, "maxProperties": 255,
                         "additionalProperties": OPTIONAL_TEXT}}},
        {"type": "object", "title": "score", "required": ["type", "criteria"], "properties": {
            "type": {"const": "score"}, "instructions": OPTIONAL_TEXT,
            "criteria": {"type": "array", "minItems": 2, "maxItems": 10, "items": TEXT}}},
    ],
    "discriminator": {"propertyName": "type"},
}

REQUEST_SCHEMA = {
    "type": "object", "title": "SystemOneRequest", "required": ["state", "questions"],
    "properties": {
        "model": {"anyOf": [{"type": "string"}, {"type": "null"}],
                  "description": "jev-latest, jev-preview or a served model"},
        "state": TEXT,
        "questions": {"type": "object", "minProperties": 1, "additionalProperties": QUESTION},
    },
}

BATCH_SCHEMA = {
    "type": "object", "title": "SystemOneBatchRequest", "required": ["states", "questions"],
    "properties": {
        "model": REQUEST_SCHEMA["properties"]["model"],
        "states": {"type": "array", "minItems": 1, "maxItems": 256, "items": TEXT},
        "questions": REQUEST_SCHEMA["properties"]["questions"],
    },
}
