"""The accuracy gates on the adversarial checkpoint (laya.models.testgen.ADVERSARIAL: attention that
depends on content, answers mid-range, where rounding moves answers most): each reduced precision the
runtimes offer passes its bound there, and the split of torch bf16 it replaced shows why it was
replaced. Accuracy only, so they run on every processor: without bf16 units torch emulates bf16
exactly (fp32 arithmetic on bf16-rounded values), and int8 matmuls are exact integer sums anywhere."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import need

from laya.encoder.checkpoint import load_checkpoint
from laya.encoder.runtimes import pytorch
from laya.gate import BOUNDS, gate_rows, measure


@pytest.fixture(scope="module")
def adversarial(adversarial_dir):
    checkpoint = load_checkpoint(adversarial_dir)
    return checkpoint, pytorch.TorchRuntime(checkpoint, precision="fp32")


def bf16(reference: pytorch.TorchRuntime, parts) -> pytorch.TorchRuntime:
    run = pytorch.TorchRuntime.__new__(pytorch.TorchRuntime)
    run.net, run.precision, run.gate = pytorch.cast_bf16(copy.deepcopy(reference.net), parts=parts), "bf16", None
    return run


def test_the_adversarial_checkpoint_answers_mid_range(adversarial):
    """What makes it hard: no answer is near-certain, so every change of a logit shows."""
    from laya.calibration.temperatures import Temperatures
    from laya.encoder.batch import collate
    from laya.heads.decode import probabilities

    checkpoint, reference = adversarial
    temps = Temperatures.from_raw(checkpoint.config.temperature, checkpoint.config.temperature_by_options,
                                  source="test")
    pairs = gate_rows(checkpoint)
    logits, _ = reference.forward(collate([row for _, row in pairs], checkpoint.tokenizer.pad_id))
    tops = [float(np.max(probabilities(logits[i, : len(row.markers)], temps.for_question(q.qtype, q.n_options))))
            for i, (q, row) in enumerate(pairs)]
    assert max(tops) < 0.8 and np.median(tops) < 0.6, tops


@pytest.mark.slow
def test_bf16_holds_its_bound_where_rounding_queries_and_keys_did_not(adversarial):
    checkpoint, reference = adversarial
    used = measure(checkpoint, reference.forward, bf16(reference, pytorch.BF16_PARTS_USED).forward, "bf16")
    assert used["passed"], used
    assert used["max_dp"] <= BOUNDS["bf16"].max_dp / 2, used
    # the split before it (every part of every layer but the first in bf16) moves answers at least twice
    # as far here; queries and keys alone in bf16 do most of that
    everything = measure(checkpoint, reference.forward, bf16(reference, set(pytorch.BF16_PARTS)).forward, "bf16")
    queries_keys = measure(checkpoint, reference.forward, bf16(reference, {"wq", "wk"}).forward, "bf16")
    assert everything["max_dp"] >= 1.5 * used["max_dp"], (everything, used)
    assert queries_keys["max_dp"] >= used["max_dp"], (queries_keys, used)


@pytest.mark.slow
def test_int8_holds_its_bound_on_the_adversarial_checkpoint(adversarial, tmp_path):
    need("onnxruntime", "the [onnx] extra is not installed")
    need("onnx", "the [export] extra is not installed")
    from laya.export.onnx import export_bundle

    checkpoint, _ = adversarial
    gate = export_bundle(checkpoint, tmp_path, int8=True)["gate"]
    assert gate["passed"], gate
    assert gate["batch_dependence_max_dp"] == 0.0
