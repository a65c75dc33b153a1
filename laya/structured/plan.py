"""From a JSON schema to questions: one field per property, refused up front when a property is not a
fixed option set.

The rules and their refusals are upstream's (laya 0.4.15, `structured.plan_from_json_schema`), so a
schema planned there is planned the same here and one refused there is refused with the same words:
- `$ref` to the schema's own `$defs` / `definitions` is inlined (the definition's description
  dropped, the property's keys on top); a ref met twice on one path is a cycle;
- a one-branch `allOf` and an `Optional[...]` (`anyOf`/`oneOf` with one non-null branch) unwrap;
- `const` and `enum` are choices (labels `str(value)`, `"null"` for None), except two distinct
  booleans, which are a yes/no; `boolean` is a yes/no; `integer`/`number` with integer `minimum` and
  `maximum` (at most 10 levels) is a score; strings, arrays and objects are refused.
Only a property's `description` is used (as the instructions, verbatim); `title`, `required` and
defaults are not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from laya.errors import QuestionError
from laya.questions import SURROGATE_MSG, unencodable

MAX_PROPERTIES = 32
MAX_ENUM = 32
MAX_SCORE_LEVELS = 10
MAX_REF_HOPS = 64  # a chain of $refs longer than this is refused (a hostile schema could make it quadratic)
_DEFINITIONS = (("#/$defs/", "$defs"), ("#/definitions/", "definitions"))


class SchemaError(QuestionError):
    """A schema that cannot be asked as questions; the message names the property's path."""

    def __init__(self, message: str, qid: str | None = None, error_type: str = "invalid_schema"):
        super().__init__(message, qid=qid, error_type=error_type)

    def __reduce__(self):
        return (SchemaError, (str(self), self.qid, self.error_type))


@dataclass(frozen=True)
class Field:
    """One property as a question: its kind, the question asked, and how an answer maps back
    (a choice's (label, value) pairs, a score's lowest value)."""

    name: str
    kind: Literal["choice", "score", "noul"]
    question: dict[str, Any]
    options: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    minimum: int = 0

    @property
    def certain(self) -> bool:
        """A choice of one value (a `const`, a one-value enum): decided without reading the state
        (a System One choice has at least two options), as upstream's softmax over one logit is 1."""
        return self.kind == "choice" and len(self.options) == 1


def schema_of(schema: Any) -> dict[str, Any]:
    """The JSON schema of a pydantic model (v2 or v1) or of a dict, which is its own."""
    if hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if hasattr(schema, "schema") and not isinstance(schema, dict):
        return schema.schema()
    if isinstance(schema, dict):
        return schema
    raise SchemaError(f"expected a JSON schema dict or a pydantic model, got {type(schema).__name__}")


def plan_schema(schema: Any) -> list[Field]:
    """Every property of `schema`, planned in order; `SchemaError` for the first one that cannot be."""
    root = schema_of(schema)
    if not isinstance(root, dict):
        raise SchemaError(f"expected a JSON schema object, got {type(root).__name__}")
    if (where := unencodable(root)) is not None:
        raise SchemaError(f"{'.'.join(map(str, where)) or 'the schema'}: {SURROGATE_MSG}")
    if root.get("type") not in (None, "object") or "properties" not in root:
        raise SchemaError("the top level must be an object with 'properties'")
    properties = root["properties"]
    if not isinstance(properties, dict) or not properties:
        raise SchemaError("'properties' must be a non-empty object")
    if len(properties) > MAX_PROPERTIES:
        raise SchemaError(f"{len(properties)} properties exceeds MAX_PROPERTIES={MAX_PROPERTIES}")
    return [_plan(f"properties.{name}", str(name), prop, root, ()) for name, prop in properties.items()]


def questions_of(fields: list[Field]) -> dict[str, dict[str, Any]]:
    return {f.name: f.question for f in fields}


def _plan(path: str, name: str, prop: Any, root: dict[str, Any], seen: tuple[str, ...]) -> Field:
    if not isinstance(prop, dict):
        raise SchemaError(f"{path}: property must be an object, got {type(prop).__name__}", qid=name)
    while "$ref" in prop:
        if len(seen) >= MAX_REF_HOPS:
            raise SchemaError(f"{path}: more than {MAX_REF_HOPS} $ref hops; flatten the schema", qid=name)
        prop, seen = _resolve(path, name, prop, root, seen)
    description = prop.get("description")
    if not {"const", "enum", "type"} & prop.keys():
        wrapped = prop.get("allOf")
        if isinstance(wrapped, list) and len(wrapped) == 1 and isinstance(wrapped[0], dict):
            return _plan(path, name, {**wrapped[0], **{k: v for k, v in prop.items() if k != "allOf"}}, root, seen)
        union = prop.get("anyOf") or prop.get("oneOf")
        if union is not None:
            if not isinstance(union, list):
                key = "anyOf" if prop.get("anyOf") else "oneOf"
                raise SchemaError(f"{path}: '{key}' must be an array of schemas, got {type(union).__name__}", qid=name)
            branches = [b for b in union if isinstance(b, dict) and b.get("type") != "null"]
            if len(branches) != 1:
                raise SchemaError(f"{path}: only 'Optional[...]' unions (one non-null branch) are supported, "
                                  f"got {len(branches)}", qid=name)
            branch = dict(branches[0])
            branch.setdefault("description", description)
            return _plan(path, name, branch, root, seen)
    if "const" in prop:
        return _enum(path, name, [prop["const"]], description)
    if "enum" in prop:
        return _enum(path, name, prop["enum"], description)
    kind = prop.get("type")
    if isinstance(kind, list):
        real = [t for t in kind if t != "null"]
        if len(real) > 1:
            raise SchemaError(f"{path}: 'type' has multiple non-null types; unions are not supported", qid=name)
        kind = real[0] if real else None
    if kind == "boolean":
        return _noul(name, description)
    if kind == "string":
        raise SchemaError(f"{path}: a free string cannot be a fixed option set; use 'enum' or a boolean", qid=name)
    if kind in ("integer", "number"):
        return _score(path, name, prop, description)
    if kind == "array":
        raise SchemaError(f"{path}: arrays are not supported; ask one field per element", qid=name)
    if kind == "object":
        raise SchemaError(f"{path}: nested objects are not supported; flatten the schema", qid=name)
    raise SchemaError(f"{path}: unsupported schema {_clipped_repr(prop)}", qid=name)


def _clipped_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _resolve(path: str, name: str, prop: dict[str, Any], root: dict[str, Any], seen: tuple[str, ...]
             ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A local `$ref` replaced by its definition (minus the definition's own description, which
    describes the type rather than asks about this field), the property's keys on top."""
    ref = prop["$ref"]
    if ref in seen:
        raise SchemaError(f"{path}: $ref {ref!r} is recursive; flatten the schema", qid=name)
    target = None
    for prefix, key in _DEFINITIONS:
        table = root.get(key)
        if isinstance(ref, str) and ref.startswith(prefix) and isinstance(table, dict):
            target = table.get(ref[len(prefix):])
    if not isinstance(target, dict):
        raise SchemaError(f"{path}: $ref {_clipped_repr(ref)} does not resolve to an entry of this schema's "
                          "'$defs' or 'definitions'", qid=name)
    merged = {k: v for k, v in target.items() if k != "description"}
    merged.update((k, v) for k, v in prop.items() if k != "$ref")
    return merged, (*seen, ref)


def _enum(path: str, name: str, values: Any, description: str | None) -> Field:
    if not isinstance(values, list | tuple):
        raise SchemaError(f"{path}: 'enum' must be an array of values, got {type(values).__name__}", qid=name)
    if len(values) > MAX_ENUM:
        raise SchemaError(f"{path}: {len(values)} options exceeds MAX_OPTIONS={MAX_ENUM}", qid=name)
    if not values:
        raise SchemaError(f"{path}: 'enum' must not be empty", qid=name)
    if all(isinstance(v, bool) for v in values) and len(set(values)) == 2:
        return _noul(name, description)
    options = tuple(("null" if v is None else str(v), v) for v in values)
    if len({label for label, _ in options}) != len(options):
        raise SchemaError(f"{path}: enum values produce duplicate choice labels", qid=name)
    question = {"type": "choice", "instructions": description or f"What is `{name}`?",
                "criteria": {label: None for label, _ in options}}
    return Field(name, "choice", question, options)


def _noul(name: str, description: str | None) -> Field:
    return Field(name, "noul", {"type": "noul", "instructions": description or f"Is `{name}` true?"})


def _score(path: str, name: str, prop: dict[str, Any], description: str | None) -> Field:
    lo, hi = prop.get("minimum"), prop.get("maximum")
    if not isinstance(lo, int) or isinstance(lo, bool) or not isinstance(hi, int) or isinstance(hi, bool):
        raise SchemaError(f"{path}: a numeric field needs integer 'minimum' and 'maximum' to become a score", qid=name)
    if hi < lo:
        raise SchemaError(f"{path}: 'maximum' {hi} is below 'minimum' {lo}", qid=name)
    levels = hi - lo + 1
    if levels > MAX_SCORE_LEVELS:
        raise SchemaError(f"{path}: {levels} levels exceeds MAX_SCORE_LEVELS={MAX_SCORE_LEVELS}; narrow the range "
                          "or use an enum", qid=name)
    question = {"type": "score", "instructions": description or f"Score `{name}` from {lo} to {hi}",
                "criteria": [str(v) for v in range(lo, hi + 1)]}
    return Field(name, "score", question, minimum=lo)
