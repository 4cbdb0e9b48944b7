#!/usr/bin/env bash
# Fetch NVIDIA's nv-p2p.h (the GPU peer-to-peer API header) for the P2P build of tutti.ko.
#
#   scripts/hil/fetch-nv-p2p.sh
#
# Only the header is used: the HIL builds kmod/ a second time per kernel with NV_P2P_INC pointing at
# it (W=1, warnings fail).  Nothing of the NVIDIA driver is installed, built or loaded.
#
# Source, in order:
#   1. Debian's nvidia-open-kernel-dkms (contrib), else nvidia-kernel-dkms (non-free), from the same
#      mirror the kernels come from (the Debian repositories apt is configured with: `apt-get
#      indextargets`).  The apt sources of the CI machine have only `main`, so the contrib/non-free
#      Packages index is fetched directly: InRelease is verified with gpgv against Debian's archive
#      keyring, the Packages.xz against InRelease's SHA256, the .deb against the index's SHA256.  The
#      CURRENT version is resolved every run (highest over the suites, e.g. bookworm, -updates,
#      -security); nothing is pinned.
#   2. If the mirror route fails: kernel-open/nvidia/nv-p2p.h of NVIDIA's open-gpu-kernel-modules on
#      GitHub (default branch).
#   3. If both fail (offline) and a header was fetched before: that one, with a warning.
#
# Cache: the .deb in build/hil/debs (like the kernels), the header in
# build/hil/nv-p2p/<package>_<version>/nv-p2p.h; a resolved version already extracted is not
# downloaded again.  Output: build/hil/nv-p2p/nv-p2p.env (NV_P2P_INC, NV_P2P_ORIGIN).
#
# Environment: HIL_NV_P2P_REPOS ("URI SUITE" pairs separated by ';', overriding apt's),
# HIL_NV_P2P_GITHUB_URL (fallback URL).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/hil/lib.sh

OUT=$HIL_BUILD/nv-p2p
DEBS=$HIL_BUILD/debs
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
GITHUB_URL=${HIL_NV_P2P_GITHUB_URL:-https://raw.githubusercontent.com/NVIDIA/open-gpu-kernel-modules/main/kernel-open/nvidia/nv-p2p.h}
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
mkdir -p "$OUT" "$DEBS"
TMP=$(mktemp -d "$OUT/.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

fetch() { curl -fsSL --retry 3 --connect-timeout 20 -o "$2" "$1"; }

# "URI SUITE" of each Debian repository apt uses (the kernels' mirror)
repos() {
	if [ -n "${HIL_NV_P2P_REPOS:-}" ]; then
		tr ';' '\n' <<<"$HIL_NV_P2P_REPOS" | sed '/^ *$/d'
		return
	fi
	apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(IDENTIFIER)' 2>/dev/null |
		awk '$3 == "Packages" && $1 ~ /debian/ { sub(/\/$/, "", $1); print $1, $2 }' | sort -u
}

# verified_index URI SUITE COMPONENT -> path of the decompressed Packages file, or fails
verified_index() {
	local uri=$1 suite=$2 comp=$3 d rel want got
	d=$TMP/$(tr '/:' '__' <<<"$uri-$suite")
	mkdir -p "$d"
	if [ ! -s "$d/Release" ]; then
		fetch "$uri/dists/$suite/InRelease" "$d/InRelease" || return 1
		gpgv --quiet --keyring "$KEYRING" --output "$d/Release" "$d/InRelease" 2>"$d/gpgv.log" || {
			warn "$uri $suite: InRelease signature not valid ($(tail -1 "$d/gpgv.log"))"
			rm -f "$d/Release"
			return 1
		}
	fi
	rel=$comp/binary-$ARCH/Packages.xz
	want=$(awk -v f="$rel" '/^SHA256:/ { s = 1; next } /^[A-Za-z]/ { s = 0 } s && $3 == f { print $1 }' "$d/Release" | head -1)
	[ -n "$want" ] || return 1
	fetch "$uri/dists/$suite/$rel" "$d/$comp.xz" || return 1
	got=$(sha256sum "$d/$comp.xz" | cut -d' ' -f1)
	[ "$got" = "$want" ] || { warn "$uri $suite $rel: SHA256 mismatch"; return 1; }
	xz -dc "$d/$comp.xz" >"$d/$comp.Packages" || return 1
	echo "$d/$comp.Packages"
}

# stanza fields of PKG in a Packages file: "version filename sha256"
pkg_fields() {
	awk -v p="$2" '
		/^Package: / { inp = ($2 == p); v = f = s = "" }
		inp && /^Version: / { v = $2 }
		inp && /^Filename: / { f = $2 }
		inp && /^SHA256: / { s = $2 }
		inp && /^$/ { if (v != "") print v, f, s; inp = 0 }
		END { if (inp && v != "") print v, f, s }' "$1"
}

# resolve PKG COMPONENT -> "uri version filename sha256" of the highest version over the repos
resolve() {
	local pkg=$1 comp=$2 uri suite idx best= bv= line v
	while read -r uri suite; do
		[ -n "$uri" ] || continue
		idx=$(verified_index "$uri" "$suite" "$comp") || continue
		while read -r line; do
			[ -n "$line" ] || continue
			v=${line%% *}
			if [ -z "$bv" ] || dpkg --compare-versions "$v" gt "$bv"; then
				bv=$v
				best="$uri $line"
			fi
		done < <(pkg_fields "$idx" "$pkg")
	done < <(repos)
	[ -n "$best" ] && echo "$best"
}

write_env() { # DIR ORIGIN
	printf 'NV_P2P_INC=%s\nNV_P2P_ORIGIN=%q\n' "$(realpath "$1")" "$2" >"$OUT/nv-p2p.env.tmp"
	mv "$OUT/nv-p2p.env.tmp" "$OUT/nv-p2p.env"
	log "nv-p2p.h: $2"
}

from_debian() {
	local pkg comp r uri ver file sha dir deb
	for pc in "nvidia-open-kernel-dkms contrib" "nvidia-kernel-dkms non-free"; do
		read -r pkg comp <<<"$pc"
		r=$(resolve "$pkg" "$comp") || continue
		read -r uri ver file sha <<<"$r"
		dir=$OUT/${pkg}_${ver//:/%3a}
		if [ ! -s "$dir/nv-p2p.h" ]; then
			deb=$DEBS/$(basename "$file")
			if [ ! -s "$deb" ] || [ "$(sha256sum "$deb" | cut -d' ' -f1)" != "$sha" ]; then
				log "downloading $pkg $ver ($uri/$file)"
				fetch "$uri/$file" "$deb.part" || { warn "download of $uri/$file failed"; continue; }
				[ "$(sha256sum "$deb.part" | cut -d' ' -f1)" = "$sha" ] ||
					{ rm -f "$deb.part"; warn "$file: SHA256 does not match the index"; continue; }
				mv "$deb.part" "$deb"
			fi
			mkdir -p "$TMP/x"
			# only the driver's own copy (usr/src/nvidia-*/nvidia/nv-p2p.h)
			dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$TMP/x" --wildcards '*/nvidia/nv-p2p.h' ||
				{ warn "$deb has no nvidia/nv-p2p.h"; continue; }
			h=$(find "$TMP/x" -path '*/nvidia/nv-p2p.h' | head -1)
			[ -s "$h" ] || { warn "$deb has no nvidia/nv-p2p.h"; continue; }
			mkdir -p "$dir"
			cp "$h" "$dir/nv-p2p.h"
		fi
		write_env "$dir" "Debian $pkg $ver ($uri/$file)"
		return 0
	done
	return 1
}

from_github() {
	local dir=$OUT/github
	fetch "$GITHUB_URL" "$TMP/nv-p2p.h" || return 1
	grep -q 'nvidia_p2p_get_pages' "$TMP/nv-p2p.h" || return 1
	mkdir -p "$dir"
	cp "$TMP/nv-p2p.h" "$dir/nv-p2p.h"
	write_env "$dir" "$GITHUB_URL (fetched $(date -u +%F))"
}

command -v curl >/dev/null || die "curl is needed to fetch nv-p2p.h"
command -v gpgv >/dev/null && [ -f "$KEYRING" ] || die "gpgv and $KEYRING (debian-archive-keyring) are needed to verify the Debian index"

from_debian && exit 0
warn "nv-p2p.h not obtained from the Debian mirror; trying $GITHUB_URL"
from_github && exit 0
if [ -s "$OUT/nv-p2p.env" ]; then
	. "$OUT/nv-p2p.env"
	if [ -s "$NV_P2P_INC/nv-p2p.h" ]; then
		warn "offline: using the nv-p2p.h fetched earlier ($NV_P2P_ORIGIN)"
		exit 0
	fi
fi
die "cannot obtain NVIDIA's nv-p2p.h (Debian mirror and GitHub both failed, nothing cached)"
