#!/usr/bin/env bash
# The emulated NVMe controller's data rate on the GPU machine (H200): host
# memory -> HBM with 32 KiB read commands, batched copies against per-extent
# copies, capped at 2 x 14 GB/s, beside compute; test_gpu_gio first, since it
# checks the controller's data path (PRP/SGL, file backing, errors, cap).
# Run from the repo root after
#   make -s -j16 DEPS_ROOT=.h200/root BUILD=build/h200 gpu-lib
# Writes $OUT/emu_bw.json and emu_bw.log (default build/gpu/out); < 150 s.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/out}
B=${B:-build/h200}
NVCC=${NVCC:-nvcc}
FLAGS="-std=c++17 -arch=sm_90 -O2 -Ilibtutti/include -Ilibtutti/tests -Xcompiler -Wall,-Werror -Werror all-warnings"
LINK=(-L"$B" -ltutti_gpu -Xlinker -rpath="$PWD/$B")
mkdir -p "$OUT"
[ -f "$B/libtutti_gpu.so" ] || { echo "no $B/libtutti_gpu.so: run make ... BUILD=$B gpu-lib first"; exit 1; }
t0=$(date +%s)
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)" \
	"cpus=$(nproc) $($NVCC --version | tail -1)" | tee "$OUT/emu_bw.log"
$NVCC $FLAGS benchmarks/gpu_iouring_bench.cu -o "$B/gpu_iouring_bench" "${LINK[@]}" >"$OUT/emu_bw_build.log" 2>&1 &
p1=$!
$NVCC $FLAGS libtutti/tests/test_gpu_gio.cu -o "$B/test_gpu_gio" "${LINK[@]}" >>"$OUT/emu_bw_build.log" 2>&1 &
p2=$!
rc=0
wait $p1 || rc=1
wait $p2 || rc=1
[ $rc -eq 0 ] || { cat "$OUT/emu_bw_build.log"; echo "== build FAILED" | tee -a "$OUT/emu_bw.log"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/emu_bw.log"

timeout 60 "$B/test_gpu_gio" >"$OUT/emu_bw_test_gpu_gio.log" 2>&1
trc=$?
echo "== test_gpu_gio exit $trc: $(grep -c '^ok' "$OUT/emu_bw_test_gpu_gio.log") ok," \
	"$(grep -c '^not ok' "$OUT/emu_bw_test_gpu_gio.log") not ok" | tee -a "$OUT/emu_bw.log"
grep -E '^not ok|Bail out|throttle:' "$OUT/emu_bw_test_gpu_gio.log" | tee -a "$OUT/emu_bw.log"

PYTHONUNBUFFERED=1 timeout 110 python3 benchmarks/gpu_iouring.py run --sweep emubw --timeout 40 \
	--bin "$B/gpu_iouring_bench" --out "$OUT/emu_bw.json" 2>&1 | tee -a "$OUT/emu_bw.log"
brc=${PIPESTATUS[0]}
echo "== done in $(( $(date +%s) - t0 )) s, test_gpu_gio exit $trc, bench exit $brc" | tee -a "$OUT/emu_bw.log"
[ $trc -eq 0 ] && [ $brc -eq 0 ]
