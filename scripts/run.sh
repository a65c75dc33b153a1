#!/usr/bin/env bash
# Set up .venv and run laya. With no arguments it runs the main job: `laya serve` on 127.0.0.1:8000
# with the built-in default models (the SmolLM2 GGUF shipped in a package, plus laya-multilingual
# where the Hugging Face cache has it). Otherwise the arguments go to the `laya` command,
# e.g. `bash scripts/run.sh demo` or `bash scripts/run.sh serve --model path/to/checkpoint`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
if [ "$#" -gt 0 ]; then
    exec .venv/bin/laya "$@"
fi
exec .venv/bin/laya serve
