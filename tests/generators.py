"""Hypothesis strategies for hostile input, shared by every fuzz test (HTTP routes, MCP tools, CLI lines):
JSON of every shape at every level, text JSON cannot render (lone surrogates), numbers past any float,
and the shapes each surface expects with wrong types where its fields go."""

from __future__ import annotations

from hypothesis import strategies as st

# lone surrogates and huge integers are what JSON can carry and text cannot: they must be refused too
surrogates = st.sampled_from(["\ud800", "a\udfff", "\udbff\ud800x"])
scalars = (st.none() | st.booleans() | st.integers(-5, 300) | st.integers(min_value=10**70, max_value=10**80)
           | st.floats(allow_nan=False) | st.text(max_size=12) | surrogates)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=4), max_leaves=12)
texts = st.text(max_size=40) | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
criteria = (st.dictionaries(st.text(max_size=10), st.none() | texts | values, max_size=8)
            | st.lists(st.text(max_size=10) | values, max_size=12) | values)
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["choice", "score", "noul", "box", "", "CHOICE"]) | values},
    optional={"instructions": texts | values, "criteria": criteria, "labels": values},
)
questions = st.dictionaries(st.text(max_size=8), question | values, max_size=4) | values
request = st.fixed_dictionaries(
    {},
    optional={"state": texts | values | st.lists(texts, max_size=3), "model": st.none() | st.text(max_size=12) | values,
              "questions": questions, "tournament": values, "x_overflow": values},
)
batch = st.fixed_dictionaries({"states": st.lists(texts | values, max_size=3) | values},
                              optional={"questions": st.dictionaries(st.text(max_size=8), question, max_size=3)})

# JSON schemas: the keywords the planner reads, with right and wrong values at every level
SCHEMA_WORDS = ["type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minimum", "maximum", "description",
                "properties", "items", "$defs", "definitions"]
type_names = st.sampled_from(["object", "string", "integer", "number", "boolean", "array", "null"])
schema_values = st.recursive(
    scalars | type_names | st.sampled_from(["#/$defs/a", "#/definitions/a", "#/$defs/missing"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(SCHEMA_WORDS) | st.text(max_size=4),
                                                                inner, max_size=5), max_leaves=25)
# a property: the keyword groups the planner branches on, each with right and wrong values
prop = st.one_of(
    st.fixed_dictionaries({}, optional={"anyOf": schema_values, "oneOf": schema_values, "allOf": schema_values,
                                        "$ref": schema_values, "description": values}),
    st.fixed_dictionaries({"enum": schema_values}, optional={"description": values}),
    st.fixed_dictionaries({"const": schema_values}),
    st.fixed_dictionaries({"type": type_names | schema_values},
                          optional={"minimum": schema_values, "maximum": schema_values, "items": schema_values}),
    st.dictionaries(st.sampled_from(SCHEMA_WORDS), schema_values, max_size=5),
    schema_values,
)
schema = (st.fixed_dictionaries({"type": st.just("object"),
                                 "properties": st.dictionaries(st.text(min_size=1, max_size=6), prop, min_size=1,
                                                               max_size=4)},
                                optional={"$defs": st.dictionaries(st.sampled_from(["a", "b"]), prop, max_size=2)})
          | st.fixed_dictionaries({"type": schema_values, "properties": schema_values}) | schema_values)

message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "wizard"]) | values},
                                optional={"content": texts | values | st.lists(values, max_size=3),
                                          "tool_calls": values})
chat = st.fixed_dictionaries(
    {"messages": st.lists(message | values, max_size=4) | values},
    optional={"model": st.none() | st.text(max_size=8) | values,
              "response_format": st.fixed_dictionaries(
                  {"type": st.sampled_from(["json_schema", "json_object", "text"]) | values},
                  optional={"json_schema": st.fixed_dictionaries({"schema": schema}, optional={
                      "name": values, "strict": values}) | values}) | values,
              "stream": values, "n": values, "tools": values, "x_min_confidence": values})
# a chat completion that is valid but for its schema: what reaches the schema walk
chat_schema = st.builds(lambda s: {"messages": [{"role": "user", "content": "refund please"}],
                                   "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                             "schema": s}}},
                        schema)
