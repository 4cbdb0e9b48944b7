# Shared helpers for scripts/hil/*.sh (sourced, run from the repository root).
HIL_BUILD=${HIL_BUILD:-build/hil}
mkdir -p "$HIL_BUILD"
HIL_BUILD=$(realpath "$HIL_BUILD")

log() { printf '[hil %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
warn() { printf '[hil %s] WARNING: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	printf '[hil %s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2
	exit 1
}
# kernel.env of a kver: KVER ABI PKGVER VMLINUZ KDIR MODROOT LINE
load_kernel_env() {
	local f=$HIL_BUILD/kernels/$1/kernel.env
	[ -f "$f" ] || die "no $f: run scripts/hil/fetch-kernels.sh first"
	# shellcheck disable=SC1090
	. "$f"
}
