"""Every request option on every surface: docs/request-options.md holds one table (a row per option, a
column per surface) and this file walks it. Each spelling is checked where the table says it is taken
(the HTTP body's schema and validation, `Model.predict`'s keywords, `laya predict`'s parser, a JSONL
line, the MCP tools' arguments) and that it changes what is asked there, never read and dropped; an
`n/a` says why, and there the option is not half-taken either. The other way round, every option a
surface takes is in the table, so an option added to one surface and forgotten on another fails here.
An option given to an engine it cannot apply to is refused naming it, and a plan counts what each
option costs as the request would be prepared."""

from __future__ import annotations

import inspect
import json
import re
import warnings
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import need
from fake_engine import ScriptedEngine
from live_server import LiveServer

from laya.api import STRICT_HEADER, strict_of
from laya.apps.jsonl import Line, local_answer
from laya.cli import build_parser, common, main
from laya.decide.model import decisions
from laya.encoder.engine import EncoderEngine
from laya.encoder.model import Model
from laya.errors import QuestionError
from laya.orders import OrderedJob
from laya.request import Request, parse_request
from laya.routing.router import Router
from laya.schema import question_schema, request_schema

DOC = Path(__file__).parents[1] / "docs" / "request-options.md"
SURFACES = ("HTTP", "Python", "CLI", "JSONL", "MCP")
# what a caller might give for each option (a new row needs one here)
VALUES: dict[str, Any] = {"x_order": "both", "x_shortlist": 2, "tournament": 2, "x_overflow": "keep_end",
                          "reuse_prefix": False, "min_confidence": 0.5, "strict answers": True, "deadline": 5}
STATE = ("Hello, I have a question about my account and the plan I am on. " + "Some more words about it. " * 70
         + "In the end: I was charged twice for one order, refund me now!")
QUESTIONS = {"team": {"type": "choice", "instructions": "Which team?",
                      "criteria": {"billing": "refunds", "sales": "new plans", "tech": "bugs", "legal": None}},
             "urgent": {"type": "noul", "instructions": "Urgent?"}}
QUESTION_FIELD = re.compile(r"^(request\.)?questions\.<id>\.(\w+)$")
# what a surface is given that is not an option of how a request is read
NOT_OPTIONS = {"model", "state", "states", "questions", "x_lang", "question", "options", "levels", "minimum",
               "maximum", "instructions", "schema", "request"}
CLI_NOT_OPTIONS = {"-h", "--help", "--readout", "--decide-probe", "--state", "-s", "--state-json", "--questions", "-q",
                   "--input", "-i", "--output", "-o", "--url", "--api-key-file", "--concurrency", "--no-progress",
                   "--pretty", "--window", "--stride"}  # a scan's sizes belong to --overflow scan


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def read_table() -> dict[str, dict[str, str]]:
    """The table's rows by option, each row's cells by column."""
    lines = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    header = _cells(lines[0])
    assert set(SURFACES) <= set(header) and re.fullmatch(r"[|\-\s]+", lines[1]), header
    return {cells[0]: dict(zip(header, cells)) for cells in map(_cells, lines[2:])}


TABLE = read_table()


def spelling(cell: str) -> str | None:
    """A cell's spelling (its first code span), or None where it says n/a, and why."""
    if cell.startswith("n/a"):
        assert re.fullmatch(r"n/a \(.{10,}\)", cell), f"an n/a says why: {cell!r}"
        return None
    found = re.match(r"`([^`]+)`", cell)
    assert found, f"a cell starts with its spelling in backticks, or n/a (why): {cell!r}"
    return found.group(1)


def tools_named(cell: str) -> list[str]:
    """The MCP tools a cell names in its first parentheses, e.g. (`predict`, `plan`)."""
    found = re.search(r"\(([^)]*)\)", cell)
    return re.findall(r"`(\w+)`", found.group(1)) if found else []


def names_of(option: str) -> set[str]:
    """Every name the option goes by on some surface, as a keyword, a flag or an argument would spell it."""
    out = {option.replace(" ", "_")}
    for surface in SURFACES:
        given = spelling(TABLE[option][surface])
        if given is None or QUESTION_FIELD.match(given):
            continue
        name = given.split(":")[0].lower().removeprefix("x-laya-").removeprefix("request.").lstrip("-").rstrip("=")
        name = name.replace("-", "_")
        out |= {name, name.removeprefix("x_")}
    return out


def pairs(*surfaces: str, given: bool = True) -> list[tuple[str, str]]:
    return [(option, surface) for option in TABLE for surface in surfaces
            if (spelling(TABLE[option][surface]) is not None) is given]


def test_the_table_has_a_row_per_option_and_a_cell_per_surface():
    assert set(TABLE) == set(VALUES), "a new option needs a value to try here (VALUES)"
    for option, row in TABLE.items():
        for surface in SURFACES:
            spelling(row[surface])
        assert row["applies to"] and row["a plan counts"], option


# --- the way round: whatever a surface takes is in the table ------------------------------------------


def given_on(surface: str) -> set[str]:
    return {s for option in TABLE if (s := spelling(TABLE[option][surface])) is not None}


def predict_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["predict"]


def model_flags() -> set[str]:
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    common.add_model_args(parser)
    return set(parser._option_string_actions)


def mcp_tools(backend: Any = None) -> dict[str, dict[str, Any]]:
    need("mcp", "the MCP SDK is not installed (the [mcp] extra)")
    from laya.apps.mcp import build_server

    server = build_server(backend or Stub())
    return {tool.name: tool.input_schema for tool in anyio.run(server.list_tools)}


def test_every_option_a_surface_takes_is_in_the_table():
    http, python = given_on("HTTP"), given_on("Python")
    body = set(request_schema()["properties"]) | set(request_schema(batch=True)["properties"])
    assert body - NOT_OPTIONS <= http, "a body field missing from the table"
    choice = next(q for q in question_schema()["oneOf"] if q["title"] == "choice")
    assert {f"questions.<id>.{k}" for k in choice["properties"] if k.startswith("x_")} <= http
    for method in (Model.predict, Model.predict_batch, Router.predict, Router.predict_batch):
        taken = set(inspect.signature(method).parameters) - {"self", "state", "states", "questions", "lang"}
        assert {f"{name}=" for name in taken} <= python, f"a keyword of {method.__qualname__} missing"
    flags = set(predict_parser()._option_string_actions) - CLI_NOT_OPTIONS - model_flags()
    assert flags <= given_on("CLI"), "a `laya predict` flag missing from the table"
    arguments = {name for schema in mcp_tools().values() for name in schema["properties"]} - NOT_OPTIONS
    assert arguments <= given_on("MCP"), "an MCP tool argument missing from the table"


# --- each spelling, taken where the table says -----------------------------------------------------------


def body_with(option: str, name: str) -> dict[str, Any]:
    """The request with the option given as the body (or a question) spells it."""
    value = VALUES[option]
    if (field := QUESTION_FIELD.match(name)) is not None:
        return {"state": STATE, "questions": {**QUESTIONS, "team": {**QUESTIONS["team"], field.group(2): value}}}
    return {"state": STATE, "questions": QUESTIONS, name.removeprefix("request."): value}


def check_http(option: str, given: str) -> None:
    if ":" in given:  # a header
        name, value = (part.strip() for part in given.split(":", 1))
        from laya.server.state import TIMEOUT_HEADER, ServerConfig, request_timeout

        assert name.lower() in (STRICT_HEADER, TIMEOUT_HEADER), f"{name} is no header the server reads"
        if name.lower() == STRICT_HEADER:
            assert strict_of(value, False) is True
        else:
            assert request_timeout(value, ServerConfig(request_timeout_s=60)) == (float(value), None)
        return
    plain = parse_request({"state": STATE, "questions": QUESTIONS})
    asked = parse_request(body_with(option, given))
    assert asked != plain, f"{given} is read and dropped by the validation"
    if (field := QUESTION_FIELD.match(given)) is not None:
        choice = next(q for q in question_schema()["oneOf"] if q["title"] == "choice")
        assert field.group(2) in choice["properties"], f"{given} is not in the OpenAPI document"
    else:
        for batch in (False, True):
            assert given in request_schema(batch=batch)["properties"], f"{given} is not in the OpenAPI document"


@pytest.fixture(scope="module")
def plain_answer(model):
    return model.predict(STATE, QUESTIONS)


def check_python(option: str, given: str, model: Model, plain: dict[str, Any]) -> None:
    if (field := QUESTION_FIELD.match(given)) is not None:
        questions = body_with(option, given)["questions"]
        answer = model.predict(STATE, questions)["answers"]["team"]
        assert answer.get(field.group(2), {}).get("k") == VALUES[option], f"Model.predict drops {given}"
        return
    keyword = given.removesuffix("=")
    for method in (Model.predict, Model.predict_batch, Router.predict, Router.predict_batch):
        assert keyword in inspect.signature(method).parameters, f"{method.__qualname__} takes no {keyword}="
    assert model.predict(STATE, QUESTIONS, **{keyword: VALUES[option]}) != plain, f"{keyword}= changes nothing"


def cli_call(monkeypatch, *extra: str, questions: dict | None = None) -> tuple[dict, dict]:
    """What `laya predict -m M -s STATE -q Q ...` hands the model: its questions and keywords."""
    calls = []

    class Recorder:
        def predict(self, state: Any, questions: dict, **kwargs: Any) -> dict:
            calls.append((questions, kwargs))
            return {}

    monkeypatch.setattr(common, "load_model", lambda args: Recorder())
    assert main(["predict", "-m", "m", "-s", "hi", "-q", json.dumps(questions or QUESTIONS), *extra]) == 0
    return calls[0]


def check_cli(option: str, given: str, monkeypatch) -> None:
    if QUESTION_FIELD.match(given):
        questions = body_with(option, given)["questions"]
        assert cli_call(monkeypatch, questions=questions)[0] == questions
        return
    action = predict_parser()._option_string_actions.get(given)
    assert action is not None, f"laya predict has no {given}"
    value = VALUES[option]
    args = (given,) if action.nargs == 0 else (given, str(value))
    assert cli_call(monkeypatch, *args)[1] != cli_call(monkeypatch)[1], f"{given} is parsed and dropped"


def jsonl_call(engine: Any, body: dict[str, Any]) -> tuple[Request, dict[str, Any]]:
    """The request a JSONL line becomes, and the line's outcome."""
    seen: list[Request] = []

    class Recording:
        info = engine.info

        def prepare(self, request: Request, **kwargs: Any) -> Any:
            seen.append(request)
            return engine.prepare(request, **kwargs)

        def execute(self, jobs: list[Any]) -> Any:
            return engine.execute(jobs)

    (outcome,) = local_answer(Recording())([Line(1, 1, body)])
    return seen[0], outcome


def check_jsonl(option: str, given: str, engine: EncoderEngine) -> None:
    plain, _ = jsonl_call(engine, {"state": STATE, "questions": QUESTIONS})
    asked, outcome = jsonl_call(engine, body_with(option, given))
    assert asked != plain, f"a line's {given} is read and dropped"
    if given == "x_min_confidence":  # applied where the answer is written, not by the engine
        assert all("x_abstention" in a for a in outcome["response"]["answers"].values())


class Stub:
    """An MCP backend that keeps every body it is sent and answers each question as a yes/no."""

    name = "stub"

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def respond(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        self.bodies.append(body)
        return {"model": "stub", "usage": {"input_tokens": 1, "output_tokens": 0},
                "answers": {qid: {"type": "noul", "noul": 0.7, "x_answer_confidence": 0.7}
                            for qid in body["questions"]}}

    async def plan(self, body: dict[str, Any], ctx: Any) -> dict[str, Any]:
        self.bodies.append(body)
        return {"object": "systemone.plan"}

    async def models(self) -> list[dict[str, Any]]:
        return []


TOOL_CALLS = {"choice": {"state": "s", "question": "Which?", "options": ["a", "b"]},
              "score": {"state": "s", "question": "How much?", "levels": ["low", "high"]},
              "noul": {"state": "s", "question": "Yes?"},
              "decide": {"state": "s", "schema": {"type": "object", "properties": {
                  "refund": {"type": "boolean", "description": "Refund?"}}}}}


def mcp_call(stub: Stub, tool: str, arguments: dict[str, Any]) -> Any:
    from laya.apps.mcp import build_server

    result = anyio.run(build_server(stub).call_tool, tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


def check_mcp_request(option: str, given: str, tools: list[str]) -> None:
    """`request.NAME`: a field of the request body the tools take whole, named where the agent reads
    what `predict` takes, and sent on as given."""
    schemas, stub = mcp_tools(), Stub()
    field = QUESTION_FIELD.match(given)
    name = field.group(2) if field else given.removeprefix("request.")
    assert name in schemas["predict"]["properties"]["request"]["description"], f"predict does not say {name}"
    for tool in tools:
        assert "request" in schemas[tool]["properties"], f"the MCP tool {tool} takes no request"
        mcp_call(stub, tool, {"request": body_with(option, given)})
        assert parse_request(stub.bodies[-1]) == parse_request(body_with(option, given))


def check_mcp(option: str, given: str, cell: str) -> None:
    tools = tools_named(cell)
    assert tools, f"the MCP cell names the tools that take {given}: {cell!r}"
    if given.startswith("request."):
        check_mcp_request(option, given, tools)
        return
    schemas, stub = mcp_tools(), Stub()
    for tool in tools:
        assert given in schemas[tool]["properties"], f"the MCP tool {tool} takes no {given}"
        plain = mcp_call(stub, tool, TOOL_CALLS[tool])
        assert mcp_call(stub, tool, {**TOOL_CALLS[tool], given: VALUES[option]}) != plain, f"{tool} drops {given}"
    for other in re.findall(r"`(request\.[^`]+)`", cell):  # the same option in a whole request
        check_mcp_request(option, other, ["predict"])


@pytest.mark.parametrize(("option", "surface"), pairs(*SURFACES))
def test_each_spelling_is_taken_where_the_table_says(option, surface, request, monkeypatch):
    cell = TABLE[option][surface]
    given = spelling(cell)
    assert given is not None
    if surface == "HTTP":
        check_http(option, given)
    elif surface == "Python":
        check_python(option, given, request.getfixturevalue("model"), request.getfixturevalue("plain_answer"))
    elif surface == "CLI":
        check_cli(option, given, monkeypatch)
    elif surface == "JSONL":
        check_jsonl(option, given, request.getfixturevalue("encoder"))
    else:
        check_mcp(option, given, cell)


@pytest.mark.parametrize(("option", "surface"), pairs("Python", "CLI", "MCP", given=False))
def test_where_the_table_says_n_a_the_option_is_not_half_taken(option, surface, model):
    """No keyword, flag or argument by any of the option's names: the surface refuses it as unknown."""
    names = names_of(option)
    if surface == "Python":
        for name in names:
            assert name not in inspect.signature(Model.predict).parameters
            with pytest.raises(TypeError, match=name):
                model.predict(STATE, QUESTIONS, **{name: VALUES[option]})
    elif surface == "CLI":
        taken = set(predict_parser()._option_string_actions)
        assert not {"--" + name.replace("_", "-") for name in names} & taken
    else:
        assert not names & {arg for schema in mcp_tools().values() for arg in schema["properties"]}


# --- where an option cannot apply, and what a plan counts ------------------------------------------------


BODY_OPTIONS = [option for option in TABLE if ":" not in (spelling(TABLE[option]["HTTP"]) or ":")]


def refused_by(option: str) -> str | None:
    """The engine the table says refuses the option ("a chat model refuses", "a laya encoder refuses")."""
    found = re.search(r"a (chat model|laya encoder) refuses", TABLE[option]["applies to"])
    return None if found is None else {"chat model": "decide", "laya encoder": "encoder"}[found.group(1)]


def decided(job: Any) -> int:
    """The decisions a prepared decide job takes, every order's part counted."""
    parts = job.parts if isinstance(job, OrderedJob) else [job]
    return sum(decisions(p) for part in parts for planned in part.planned for p in planned)


@pytest.mark.parametrize("option", BODY_OPTIONS)
@pytest.mark.parametrize("which", ["encoder", "decide"])
def test_an_option_is_refused_where_it_cannot_apply_and_planned_as_prepared(option, which, request):
    engine = request.getfixturevalue(which)
    asked = parse_request(body_with(option, spelling(TABLE[option]["HTTP"])))
    name = spelling(TABLE[option]["HTTP"]).split(".")[-1]
    plan, plain = engine.plan(asked), engine.plan(parse_request({"state": STATE, "questions": QUESTIONS}))
    if refused_by(option) == which:
        with pytest.raises(QuestionError, match=name):
            engine.prepare(asked)
        assert name in plan["refused"]["message"]
        return
    job = engine.prepare(asked)
    assert plan["refused"] is None
    if which == "encoder":
        assert plan["rows"] == job.n_rows
    else:
        assert plan["limits"]["decisions"]["value"] == decided(job)
    if option == "x_order":  # K orders: every order's rows (a chat model's every question) read again
        counted = "rows" if which == "encoder" else "decisions"
        again = 1 if which == "encoder" else plain["limits"][counted]["value"]
        assert plan["limits"][counted]["value"] == plain["limits"][counted]["value"] + again


def test_request_rows_count_every_order_of_a_choice():
    """What admission reserves before the model prepares anything: a choice read in K orders is K rows."""
    plain = parse_request({"state": STATE, "questions": QUESTIONS})
    assert parse_request({**body_with("x_order", "x_order"), "x_order": "rotate:3"}).rows == plain.rows + 2
    assert parse_request({**body_with("x_order", "x_order"), "x_order": "rotate:9"}).rows == plain.rows + 3


def test_the_python_keywords_answer_as_the_server_does(model, encoder):
    """`Model.predict` with `order=` and a shortlisted choice gives what the engine behind the server gives."""
    questions = body_with("x_shortlist", "questions.<id>.x_shortlist")["questions"]
    (want,) = encoder.execute([encoder.prepare(Request.of([STATE], questions, order="both"))])[0]
    got = model.predict(STATE, questions, order="both")
    assert got["answers"]["team"]["x_order"] == {"mode": "both", "orders": 2}
    assert got["answers"] == want.to_json()["answers"]


def test_min_confidence_and_strict_together_are_refused_everywhere(model, encoder):
    with pytest.raises(QuestionError, match="strict"):
        model.predict(STATE, QUESTIONS, min_confidence=0.5, strict=True)
    strict = model.predict(STATE, QUESTIONS, strict=True)
    assert not [k for k in json.dumps(strict).split('"') if k.startswith("x_")]
    (line,) = local_answer(encoder, strict=True)([Line(1, 1, body_with("min_confidence", "x_min_confidence"))])
    assert line["error"]["type"] == "invalid_min_confidence"


def test_the_server_gates_answers_and_refuses_a_gate_it_cannot_show():
    need("fastapi")
    from laya.server.app import create_app

    body = body_with("min_confidence", "x_min_confidence")
    with warnings.catch_warnings(), LiveServer(create_app(lambda: [ScriptedEngine()])) as live:
        warnings.simplefilter("ignore", RuntimeWarning)
        gated = httpx.post(live.url + "/v1/systemone", json=body, timeout=30).json()
        batch = httpx.post(live.url + "/v1/systemone/batch", timeout=30,
                           json={"states": ["a", "b"], "questions": QUESTIONS, "x_min_confidence": 0.5}).json()
        strict = httpx.post(live.url + "/v1/systemone", json={**body, "x_min_confidence": None}, timeout=30,
                            headers={"X-Laya-Strict": "1"}).json()
        both = httpx.post(live.url + "/v1/systemone", json=body, headers={"X-Laya-Strict": "1"}, timeout=30)
        bad = httpx.post(live.url + "/v1/systemone", json={**body, "x_min_confidence": 2}, timeout=30)
    assert all(a["x_abstention_threshold"] == 0.5 for a in gated["answers"].values())
    assert all("x_abstention" in a for r in batch["results"] for a in r["answers"].values())
    assert all(set(a) == {"type", "noul"} for a in strict["answers"].values())
    assert both.status_code == 422 and "strict" in both.text
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "x_min_confidence"]
