#!/usr/bin/env bash
# Run libtutti's on-disk-format fuzzers (libtutti/fuzz) one at a time, each for
# a time or a number of executions, starting from the committed corpus
# (libtutti/fuzz/corpus/<target>, never written to: new inputs go to a work
# copy under the build folder).  Prints one summary line per target; exits 1
# if any target crashed, leaked, hit a sanitizer or timed out on an input (its
# input is then under <build>/artifacts/: add it to the corpus as regress-*).
#   scripts/fuzz.sh [--build DIR] (--seconds S | --runs N) TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/fuzz
limit=(-max_total_time=45)
while [ $# -gt 0 ]; do
	case "$1" in
	--build) build=$2; shift 2 ;;
	--seconds) limit=(-max_total_time="$2"); shift 2 ;;
	--runs) limit=(-runs="$2"); shift 2 ;;
	--) shift; break ;;
	-*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--build DIR] (--seconds S | --runs N) TARGET..." >&2; exit 2; }

mkdir -p "$build/artifacts" "$build/logs"
fail=0
for t in "$@"; do
	work="$build/work/$t"
	rm -rf "$work"
	mkdir -p "$work"
	log="$build/logs/$t.log"
	start=$(date +%s)
	rc=0
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
		fail=1
		tail -40 "$log" >&2
	fi
done
exit $fail
