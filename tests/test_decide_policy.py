"""The decide policy against a scripted backend: split, choice checks, scoring, the kept state."""

from __future__ import annotations

import numpy as np
import pytest
from scripted_backend import BOS, END, MERGED_AB, ScriptedBackend

from laya.decide.model import DecideModel, DecideSettings
from laya.decide.policy import Decider, DecideRefused, PrefixCache, log_softmax, score, split_prompt
from laya.request import Request

LABELS = ["A", "B", "C"]


def test_split_gives_one_token_back_at_a_merge():
    backend = ScriptedBackend()
    full, n_prefix = split_prompt(backend, "xa", "bq")
    assert full == backend.prompt_tokens("xabq")
    assert MERGED_AB in full  # "a" + "b" merged across the join
    assert n_prefix == 4  # BOS < u > | x  (the 'x' that was shared is given back too)
    assert full[:n_prefix] == [BOS, *backend.tokenize("<u>")]


def test_split_plain_join():
    backend = ScriptedBackend()
    full, n_prefix = split_prompt(backend, "state: hello. ", "question?")
    alone = backend.prompt_tokens("state: hello. ")
    shared = next(i for i, (a, b) in enumerate(zip(full, alone)) if a != b)
    assert n_prefix == shared - 1 and full[:n_prefix] == alone[:n_prefix]


def test_scores_are_normalised_over_the_whole_vocabulary():
    logits = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    full = log_softmax(logits)
    s = score(full, full[[3, 7, 9]], [(3,), (7,), (9,)], temperature=2.0)
    np.testing.assert_allclose(s.logp, full[[3, 7, 9]])
    assert s.outside_mass == pytest.approx(1 - np.exp(full[[3, 7, 9]]).sum())
    z = full[[3, 7, 9]] / 2.0
    np.testing.assert_allclose(s.probabilities, np.exp(z) / np.exp(z).sum())


@pytest.mark.parametrize(("labels", "message"), [([], "at least one choice"), (["A1", "A1"], "same tokens"),
                                                 (["", "B"], "no tokens")])
def test_refusals_happen_before_any_prefill(labels, message):
    backend = ScriptedBackend()
    decider = Decider(backend)
    decider.decide("state", "q1", LABELS)
    seq, calls, kept = list(backend.seq), len(backend.prefill_calls), decider.cache.kept
    with pytest.raises(DecideRefused, match=message):
        decider.decide("state", "q2", labels)
    assert backend.seq == seq and len(backend.prefill_calls) == calls and decider.cache.kept is kept


def test_prompt_longer_than_the_context_is_refused_and_the_session_stays_usable():
    backend = ScriptedBackend(n_ctx=60)
    decider = Decider(backend)
    before, _ = Decider(ScriptedBackend(n_ctx=60)).decide("state", "question", LABELS)
    with pytest.raises(DecideRefused, match="context holds 60") as info:
        decider.decide("state " * 20, "question", LABELS)
    assert info.value.error_type == "max_tokens_exceeded"
    assert backend.prefill_calls == []
    after, _ = decider.decide("state", "question", LABELS)
    np.testing.assert_array_equal(after.logp, before.logp)


def test_kept_state_is_restored_extended_and_stored():
    backend = ScriptedBackend()
    decider = Decider(backend)
    s1, r1 = decider.decide("the state. ", "first question", LABELS)
    assert r1.reused_tokens == 0 and r1.prefilled_tokens == r1.n_tokens
    n_prefix = len(decider.cache.kept.tokens)
    # same prefix, another question: only the suffix is prefilled
    s2, r2 = decider.decide("the state. ", "second question", LABELS)
    assert r2.reused_tokens == n_prefix and r2.prefilled_tokens == r2.n_tokens - n_prefix
    assert backend.prefill_calls[-1] == backend.prompt_tokens("the state. second question")[n_prefix:]
    # the prefix grew: the kept part is restored, the rest prefilled, and the longer prefix kept
    s3, r3 = decider.decide("the state. more state. ", "second question", LABELS)
    assert r3.reused_tokens == n_prefix and len(decider.cache.kept.tokens) > n_prefix
    # every answer is what a fresh session computes
    for (prefix, suffix), got in ((("the state. ", "second question"), s2),
                                  (("the state. more state. ", "second question"), s3)):
        fresh, _ = Decider(ScriptedBackend(), PrefixCache(policy="off")).decide(prefix, suffix, LABELS)
        np.testing.assert_array_equal(got.logp, fresh.logp)


def test_reuse_prefix_false_leaves_the_kept_state_alone():
    backend = ScriptedBackend()
    decider = Decider(backend)
    decider.decide("kept prefix. ", "q", LABELS)
    kept = decider.cache.kept
    _, report = decider.decide("another prefix. ", "q", LABELS, reuse_prefix=False)
    assert decider.cache.kept is kept and report.reused_tokens == 0
    assert backend.prefill_calls[-1] == backend.prompt_tokens("another prefix. q")
    _, again = decider.decide("kept prefix. ", "q2", LABELS)
    assert again.reused_tokens == len(kept.tokens)


def test_policy_off_and_byte_bound():
    off = Decider(ScriptedBackend(), PrefixCache(policy="off"))
    off.decide("state", "q", LABELS)
    assert off.cache.kept is None
    tiny = Decider(ScriptedBackend(), PrefixCache(max_bytes=8))
    _, report = tiny.decide("a long enough state", "q", LABELS)
    assert tiny.cache.kept is None and report.stored_bytes == 0
    with pytest.raises(ValueError, match="policy"):
        PrefixCache(policy="sometimes")


def test_model_answers_system_one_questions():
    model = DecideModel(ScriptedBackend(n_ctx=2000), "scripted")
    questions = {"t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": None, "sales": "plans"}},
                 "s": {"type": "score", "instructions": "Level?", "criteria": ["low", "mid", "high"]},
                 "u": {"type": "noul", "instructions": "Urgent?"}}
    out = model.predict("refund please", questions)
    t, s, u = out["answers"].values()
    assert abs(sum(t["probabilities"].values()) - 1) < 1e-9 and 0 <= t["x_outside_mass"] <= 1
    assert s["score"] == pytest.approx(sum(int(k) * v for k, v in s["probabilities"].items()))
    assert len(u["x_prefill"]) == 2  # both label orders
    assert out["usage"]["input_tokens"] > 0
    # the second and later questions reuse the state
    assert all(r["reused_tokens"] > 0 for a in list(out["answers"].values())[1:] for r in a["x_prefill"])
    # independent of ids and order
    again = model.predict("refund please", {"zz": questions["u"], "renamed": questions["t"]})
    assert again["answers"]["renamed"]["probabilities"] == t["probabilities"]
    assert again["answers"]["zz"]["noul"] == u["noul"]


class CountingBackend(ScriptedBackend):
    """Counts the text it is asked to tokenise."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.tokenised = 0

    def prompt_tokens(self, message: str) -> list[int]:
        self.tokenised += 1
        return super().prompt_tokens(message)

    def tokenize(self, text: str) -> list[int]:
        self.tokenised += 1
        return super().tokenize(text)


def test_the_engine_answers_what_it_prepared_without_tokenising_again():
    from laya.decide.engine import DecideEngine

    questions = {"t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": None, "sales": "plans"}},
                 "u": {"type": "noul", "instructions": "Urgent?"}}
    backend = CountingBackend(n_ctx=2000)
    engine = DecideEngine(DecideModel(backend, "scripted"))
    job = engine.prepare(Request.of(["refund please", "where is my parcel"], questions))
    prepared = backend.tokenised
    assert prepared > 0
    (first, second), = ([r.to_json() for r in results] for results in engine.execute([job]))
    assert backend.tokenised == prepared  # the tree reads logits, it tokenises no text
    alone = DecideModel(ScriptedBackend(n_ctx=2000), "scripted")
    for got, state in ((first, "refund please"), (second, "where is my parcel")):
        want = alone.predict(state, questions)
        assert got["usage"] == want["usage"]
        for qid, answer in want["answers"].items():  # all but the prefill's timings
            assert {k: v for k, v in got["answers"][qid].items() if k != "x_prefill"} == \
                {k: v for k, v in answer.items() if k != "x_prefill"}


def test_noul_averages_both_label_orders():
    model = DecideModel(ScriptedBackend(n_ctx=2000), "scripted")
    u = model.predict("x", {"u": {"type": "noul", "instructions": "ok?"}})["answers"]["u"]
    backend = ScriptedBackend(n_ctx=2000)
    from laya.decide.prompts import prefix_for
    from laya.questions import parse_question

    reads = model.readouts(parse_question("u", {"type": "noul", "instructions": "ok?"}))
    assert [r.keys for r in reads] == [(1, 0), (0, 1)] and reads[0].labels == ("yes", "no")
    p_true = []
    for read in reads:
        scores, _ = Decider(backend, PrefixCache(policy="off")).decide(prefix_for("x"), read.suffix, list(read.labels))
        p_true.append(scores.probabilities[list(read.keys).index(1)])
    assert u["noul"] == pytest.approx(np.mean(p_true))


def test_readout_by_names_or_letters():
    from laya.questions import parse_question

    model = DecideModel(ScriptedBackend(n_ctx=4000), "scripted")
    distinct = parse_question("q", {"type": "choice", "criteria": ["billing", "refunds", "tech"]})
    (read,) = model.readouts(distinct)
    assert read.labels == ("billing", "refunds", "tech") and "- billing" in read.suffix
    shared = parse_question("q", {"type": "choice", "criteria": ["same one", "same two"]})
    (read,) = model.readouts(shared)  # names sharing a beginning: read through the collision tree
    assert read.labels == ("same one", "same two") and "- same one" in read.suffix
    many = parse_question("q", {"type": "choice", "criteria": [chr(0x41 + i) + "x" for i in range(40)]})
    assert len(model.readouts(many)[0].labels) == 40  # past 26 options: names still tell them apart
    letters = DecideModel(ScriptedBackend(), "scripted", settings=DecideSettings(labels="letters"))
    assert letters.readouts(distinct)[0].labels == ("A", "B", "C")


def test_many_options_sharing_first_tokens_are_answered_through_the_tree():
    model = DecideModel(ScriptedBackend(n_ctx=4000), "scripted")
    out = model.predict("x", {"q": {"type": "choice", "criteria": [f"o{i}" for i in range(27)]}})
    answer = out["answers"]["q"]
    assert len(answer["probabilities"]) == 27 and sum(answer["probabilities"].values()) == pytest.approx(1.0)
    assert answer["x_levels"] >= 2 and answer["x_prefill"][0]["tree_passes"] >= 1


def tree_backend():
    backend = ScriptedBackend(n_ctx=4000)
    decider = Decider(backend, PrefixCache(policy="off"))
    return backend, decider


def joint(backend, prompt_tokens: list[int], path: list[int], end: bool = False) -> float:
    """log p(path) (then an end token, if `end`) computed step by step on a fresh sequence."""
    total = 0.0
    backend.reset()
    backend.prefill(prompt_tokens)
    for token in path:
        total += float(log_softmax(backend.last_logits())[token])
        backend.prefill([token])
    if end:
        total += float(log_softmax(backend.last_logits())[END])
    return total


def test_the_tree_reads_each_label_along_its_own_path():
    backend, decider = tree_backend()
    labels = ["xa", "xb", "y", "x"]  # "x" ends where "xa" and "xb" go on
    scores, report = decider.decide("state. ", "question?", labels, tree_budget=10)
    prompt = backend.prompt_tokens("state. question?")
    x, a, b, y = (ord(c) % 60 for c in "xaby")
    want = [joint(backend, prompt, [x, a]), joint(backend, prompt, [x, b]), joint(backend, prompt, [y]),
            joint(backend, prompt, [x], end=True)]
    np.testing.assert_allclose(scores.logp, want, rtol=0, atol=1e-9)
    assert report.levels == 2 and report.tree_passes == 1


def test_past_the_budget_a_losing_group_is_split_equally_but_a_possible_winner_never_is():
    backend, decider = tree_backend()
    labels = ["pa", "pb", "qa", "qb"]
    full, report = decider.decide("s. ", "q?", labels, tree_budget=10)
    assert report.tree_passes == 2 and len(set(np.round(full.logp, 12))) == 4
    cheap, report = decider.decide("s. ", "q?", labels, tree_budget=0)
    assert report.tree_passes == 1  # only the group that could hold the best answer was expanded
    best = int(np.argmax(full.logp))
    assert int(np.argmax(cheap.logp)) == best
    loser = [0, 1] if best in (2, 3) else [2, 3]
    assert cheap.logp[loser[0]] == cheap.logp[loser[1]]
    # the split group keeps its first token's whole mass; expanded, only what goes on to its members
    assert np.logaddexp(*cheap.logp[loser]) >= np.logaddexp(*full.logp[loser])


def test_the_tree_leaves_the_kept_prefix_exact():
    backend = ScriptedBackend(n_ctx=4000)
    decider = Decider(backend)
    first, _ = decider.decide("the state. ", "question one?", ["xa", "xb", "y"])
    again, report = decider.decide("the state. ", "question one?", ["xa", "xb", "y"])
    assert report.reused_tokens > 0
    np.testing.assert_array_equal(first.logp, again.logp)


# A scripted tree: known logits after each answer path, labels colliding at two levels, so reading
# them takes three levels and at least two expansions, each from the prompt state.
X, Y, Z, P, Q, R, S = (ord(c) % 60 for c in "xyzpqrs")
END2 = 60  # a second end-of-answer token: a label that ends reads both
SCRIPT = {
    (): {X: 4.0, Y: 3.0, Z: 1.0},
    (X,): {Q: 3.0, P: 2.5, END: 0.5},
    (X, P): {P: 2.0, Q: 1.0, R: 0.0, END: 1.5, END2: 1.0},
    (Y,): {R: 1.0, S: 2.0},
}
TREE_LABELS = ["xpp", "xpq", "xpr", "xp", "xq", "yr", "ys", "z"]


def lp(path: tuple[int, ...], token: int) -> float:
    """log p(token | prompt, path) from the script alone (every other token at SCRIPTED_LOW)."""
    from scripted_backend import SCRIPTED_LOW

    row = np.full(64, SCRIPTED_LOW, dtype=np.float64)
    for t, v in SCRIPT[path].items():
        row[t] = v
    return float(row[token] - np.log(np.sum(np.exp(row))))


def expected_joint() -> dict[str, float]:
    """Every label's log-probability, step by step along its own path."""
    x, y, xp = lp((), X), lp((), Y), lp((), X) + lp((X,), P)
    return {"xpp": xp + lp((X, P), P), "xpq": xp + lp((X, P), Q), "xpr": xp + lp((X, P), R),
            "xp": xp + float(np.logaddexp(lp((X, P), END), lp((X, P), END2))),
            "xq": x + lp((X,), Q), "yr": y + lp((Y,), R), "ys": y + lp((Y,), S), "z": lp((), Z)}


def scripted(policy: str = "off"):
    backend = ScriptedBackend(n_ctx=4000, script=SCRIPT, end_tokens=[END, END2])
    return backend, Decider(backend, PrefixCache(policy=policy))


@pytest.mark.parametrize("policy", ["off", "on"])
def test_the_tree_equals_the_joint_computed_step_by_step(policy):
    backend, decider = scripted(policy)
    if policy == "on":
        decider.decide("the state. ", "an earlier question?", ["a", "b"])  # a kept prefix in play
    scores, report = decider.decide("the state. ", "which one?", TREE_LABELS, tree_budget=8)
    want = expected_joint()
    np.testing.assert_allclose(scores.logp, [want[label] for label in TREE_LABELS], rtol=0, atol=1e-9)
    assert report.levels == 3 and report.tree_passes == 3  # x, then y and xp: two restores of the prompt
    firsts = np.exp([lp((), X), lp((), Y), lp((), Z)]).sum()
    assert scores.outside_mass == pytest.approx(1 - firsts, abs=1e-12)
    z = np.array([want[label] for label in TREE_LABELS])
    np.testing.assert_allclose(scores.probabilities, np.exp(z - np.logaddexp.reduce(z)), rtol=1e-12)
    # the expansions: each one a path prefilled on the prompt state, never on another path
    prompt = backend.prompt_tokens("the state. which one?")
    assert backend.prefill_calls[-3:] == [[X], [Y], [X, P]]
    assert backend.save_state()[: len(prompt)] == tuple(prompt)


def test_an_unexpanded_group_gets_its_mass_split_equally():
    want = expected_joint()
    x_then_p = lp((), X) + lp((X,), P)  # the mass of the group "xp*" (4 labels), never expanded
    _, decider = scripted()
    # budget 1: only "x" (it could hold the best answer) is expanded; "xq" then beats both groups left
    scores, report = decider.decide("the state. ", "which one?", TREE_LABELS, tree_budget=1)
    got = dict(zip(TREE_LABELS, scores.logp))
    assert report.tree_passes == 1 and report.levels == 2
    for label in ("xpp", "xpq", "xpr", "xp"):
        assert got[label] == pytest.approx(x_then_p - np.log(4), abs=1e-12)
    for label in ("yr", "ys"):
        assert got[label] == pytest.approx(lp((), Y) - np.log(2), abs=1e-12)
    for label in ("xq", "z"):
        assert got[label] == pytest.approx(want[label], abs=1e-12)
    # budget 2: the next pass goes to the group of most mass ("y*", over "xp*")
    scores, report = decider.decide("the state. ", "which one?", TREE_LABELS, tree_budget=2)
    got = dict(zip(TREE_LABELS, scores.logp))
    assert lp((), Y) > x_then_p and report.tree_passes == 2
    for label in ("yr", "ys", "xq", "z"):
        assert got[label] == pytest.approx(want[label], abs=1e-12)
    for label in ("xpp", "xpq", "xpr", "xp"):
        assert got[label] == pytest.approx(x_then_p - np.log(4), abs=1e-12)


def test_a_group_that_could_win_is_expanded_even_with_no_budget():
    _, decider = scripted()
    scores, report = decider.decide("the state. ", "which one?", TREE_LABELS, tree_budget=0)
    got = dict(zip(TREE_LABELS, scores.logp))
    assert report.tree_passes == 1  # "x" holds the largest first-token mass: it must be read
    assert got["xq"] == pytest.approx(expected_joint()["xq"], abs=1e-12)
    assert TREE_LABELS[int(np.argmax(scores.logp))] == "xq"
    assert got["z"] == pytest.approx(lp((), Z), abs=1e-12)


def test_past_max_levels_a_group_is_split_even_if_it_could_win():
    from laya.decide.policy import collision_tree

    backend, decider = scripted()
    decider.decide("the state. ", "which one?", ["x", "y"])  # the backend now holds the prompt
    root = log_softmax(backend.last_logits())
    seqs = [tuple(backend.tokenize(label)) for label in ("xpp", "xpq", "yr", "ys")]
    tree = collision_tree(backend, seqs, root, budget=8, max_levels=1)
    xp, y = lp((), X) + lp((X,), P), lp((), Y)
    assert tree.levels == 2 and tree.passes == 2  # "x" and "y" read, "xp" (level 3) not
    assert xp > y + lp((Y,), S)  # "xp*" could hold the best answer: only max_levels stops it
    np.testing.assert_allclose(tree.logp, [xp - np.log(2), xp - np.log(2), y + lp((Y,), R), y + lp((Y,), S)],
                               rtol=0, atol=1e-12)


def test_the_decide_engine_refuses_an_overflow_policy_naming_why():
    from laya.decide.engine import DecideEngine
    from laya.errors import QuestionError
    from laya.request import Scan

    engine = DecideEngine(DecideModel(ScriptedBackend(n_ctx=2000), "scripted"))
    questions = {"u": {"type": "noul", "instructions": "Urgent?"}}
    assert engine.prepare(Request.of(["x"], questions, overflow=None))
    for overflow in ("keep_end", Scan(64, 32)):
        with pytest.raises(QuestionError, match="x_overflow is for encoder models") as caught:
            engine.prepare(Request.of(["x"], questions, overflow=overflow))
        assert caught.value.error_type == "invalid_overflow"
