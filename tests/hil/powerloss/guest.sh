#!/bin/bash
# Runs INSIDE the HIL guest (scripts/hil/powerloss.sh boots it with both drives behind QEMU's
# blklogwrites driver): the power-loss replay workload, once per engine, each on its own drive.
#   A (0000:00:04.0) -> tutti.ko  -> kqueue engine on /dev/tuttiNn1
#   B (0000:00:05.0) -> kernel nvme driver -> file engine (PL_FILE_ENGINE, uring) on /dev/nvmeXn1
# Environment: the HIL contract (scripts/hil/README.md), plus PL_SEED, PL_OPS, PL_FILE_ENGINE.
# Output: TAP lines, the writers' journals ("PL ..." lines, read by replay.py on the host),
# "HIL-RESULT: N passed, M failed".
set -u
cd "$(dirname "$0")/../../.." || exit 1
BIN=${TUTTI_HIL_BIN:-$PWD/build/hil-tests}
SEED=${PL_SEED:-1} OPS=${PL_OPS:-50} FILE_ENGINE=${PL_FILE_ENGINE:-uring}
N=0 PASS=0 FAIL=0
ok() { N=$((N + 1)); PASS=$((PASS + 1)); echo "ok $N - $*"; }
not_ok() { N=$((N + 1)); FAIL=$((FAIL + 1)); echo "not ok $N - $*"; }
finish() {
	echo "1..$N"
	echo "HIL-RESULT: $PASS passed, $FAIL failed"
	exit $((FAIL != 0))
}
wait_for() { local i; for i in $(seq 100); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

# writer TAG ENGINE DEV: its journal lines as they are, its checks (TAP, hil.h) numbered here;
# its whole output is kept in /tmp/pl-TAG.tap for the TAP consumer (tap_complete).
writer() {
	local tag=$1 line rc
	shift
	while IFS= read -r line; do
		case $line in
		"ok "[0-9]*" - "*) ok "[$tag] ${line#ok * - }" ;;
		"not ok "[0-9]*" - "*) not_ok "[$tag] ${line#not ok * - }" ;;
		"PL "* | "#"*) echo "$line" ;;
		*) echo "# $line" ;;
		esac
	done < <("$BIN/pl_writer" "$@" 2>&1 | tee "/tmp/pl-$tag.tap"; echo "PL-RC ${PIPESTATUS[0]}")
}
# tap_complete TAG OUT: with no failure of its own, the writer's TAP output must satisfy the
# project's TAP consumer (scripts/tap-run: a plan, the whole of it).
tap_complete() {
	grep -q '^not ok ' <<<"$2" && return
	scripts/tap-run --saved "/tmp/pl-$1.tap" >/tmp/pl-tap.log 2>&1 ||
		not_ok "[$1] its TAP output is complete: $(sed -n 's/^ *Parse errors: //p; s/^tap-run: //p' /tmp/pl-tap.log | head -3 | paste -sd ' ')"
}

set -- ${TUTTI_NVME_BDFS:-0000:00:04.0 0000:00:05.0}
A=$1 B=$2
[ -x "$BIN/pl_writer" ] || { not_ok "pl_writer built (make -C tests/hil/powerloss)"; finish; }

# A: tutti.ko, kernel-queue engine
if insmod "${TUTTI_KO:?TUTTI_KO not set}" && "$BIN/kq_attach" attach "$A" >/tmp/pl-attach 2>&1; then
	node=
	for m in /sys/bus/pci/devices/$A/misc/tutti*; do
		case $(basename "$m") in *n*) ;; *) node=$(basename "$m") ;; esac
	done
	if [ -n "$node" ] && wait_for "/dev/${node}n1"; then
		ok "$A attached to tutti.ko: /dev/${node}n1"
		out=$(writer kqueue kqueue "/dev/${node}n1" "$SEED" "$OPS")
		echo "$out"
		PASS=$((PASS + $(grep -c '^ok ' <<<"$out"))) FAIL=$((FAIL + $(grep -c '^not ok ' <<<"$out")))
		N=$((N + $(grep -c '^ok \|^not ok ' <<<"$out")))
		grep -q "^PL kqueue END" <<<"$out" || not_ok "[kqueue] the writer ran to its end ($(grep -o 'PL-RC.*' <<<"$out"))"
		tap_complete kqueue "$out"
	else
		not_ok "tutti node for $A"
	fi
else
	not_ok "insmod tutti.ko + attach $A: $(cat /tmp/pl-attach 2>/dev/null)"
fi

# B: the kernel's nvme driver, file engine on the block device
for k in ${TUTTI_NVME_KOS:-}; do insmod "$k" 2>/dev/null; done
dev=
for i in $(seq 100); do
	ctl=$(ls /sys/bus/pci/devices/$B/nvme 2>/dev/null | head -1)
	[ -n "$ctl" ] && [ -b "/dev/${ctl}n1" ] && { dev=/dev/${ctl}n1; break; }
	sleep 0.1
done
if [ -n "$dev" ]; then
	ok "$B bound to the kernel's nvme driver: $dev"
	out=$(writer "$FILE_ENGINE" "$FILE_ENGINE" "$dev" "$SEED" "$OPS")
	echo "$out"
	PASS=$((PASS + $(grep -c '^ok ' <<<"$out"))) FAIL=$((FAIL + $(grep -c '^not ok ' <<<"$out")))
	N=$((N + $(grep -c '^ok \|^not ok ' <<<"$out")))
	grep -q "^PL $FILE_ENGINE END" <<<"$out" || not_ok "[$FILE_ENGINE] the writer ran to its end ($(grep -o 'PL-RC.*' <<<"$out"))"
	tap_complete "$FILE_ENGINE" "$out"
else
	not_ok "block device of $B under the nvme driver"
fi
finish
