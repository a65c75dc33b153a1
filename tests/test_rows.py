"""One test per row-building rule of laya-format.md section 5."""

from __future__ import annotations

import json

import numpy as np
import pytest

from laya.encoder.batch import collate
from laya.encoder.rows import build_head, build_row, build_rows, tokenize_state
from laya.errors import QuestionError
from laya.questions import parse_question

LONG = "the customer was charged twice for the same order and wants a refund today " * 8


@pytest.fixture(scope="module")
def tok(model):
    return model.tokenizer


def q(spec, qid="q"):
    return parse_question(qid, spec)


def choice(criteria, instructions="Which team?"):
    return q({"type": "choice", "instructions": instructions, "criteria": criteria})


def test_row_layout(tok):
    question = choice({"billing": "refunds", "sales": None})
    (row,) = build_rows(tok, "my state", [question], 256, 96)
    ids = list(row.ids)
    qids = tok.encode("choice question: Which team?")
    assert ids[0] == tok.cls_id
    assert ids[1 : 1 + len(qids)] == qids
    assert ids[1 + len(qids)] == tok.sep_id
    o1, o2 = tok.encode(" billing: refunds"), tok.encode(" sales")
    m1 = 2 + len(qids)
    assert row.markers == (m1, m1 + 1 + len(o1))
    assert ids[m1 : m1 + 1 + len(o1)] == [tok.mask_id, *o1]
    assert ids[row.markers[1] : row.markers[1] + 1 + len(o2)] == [tok.mask_id, *o2]
    state = tok.encode("my state")
    assert ids[-len(state) - 2 :] == [tok.sep_id, *state, tok.sep_id]
    assert row.qtype == 0


def test_option_texts_per_type():
    assert choice({"a": "x", "b": None, "c": ""}).options == ("a: x", "b", "c")
    assert choice(["a", "b"]).options == ("a", "b")
    assert q({"type": "score", "instructions": "i", "criteria": ["low", "high"]}).options == (
        "level 0: low", "level 1: high")
    assert q({"type": "noul", "instructions": "i"}).options == (
        "false: no, the statement does not hold", "true: yes, the statement holds")
    assert q({"type": "noul", "instructions": "i", "criteria": {"true": "paid"}}).options == (
        "false: no, the statement does not hold", "true: paid")
    assert q({"type": "noul", "instructions": "i", "criteria": {"TRUE": "t", "False": "f"},
              "labels": {"false": " B ", "true": "A"}}).options == ("B: f", "A: t")


def test_type_word_starts_the_question(tok):
    for qtype, extra in (("score", {"criteria": ["a", "b"]}), ("noul", {})):
        head = build_head(tok, q({"type": qtype, "instructions": "Why?", **extra}), 96)
        assert list(head.ids[1 : 1 + len(tok.encode(f"{qtype} question: Why?"))]) == tok.encode(
            f"{qtype} question: Why?")


def test_options_read_with_a_leading_space(tok):
    head = build_head(tok, choice(["billing", "sales"]), 96)
    assert list(head.ids[head.markers[0] + 1 : head.markers[1]]) == tok.encode(" billing")
    assert tok.encode(" billing") != tok.encode("billing")


def test_option_capped_at_48_tokens(tok):
    head = build_head(tok, choice({"a": LONG, "b": "short"}), 192)
    assert head.markers[1] - head.markers[0] == 1 + 48
    assert list(head.ids[head.markers[0] + 1 : head.markers[1]]) == tok.encode(" a: " + LONG)[:48]


def test_per_option_cap_when_options_crowd_the_head(tok):
    labels = {f"option {i}": f"the description of option number {i}" for i in range(10)}
    head = build_head(tok, choice(labels), 96)
    per = max(4, (96 - 16) // 10)
    assert head.tokens_per_option == per
    spans = np.diff([*head.markers, len(head.ids) - 1])
    assert all(s == per for s in spans)


def test_option_floor_of_four_tokens_and_head_cap_is_not_a_guarantee(tok):
    labels = {f"item {i}": f"the description of item {i}" for i in range(40)}
    head = build_head(tok, choice(labels), 96)
    assert head.tokens_per_option == 4  # (96 - 16) // 40 = 2, floored at 4
    assert len(head.ids) > 96  # the floors make the head longer than head_max_len


def test_instructions_floor_of_eight_tokens(tok):
    labels = {f"item {i}": f"the description of item {i}" for i in range(40)}
    head = build_head(tok, choice(labels, instructions=LONG), 96)
    assert head.markers[0] == 1 + 8 + 1


def test_instructions_are_cut_last(tok):
    question = choice({"a": "x", "b": "y"}, instructions=LONG)
    head = build_head(tok, question, 96)
    options = sum(1 + len(tok.encode(" " + o)) for o in question.options)
    assert head.markers[0] - 2 == 96 - options  # the instructions got exactly what the options left
    assert list(head.ids[1 : head.markers[0] - 1]) == tok.encode("choice question: " + LONG)[: 96 - options]


def test_state_keeps_its_start_for_text_and_objects(tok):
    question = choice(["a", "b"])
    for state in (LONG * 3, {"text": LONG * 3}):
        (row,) = build_rows(tok, state, [question], 128, 96)
        full = tok.encode(state if isinstance(state, str) else json.dumps(state, ensure_ascii=False))
        head_len = row.markers[-1] + 1 + len(tok.encode(" b")) + 1
        assert len(row.ids) == 128
        assert list(row.ids[head_len:-1]) == full[: 128 - head_len - 1]
        assert row.state_tokens_dropped == len(full) - (128 - head_len - 1)


def test_conversation_keeps_its_newest_turns(tok):
    state = [{"role": "user", "content": LONG}, {"role": "user", "content": "the newest turn"}]
    (row,) = build_rows(tok, state, [choice(["a", "b"])], 128, 96)
    full = tok.encode(json.dumps(state, ensure_ascii=False))
    kept = row.state_tokens_kept
    assert list(row.ids[-kept - 1 : -1]) == full[-kept:]
    assert row.ids[-1] == tok.sep_id


def test_no_room_drops_the_whole_state(tok):
    labels = {f"item {i}": f"the description of item {i}" for i in range(30)}
    question = choice(labels)
    head = build_head(tok, question, 96)
    for state in ("some state", ["a conversation"]):
        row = build_row(tok, question, head, tokenize_state(tok, state), len(head.ids) + 1)
        assert row.state_tokens_kept == 0
        assert list(row.ids) == [*head.ids, tok.sep_id][: len(head.ids) + 1]


def test_state_is_cut_to_max_len(tok):
    (row,) = build_rows(tok, LONG * 10, [choice(["a", "b"])], 100, 96)
    assert len(row.ids) == 100 and row.ids[-1] == tok.sep_id


def test_mask_literals_become_spaces(tok):
    mask = tok.mask_token
    question = choice({f"a{mask}b": f"x{mask}y", "c": None}, instructions=f"which {mask} one")
    (row,) = build_rows(tok, f"state {mask} text", [question], 256, 96)
    assert list(row.ids).count(tok.mask_id) == 2  # only the real markers
    assert list(row.ids) == list(build_rows(tok, "state   text", [choice({"a b": "x y", "c": None}, "which   one")],
                                            256, 96)[0].ids)


def test_structured_text_is_json(tok):
    spec = {"type": "choice", "instructions": {"task": "route", "n": 2}, "criteria": {"a": {"k": [1, "ü"]}, "b": None}}
    question = q(spec)
    assert question.instructions == '{"task": "route", "n": 2}'
    assert question.options == ('a: {"k": [1, "ü"]}', "b")
    assert q({"type": "noul", "instructions": ["x", 1]}).instructions == '["x", 1]'
    (row,) = build_rows(tok, {"ü": ["é"]}, [question], 256, 96)
    state = tok.encode('{"ü": ["é"]}')
    assert list(row.ids[-len(state) - 1 : -1]) == state


def test_markers_that_do_not_fit_are_refused(tok):
    labels = {f"item {i}": f"the description of item {i}" for i in range(70)}
    with pytest.raises(QuestionError, match=r"only \d+ of its 70 option markers fit"):
        build_rows(tok, "state", [choice(labels)], 256, 96)


def test_state_is_tokenised_once(tok, monkeypatch):
    calls = []
    original = tok.encode

    def counting(text):
        calls.append(text)
        return original(text)

    monkeypatch.setattr(tok, "encode", counting)
    questions = [choice(["a", "b"]), q({"type": "noul", "instructions": "x"}, "n")]
    build_rows(tok, "the one state", questions, 256, 96)
    assert calls.count("the one state") == 1


def test_padding_and_marker_tensors(tok):
    questions = [choice(["a", "b", "c"]), q({"type": "noul", "instructions": "x"}, "n")]
    rows = build_rows(tok, "state", questions, 256, 96)
    batch = collate(rows, tok.pad_id)
    n_len = max(len(r.ids) for r in rows)
    assert batch.input_ids.shape == (2, n_len) and batch.input_ids.dtype == np.int64
    for i, row in enumerate(rows):
        assert list(batch.input_ids[i, : len(row.ids)]) == list(row.ids)
        assert (batch.input_ids[i, len(row.ids) :] == tok.pad_id).all()
        assert batch.attention_mask[i].sum() == len(row.ids)
    assert batch.marker_pos.shape == (2, 3)
    assert batch.marker_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.marker_pos[1, 2] == 0
    assert batch.qtype.tolist() == [0, 2]


BUDGETS = [(512, 192), (1024, 256)]  # the English and the multilingual checkpoints' row budgets
STATES = ["short state", LONG * 12, ["old turn " + LONG * 6, "the newest turn"], {"message": LONG * 6}]


@pytest.mark.parametrize(("max_len", "head_max_len"), BUDGETS, ids=["512-192", "1024-256"])
def test_every_row_fits_max_len_over_crowded_heads(tok, max_len, head_max_len):
    """2 to 255 described options, four kinds of state: every row is at most `max_len` tokens and is
    `head + state + [SEP]` cut to `max_len` (upstream's rule), so it ends with its [SEP] whenever the
    head leaves room for one; a head longer than the row loses its tail, never the markers."""
    states = [tokenize_state(tok, s) for s in STATES]
    longest, full_rows, past_the_row, refused = 0, 0, 0, 0
    for n in range(2, 256):
        question = choice({f"option {i}": f"the description of option number {i}" for i in range(n)})
        head = build_head(tok, question, head_max_len)
        if head.markers[-1] >= max_len:
            with pytest.raises(QuestionError, match="option markers fit"):
                build_row(tok, question, head, states[0], max_len)
            refused += 1
            continue
        past_the_row += len(head.ids) + 1 > max_len
        room = max(0, max_len - len(head.ids) - 1)
        for state in states:
            row = build_row(tok, question, head, state, max_len)
            kept = state.ids[max(0, len(state.ids) - room):] if state.keep_end else state.ids[:room]
            assert len(row.ids) <= max_len, (n, len(row.ids))
            assert row.ids == (*head.ids, *kept, tok.sep_id)[:max_len], n
            assert row.state_tokens_kept == len(kept) and row.markers == head.markers
            if len(head.ids) + 1 <= max_len:
                assert row.ids[-1] == tok.sep_id, n
            longest = max(longest, len(row.ids))
            full_rows += len(row.ids) == max_len
    assert longest == max_len and full_rows > 100  # the budget is reached ...
    assert past_the_row >= 1 and refused >= 1  # ... by heads that fill the row and by ones that cannot fit


def test_the_head_cache_gives_the_built_head_and_stays_bounded(tok):
    from laya.encoder.rows import HeadCache

    heads = HeadCache(tok, 96, size=2)
    a, b, c = (choice({"billing": None, "sales": None}, instructions=f"Which team {i}?") for i in range(3))
    assert heads(a) == build_head(tok, a, 96)
    assert heads(a) is heads(a)  # built once
    renamed = parse_question("other-id", {"type": "choice", "instructions": "Which team 0?",
                                          "criteria": {"billing": None, "sales": None}})
    assert heads(renamed) is heads(a)  # by what it is built from, not by the question's id
    other_options = choice({"billing": None, "support": None}, instructions="Which team 0?")
    assert heads(other_options) == build_head(tok, other_options, 96) != heads(a)
    heads(b), heads(c)
    assert len(heads._heads) == 2  # least recently used out first
    assert heads(c) == build_head(tok, c, 96)
