#!/usr/bin/env bash
# Every GPU test in one call on the lent H200 (a device session is short: one call, one report):
# C GPU tests (h200_run.sh --tests), then the Python GPU tests, each file under its own timeout,
# with the store's gio data path's waits bounded
# (TUTTI_GIO_WAIT_TIMEOUT_S: a stuck layer fails with a state dump instead of holding the GPU).
#   OUT=<dir> B=build/h200 scripts/gpu/h200_check.sh [--bench] [--repeat N [--seconds S]] [pytest -k expression]
# --repeat N: the whole suite (C and Python) N times, built once (issue 12's "10 runs of the whole GPU
# suite, 0 hangs"); no new round starts after S seconds (default 540: a device call is limited), so the
# summary says how many ran. Rounds after the first log under $OUT/rounds/<r>/, a failing round's logs are
# copied to $OUT/failed_r<r>_<file>.
# --bench: then the store-path benchmarks the store gio hang blocked: the connector's load through the
# worker vs a bare transaction (staged, gio; RAM store) and a quick prefill through the store's gio path.
# Logs: $OUT/check.log (summary), $OUT/test_gpu.log (C), $OUT/py_<file>.log (each Python file), $OUT/*.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/out}
B=${B:-build/h200}
BENCH=0 ROUNDS=1 SECS=540
while [ $# -gt 0 ]; do
	case $1 in
	--bench) BENCH=1; shift ;;
	--repeat) ROUNDS=$2; shift 2 ;;
	--seconds) SECS=$2; shift 2 ;;
	-*) echo "unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
K=${1:-}
mkdir -p "$OUT"
say() { echo "== $*" | tee -a "$OUT/check.log"; }
PYFILES="tests/test_gpu_controller_context.py tests/test_gpu_store_py.py tests/test_store_lifetime.py
	tests/test_cli_gpu.py tests/test_worker_write_policy.py tests/test_worker_deferred.py tests/test_prefill_gpu.py
	tests/test_tp_gpu.py"

# One round of the whole suite, logs in $1; NOBUILD=1 after the first. Returns non-zero on a failure
# (a hung file is killed by its timeout and counts as one).
suite() {
	local L=$1 c r f n fail
	mkdir -p "$L"
	B=$B OUT=$L bash scripts/gpu/h200_run.sh --tests >/dev/null 2>&1
	c=$?
	say "C GPU tests: $([ $c -eq 0 ] && echo passed || echo FAILED) ($(grep -c '^ok' "$L/test_gpu.log" 2>/dev/null) ok, $(grep -c '^not ok' "$L/test_gpu.log" 2>/dev/null) not ok)"
	grep '^not ok\|Bail out' "$L/test_gpu.log" 2>/dev/null | head -20 | tee -a "$OUT/check.log"
	fail=$c
	for f in $PYFILES; do
		n=$(basename "$f" .py)
		timeout 240 python3 -m pytest -q -rs -p no:cacheprovider ${K:+-k "$K"} "$f" >"$L/py_$n.log" 2>&1
		r=$?
		say "$f: exit $r: $(tail -1 "$L/py_$n.log")"
		[ $r -eq 0 ] || [ $r -eq 5 ] || fail=1
	done
	return $fail
}

t0=$(date +%s)
say "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | paste -sd, -)"
# shellcheck source=scripts/gpu/h200_pyext.sh
source scripts/gpu/h200_pyext.sh || { say "tutti._tutti did not build"; exit 1; }
export TUTTI_GPU_LIB=$PWD/$B/libtutti_gpu.so PYTHONUNBUFFERED=1 TUTTI_GIO_WAIT_TIMEOUT_S=20
suite "$OUT"
fail=$?
python3 -m tutti.cli gpu >"$OUT/admin_gpu.txt" 2>&1
say "tutti-admin gpu: exit $? ($OUT/admin_gpu.txt)"
passed=$((1 - fail)) r=1
while [ $r -lt "$ROUNDS" ] && [ $(( $(date +%s) - t0 )) -lt "$SECS" ]; do
	r=$((r + 1))
	s0=$(date +%s)
	NOBUILD=1 suite "$OUT/rounds/$r"
	rc=$?
	say "round $r: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - s0 )) s"
	if [ $rc -eq 0 ]; then passed=$((passed + 1)); else
		fail=1
		for l in "$OUT/rounds/$r"/*.log; do
			grep -q 'FAILED\|not ok\|Bail out\|Timeout\|[0-9] failed\|error' "$l" && cp "$l" "$OUT/failed_r${r}_$(basename "$l")"
		done
	fi
done
[ "$ROUNDS" -gt 1 ] && say "whole suite: $passed of $r rounds passed"
if [ $BENCH -eq 1 ]; then
	for p in staged gio; do
		timeout 200 python3 benchmarks/connector_load.py --data-path $p --dir /dev/shm --runs 3 \
			--json "$OUT/connector_load_$p.json" >"$OUT/connector_load_$p.log" 2>&1
		say "connector_load $p: exit $?: $(tail -1 "$OUT/connector_load_$p.log")"
	done
	timeout 300 python3 benchmarks/prefill.py run --quick --kv store --out "$OUT/prefill_store.json" \
		>"$OUT/prefill_store.log" 2>&1
	say "prefill --quick --kv store: exit $?: $(tail -1 "$OUT/prefill_store.log")"
fi
say "done in $(( $(date +%s) - t0 )) s: $([ $fail -eq 0 ] && echo ALL PASSED || echo FAILURES)"
exit $fail
