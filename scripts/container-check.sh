#!/usr/bin/env bash
# Build the CPU image (deploy/Containerfile) and check it as it runs: /ready, one answer against the
# library's, the health check, and a SIGTERM drain. Prints one JSON line of figures at the end.
#
#   sudo bash scripts/container-check.sh [--base IMAGE] [--reuse]
#
# Without --base, the base is Debian bookworm made here by mmdebstrap (minbase with python3, python3-venv,
# ca-certificates, libgomp1) and imported into podman. The image is built offline (every wheel from this
# machine's pip, scripts/build-image.sh --offline) with a generated checkpoint baked in and prepared.
# Where `podman run` cannot run (a VM whose runtime may not call setrlimit), the image's own program is
# started from its filesystem (`podman image mount`), bound read-only, with chroot as the image's user,
# its entrypoint, command and environment: what `podman run --read-only --tmpfs /tmp` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
base= reuse=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base=$2; shift 2 ;;
        --reuse) reuse=1; shift ;;  # check the image built before instead of building it again
        *) echo "container-check: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "container-check: run as root (podman image mount, chroot)" >&2; exit 2; }
for tool in podman mmdebstrap; do
    command -v "$tool" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman mmdebstrap >/dev/null
done
work=$(mktemp -d)
root="$work/root"
server=
cleanup() {
    [ -z "$server" ] || kill -9 "$server" 2>/dev/null || true
    for m in "$root/run/secrets" "$root/tmp" "$root/dev" "$root/proc" "$root"; do
        mountpoint -q "$m" 2>/dev/null && umount -l "$m"
    done
    podman image unmount laya:cpu-check >/dev/null 2>&1 || true
    if [ -n "$keep" ]; then echo "container-check: left $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
keep=${KEEP:-}  # KEEP=1: leave the work folder (logs, answers) for a look
started=$(date +%s)
if [ -z "$base" ]; then
    base=localhost/laya-base:bookworm
    if ! podman image exists "$base"; then
        echo "container-check: making a Debian bookworm base with mmdebstrap (about 100 s)"
        mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,libgomp1 \
            bookworm "$work/rootfs.tar"
        podman import -q "$work/rootfs.tar" "$base" >/dev/null
        rm -f "$work/rootfs.tar"
    fi
fi
.venv/bin/python -c "
from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint
write_test_checkpoint('$work/model', TestCheckpointSpec(flavour='mmbert', seed=5))"
build_started=$(date +%s)
if [ "$reuse" = 0 ] || ! podman image exists laya:cpu-check; then
    BUILD_OPTIONS="--isolation chroot" bash scripts/build-image.sh --offline --base "$base" --model "$work/model" \
        --tag laya:cpu-check
fi
built=$(( $(date +%s) - build_started ))
size=$(podman image inspect laya:cpu-check --format '{{.Size}}')
config() { podman image inspect laya:cpu-check --format "{{json .Config.$1}}"; }
user=$(podman image inspect laya:cpu-check --format '{{.Config.User}}')
mapfile -t argv < <(python3 -c "import json,sys; [print(a) for a in (json.loads(sys.argv[1]) or []) + (json.loads(sys.argv[2]) or [])]" \
    "$(config Entrypoint)" "$(config Cmd)")
mapfile -t envs < <(python3 -c "import json,sys; [print(a) for a in json.loads(sys.argv[1]) or []]" "$(config Env)")
mapfile -t health < <(python3 -c "import json,sys; t=json.loads(sys.argv[1]) or {}; [print(a) for a in t.get('Test', [])[1:]]" \
    "$(config Healthcheck)")
stopsignal=$(podman image inspect laya:cpu-check --format '{{.Config.StopSignal}}')
# the image's filesystem, read-only, with what `podman run --read-only --tmpfs /tmp` adds
mnt=$(podman image mount laya:cpu-check)
mkdir -p "$root" && mount --bind "$mnt" "$root" && mount -o remount,bind,ro "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
mkdir -p "$work/secrets" && head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$work/secrets/laya_api_key"
chmod 0444 "$work/secrets/laya_api_key"
mount --bind "$work/secrets" "$root/run/secrets"
key=$(cat "$work/secrets/laya_api_key")
uid=$(chroot "$root" id -u "$user"); gid=$(chroot "$root" id -g "$user")
in_image() { chroot --userspec="$uid:$gid" "$root" env -i "${envs[@]}" "$@"; }
port=8000
launched=$(date +%s.%N)
# started directly (not through in_image's subshell): $! is then the server itself, chroot and env exec it
chroot --userspec="$uid:$gid" "$root" env -i "${envs[@]}" "${argv[@]}" > "$work/server.log" 2>&1 &
server=$!
ready=
for _ in $(seq 1 600); do
    if curl -sf -o /dev/null "http://127.0.0.1:$port/ready"; then ready=$(python3 -c "import time; print(round(time.time() - $launched, 1))"); break; fi
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
done
[ -n "$ready" ] || { echo "container-check: the server never became ready"; cat "$work/server.log"; exit 1; }
in_image "${health[@]}" && healthy=true || healthy=false
body='{"state": "my parcel is late and I was charged twice", "questions": {"team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "shipping", "sales"]}, "urgent": {"type": "noul", "instructions": "Is it urgent?"}}}'
curl -s -o "$work/answer.json" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "$body" "http://127.0.0.1:$port/v1/systemone"
refused=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" \
    "http://127.0.0.1:$port/v1/systemone")  # no key: 403
wrong=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${key}x" -H 'Content-Type: application/json' \
    -d "$body" "http://127.0.0.1:$port/v1/systemone")  # a wrong key: 401
# the library's answer, from the image's own library and model
in_image python3 -c "
import json, sys, laya
body = json.loads(sys.argv[1])
print(json.dumps(laya.load('/models/default').predict(body['state'], body['questions'])))" "$body" > "$work/library.json"
parity=$(python3 - "$work/answer.json" "$work/library.json" <<'PY'
import json, sys
served, library = (json.load(open(p)) for p in sys.argv[1:3])
assert "answers" in served, f"the server answered {served}"
worst = 0.0
for qid, want in library["answers"].items():
    got = served["answers"][qid]
    if "probabilities" in want:  # choice and score: the answer, and every option's probability
        assert got[want["type"]] == want[want["type"]], (got, want)
        worst = max([worst] + [abs(p - got["probabilities"][k]) for k, p in want["probabilities"].items()])
    else:  # noul: P(true)
        worst = max(worst, abs(want["noul"] - got["noul"]))
print(worst)
PY
)
# the drain: a request in flight when SIGTERM comes is answered; the process then exits
long="$(python3 -c "import json; print(json.dumps({'state': 'refund ' * 400, 'questions': {'q%d' % i: {'type': 'choice', 'instructions': 'Which?', 'criteria': ['a%d' % j for j in range(40)]} for i in range(8)}}))")"
curl -s -o "$work/inflight.json" -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "$long" "http://127.0.0.1:$port/v1/systemone" > "$work/inflight.code" &
client=$!
sleep 0.3
signalled=$(date +%s.%N)
kill -s "${stopsignal:-TERM}" "$server"
after=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" -d "$body" \
    "http://127.0.0.1:$port/v1/systemone" || true)
wait "$client" || true
status=0; wait "$server" || status=$?
stopped=$(python3 -c "import time; print(round(time.time() - $signalled, 1))")
server=
inflight=$(cat "$work/inflight.code")
python3 - <<PY
import json
print(json.dumps({"image": "laya:cpu-check", "size_mb": round($size / 2**20), "build_s": $built,
                  "ready_s": $ready, "healthcheck": "$healthy" == "true", "parity_max_dp": $parity,
                  "precision": json.load(open("$work/answer.json")).get("x_precision"),
                  "keyless_request": $refused, "wrong_key": $wrong, "in_flight_at_sigterm": $inflight,
                  "new_request_while_draining": "$after", "exit_status": $status, "stopped_s": $stopped,
                  "total_s": $(( $(date +%s) - started ))}))
PY
ok=1
[ "$healthy" = true ] && [ "$refused" = 403 ] && [ "$wrong" = 401 ] && [ "$inflight" = 200 ] && [ "$status" = 0 ] \
    && python3 -c "import sys; sys.exit(0 if $parity <= 1e-6 else 1)" || ok=0
[ "$ok" = 1 ] && echo "container-check: passed" || { echo "container-check: FAILED"; tail -20 "$work/server.log"; exit 1; }
