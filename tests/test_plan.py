"""The plan before the forward pass (`laya.plan`): its figures are the ones the forward pass then
uses (rows, tokens, the state kept and dropped), on upstream's golden cases and tournaments, for
both engines, in this process, through the engine process and over HTTP; limits near or over are
told, and a request the forward pass would refuse is reported with that refusal."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import httpx
import pytest
from conftest import GOLDEN, load_quiet
from live_server import LiveServer
from scripted_backend import ScriptedBackend

from laya.decide.engine import DecideEngine
from laya.decide.model import DecideModel
from laya.encoder.engine import EncoderEngine
from laya.errors import QuestionError
from laya.limits import Limits
from laya.plan import HEADROOM
from laya.questions import parse_questions
from laya.request import Request, Scan
from laya.server.app import ServerConfig, create_app

ANSWERS = json.loads((GOLDEN / "answers.json").read_text(encoding="utf-8"))
TOURNAMENTS = json.loads((GOLDEN / "tournament.json").read_text(encoding="utf-8"))
USAGE = ("state_tokens", "state_tokens_kept", "state_tokens_dropped", "truncated_questions", "rows", "windows")
ROUTE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None,
                                                                       "support": "bugs"}}
URGENT = {"type": "noul", "instructions": "Urgent?"}
LONG = "I was charged twice for my plan and nobody answers my mails. " * 40


@functools.cache
def golden_engine(name: str, record: str) -> EncoderEngine:
    rel = (ANSWERS if record == "answers" else TOURNAMENTS)["checkpoints"][name]
    return EncoderEngine(load_quiet(GOLDEN / rel, "onnx"))


def forward(engine, states, questions, **options):
    """What the forward pass reports per state: input_tokens and x_usage."""
    job = engine.prepare(Request.of(states, parse_questions(questions), **options))
    return engine.execute([job])[0]


def assert_plan_is_the_forward(plan: dict, responses, exact: bool = True) -> None:
    assert len(plan["states"]) == len(responses)
    for planned, response in zip(plan["states"], responses):
        usage = response.x_usage or {}
        assert {k: planned[k] for k in USAGE if k in usage} == {k: usage[k] for k in USAGE if k in usage}
        if exact:
            assert planned["input_tokens"] == response.input_tokens
        else:
            assert planned["input_tokens"] >= response.input_tokens
        assert sum(q["rows"] for q in planned["questions"].values()) == planned["rows"]
    assert plan["rows"] == sum(s["rows"] for s in plan["states"])
    assert plan["input_tokens_exact"] is exact and plan["refused"] is None and plan["over"] == []


@pytest.mark.parametrize("case", [c for c in ANSWERS["cases"] if "error" not in c],
                         ids=lambda c: f"{c['checkpoint']}:{c['id']}")
def test_the_plan_is_what_the_forward_pass_uses_on_the_golden_cases(case):
    engine = golden_engine(case["checkpoint"], "answers")
    try:
        responses = forward(engine, [case["state"]], case["questions"])
    except QuestionError as exc:  # refused by the contract (test_parity names them): the plan says so
        try:
            request = Request.of([case["state"]], case["questions"])
        except QuestionError as invalid:  # refused before any engine sees it (a 422 at the server's door)
            assert (invalid.error_type, str(invalid)) == (exc.error_type, str(exc))
            return
        plan = engine.plan(request, limits=Limits())
        assert plan["refused"]["error_type"] == exc.error_type and plan["refused"]["message"] == str(exc)
        assert plan["states"] == [] and plan["refused"]["status"] in (413, 422)
        return
    plan = engine.plan(Request.of([case["state"]], case["questions"]), limits=Limits())
    assert_plan_is_the_forward(plan, responses)
    assert plan["input_tokens"] == case["response"]["usage"]["input_tokens"]  # upstream's count
    state = plan["states"][0]
    assert state["state_tokens_dropped"] == case["response"]["usage"]["state_tokens_dropped"]
    assert state["dropped"] == (None if not state["state_tokens_dropped"] else
                                "start" if isinstance(case["state"], list) else "end")
    for qid, entry in state["questions"].items():
        q = parse_questions(case["questions"])[[x.qid for x in parse_questions(case["questions"])].index(qid)]
        assert entry["type"] == q.qtype and entry["options"] == q.n_options
        if q.qtype == "choice":
            assert len(entry["tokens_per_option"]) == q.n_options and min(entry["tokens_per_option"]) >= 1


TOURNAMENT_CASES = ([c for c in TOURNAMENTS["cases"]] + [c for c in ANSWERS["cases"] if "error" in c])


@pytest.mark.parametrize("case", TOURNAMENT_CASES, ids=lambda c: f"{c['checkpoint']}:{c['id']}")
def test_a_tournament_plan_counts_every_row_and_bounds_the_later_tokens(case):
    record = "answers" if "error" in case else "tournaments"
    engine = golden_engine(case["checkpoint"], record)
    # upstream's predict_tournament in groups of 16; a choice too large for the row always is one
    options = {} if "error" in case else {"tournament": TOURNAMENTS["upstream"]["group_size"]}
    responses = forward(engine, [case["state"]], case["questions"], **options)
    plan = engine.plan(Request.of([case["state"]], case["questions"], **options), limits=Limits())
    assert_plan_is_the_forward(plan, responses, exact=False)
    games = [q for q in plan["states"][0]["questions"].values() if "tournament" in q]
    assert games and all(g["tournament"]["later_rows"] >= 1 for g in games)


def test_scans_kept_ends_and_several_states(model):
    engine = EncoderEngine(model)
    questions = {"team": ROUTE, "u": URGENT}
    for options in ({}, {"overflow": "keep_end"}, {"overflow": Scan()}, {"overflow": Scan(window=64, stride=32)}):
        states = [LONG, "short", [{"role": "user", "content": LONG}]]
        plan = engine.plan(Request.of(states, parse_questions(questions), **options), limits=Limits())
        assert_plan_is_the_forward(plan, forward(engine, states, questions, **options))
        dropped = [s["dropped"] for s in plan["states"]]
        if not options:
            assert dropped == ["end", None, "start"]  # a text keeps its start, a conversation its newest end
        elif options["overflow"] == "keep_end":
            assert dropped == ["start", None, "start"]
        else:
            assert dropped == [None, None, None] and plan["states"][0]["windows"] > 1


def test_limits_near_and_over_are_told_and_the_refusal_is_the_forward_passs(model):
    engine = EncoderEngine(model)
    questions = parse_questions({"team": ROUTE, "u": URGENT})
    limits = Limits(max_rows=5)
    near = engine.plan(Request.of(["a", "b"], questions), limits=limits)  # 4 rows of 5
    assert near["limits"]["rows"] == {"value": 4, "max": 5, "flag": "--max-rows", "status": "near"}
    assert near["near"] == ["rows"] and near["over"] == [] and near["refused"] is None
    # 6 rows: counted, and refused as the forward is
    over = engine.plan(Request.of(["a", "b", "c"], questions), limits=limits)
    with pytest.raises(QuestionError) as refused:
        engine.prepare(Request.of(["a", "b", "c"], questions), limits=limits)
    assert over["over"] == ["rows"] and len(over["states"]) == 3
    assert over["refused"] == {"status": 413, "error_type": refused.value.error_type, "message": str(refused.value)}
    # far past the limit (the rows themselves are bounded by --max-rows and the row length)
    tokens = engine.plan(Request.of(["x " * 200] * 20, questions), limits=Limits(max_tokens=1000))
    assert tokens["over"] == ["tokens"] and tokens["limits"]["tokens"]["value"] > 1000 * HEADROOM
    assert "at most 1000 (--max-request-tokens)" in tokens["refused"]["message"]  # told against the real limit


def test_the_decide_engine_plans_its_prompts(tmp_path):
    engine = DecideEngine(DecideModel(ScriptedBackend(), "scripted"))
    questions = {"team": ROUTE, "u": URGENT}
    plan = engine.plan(Request.of(["my card was charged twice"], parse_questions(questions)), limits=Limits())
    job = engine.prepare(Request.of(["my card was charged twice"], parse_questions(questions)))
    state = plan["states"][0]
    assert plan["engine"] == "decide" and plan["runtime"] == "llama.cpp" and not plan["input_tokens_exact"]
    assert state["questions"]["team"]["prompt_tokens"] == [len(p.tokens) for p in job.planned[0][0].prompts]
    assert state["decisions"] == sum(len(p.prompts) for p in job.planned[0])
    assert plan["limits"]["decisions"]["value"] == state["decisions"]
    assert state["input_tokens"] >= engine.execute([job])[0][0].input_tokens  # a kept prefix reads fewer
    too_long = engine.plan(Request.of(["word " * 5000], parse_questions(questions)), limits=Limits())
    assert too_long["refused"]["status"] == 413 and "context holds" in too_long["refused"]["message"]


@pytest.fixture(scope="module")
def plan_server(model):
    with LiveServer(create_app(lambda: [EncoderEngine(model)], ServerConfig(limits=Limits(max_states=4)))) as live:
        yield live


def post_plan(server, body):
    return httpx.post(server.url + "/v1/systemone/plan", json=body, timeout=30)


def test_the_plan_route(plan_server, model):
    questions = {"team": ROUTE, "u": URGENT}
    r = post_plan(plan_server, {"state": LONG, "questions": questions})
    assert r.status_code == 200, r.text
    direct = EncoderEngine(model).plan(Request.of([LONG], parse_questions(questions)), limits=Limits(max_states=4))
    assert r.json() == direct
    answered = httpx.post(plan_server.url + "/v1/systemone", json={"state": LONG, "questions": questions}).json()
    assert r.json()["states"][0]["input_tokens"] == answered["usage"]["input_tokens"]
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    one = post_plan(plan_server, {"state": conversation, "questions": questions}).json()
    assert len(one["states"]) == 1  # a conversation is one state, not a batch
    many = post_plan(plan_server, {"states": ["a"] * 6, "questions": questions}).json()  # over 4, within 4 x 4
    assert many["limits"]["states"]["status"] == "over" and len(many["states"]) == 6
    assert httpx.post(plan_server.url + "/v1/systemone/batch",
                      json={"states": ["a"] * 6, "questions": questions}).status_code == 413
    assert post_plan(plan_server, {"states": ["a"] * 17, "questions": questions}).status_code == 413
    bad = post_plan(plan_server, {"state": "x", "questions": {"q": {"type": "choice"}}})
    assert bad.status_code == 422 and len(bad.content) < 4096
    assert "/v1/systemone/plan" in httpx.get(plan_server.url + "/openapi.json").json()["paths"]


def test_the_plan_through_the_engine_process(checkpoint_dir, model):
    from laya.server.remote import RemoteEngine
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    remote = RemoteEngine(functools.partial(load_engine, ModelSpec(str(checkpoint_dir), name="enc"),
                                            ServeOptions(runtime="torch", threads=1)))
    try:
        questions = parse_questions({"team": ROUTE, "u": URGENT})
        got = remote.plan(Request.of([LONG, "b"], questions, tournament=2), limits=Limits())
        want = EncoderEngine(model).plan(Request.of([LONG, "b"], questions, tournament=2), limits=Limits())
        assert {k: v for k, v in got.items() if k != "model"} == {k: v for k, v in want.items() if k != "model"}
        refused = remote.plan(Request.of(["x"] * 3, questions), limits=Limits(max_rows=2))
        assert refused["refused"]["error_type"] == "max_rows_exceeded"
    finally:
        remote.close()


def test_laya_plan_command(checkpoint_dir, plan_server):
    questions = json.dumps({"team": ROUTE, "u": URGENT})
    local = subprocess.run([sys.executable, "-m", "laya.cli", "plan", "-m", str(checkpoint_dir), "-r", "torch",
                            "-s", LONG, "-q", questions], capture_output=True, text=True, timeout=120)
    assert local.returncode == 0, local.stderr
    remote = subprocess.run([sys.executable, "-m", "laya.cli", "plan", "--url", plan_server.url, "-s", LONG,
                             "-q", questions, "--overflow", "scan", "--window", "64"],
                            capture_output=True, text=True, timeout=120)
    assert remote.returncode == 0, remote.stderr
    here, there = json.loads(local.stdout), json.loads(remote.stdout)
    assert here["states"][0]["state_tokens_dropped"] > 0 and here["states"][0]["dropped"] == "end"
    assert there["states"][0]["windows"] > 1 and there["states"][0]["state_tokens_dropped"] == 0
    refused = subprocess.run([sys.executable, "-m", "laya.cli", "plan", "--url", plan_server.url, "-s", "x",
                              "-q", json.dumps({"big": {"type": "choice", "criteria": ["a", "b", "c"]}}),
                              "--tournament", "1"], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "tournament" in (refused.stdout + refused.stderr)
