#!/usr/bin/env bash
# Build and run the GPU io_uring tests and benchmark on a machine with a GPU
# (the lent H200). Logs and results go under $OUT (default build/gpu/out).
#   scripts/gpu/h200_run.sh            tests + full benchmark sweep
#   scripts/gpu/h200_run.sh --quick    tests + a short sweep
#   scripts/gpu/h200_run.sh --tests    tests only
# NOBUILD=1: run what an earlier call built in $B (the repeated rounds of h200_check.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/out}
B=${B:-build/gpu}
mkdir -p "$B" "$OUT"
NVCC=${NVCC:-nvcc}
FLAGS="-std=c++17 -arch=sm_90 -O2 -Ilibtutti/include -Ilibtutti/tests -Xcompiler -Wall,-Werror -Werror all-warnings"
log() { echo "== $*" | tee -a "$OUT/run.log"; }

log "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) cpus=$(nproc)"
t0=$(date +%s)
command -v prove >/dev/null || { log "prove not found (Perl's TAP::Harness: Debian/Ubuntu package perl)"; exit 1; }
# The library (store + GPU data paths) once, through make; every GPU test and
# benchmark program links against it. DEPS_ROOT: see scripts/gpu/h200_deps.sh.
if [ "${NOBUILD:-0}" != 1 ]; then
[ -z "${DEPS_ROOT:-}" ] && [ -d .h200/root ] && ! [ -e /usr/include/liburing.h ] && DEPS_ROOT=.h200/root
make -s -j"$(nproc)" BUILD="$B" ${DEPS_ROOT:+DEPS_ROOT=$DEPS_ROOT} gpu-lib >>"$OUT/build.log" 2>&1 ||
	{ cat "$OUT/build.log"; log "build FAILED"; exit 1; }
pids=()
for f in libtutti/tests/test_gpu_*.cu libtutti/tests/hd_compile.cu benchmarks/*.cu; do
	$NVCC $FLAGS "$f" -o "$B/$(basename "$f" .cu)" -L"$B" -ltutti_gpu -Xlinker -rpath="$PWD/$B" &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { log "build FAILED"; exit 1; }
log "built in $(( $(date +%s) - t0 )) s"
fi

# The GPU tests (TAP, libtutti/tests/tap.h) through the project's one TAP consumer, Perl's prove:
# a test that dies before its plan fails, "1..0 # SKIP no CUDA device" (no GPU here) is a skip.
# Each test at most 150 s.
fail=0
tests=()
for t in "$B"/test_gpu_* "$B"/hd_compile; do [ -x "$t" ] && [ -f "$t" ] && tests+=("$t"); done
log "prove: ${tests[*]}"
prove --verbose --merge --timer --exec "timeout 150" "${tests[@]}" 2>&1 | tee -a "$OUT/test_gpu.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
log "GPU tests $([ $fail -eq 0 ] && echo passed || echo FAILED)"
[ "${1:-}" = "--tests" ] && exit $fail

log "benchmark"
PYTHONUNBUFFERED=1 timeout 330 python3 benchmarks/gpu_iouring.py run --bin "$B/gpu_iouring_bench" \
	--out "$OUT/gpu_iouring.json" ${1:+$1} 2>&1 | tee "$OUT/bench.log"
log "done in $(( $(date +%s) - t0 )) s, tests $([ $fail -eq 0 ] && echo passed || echo FAILED)"
exit $fail
