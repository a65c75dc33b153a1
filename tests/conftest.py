"""Shared fixtures: generated checkpoints (in the exact format, seconds to make) and loaded models."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from laya.models.testgen import TestCheckpointSpec, write_test_checkpoint

GOLDEN = Path(__file__).parent / "golden"


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


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", TestCheckpointSpec())


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
