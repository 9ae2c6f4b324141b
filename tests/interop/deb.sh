#!/usr/bin/env bash
# The Debian packages, as an admin gets them: dpkg-buildpackage -us -uc -b
# on a copy of the source (the symbols files hold the exported symbols:
# DPKG_GENSYMBOLS_CHECK_LEVEL=4 in debian/rules), lintian with no error,
# apt-get install of the packages on this machine, and then:
#   - man rnbd-server renders, as do the other pages by name;
#   - pkg-config --cflags --libs librtrs librnbd;
#   - readelf: librtrs.so.0 and librnbd.so.0 are the installed SONAMEs;
#   - a C program compiled against the installed rnbd.h and librnbd alone
#     maps a file of the installed rnbd-server, started from the packaged
#     example configuration, and moves verified bytes into it;
#   - systemd-analyze verify accepts the installed units, and installing
#     enabled neither;
#   - the packages purge cleanly and leave none of their files behind.
# Needs root (it installs packages here): exits 77 without it or without
# dpkg-buildpackage, lintian or apt-get. Refuses (77) to run while any of
# the project's packages is installed: it would replace an admin's.
# Usage: deb.sh BUILD_DIR (for rtrs-test-server's absence: the server here
# is the installed rnbd-server).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/lib/common.sh"

[ "$(id -u)" -eq 0 ] || { echo "deb: needs root (installs packages); skipping"; exit 77; }
for t in dpkg-buildpackage lintian apt-get pkg-config systemd-analyze man cc; do
	command -v "$t" >/dev/null || { echo "deb: $t is not installed; skipping"; exit 77; }
done
pkgs=(librtrs0 librtrs-dev librnbd0 librnbd-dev rnbd-server rnbd-client rnbd-utils nbdkit-plugin-rnbd)
for p in "${pkgs[@]}"; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qx "install ok installed"; then
		echo "deb: $p is installed on this machine; not replacing it (skipping)"
		exit 77
	fi
done

dir=$(mktemp -d /var/tmp/rtrs-deb.XXXXXX)
installed=false
cleanup() {
	kill_pids
	if $installed; then
		DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${pkgs[@]}" >"$dir/purge.log" 2>&1 ||
			cat "$dir/purge.log"
	fi
	rm -rf "$dir"
}
trap cleanup EXIT

# The tracked files only, as a clean checkout has them (no build folders).
mkdir "$dir/rtrs-src"
(cd "$src" && git ls-files -z 2>/dev/null || find . -path ./build\* -prune -o -type f -print0) |
	(cd "$src" && xargs -0 cp --parents -t "$dir/rtrs-src")
check "dpkg-buildpackage -us -uc -b builds the packages" bash -c \
	"cd '$dir/rtrs-src' && dpkg-buildpackage -us -uc -b >'$dir/build.log' 2>&1 ||
	 { tail -40 '$dir/build.log'; exit 1; }"
debs=()
for p in "${pkgs[@]}"; do
	f=$(ls "$dir"/"${p}"_*.deb 2>/dev/null | head -1 || true)
	check "  package $p" test -n "$f"
	[ -n "$f" ] && debs+=("$f")
done
[ ${#debs[@]} -eq ${#pkgs[@]} ] || { finish deb; exit 1; }
# lintian leaves folders of its own in TMPDIR (mldbm-elf-*): this one's go with $dir.
mkdir "$dir/tmp"
check "lintian reports no error" bash -c \
	"TMPDIR='$dir/tmp' lintian --fail-on error '$dir'/*.changes >'$dir/lintian.log' 2>&1 ||
	 { cat '$dir/lintian.log'; exit 1; }"
grep -E '^[EW]: ' "$dir/lintian.log" || true

# Purged on the way out whatever happens from here (a purge of packages that
# are not installed does nothing), even if the install is cut short.
installed=true
check "apt-get install ./*.deb" bash -c \
	"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${debs[*]} \
	 >'$dir/install.log' 2>&1 || { tail -20 '$dir/install.log'; exit 1; }"
lib=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)

check "man rnbd-server renders" bash -c \
	"MANWIDTH=80 man rnbd-server 2>'$dir/man.err' | grep -q '^NAME' && ! grep -q . '$dir/man.err'"
for page in rnbd-server.conf rnbd-clientd rnbd-clientd.conf rnbd rnbd-client rtrs-perf rtrs-key \
	nbdkit-rnbd-plugin; do
	check "  man $page" bash -c "MANWIDTH=80 man $page 2>/dev/null | grep -q '^NAME'"
done
check "pkg-config --cflags --libs librtrs librnbd" bash -c \
	"pkg-config --cflags --libs librtrs librnbd | tee '$dir/pc.txt' && grep -q -- '-lrnbd' '$dir/pc.txt'"
check "librtrs.so.0's SONAME" bash -c "readelf -d $lib/librtrs.so.0 | grep -q 'soname: \\[librtrs.so.0\\]'"
check "librnbd.so.0's SONAME" bash -c "readelf -d $lib/librnbd.so.0 | grep -q 'soname: \\[librnbd.so.0\\]'"

# The installed server, from the packaged example, exporting a folder here.
mkdir "$dir/exports"
head -c $((4 << 20)) /dev/zero >"$dir/exports/disk0"
zcat -f /usr/share/doc/rnbd-server/examples/rnbd-server.conf.example* |
	sed "s|^dev-search-path .*|dev-search-path $dir/exports|; s|^port .*|port 0|" >"$dir/rnbd-server.conf"
/usr/sbin/rnbd-server --config "$dir/rnbd-server.conf" >"$dir/server.log" 2>&1 &
pids+=($!)
wait_until 20 grep -q 'listening on port [0-9]' "$dir/server.log" || cat "$dir/server.log"
sport=$(grep -o 'listening on port [0-9]*' "$dir/server.log" | head -1 | grep -o '[0-9]*$' || true)
check "the installed rnbd-server starts from the packaged example" test -n "$sport"
# shellcheck disable=SC2046
check "a program from the installed rnbd.h and librnbd builds" \
	cc -std=c11 -Wall -Wextra -Werror "$src/tests/interop/installed-rnbd.c" -o "$dir/installed-rnbd" \
	$(pkg-config --cflags --libs librnbd)
check "  and moves verified bytes into the server's file" \
	"$dir/installed-rnbd" "127.0.0.1:$sport" disk0 "$dir/exports/disk0"
loads() { # PROG LIB: PROG loads the installed LIB (through /lib or /usr/lib: merged /usr)
	local got
	got=$(ldd "$1" | awk -v l="$2" '$1 == l { print $3 }')
	[ -n "$got" ] && [ "$(readlink -f "$got")" = "$(readlink -f "$lib/$2")" ] ||
		{ echo "  $2: $got"; return 1; }
}
check "  through the installed librnbd.so.0" loads "$dir/installed-rnbd" librnbd.so.0
check "  and librtrs.so.0" loads "$dir/installed-rnbd" librtrs.so.0

# One fabric per transport, both the project's: nothing installed loads libfabric.
for prog in /usr/sbin/rnbd-server /usr/sbin/rnbd-clientd /usr/bin/rnbd /usr/bin/rnbd-client \
	/usr/bin/rtrs-perf "$lib/librtrs.so.0" "$lib/librnbd.so.0"; do
	check "  ldd $prog names no libfabric" bash -c "! ldd '$prog' | grep -q libfabric"
done
check "  debian/control names no libfabric" bash -c "! grep -qi libfabric '$src/debian/control'"

check "systemd-analyze verify accepts the installed units" \
	systemd-analyze verify --man=no /lib/systemd/system/rnbd-server.service \
	/lib/systemd/system/rnbd-clientd.service
check "  neither unit was enabled by the install" bash -c \
	"! ls /etc/systemd/system/*.wants/rnbd-server.service /etc/systemd/system/*.wants/rnbd-clientd.service 2>/dev/null | grep -q ."
for prog in /usr/sbin/rnbd-server /usr/sbin/rnbd-clientd /usr/bin/rnbd /usr/bin/rnbd-client \
	/usr/bin/rtrs-perf /usr/bin/rtrs-key; do
	check "  $prog --version" bash -c "'$prog' --version | grep -qx '$(basename "$prog") [0-9.]*'"
done

kill_pids
pids=()
# rnbd-clientd's saved mappings, as "rnbd client save" leaves them: the
# purge takes them (not when this machine had that folder before).
state=false
if [ ! -e /var/lib/rnbd ]; then
	mkdir /var/lib/rnbd && echo '[]' >/var/lib/rnbd/mappings && state=true
fi
check "the packages purge" bash -c \
	"DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ${pkgs[*]} >'$dir/purge.log' 2>&1 ||
	 { cat '$dir/purge.log'; exit 1; }"
installed=false
check "  and leave none of their files" bash -c \
	"! ls /usr/sbin/rnbd-server $lib/librtrs.so.0 $lib/librnbd.so.0 /usr/include/rnbd.h \
	   /lib/systemd/system/rnbd-server.service 2>/dev/null | grep -q ."
if $state; then
	check "  nor rnbd-clientd's state (/var/lib/rnbd)" test ! -e /var/lib/rnbd
	rm -rf /var/lib/rnbd
fi
finish deb
