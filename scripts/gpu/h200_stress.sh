#!/usr/bin/env bash
# Repeat one GPU test file (default tests/test_gpu_store_py.py) many times on the lent H200 and
# count passes, failures and hangs (a run killed by its timeout), for issue 12's "100 runs, 0 hangs".
#   OUT=<dir> B=build/h200 scripts/gpu/h200_stress.sh [--runs N] [--jobs J] [--seconds S] [--timeout T] [FILE]
# --jobs: runs at once on the one GPU (more pressure than one at a time: say which in the report);
# --seconds: start no new run after this long (a device call is limited), so the count says what ran.
# After scripts/gpu/h200_check.sh built the library (same B). Logs: $OUT/stress/<n>.log (and <n>.bt:
# a hung run's native stacks), summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/out}
B=${B:-build/h200}
RUNS=100 JOBS=1 SECS=540 TMO=120 FILE=tests/test_gpu_store_py.py
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	--jobs) JOBS=$2; shift 2 ;;
	--seconds) SECS=$2; shift 2 ;;
	--timeout) TMO=$2; shift 2 ;;
	-*) echo "unknown option $1" >&2; exit 2 ;;
	*) FILE=$1; shift ;;
	esac
done
mkdir -p "$OUT/stress"
# shellcheck source=scripts/gpu/h200_pyext.sh
source scripts/gpu/h200_pyext.sh || { echo "tutti._tutti did not build"; exit 1; }
export TUTTI_GPU_LIB=$PWD/$B/libtutti_gpu.so PYTHONUNBUFFERED=1
[ -f "$TUTTI_GPU_LIB" ] || { echo "no $TUTTI_GPU_LIB: run h200_check.sh first"; exit 1; }
t0=$(date +%s)
# A hung run's evidence before it is killed: pytest does not capture (-s), so the
# gio path's hang report and faulthandler's Python stacks (at TMO/2) reach the log,
# and a debugger (gdb or cuda-gdb, where there is one) adds every thread's native stack.
DBG=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null || true)
one() {
	local n=$1 r pid waited=0
	python3 -m pytest -q -s -p no:cacheprovider -o faulthandler_timeout=$((TMO / 2)) "$FILE" \
		>"$OUT/stress/$n.log" 2>&1 &
	pid=$!
	while kill -0 "$pid" 2>/dev/null && [ $waited -lt "$TMO" ]; do
		sleep 1
		waited=$((waited + 1))
	done
	if kill -0 "$pid" 2>/dev/null; then
		[ -n "$DBG" ] && timeout 60 "$DBG" -p "$pid" -batch -ex "thread apply all bt 15" \
			>"$OUT/stress/$n.bt" 2>&1
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		r=137
	else
		wait "$pid"
		r=$?
	fi
	echo "$r" >"$OUT/stress/$n.rc"
}
started=0
while [ $started -lt "$RUNS" ] && [ $(( $(date +%s) - t0 )) -lt "$SECS" ]; do
	while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
	started=$((started + 1))
	one $started &
done
wait
pass=0 fail=0 hang=0
for f in "$OUT"/stress/*.rc; do
	case $(cat "$f") in
	0) pass=$((pass + 1)) ;;
	137) hang=$((hang + 1)); echo "hung: ${f%.rc}.log" ;;
	*) fail=$((fail + 1)); echo "failed: ${f%.rc}.log: $(tail -1 "${f%.rc}.log")" ;;
	esac
done
echo "stress $FILE: $started runs ($JOBS at a time) in $(( $(date +%s) - t0 )) s: $pass passed, $fail failed, $hang hung (killed after ${TMO} s)"
[ $fail -eq 0 ] && [ $hang -eq 0 ]
