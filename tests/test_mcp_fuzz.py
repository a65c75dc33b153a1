"""The MCP tools hold like the HTTP routes: generated arguments of every shape (tests/generators.py) to
every tool of an in-process server over the tiny model, through the SDK's own client. Each call is
answered or refused as a tool error that names the problem (the laya error type, or the SDK's argument
validation); none ends in an internal exception or a traceback."""

from __future__ import annotations

import re

import pytest
from conftest import need
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

need("mcp", "the MCP SDK is not installed (the [mcp] extra)")

import anyio.from_thread  # noqa: E402
from generators import question, questions, request, schema, texts, values  # noqa: E402
from mcp import Client  # noqa: E402

from laya.apps.mcp import Loader, LocalBackend, build_server  # noqa: E402
from laya.encoder.engine import EncoderEngine  # noqa: E402

INTERNAL = re.compile(r"Traceback|\b(TypeError|KeyError|AttributeError|IndexError|RecursionError|"
                      r"UnicodeEncodeError|ZeroDivisionError|AssertionError|RuntimeError)\b")
states = texts | values
numbers = st.none() | st.floats(allow_nan=False) | st.integers(-50, 50) | values


@pytest.fixture(scope="module")
def call(model):
    loader = Loader(lambda: EncoderEngine(model), "the test model")
    loader.start()
    with anyio.from_thread.start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(Client(build_server(LocalBackend(loader)))) as client:
        yield lambda name, args: portal.call(client.call_tool, name, args)


def held(result) -> None:
    """Answered, or a tool error naming the problem: the SDK reports a crash inside a tool as the bare
    'Error executing tool NAME', with nothing of what happened after it."""
    text = " ".join(getattr(c, "text", "") for c in result.content).strip()
    if result.is_error:
        assert not INTERNAL.search(text), text[:2000]
        assert not re.fullmatch(r"Error executing tool \w+", text), f"a crash inside the tool: {text!r}"


TOOL_ARGS = {
    "choice": st.fixed_dictionaries({}, optional={"state": states, "question": texts | values,
                                                  "options": st.lists(st.text(max_size=8), max_size=5) | values,
                                                  "instructions": texts | values, "min_confidence": numbers}),
    "score": st.fixed_dictionaries({}, optional={"state": states, "question": texts | values,
                                                 "levels": st.lists(st.text(max_size=8), max_size=12) | values,
                                                 "minimum": numbers, "maximum": numbers,
                                                 "instructions": texts | values, "min_confidence": numbers}),
    "noul": st.fixed_dictionaries({}, optional={"state": states, "question": texts | values,
                                                "instructions": texts | values, "min_confidence": numbers}),
    "predict": st.fixed_dictionaries({}, optional={"request": request | values}),
    "plan": st.fixed_dictionaries({}, optional={"request": request | values}),
    "decide": st.fixed_dictionaries({}, optional={"state": states, "schema": schema, "min_confidence": numbers}),
}


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(TOOL_ARGS)), data=st.data())
def test_no_tool_call_ends_in_an_internal_error(call, name, data):
    held(call(name, data.draw(TOOL_ARGS[name])))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(state=st.text(min_size=1, max_size=60), asked=st.dictionaries(st.text(min_size=1, max_size=6), question,
                                                                     min_size=1, max_size=3), extra=questions)
def test_predict_answers_or_names_the_problem(call, state, asked, extra):
    held(call("predict", {"request": {"state": state, "questions": asked}}))
    held(call("predict", {"request": {"state": state, "questions": extra}}))
