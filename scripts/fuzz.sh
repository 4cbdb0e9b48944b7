#!/usr/bin/env bash
# Run libtutti's on-disk-format fuzzers (libtutti/fuzz) one at a time, each for
# a time or a number of executions, starting from the committed corpus
# (libtutti/fuzz/corpus/<target>, never written to: new inputs go to a work
# copy under the build folder).  Prints one summary line per target; exits 1
# if any target crashed, leaked, hit a sanitizer or timed out on an input (its
# input is then under <build>/artifacts/: add it to the corpus as regress-*).
# --jobs J: J targets at once (each fuzzer is one process on one core).
#   scripts/fuzz.sh [--build DIR] [--jobs J] (--seconds S | --runs N) TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/fuzz
limit=(-max_total_time=45)
jobs=1
while [ $# -gt 0 ]; do
	case "$1" in
	--build) build=$2; shift 2 ;;
	--seconds) limit=(-max_total_time="$2"); shift 2 ;;
	--runs) limit=(-runs="$2"); shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	--) shift; break ;;
	-*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--build DIR] (--seconds S | --runs N) TARGET..." >&2; exit 2; }

mkdir -p "$build/artifacts" "$build/logs"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --jobs wants a whole number >= 1" >&2; exit 2; }

fuzz_one() {
	local t=$1 work="$build/work/$1" log="$build/logs/$1.log" start rc=0 secs runs reports
	rm -rf "$work"
	mkdir -p "$work"
	start=$(date +%s)
	# -timeout: an input that takes 10 s is a hang (no wait is unbounded);
	# -rss_limit_mb: the largest legal allocation here is far below it.
	"$build/$t" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$build/artifacts/$t-" "$work" "libtutti/fuzz/corpus/$t" \
		>"$log" 2>&1 || rc=$?
	secs=$(( $(date +%s) - start ))
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	reports=$(grep -cE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|broken:' "$log" || true)
	echo "$t: rc=$rc runs=${runs:-?} seconds=$secs exec/s=$(( ${runs:-0} / (secs > 0 ? secs : 1) )) reports=$reports corpus=$(ls "$work" | wc -l)+$(ls "libtutti/fuzz/corpus/$t" | wc -l)"
	if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
		tail -40 "$log" >&2
		return 1
	fi
}

fail=0
for t in "$@"; do
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
		sleep 0.2
	done
	rm -f "$build/logs/$t.failed"
	{ fuzz_one "$t" || touch "$build/logs/$t.failed"; } &
done
wait
for t in "$@"; do
	[ ! -e "$build/logs/$t.failed" ] || fail=1
done
exit $fail
