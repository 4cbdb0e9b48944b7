#!/usr/bin/env bash
# One HIL boot: QEMU (TCG, q35, 2 GiB, 2 CPUs) with two emulated NVMe controllers and the host's
# root over virtio 9p; the guest runs the suite for PHASE and powers off.
#
#   scripts/hil/run-qemu.sh [options] KVER PHASE IMG_A IMG_B
#     --timeout S          kill QEMU (SIGKILL) after S seconds: exit 124       (default: $HIL_BOOT_TIMEOUT or 720)
#     --kill-on MARKER     SIGKILL QEMU a random 0.5-3 s after a line starting with MARKER appears on
#                          the results port (crash-reboot scenario): exit 137 when that happened
#     --kill-delay-ms MS   fixed delay instead of the random one
#     --suite PATH         the guest script, relative to the repo (default: tests/hil/run-guest.sh)
#     --tag NAME           log names: build/hil/logs/KVER/NAME.{console,results}.log (default: PHASE)
#     --env KEY=VALUE      one more variable for the guest suite (repeatable)
#     --blklog a|b=LOG     put that drive behind QEMU's blklogwrites driver: every write and flush
#                          the guest issues is logged to LOG (dm-log-writes format; created empty)
#     --media-errors a|b   that drive behind QEMU's blkdebug driver: reads of sectors 4105 and 7000
#                          and writes of sector 9000 fail with EIO (an NVMe error status for the
#                          guest) once a write-zeroes has reached the drive (the guest asks for one
#                          through QMP: tests/hil/kq_media.c); the guest gets TUTTI_HIL_MEDIA
#                          ("DRIVE READ_SECTORS WRITE_SECTORS")
#
# QMP requests of the guest: a results-port line "HIL-QMP <json>" (also after "# ") is sent to
# QEMU's QMP socket by scripts/hil/qmp.py, in order, as it appears (e.g. block_set_io_throttle to
# stall a command; {"hil":"pause","ms":N} for stop/cont); replies in <tag>.qmp.log.
#
# Exit status: the guest suite's rc (from "HIL-EXIT <rc>"); 124 timeout; 137 killed on purpose
# (--kill-on); 125 QEMU ended without HIL-EXIT (panic, init failure: see the console log);
# 126 QEMU could not start.
#
# Hardware seen by the guest:
#   0000:00:04.0  nvme serial=tuttiA  IMG_A
#   0000:00:05.0  nvme serial=tuttiB  IMG_B, 16 MiB CMB (BAR2)
#   0000:00:06.0  virtio-9p, mount_tag=hostroot: the host's /, read-only
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/hil/lib.sh

TIMEOUT=${HIL_BOOT_TIMEOUT:-720}
KILL_ON=
KILL_DELAY_MS=
SUITE=${HIL_SUITE:-tests/hil/run-guest.sh}
TAG=
EXTRA_ENV=()
BLKLOG_a= BLKLOG_b=
MEDIA=
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout) TIMEOUT=$2; shift 2 ;;
	--kill-on) KILL_ON=$2; shift 2 ;;
	--kill-delay-ms) KILL_DELAY_MS=$2; shift 2 ;;
	--suite) SUITE=$2; shift 2 ;;
	--tag) TAG=$2; shift 2 ;;
	--env) EXTRA_ENV+=("$2"); shift 2 ;;
	--blklog)
		case "$2" in
		a=?* | b=?*) printf -v "BLKLOG_${2%%=*}" '%s' "${2#*=}" ;;
		*) die "run-qemu.sh: --blklog takes a=LOG or b=LOG, not $2" ;;
		esac
		shift 2 ;;
	--media-errors)
		case "$2" in a | b) MEDIA=$2 ;; *) die "run-qemu.sh: --media-errors takes a or b, not $2" ;; esac
		shift 2 ;;
	--) shift; break ;;
	-*) die "run-qemu.sh: unknown option $1" ;;
	*) break ;;
	esac
done
[ $# -eq 4 ] || die "usage: run-qemu.sh [options] KVER PHASE IMG_A IMG_B"
KVER=$1 PHASE=$2 IMG_A=$(realpath "$3") IMG_B=$(realpath "$4")
TAG=${TAG:-$PHASE}
load_kernel_env "$KVER"
KD=$HIL_BUILD/kernels/$KVER
REPO=$(pwd)
[ -f "$KD/initramfs.cpio.gz" ] || die "no initramfs for $KVER: run scripts/hil/build-initramfs.sh $KVER"
[ -f "$IMG_A" ] && [ -f "$IMG_B" ] || die "disk images $IMG_A / $IMG_B missing"
[ -x "$SUITE" ] || die "guest suite $SUITE is missing or not executable"

LOGD=$HIL_BUILD/logs/$KVER
RUND=$HIL_BUILD/run
mkdir -p "$LOGD" "$RUND"
CONSOLE=$LOGD/$TAG.console.log
RESULTS=$LOGD/$TAG.results.log
ENVF=$RUND/$KVER.$TAG.env
rm -f "$CONSOLE" "$RESULTS" "$LOGD/$TAG.kill"

q() { printf "%q" "$1"; }
# --media-errors: blkdebug's rules, asleep (state 1) until a write-zeroes (state 2)
MEDIA_READ=4105,7000 MEDIA_WRITE=9000
MEDIA_CONF=$RUND/$KVER.$TAG.blkdebug.conf
if [ -n "$MEDIA" ]; then
	{
		printf '[set-state]\nevent = "pwritev_zero"\nstate = "1"\nnew_state = "2"\n'
		for sec in ${MEDIA_READ//,/ }; do
			printf '[inject-error]\nevent = "read_aio"\nstate = "2"\niotype = "read"\nsector = "%s"\nerrno = "5"\n' "$sec"
		done
		for sec in ${MEDIA_WRITE//,/ }; do
			printf '[inject-error]\nevent = "write_aio"\nstate = "2"\niotype = "write"\nsector = "%s"\nerrno = "5"\n' "$sec"
		done
	} >"$MEDIA_CONF"
fi
{
	echo "# written by scripts/hil/run-qemu.sh, sourced by the guest's /init"
	echo "export TUTTI_HIL=1"
	echo "export TUTTI_HIL_PHASE=$(q "$PHASE")"
	echo "export TUTTI_KVER=$(q "$KVER")"
	echo "export TUTTI_NVME_BDFS='0000:00:04.0 0000:00:05.0'"
	echo "export TUTTI_REPO=$(q "$REPO")"
	ko=$KD/tutti.ko
	[ -f "$ko" ] || ko=
	echo "export TUTTI_KO=$(q "$ko")"
	# the kernel's nvme.ko inside the unpacked module tree (.ko.xz on 6.12: the chroot's kmod insmod
	# and modprobe read xz/zstd); its dependencies beside it, modules.dep made by depmod
	nvme_rel=$(grep -oE '^[^:]*/nvme\.ko(\.xz|\.zst|\.gz)?:' "$MODROOT/modules.dep" | head -1 | tr -d :)
	[ -n "$nvme_rel" ] || die "$KVER: nvme.ko not found in $MODROOT/modules.dep"
	echo "export TUTTI_NVME_KO=$(q "$MODROOT/$nvme_rel")"
	# the same driver and its dependencies decompressed, in load order (plain insmod, one by one)
	echo "export TUTTI_NVME_KOS=$(q "$(tr '\n' ' ' <"$KD/ko/nvme.order" | sed 's/ $//')")"
	# modprobe -d "$TUTTI_MODULES_ROOT" MODULE: any module of this kernel, with its dependencies
	echo "export TUTTI_MODULES_ROOT=$(q "$(realpath "$KD/root")")"
	# the P2P build of tutti.ko and the stand-in for the NVIDIA P2P API (empty if not built)
	p2p=$KD/tutti-nv-p2p.ko
	[ -f "$p2p" ] || p2p=
	echo "export TUTTI_KO_NV_P2P=$(q "$p2p")"
	fk=$KD/nvp2p_fake.ko
	[ -f "$fk" ] || fk=
	echo "export TUTTI_NVP2P_FAKE_KO=$(q "$fk")"
	st=$KD/hil_selftest.ko
	[ -f "$st" ] || st=
	echo "export TUTTI_HIL_SELFTEST_KO=$(q "$st")"
	echo "export HIL_SUITE=$(q "$SUITE")"
	echo "export PATH=$(q "$REPO/.venv-hil/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")"
	echo "export TUTTI_VENV=$(q "$REPO/.venv-hil")"
	echo "export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 LC_ALL=C.UTF-8 TERM=dumb"
	echo "export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1"
	echo "export PYTEST_ADDOPTS='-p no:cacheprovider'"
	[ -z "$MEDIA" ] || echo "export TUTTI_HIL_MEDIA=$(q "$MEDIA $MEDIA_READ $MEDIA_WRITE")"
	for kv in "${EXTRA_ENV[@]}"; do
		[[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $kv: not KEY=VALUE"
		echo "export ${kv%%=*}=$(q "${kv#*=}")"
	done
} >"$ENVF"

QEMU_PID=
cleanup() {
	if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
		kill -9 "$QEMU_PID" 2>/dev/null || true
		wait "$QEMU_PID" 2>/dev/null || true
	fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# drive_opts ID IMAGE [LOG]: a raw drive, or with LOG the same image behind blklogwrites; the
# drive --media-errors names behind blkdebug
drive_opts() {
	if [ "$1" = "$MEDIA" ]; then
		[ -z "$3" ] || die "run-qemu.sh: --media-errors and --blklog on one drive"
		echo "driver=raw,file.driver=blkdebug,file.config=$MEDIA_CONF,file.image.driver=file,file.image.filename=$2,if=none,id=$1,cache=writeback"
		return
	fi
	if [ -z "$3" ]; then
		echo "file=$2,format=raw,if=none,id=$1,cache=writeback"
		return
	fi
	: >"$3"
	echo "driver=blklogwrites,file.driver=file,file.filename=$2,log.driver=file,log.filename=$(realpath "$3"),log-sector-size=512,if=none,id=$1,cache=writeback"
}

QEMU=(qemu-system-x86_64
	-accel tcg -machine q35 -m 2G -smp 2
	-nographic -monitor none -no-reboot -vga none -nic none
	-kernel "$VMLINUZ" -initrd "$KD/initramfs.cpio.gz"
	-append "console=ttyS0,115200 panic=-1 mitigations=off kfence.sample_interval=100 hil_env=$ENVF"
	-serial "file:$CONSOLE" -serial "file:$RESULTS"
	-drive "$(drive_opts a "$IMG_A" "$BLKLOG_a")"
	-device nvme,serial=tuttiA,drive=a,addr=4
	-drive "$(drive_opts b "$IMG_B" "$BLKLOG_b")"
	-device nvme,serial=tuttiB,drive=b,cmb_size_mb=16,addr=5
	-fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot,addr=6
)
# The guest's QMP requests (see the top): a socket, and forward_qmp in the wait loop.
QMP_SOCK=$RUND/$KVER.$TAG.qmp
QMP_DONE=0
rm -f "$QMP_SOCK" "$LOGD/$TAG.qmp.log"
QEMU+=(-qmp "unix:$QMP_SOCK,server=on,wait=off")
forward_qmp() {
	local n line
	n=$(grep -acE '^(# )?HIL-QMP ' "$RESULTS" 2>/dev/null) || n=0
	while [ "$QMP_DONE" -lt "$n" ]; do
		QMP_DONE=$((QMP_DONE + 1))
		line=$(grep -aE '^(# )?HIL-QMP ' "$RESULTS" | sed -n "${QMP_DONE}p" | tr -d '\r')
		scripts/hil/qmp.py "$QMP_SOCK" "${line#*HIL-QMP }" >>"$LOGD/$TAG.qmp.log" 2>&1 ||
			log "$KVER/$TAG: QMP request failed: ${line#*HIL-QMP } (see $TAG.qmp.log)"
	done
}
printf '%q ' "${QEMU[@]}" >"$LOGD/$TAG.qemu-cmd"
echo >>"$LOGD/$TAG.qemu-cmd"

start=$(date +%s.%N)
"${QEMU[@]}" </dev/null >"$LOGD/$TAG.qemu.log" 2>&1 &
QEMU_PID=$!
deadline=$(($(date +%s) + TIMEOUT))
killed=
marker_at=
kill_at_ms=
now_ms() { date +%s%3N; }
while kill -0 "$QEMU_PID" 2>/dev/null; do
	if [ "$(date +%s)" -ge "$deadline" ]; then
		killed=timeout
		kill -9 "$QEMU_PID" 2>/dev/null || true
		break
	fi
	if [ -n "$KILL_ON" ]; then
		if [ -z "$marker_at" ] && grep -qa "^$KILL_ON" "$RESULTS" 2>/dev/null; then
			marker_at=$(now_ms)
			delay=${KILL_DELAY_MS:-$((500 + RANDOM % 2501))}
			kill_at_ms=$((marker_at + delay))
			log "$KVER/$TAG: saw $KILL_ON, SIGKILL of QEMU in $delay ms"
			echo "SIGKILLed $delay ms after $KILL_ON" >"$LOGD/$TAG.kill"
		fi
		if [ -n "$kill_at_ms" ] && [ "$(now_ms)" -ge "$kill_at_ms" ]; then
			killed=marker
			kill -9 "$QEMU_PID" 2>/dev/null || true
			break
		fi
		sleep 0.05
	else
		sleep 0.2
	fi
	forward_qmp
done
set +e
wait "$QEMU_PID" 2>/dev/null
qrc=$?
set -e
QEMU_PID=
secs=$(echo "$(date +%s.%N) - $start" | bc)
secs=$(printf '%.1f' "$secs")

exit_line=$(grep -a '^HIL-EXIT ' "$RESULTS" 2>/dev/null | tail -1 | tr -d '\r' || true)
case "$killed" in
timeout)
	log "$KVER/$TAG: TIMEOUT after ${TIMEOUT}s: QEMU killed (console: $CONSOLE)"
	echo "boot $KVER $TAG: timeout ${secs}s" >>"$HIL_BUILD/timings"
	exit 124
	;;
marker)
	log "$KVER/$TAG: QEMU SIGKILLed on purpose after ${secs}s (${delay} ms after $KILL_ON)"
	echo "boot $KVER $TAG: killed after ${secs}s" >>"$HIL_BUILD/timings"
	exit 137
	;;
esac
echo "boot $KVER $TAG: ${secs}s" >>"$HIL_BUILD/timings"
if [ -z "$exit_line" ]; then
	if [ ! -s "$CONSOLE" ]; then
		log "$KVER/$TAG: QEMU failed to start (exit $qrc): $(tail -5 "$LOGD/$TAG.qemu.log")"
		exit 126
	fi
	log "$KVER/$TAG: QEMU exited ($qrc) after ${secs}s without HIL-EXIT: guest panic or init failure"
	# The first oops says what went wrong; the tail only that the kernel stopped.
	if grep -qaE 'BUG: |Oops: |general protection fault' "$CONSOLE"; then
		log "first oops in the console log:"
		grep -aE -m1 -A24 'BUG: |Oops: |general protection fault' "$CONSOLE" | sed 's/^/    /' >&2
	fi
	log "last console lines:"
	tail -15 "$CONSOLE" | sed 's/^/    /' >&2
	exit 125
fi
rc=${exit_line#HIL-EXIT }
log "$KVER/$TAG: guest finished in ${secs}s, suite exit $rc (QEMU exit $qrc)"
exit "$rc"
