"""Core ML bundles verified without a Mac: what the saved specs declare, how rows are routed, and the
numpy MIL evaluator's own behaviour. (Parity of the torch graphs and of the saved programs against
the reference is in the shared parity suite: targets coreml-torch-fp32 and coreml-mil-fp16.)"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import BUNDLE_QUESTIONS, GOLDEN, load_quiet, need

need("coremltools", "the [coreml] extra is not installed")

from laya.encoder.checkpoint import load_checkpoint  # noqa: E402
from laya.encoder.export.coreml import ane_buckets, general_lengths, runtime_inputs  # noqa: E402
from laya.encoder.runtimes import mil  # noqa: E402
from laya.errors import RuntimeUnavailable  # noqa: E402

SOURCE = GOLDEN / "checkpoints" / "mmbert"
QUESTIONS = BUNDLE_QUESTIONS


@pytest.fixture(scope="module")
def bundle():
    """The bundle a load converts on first use (fp16, with the Neural Engine buckets) into the session's
    cache: the parity suite's coreml-mil-fp16 target loads the same checkpoint, so its conversion (tens of
    seconds) is made once for both."""
    return runtime_inputs(load_checkpoint(SOURCE), {"executor": "mil"})["bundle"]


def spec_of(path):
    return mil.Program(path).spec


def _shape(feature):
    return list(feature.type.multiArrayType.shape)


def test_manifest_lists_every_program(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    checkpoint = load_checkpoint(SOURCE)
    assert manifest["kind"] == "coreml" and manifest["precision"] == "fp16"
    assert manifest["general"]["lengths"] == general_lengths(256) == [16, 32, 64, 96, 128, 192, 256]
    buckets = manifest["ane"]["buckets"]
    assert buckets == [{"length": n, "program": f"ane-L{n}.mlpackage"} for n in ane_buckets(checkpoint)]
    assert [b["length"] for b in buckets] == [64, 96, 128, 256]  # multilingual: 256 too
    for name in [manifest["general"]["program"], *(b["program"] for b in buckets)]:
        assert (bundle / name / "Data/com.apple.CoreML/model.mlmodel").is_file()


def test_general_spec_has_the_inputs_the_runtime_feeds(bundle):
    spec = spec_of(bundle / "general.mlpackage")
    inputs = {f.name: f for f in spec.description.input}
    assert list(inputs) == ["input_ids", "n_tokens", "marker_pos", "qtype"]
    ids = inputs["input_ids"].type.multiArrayType
    assert ids.dataType == ids.INT32
    assert [list(s.shape) for s in ids.enumeratedShapes.shapes] == [[1, n] for n in general_lengths(256)]
    markers = inputs["marker_pos"].type.multiArrayType.shapeRange.sizeRanges
    assert (markers[1].lowerBound, markers[1].upperBound) == (2, 255)
    assert [o.name for o in spec.description.output] == ["logits", "act_logits"]
    assert spec.mlProgram.functions["main"].opset == "CoreML7"


def test_neural_engine_specs_are_channel_first_fixed_fp16(bundle):
    d = load_checkpoint(SOURCE).encoder.hidden_size
    for length in (64, 96, 128, 256):
        spec = spec_of(bundle / f"ane-L{length}.mlpackage")
        inputs = {f.name: f for f in spec.description.input}
        assert {n: _shape(f) for n, f in inputs.items()} == {
            "embeddings": [1, d, 1, length], "type_vector": [1, d, 1, 1], "global_mask": [1, 1, 1, length],
            "local_mask": [1, 1, length, length], "markers": [1, length, 32]}
        for feature in [*spec.description.input, *spec.description.output]:
            array = feature.type.multiArrayType
            assert array.dataType == array.FLOAT16, feature.name
        assert {o.name: _shape(o) for o in spec.description.output} == {"logits": [1, 32], "cls": [1, d]}
        program = mil.Program(bundle / f"ane-L{length}.mlpackage")
        # every Linear became a 1x1 convolution: no linear/matmul over weights remains
        assert "linear" not in program.operation_types and "conv" in program.operation_types


def test_rows_go_to_the_smallest_bucket_that_fits_else_to_the_general_program(bundle):
    model = load_quiet(bundle, None, executor="mil")
    runtime = model.runtime
    assert runtime.bucket_for(10, 2) == 64 and runtime.bucket_for(64, 2) == 64 and runtime.bucket_for(65, 2) == 96
    assert runtime.bucket_for(200, 32) == 256 and runtime.bucket_for(200, 33) is None
    many = {"c": {"type": "choice", "instructions": "pick", "criteria": [f"option {i}" for i in range(40)]}}
    model.predict("short", QUESTIONS)
    assert runtime.routed == {"ane": 2, "general": 0}
    model.predict("short", many)  # 40 options > 32 slots: the general program, not a truncated question
    assert runtime.routed["general"] == 1
    ane_answer = model.predict("refund please", QUESTIONS)
    general_only = load_quiet(bundle, None, executor="mil", ane=False)
    general_answer = general_only.predict("refund please", QUESTIONS)
    assert general_only.runtime.routed == {"ane": 0, "general": 2}
    for key, p in general_answer["answers"]["t"]["probabilities"].items():
        assert ane_answer["answers"]["t"]["probabilities"][key] == pytest.approx(p, abs=0.02)


@pytest.mark.skipif(sys.platform == "darwin", reason="platform-bound: this checks the refusal off macOS, and on macOS "
                                                  "Core ML predicts (the coreml-fp16 parity target runs it)")
def test_core_ml_itself_is_refused_off_macos_naming_the_platform(bundle):
    import platform

    with pytest.raises(RuntimeUnavailable, match=f"only on macOS.*this is {platform.system()}"):
        load_quiet(bundle, None)


def test_the_general_program_is_never_put_on_the_neural_engine(bundle):
    for units in ("all", "cpu_and_ne"):
        with pytest.raises(RuntimeUnavailable, match="wrong answers on the Neural Engine"):
            load_quiet(bundle, None, executor="mil", compute_units=units)


def test_the_evaluator_names_an_operation_it_does_not_know(bundle, monkeypatch):
    program = mil.Program(bundle / "ane-L64.mlpackage")
    monkeypatch.delitem(mil.OPS, "softmax")
    d = load_checkpoint(SOURCE).encoder.hidden_size
    feeds = {"embeddings": np.zeros((1, d, 1, 64)), "type_vector": np.zeros((1, d, 1, 1)),
             "global_mask": np.zeros((1, 1, 1, 64)), "local_mask": np.zeros((1, 1, 64, 64)),
             "markers": np.zeros((1, 64, 32))}
    with pytest.raises(mil.UnknownOperation, match="operation 'softmax'"):
        program.run(feeds)


@pytest.fixture(scope="module")
def fp32_general(tmp_path_factory):
    from laya.encoder.export.coreml import convert_general

    path = tmp_path_factory.mktemp("coreml32") / "general.mlpackage"
    convert_general(load_checkpoint(SOURCE), path, "fp32")
    return path


def test_the_fp32_general_program_matches_its_torch_graph(fp32_general):
    import torch

    from laya.encoder.export.coreml import general_module

    program, module = mil.Program(fp32_general), general_module(load_checkpoint(SOURCE))
    rng = np.random.default_rng(0)
    for n, length, k in [(20, 32, 3), (100, 128, 40), (256, 256, 2)]:
        ids = np.zeros((1, length), np.int32)
        ids[0, :n] = rng.integers(5, 700, n)
        feeds = {"input_ids": ids, "n_tokens": np.array([n], np.int32), "qtype": np.array([k % 3], np.int32),
                 "marker_pos": np.sort(rng.choice(np.arange(1, n), k, replace=False))[None].astype(np.int32)}
        got = program.run(feeds)
        with torch.no_grad():
            want = module(*[torch.from_numpy(feeds[name]) for name in ("input_ids", "n_tokens", "marker_pos", "qtype")])
        np.testing.assert_allclose(got["logits"], want[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(got["act_logits"], want[1].numpy(), atol=1e-4)


def test_the_evaluator_covers_exactly_what_the_bundles_use(bundle, fp32_general):
    used = set()
    for path in [*bundle.glob("*.mlpackage"), fp32_general]:
        used |= mil.Program(path).operation_types
    assert used - {"const"} == set(mil.OPS)


def test_compact_mode_is_opt_in_reported_and_fits_rows_to_the_neural_engine():
    """Off by default (a long row goes to the general program, exact); with compact=True it is
    shortened to the largest bucket, descriptions first, then the state, and x_usage says what went."""
    source = GOLDEN / "checkpoints" / "modernbert"  # buckets 64, 96, 128 in a 256-token row
    exact = load_quiet(source, "coreml", executor="torch")
    compact = load_quiet(source, "coreml", executor="torch", compact=True)
    assert exact.runtime.compact() is None and compact.runtime.compact().length == 128
    long_state = "the customer was charged twice and wants the money back today " * 12
    route = {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "payments, refunds and invoices " * 3, "sales": "plans and prices " * 3}}
    questions = {"t": route, "u": {"type": "noul", "instructions": "Urgent?"}}
    plain = exact.predict(long_state, questions)
    assert exact.runtime.routed == {"ane": 0, "general": 2} and "compacted" not in plain["x_usage"]
    short = compact.predict(long_state, questions)
    assert compact.runtime.routed == {"ane": 2, "general": 0}
    dropped = short["x_usage"]["compacted"]
    assert dropped["t"]["option_descriptions"] == 2 and dropped["t"]["state_tokens"] > 0
    assert "option_descriptions" not in dropped["u"] and dropped["u"]["state_tokens"] > 0
    assert set(short["answers"]["t"]["probabilities"]) == {"billing", "sales"}
    # a row that fits is not touched
    fits = compact.predict("short", {"u": {"type": "noul", "instructions": "Urgent?"}})
    assert "compacted" not in fits["x_usage"]
    assert fits["answers"] == exact.predict("short", {"u": {"type": "noul", "instructions": "Urgent?"}})["answers"]
