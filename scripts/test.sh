#!/usr/bin/env bash
# Set up .venv and run the checks: ruff, the layers and the types, then the test suite. Extra arguments go to pytest.
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
# The layers (import-linter contracts) and the types (mypy; strict on the contract and the engine
# boundary), both configured in pyproject.toml.
.venv/bin/lint-imports
.venv/bin/mypy
main=0
.venv/bin/python -m pytest -m "not mlx" "$@" || main=$?
# MLX in its own process, with OpenBLAS preloaded (see scripts/mlx-blas.sh). One OpenBLAS thread: the
# reference runtime (torch) runs beside MLX there, and OpenBLAS's spinning threads slow it 10x on the
# test models. It runs whatever the first half gave, so one failure does not hide the other half.
# Exit code 5 means the arguments selected no test, which is fine in either half.
mlx=0
with_mlx_blas env OPENBLAS_NUM_THREADS=1 .venv/bin/python -m pytest -m mlx "$@" || mlx=$?
# A fixed, fast subset of the planted bugs (scripts/mutants.py --ci): each must turn its tests red. Run
# with the whole suite (CI), not when the arguments pick some tests.
mutants=0
picked=0
for arg in "$@"; do case "$arg" in -*) ;; *) picked=1 ;; esac; done
if [ "$picked" -eq 0 ]; then
    .venv/bin/python scripts/mutants.py --ci || mutants=$?
fi
for status in "$main" "$mlx" "$mutants"; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
        echo "test: failed (main half exit $main, MLX half exit $mlx, mutants exit $mutants)" >&2
        exit "$status"
    fi
done
if [ "$main" -eq 5 ] && [ "$mlx" -eq 5 ]; then
    echo "test: no test ran" >&2
    exit 5
fi
