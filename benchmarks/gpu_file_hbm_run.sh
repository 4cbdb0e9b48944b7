#!/usr/bin/env bash
# On the GPU machine: build libtutti_gpu.so, test_gpu_staged and gpu_file_hbm,
# check cufile_min.h against a real cufile.h if one is there, run the test,
# then the benchmark within what is left of BUDGET seconds. Results: $OUT.
#   OUT=build/h200/out BUDGET=300 benchmarks/gpu_file_hbm_run.sh
#   QUICK=1: the test, then one RAM-backed 32K store: h2d, staged, mapped
#   arguments go to gpu_file_hbm.py run, e.g. --kinds disk --runs 1 --rounds 5
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-build/gpu/out}
BUDGET=${BUDGET:-300}
QUICK=${QUICK:-}
B=build/h200
mkdir -p "$B" "$OUT"
D=
[ -d .h200/root ] && ! [ -e /usr/include/liburing.h ] && D=.h200/root
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; free -g | head -2
  df -hT . /dev/shm; grep -iE '"allow_compat_mode"|"use_poll_mode"' /etc/cufile.json; } >"$OUT/machine.txt" 2>&1
make -s -j"$(nproc)" BUILD=$B ${D:+DEPS_ROOT=$D} gpu-lib >"$OUT/build.log" 2>&1 ||
	{ tail -40 "$OUT/build.log"; exit 1; }
F="-std=c++17 -arch=sm_90 -O2 -Ilibtutti/include -Ilibtutti/tests -Xcompiler -Wall,-Werror -Werror all-warnings"
LK="-L$B -ltutti_gpu -Xlinker -rpath=$PWD/$B"
nvcc $F libtutti/tests/test_gpu_staged.cu -o $B/test_gpu_staged $LK >>"$OUT/build.log" 2>&1 &
p1=$!
nvcc $F benchmarks/gpu_file_hbm.cu -o $B/gpu_file_hbm $LK >>"$OUT/build.log" 2>&1 &
p2=$!
CFI=
for d in /usr/local/cuda/include $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
	for c in "$d/cufile.h" "$d/nvidia/cufile/include/cufile.h"; do [ -f "$c" ] && CFI=$(dirname "$c") && break 2; done
done
if [ -n "$CFI" ]; then
	nvcc $F -I"$CFI" -c libtutti/tests/gds_abi_check.cu -o $B/gds_abi_check.o >"$OUT/abi.log" 2>&1 &&
		echo "cufile_min.h matches $CFI/cufile.h" >>"$OUT/abi.log" || echo "ABI CHECK FAILED" >>"$OUT/abi.log"
else
	echo "no cufile.h found: ABI check not run" >"$OUT/abi.log"
fi
wait $p1 && wait $p2 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/build.log"
# cuFile needs udev's word on the disk's filesystem (none where no udevd runs)
# and compatibility mode allowed; its logs go to $OUT.
DISK=${DISK_DIR:-/var/tmp/tt_file_hbm}
mkdir -p "$DISK"
source scripts/gpu/cufile_env.sh "$DISK" | tee -a "$OUT/machine.txt"
# The test gives itself 80 s (each case in its own process); 90 s at most.
timeout -k 5 90 $B/test_gpu_staged >"$OUT/test_gpu_staged.log" 2>&1
echo "test_gpu_staged exit $? after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/test_gpu_staged.log"
grep -E "^not ok|^1\.\.|Bail|signal|hung|mapped: |pread: " "$OUT/test_gpu_staged.log"
# The benchmark gets what is left; it rewrites its JSON after every
# configuration, so a run cut short still leaves what it measured.
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "benchmark budget ${LEFT} s"
PYTHONUNBUFFERED=1 python3 benchmarks/gpu_file_hbm.py run --bin $B/gpu_file_hbm --out "$OUT/gpu_file_hbm.json" \
	--disk-dir "$DISK" --budget $LEFT ${QUICK:+--quick} "$@" >"$OUT/bench.log" 2>&1
echo "bench exit $? after $(( $(date +%s) - T0 )) s"
# cuFile's logs say why it refused a file; their names do not travel back.
for f in "$OUT"/cufile_*.log cufile.log; do [ -f "$f" ] && tail -c 50000 "$f" >>"$OUT/cufile_all.log" && rm -f "$f"; done
grep -E "^- .*(mapped|staged)\`: |not run: " "$OUT/bench.log" | sort -u
sed -n '/^| Target/,$p' "$OUT/bench.log"
