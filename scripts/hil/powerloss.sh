#!/usr/bin/env bash
# Power-loss replay for one kernel (hil.sh runs it after each kernel's main boot; see
# docs/reliability.md "Power-loss replay").
#
#   scripts/hil/powerloss.sh [--ops N] [--crash-states N] [--seed S] [--mutant] KVER
#
# 1. Boots the guest with both NVMe drives behind QEMU's blklogwrites driver (run-qemu.sh --blklog):
#    every write and flush the guest issues is logged. tests/hil/powerloss/guest.sh runs the
#    workload (pl_writer.c: OPS operations drawn from SEED) through the kernel-queue engine on drive A
#    (tutti.ko) and through the file engine (io_uring, or psync) on drive B (the kernel's nvme driver).
# 2. Replays each drive's log here (tests/hil/powerloss/replay.py, the .venv-hil Python): the disk
#    at every flush point and at CRASH_STATES states between flushes (writes dropped, reordered,
#    torn), each opened, `tutti-admin check`ed and read key by key against the writer's journal.
# --mutant: the same with a libtutti whose commit skips the data flush (a copy under
# build/hil/pl-mutant): the replay must find wrong bytes; exit 0 only if it does.
#
# Environment: HIL_PL_OPS (300: ~240 write sequences), HIL_PL_CRASH_STATES (2000 per engine),
# HIL_PL_SEED (random, printed), HIL_PL_FILE_ENGINE (uring; or psync),
# HIL_BOOT_TIMEOUT (720). Logs in build/hil/logs/KVER/: powerloss.{console,results}.log (the boot),
# pl-replay.results.log (TAP), powerloss-<engine>.json (counts); images and logs of the
# drives in build/hil/images/KVER/pl-{a,b}.{img,log}. Exit 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/hil/lib.sh

OPS=${HIL_PL_OPS:-300}
STATES=${HIL_PL_CRASH_STATES:-2000}
SEED=${HIL_PL_SEED:-$((RANDOM * 32768 + RANDOM))}
FILE_ENGINE=${HIL_PL_FILE_ENGINE:-uring}
MUTANT=0
while [ $# -gt 0 ]; do
	case "$1" in
	--ops) OPS=$2; shift 2 ;;
	--crash-states) STATES=$2; shift 2 ;;
	--seed) SEED=$2; shift 2 ;;
	--mutant) MUTANT=1; shift ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) die "powerloss.sh: unknown option $1" ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || die "usage: powerloss.sh [--ops N] [--crash-states N] [--seed S] [--mutant] KVER"
KVER=$1
load_kernel_env "$KVER"
LOGD=$HIL_BUILD/logs/$KVER
IMGD=$HIL_BUILD/images/$KVER
PY=.venv-hil/bin/python
mkdir -p "$LOGD" "$IMGD"
TAG=powerloss RTAG=pl-replay	# the boot's and the replay's log names (rows of hil.sh's summary)
[ $MUTANT = 0 ] || TAG=powerloss-mutant RTAG=pl-mutant-replay
OUT=$LOGD/$RTAG.results.log
rm -f "$OUT" "$LOGD/$TAG"-*.json "$LOGD/$TAG.rc"
[ -x "$PY" ] && "$PY" -c 'import tutti._tutti, click' 2>/dev/null || die "$PY with tutti is missing (hil.sh makes it)"

# The workload, built here (the guest sees the repo read-only).
BIN=$PWD/build/hil-tests
if [ $MUTANT = 1 ]; then
	M=$HIL_BUILD/pl-mutant
	rm -rf "$M"
	mkdir -p "$M/kmod"
	cp -r libtutti "$M/"
	cp -r kmod/include "$M/kmod/"	# libtutti includes ../../../kmod/include
	grep -q 'ret = to_commit && !t->prepared ? txn_flush(t) : 0;' "$M/libtutti/src/store/txn.c" ||
		die "--mutant: the data flush in finish_write() is not where this script expects it"
	sed -i 's/ret = to_commit && !t->prepared ? txn_flush(t) : 0;/ret = 0; \/* MUTANT *\//' \
		"$M/libtutti/src/store/txn.c"
	BIN=$M/bin
	LIB=(LIBTUTTI="$M/libtutti")
else
	LIB=()
fi
make -s -C tests/hil OUT="$BIN" "${LIB[@]}" >"$LOGD/$TAG-build.log" 2>&1 &&
	make -s -C tests/hil/powerloss OUT="$BIN" "${LIB[@]}" >>"$LOGD/$TAG-build.log" 2>&1 ||
	{ tail -20 "$LOGD/$TAG-build.log" >&2; die "building pl_writer failed (log: $LOGD/$TAG-build.log)"; }

CHILD=
# run-qemu.sh kills its QEMU on TERM: pass ours on (hil.sh sends it when it is stopped)
trap '[ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null; wait; exit 143' TERM
trap '[ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null; wait; exit 130' INT

# 1. The logged boot (again once if the guest kernel died before /init, as hil.sh does).
for try in 1 2; do
	rm -f "$IMGD"/pl-[ab].img "$IMGD"/pl-[ab].log
	qemu-img create -q -f raw "$IMGD/pl-a.img" 128M
	qemu-img create -q -f raw "$IMGD/pl-b.img" 128M
	set +e
	scripts/hil/run-qemu.sh --suite tests/hil/powerloss/guest.sh --tag "$TAG" \
		--env "PL_OPS=$OPS" --env "PL_SEED=$SEED" --env "PL_FILE_ENGINE=$FILE_ENGINE" --env "TUTTI_HIL_BIN=$BIN" \
		--blklog "a=$IMGD/pl-a.log" --blklog "b=$IMGD/pl-b.log" \
		"$KVER" powerloss "$IMGD/pl-a.img" "$IMGD/pl-b.img" &
	CHILD=$!
	wait "$CHILD"
	rc=$?
	CHILD=
	set -e
	[ $rc -eq 125 ] && [ $try = 1 ] && ! grep -q '^HIL-INIT' "$LOGD/$TAG.results.log" 2>/dev/null || break
	cp "$LOGD/$TAG.console.log" "$LOGD/$TAG.no-init.1.console.log"
	log "$KVER/$TAG: the guest kernel died before /init (not our code): boot again"
done
echo "$rc" >"$LOGD/$TAG.rc"

# 2. The replay, one engine per drive.
t0=$(date +%s)
n=0 pass=0 fail=0
emit() {	# TAP lines of one replay, renumbered
	local line
	while IFS= read -r line; do
		case $line in
		"ok - "*) n=$((n + 1)) pass=$((pass + 1)); echo "ok $n - ${line#ok - }" ;;
		"not ok - "*) n=$((n + 1)) fail=$((fail + 1)); echo "not ok $n - ${line#not ok - }" ;;
		*) echo "$line" ;;
		esac
	done
}
{
	echo "# power-loss replay of $KVER: seed $SEED, $OPS operations per engine, $STATES crash states per engine"
	if [ "$rc" -ne 0 ]; then
		n=1 fail=1
		echo "not ok 1 - the logged boot failed (exit $rc; $LOGD/$TAG.console.log): nothing to replay"
	else
		for e in kqueue:a "$FILE_ENGINE:b"; do
			eng=${e%%:*} d=${e#*:}
			emit < <("$PY" tests/hil/powerloss/replay.py --log "$IMGD/pl-$d.log" --disk "$IMGD/pl-$d.img" \
				--journal "$LOGD/$TAG.results.log" --engine "$eng" --crash-states "$STATES" \
				--seed "$SEED" --json "$LOGD/$TAG-$eng.json" 2>&1)
		done
	fi
	echo "1..$n"
	echo "HIL-RESULT: $pass passed, $fail failed"
} >"$OUT"
echo "boot $KVER $RTAG: $(($(date +%s) - t0))s" >>"$HIL_BUILD/timings"
# hil.sh's summary prints the TAP lines; the failures' details only come from here
pat='^# FAIL'
[ ! -t 2 ] || pat='^(not )?ok |^# FAIL|^HIL-RESULT'
grep -E "$pat" "$OUT" | sed "s/^/  [$KVER $RTAG] /" | cut -c1-400 >&2 || true
if [ $MUTANT = 1 ]; then
	if grep -q '^not ok .*0 wrong bytes served' "$OUT"; then
		log "$KVER: --mutant: the replay found the missing data flush (as it must)"
		exit 0
	fi
	log "$KVER: --mutant: the replay did NOT find the missing data flush"
	exit 1
fi
[ "$rc" -eq 0 ] && ! grep -q '^not ok' "$OUT"
