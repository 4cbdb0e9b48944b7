#!/usr/bin/env bash
# Fetch and unpack the Debian kernels the HIL suite boots (nothing is installed into /boot).
#
#   scripts/hil/fetch-kernels.sh [LINE...]      LINE: 6.1 | 6.12   (default: both)
#
# Each line is resolved to its CURRENT ABI through its metapackage (old ABIs vanish from the
# archive, so nothing is pinned):
#   6.1  -> linux-image-amd64        -> linux-image-<abi>-amd64
#   6.12 -> linux-image-6.12-amd64   -> linux-image-<abi>-amd64
# then apt-get download: the image, linux-headers-<abi>-amd64, and the -common and linux-kbuild
# packages the headers depend on; dpkg -x into build/hil/kernels/<kver>/root; rewrite the headers
# Makefile's absolute /usr/src include to the unpacked tree.  Downloads already in build/hil/debs are
# reused; an unpacked tree whose stamp matches is left alone (idempotent reruns).
#
# Output: build/hil/kernels/<kver>/kernel.env (KVER, ABI, PKGVER, VMLINUZ, KDIR, MODROOT) and
# build/hil/kernels.list (the kvers resolved by this run, one a line, in LINE order).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/hil/lib.sh

LINES=("$@")
[ ${#LINES[@]} -gt 0 ] || LINES=(6.1 6.12)

DEBS=$HIL_BUILD/debs
mkdir -p "$DEBS" "$HIL_BUILD/kernels"
APT_OPTS=(-o APT::Sandbox::User=root -o Acquire::Retries=3)

meta_for() {
	case "$1" in
	6.1) echo linux-image-amd64 ;;
	6.12) echo linux-image-6.12-amd64 ;;
	*) die "unknown kernel line '$1' (known: 6.1, 6.12)" ;;
	esac
}

# Depends: of the candidate version of a package, one alternative-free name per line.
deps_of() {
	apt-cache show --no-all-versions "$1" 2>/dev/null |
		sed -n 's/^Depends: //p' | head -1 | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/^ *//; s/ *$//' | grep -v '^$'
}

# candidate versions of several packages, "pkg version" per line, in one apt-cache call
cand_versions() {
	apt-cache policy "$@" 2>/dev/null | awk '/^[^ ].*:$/ { p = substr($0, 1, length($0) - 1) } /^ *Candidate: / { print p, $2 }'
}

refreshed=${HIL_APT_REFRESHED:-0}
apt_refresh() {
	[ $refreshed -eq 0 ] || return 1
	refreshed=1
	log "apt-get update (package lists missing or stale)"
	apt-get update -qq >"$HIL_BUILD/apt-update.log" 2>&1 || {
		cat "$HIL_BUILD/apt-update.log" >&2
		die "apt-get update failed: cannot resolve the current Debian kernel ABIs"
	}
}

# Resolve LINE -> "abi image headers common kbuild", refreshing the lists once if needed.
resolve() {
	local line=$1 meta img abi hdr common kbuild
	meta=$(meta_for "$line")
	for _try in 1 2; do
		img=$(deps_of "$meta" | grep -E '^linux-image-.*-amd64$' | head -1 || true)
		if [ -n "$img" ]; then
			abi=${img#linux-image-}
			abi=${abi%-amd64}
			hdr=linux-headers-$abi-amd64
			hdeps=$(deps_of "$hdr")
			common=$(grep -E '^linux-headers-.*-common$' <<<"$hdeps" | head -1 || true)
			kbuild=$(grep -E '^linux-kbuild-' <<<"$hdeps" | head -1 || true)
			if [ -n "$common" ] && [ -n "$kbuild" ]; then
				echo "$abi $img $hdr $common $kbuild"
				return 0
			fi
		fi
		apt_refresh || break
	done
	die "cannot resolve the $line kernel: metapackage '$meta' or its headers ($hdr) not found in the apt lists"
}

# apt-get download PKG (candidate version) into $DEBS unless that exact version is present.
# Prints the .deb path.
fetch_deb() {
	local pkg=$1 ver=$2 file
	[ -n "$ver" ] && [ "$ver" != "(none)" ] || die "package '$pkg' has no candidate version in the apt lists"
	# apt-get download names files pkg_version_arch.deb with ':' (epoch) encoded as %3a
	file=$(ls "$DEBS/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
	if [ -z "$file" ]; then
		log "downloading $pkg $ver"
		if ! (cd "$DEBS" && apt-get download "${APT_OPTS[@]}" "$pkg" >"$HIL_BUILD/apt-download.log" 2>&1); then
			cat "$HIL_BUILD/apt-download.log" >&2
			warn "download of Debian package '$pkg' ($ver) failed"
			return 1
		fi
		file=$(ls "$DEBS/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
		[ -n "$file" ] || die "apt-get download '$pkg' reported success but no .deb for $ver is in $DEBS"
	fi
	echo "$file"
}

: >"$HIL_BUILD/kernels.list.tmp"
for line in "${LINES[@]}"; do
	# lists older than a day may name an ABI that is gone: refresh first
	if [ $refreshed -eq 0 ] && [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
		apt_refresh || true
	fi
	read -r abi img hdr common kbuild <<<"$(resolve "$line")"
	kver=$abi-amd64
	debs=()
	vers=$(cand_versions "$img" "$hdr" "$common" "$kbuild")
	for p in "$img" "$hdr" "$common" "$kbuild"; do
		if ! f=$(fetch_deb "$p" "$(awk -v p="$p" '$1 == p { print $2 }' <<<"$vers")"); then
			# the lists may be stale (ABI withdrawn from the mirror): refresh once, start over
			[ $refreshed -eq 0 ] || die "download of Debian package '$p' failed even with fresh apt lists (network down? mirror unreachable?)"
			apt_refresh
			HIL_APT_REFRESHED=1 exec "$0" "${LINES[@]}"
		fi
		debs+=("$f")
	done
	dir=$HIL_BUILD/kernels/$kver
	stamp=$(printf '%s\n' "${debs[@]##*/}" | sha1sum | cut -d' ' -f1)
	if [ "$(cat "$dir/.unpacked" 2>/dev/null)" != "$stamp" ]; then
		log "unpacking $kver (${debs[*]##*/})"
		rm -rf "$dir"
		mkdir -p "$dir/root"
		for f in "${debs[@]}"; do dpkg -x "$f" "$dir/root" || die "dpkg -x $f failed"; done
		kdir=$dir/root/usr/src/linux-headers-$kver
		[ -f "$kdir/Makefile" ] || die "$hdr: no Makefile in $kdir"
		# "include /usr/src/linux-headers-<abi>-common/Makefile" -> the unpacked copy
		sed -i "s|/usr/src/|$(realpath "$dir/root")/usr/src/|g" "$kdir/Makefile"
		grep -q "$(realpath "$dir/root")" "$kdir/Makefile" || die "could not rewrite $kdir/Makefile"
		echo "$stamp" >"$dir/.unpacked"
	fi
	vmlinuz=$dir/root/boot/vmlinuz-$kver
	[ -f "$vmlinuz" ] || die "$img: no /boot/vmlinuz-$kver inside"
	[ -d "$dir/root/lib/modules/$kver" ] || die "$img: no /lib/modules/$kver inside"
	cat >"$dir/kernel.env" <<EOF
LINE=$line
KVER=$kver
ABI=$abi
PKGVER=$(awk -v p="$img" '$1 == p { print $2 }' <<<"$vers")
VMLINUZ=$(realpath "$vmlinuz")
KDIR=$(realpath "$dir/root/usr/src/linux-headers-$kver")
MODROOT=$(realpath "$dir/root/lib/modules/$kver")
EOF
	echo "$kver" >>"$HIL_BUILD/kernels.list.tmp"
	log "kernel $line: $kver ($(awk -v p="$img" '$1 == p { print $2 }' <<<"$vers"))"
done
mv "$HIL_BUILD/kernels.list.tmp" "$HIL_BUILD/kernels.list"
