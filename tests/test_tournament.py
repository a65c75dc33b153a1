"""Tournaments: every valid System One choice (2 to 255 options) answered on the encoder engine.

Upstream parity of the rounds and the final row is in the parity suite (tournament goldens); here,
the rules of the shares, the automatic trigger, and the System One MUSTs on a checkpoint with the
mmBERT-base row budget (1,024 / 256 tokens), in Python and over HTTP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json

import httpx
import numpy as np
import pytest
from conftest import GOLDEN, load_quiet
from live_server import LiveServer

from laya.encoder.engine import EncoderEngine
from laya.encoder.rows import build_rows
from laya.errors import QuestionError
from laya.questions import parse_question, parse_questions
from laya.server.app import ServerConfig, create_app
from laya.testing import checkpoints as testgen
from laya.tournament import Tournament, groups_of

LONG = "a description long enough that two hundred and fifty five of these never fit in one row"


def test_groups_are_upstreams_near_equal_cut():
    assert groups_of(list(range(40)), 16) == [list(range(0, 13)), list(range(13, 26)), list(range(26, 40))]
    sizes = [len(g) for g in groups_of(list(range(255)), 16)]
    assert len(sizes) == 16 and sum(sizes) == 255 and set(sizes) == {15, 16}
    assert groups_of(list(range(16)), 16) == [list(range(16))]


def test_shares_keep_the_final_odds_and_no_loser_outscores_its_winner():
    question = parse_question("q", {"type": "choice", "criteria": [f"o{i}" for i in range(6)]})
    game = Tournament(question, group=3)
    game.next_round()  # groups [0, 1, 2], [3, 4, 5]
    game.record([np.array([0.2, 0.7, 0.1]), np.array([0.5, 0.3, 0.2])])
    assert game.alive == [1, 3] and game.done
    final = np.array([0.6, 0.4])
    shares = game.shares(final)
    assert shares.sum() == pytest.approx(1.0)
    assert shares[1] / shares[3] == pytest.approx(0.6 / 0.4)  # the finalists keep the final row's odds
    assert shares[0] / shares[1] == pytest.approx(0.2 / 0.7) and shares[4] / shares[3] == pytest.approx(0.3 / 0.5)
    assert int(np.argmax(shares)) == 1
    report = game.report(final)
    assert report == {"rounds": 1, "groups": [2], "finalists": ["o1", "o3"],
                      "final_probabilities": {"o1": 0.6, "o3": 0.4}}


WIDE_SPEC = testgen.TestCheckpointSpec(flavour="mmbert", max_len=1024, head_max_len=256, seed=5)
WIDE = json.loads((GOLDEN / "wide.json").read_text(encoding="utf-8"))  # tests/golden/make_wide_golden.py


def _wide_cases_module():
    spec = importlib.util.spec_from_file_location("wide_cases", GOLDEN / "wide_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """A small generated checkpoint with the mmBERT-base row budget (the wide goldens' checkpoint)."""
    return testgen.write_test_checkpoint(tmp_path_factory.mktemp("ck") / "wide", WIDE_SPEC)


@pytest.fixture(scope="module")
def wide(wide_dir):
    return load_quiet(wide_dir)


def choice(n: int, described: bool = True) -> dict:
    criteria = {f"label {i}": (f"{LONG} {i}" if described else None) for i in range(n)}
    return {"type": "choice", "instructions": "Which label fits?", "criteria": criteria}


@pytest.mark.parametrize("n", [2, 3, 16, 17, 40, 64, 100, 128, 200, 254, 255])
def test_every_option_count_from_2_to_255_is_answered(wide, n):
    out = wide.predict("a customer writes about a refund for a parcel that never arrived", {"q": choice(n)})
    answer = out["answers"]["q"]
    names = list(choice(n)["criteria"])
    assert list(answer["probabilities"]) == names
    assert all(0.0 <= p <= 1.0 for p in answer["probabilities"].values())
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)
    assert 0.0 <= answer["confidence"] <= 1.0
    if n == 255:  # its markers do not fit in 1,024 tokens: answered by a tournament
        played = answer["x_tournament"]
        assert answer["choice"] in played["finalists"] and len(played["finalists"]) <= 16
        assert out["x_usage"]["rows"] == sum(played["groups"]) + 1


def test_a_question_that_fits_is_answered_in_one_row_as_before(wide):
    question = {"q": choice(40, described=False)}
    out = wide.predict("state", question)
    assert "x_tournament" not in out["answers"]["q"] and out["x_usage"]["rows"] == 1
    asked = wide.predict("state", question, tournament=16)["answers"]["q"]
    assert asked["x_tournament"]["groups"] == [3]


def test_every_row_is_counted_in_usage(wide):
    one = wide.predict("state", {"u": {"type": "noul", "instructions": "Urgent?"}})
    both = wide.predict("state", {"u": {"type": "noul", "instructions": "Urgent?"}, "q": choice(255)})
    assert both["x_usage"]["rows"] == 1 + 17
    assert both["usage"]["input_tokens"] > 17 * one["usage"]["input_tokens"] // 2
    assert both["answers"]["u"] == one["answers"]["u"]  # the other questions are answered as before


def test_tournament_sizes_are_checked(wide):
    for bad in (1, 0, 256, True, 2.5):
        with pytest.raises(QuestionError, match="group size"):
            wide.predict("s", {"q": choice(3)}, tournament=bad)


def test_answers_do_not_depend_on_batch_company(wide):
    states = ["refund please", "my parcel is late", "cancel my plan"]
    together = wide.predict_batch(states, {"q": choice(100)})
    for state, got in zip(states, together):
        assert got["answers"] == wide.predict(state, {"q": choice(100)})["answers"]


def test_over_http_255_options_and_the_tournament_option(wide):
    with LiveServer(create_app(lambda: [EncoderEngine(wide)], ServerConfig())) as live:
        r = httpx.post(live.url + "/v1/systemone", json={"state": "refund", "questions": {"q": choice(255)}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["answers"]["q"]["probabilities"]) == 255 and body["answers"]["q"]["x_tournament"]
        asked = httpx.post(live.url + "/v1/systemone", json={"state": "refund", "questions": {"q": choice(20)},
                                                             "tournament": 4})
        assert asked.status_code == 200 and asked.json()["answers"]["q"]["x_tournament"]["groups"] == [5, 2]
        bad = httpx.post(live.url + "/v1/systemone", json={"state": "refund", "questions": {"q": choice(3)},
                                                           "tournament": 1})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "tournament"]


@pytest.mark.slow
def test_the_mmbert_base_shape_answers_255_options(tmp_path_factory):
    """The checkpoint shape the issue was measured on: 22 layers, d 768, a 256k-row vocabulary, 1,024-token
    rows, where a 255-option choice's markers do not fit one row."""
    spec = testgen.TestCheckpointSpec(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12,
                                      intermediate_size=1152, local_attention=128, max_len=1024, head_max_len=256,
                                      vocab_size=256000, seed=3)
    model = load_quiet(testgen.write_test_checkpoint(tmp_path_factory.mktemp("ck") / "mmbert-base", spec))
    question = choice(255)
    answer = model.predict("a parcel never arrived and the customer wants a refund", {"q": question})["answers"]["q"]
    assert list(answer["probabilities"]) == list(question["criteria"])
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)
    assert answer["x_tournament"]["groups"] == [16]


# Upstream laya 0.4.15 on the same checkpoint (tests/golden/wide.json): heads that crowd the 1,024 / 256
# budget, up to a head longer than the row itself (whose row upstream cuts to 1,024 tokens, losing its
# closing [SEP]s) and a last marker at exactly position 1,023.


@pytest.fixture(scope="module")
def wide_cases(wide, wide_dir):
    spec, recorded = dataclasses.asdict(WIDE_SPEC), WIDE["spec"]
    assert {k: spec.get(k) for k in recorded} == recorded
    defaults = dataclasses.asdict(testgen.TestCheckpointSpec())
    added = {k: v for k, v in spec.items() if k not in recorded}  # generator settings newer than wide.json
    assert all(defaults[k] == v for k, v in added.items()), f"{added}: regenerate wide.json"
    for rel, want in WIDE["digests"].items():  # the generator still makes the checkpoint upstream answered
        assert hashlib.sha256((wide_dir / rel).read_bytes()).hexdigest() == want, f"{rel}: regenerate wide.json"
    cases = {c["id"]: c for c in _wide_cases_module().wide_cases(wide.tokenizer)}
    assert list(cases) == [c["id"] for c in WIDE["cases"]]
    digest = _wide_cases_module().input_digest
    for golden in WIDE["cases"]:
        assert digest(cases[golden["id"]]) == golden["input_sha256"], f"{golden['id']}: regenerate wide.json"
    return cases


def _ids_digest(ids) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def test_wide_goldens_crowd_the_budget():
    rows = [r for c in WIDE["cases"] for r in c.get("rows", [])]
    assert sum(r["n"] == 1024 for r in rows) >= 10
    assert any(r["markers"][-1] == 1023 for r in rows)  # the last marker on the row's last token
    assert sum("error" in c for c in WIDE["cases"]) == 1 and WIDE["upstream"]["laya"] == "0.4.15"


@pytest.mark.parametrize("golden", WIDE["cases"], ids=[c["id"] for c in WIDE["cases"]])
def test_wide_rows_match_upstream(wide, wide_cases, golden):
    case = wide_cases[golden["id"]]
    questions = parse_questions(case["questions"])
    if "error" in golden:  # upstream refuses markers past the row; we refuse the one row (and play a tournament)
        with pytest.raises(QuestionError, match="option markers fit"):
            build_rows(wide.tokenizer, case["state"], questions, wide.max_len, wide.head_max_len)
        return
    rows = build_rows(wide.tokenizer, case["state"], questions, wide.max_len, wide.head_max_len)
    got = [{"n": len(r.ids), "sha256": _ids_digest(r.ids), "tail": list(r.ids[-8:]), "markers": list(r.markers)}
           for r in rows]
    assert got == golden["rows"]


def test_wide_answers_match_upstream(wide, wide_cases):
    worst = 0.0
    for golden in WIDE["cases"]:
        case = wide_cases[golden["id"]]
        out = wide.predict(case["state"], case["questions"])
        if "error" in golden:
            for answer in out["answers"].values():
                assert answer["x_tournament"]["finalists"], golden["id"]
            continue
        assert out["usage"]["input_tokens"] == golden["usage"]["input_tokens"], golden["id"]
        assert out["x_usage"]["state_tokens_dropped"] == golden["usage"]["state_tokens_dropped"], golden["id"]
        for qid, want in golden["answers"].items():
            answer = out["answers"][qid]
            got = [1 - answer["noul"], answer["noul"]] if want["type"] == "noul" else list(
                answer["probabilities"].values())
            dp = float(np.max(np.abs(np.array(got) - np.array(want["p"]))))
            worst = max(worst, dp)
            assert dp <= 1e-5, f"{golden['id']} {qid}: max |dp| {dp:.2e}"
            assert answer["x_act_probability"] == pytest.approx(want["act"], abs=1e-5), (golden["id"], qid)
    print(f"\nwide goldens: max |dp| {worst:.2e}")
