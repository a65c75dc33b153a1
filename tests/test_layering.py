"""One direction of dependency: the exporters may import the runtimes (their gates run them); the
runtimes never import the exporters. Exporting on first use is decided by loading."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import load_quiet, need

from laya.encoder.checkpoint import load_checkpoint
from laya.errors import CheckpointError, RuntimeUnavailable

RUNTIME_MODULES = ["laya.encoder.runtimes.onnx", "laya.encoder.runtimes.coreml", "laya.encoder.runtimes.mlx",
                   "laya.encoder.runtimes.pytorch", "laya.encoder.runtimes.mil", "laya.encoder.runtimes"]


def test_no_runtime_module_imports_the_exporters():
    code = ("import importlib, json, sys\n"
            f"for name in {RUNTIME_MODULES!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('laya.encoder.export'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_a_runtime_given_a_bare_checkpoint_says_how_to_get_a_bundle(checkpoint_dir):
    need("onnxruntime", "the [onnx] extra is not installed")
    from laya.encoder.runtimes.onnx import OnnxRuntime

    with pytest.raises(CheckpointError, match="runs an exported bundle"):
        OnnxRuntime(load_checkpoint(checkpoint_dir))


def test_loading_exports_on_first_use_and_checks_options_first(checkpoint_dir, tmp_path):
    need("onnxruntime", "the [onnx] extra is not installed")
    with pytest.raises(RuntimeUnavailable, match="takes no option 'bogus'"):
        load_quiet(checkpoint_dir, "onnx", bogus=1, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir()), "an invalid option must be refused before anything is exported"
    model = load_quiet(checkpoint_dir, "onnx", cache_dir=tmp_path)
    assert model.runtime.folder.parent == tmp_path and (model.runtime.folder / "manifest.json").is_file()
    with pytest.raises(CheckpointError, match="cache_dir applies only"):
        load_quiet(checkpoint_dir, "torch", cache_dir=tmp_path)
