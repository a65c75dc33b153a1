# Sourced by scripts/test.sh: defines `with_mlx_blas CMD...`, which runs CMD with Debian's OpenBLAS
# preloaded for MLX. MLX's Linux CPU wheel multiplies with a bundled reference BLAS (~3 GFLOP/s on the
# 2-core test machine); OpenBLAS runs the same matmuls at ~200 GFLOP/s. Two catches, both measured:
# - OpenBLAS 0.3.21 misdetects AMD Zen 4 and picks slow kernels (~30 GFLOP/s); on a CPU with the
#   AVX-512 subsets SkylakeX kernels need, OPENBLAS_CORETYPE=SkylakeX selects the fast ones.
# - Preloading OpenBLAS into a process that also runs torch slows torch ~15x; so only MLX runs this way.
# Installs libopenblas0-pthread with apt when missing and we are root; otherwise says what to install.
LAYA_OPENBLAS=""
LAYA_OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-}"
if [ "$(uname -s)" = Linux ]; then
    candidate="/usr/lib/$(uname -m)-linux-gnu/openblas-pthread/libopenblas.so.0"
    if [ ! -e "$candidate" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing Debian's libopenblas0-pthread for MLX"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread >/dev/null
    fi
    if [ -e "$candidate" ]; then
        LAYA_OPENBLAS="$candidate"
        if [ -z "$LAYA_OPENBLAS_CORETYPE" ] && grep -q avx512f /proc/cpuinfo && grep -q avx512bw /proc/cpuinfo \
            && grep -q avx512dq /proc/cpuinfo && grep -q avx512vl /proc/cpuinfo; then
            LAYA_OPENBLAS_CORETYPE=SkylakeX
        fi
    else
        echo "setup: $candidate not found; MLX tests will be slow (apt-get install libopenblas0-pthread)" >&2
    fi
fi

with_mlx_blas() {
    if [ -n "$LAYA_OPENBLAS" ]; then
        env LD_PRELOAD="$LAYA_OPENBLAS${LD_PRELOAD:+:$LD_PRELOAD}" \
            ${LAYA_OPENBLAS_CORETYPE:+OPENBLAS_CORETYPE=$LAYA_OPENBLAS_CORETYPE} "$@"
    else
        "$@"
    fi
}
