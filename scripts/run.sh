#!/usr/bin/env bash
# Set up .venv and run laya. With no arguments it runs the main job (`laya demo`);
# otherwise the arguments go to the `laya` command, e.g. `bash scripts/run.sh info laya-multilingual`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
if [ "$#" -gt 0 ]; then
    exec .venv/bin/laya "$@"
fi
exec .venv/bin/laya demo
