#!/usr/bin/env bash
# What meson install gives an admin, in a scratch destdir: librtrs.so.0 and
# librnbd.so.0 with their headers and pkg-config files, the daemons in
# sbin, the nbdkit plugin under the prefix, systemd units that
# systemd-analyze accepts, an example configuration rnbd-server starts
# from, the man pages; programs built from the installed headers and
# libraries alone (pkg-config) move verified bytes to rtrs-test-server and
# to that rnbd-server; every program says its version.
# Usage: install.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: install.sh BUILD_DIR}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
for t in pkg-config systemd-analyze cc; do
	command -v "$t" >/dev/null || { echo "install: $t is not installed"; exit 77; }
done

. "$src/tests/lib/common.sh"
dir=$(mktemp -d /var/tmp/rtrs-install.XXXXXX)
trap 'kill_pids; rm -rf "$dir"' EXIT
root=$dir/root
prefix=$(meson introspect --buildoptions "$build" |
	python3 -c 'import json, sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])')
libdir=$(meson introspect --buildoptions "$build" |
	python3 -c 'import json, sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "libdir"][0])')
check "meson install into a destdir" bash -c "meson install -C '$build' --destdir '$root' >'$dir/install.log' 2>&1"
p=$root$prefix
check "librtrs.so.0 and its links" test -e "$p/$libdir/librtrs.so.0" -a -L "$p/$libdir/librtrs.so"
check "  its SONAME is librtrs.so.0" bash -c \
	"readelf -d '$p/$libdir/librtrs.so.0' | grep -q 'Library soname: \\[librtrs.so.0\\]'"
check "include/rtrs.h" test -f "$p/include/rtrs.h"
check "librnbd.so.0 and its links" test -e "$p/$libdir/librnbd.so.0" -a -L "$p/$libdir/librnbd.so"
check "  its SONAME is librnbd.so.0" bash -c \
	"readelf -d '$p/$libdir/librnbd.so.0' | grep -q 'Library soname: \\[librnbd.so.0\\]'"
check "include/rnbd.h" test -f "$p/include/rnbd.h"
check "the daemons in sbin" test -x "$p/sbin/rnbd-server" -a -x "$p/sbin/rnbd-clientd"
check "the nbdkit plugin under the prefix" test -f "$p/$libdir/nbdkit/plugins/nbdkit-rnbd-plugin.so"
check "the example configuration" test -f "$p/share/doc/rtrs/examples/rnbd-server.conf.example"

# pkg-config from the destdir: its paths moved there.
export PKG_CONFIG_PATH=$p/$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
check "pkg-config --cflags --libs librtrs librnbd" pkg-config --cflags --libs librtrs librnbd
# shellcheck disable=SC2046
check "a program from the installed header and library builds" \
	cc -std=c11 -Wall -Wextra -Werror -I"$src/tests/lib" "$src/tests/interop/installed-client.c" \
	-o "$dir/installed-client" $(pkg-config --cflags --libs librtrs) -pthread
"$build/tests/functional/rtrs-test-server" --port 0 >"$dir/server.log" 2>&1 &
pids+=($!)
wait_until 10 grep -q 'port [0-9]' "$dir/server.log" || cat "$dir/server.log"
sport=$(grep -o 'port [0-9]*' "$dir/server.log" | head -1 | grep -o '[0-9]*$')
check "  and moves verified bytes through the installed librtrs.so.0" \
	env LD_LIBRARY_PATH="$p/$libdir" "$dir/installed-client" "127.0.0.1:$sport"
check "  which is the one it loads" bash -c \
	"LD_LIBRARY_PATH='$p/$libdir' ldd '$dir/installed-client' | grep -q '$p/$libdir/librtrs.so.0'"

# The units, with their programs' paths moved into the destdir.
for u in rnbd-server rnbd-clientd; do
	sed "s|$prefix/sbin/|$p/sbin/|g" "$p/lib/systemd/system/$u.service" >"$dir/$u.service"
done
check "systemd-analyze verify accepts the units" \
	systemd-analyze verify --man=no "$dir/rnbd-server.service" "$dir/rnbd-clientd.service"
check "  rnbd-server's reloads with SIGHUP" grep -q '^ExecReload=.*-HUP' "$dir/rnbd-server.service"
check "  both sandboxed" bash -c "grep -l '^NoNewPrivileges=yes' '$dir'/*.service | wc -l | grep -qx 2"

# rnbd-server from the example configuration (its export folder moved here).
mkdir "$dir/exports"
sed "s|^dev-search-path .*|dev-search-path $dir/exports|; s|^port .*|port 0|" \
	"$p/share/doc/rtrs/examples/rnbd-server.conf.example" >"$dir/rnbd-server.conf"
rnbd_server_start "$dir/rnbd.log" -- --config "$dir/rnbd-server.conf"
check "rnbd-server starts from the example configuration" test -n "$port"
head -c $((4 << 20)) /dev/zero >"$dir/exports/disk0"
# shellcheck disable=SC2046
check "a program from the installed rnbd.h and librnbd builds" \
	cc -std=c11 -Wall -Wextra -Werror "$src/tests/interop/installed-rnbd.c" \
	-o "$dir/installed-rnbd" $(pkg-config --cflags --libs librnbd)
check "  and writes verified bytes to that server's file through the installed librnbd.so.0" \
	env LD_LIBRARY_PATH="$p/$libdir" "$dir/installed-rnbd" "127.0.0.1:$port" disk0 "$dir/exports/disk0"
check "  which is the one it loads" bash -c \
	"LD_LIBRARY_PATH='$p/$libdir' ldd '$dir/installed-rnbd' | grep -q '$p/$libdir/librnbd.so.0'"

 # The man pages: installed, rendered by man(1) without a warning, and each
# program's lists every option its --help does (both come from its table).
for page in man8/rnbd-server.8 man5/rnbd-server.conf.5 man8/rnbd-clientd.8 man5/rnbd-clientd.conf.5 \
	man8/rnbd.8 man1/rnbd-client.1 man1/rtrs-perf.1 man1/rtrs-key.1 man1/nbdkit-rnbd-plugin.1; do
	check "man page $page renders without warnings" bash -c \
		"MANWIDTH=80 man --warnings -l '$p/share/man/$page' >'$dir/page.txt' 2>'$dir/page.err' &&
		 ! grep -q . '$dir/page.err' && grep -q '^NAME' '$dir/page.txt'"
done
lists_options() { # PROG PAGE [ARGS...]: every --option of PROG ARGS --help is in PAGE
	local prog=$1 page=$2 opt opts missing=
	shift 2
	MANWIDTH=200 man -l "$page" 2>/dev/null | sed 's/\[no-\]//g' >"$dir/page.txt"
	opts=$(LD_LIBRARY_PATH="$p/$libdir" "$prog" "$@" --help | sed 's/\[no-\]//g' |
		grep -oE '^ +(-[a-zA-Z], )?--[a-z][a-z0-9-]*' | grep -oE -- '--[a-z0-9-]+')
	[ -n "$opts" ] || { echo "  $prog $* --help listed no option"; return 1; }
	for opt in $opts; do
		grep -qE -- "(^|[ ,])$opt( |$)" "$dir/page.txt" || missing="$missing $opt"
	done
	[ -z "$missing" ] || { echo "  not in $page:$missing"; return 1; }
}
check "rnbd-server(8) lists every option of rnbd-server --help" \
	lists_options "$p/sbin/rnbd-server" "$p/share/man/man8/rnbd-server.8"
check "rnbd-clientd(8) lists every option of rnbd-clientd --help" \
	lists_options "$p/sbin/rnbd-clientd" "$p/share/man/man8/rnbd-clientd.8"
check "rnbd-client(1) lists every option of rnbd-client --help" \
	lists_options "$p/bin/rnbd-client" "$p/share/man/man1/rnbd-client.1"
check "rtrs-perf(1) lists every option of rtrs-perf --help" \
	lists_options "$p/bin/rtrs-perf" "$p/share/man/man1/rtrs-perf.1"
check "rnbd(8) lists every option of rnbd --help" \
	lists_options "$p/bin/rnbd" "$p/share/man/man8/rnbd.8"
check "rtrs-key(1) lists every option of rtrs-key gen --help" \
	lists_options "$p/bin/rtrs-key" "$p/share/man/man1/rtrs-key.1" gen
lists_keys() { # every key=VALUE of the installed plugin's --help is in its page
	local keys k missing=
	keys=$(LD_LIBRARY_PATH="$p/$libdir" nbdkit "$p/$libdir/nbdkit/plugins/nbdkit-rnbd-plugin.so" \
		--help 2>&1 | grep -oE '^[a-z_]+=')
	[ -n "$keys" ] || { echo "  nbdkit listed no key of the plugin"; return 1; }
	MANWIDTH=200 man -l "$p/share/man/man1/nbdkit-rnbd-plugin.1" 2>/dev/null >"$dir/page.txt"
	for k in $keys; do
		grep -q "^ *$k" "$dir/page.txt" || missing="$missing $k"
	done
	[ -z "$missing" ] || { echo "  not in nbdkit-rnbd-plugin(1):$missing"; return 1; }
}
check "nbdkit-rnbd-plugin(1) lists every key of the plugin's --help" lists_keys

for prog in "$p/sbin/rnbd-server" "$p/sbin/rnbd-clientd" "$p/bin/rnbd" "$p/bin/rnbd-client" \
	"$p/bin/rtrs-perf" "$p/bin/rtrs-key"; do
	want="$(basename "$prog") $(meson introspect --projectinfo "$build" |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')"
	check "$(basename "$prog") --version says '$want'" bash -c \
		"[ \"\$(LD_LIBRARY_PATH='$p/$libdir' '$prog' --version)\" = '$want' ]"
done
finish install
