#!/usr/bin/env bash
# Hardware-in-the-loop: the kernel module and the guest suite on QEMU's emulated NVMe, for each
# current Debian kernel line.  The entry point of `make hil`.
#
#   scripts/hil/hil.sh [--kernels "6.1 6.12"] [--no-crash | --crash] [--no-powerloss] [--suite PATH]
#
# Steps: apt-install what is missing -> fetch/unpack the kernels -> fetch NVIDIA's nv-p2p.h
# (fetch-nv-p2p.sh) -> .venv-hil (tutti + pytest, for the guest) -> per kernel: build kmod/ (and a
# self-test module) with W=1, failing on any warning, and kmod/ again with the GPU peer-to-peer path
# (NV_P2P_INC=<that header>), plus tests/hil/nvp2p-fake (a stand-in for the NVIDIA driver's P2P
# API, since the guest has no NVIDIA driver); build the initramfs; boot with fresh disk images and run the guest suite (phase "main"); when the
# suite asked for it ("HIL-REQUEST crash-reboot" on its output) or with --crash: boot with phase
# crash-write, SIGKILL QEMU 0.5-3 s after the guest prints HIL-WRITING, boot again on the same images
# with phase verify; then the power-loss replay (scripts/hil/powerloss.sh: a boot with both drives
# behind QEMU's blklogwrites, each log replayed here).  Prints every test line per kernel, a summary, and exits non-zero on any
# failure, timeout, or a boot without a HIL-RESULT line.
#
# Environment: HIL_KERNELS (lines, default "6.1 6.12"), HIL_CRASH (auto|0|1), HIL_CRASH_ROUNDS (1),
# HIL_POWERLOSS (1; 0 skips the replay; its sizes: HIL_PL_OPS, HIL_PL_CRASH_STATES, HIL_PL_SEED),
# HIL_BOOT_TIMEOUT (seconds per boot, 720), HIL_BOOT_RETRIES (boots again after a kernel death before
# /init, 1), HIL_SUITE (guest script, default tests/hil/run-guest.sh,
# else the placeholder scripts/hil/placeholder-guest.sh), HIL_IMG_SIZE (512M), PY (python3),
# HIL_VENV_INSTALL=0 (debugging: keep .venv-hil as it is instead of reinstalling from this tree).
# Logs: build/hil/logs/<kver>/ (serial console, results port, module build).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/hil/lib.sh
REPO=$(pwd)
T0=$(date +%s)

KERNELS=${HIL_KERNELS:-6.1 6.12}
CRASH=${HIL_CRASH:-auto}
ROUNDS=${HIL_CRASH_ROUNDS:-1}
POWERLOSS=${HIL_POWERLOSS:-1}
SUITE=${HIL_SUITE:-}
IMG_SIZE=${HIL_IMG_SIZE:-512M}
PY=${PY:-python3}
VENV=.venv-hil
while [ $# -gt 0 ]; do
	case "$1" in
	--kernels) KERNELS=$2; shift 2 ;;
	--no-crash) CRASH=0; shift ;;
	--crash) CRASH=1; shift ;;
	--no-powerloss) POWERLOSS=0; shift ;;
	--suite) SUITE=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "hil.sh: unknown argument $1 (see --help)" ;;
	esac
done

: >"$HIL_BUILD/timings"
rm -rf "$HIL_BUILD/logs"
mkdir -p "$HIL_BUILD/logs"
step_t=0
step() { step_t=$(date +%s); log "== $*"; }
step_done() { echo "step $1: $(($(date +%s) - step_t))s" >>"$HIL_BUILD/timings"; }

CHILD=
on_exit() {
	# run-qemu.sh kills its QEMU on TERM; make sure nothing outlives us
	if [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null; then
		kill -TERM "$CHILD" 2>/dev/null || true
		wait "$CHILD" 2>/dev/null || true
	fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- packages
APT_PKGS=(qemu-system-x86 qemu-utils busybox-static cpio kmod make bc flex bison libelf-dev dwarves
	xz-utils zstd gcc gcc-12 libc6-dev curl gpgv debian-archive-keyring
	perl)	# perl: prove, the TAP consumer run-guest.sh judges each guest program with (scripts/tap-run)
step "packages"
missing=()
for p in "${APT_PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
"$PY" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "install these packages: ${missing[*]}"
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	log "installing ${missing[*]}"
	$sudo apt-get update -qq >"$HIL_BUILD/apt-update.log" 2>&1 || { cat "$HIL_BUILD/apt-update.log" >&2; die "apt-get update failed"; }
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" \
		>"$HIL_BUILD/apt-install.log" 2>&1 || { tail -20 "$HIL_BUILD/apt-install.log" >&2; die "apt-get install ${missing[*]} failed"; }
fi
step_done packages

# ---------------------------------------------------------------- kernels
step "kernels: $KERNELS"
# shellcheck disable=SC2086
scripts/hil/fetch-kernels.sh $KERNELS
mapfile -t KVERS <"$HIL_BUILD/kernels.list"
step_done "fetch kernels"

# ---------------------------------------------------------------- nv-p2p.h (P2P build of tutti.ko)
HAVE_NV_P2P=0
if [ -f kmod/Makefile ]; then
	step "nv-p2p.h for the GPU peer-to-peer build"
	scripts/hil/fetch-nv-p2p.sh
	# shellcheck disable=SC1091
	. "$HIL_BUILD/nv-p2p/nv-p2p.env"
	HAVE_NV_P2P=1
	step_done "fetch nv-p2p.h"
fi

# ---------------------------------------------------------------- venv for the guest
step "$VENV"
if [ ! -x "$VENV/bin/python" ]; then
	"$PY" -m venv "$VENV" || die "python venv creation failed"
	"$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
fi
# reinstall whenever anything the extension is built from changed (kmod/include: the uapi header)
stamp=$(cat pyproject.toml setup.py $(find libtutti/src libtutti/include python $(ls -d kmod/include 2>/dev/null) \
	-name '*.[ch]' -o -name '*.py' | sort) | sha1sum | cut -d' ' -f1)
if [ "${HIL_VENV_INSTALL:-1}" = 0 ]; then
	warn "HIL_VENV_INSTALL=0: using $VENV as it is (not rebuilt from this tree)"
elif [ "$(cat "$VENV/.tutti-src-stamp" 2>/dev/null)" != "$stamp" ]; then
	"$VENV/bin/pip" install -q ".[test]" >"$HIL_BUILD/venv-install.log" 2>&1 ||
		{ grep -v '^WARNING: Location' "$HIL_BUILD/venv-install.log" | tail -30 >&2; die "pip install .[test] into $VENV failed"; }
	echo "$stamp" >"$VENV/.tutti-src-stamp"
fi
"$VENV/bin/python" -c 'import tutti._tutti, pytest' || die "$VENV: tutti or pytest does not import"
step_done venv

# ---------------------------------------------------------------- modules + initramfs
# build_module SRC_DIR KVER LOG [MAKE_ARGS...]: clean, make W=1, fail on any warning
build_module() {
	local src=$1 kver=$2 logf=$3 rc=0
	shift 3
	load_kernel_env "$kver"
	make -C "$KDIR" M="$src" clean >/dev/null 2>&1 || true
	make -C "$src" KDIR="$KDIR" W=1 "$@" >"$logf" 2>&1 || rc=$?
	if [ $rc -ne 0 ]; then
		tail -40 "$logf" >&2
		die "module build in $src for $kver failed (log: $logf)"
	fi
	if grep -qiE '(^|[^a-z])warning:' "$logf"; then
		grep -iE -B2 -A3 '(^|[^a-z])warning:' "$logf" >&2
		die "module build in $src for $kver has warnings (W=1; log: $logf)"
	fi
}

step "modules (W=1, warnings fail) + initramfs"
P2P_BUILT=()
HAVE_KMOD=0
if [ -f kmod/Makefile ]; then HAVE_KMOD=1; else warn "kmod/Makefile missing: tutti.ko is not built (TUTTI_KO empty in the guest)"; fi
for kver in "${KVERS[@]}"; do
	KD=$HIL_BUILD/kernels/$kver
	mkdir -p "$HIL_BUILD/logs/$kver"
	rm -f "$KD/tutti.ko" "$KD/hil_selftest.ko"
	st=$HIL_BUILD/selftest-kmod/$kver
	rm -rf "$st"
	mkdir -p "$st"
	cp scripts/hil/selftest-kmod/* "$st/"
	build_module "$st" "$kver" "$HIL_BUILD/logs/$kver/selftest-build.log"
	cp "$st/hil_selftest.ko" "$KD/"
	if [ $HAVE_KMOD -eq 1 ]; then
		build_module "$REPO/kmod" "$kver" "$HIL_BUILD/logs/$kver/kmod-build.log"
		[ -f kmod/tutti.ko ] || die "make -C kmod KDIR=... produced no kmod/tutti.ko"
		vm=$(modinfo -F vermagic kmod/tutti.ko | cut -d' ' -f1)
		[ "$vm" = "$kver" ] || die "kmod/tutti.ko has vermagic $vm, expected $kver"
		cp kmod/tutti.ko "$KD/tutti.ko"
		log "tutti.ko for $kver: built clean with W=1"
	fi
	if [ $HAVE_NV_P2P -eq 1 ]; then
		# The same sources with the GPU path, in a copy (kmod/tutti.ko stays the plain build).
		p2p=$HIL_BUILD/kmod-p2p/$kver
		rm -rf "$p2p"
		mkdir -p "$p2p"
		cp -r kmod/Makefile kmod/include $(ls kmod/*.[ch] | grep -v '\.mod\.c$') "$p2p/"
		build_module "$p2p" "$kver" "$HIL_BUILD/logs/$kver/kmod-p2p-build.log" NV_P2P_INC="$NV_P2P_INC"
		[ -f "$p2p/tutti_p2p.o" ] && grep -qa nvidia_p2p_get_pages "$p2p/tutti.ko" ||
			die "the P2P build for $kver did not compile tutti_p2p.c (log: $HIL_BUILD/logs/$kver/kmod-p2p-build.log)"
		vm=$(modinfo -F vermagic "$p2p/tutti.ko" | cut -d' ' -f1)
		[ "$vm" = "$kver" ] || die "P2P tutti.ko has vermagic $vm, expected $kver"
		cp "$p2p/tutti.ko" "$KD/tutti-nv-p2p.ko"
		# A stand-in for the NVIDIA driver's P2P API (GPU memory = controller B's CMB), so the guest
		# can run the P2P build's pin / ring / revocation / teardown paths (tests/hil/nvp2p-fake).
		fk=$HIL_BUILD/nvp2p-fake/$kver
		rm -rf "$fk" "$KD/nvp2p_fake.ko"
		mkdir -p "$fk"
		cp tests/hil/nvp2p-fake/Makefile tests/hil/nvp2p-fake/*.c "$fk/"
		build_module "$fk" "$kver" "$HIL_BUILD/logs/$kver/nvp2p-fake-build.log" NV_P2P_INC="$NV_P2P_INC"
		cp "$fk/nvp2p_fake.ko" "$KD/"
		P2P_BUILT+=("$kver")
		log "tutti.ko with nvidia-p2p for $kver: built clean with W=1 (loaded in the guest only against nvp2p_fake)"
	fi
	scripts/hil/build-initramfs.sh "$kver"
done
step_done "module builds + initramfs"

# ---------------------------------------------------------------- the suite
if [ -z "$SUITE" ]; then
	if [ -f tests/hil/run-guest.sh ]; then
		SUITE=tests/hil/run-guest.sh
	else
		SUITE=scripts/hil/placeholder-guest.sh
		warn "tests/hil/run-guest.sh does not exist: running the PLACEHOLDER suite $SUITE"
	fi
fi
[ -x "$SUITE" ] || die "guest suite $SUITE is not executable (chmod +x)"

# The guest sees the repo read-only: the suite's test programs are built here, before the boots.
if [ -f tests/hil/Makefile ] && [ "$SUITE" != scripts/hil/placeholder-guest.sh ]; then
	step "make -C tests/hil (guest test programs, built on the host)"
	make -C tests/hil >"$HIL_BUILD/logs/guest-tests-build.log" 2>&1 ||
		{ tail -30 "$HIL_BUILD/logs/guest-tests-build.log" >&2; die "make -C tests/hil failed (log: $HIL_BUILD/logs/guest-tests-build.log)"; }
	step_done "guest test programs"
fi
# Optional host-side preparation owned by the guest suite.
if [ -x tests/hil/prepare-host.sh ]; then
	step "tests/hil/prepare-host.sh"
	HIL_BUILD=$HIL_BUILD HIL_KVERS="${KVERS[*]}" tests/hil/prepare-host.sh ||
		die "tests/hil/prepare-host.sh failed"
	step_done "suite preparation"
fi

TOTAL_PASS=0 TOTAL_FAIL=0 TOTAL_SKIP=0 PROBLEMS=0
SUMMARY=()

# Boots retried, up to HIL_BOOT_RETRIES times (default 1), each named in the summary with its
# logs kept (TAG.<why>.N.{console,results}.log):
# - a guest kernel that dies before it runs /init (no HIL-INIT on the results port) never ran
#   our module or suite: under TCG the 6.12 kernel has, rarely, oopsed in an interrupt while
#   probing PCI;
# - a boot that timed out in phase main or crash-write (on fresh disk images again): CI saw the
#   6.1 guest go silent for 7 minutes in a step that passes in every other run. The guest's stall
#   watchdog (run-guest.sh) leaves the processes and kernel backtraces in the kept logs, and the
#   retry is reported, so a hang that comes back fails; a verify boot is never retried (its
#   images are the crashed writer's).
BOOT_RETRIES=${HIL_BOOT_RETRIES:-1}
RETRIED=()

# boot KVER PHASE TAG IMG_A IMG_B [run-qemu options] -> sets BOOT_RC
boot() {
	local kver=$1 phase=$2 tag=$3 a=$4 b=$5 try=0 d why
	shift 5
	d=$HIL_BUILD/logs/$kver
	while :; do
		set +e
		scripts/hil/run-qemu.sh --suite "$SUITE" --tag "$tag" "$@" "$kver" "$phase" "$a" "$b" &
		CHILD=$!
		wait "$CHILD"
		BOOT_RC=$?
		CHILD=
		set -e
		[ "$try" -lt "$BOOT_RETRIES" ] || return 0
		if [ "$BOOT_RC" -eq 125 ] && ! grep -q '^HIL-INIT' "$d/$tag.results.log" 2>/dev/null; then
			why=no-init
		elif [ "$BOOT_RC" -eq 124 ] && [ "$phase" != verify ]; then
			why=timeout
			qemu-img create -q -f raw "$a" "$IMG_SIZE"
			qemu-img create -q -f raw "$b" "$IMG_SIZE"
		else
			return 0
		fi
		try=$((try + 1))
		cp "$d/$tag.console.log" "$d/$tag.$why.$try.console.log"
		cp "$d/$tag.results.log" "$d/$tag.$why.$try.results.log" 2>/dev/null || true
		if [ $why = no-init ]; then
			log "$kver/$tag: the guest kernel died before /init (not our code): boot again ($try of $BOOT_RETRIES); its console: $d/$tag.$why.$try.console.log"
			RETRIED+=("$kver/$tag: kernel died before /init, booted again (console: $tag.$why.$try.console.log)")
		else
			log "$kver/$tag: TIMEOUT: boot again on fresh images ($try of $BOOT_RETRIES); the stalled boot's logs: $d/$tag.$why.$try.*.log"
			grep -a 'HIL-STALL' -A12 "$d/$tag.$why.$try.results.log" 2>/dev/null | head -30 | sed 's/^/    /' >&2 || true
			RETRIED+=("$kver/$tag: TIMED OUT, booted again on fresh images (logs: $tag.$why.$try.*.log)")
		fi
	done
}

boot_secs() { grep -F "boot $1 $2:" "$HIL_BUILD/timings" | tail -1 | sed 's/.*: //; s/^killed after //; s/^timeout //; s/s$//'; }

# report KVER TAG RC [expect_result=1]: print the TAP lines, account, add a summary row
report() {
	local kver=$1 tag=$2 rc=$3 expect=${4:-1} res f="$HIL_BUILD/logs/$1/$2.results.log" p=0 x=0 s=0 nok nnot why=
	tr -d '\r' <"$f" 2>/dev/null | grep -E '^(not )?ok [0-9]+|^HIL-(RESULT|ERROR)' | sed "s/^/  [$kver $tag] /" || true
	nok=$(tr -d '\r' <"$f" 2>/dev/null | grep -cE '^ok [0-9]+' || true)
	nnot=$(tr -d '\r' <"$f" 2>/dev/null | grep -cE '^not ok [0-9]+' || true)
	res=$(tr -d '\r' <"$f" 2>/dev/null | grep -E '^HIL-RESULT: [0-9]+ passed, [0-9]+ failed' | tail -1 || true)
	if [ -n "$res" ]; then
		p=$(sed -E 's/^HIL-RESULT: ([0-9]+) passed, ([0-9]+) failed.*/\1/' <<<"$res")
		x=$(sed -E 's/^HIL-RESULT: ([0-9]+) passed, ([0-9]+) failed.*/\2/' <<<"$res")
		s=$(sed -nE 's/^HIL-RESULT: .*, ([0-9]+) skipped.*/\1/p' <<<"$res")	# run-guest.sh says it
	else
		p=$nok x=$nnot
	fi
	s=${s:-0}
	[ "$x" -ge "$nnot" ] || x=$nnot
	if [ "$expect" = 1 ]; then
		case "$rc" in
		124) why="TIMEOUT" ;;
		125) why="guest died without HIL-EXIT (panic?)" ;;
		126) why="QEMU did not start" ;;
		*)
			if [ -z "$res" ]; then
				why="no HIL-RESULT line"
			elif [ "$rc" -ne 0 ] && [ "$x" -eq 0 ]; then
				why="suite exit $rc"
			elif [ $((p + x)) -eq 0 ]; then
				why="ran no test"
			fi
			;;
		esac
	fi
	if [ -n "$why" ]; then
		log "$kver/$tag: $why; last lines of $f:"
		tail -15 "$f" 2>/dev/null | tr -d '\r' | sed 's/^/    | /' >&2 || true
	fi
	TOTAL_PASS=$((TOTAL_PASS + p))
	TOTAL_FAIL=$((TOTAL_FAIL + x))
	TOTAL_SKIP=$((TOTAL_SKIP + s))
	if [ "$x" -gt 0 ] || [ -n "$why" ]; then PROBLEMS=$((PROBLEMS + 1)); fi
	SUMMARY+=("$(printf '%-24s %-14s %-44s %6ss' "$kver" "$tag" "$p passed, $x failed$([ "$s" -eq 0 ] || echo ", $s skipped")${why:+ — $why}" "$(boot_secs "$kver" "$tag")")")
}

# Power-loss replay: its own boot (phase powerloss) on drives behind blklogwrites, then the
# replay of both logs here (scripts/hil/powerloss.sh); a summary row for each.
powerloss() {
	local rc
	[ "$POWERLOSS" = 1 ] && [ "$SUITE" != scripts/hil/placeholder-guest.sh ] || return 0
	log "---- $1: power-loss replay (scripts/hil/powerloss.sh)"
	set +e
	scripts/hil/powerloss.sh "$1" &
	CHILD=$!
	wait "$CHILD"
	rc=$?
	CHILD=
	set -e
	report "$1" powerloss "$(cat "$HIL_BUILD/logs/$1/powerloss.rc" 2>/dev/null || echo 125)"
	report "$1" pl-replay "$rc"
}

step "boots: suite $SUITE"
for kver in "${KVERS[@]}"; do
	load_kernel_env "$kver"
	log "---- $kver ($PKGVER): phase main"
	img=$HIL_BUILD/images/$kver
	mkdir -p "$img"
	rm -f "$img"/*.img
	qemu-img create -q -f raw "$img/a.img" "$IMG_SIZE"
	qemu-img create -q -f raw "$img/b.img" "$IMG_SIZE"
	boot "$kver" main main "$img/a.img" "$img/b.img" --media-errors b
	report "$kver" main "$BOOT_RC"
	powerloss "$kver"

	want=$CRASH
	if [ "$want" = auto ]; then
		want=0
		# grep the file itself: under pipefail, `tr | grep -q` fails when grep's early exit
		# SIGPIPEs tr, and the crash phase was skipped without a word (seen in CI).
		grep -q '^HIL-REQUEST crash-reboot' "$HIL_BUILD/logs/$kver/main.results.log" && want=1
	fi
	[ "$want" = 1 ] || continue
	for r in $(seq "$ROUNDS"); do
		sfx=
		[ "$ROUNDS" -eq 1 ] || sfx=.$r
		log "---- $kver: crash-reboot${sfx}: phase crash-write, SIGKILL after HIL-WRITING"
		rm -f "$img"/*.img
		qemu-img create -q -f raw "$img/a.img" "$IMG_SIZE"
		qemu-img create -q -f raw "$img/b.img" "$IMG_SIZE"
		boot "$kver" crash-write "crash-write$sfx" "$img/a.img" "$img/b.img" --kill-on HIL-WRITING
		report "$kver" "crash-write$sfx" "$BOOT_RC" 0
		if [ "$BOOT_RC" -ne 137 ]; then
			log "$kver/crash-write$sfx: no HIL-WRITING (boot exit $BOOT_RC); last lines of the results log:"
			tail -15 "$HIL_BUILD/logs/$kver/crash-write$sfx.results.log" 2>/dev/null | tr -d '\r' | sed 's/^/    | /' >&2 || true
			PROBLEMS=$((PROBLEMS + 1))
			TOTAL_FAIL=$((TOTAL_FAIL + 1))
			SUMMARY[-1]="$(printf '%-24s %-14s %s' "$kver" "crash-write$sfx" "FAILED: no HIL-WRITING before the boot ended (exit $BOOT_RC)")"
			continue
		fi
		SUMMARY[-1]="$(printf '%-24s %-14s %-44s %6ss' "$kver" "crash-write$sfx" "$(cat "$HIL_BUILD/logs/$kver/crash-write$sfx.kill")" "$(boot_secs "$kver" "crash-write$sfx")")"
		log "---- $kver: crash-reboot${sfx}: phase verify (same disk images)"
		clog=$HIL_BUILD/logs/$kver/crash-write$sfx.results.log
		acked=$(tr -d '\r' <"$clog" | sed -n 's/^HIL-ACKED \([0-9][0-9]*\).*/\1/p' | tail -1)
		boot "$kver" verify "verify$sfx" "$img/a.img" "$img/b.img" \
			--env "TUTTI_HIL_CRASH_LOG=$clog" --env "TUTTI_HIL_LAST_ACKED=$acked"
		report "$kver" "verify$sfx" "$BOOT_RC"
	done
done
step_done boots

# ---------------------------------------------------------------- summary
echo
echo "==== HIL summary (suite: $SUITE) ===="
for k in "${KVERS[@]}"; do
	load_kernel_env "$k"
	echo "  $k = Debian $PKGVER (line $LINE)"
done
if [ $HAVE_NV_P2P -eq 1 ]; then
	echo "  P2P build (W=1 clean; in the guest only against the nvp2p_fake stand-in): ${P2P_BUILT[*]}"
	echo "    nv-p2p.h: $NV_P2P_ORIGIN"
fi
printf '  %-24s %-14s %-44s %7s\n' kernel phase result time
for l in "${SUMMARY[@]}"; do echo "  $l"; done
for l in "${RETRIED[@]}"; do echo "  retried: $l"; done
echo "  timings: $(grep '^step' "$HIL_BUILD/timings" | sed 's/^step //' | paste -sd';' | sed 's/;/; /g'); total $(($(date +%s) - T0))s"
echo "  logs: $HIL_BUILD/logs/"
if [ "$SUITE" = scripts/hil/placeholder-guest.sh ]; then
	echo "  NOTE: placeholder suite: plumbing only, not the module's tests"
fi
echo "HIL: $TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped"
[ "$PROBLEMS" -eq 0 ] && [ "$TOTAL_FAIL" -eq 0 ]
