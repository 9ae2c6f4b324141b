#!/usr/bin/env bash
# rnbd-server's own front: its config file and command line.

#   config   a file named with an abbreviated --conf is read; a bad line, a
#            nested config line, a directory or a missing file stop the
#            server with the file (and line) named, exit status 2; a flag the
#            file sets is cleared with --no-FLAG; '#' inside a value and a
#            quoted value with " #" reach the server intact.
# Usage: rnbd-server.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: rnbd-server.sh BUILD_DIR}" && pwd)
server=$build/daemons/rnbd-server
client=$build/tools/rnbd-client
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }
unset RTRS_LOG_LEVEL

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-server.XXXXXX)
trap 'kill_pids; rm -rf "$dir"' EXIT

# refused NAME WANT ARGS...: the server exits 2 at once, WANT in its stderr.
refused() {
	local name=$1 want=$2 rc=0
	shift 2
	timeout 10 "$server" "$@" >"$dir/$name.out" 2>"$dir/$name.err" || rc=$?
	if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" "$dir/$name.err"; then
		echo "  exit $rc (want 2); stderr: $(cat "$dir/$name.err")"
		return 1
	fi
}

# stop_server: the last server started goes (SIGTERM) and is waited for.
stop_server() {
	kill "${pids[-1]}" 2>/dev/null || true
	wait "${pids[-1]}" 2>/dev/null || true
	unset 'pids[-1]'
}

# ---- config file ------------------------------------------------------------

printf 'port 0\nqueue-depth 70000\n' >"$dir/bad.conf"
check "a bad line through --conf: exit 2 naming the file and line" \
	refused bad "$dir/bad.conf:2: queue-depth 70000: expected a number in 1..65535" \
	--conf "$dir/bad.conf"
printf 'port 0\n' >"$dir/inner.conf"
printf '# outer\nconfig %s\n' "$dir/inner.conf" >"$dir/nested.conf"
check "a config line in a config file: refused" \
	refused nested "$dir/nested.conf:2: config: config files do not nest" -c "$dir/nested.conf"
check "a directory as the config file: refused" \
	refused isdir "config file $dir: is a directory" --config "$dir"
check "a missing config file: refused" \
	refused missing "config file $dir/none.conf: No such file or directory" \
	--config="$dir/none.conf"
check "an unknown option on the command line: refused" refused unknown "--bogus" --bogus

# The file says quiet; --no-quiet on the command line wins.
printf 'port 0\nquiet\n' >"$dir/quiet.conf"
rnbd_server_start "$dir/quiet.log" -- --conf "$dir/quiet.conf" || exit 1
stop_server
check "quiet from the file: no info lines" bash -c "! grep -q 'info' '$dir/quiet.log'"
rnbd_server_start "$dir/noquiet.log" -- --conf "$dir/quiet.conf" --no-quiet || exit 1
stop_server
check "--no-quiet clears the file's quiet" grep -q 'rtrs info: ' "$dir/noquiet.log"

# '#' inside a value, and a quoted value holding " #".
mkdir "$dir/ex#1"
head -c 65536 /dev/urandom >"$dir/ex#1/disk.img"
cat >"$dir/hash.conf" <<EOF
# the search path has a '#', not a comment
dev-search-path $dir/ex#1   # this is one
control "$dir/ctl #2"
port = 0
EOF
rnbd_server_start "$dir/hash.log" -- -c "$dir/hash.conf" || exit 1
check "a value with '#' is the whole value" \
	"$client" read --server "127.0.0.1:$port" --session hash --device disk.img \
	--file "$dir/out.img"
check "... and the device read is the file below it" cmp -s "$dir/ex#1/disk.img" "$dir/out.img"
check "a quoted value with ' #' is the whole value" \
	test "$(ctl "$dir/ctl #2" list)" = "ok 0 devices"
stop_server

finish rnbd-server
