#!/usr/bin/env bash
# Build laya's CPU server image (deploy/Containerfile) with podman or docker.
#
#   bash scripts/build-image.sh [--model DIR] [--tag laya:cpu] [--base IMAGE] [--offline]
#                               [--containerfile deploy/Containerfile.cuda]
#
# dist/ gets laya's wheel and the llama-cpp-python wheel scripts/setup.sh built (laya's patches, no
# compiler in the image). --offline also downloads every dependency's wheel into dist/ on this machine
# (with its pip settings) and builds with --no-index: the image build then needs no network. --model
# bakes a checkpoint folder into the image at /models/default, prepared at build time.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=laya:cpu model= base= offline=0 containerfile=deploy/Containerfile
while [ $# -gt 0 ]; do
    case "$1" in
        --model) model=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --base) base=$2; shift 2 ;;
        --offline) offline=1; shift ;;
        --containerfile) containerfile=$2; shift 2 ;;
        *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
    esac
done
engine=$(command -v podman || command -v docker || true)
[ -n "$engine" ] || { echo "build-image: neither podman nor docker is installed" >&2; exit 2; }
python=${PYTHON:-.venv/bin/python}
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/dist" "$context/model"
# the wheel of the tracked files (what a clone holds), as `python -m build` makes it
mkdir -p "$context/src"
git ls-files -z | xargs -0 cp --parents -t "$context/src" 2>/dev/null || true  # a deleted file is skipped
"$python" -m build -q --wheel --outdir "$context/dist" "$context/src" >/dev/null
rm -rf "$context/src"
wheels="${LAYA_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/laya/wheels}"
[ "$containerfile" != deploy/Containerfile ] || cp "$wheels"/llama-cpp-python-*/llama_cpp_python-*.whl "$context/dist/" \
    2>/dev/null || echo "build-image: no prebuilt llama-cpp-python wheel (run scripts/setup.sh): the image compiles it"
args=()
if [ "$offline" = 1 ]; then
    "$python" -m pip download -q -d "$context/dist" --find-links "$context/dist" "torch==2.13.0" \
        "$(ls "$context"/dist/laya_runtime-*.whl)[torch,onnx,serve,llama,mcp]"
    args+=(--build-arg "PIP_OPTIONS=--no-index")
fi
if [ -n "$model" ]; then
    [ -f "$model/rl_agent_config.json" ] || { echo "build-image: $model is not a laya checkpoint folder" >&2; exit 2; }
    cp -r "$model"/. "$context/model/"
fi
[ -z "$base" ] || args+=(--build-arg "BASE=$base")
extra=()
[ "$(basename "$engine")" = podman ] && extra=(--format docker)  # keeps HEALTHCHECK and STOPSIGNAL
"$engine" build "${extra[@]}" "${args[@]}" ${BUILD_OPTIONS:-} -f "$containerfile" -t "$tag" "$context"
echo "build-image: built $tag"
