#!/usr/bin/env bash
# The nbdkit plugin's start and its parameters, in nbdkit's default mode
# (it forks into the background once ready):
#   - a wrong server, a missing default device, or a session name another
#     client holds make nbdkit itself exit 1 with the reason on stderr, and
#     leave no socket behind;
#   - every parameter is checked when it is given: a bad value or key exits
#     1 with a message naming the key;
#   - a good configuration serves (nbdinfo reads the size) from the
#     background process;
#   - when the device's info cannot be had after the map (a fault knob), the
#     connection is refused and the mapping given back: the server lists
#     nothing open;
#   - RTRS_LOG_LEVEL sets librnbd's level unless log_level= says otherwise.
# Usage: nbdkit-plugin.sh BUILD_DIR. Exits 77 when a tool is missing.
set -euo pipefail
build=$(cd "${1:?usage: nbdkit-plugin.sh BUILD_DIR}" && pwd)
plugin=$build/nbdkit/nbdkit-rnbd-plugin.so

for t in nbdkit nbdinfo python3; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/nbdkit-sanitizer.sh" # skips a sanitizer build
dir=$(mktemp -d /var/tmp/rnbd-nbdkit.XXXXXX)
cleanup() {
	for f in "$dir"/*.pid; do
		if [ -e "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
	done
	kill_pids
	rm -rf "$dir"
}
trap cleanup EXIT

truncate -s $((16 << 20)) "$dir/disk.img"
rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir" --control "$dir/ctl" || exit 1

# fails NAME WANT ARGS...: nbdkit (forking) exits 1 at once with WANT on
# stderr, and no socket is left.
fails() {
	local name=$1 want=$2 rc=0
	shift 2
	timeout 30 nbdkit -U "$dir/$name.sock" -P "$dir/$name.pid" "$plugin" "$@" \
		>"$dir/$name.out" 2>"$dir/$name.err" || rc=$?
	if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" "$dir/$name.err" || [ -e "$dir/$name.sock" ]; then
		echo "  exit $rc (want 1), socket $([ -e "$dir/$name.sock" ] && echo left || echo gone);" \
			"stderr: $(cat "$dir/$name.err")"
		return 1
	fi
}

check "a server nobody listens on: nbdkit exits 1 with the reason" \
	fails refused "session nbdkit-rnbd to 127.0.0.1:1: Connection refused" server=127.0.0.1:1
check "a server that does not resolve: nbdkit exits 1 saying so" \
	fails dns "session nbdkit-rnbd to nosuch.invalid: cannot resolve nosuch.invalid: " \
	server=nosuch.invalid
check "a default device leading out: nbdkit exits 1 with the reason" \
	fails esc 'device=../etc/passwd: "." or ".." in device name' server="127.0.0.1:$port" \
	device=../etc/passwd
check "a missing default device: nbdkit exits 1 naming it" \
	fails nodev "device=nothing.img: No such file or directory" server="127.0.0.1:$port" \
	device=nothing.img

# Parameters, each refused with its key named.
bad=(
	"port=99999: expected a number in 1..65535|port=99999"
	"port=0: expected a number in 1..65535|port=0"
	"mode=rx: expected rw, ro or migration|mode=rx"
	"session=a/b: expected 1..255 printable|session=a/b"
	"device=../x: |device=../x"
	"fast_io_fail_ms=soon: expected a number|fast_io_fail_ms=soon"
	"io_connections=2000: expected a number in 0..1024|io_connections=2000"
	"server=127.0.0.1:0: port '0' is not a number in 1..65535|server=127.0.0.1:0"
	"server=@127.0.0.1: no source address before '@'|server=@127.0.0.1"
	"server=[::1: no ']' after '['|server=[::1"
	"secret=: expected DHHC-1:..., @FILE or file:FILE|secret=hunter2"
	"host_name=a b: expected 1..223 printable|host_name=a b"
	"session= given twice|session=a|session=b"
	"unknown parameter colour|colour=red"
	"at most 8 paths|server=h1|server=h2|server=h3|server=h4|server=h5|server=h6|server=h7|server=h8|server=h9"
	"provider= needs a value|provider="
	"log_level=loud: expected error, warn, info or debug|log_level=loud"
)
i=0
for b in "${bad[@]}"; do
	IFS='|' read -r -a f <<<"$b"
	args=("${f[@]:1}")
	[[ "${args[0]}" == server=* ]] || args=(server="127.0.0.1:$port" "${args[@]}")
	i=$((i + 1))
	check "refused: ${f[*]:1}" fails "param$i" "${f[0]}" "${args[@]}"
done
check "a refused secret is not echoed" bash -c "! grep -q hunter2 '$dir'/param*.err"

# Good: nbdkit forks, the background process serves.
check "a good configuration: nbdkit returns 0 once ready" \
	nbdkit -U "$dir/good.sock" -P "$dir/good.pid" "$plugin" server="127.0.0.1:$port" \
	session=good device=disk.img
check "... and the export serves from the background" \
	test "$(nbdinfo --size "nbd+unix:///disk.img?socket=$dir/good.sock")" = $((16 << 20))

# That nbdkit holds session "good": a second one with that name is refused.
check "a session name in use: nbdkit exits 1 saying so" \
	fails busy "session good to 127.0.0.1:$port: the server has a session of this name open" \
	server="127.0.0.1:$port" session=good
kill "$(cat "$dir/good.pid")"
rm -f "$dir/good.pid"

# Device info failing after the map: the mapping is given back.
RNBD_PLUGIN_FAULT_DEV_INFO=1 nbdkit -f -U "$dir/fault.sock" "$plugin" server="127.0.0.1:$port" \
	session=fault device=disk.img >"$dir/fault.log" 2>&1 &
pids+=($!)
wait_until 10 test -S "$dir/fault.sock" || { cat "$dir/fault.log"; echo "FAIL: no nbdkit"; exit 1; }
check "device info failing: the connection is refused" \
	bash -c "! nbdinfo --size 'nbd+unix:///disk.img?socket=$dir/fault.sock' 2>/dev/null"
check "... with the reason in nbdkit's log" grep -q "mapping disk.img: device info: " "$dir/fault.log"
check "... and the server has nothing open for it" ctl_none "$dir/ctl"

# Log level: RTRS_LOG_LEVEL, unless log_level= says otherwise (nbdkit -v
# shows librnbd's info and debug lines as its debug lines).
runs() { # LOG LEVEL ARGS...: nbdkit -v with RTRS_LOG_LEVEL=LEVEL (- unset) runs and stops
	local log=$1 level=$2 envs=(-u RTRS_LOG_LEVEL)
	shift 2
	[ "$level" = - ] || envs=("RTRS_LOG_LEVEL=$level")
	env "${envs[@]}" nbdkit -v -U - "$plugin" server="127.0.0.1:$port" "$@" \
		--run true >"$log" 2>&1 || { tail -5 "$log"; return 1; }
}
check "default: runs" runs "$dir/log-default.log" -
check "... with librnbd's info lines" grep -q 'rtrs info: ' "$dir/log-default.log"
check "RTRS_LOG_LEVEL=error: runs" runs "$dir/log-error.log" error
check "... without info lines" bash -c "! grep -q 'rtrs info: ' '$dir/log-error.log'"
check "RTRS_LOG_LEVEL=error, log_level=debug: runs" runs "$dir/log-debug.log" error log_level=debug
check "... with debug lines" grep -q 'rtrs debug: ' "$dir/log-debug.log"
RTRS_LOG_LEVEL=loud check "a bad RTRS_LOG_LEVEL: nbdkit exits 1 saying so" \
	fails badenv "RTRS_LOG_LEVEL=loud: expected error, warn, info or debug" server="127.0.0.1:$port"

finish nbdkit-plugin
