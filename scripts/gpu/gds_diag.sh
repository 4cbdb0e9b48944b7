#!/usr/bin/env bash
# Why does cuFile (compat mode, no nvidia-fs) refuse to register the store's
# files on this machine? Runs test_gpu_staged's GDS cases with cuFile logging
# at TRACE into $OUT and a config that allows compatibility mode, on each
# filesystem at hand. Needs build/h200/libtutti_gpu.so and the test binary
# (scripts/gpu/h200_run.sh --tests builds both).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/out}
B=${B:-build/gpu}
mkdir -p "$OUT"
echo "== /etc/cufile.json (compat/logging lines)"
grep -n -i 'compat\|"level"\|allow\|dir"' /etc/cufile.json 2>/dev/null | head -20
source scripts/gpu/cufile_env.sh /var/tmp /tmp /dev/shm
sed -i 's/"level": "ERROR"/"level": "TRACE"/' "$CUFILE_ENV_PATH_JSON"
# A RAM disk with a real filesystem gives O_DIRECT at memory speed (tmpfs
# has no O_DIRECT before 6.6, and cuFile needs it): try a loop device.
if R=$(mkdir -p /dev/shm/ramfs && truncate -s 6G /dev/shm/ramfs/img &&
	losetup -f --show /dev/shm/ramfs/img 2>&1) && mkfs.ext4 -q -F "$R" &&
	mkdir -p /mnt/tt_ram && mount "$R" /mnt/tt_ram; then
	echo "== RAM disk $R on /mnt/tt_ram"; source scripts/gpu/cufile_env.sh /mnt/tt_ram
	sed -i 's/"level": "ERROR"/"level": "TRACE"/' "$CUFILE_ENV_PATH_JSON"
	RAMDIR=/mnt/tt_ram
else
	echo "== no RAM disk: $R"
fi

for dir in /dev/shm /var/tmp ${RAMDIR:-}; do
	echo "== $dir: $(stat -f -c %T "$dir")"
	TMPDIR=$dir timeout 60 "$B/test_gpu_staged" 2>&1 | grep -i -E 'gds|cufile|^not ok|^# (skip|gds)' | head -20
done
for f in "$OUT"/cufile_*.log; do
	[ -e "$f" ] || continue
	echo "== $f (errors)"; grep -i -E 'error|fail|not supported' "$f" | cut -c 40- | sort | uniq -c | sort -rn | head -12
	rm -f "$f"	# names with ':' do not come back from the device tool
done
