#!/bin/bash
# Runs INSIDE the HIL guest: only the kernel-module races and the stalled-command tests of
# run-guest.sh (kq_race, kq_stall), against any tutti.ko ($TUTTI_KO) and test binaries
# ($TUTTI_HIL_BIN, $TUTTI_HIL_STALL_BIN for kq_stall).  For reproducing a result of
# docs/reliability.md with another build, e.g. the module before a fix:
#
#   scripts/hil/run-qemu.sh --suite tests/hil/run-races.sh --env TUTTI_KO=/abs/old/tutti.ko \
#       --env TUTTI_HIL_RACE_ROUNDS=100 --env TUTTI_HIL_RACES="mmap-dma deleted-map" KVER main A.img B.img
#
# TUTTI_HIL_RACES: which, in order (default: all; a hang ends the boot, so put a test that may
# deadlock or oops last).  Prints ok/not ok lines and "HIL-RESULT: N passed, M failed".
cd "$(dirname "$0")/../.." || exit 1
BIN=${TUTTI_HIL_BIN:-$PWD/build/hil-tests}
SBIN=${TUTTI_HIL_STALL_BIN:-$BIN}
R=${TUTTI_HIL_RACE_ROUNDS:-100}
PASS=0 FAIL=0
run() {
	local out
	out=$(mktemp)
	echo "# $*"
	"$@" 2>&1 | tee "$out"
	PASS=$((PASS + $(grep -c '^ok ' "$out")))
	FAIL=$((FAIL + $(grep -c '^not ok ' "$out")))
	rm -f "$out"
}
node_of() {
	local m
	for m in /sys/bus/pci/devices/$1/misc/tutti*; do
		case $(basename $m) in *n*) ;; *) basename $m; return ;; esac
	done
}
set -- ${TUTTI_NVME_BDFS:?}
A=$1 B=$2
lsmod | grep -q '^tutti ' || insmod "${TUTTI_KO:?}" || { echo "not ok - insmod $TUTTI_KO"; exit 1; }
"$BIN/kq_attach" attach $A && "$BIN/kq_attach" attach $B || { echo "not ok - attach"; exit 1; }
sleep 0.5
NA=/dev/$(node_of $A)n1
echo "# module $TUTTI_KO, $(uname -r), $R rounds"
p=/sys/module/kfence/parameters/sample_interval
[ -w $p ] && echo 1 >$p 2>/dev/null && echo "# KFENCE on (sample_interval $(cat $p) ms)"
for t in ${TUTTI_HIL_RACES:-mmap-dma deleted-map unmap-busy fsync-detach stall pause stall-kill}; do
	t0=$(date +%s)
	case $t in
	mmap-dma | deleted-map) run "$BIN/kq_race" $t $NA $R ;;
	unmap-busy) run "$BIN/kq_race" unmap-busy $NA ;;
	fsync-detach) run "$BIN/kq_race" fsync-detach $B $R ;;
	stall | pause) run "$SBIN/kq_stall" $t $NA a ;;
	stall-kill) run "$SBIN/kq_stall" stall-kill $NA $A a ;;
	*) echo "not ok - unknown test $t"; FAIL=$((FAIL + 1)) ;;
	esac
	echo "# $t: $(($(date +%s) - t0)) s"
done
dmesg | grep -E "BUG|Oops|WARNING|RIP:|lockdep|KFENCE|tutti.*(timed out|disabled|not proven|not deleted)" | sed 's/^/# dmesg: /'
echo "HIL-RESULT: $PASS passed, $FAIL failed"
[ $FAIL -eq 0 ]
