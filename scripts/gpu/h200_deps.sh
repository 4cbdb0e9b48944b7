#!/usr/bin/env bash
# Make .h200/: what the H200 image lacks to build and run libtutti and the
# tutti package (it cannot download anything). Run here, then carry .h200.
#   root/  liburing + xxhash headers and libraries unpacked from Debian .debs
#          (make DEPS_ROOT=.h200/root ...)
#   whl/   cffi, pycparser, pyudev wheels for its Python 3.12
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.h200
rm -rf "$D" && mkdir -p "$D/deb" "$D/root" "$D/whl"
(cd "$D/deb" && apt-get download liburing-dev liburing2 libxxhash-dev libxxhash0)
for f in "$D"/deb/*.deb; do dpkg -x "$f" "$D/root"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 -d "$D/whl" cffi pycparser pyudev
du -sh "$D"
