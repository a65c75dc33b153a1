"""The MLX runtime beyond parity: bundles, precision rules, padding buckets, no torch at inference."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import BUNDLE_QUESTIONS, GOLDEN, load_quiet, need, predict_without_torch

need("mlx.core", "the [mlx] extra is not installed")
pytestmark = pytest.mark.mlx

import laya  # noqa: E402
from laya.encoder.checkpoint import load_checkpoint  # noqa: E402
from laya.encoder.export.mlx import export_bundle  # noqa: E402
from laya.encoder.runtimes.mlx import MlxRuntime, mlx_length  # noqa: E402
from laya.errors import CheckpointError  # noqa: E402

SOURCE = GOLDEN / "checkpoints" / "mmbert"
QUESTIONS = BUNDLE_QUESTIONS


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlx-bundles")
    checkpoint = load_checkpoint(SOURCE)
    for precision in ("fp16", "fp32"):
        export_bundle(checkpoint, root / precision, precision=precision)
    export_bundle(checkpoint, root / "again", precision="fp16")
    return root


def test_padding_lengths_are_few():
    assert [mlx_length(n) for n in (1, 32, 33, 96, 128, 129, 192, 193, 256, 257, 500, 513)] == \
        [32, 32, 64, 96, 128, 192, 192, 256, 256, 384, 512, 768]
    assert len({mlx_length(n) for n in range(1, 8193)}) == 4 + 2 * 6  # up to 8192: 16 compiled lengths at most


def test_bundle_contents_and_reproducibility(bundles):
    files = sorted(str(p.relative_to(bundles / "fp16")) for p in (bundles / "fp16").rglob("*") if p.is_file())
    assert files == ["encoder/config.json", "manifest.json", "rl_agent_config.json", "tokenizer/tokenizer.json",
                     "tokenizer/tokenizer_config.json", "weights.safetensors"]
    manifest = json.loads((bundles / "fp16" / "manifest.json").read_text())
    assert manifest["kind"] == "mlx" and manifest["precision"] == "fp16"
    assert manifest["source_sha256"] == load_checkpoint(SOURCE).sha256
    for path in (bundles / "fp16").rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (bundles / "again" / path.relative_to(bundles / "fp16")).read_bytes(), path


@pytest.mark.parametrize("precision, bound", [("fp32", 1e-4), ("fp16", 0.02)])
def test_bundles_answer_like_the_reference(bundles, precision, bound):
    reference = load_quiet(SOURCE, "torch").predict("refund please, it is late", QUESTIONS)
    model = load_quiet(bundles / precision, None)
    assert model.runtime.name == "mlx" and model.runtime.precision == precision
    got = model.predict("refund please, it is late", QUESTIONS)
    for key, p in reference["answers"]["t"]["probabilities"].items():
        assert got["answers"]["t"]["probabilities"][key] == pytest.approx(p, abs=bound)
    assert got["answers"]["u"]["noul"] == pytest.approx(reference["answers"]["u"]["noul"], abs=bound)


def test_precision_rules(bundles):
    with pytest.raises(CheckpointError, match="fp16 MLX bundle cannot run in fp32"):
        load_quiet(bundles / "fp16", None, precision="fp32")
    with pytest.raises(CheckpointError, match="MLX precision must be one of"):
        load_quiet(SOURCE, "mlx", precision="bf16")
    # a checkpoint defaults to fp16 on Apple silicon only
    expected = "fp16" if sys.platform == "darwin" else "fp32"
    assert load_quiet(SOURCE, "mlx").runtime.precision == expected


def test_compiled_and_eager_graphs_agree():
    checkpoint = load_checkpoint(SOURCE)
    model = load_quiet(SOURCE, "mlx", precision="fp32")
    prepared = model.prepare(["a short state", "a longer state " * 30], QUESTIONS)
    rows = [r for per_state in prepared.rows for r in per_state]
    from laya.encoder.batch import collate

    batch = collate(rows, checkpoint.tokenizer.pad_id)
    compiled = MlxRuntime(checkpoint, precision="fp32").forward(batch)
    eager = MlxRuntime(checkpoint, precision="fp32", compile=False).forward(batch)
    for a, b in zip(compiled, eager):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_far_padding_changes_nothing(precision):
    """A padded query farther than the local window from every real key sees only masked keys. In fp16 a
    mask of -1e9 is -inf, such a softmax row is NaN, and 0 * NaN would leak it into the real rows."""
    from laya.encoder.batch import collate

    checkpoint = load_checkpoint(SOURCE)
    runtime = MlxRuntime(checkpoint, precision=precision)
    model = load_quiet(SOURCE, "mlx", precision=precision)
    rows = [r for per_state in model.prepare(["refund please"], QUESTIONS).rows for r in per_state]
    tight = runtime.forward(collate(rows, checkpoint.tokenizer.pad_id))
    far = runtime.forward(collate(rows, checkpoint.tokenizer.pad_id, length=300))  # run at 384
    for a, b in zip(tight, far):
        assert np.isfinite(b).all()
        np.testing.assert_allclose(a, b, atol=1e-4 if precision == "fp32" else 0.05)


def test_bundle_runs_without_torch(bundles):
    assert predict_without_torch(bundles / "fp32", "refund please", QUESTIONS)["answers"]["u"]["type"] == "noul"


def test_a_bundle_of_another_kind_is_refused(bundles):
    with pytest.raises(CheckpointError, match="is a mlx bundle"):
        laya.load(bundles / "fp32", runtime="onnx")
