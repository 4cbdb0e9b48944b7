#!/usr/bin/env bash
# Placeholder guest suite: proves the HIL plumbing until tests/hil/run-guest.sh exists.
# Runs INSIDE the guest, chrooted into the host's root (read-only 9p), from the repo directory.
# Same contract as tests/hil/run-guest.sh: TAP lines, then "HIL-RESULT: N passed, M failed".
#
# Phases (TUTTI_HIL_PHASE):
#   main         plumbing checks; prints "HIL-REQUEST crash-reboot" so hil.sh runs the scenario
#   crash-write  formats a small store over both NVMe namespaces, prints HIL-WRITING, writes forever
#                (the host SIGKILLs QEMU 0.5-3 s later)
#   verify       reopens that store after the "power cut": checks clean, every block exact
set -uo pipefail
n=0 pass=0 fail=0
ok() { n=$((n + 1)); pass=$((pass + 1)); echo "ok $n - $1${2:+ # $2}"; }
notok() { n=$((n + 1)); fail=$((fail + 1)); echo "not ok $n - $1"; }
# t NAME CMD...: one test; the command's output is shown as TAP comments
t() {
	local name=$1 out rc
	shift
	out=$("$@" 2>&1)
	rc=$?
	[ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
	if [ $rc -eq 0 ]; then ok "$name"; else notok "$name (exit $rc)"; fi
	return $rc
}
done_() {
	echo "HIL-RESULT: $pass passed, $fail failed"
	[ $fail -eq 0 ]
	exit $?
}
PY=${TUTTI_VENV:-.venv-hil}/bin/python
read -r -a BDFS <<<"${TUTTI_NVME_BDFS:-}"

load_nvme() {
	local k i
	[ -d /sys/bus/pci/drivers/nvme ] || for k in ${TUTTI_NVME_KOS:-$TUTTI_NVME_KO}; do
		insmod "$k" || return 1
	done
	for i in $(seq 100); do
		[ -b /dev/nvme0n1 ] && [ -b /dev/nvme1n1 ] && break
		sleep 0.1
	done
	for b in "${BDFS[@]}"; do
		[ "$(basename "$(readlink /sys/bus/pci/devices/$b/driver)")" = nvme ] || { echo "$b not bound to nvme"; return 1; }
	done
	# namespace name -> controller: nvme0 must be 00:04.0 (tuttiA), nvme1 00:05.0 (tuttiB)
	for c in 0 1; do
		echo "nvme$c: $(cat /sys/class/nvme/nvme$c/address) serial=$(tr -d ' ' </sys/class/nvme/nvme$c/serial) $(cat /sys/block/nvme${c}n1/size) sectors"
	done
	[ -b /dev/nvme0n1 ] && [ -b /dev/nvme1n1 ]
}

# the two store members, in a fixed order (by serial), whatever names the kernel gave them
store_devs() {
	local c
	for s in tuttiA tuttiB; do
		for c in /sys/class/nvme/nvme*; do
			[ "$(tr -d ' ' <"$c/serial")" = "$s" ] && echo "/dev/$(basename "$c")n1"
		done
	done
}

case "${TUTTI_HIL_PHASE:-main}" in
main)
	echo "# placeholder HIL suite (tests/hil/run-guest.sh not present yet): kernel $(uname -r)"
	t "chroot into the host userland over 9p (read-only), guest tmpfs /tmp" bash -c '
		[ "$(uname -r)" = "$TUTTI_KVER" ] || { echo "kernel $(uname -r) != $TUTTI_KVER"; exit 1; }
		grep -qE "^hostroot / 9p ro," /proc/mounts || { cat /proc/mounts; exit 1; }
		grep -qE "^tmpfs /tmp tmpfs" /proc/mounts || exit 1
		touch "$TUTTI_REPO/.hil-rw-probe" 2>/dev/null && { echo "repo is writable?"; exit 1; }
		echo hello >/tmp/x && [ "$(cat /tmp/x)" = hello ] && echo "debian $(cat /etc/debian_version), repo $TUTTI_REPO"'
	t "host python runs, tutti imports from .venv-hil, cffi extension loads through 9p" \
		"$PY" -c 'import sys, tutti, tutti._tutti as m; print(sys.version.split()[0], tutti.__version__, m.__file__)'
	t "tutti Store round trip on guest tmpfs" "$PY" -c '
from tutti import Store, Fingerprint
fp = Fingerprint(model_id="hil", dtype="float16", n_layers=2, kv_heads=1, head_dim=128, block_size=16)
Store.format(["/tmp/s.img"], fp, n_slots=16)
with Store.open(["/tmp/s.img"], expect=fp) as s:
    d = bytes(range(256)) * (s.block_bytes // 256)
    s.put(b"k", d); assert s.get(b"k") == d
print("ok", s.block_bytes, "byte blocks")'
	t "two NVMe controllers at ${BDFS[*]} with class 0x010802, unbound" bash -c '
		for b in $TUTTI_NVME_BDFS; do
			d=/sys/bus/pci/devices/$b
			[ "$(cat $d/class)" = 0x010802 ] || { echo "$b class $(cat $d/class 2>&1)"; exit 1; }
			[ -e $d/driver ] && { echo "$b already bound to $(basename $(readlink $d/driver))"; exit 1; }
			echo "$b vendor $(cat $d/vendor) device $(cat $d/device)"
		done'
	t "controller B has a CMB BAR (BAR2)" bash -c '
		set -- $TUTTI_NVME_BDFS
		r=$(sed -n 3p /sys/bus/pci/devices/$2/resource)
		set -- $r
		[ $((${1})) -ne 0 ] && echo "BAR2 $1-$2 ($(( ($2 - $1 + 1) >> 20 )) MiB)"'
	if [ -n "${TUTTI_HIL_SELFTEST_KO:-}" ]; then
		t "out-of-tree module (built here with W=1) loads and unloads" bash -c \
			'insmod "$TUTTI_HIL_SELFTEST_KO" && grep -w hil_selftest /proc/modules && rmmod hil_selftest'
	fi
	if [ -n "${TUTTI_KO:-}" ]; then
		t "tutti.ko loads and unloads" bash -c 'insmod "$TUTTI_KO" && rmmod tutti' 
	else
		ok "tutti.ko loads and unloads" "SKIP kmod/ not built yet"
	fi
	t "the kernel's nvme.ko binds both controllers, /dev/nvme0n1 appears" load_nvme
	t "the unpacked module tree: TUTTI_NVME_KO exists, modprobe -d loads ext4 + deps (compressed on 6.12)" bash -c '
		[ -f "$TUTTI_NVME_KO" ] || { echo "no $TUTTI_NVME_KO"; exit 1; }
		modprobe -d "$TUTTI_MODULES_ROOT" ext4 && grep -E "^(ext4|jbd2|mbcache) " /proc/modules | cut -d" " -f1 | paste -sd" "'
	t "O_DIRECT dd round trip on /dev/nvme0n1 and /dev/nvme1n1" bash -c '
		head -c 4194304 /dev/urandom >/tmp/pat
		for d in /dev/nvme0n1 /dev/nvme1n1; do
			dd if=/tmp/pat of=$d bs=1M oflag=direct conv=fsync status=none seek=7 || exit 1
			dd if=$d of=/tmp/back bs=1M iflag=direct status=none skip=7 count=4 || exit 1
			cmp /tmp/pat /tmp/back || exit 1
			echo "$d: 4 MiB written and read back"
		done'
	t "tutti-admin format + check on the emulated NVMe (io_uring/O_DIRECT)" bash -c '
		tutti-admin format /dev/nvme0n1 /dev/nvme1n1 --layers 2 --kv-heads 1 --head-dim 128 --dtype float16 \
			--slots 64 --yes --force --json >/tmp/f.json && tutti-admin check /dev/nvme0n1 /dev/nvme1n1 | tail -3'
	t "pytest runs in the guest (read-only repo, no cache provider)" \
		bash -o pipefail -c '"$0" -m pytest -q -p no:cacheprovider tests/test_store_roundtrip.py | tail -1' "$PY"
	echo "HIL-REQUEST crash-reboot"
	done_
	;;
crash-write)
	load_nvme >/dev/null || { notok "nvme driver"; done_; }
	mapfile -t devs < <(store_devs)
	echo "# crash-write on ${devs[*]}"
	exec "$PY" -c '
import sys, random
sys.path.insert(0, "tests")
from helpers import crash_writer as cw
from tutti import Store
paths = sys.argv[1:]
Store.format(paths, cw.FINGERPRINT, n_slots=cw.N_SLOTS, stripe_objs=1)
ops = 0
def ready():
    print("HIL-WRITING", flush=True)
def op():
    global ops
    ops += 1
    if ops % 20 == 0:
        print("HIL-ACKED", ops, flush=True)   # ops completed (returned) so far
cw.run(paths, seed=random.getrandbits(32), trial=1, on_ready=ready, on_op=op)
' "${devs[@]}"
	;;
verify)
	t "nvme driver binds after the crash" load_nvme
	t "host passed the crash-write boot's last HIL-ACKED (${TUTTI_HIL_LAST_ACKED:-none}) and its log" bash -c '
		[ -n "$TUTTI_HIL_LAST_ACKED" ] && [ "$TUTTI_HIL_LAST_ACKED" -gt 0 ] && [ -r "$TUTTI_HIL_CRASH_LOG" ] &&
		grep -q "^HIL-WRITING" "$TUTTI_HIL_CRASH_LOG"'
	mapfile -t devs < <(store_devs)
	t "store written when QEMU was SIGKILLed reopens clean, every block exact" "$PY" -c '
import sys
sys.path.insert(0, "tests")
from helpers import crash_writer as cw
from tutti import Store
paths = sys.argv[1:]
with Store.open(paths) as s:
    res = s.check()
    assert (res["bad"], res["bad_records"]) == (0, 0), res
    info = s.info()
    assert info["n_bad_records"] == 0 and info["n_committed"] + info["n_free"] == cw.N_SLOTS, info
    present = 0
    for k in range(cw.N_KEYS):
        try:
            data = s.get(cw.key_name(k))
        except KeyError:
            continue
        present += 1
        kk, version = cw.parse_block(data)
        assert kk == k and data == cw.block_data(k, version, s.block_bytes), (k, kk, version)
    assert present == info["n_committed"]
    print(f"{present} blocks present, all exact; check: {res}")
' "${devs[@]}"
	done_
	;;
*)
	echo "# unknown phase ${TUTTI_HIL_PHASE}"
	notok "phase ${TUTTI_HIL_PHASE}"
	done_
	;;
esac
