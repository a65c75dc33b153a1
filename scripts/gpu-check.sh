#!/usr/bin/env bash
# The GPU checks of runtime="cuda" (issue 54), for a machine with one NVIDIA GPU and a preinstalled torch
# built for CUDA; no network. Run from the repository root:  bash scripts/gpu-check.sh
# In under 8 minutes on an H100: parity of fp32, bf16 and fp16 on the golden cases and on a generated
# full mmBERT-base-shape checkpoint against the CPU reference, graph replay against eager passes
# (scripts/gpu_parity.py, which exits non-zero on any failure, and so does this script), then the
# benchmark (benchmarks/gpu.py: the mmBERT-base and ModernBERT-large shapes, upstream laya on the same
# GPU where .venv-upstream was carried, else "not carried"), whose table is printed last. Its JSON
# record goes to $GPU_CHECK_JSON, else $OUT/gpu.json where $OUT is set, else /tmp/gpu-check.json.
#
# Python: the first of .venv/bin/python, python3 and python whose torch sees a CUDA device.
# laya runs from this checkout. Where laya's dependencies are not importable (tokenizers, safetensors,
# transformers for the CPU reference), laya is installed offline from a carried wheel:
#     dist/laya_runtime-*.whl   (python -m build --wheel; $LAYA_WHEEL_DIR to look elsewhere),
# with wheels of the missing dependencies in the same folder (pip install --no-index --find-links).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's laya, for the scripts below too

PY=""
for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
        PY=$candidate
        break
    fi
done
if [ -z "$PY" ]; then
    echo "gpu-check: no CUDA device that torch can use here (tried .venv/bin/python, python3, python):" \
        "this check needs an NVIDIA GPU and torch built for CUDA" >&2
    exit 2
fi
echo "gpu-check: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(), "- torch", torch.__version__,
"CUDA", torch.version.cuda)') with $PY"

if ! "$PY" -c 'import laya.encoder.runtimes.cuda, tokenizers, safetensors, transformers' >/dev/null 2>&1; then
    wheels=${LAYA_WHEEL_DIR:-dist}
    wheel=$(ls "$wheels"/laya_runtime-*.whl 2>/dev/null | sort | tail -n 1 || true)
    if [ -z "$wheel" ]; then
        echo "gpu-check: laya or its dependencies are not importable and no wheel is in $wheels/" \
            "(expected $wheels/laya_runtime-*.whl)" >&2
        exit 3
    fi
    echo "gpu-check: installing $wheel offline"
    "$PY" -m pip install --quiet --no-index --find-links "$wheels" "$wheel[torch]"
fi

"$PY" scripts/gpu_parity.py
echo "gpu-check: parity passed after $((SECONDS - started)) s; the benchmark follows"
json=${GPU_CHECK_JSON:-${OUT:+$OUT/gpu.json}}
"$PY" benchmarks/gpu.py --json "${json:-/tmp/gpu-check.json}"
