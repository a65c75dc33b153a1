"""ONNX bundles: what they hold, that they are reproducible, run without torch, and gate int8."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import BUNDLE_QUESTIONS, GOLDEN, load_quiet, need, predict_without_torch

need("onnxruntime", "the [onnx] extra is not installed")

import laya  # noqa: E402
from laya.encoder.checkpoint import load_checkpoint  # noqa: E402
from laya.encoder.export.onnx import export_bundle  # noqa: E402
from laya.encoder.gate import GateFailed  # noqa: E402
from laya.errors import CheckpointError  # noqa: E402

SOURCE = GOLDEN / "checkpoints" / "mmbert"
QUESTIONS = BUNDLE_QUESTIONS


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    checkpoint = load_checkpoint(SOURCE)
    export_bundle(checkpoint, root / "fp32")
    export_bundle(checkpoint, root / "again")
    export_bundle(checkpoint, root / "int8", int8=True)
    return root


def test_bundle_contents_and_manifest(bundles):
    files = sorted(str(p.relative_to(bundles / "fp32")) for p in (bundles / "fp32").rglob("*") if p.is_file())
    assert files == ["encoder/config.json", "manifest.json", "model.onnx", "rl_agent_config.json",
                     "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    manifest = json.loads((bundles / "fp32" / "manifest.json").read_text())
    assert manifest["format"] == "laya-bundle" and manifest["format_version"] == 1 and manifest["kind"] == "onnx"
    assert manifest["precision"] == "fp32" and manifest["opset"] == 18
    assert manifest["special_ids"] == {"cls": 2, "sep": 1, "mask": 4, "pad": 0}
    assert (manifest["max_len"], manifest["head_max_len"]) == (256, 96)
    assert manifest["source_sha256"] == load_checkpoint(SOURCE).sha256
    gate = json.loads((bundles / "int8" / "manifest.json").read_text())["gate"]
    assert {"max_dp", "argmax_agreement", "batch_dependence_max_dp", "passed", "rows"} <= set(gate)


def test_the_graph_runs_fused_kernels_and_splits_no_product(bundles):
    """What makes the forward pass cheap (GRAPH_REVISION 6): RoPE, GeGLU's GELU and attention are one
    onnxruntime kernel each, and no product is split along its last axis (a strided copy as dear as
    a matmul at these sizes). A graph that lost one of them still answers right, only slower."""
    import collections

    import onnx

    checkpoint = load_checkpoint(SOURCE)
    layers, head_layers = checkpoint.encoder.num_hidden_layers, checkpoint.config.head_layers
    graph = onnx.load(str(bundles / "fp32" / "model.onnx")).graph
    ops = collections.Counter(node.op_type for node in graph.node)
    assert ops["RotaryEmbedding"] == 2 * layers  # queries and keys of every layer
    assert ops["Gelu"] == layers  # GeGLU; the scorer's and act head's GELU read a few vectors (Erf)
    assert ops["MultiHeadAttention"] == layers + head_layers
    assert ops["Split"] == 0 and ops["Neg"] <= 1  # no rotate-half left (one Neg: the act head's entropy)
    manifest = json.loads((bundles / "fp32" / "manifest.json").read_text())
    assert manifest["split_products"] == 2 * layers + head_layers  # Wqkv and Wi; the head's packed projection
    int8 = onnx.load(str(bundles / "int8" / "model.onnx")).graph
    assert collections.Counter(node.op_type for node in int8.node)["RotaryEmbedding"] == 2 * layers


def test_exporting_twice_gives_the_same_bytes(bundles):
    for path in (bundles / "fp32").rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (bundles / "again" / path.relative_to(bundles / "fp32")).read_bytes(), path


def test_bundle_runs_without_torch(bundles):
    expected = load_quiet(SOURCE, "torch").predict("refund please", QUESTIONS)
    got = predict_without_torch(bundles / "fp32", "refund please", QUESTIONS)
    assert got["usage"] == expected["usage"]
    for key, p in expected["answers"]["t"]["probabilities"].items():
        assert got["answers"]["t"]["probabilities"][key] == pytest.approx(p, abs=1e-4)


def test_int8_bundle_with_a_failed_gate_is_refused_unless_forced(bundles, tmp_path):
    failed = tmp_path / "failed"
    shutil.copytree(bundles / "int8", failed)
    manifest = json.loads((failed / "manifest.json").read_text())
    manifest["gate"]["passed"] = False
    (failed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GateFailed, match="failed its accuracy gate"):
        laya.load(failed)
    assert load_quiet(failed, None, force=True).predict("x", QUESTIONS)["answers"]["u"]["type"] == "noul"


def test_int8_rows_do_not_depend_on_their_company(bundles):
    model = load_quiet(bundles / "int8", None, force=True)
    alone = model.predict("refund please", {"t": QUESTIONS["t"]})["answers"]["t"]
    crowd = model.predict_batch(["something much longer " * 20, "refund please"], QUESTIONS)[1]["answers"]["t"]
    assert alone == crowd


def test_a_bundle_is_not_a_torch_checkpoint(bundles):
    with pytest.raises(CheckpointError, match="is a onnx bundle"):
        laya.load(bundles / "fp32", runtime="torch")


def test_the_thread_pool_stops_spinning_when_a_forward_pass_ends(bundles):
    """By default ONNX Runtime's pool threads spin on for tens of milliseconds after a run: a whole
    core taken from the server, the client beside it and the next request's tokenising. Counted in
    CPU time (not wall time), so a slow or busy machine can only make a spinning pool look idler."""
    import time

    model = load_quiet(bundles / "fp32", "onnx", threads=2)
    model.predict("refund please", QUESTIONS)
    time.sleep(0.3)  # what ran before in this process settles
    model.predict("refund please", QUESTIONS)
    before = time.process_time()
    time.sleep(0.1)
    assert time.process_time() - before < 0.02  # spinning, the pool takes 0.05-0.1 CPU-s of these 0.1 s


def test_without_the_exporter_onnx_is_one_clear_refusal_and_auto_measures_past_it(monkeypatch, tmp_path):
    """ONNX Runtime installed without the [export] extra (a serving image): a checkpoint that has no
    exported bundle yet cannot run on onnx, said in one error naming the missing package and the extra;
    auto's measurement (`laya prepare`) skips the candidate, saying why, instead of failing."""
    from laya.encoder import choice
    from laya.errors import RuntimeUnavailable

    monkeypatch.setitem(__import__("sys").modules, "onnxscript", None)
    monkeypatch.setenv("LAYA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeUnavailable, match=r"exporting needs 'onnxscript'.*laya-runtime\[export\]"):
        laya.load(GOLDEN / "checkpoints" / "modernbert", runtime="onnx")
    monkeypatch.setattr(choice, "measured_candidates", lambda machine, exact=False: [  # the reference and onnx only
        choice.Candidate("torch", {"precision": "fp32"}, ""), choice.Candidate("onnx", {"precision": "fp32"}, "")])
    model = laya.load(GOLDEN / "checkpoints" / "modernbert", runtime="auto", measure=True, background=False)
    assert model.runtime.name != "onnx"
    assert "onnxscript" in model.choice.measurement()["not_timed"]["onnx fp32"]
