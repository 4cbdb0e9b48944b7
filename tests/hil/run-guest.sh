#!/bin/bash
# Runs INSIDE the HIL guest (chroot of the host's root): tutti.ko and the
# kqueue engine against QEMU's emulated NVMe controllers.  Prints one TAP
# line per check and ends with "HIL-RESULT: N passed, M failed, K skipped".
# Each test program speaks TAP (libtutti/tests/tap.h through hil.h); its lines
# are numbered into this stream as they come, and its whole output is judged by
# the project's TAP consumer (scripts/tap-run: prove): a program that dies
# before its plan, or with a short one, fails here.
#
# Environment (the harness contract):
#   TUTTI_HIL=1, TUTTI_KO=/path/tutti.ko for this kernel,
#   TUTTI_NVME_BDFS="A B" (A plain, B with a CMB; else found by class 0x010802),
#   TUTTI_NVME_KO=/path/nvme.ko[.xz] for the takeover test (optional),
#   TUTTI_HIL_BIN (default build/hil-tests: built with make -C tests/hil),
#   TUTTI_HIL_KILLS (default 100), TUTTI_HIL_CRASH_TRIALS (default 20),
#   TUTTI_HIL_RACE_ROUNDS (default 100),
#   TUTTI_HIL_FM_SCHEDULES (default 60; random fault schedules of the store on A and B through
#   fault:kqueue, test_fault_model), TUTTI_HIL_FM_SEED (default random, printed),
#   TUTTI_HIL_FM_CHUNK (default 20 schedules per TAP line).
#
# usage: run-guest.sh                 everything
#        run-guest.sh fault-model     only the fault schedules (phase fault-model:
#                                     scripts/hil/faultmodel.sh, long runs)
#        run-guest.sh media-errors    only the device-error test (drive behind blkdebug:
#                                     run-qemu.sh --media-errors, TUTTI_HIL_MEDIA)
#        run-guest.sh crash-write     format, then write until QEMU is killed
#                                     (prints "HIL-ACKED <n>" per committed block)
#        run-guest.sh crash-check N   after the reboot: check clean, blocks < N
#                                     served only with their exact bytes
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BIN=${TUTTI_HIL_BIN:-$ROOT/build/hil-tests}
# The harness passes its phase in the environment (scripts/hil/README.md).
case "${TUTTI_HIL_PHASE:-main}" in
crash-write) set -- crash-write ;;
verify) set -- crash-check "${TUTTI_HIL_LAST_ACKED:-0}" ;;
fault-model) set -- fault-model ;;
media-errors) set -- media-errors ;;
esac
MODE=${1:-all} CRASH_N=${2:-}
N=0 PASS=0 FAIL=0 SKIP=0

BEAT=/tmp/hil-beat	# the last result line (also from the pipeline subshells of prog)
ok()     { N=$((N + 1)); PASS=$((PASS + 1)); echo "ok $N - $*"; echo "ok $N - $*" >"$BEAT"; }
not_ok() { N=$((N + 1)); FAIL=$((FAIL + 1)); echo "not ok $N - $*"; echo "not ok $N - $*" >"$BEAT"; }
skip()   { N=$((N + 1)); SKIP=$((SKIP + 1)); echo "ok $N - # SKIP $*"; echo "skip $N" >"$BEAT"; }

# A step that hangs ends in the host's boot timeout with nothing said about why (CI saw one:
# "hand A back to tutti" after the mounted-device refusal, on 6.1, once).  After HIL_STALL_S
# (150) seconds without a result line, once: the processes and where they sleep on the
# results port, blocked tasks and every CPU's backtrace (sysrq w, l) on the console.
stall_watchdog() {
	local quiet
	while sleep 10; do
		quiet=$(($(date +%s) - $(stat -c %Y "$BEAT" 2>/dev/null || date +%s)))
		[ "$quiet" -ge "${HIL_STALL_S:-150}" ] || continue
		echo "# HIL-STALL: no result for ${quiet}s; the last: $(head -c 300 "$BEAT")"
		ps -eo pid,ppid,stat,wchan:32,etimes,args 2>/dev/null | awk '$2 != 2 && $1 != 2' | sed 's/^/# /'
		echo 1 >/proc/sys/kernel/sysrq 2>/dev/null
		echo w >/proc/sysrq-trigger 2>/dev/null
		echo l >/proc/sysrq-trigger 2>/dev/null
		echo "# HIL-STALL: blocked tasks and CPU backtraces are on the console log"
		return
	done
}
: >"$BEAT"
stall_watchdog &
WATCHDOG=$!
trap 'kill $WATCHDOG 2>/dev/null' EXIT
# KFENCE (6.12: built in, off at boot) samples slab allocations and reports a use after free or
# an out-of-bounds access of one: on for the race tests (one allocation in every 1 ms).
# The pool is made at boot (run-qemu.sh: kfence.sample_interval=100): enabled late, KFENCE
# allocates it with alloc_contig_pages, which on a guest whose memory the earlier tests
# fragmented looped for minutes (6.12: soft lockups in param_set_sample_interval, the boot
# timed out). Here the interval only gets shorter.
kfence_on() {
	local p=/sys/module/kfence/parameters/sample_interval
	if [ -w $p ] && echo 1 >$p 2>/dev/null; then echo "# KFENCE on (sample_interval $(cat $p) ms)"
	else echo "# KFENCE not available in $(uname -r)"; fi
}
expect() { local d=$1; shift; if "$@" >/tmp/hil.out 2>&1; then ok "$d"; else not_ok "$d"; sed 's/^/# /' /tmp/hil.out; fi; }
finish() {
	echo "1..$N"
	echo "HIL-RESULT: $PASS passed, $FAIL failed, $SKIP skipped"
	exit $((FAIL != 0))
}

# A test program's TAP lines, numbered into this stream (the plan and anything else as comments).
prog() {
	local tag=$1 line
	while IFS= read -r line; do
		case $line in
		"ok "[0-9]*" - # SKIP"*) skip "[$tag] ${line#ok * - # SKIP }" ;;
		"ok "[0-9]*" - "*) ok "[$tag] ${line#ok * - }" ;;
		"not ok "[0-9]*" - "*) not_ok "[$tag] ${line#not ok * - }" ;;
		"1..0 # SKIP"*) skip "[$tag] ${line#1..0 # SKIP }" ;;	# nothing of it runs here
		"#"* | "HIL-QMP "*) echo "$line" ;;	# HIL-QMP: for the host (run-qemu.sh)
		*) echo "# $line" ;;
		esac
	done
}
# Why a program's saved TAP output fails the consumer's judgement (no plan, a short plan), or
# nothing when it passes.
tap_verdict() {
	local res
	res=$("$ROOT/scripts/tap-run" --saved "$1" 2>&1) && return 0
	echo "$res" | sed -n 's/^ *Parse errors: //p; s/^tap-run: //p' | head -3 | paste -sd ' '
	return 1
}
prog_rc() { local tag=$1; shift; prog_run "$tag" "$BIN/kq_hw" "$@"; }
prog_store() { local tag=$1; shift; prog_run "$tag" "$BIN/kq_store" "$@"; }
# Run a test program: its lines numbered into this stream as they come; then a failure of its own
# when it failed silently (an exit status, or a missing or short plan: it died on the way).
prog_run() {
	local tag=$1 out raw why
	shift
	out=$(mktemp) raw=$(mktemp)
	{ "$@" 2>&1; echo "HIL-RC $?"; } | tee "$raw" | prog "$tag" | tee "$out"
	# counters are lost in the pipe's subshell: recount
	PASS=$((PASS + $(grep -c "^ok [0-9]* - [^#]" "$out")))
	SKIP=$((SKIP + $(grep -c "^ok [0-9]* - # SKIP" "$out")))
	FAIL=$((FAIL + $(grep -c "^not ok " "$out")))
	N=$((N + $(grep -c "^ok \|^not ok " "$out")))
	if ! grep -q "^not ok" "$out"; then
		if ! grep -q "^# HIL-RC 0$" "$out"; then
			not_ok "[$tag] exited with $(sed -n 's/^# HIL-RC //p' "$out")"
		elif ! why=$(tap_verdict "$raw"); then
			not_ok "[$tag] its TAP output is complete: $why"
		fi
	fi
	rm -f "$out" "$raw"
}

# The store under random I/O fault schedules (issue 12), the driver `make ctest` runs on files
# (libtutti/tests/fault_model.c), here on the two tutti.ko nodes through fault:kqueue, its crash
# view a second queue pair on each controller after every step.  In chunks of
# TUTTI_HIL_FM_CHUNK schedules, one TAP line each, so the stall watchdog hears from it; stops
# at the first chunk that fails (its line says the seed that reproduces it).
fault_model() {
	local total=${TUTTI_HIL_FM_SCHEDULES:-60} chunk=${TUTTI_HIL_FM_CHUNK:-20} ran=0 n fail0
	local seed=${TUTTI_HIL_FM_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')} t0
	t0=$(date +%s)
	echo "# fault model: $total schedules on $NA $NB through fault:kqueue, seeds from $seed"
	while [ $ran -lt "$total" ]; do
		n=$((total - ran < chunk ? total - ran : chunk))
		fail0=$FAIL
		prog_run fault-model "$BIN/test_fault_model" --engine kqueue --paths "$NA,$NB" \
			--schedules $n --seed $((seed + ran))
		ran=$((ran + n))
		[ "$FAIL" -eq "$fail0" ] || break
	done
	echo "# fault model: $ran schedules in $(($(date +%s) - t0)) s"
	# Every schedule opened a live handle and a crash view per step: all closed, all given back.
	local d q p left=
	for d in $A $B; do
		q=$(cat /sys/bus/pci/devices/$d/user_queues) p=$(cat /sys/bus/pci/devices/$d/pinned_pages)
		[ "$q" = 0 ] && [ "$p" = 0 ] || left="$left $d: $q queues, $p pinned pages;"
	done
	[ -z "$left" ] && ok "[fault-model] every queue and pinned page given back ($A $B)" \
		|| not_ok "[fault-model] every queue and pinned page given back:$left"
}

# Real device errors (QEMU's blkdebug under one drive, run-qemu.sh --media-errors): exactly the
# blocks over a bad sector fail, none is dropped (kq_media.c).  Last of the store tests: the
# drive's bad sectors stay bad once woken.
media_errors() {
	if [ -z "${TUTTI_HIL_MEDIA:-}" ]; then
		skip "no drive behind blkdebug (run-qemu.sh --media-errors): device-error test"
		return
	fi
	set -- $TUTTI_HIL_MEDIA
	CB=/dev/$(node_of $B) NB=/dev/$(node_of $B)n1
	wait_for $NB || { not_ok "[media-errors] $NB exists"; return; }
	local t0
	t0=$(date +%s)
	prog_run media-errors "$BIN/kq_media" $NA $NB $1 $([ $1 = b ] && echo 1 || echo 0) $2 $3
	echo "# device errors: $(($(date +%s) - t0)) s"
}

bdfs() {
	if [ -n "${TUTTI_NVME_BDFS:-}" ]; then echo $TUTTI_NVME_BDFS; return; fi
	for d in /sys/bus/pci/devices/*; do
		[ "$(cat $d/class)" = 0x010802 ] && basename $d
	done
}
node_of() { # BDF -> tuttiN (controller node name)
	local m
	for m in /sys/bus/pci/devices/$1/misc/tutti*; do
		case $(basename $m) in *n*) ;; *) basename $m; return ;; esac
	done
}
wait_for() { local i; for i in $(seq 50); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

set -- $(bdfs) ; A=${1:-} B=${2:-}
[ -n "$A" ] && [ -n "$B" ] || { not_ok "two NVMe controllers present (found: $A $B)"; finish; }
[ -x "$BIN/kq_hw" ] && [ -x "$BIN/kq_store" ] || make -s -C tests/hil OUT="$BIN" >/dev/null || { not_ok "build guest tests"; finish; }
DMESG0=$(dmesg | wc -l)

# Load and attach: tutti binds only what it is handed.
if ! lsmod | grep -q "^tutti "; then
	expect "insmod tutti.ko ($(uname -r))" insmod "${TUTTI_KO:?TUTTI_KO not set}"
fi
[ -z "$(readlink /sys/bus/pci/devices/$A/driver)" ] && ok "tutti.ko did not grab $A by class" || true
for d in $A $B; do expect "attach $d" "$BIN/kq_attach" attach $d; done
CA=/dev/$(node_of $A) CB=/dev/$(node_of $B)
NA=${CA}n1 NB=${CB}n1
wait_for $NA && wait_for $NB && ok "nodes $NA and $NB exist" || { not_ok "nodes $NA $NB"; finish; }

case $MODE in
crash-write)
	"$BIN/kq_store" store $NA $NB >/dev/null 2>&1	# formats with force
	echo HIL-WRITING	# the host kills QEMU a random moment after this
	"$BIN/kq_store" writer $NA $NB 0 | sed -u 's/^/HIL-ACKED /'
	exit 1 ;;
fault-model)
	fault_model
	finish ;;
media-errors)
	media_errors
	finish ;;
crash-check)
	prog_store verify verify $NA $NB "${CRASH_N:?crash-check needs N}"
	expect "tutti-admin check is clean after QEMU was killed mid-write" \
		"$ROOT/.venv-hil/bin/tutti-admin" check $NA $NB
	finish ;;
esac
echo "HIL-REQUEST crash-reboot"	# the harness runs crash-write, kills QEMU, then verify

prog_rc identify identify $CA $NA
prog_rc identify identify $CB $NB
prog_rc smart smart $NA
prog_rc sgl-prp sglprp $NA
prog_rc mdts mdts $NA
TUTTI_KQ_PRP=1 prog_rc mdts-prp mdts $NA
prog_rc cmb cmb $NA $CB
prog_rc malformed malformed $NA
# GPU memory (nvidia-p2p): this module is the build without it (no NVIDIA driver here).
n0=$(dmesg | wc -l)
prog_run gpu-p2p "$BIN/kq_p2p" $NA
n1=$(dmesg | wc -l)
[ "$n1" -eq "$n0" ] && ok "[gpu-p2p] refusals left the kernel log untouched" \
	|| { not_ok "[gpu-p2p] refusals left the kernel log untouched"; dmesg | tail -n +$((n0 + 1)) | sed 's/^/# /'; }
prog_rc sigkill kill $NA "${TUTTI_HIL_KILLS:-100}"
prog_store store store $NA $NB
TUTTI_KQ_PRP=1 prog_store store-prp store $NA $NB
TUTTI_KQ_SQ_PEER=$CB prog_store store-sq-in-cmb store $NA $NB
prog_store crash crash $NA $NB "${TUTTI_HIL_CRASH_TRIALS:-20}"
fault_model

# Kernel-module races (issue 12 items 7, 8, 9), each round a child process under a watchdog,
# and a stalled command (0b): the guest asks the host to throttle drive "a" through QMP so that
# one read takes seconds (kq_stall.c).  The kill is expected: its kernel lines are bracketed
# for the final dmesg check.
R=${TUTTI_HIL_RACE_ROUNDS:-100}
t_races=$(date +%s)
kfence_on
prog_run race-mmap-dma "$BIN/kq_race" mmap-dma $NA $R
prog_run race-deleted-map "$BIN/kq_race" deleted-map $NA $R
prog_run race-unmap-busy "$BIN/kq_race" unmap-busy $NA
prog_run race-fsync-detach "$BIN/kq_race" fsync-detach $B $R
CB=/dev/$(node_of $B); NB=${CB}n1
wait_for $NB && prog_rc after-detach-race identify $CB $NB || not_ok "$NB after the fsync-detach race"
prog_run stall "$BIN/kq_stall" stall $NA a
prog_run stall-pause "$BIN/kq_stall" pause $NA a
echo "HIL-EXPECTED-BEGIN stall-kill" >/dev/kmsg
k0=$(dmesg | wc -l)
prog_run stall-kill "$BIN/kq_stall" stall-kill $NA $A a
echo "HIL-EXPECTED-END stall-kill" >/dev/kmsg
kill_log=$(dmesg | tail -n +$((k0 + 1)))
echo "$kill_log" | grep -q "controller disabled" && ! echo "$kill_log" | grep -qE "did not confirm|BUG|Oops|WARNING" \
	&& ok "[stall-kill] the kernel log says the controller was disabled and confirmed stopped" \
	|| { not_ok "[stall-kill] the kernel log says the controller was disabled and confirmed stopped"; echo "$kill_log" | sed 's/^/# /'; }
echo $A >/sys/bus/pci/drivers/tutti/unbind
expect "rebind $A after the kill" "$BIN/kq_attach" attach $A
CA=/dev/$(node_of $A); NA=${CA}n1
wait_for $NA && prog_rc after-kill sglprp $NA || not_ok "$NA after the kill"
echo "# races and stalled command: $(($(date +%s) - t_races)) s"

# Takeover from the kernel's nvme driver and hand-back.
if [ -n "${TUTTI_NVME_KO:-}" ] && [ -e "$TUTTI_NVME_KO" ]; then
	load_ko() { # load a module file and its dependencies from the same tree
		local ko=$1 dep dir
		dir=${ko%/kernel/*}
		for dep in $(modinfo -F depends "$ko" | tr , ' '); do
			lsmod | grep -q "^${dep//-/_} " && continue
			load_ko "$(find "$dir" -name "$dep.ko*" | head -1)"
		done
		lsmod | grep -q "^$(basename ${ko%%.ko*} | tr - _) " || insmod "$ko"
	}
	expect "detach $A (nvme driver module loaded)" bash -c "$(declare -f load_ko); load_ko $TUTTI_NVME_KO && $BIN/kq_attach detach $A"
	ctl=$(ls /sys/bus/pci/devices/$A/nvme 2>/dev/null | head -1)
	[ "$(basename "$(readlink /sys/bus/pci/devices/$A/driver)")" = nvme ] && [ -n "$ctl" ] \
		&& ok "nvme took $A over ($ctl)" || not_ok "nvme took $A over"
	blk=/dev/${ctl}n1
	wait_for $blk && ok "$blk appeared" || not_ok "$blk appeared"
	for m in crc32c_generic ext4; do	# ext4 wants crc32c; nothing autoloads here
		load_ko "$(find "${TUTTI_NVME_KO%/kernel/*}" -name "$m.ko*" | head -1)" 2>/dev/null
	done
	if command -v mkfs.ext4 >/dev/null && grep -qw ext4 /proc/filesystems; then
		mkdir -p /tmp/hil-mnt
		if mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=1 $blk && mount $blk /tmp/hil-mnt; then
			out=$("$BIN/kq_attach" attach $A 2>&1); rc=$?
			[ $rc -ne 0 ] && echo "$out" | grep -q "mounted on /tmp/hil-mnt" \
				&& ok "attach refuses the mounted $blk: $out" || not_ok "attach refuses a mounted device (rc $rc: $out)"
			[ "$(basename "$(readlink /sys/bus/pci/devices/$A/driver)")" = nvme ] \
				&& ok "refused attach left $A with nvme" || not_ok "refused attach left $A with nvme"
			umount /tmp/hil-mnt
		else
			not_ok "mkfs/mount $blk"
		fi
	else
		skip "mkfs.ext4 or ext4 not available: mounted-device refusal not tested"
	fi
	expect "hand $A back to tutti" "$BIN/kq_attach" attach $A
	CA=/dev/$(node_of $A); NA=${CA}n1
	wait_for $NA && prog_rc after-takeover identify $CA $NA || not_ok "$NA after hand-back"
	rmmod nvme nvme_core 2>/dev/null; true
else
	skip "TUTTI_NVME_KO not set: takeover test"
fi
# tutti-admin doctor sees the module (its version) and both controllers on it; exit 0/1/3 only.
out=$(PYTHONDONTWRITEBYTECODE=1 "${TUTTI_VENV:-$ROOT/.venv-hil}/bin/python" tests/hil/doctor_guest.py $A $B 2>&1) \
	&& ok "tutti-admin doctor: $out" || { not_ok "tutti-admin doctor"; echo "$out" | sed 's/^/# /'; }
out=$(PYTHONDONTWRITEBYTECODE=1 "${TUTTI_VENV:-$ROOT/.venv-hil}/bin/python" -m pytest -q -rsP -p no:cacheprovider tests/hil/test_admin_guest.py 2>&1) && ok "tutti-admin list/attach/detach/health (tests/hil/test_admin_guest.py): $(echo "$out" | tail -1)" || { not_ok "tutti-admin list/attach/detach/health (tests/hil/test_admin_guest.py)"; echo "$out" | sed 's/^/# /'; }
echo "$out" | grep '^ENDURANCE ' | sed 's/^/# /' || true  # the store's bytes-written counter against SMART

# GPU memory for real, as far as the guest allows: the P2P build of tutti.ko against
# nvp2p_fake.ko, a stand-in for the NVIDIA driver's P2P API whose "GPU memory" is B's CMB (both
# builds are module "tutti": swapped, never loaded together; the plain build comes back after).
if [ -n "${TUTTI_KO_NV_P2P:-}" ] && [ -n "${TUTTI_NVP2P_FAKE_KO:-}" ]; then
	bar2=$(sed -n 3p /sys/bus/pci/devices/$B/resource | cut -d' ' -f1)
	expect "rmmod tutti (to load the nvidia-p2p build)" rmmod tutti
	expect "insmod nvp2p_fake (stand-in GPU memory: $B's CMB at $bar2)" \
		insmod "$TUTTI_NVP2P_FAKE_KO" base=$bar2 size=0x1000000
	expect "insmod tutti-nv-p2p.ko" insmod "$TUTTI_KO_NV_P2P"
	CA=/dev/$(node_of $A); NA=${CA}n1; CB=/dev/$(node_of $B)
	if wait_for $NA && wait_for $CB; then
		prog_run gpu-p2p-live "$BIN/kq_p2p" live $NA $CB
		dmesg | tail -n +$((DMESG0 + 1)) | grep -q "GPU memory revoked by its driver: 2 queue(s) stopped" \
			&& ok "[gpu-p2p-live] the revocation was logged (2 queues stopped)" \
			|| not_ok "[gpu-p2p-live] the revocation was logged (2 queues stopped)"
	else
		not_ok "nodes after loading the nvidia-p2p build"
	fi
	expect "rmmod the nvidia-p2p build" rmmod tutti
	expect "rmmod nvp2p_fake (no pin left behind)" rmmod nvp2p_fake
	expect "insmod tutti.ko (the plain build) again" insmod "$TUTTI_KO"
	CA=/dev/$(node_of $A); NA=${CA}n1
	wait_for $NA && ok "$NA back with the plain build" || not_ok "$NA back with the plain build"
else
	skip "no nvidia-p2p build or stand-in (TUTTI_KO_NV_P2P / TUTTI_NVP2P_FAKE_KO): live GPU-memory test"
fi

media_errors

# rmmod shuts the controllers down; loading again rebinds (driver_override stays).
expect "rmmod tutti" rmmod tutti
dmesg | tail -n +$((DMESG0 + 1)) | grep -q "tutti.*shutdown timed out" && not_ok "clean shutdown" || ok "controllers shut down cleanly"
expect "insmod again" insmod "$TUTTI_KO"
CA=/dev/$(node_of $A); NA=${CA}n1
wait_for $NA && prog_rc after-reload smart $NA || not_ok "$NA after reload"

# The kernel log: no oops, warning, bad page, leak or driver error since we started.
bad=$(dmesg | tail -n +$((DMESG0 + 1)) | sed '/HIL-EXPECTED-BEGIN/,/HIL-EXPECTED-END/d' |
	grep -E "BUG|Oops|WARNING|general protection|Bad page|leak|lockdep|tutti.*(timed out|not deleted|disabled|not proven)" | head -5)
[ -z "$bad" ] && ok "dmesg: no oops, warning or leak" || { not_ok "dmesg is clean"; echo "$bad" | sed 's/^/# /'; }
finish
