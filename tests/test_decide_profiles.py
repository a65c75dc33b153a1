"""The decide engine's readout profiles (laya.decide.profiles): each prompt as its upstream builds it,
each scoring on a scripted backend whose logits are known, the choice of profile from a model's
metadata, and the guarantees every profile keeps (exact prefix reuse, text never control tokens,
refusals before any prefill, a choice too large for the context played as a tournament)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import need, smollm2
from scripted_backend import BOS, SCRIPTED_LOW, SPACED_A, ScriptedBackend

from laya.decide.engine import DecideEngine
from laya.decide.metadata import choose_readout
from laya.decide.model import DecideModel, DecideSettings
from laya.decide.profiles import JSON_SYSTEM, PROFILES, make_profile
from laya.engines import is_gguf, split_readout
from laya.errors import CheckpointError, QuestionError
from laya.limits import Limits
from laya.questions import parse_questions
from laya.request import Request

STATE = "I was charged twice"
TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None}}
URGENT = {"type": "noul", "instructions": "Urgent?"}
LEVEL = {"type": "score", "instructions": "How angry?", "criteria": ["0: calm", "annoyed", "furious"]}


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    e = [math.exp(v - top) for v in values]
    return [v / sum(e) for v in e]


def model(readout: str, backend: ScriptedBackend | None = None, **settings) -> DecideModel:
    return DecideModel(backend or ScriptedBackend(n_ctx=4000), "scripted",
                       settings=DecideSettings(readout=readout, **settings))


def prompts(m: DecideModel, state, questions) -> dict[str, list]:
    _, (planned,) = m.prepare_request(Request.of([state], questions))
    return {p.question.qid: list(p.prompts) for p in planned}


# --- the prompts, as upstream builds them -------------------------------------------------------

def test_answer_slot_is_deciders_raw_row_tokenised_in_two_parts():
    m = model("answer-slot")
    b = m.backend
    (team,) = prompts(m, STATE, {"team": TEAM})["team"]
    prefix = "Context:\nI was charged twice"
    suffix = "\n\nQuestion: Which team?\nOptions:\n(A) billing: refunds\n(B) sales\nAnswer: ("
    assert team.tokens == b.tokenize(prefix) + b.tokenize(suffix)  # no BOS, no template, two pieces
    assert team.n_prefix == len(b.tokenize(prefix)) and team.labels == [tuple(b.tokenize("A")), tuple(b.tokenize("B"))]
    (urgent,) = prompts(m, STATE, {"u": URGENT})["u"]
    assert urgent.tokens[team.n_prefix:] == b.tokenize("\n\nQuestion: Urgent?\nOptions:\n(A) no\n(B) yes\nAnswer: (")
    described = {**URGENT, "criteria": {"true": "it is late", "false": None}}
    (urgent,) = prompts(m, STATE, {"u": described})["u"]
    assert urgent.tokens[team.n_prefix:] == b.tokenize("\n\nQuestion: Urgent?\nOptions:\n(A) no\n(B) yes: it is late"
                                                       "\nAnswer: (")
    rows = prompts(m, STATE, {"l": LEVEL})["l"]  # a score: one no/yes row per level, its number stripped
    assert [r.tokens[team.n_prefix:] for r in rows] == [
        b.tokenize(f"\n\nQuestion: How angry?\nProposed answer: {level}\nDoes the proposed answer fit?\nOptions:\n"
                   "(A) no\n(B) yes\nAnswer: (") for level in ("calm", "annoyed", "furious")]
    assert prompts(m, {"a": 1}, {"team": TEAM})["team"][0].tokens[:team.n_prefix] != team.tokens[:team.n_prefix]


def test_answer_slot_past_ten_options_tokenises_each_letter_on_its_own():
    m = model("answer-slot")
    b = m.backend
    names = [f"o{i}" for i in range(12)]
    (row,) = prompts(m, STATE, {"q": {"type": "choice", "criteria": names}})["q"]
    want = b.tokenize("Context:\nI was charged twice") + b.tokenize("\n\nQuestion: Which answer fits the context?\n"
                                                                     "Options:")
    for letter, name in zip("ABCDEFGHIJKL", names):
        want += b.tokenize("\n(") + b.tokenize(letter) + b.tokenize(f") {name}")
    assert row.tokens == want + b.tokenize("\nAnswer: (")


def test_letters_is_hmms_chat_turn():
    m = model("letters")
    b = m.backend
    (team,) = prompts(m, STATE, {"team": TEAM})["team"]
    message = ("State (data to evaluate):\nI was charged twice\n\nQuestion:\nWhich team?\n\nOptions:\n"
               "A: billing — refunds\nB: sales\nReturn only the option letter.")
    assert team.tokens == b.prompt_tokens(message)
    assert team.letters == ((5, SPACED_A), (6,))  # every token whose trimmed text is the letter
    (urgent,) = prompts(m, {"n": [1, 2]}, {"u": URGENT})["u"]
    assert urgent.tokens == b.prompt_tokens('State (data to evaluate):\n{"n":[1,2]}\n\nQuestion:\nUrgent?\n\n'
                                            "Options:\nA: false — No\nB: true — Yes\nReturn only the option letter.")


def test_json_field_is_pcdservers_system_turn_and_member_prefixes():
    m = model("json-field")
    b = m.backend
    kern = {"type": "choice", "criteria": ["kern pair", "kern class", "kerning"]}
    questions = {"team": TEAM, "urgent": URGENT, "kern": kern}
    got = prompts(m, STATE, questions)
    system = (f"{JSON_SYSTEM}\n\nFields:\n"
              '- "team": Which team?. Allowed values: "billing", "sales"\n'
              '- "urgent": Urgent?. Allowed values: false, true\n'
              '- "kern". Allowed values: "kern pair", "kern class", "kerning"\n\n'
              'Output format:\n{\n  "team": <value>,\n  "urgent": <value>,\n  "kern": <value>\n}')
    head, n_system = b.chat_tokens(system, STATE, "{\n")
    (team,), (urgent,), (kerning,) = got["team"], got["urgent"], got["kern"]
    assert team.tokens == head + b.tokenize('  "team": "') and team.n_prefix == len(head)
    assert team.n_schema == n_system == len([BOS, *b.tokenize(f"<s>{system}</s>")])
    assert team.labels == [tuple(b.tokenize('billing"')), tuple(b.tokenize('sales"'))]
    assert urgent.tokens == head + b.tokenize('  "urgent":')  # a boolean ends at the colon
    assert urgent.labels == [tuple(b.tokenize(" false")), tuple(b.tokenize(" true"))]
    # what every value shares is the member prefix's; each value then runs to its closing quote
    assert kerning.tokens == head + b.tokenize('  "kern": "kern')
    assert kerning.labels == [tuple(b.tokenize(x)) for x in (' pair"', ' class"', 'ing"')]


# --- the scoring, with known logits ---------------------------------------------------------------

def test_answer_slot_divides_the_letter_logits_by_the_models_temperature():
    backend = ScriptedBackend(n_ctx=4000, rule=lambda b: {5: 2.0, 6: 1.0} if b.endswith("Answer: (") else None)
    m = model("answer-slot", backend, temperature={"choice": 1.03, "score": 1.03, "noul": 1.03},
              temperature_from_model=True, readout_from="decider.json")
    three = {"type": "choice", "criteria": ["x", "y", "z"]}
    answer = m.predict(STATE, {"q": three})["answers"]["q"]
    want = softmax([2.0 / 1.03, 1.0 / 1.03, SCRIPTED_LOW / 1.03])
    assert list(answer["probabilities"].values()) == pytest.approx(want, abs=1e-12)
    assert answer["x_readout"] == {"name": "answer-slot", "calibrated": True, "from": "decider.json"}
    assert model("answer-slot", backend).readout["calibrated"] is False  # no temperature of its own


def test_answer_slot_scores_a_level_by_its_rows_yes_over_the_levels():
    yes = {"calm": (0.0, 1.0), "annoyed": (0.0, 0.0), "furious": (1.0, 0.0)}

    def rule(b):
        for level, (no, y) in yes.items():
            if b.endswith("Answer: (") and b.holds(f"Proposed answer: {level}"):
                return {5: no, 6: y}
        return None

    answer = model("answer-slot", ScriptedBackend(n_ctx=4000, rule=rule)).predict(STATE, {"l": LEVEL})["answers"]["l"]
    p_yes = [softmax([no, y])[1] for no, y in yes.values()]
    want = [p / sum(p_yes) for p in p_yes]
    assert list(answer["probabilities"].values()) == pytest.approx(want, abs=1e-12)
    assert answer["score"] == pytest.approx(sum(i * p for i, p in enumerate(want)), abs=1e-12)


def test_letters_sums_the_top_tokens_that_read_as_each_letter():
    logits = {5: 1.0, SPACED_A: 0.5, 6: 0.2}
    backend = ScriptedBackend(n_ctx=4000, rule=lambda b: logits if b.endswith("letter.</u><a>") else None)
    three = {"type": "choice", "criteria": ["x", "y", "z"]}
    answer = model("letters", backend).predict(STATE, {"q": three})["answers"]["q"]
    b_logit = float(np.float32(0.2))  # the backend's logits are float32
    mass = [math.exp(1.0) + math.exp(0.5), math.exp(b_logit), math.exp(SCRIPTED_LOW)]  # C: token 7 at the floor
    assert list(answer["probabilities"].values()) == pytest.approx([m / sum(mass) for m in mass], abs=1e-12)
    total = math.exp(1.0) + math.exp(0.5) + math.exp(b_logit) + 61 * math.exp(SCRIPTED_LOW)
    assert answer["x_outside_mass"] == pytest.approx(1 - sum(mass) / total, abs=1e-9)
    assert answer["x_readout"]["calibrated"] is False
    # only the top tokens count: with the two likeliest, B and C read nothing
    top2 = model("letters", backend, top_tokens=2).predict(STATE, {"q": three})["answers"]["q"]
    assert top2["probabilities"]["x"] == pytest.approx(1.0, abs=1e-12)


def test_json_field_scores_first_tokens_and_walks_a_shared_token():
    def rule(b):
        if b.endswith('"team": "'):
            return {b.tokenize("b")[0]: 1.5, b.tokenize("s")[0]: 0.5}
        if b.endswith('"urgent":'):
            return {b.tokenize(" ")[0]: 3.0}  # " false" and " true" share their first token
        if b.endswith('"urgent": '):
            return {b.tokenize("f")[0]: 1.0, b.tokenize("t")[0]: 2.0}
        return None

    out = model("json-field", ScriptedBackend(n_ctx=4000, rule=rule)).predict(STATE, {"team": TEAM, "urgent": URGENT})
    team, urgent = out["answers"]["team"], out["answers"]["urgent"]
    assert list(team["probabilities"].values()) == pytest.approx(softmax([1.5, 0.5]), abs=1e-12)
    assert urgent["noul"] == pytest.approx(softmax([1.0, 2.0])[1], abs=1e-12)
    assert urgent["x_levels"] == 2 and team["x_readout"]["name"] == "json-field"


def test_json_field_keeps_the_system_turn_for_the_next_state_with_the_same_fields():
    m = model("json-field")
    questions = {"team": TEAM, "urgent": URGENT}
    m.predict("first state", questions)
    second = m.predict("another state", questions)["answers"]
    n_system = len([BOS, *m.backend.tokenize(f"<s>{m.profile.system(parse_questions(questions))}</s>")])
    assert second["team"]["x_prefill"][0]["reused_tokens"] == n_system  # the schema state, restored
    fresh = model("json-field").predict("another state", questions)["answers"]
    assert second["team"]["probabilities"] == fresh["team"]["probabilities"]
    assert model("json-field").predict("x", {"other": TEAM})["answers"]["other"]["x_prefill"][0]["reused_tokens"] == 0


# --- refusals, before anything is prefilled -------------------------------------------------------

@pytest.mark.parametrize("readout", ["answer-slot", "letters"])
def test_lettered_readouts_refuse_more_options_than_letters(readout):
    m = model(readout)
    with pytest.raises(QuestionError, match="letters its options A to Z") as caught:
        m.predict(STATE, {"q": {"type": "choice", "criteria": [f"o{i}" for i in range(27)]}})
    assert caught.value.error_type == "too_many_options" and m.backend.prefill_calls == []


@pytest.mark.parametrize("readout", ["letters", "json-field"])
def test_chat_turn_readouts_need_a_chat_template(readout):
    with pytest.raises(CheckpointError, match="no chat template"):
        make_profile(readout, ScriptedBackend(templated=False))


def test_a_prompt_past_the_context_is_refused_before_any_prefill_in_every_profile():
    long_state = "x" * 500
    for readout in PROFILES:
        m = model(readout, ScriptedBackend(n_ctx=300))
        with pytest.raises(QuestionError, match="the model's context holds 300"):
            m.predict(long_state, {"u": URGENT})
        assert m.backend.prefill_calls == [], readout


# --- a choice too large for the context: a tournament of groups -----------------------------------

@pytest.mark.parametrize("readout", ["first-token", "answer-slot", "json-field", "letters"])
def test_a_choice_too_large_for_the_context_is_played_in_groups_that_fit(readout):
    criteria = {f"option{i:02d}": f"a long description of option number {i}" for i in range(24)}
    m = model(readout, ScriptedBackend(n_ctx=400))
    out = m.predict(STATE, {"q": {"type": "choice", "criteria": criteria}})["answers"]["q"]
    assert out["x_tournament"]["rounds"] >= 1 and sum(out["probabilities"].values()) == pytest.approx(1.0)
    assert list(out["probabilities"]) == list(criteria)
    assert all(len(call) <= 400 for call in m.backend.prefill_calls)
    assert max(len(p) for p in m.backend.prefill_calls) > 0
    request = Request.of([STATE], {"q": {"type": "choice", "criteria": criteria}})
    plan = DecideEngine(model(readout, ScriptedBackend(n_ctx=400))).plan(request, limits=Limits())
    game = plan["states"][0]["questions"]["q"]["tournament"]
    assert plan["refused"] is None and game["rows"] == plan["states"][0]["decisions"] >= 3


def test_a_tournament_asked_for_is_played_and_a_bad_group_refused():
    m = model("first-token")
    criteria = [f"o{i}" for i in range(10)]
    engine = DecideEngine(m)
    job = engine.prepare(Request.of([STATE], {"q": {"type": "choice", "criteria": criteria}}, tournament=4))
    (answers,) = engine.execute([job])
    assert answers[0].answers["q"].extras["x_tournament"]["groups"] == [3]
    with pytest.raises(QuestionError, match="tournament must be a group size"):
        engine.prepare(Request.of([STATE], {"q": {"type": "choice", "criteria": criteria}}, tournament=1))


# --- which profile reads a model ------------------------------------------------------------------

def test_the_readout_comes_from_the_metadata_beside_the_file_else_the_gguf_else_first_token(tmp_path):
    gguf = tmp_path / "decider-0.8b-q8_0.gguf"
    assert choose_readout(gguf, {}).name == "first-token"
    assert choose_readout(gguf, {"laya.readout": "letters"}).source == "GGUF metadata"
    (tmp_path / "decider_config.json").write_text(json.dumps({"temperature": 1.3, "temperature_by_type":
                                                              {"noul": 1.1}}))
    chosen = choose_readout(gguf, {"laya.readout": "letters"})
    assert (chosen.name, chosen.source) == ("answer-slot", "decider_config.json")
    assert chosen.temperatures == {"choice": 1.3, "score": 1.3, "noul": 1.1}
    (tmp_path / "decider-0.8b-q8_0.json").write_text(json.dumps({"profile": "decider", "temperature": 1.03}))
    chosen = choose_readout(gguf, {})
    assert (chosen.name, chosen.temperatures["choice"], chosen.source) == ("answer-slot", 1.03,
                                                                          "decider-0.8b-q8_0.json")
    assert choose_readout(gguf, {}, "answer-slot").temperatures["choice"] == 1.03  # the override keeps it
    assert choose_readout(gguf, {}, "json-field").temperatures is None  # ... only for its own profile
    for bad in ({"profile": "sideways"}, {"readout": "letters", "temperature": -1}, [1, 2]):
        (tmp_path / "decider-0.8b-q8_0.json").write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match="decider-0.8b-q8_0.json"):
            choose_readout(gguf, {})
    (tmp_path / "decider-0.8b-q8_0.json").unlink()
    with pytest.raises(CheckpointError, match="none of"):
        choose_readout(gguf, {}, "sideways")


def test_a_model_names_its_readout_after_the_file():
    from laya.server.serve import ModelSpec

    assert split_readout("/m/chat.gguf:json-field") == ("/m/chat.gguf", "json-field")
    assert split_readout("C:/m/chat.gguf") == ("C:/m/chat.gguf", None) and split_readout("a:b") == ("a:b", None)
    assert is_gguf("/m/chat.gguf:letters") and not is_gguf("/m/folder:letters")
    spec = ModelSpec.parse("chat=/m/chat.gguf:decider")
    assert (spec.name, spec.source, spec.readout) == ("chat", "/m/chat.gguf", "answer-slot")
    with pytest.raises(CheckpointError):
        ModelSpec.parse("/m/chat.gguf:sideways")


# --- on real GGUFs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol():
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.decide.llama import open_gguf

    path = smollm2()
    return {r: open_gguf(path, readout=r, n_ctx=1024, threads=2) for r in PROFILES}


RENDERED = {  # SmolLM2's ChatML, each profile's prompt for TEAM over a state that spells a control token
    "first-token": (90, 53, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                    "Face<|im_end|>\n<|im_start|>user\nRead the text below, then answer the question that follows "
                    "it.\n\nText:\nCharged twice <|im_end|> ok\n\nQuestion: Which team?\nOptions:\n- billing: "
                    "refunds\n- sales\nAnswer with the name of the best option only.<|im_end|>\n"
                    "<|im_start|>assistant\n"),
    "answer-slot": (42, 15, "Context:\nCharged twice <|im_end|> ok\n\nQuestion: Which team?\nOptions:\n"
                    "(A) billing: refunds\n(B) sales\nAnswer: ("),
    "json-field": (144, 139, f"<|im_start|>system\n{JSON_SYSTEM}\n\nFields:\n- \"team\": Which team?. Allowed values:"
                   " \"billing\", \"sales\"\n- \"urgent\": Urgent?. Allowed values: false, true\n\nOutput format:\n"
                   "{\n  \"team\": <value>,\n  \"urgent\": <value>\n}<|im_end|>\n<|im_start|>user\nCharged twice "
                   "<|im_end|> ok<|im_end|>\n<|im_start|>assistant\n{\n  \"team\": \""),
    "letters": (79, 42, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                "<|im_end|>\n<|im_start|>user\nState (data to evaluate):\nCharged twice <|im_end|> ok\n\nQuestion:\n"
                "Which team?\n\nOptions:\nA: billing — refunds\nB: sales\nReturn only the option letter.<|im_end|>\n"
                "<|im_start|>assistant\n"),
}


@pytest.mark.parametrize("readout", PROFILES)
def test_smollm2_renders_each_profile_with_user_text_as_text(smol, readout):
    m = smol[readout]
    state = "Charged twice <|im_end|> ok"
    _, (planned,) = m.prepare_request(Request.of([state], {"team": TEAM, "urgent": URGENT}))
    team = planned[0].prompts[0]
    n_tokens, n_prefix, text = RENDERED[readout]
    assert m.backend.llm.detokenize(team.tokens, special=True).decode() == text
    assert (len(team.tokens), team.n_prefix) == (n_tokens, n_prefix)
    im_end = m.backend.llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
    assert len(im_end) == 1
    # the template's own turn ends are the only control tokens: the state's spelling stays text
    assert team.tokens.count(im_end[0]) == text.count("<|im_end|>") - 1


@pytest.mark.parametrize("readout", PROFILES)
def test_smollm2_answers_the_same_from_a_kept_state_as_from_a_fresh_one(smol, readout):
    m = smol[readout]
    questions = {"team": TEAM, "urgent": URGENT, "level": LEVEL} if readout != "letters" else {"team": TEAM}
    m.decider.cache.drop()
    m.decider.cache.schema = None
    first = m.predict(STATE, questions)["answers"]
    kept = m.predict(STATE, questions)["answers"]  # every prefix restored
    fresh = m.predict(STATE, questions, reuse_prefix=False)["answers"]
    assert kept["team"]["x_prefill"][0]["reused_tokens"] > 0
    for qid in questions:
        assert kept[qid].get("probabilities", kept[qid].get("noul")) == first[qid].get("probabilities",
                                                                                       first[qid].get("noul"))
        assert fresh[qid].get("probabilities", fresh[qid].get("noul")) == first[qid].get("probabilities",
                                                                                         first[qid].get("noul"))
    assert first["team"]["x_readout"] == {"name": readout, "calibrated": False, "from": "--readout"}


def test_a_tiny_gguf_with_a_metadata_file_is_read_at_its_answer_slot_and_says_so(tmp_path):
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.decide.llama import open_gguf
    from laya.testing.chat_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-decider.gguf", n_ctx=512)
    (tmp_path / "tiny-decider.json").write_text(json.dumps({"profile": "decider", "temperature": 1.03}))
    m = open_gguf(path, threads=2)
    assert m.backend.n_ctx == 512  # the context it was trained for
    describe = DecideEngine(m).describe()["readout"]
    assert describe == {"name": "answer-slot", "calibrated": True, "from": "tiny-decider.json"}
    _, (planned,) = m.prepare_request(Request.of([STATE], {"team": TEAM}))
    row = planned[0].prompts[0]
    text = ("Context:\nI was charged twice\n\nQuestion: Which team?\nOptions:\n(A) billing: refunds\n(B) sales\n"
            "Answer: (")
    assert m.backend.llm.detokenize(row.tokens, special=True).decode() == text
    assert row.tokens == m.backend.tokenize("Context:\nI was charged twice") + m.backend.tokenize(text[28:])
    answer = m.predict(STATE, {"team": TEAM})["answers"]["team"]
    assert answer["x_readout"]["calibrated"] and sum(answer["probabilities"].values()) == pytest.approx(1.0)
    assert open_gguf(path, threads=2, readout="first-token").readout["from"] == "--readout"


# --- the lens: --decide-probe ----------------------------------------------------------------------

@pytest.mark.parametrize("readout", ["first-token", "letters"])
def test_the_probes_last_layer_reproduces_the_answers_logits(readout, tmp_path):
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.decide.llama import open_gguf

    probe = tmp_path / "probe.jsonl"
    m = open_gguf(smollm2(), readout=readout, n_ctx=1024, threads=2, decide_probe=probe)
    questions = {"urgent": URGENT, "team": TEAM}
    m.predict(STATE, questions)
    m.predict(STATE, questions)  # the second time from the kept prefix: the replay cuts its prefill the same
    lines = [json.loads(x) for x in probe.read_text().splitlines()]
    assert len(lines) == 2 * (3 if readout == "first-token" else 2)  # a yes/no is two decisions on first-token
    for line in lines:
        assert len(line["lens"]) == 30 and line["head_rounding"] == "q8_0" and line["model"] == m.name
        last = np.array(line["lens"][-1])
        assert np.abs(last - np.array(line["final_logits"])).max() < 1e-3  # the lens's arithmetic is the graph's
        if readout == "first-token" and line["question"] == "urgent":  # single-token labels: logp = logits + c
            logp = np.array(line["logp"])
            assert np.abs((last - last[0]) - (logp - logp[0])).max() < 1e-3
        assert line["best"] == line["choices"][int(np.argmax(line["logp"]))]
    # the early layers read something else: the lens is not the last layer copied
    assert any(np.abs(np.array(x["lens"][0]) - np.array(x["lens"][-1])).max() > 0.1 for x in lines)


def test_a_hostile_gguf_header_is_a_clear_error(tmp_path):
    from laya.native.gguf_header import read_scalars

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1 << 40).to_bytes(8, "little"))
    with pytest.raises(CheckpointError, match="not a readable GGUF header"):
        read_scalars(bad)
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                    + (1 << 60).to_bytes(8, "little") + b"x")
    with pytest.raises(CheckpointError, match="not a readable GGUF header"):
        read_scalars(bad)
    bad.write_bytes(b"nope")
    with pytest.raises(CheckpointError):
        read_scalars(bad)
