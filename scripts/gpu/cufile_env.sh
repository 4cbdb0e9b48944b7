#!/usr/bin/env bash
# Source before running cuFile (GDS) code on a container-like machine:
#   source scripts/gpu/cufile_env.sh DIR...
# cuFile identifies a file's filesystem from udev's database
# (/run/udev/data/b<major>:<minor>: ID_FS_TYPE, ID_FS_USAGE); a machine
# without udevd has none, and cuFileHandleRegister then fails even in
# compatibility mode ("udev property not found: ID_FS_USAGE"). As root, write
# the entries udev would have written for the block device under each DIR,
# and point cuFile at a config that allows compatibility mode and logs into
# $OUT (default /tmp). Changes nothing where the entries exist.
_cf_out=${OUT:-/tmp}
if [ "$(id -u)" = 0 ]; then
	mkdir -p /run/udev/data
	for _cf_dir in "$@"; do
		_cf_src=$(findmnt -n -o SOURCE --target "$_cf_dir" 2>/dev/null)
		_cf_fs=$(findmnt -n -o FSTYPE --target "$_cf_dir" 2>/dev/null)
		[ -b "$_cf_src" ] || continue
		_cf_id=$(stat -L -c '%t:%T' "$_cf_src")
		_cf_f=/run/udev/data/b$((16#${_cf_id%:*})):$((16#${_cf_id#*:}))
		[ -e "$_cf_f" ] && continue
		printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\nE:DEVTYPE=disk\n' "$_cf_fs" >"$_cf_f"
		echo "cufile_env: wrote $_cf_f for $_cf_src ($_cf_fs, under $_cf_dir)"
	done
fi
python3 - "$_cf_out" <<'PY'
import json, re, sys
out = sys.argv[1]
try:
    cfg = json.loads(re.sub(r"(?m)^\s*//.*$", "", open("/etc/cufile.json").read()))
except Exception:
    cfg = {}
cfg.setdefault("logging", {}).update({"dir": out, "level": "ERROR"})
cfg.setdefault("properties", {}).update({"allow_compat_mode": True})
json.dump(cfg, open(f"{out}/cufile.json", "w"), indent=1)
PY
export CUFILE_ENV_PATH_JSON=$_cf_out/cufile.json
unset _cf_out _cf_dir _cf_src _cf_fs _cf_id _cf_f
