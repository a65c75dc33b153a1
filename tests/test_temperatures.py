"""Bucket temperatures for every question type, with bucket values that differ from the type values
(when they are equal, a bucket that is never applied cannot be seen), down to the model's answers."""

from __future__ import annotations

import numpy as np
import pytest

from laya.calibration.temperatures import T_MAX, T_MIN, Temperatures, bucket_of
from laya.testing.checkpoints import DEFAULT_BUCKETS, DEFAULT_TEMPERATURE

PER_TYPE = (1.3, 0.9, 1.6)  # choice, score, noul
# every (type, bucket) its own value, none equal to a type's
BY_BUCKET = {f"{qtype}:{bucket}": 2.0 + 0.25 * i + 0.05 * j
             for i, qtype in enumerate(("choice", "score", "noul"))
             for j, bucket in enumerate(("2", "3-5", "6-10", "11+"))}
SIZES = {"2": (1, 2), "3-5": (3, 4, 5), "6-10": (6, 9, 10), "11+": (11, 16, 255)}


def test_the_values_under_test_tell_buckets_from_types():
    assert len(set(BY_BUCKET.values())) == len(BY_BUCKET)
    assert not set(BY_BUCKET.values()) & set(PER_TYPE)


@pytest.mark.parametrize("qtype", ["choice", "score", "noul"])
def test_every_type_reads_its_own_bucket(qtype):
    temps = Temperatures(per_type=PER_TYPE, by_bucket=dict(BY_BUCKET))
    for bucket, sizes in SIZES.items():
        for k in sizes:
            assert bucket_of(k) == bucket
            assert temps.for_question(qtype, k) == BY_BUCKET[f"{qtype}:{bucket}"], (qtype, k)


@pytest.mark.parametrize(("qtype", "index"), [("choice", 0), ("score", 1), ("noul", 2)])
def test_without_its_bucket_a_question_reads_its_types_value(qtype, index):
    others = {k: v for k, v in BY_BUCKET.items() if not k.startswith(qtype + ":")}
    temps = Temperatures(per_type=PER_TYPE, by_bucket=others)
    for k in (2, 4, 8, 30):
        assert temps.for_question(qtype, k) == PER_TYPE[index]
    only_small = Temperatures(per_type=PER_TYPE, by_bucket={f"{qtype}:3-5": 3.3})
    assert only_small.for_question(qtype, 3) == 3.3 and only_small.for_question(qtype, 6) == PER_TYPE[index]


def test_loaded_buckets_are_clamped_for_every_type():
    raw = {"choice:11+": 0.1006, "score:6-10": 9.0, "noul:2": 0.2, "score:3-5": 1.75}
    with pytest.warns(RuntimeWarning, match="score:6-10=9.0 -> 5"):
        temps = Temperatures.from_raw([7.0, 0.9, 0.01], raw, source="cfg")
    assert temps.per_type == (T_MAX, 0.9, T_MIN)
    assert temps.for_question("choice", 40) == T_MIN
    assert temps.for_question("score", 7) == T_MAX
    assert temps.for_question("noul", 2) == T_MIN
    assert temps.for_question("score", 4) == 1.75
    assert temps.for_question("score", 2) == 0.9  # no score:2 bucket


def softmax(z: np.ndarray, t: float) -> np.ndarray:
    e = np.exp((z - z.max()) / t)
    return e / e.sum()


def test_the_models_answers_are_tempered_by_bucket(model):
    """The generated checkpoint ships buckets unlike its type values (score:3-5 1.1 vs 0.9, noul:2 2.0
    vs 1.6, choice:3-5 1.7 vs 1.3, choice:11+ clamped to 0.5): each answer is softmax(logits / T) with
    the bucket's T, and measurably not the type's."""
    assert list(DEFAULT_TEMPERATURE) == [1.3, 0.9, 1.6]
    questions = {
        "c4": {"type": "choice", "instructions": "Team?", "criteria": ["billing", "sales", "support", "legal"]},
        "c12": {"type": "choice", "instructions": "Topic?", "criteria": [f"topic {i}" for i in range(12)]},
        "s3": {"type": "score", "instructions": "Anger?", "criteria": ["calm", "annoyed", "furious"]},
        "s7": {"type": "score", "instructions": "Level?", "criteria": [f"level {i}" for i in range(7)]},
        "n": {"type": "noul", "instructions": "Urgent?"},
    }
    want_t = {"c4": DEFAULT_BUCKETS["choice:3-5"], "c12": 0.5, "s3": DEFAULT_BUCKETS["score:3-5"],
              "s7": DEFAULT_TEMPERATURE[1], "n": DEFAULT_BUCKETS["noul:2"]}
    type_t = {"c4": 1.3, "c12": 1.3, "s3": 0.9, "s7": 0.9, "n": 1.6}
    state = "I was charged twice for my order and I want a refund today."
    prepared = model.prepare([state], questions)
    logits, _ = model.run(prepared.rows[0])
    out = model.predict(state, questions)["answers"]
    for (qid, answer), z in zip(out.items(), logits):
        z = np.asarray(z, dtype=np.float64)
        got = np.array([1 - answer["noul"], answer["noul"]] if qid == "n" else list(answer["probabilities"].values()))
        np.testing.assert_allclose(got, softmax(z, want_t[qid]), rtol=0, atol=1e-6, err_msg=qid)
        if want_t[qid] != type_t[qid]:
            assert np.max(np.abs(got - softmax(z, type_t[qid]))) > 1e-3, qid
