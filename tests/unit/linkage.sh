#!/usr/bin/env bash
# The shared libraries' interfaces, and lib/common linked once per process
# (lib/common/export.h):
#   - librtrs.so.0 and librnbd.so.0 are their SONAMEs;
#   - librtrs.so exports exactly lib/common's RTRS_PRIVATE symbols (the log
#     state and util.c's helpers, named rtrs_common_*) and, as RTRS_0.1,
#     only rtrs_* functions that include/rtrs.h declares;
#   - librnbd.so exports, as RNBD_0.1, exactly the functions include/rnbd.h
#     declares;
#   - the ABI stays: each library's exported symbols, with their versions,
#     are those of its Debian symbols file (debian/librtrs0.symbols,
#     debian/librnbd0.symbols), no more and no fewer; a change to the
#     interface changes that file in the same commit;
#   - no program or plugin linked against librtrs.so has a copy of
#     lib/common's log state or helpers of its own: they take them from
#     librtrs.so, librnbd.so too; the programs on librnbd take it as
#     librnbd.so.0 and have no copy of it.
# Usage: linkage.sh BUILD_DIR SOURCE_DIR. Exits 77 without nm and objdump.
set -euo pipefail
build=$(cd "${1:?usage: linkage.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: linkage.sh BUILD_DIR SOURCE_DIR}" && pwd)
for t in nm objdump; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done
. "$src/tests/lib/common.sh"

lib=$build/lib/rtrs/librtrs.so.0
check "librtrs's SONAME is librtrs.so.0" bash -c \
	"readelf -d '$lib' | grep -q 'Library soname: \\[librtrs.so.0\\]'"
private="rtrs_common_log_level rtrs_common_log_msg rtrs_common_log_ratelimit_ok
rtrs_common_log_set_sink rtrs_common_parse_size rtrs_common_parse_u64 rtrs_common_rand_below
rtrs_common_rand_bytes rtrs_common_err_detail rtrs_common_err_detail_clear
rtrs_common_err_detail_get rtrs_common_open_regular rtrs_common_file_type_name"

# The dynamic symbols librtrs.so defines, as "VERSION NAME".
objdump -T "$lib" | awk '$2 == "g" && $4 != "*UND*" && $(NF-1) ~ /^RTRS_/ && $NF != $(NF-1) {
	print $(NF-1), $NF }' | sort >"$build/linkage-exports.txt"
check "librtrs.so exports RTRS_PRIVATE: exactly lib/common's log state and helpers" \
	test "$(awk '$1 == "RTRS_PRIVATE" { print $2 }' "$build/linkage-exports.txt" | sort)" = \
	"$(echo $private | tr ' ' '\n' | sort)"
declared() { # every RTRS_0.1 symbol is an rtrs_ function that rtrs.h declares
	local bad=0
	while read -r ver name; do
		[ "$ver" = RTRS_0.1 ] || continue
		# A -Dfault_injection=true build adds the test-only rtrs-fault.h (lib-env.sh checks when).
		grep -Eq "[ *]$name\(" "$src/lib/rtrs/rtrs-fault.h" && continue
		if [[ $name != rtrs_* ]] || ! grep -Eq "[ *]$name\(" "$src/include/rtrs.h"; then
			echo "  $name ($ver) is not declared in include/rtrs.h"
			bad=1
		fi
	done <"$build/linkage-exports.txt"
	return $bad
}
check "librtrs.so's RTRS_0.1 is include/rtrs.h's functions" declared
check "... among them rtrs_addr_parse" grep -qx "RTRS_0.1 rtrs_addr_parse" "$build/linkage-exports.txt"
check "no other version node" \
	bash -c "! awk '\$1 != \"RTRS_0.1\" && \$1 != \"RTRS_PRIVATE\"' '$build/linkage-exports.txt' | grep -q ."

rnbd=$build/lib/rnbd/librnbd.so.0
check "librnbd's SONAME is librnbd.so.0" bash -c \
	"readelf -d '$rnbd' | grep -q 'Library soname: \\[librnbd.so.0\\]'"
objdump -T "$rnbd" | awk '$2 == "g" && $4 != "*UND*" && $(NF-1) ~ /^RNBD_/ && $NF != $(NF-1) {
	print $(NF-1), $NF }' | sort >"$build/linkage-rnbd-exports.txt"
check "librnbd.so exports only RNBD_0.1" \
	bash -c "! awk '\$1 != \"RNBD_0.1\"' '$build/linkage-rnbd-exports.txt' | grep -q ."
check "librnbd.so's RNBD_0.1 is exactly include/rnbd.h's functions" test \
	"$(awk '{ print $2 }' "$build/linkage-rnbd-exports.txt")" = \
	"$(grep -oE '[ *]rnbd_[a-z0-9_]+\(' "$src/include/rnbd.h" | tr -d ' *(' | sort -u)"

# The exported symbols as a Debian symbols file names them (NAME@VERSION,
# the version nodes included), against that file; a -Dfault_injection=true
# build's test-only rtrs-fault.h functions aside.
abi_same() { # LIB SYMBOLS_FILE
	local got want
	got=$(objdump -T "$1" | awk '$2 == "g" && $4 != "*UND*" && $(NF-1) ~ /^R(TRS|NBD)_/ {
		print $NF "@" $(NF-1) }' | grep -v '^rtrs_fault_' | sort)
	want=$(awk '/^ / { print $1 }' "$2" | sort)
	[ "$got" = "$want" ] && return 0
	diff <(echo "$want") <(echo "$got") | sed -n 's/^[<>]/  &/p'
	echo "  (< in $2 only, > exported only)"
	return 1
}
check "librtrs.so's ABI is debian/librtrs0.symbols" abi_same "$lib" "$src/debian/librtrs0.symbols"
check "librnbd.so's ABI is debian/librnbd0.symbols" abi_same "$rnbd" "$src/debian/librnbd0.symbols"

# no_own_copy FILE: FILE defines no symbol of lib/common's log state or
# helpers (under the linker names of export.h, or the plain ones).
no_own_copy() {
	local own
	own=$(nm "$1" | grep -E ' [TtDdBbRr] (rtrs_common_|g_log_level$|log_msg$|log_set_sink$|parse_u64$|parse_size$|rand_bytes$)' || true)
	[ -z "$own" ] || { echo "  $own"; return 1; }
}
uses_shared() { # FILE takes the log state from librtrs.so
	local dyn
	dyn=$(nm -D "$1")
	grep -q ' U rtrs_common_log_level@RTRS_PRIVATE' <<<"$dyn"
}
on_librnbd() { # FILE needs librnbd.so.0 and defines none of its functions
	local own
	readelf -d "$1" | grep -q 'Shared library: \[librnbd.so.0\]' || {
		echo "  does not need librnbd.so.0"; return 1; }
	own=$(nm "$1" | grep -E ' [Tt] (rnbd_srv_open|rnbd_clt_sess_open|rnbd_clt_submit)$' || true)
	[ -z "$own" ] || { echo "  $own"; return 1; }
}
for f in tools/rtrs-perf tools/rnbd-client daemons/rnbd-server nbdkit/nbdkit-rnbd-plugin.so \
	tests/functional/rtrs-test-server tests/functional/test-log tests/functional/test-rnbd \
	tests/functional/test-io; do
	[ -e "$build/$f" ] || continue
	check "$f: no lib/common of its own" no_own_copy "$build/$f"
done
check "librnbd.so logs through librtrs.so's state" uses_shared "$rnbd"
# The programs are built before this test runs (its depends); the functional
# tests may not be yet when only the unit suite was asked for.
for f in tools/rnbd-client daemons/rnbd-server daemons/rnbd-clientd nbdkit/nbdkit-rnbd-plugin.so \
	tests/functional/test-log; do
	[ -e "$build/$f" ] || [[ $f != tests/* ]] || continue
	check "$f: takes librnbd as librnbd.so.0" on_librnbd "$build/$f"
done

finish linkage
