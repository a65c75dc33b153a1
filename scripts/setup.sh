#!/usr/bin/env bash
# Create (or update) the virtual environment at .venv with laya and every extra the tests need.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"laya needs Python 3.11 or newer; {sys.executable} is {sys.version.split()[0]}")
PY

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi
# torch is pinned to the CPU build first: a bare `torch` requirement can pull a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing torch (CPU)"
    .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0"
fi
echo "setup: installing laya with its extras (llama-cpp-python compiles llama.cpp on first install: minutes)"
# A portable llama.cpp build; pip caches the wheel, so later setups are quick.
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" \
    .venv/bin/pip install -q --disable-pip-version-check -e ".[torch,onnx,export,mlx,coreml,calibrate,train,serve,ray,llama,dev]"
echo "setup: ready (.venv)"
