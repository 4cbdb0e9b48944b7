#!/usr/bin/env bash
# The store under random I/O fault schedules in the guest, alone and long (docs/reliability.md
# "Store under I/O faults"). Every main boot of hil.sh runs a short version (TUTTI_HIL_FM_SCHEDULES,
# 60); this is for the long runs, after a hil.sh run built the kernels, modules and initramfs.
#
#   scripts/hil/faultmodel.sh [--schedules N] [--seed S] KVER...
#
# Per kernel: one boot (phase fault-model) on fresh images; the guest suite (tests/hil/run-guest.sh
# fault-model) attaches both controllers to tutti.ko and runs test_fault_model through fault:kqueue
# on the two namespace nodes, N schedules from seed S (consecutive seeds), 20 per TAP line
# (HIL_FM_CHUNK). Prints the TAP lines, the totals per kernel, and exits 0 only if every
# schedule held every invariant.
#
# Environment: HIL_FM_SCHEDULES (500), HIL_FM_SEED (random, printed), HIL_FM_CHUNK (20),
# HIL_FM_SECS_PER_SCHEDULE (10: the boot's timeout is 300 s plus that per schedule).
# Logs: build/hil/logs/KVER/fault-model.{console,results}.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/hil/lib.sh

SCHEDULES=${HIL_FM_SCHEDULES:-500}
SEED=${HIL_FM_SEED:-$((RANDOM * 32768 + RANDOM))}
CHUNK=${HIL_FM_CHUNK:-20}
while [ $# -gt 0 ]; do
	case "$1" in
	--schedules) SCHEDULES=$2; shift 2 ;;
	--seed) SEED=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) die "faultmodel.sh: unknown option $1" ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || die "usage: faultmodel.sh [--schedules N] [--seed S] KVER..."
TIMEOUT=$((300 + SCHEDULES * ${HIL_FM_SECS_PER_SCHEDULE:-10}))
BIN=$PWD/build/hil-tests
make -s -C tests/hil OUT="$BIN" >"$HIL_BUILD/logs/guest-tests-build.log" 2>&1 ||
	{ tail -20 "$HIL_BUILD/logs/guest-tests-build.log" >&2; die "make -C tests/hil failed"; }

CHILD=
trap '[ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null; wait; exit 143' TERM
trap '[ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null; wait; exit 130' INT

bad=0
for kver in "$@"; do
	load_kernel_env "$kver"
	img=$HIL_BUILD/images/$kver
	mkdir -p "$img" "$HIL_BUILD/logs/$kver"
	rm -f "$img"/fm-[ab].img
	qemu-img create -q -f raw "$img/fm-a.img" "${HIL_IMG_SIZE:-512M}"
	qemu-img create -q -f raw "$img/fm-b.img" "${HIL_IMG_SIZE:-512M}"
	log "---- $kver: $SCHEDULES fault schedules from seed $SEED (timeout ${TIMEOUT}s)"
	t0=$(date +%s)
	set +e
	scripts/hil/run-qemu.sh --timeout "$TIMEOUT" --tag fault-model \
		--env "TUTTI_HIL_FM_SCHEDULES=$SCHEDULES" --env "TUTTI_HIL_FM_SEED=$SEED" \
		--env "TUTTI_HIL_FM_CHUNK=$CHUNK" --env "TUTTI_HIL_BIN=$BIN" \
		"$kver" fault-model "$img/fm-a.img" "$img/fm-b.img" &
	CHILD=$!
	wait "$CHILD"
	rc=$?
	CHILD=
	set -e
	secs=$(($(date +%s) - t0))
	echo "boot $kver fault-model: ${secs}s" >>"$HIL_BUILD/timings"
	f=$HIL_BUILD/logs/$kver/fault-model.results.log
	tr -d '\r' <"$f" | grep -E '^(not )?ok [0-9]+|^HIL-RESULT|^# fault model' | sed "s/^/  [$kver] /" || true
	# the totals of the chunks' lines
	tr -d '\r' <"$f" | python3 -c '
import re, sys
keys = ("schedules", "steps", "faults injected", "failed blocks reported",
        "blocks compared byte for byte", "with verification off", "reopens", "crash views checked")
tot = dict.fromkeys(keys, 0)
for line in sys.stdin:
    if not re.match(r"ok \d+ - \[fault-model\] \[kqueue\] \d+ schedules", line):
        continue
    for k in keys:
        m = re.search(r"(\d+) (?:\()?" + re.escape(k), line)
        tot[k] += int(m.group(1)) if m else 0
print("  [%s] totals: " % sys.argv[1] + ", ".join("%s %d" % (k, v) for k, v in tot.items()))
' "$kver"
	if [ "$rc" -ne 0 ] || grep -q '^not ok' "$f" || ! grep -q '^HIL-RESULT' "$f"; then
		log "$kver: FAILED (boot exit $rc, ${secs}s; logs: $HIL_BUILD/logs/$kver/fault-model.*.log)"
		bad=1
	else
		log "$kver: passed in ${secs}s"
	fi
done
exit $bad
