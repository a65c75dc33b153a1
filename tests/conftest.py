"""Shared fixtures: generated checkpoints (in the exact format, seconds to make) and loaded models."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from laya.models.testgen import TestCheckpointSpec, write_test_checkpoint

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", TestCheckpointSpec())


@pytest.fixture(scope="session")
def mmbert_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("ck") / "tiny-mm", TestCheckpointSpec(flavour="mmbert"))


def load_quiet(path, runtime: str = "torch", **kwargs):
    """Load a generated checkpoint; its deliberate out-of-range temperature warns at every load."""
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
