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
# llama.cpp (the [llama] extra) on x86-64 Linux: built with runtime CPU dispatch, so the wheel stays
# portable and AVX-512 and AMX machines still get their kernels. The CPU backend is compiled once per
# instruction set (libggml-cpu-<variant>.so in llama_cpp/lib) and ggml loads the variant that scores
# best on the processor when laya loads a model (laya/decide/llama.py, load_backends). Of the 14
# variants GGML_CPU_ALL_VARIANTS knows, scripts/llama-cpu-variants.patch lets us build only
# LLAMA_CPU_VARIANTS (each 1.5-2 CPU-minutes of compile, ~6-8% of the build): AVX2 (haswell: also Zen 1-3),
# AVX-512 (skylakex; icelake: +VBMI/VNNI, also Zen 4-5) and AMX (sapphirerapids). No AVX2, no backend:
# the same floor as the AVX2 build before it. The wheel is kept (LAYA_WHEELS), so later setups are quick.
LLAMA_CPP_PYTHON="0.3.36"
LLAMA_CPU_VARIANTS="${LLAMA_CPU_VARIANTS:-haswell;skylakex;icelake;sapphirerapids}"
if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] && [ -z "${CMAKE_ARGS:-}" ]; then
    lib_dir=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")/llama_cpp/lib
    wanted=$(echo "$LLAMA_CPU_VARIANTS" | tr ';' '\n' | sed 's|^|libggml-cpu-|; s|$|.so|' | sort | tr '\n' ' ')
    have=$(cd "$lib_dir" 2>/dev/null && ls libggml-cpu-*.so 2>/dev/null | sort | tr '\n' ' ' || true)
    version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null || true)
    # The build is named by its version, its variants and the patches it carries (scripts/llama-*.patch),
    # so a changed patch builds a new wheel and an installed one without it is replaced.
    build="$LLAMA_CPP_PYTHON-$(echo "$LLAMA_CPU_VARIANTS" | tr ';' '-')-$(cat scripts/llama-*.patch | sha256sum | cut -c1-12)"
    built=$(cat "$lib_dir/laya-build" 2>/dev/null || true)
    if [ "$have" != "$wanted" ] || [ "$version" != "$LLAMA_CPP_PYTHON" ] || [ "$built" != "$build" ]; then
        wheels="${LAYA_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/laya/wheels}/llama-cpp-python-$build"
        if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
            echo "setup: building llama-cpp-python $LLAMA_CPP_PYTHON with CPU variants $LLAMA_CPU_VARIANTS (minutes)"
            src=$(mktemp -d)
            .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$src" \
                "llama-cpp-python==$LLAMA_CPP_PYTHON"
            tar -xzf "$src/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$src"
            for p in scripts/llama-*.patch; do
                patch -s -p1 -d "$src/llama_cpp_python-$LLAMA_CPP_PYTHON" < "$p"
            done
            CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
            CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
-DGGML_CPU_VARIANTS=$LLAMA_CPU_VARIANTS -DCMAKE_INSTALL_BINDIR=llama_cpp/lib" \
                .venv/bin/pip wheel -q --disable-pip-version-check --no-deps -w "$src/wheel" \
                "$src/llama_cpp_python-$LLAMA_CPP_PYTHON"
            mkdir -p "$wheels" && mv "$src"/wheel/llama_cpp_python-*.whl "$wheels"/
            rm -rf "$src"
        fi
        .venv/bin/pip uninstall -q -y llama-cpp-python >/dev/null 2>&1 || true
        .venv/bin/pip install -q --disable-pip-version-check "$wheels"/llama_cpp_python-*.whl
        echo "$build" > "$lib_dir/laya-build"
    fi
fi
echo "setup: installing laya with its extras (llama-cpp-python compiles llama.cpp on first install: minutes)"
# Elsewhere (or with CMAKE_ARGS set) llama-cpp-python builds as before: a portable llama.cpp; pip
# caches the wheel, so later setups are quick.
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" \
    .venv/bin/pip install -q --disable-pip-version-check -e ".[torch,onnx,export,mlx,coreml,calibrate,train,serve,ray,llama,mcp,dev]"
echo "setup: ready (.venv)"
