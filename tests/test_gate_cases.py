"""The precision gate reads what callers send (laya/encoder/gate_cases.py) and keeps headroom inside the
envelope it promises (laya/encoder/gate.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_quiet

from laya.encoder import gate
from laya.encoder.gate_cases import KINDS


@pytest.fixture(scope="module")
def rows(checkpoint_dir):
    checkpoint = load_quiet(checkpoint_dir, "torch").checkpoint
    return checkpoint, gate.gate_rows(checkpoint)


def test_every_input_kind_is_among_the_gate_rows(rows):
    checkpoint, triples = rows
    assert {kind for _, _, kind in triples} == set(KINDS)
    tok, cfg = checkpoint.tokenizer, checkpoint.config
    by_kind = {kind: [(q, r) for q, r, k in triples if k == kind] for kind in KINDS}
    # states cut at the row's end, and rows the full length of the row
    assert all(r.state_tokens_dropped > 0 for _, r in by_kind["cut_at_max_len"])
    assert max(len(r.ids) for _, r, _ in triples) == cfg.max_len
    # from 2 options up to as many as the row holds (past a tournament's group of 16), described or not
    counts = [q.n_options for q, _ in by_kind["many_options"]]
    assert min(q.n_options for q, _, _ in triples) == 2 and max(counts) > 16
    assert any(all(d is None for d in q.descriptions) for q, _ in by_kind["many_options"])
    assert any(all(d is None for d in q.descriptions) for q, _ in by_kind["labels_only"] if q.qtype == "choice")
    # special tokens typed in the text reach the row as those tokens (the mask string alone is blanked)
    typed = [r for _, r in by_kind["special_tokens"]]
    assert any(tok.sep_id in r.ids[r.head_tokens:-1] for r in typed)
    assert all(tok.mask_id not in r.ids[r.head_tokens:] for r in typed)
    # every question type, several questions over one state, and each state shape
    assert {q.qtype for q, _, _ in triples} == {"choice", "score", "noul"}
    assert len(by_kind["several_questions"]) >= 6
    assert all(r.state_tokens > 0 for _, r in by_kind["non_latin"] + by_kind["json_object"]
               + by_kind["conversation"])


def test_the_gate_rows_are_the_same_at_every_call(rows):
    checkpoint, triples = rows
    again = gate.gate_rows(checkpoint)
    assert [(k, r.ids) for _, r, k in again] == [(k, r.ids) for _, r, k in triples]


def _moved(dp: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    reference = [np.array([0.5, 0.3, 0.2]), np.array([0.9, 0.1])]
    return reference, [reference[0] + np.array([-dp, dp, 0.0]), reference[1]]


def test_the_gate_keeps_headroom_inside_the_envelope():
    reference, alone = _moved(0.04)  # inside the promised 0.05, outside the gate's bound
    record = gate.judge(reference, alone, alone, "bf16", kinds=["text", "json_object"])
    assert not record["passed"]
    assert record["bounds"]["max_dp"] == pytest.approx(0.03) and record["envelope"]["max_dp"] == 0.05
    assert record["max_dp_by_kind"] == {"json_object": 0.0, "text": pytest.approx(0.04)}
    reference, alone = _moved(0.02)
    assert gate.judge(reference, alone, alone, "bf16")["passed"]


def test_the_record_reports_the_golden_cases_without_judging_them(checkpoint_dir, monkeypatch):
    model = load_quiet(checkpoint_dir, "torch")
    checkpoint, forward = model.checkpoint, model.runtime.forward
    seen = len(gate.held_out_rows(checkpoint))
    assert seen > 20  # the golden cases that fit in one row
    record = gate.measure(checkpoint, forward, forward, "bf16")
    assert record["held_out"] == {"source": "the golden cases", "rows": seen, "max_dp": pytest.approx(0, abs=1e-4),
                                  "flipped_margin": 0.0}
    assert record["passed"] and set(record["max_dp_by_kind"]) == set(KINDS)
    # a candidate that drifts only on inputs the gate's rows never hold: reported, not judged
    held = {row.ids for _, row, _ in gate.held_out_rows(checkpoint)} - {row.ids for _, row, _ in
                                                                          gate.gate_rows(checkpoint)}

    def drifting(batch):
        logits, act = forward(batch)
        for i, ids in enumerate(batch.input_ids):
            if tuple(int(t) for t in ids[: int(batch.attention_mask[i].sum())]) in held:
                logits[i, 0] += 0.5
        return logits, act

    record = gate.measure(checkpoint, forward, drifting, "bf16")
    assert record["passed"] and record["max_dp"] < 1e-4 and record["held_out"]["max_dp"] > 0.03
