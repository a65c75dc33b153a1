#!/usr/bin/env bash
# Set up .venv and run the checks: ruff, then the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The demo page is tested in Debian's Chromium (never a browser downloaded by a test tool).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test: installing Debian's chromium for the browser test"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "test: chromium not found; install Debian's chromium package to run the demo page test" >&2
    fi
fi
. scripts/mlx-blas.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -m "not mlx" "$@"
# MLX in its own process, with OpenBLAS preloaded (see scripts/mlx-blas.sh). One OpenBLAS thread: the
# reference runtime (torch) runs beside MLX there, and OpenBLAS's spinning threads slow it 10x on the
# test models. Exit code 5 means the arguments selected no MLX test, which is fine.
status=0
with_mlx_blas env OPENBLAS_NUM_THREADS=1 .venv/bin/python -m pytest -m mlx "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
    exit "$status"
fi
