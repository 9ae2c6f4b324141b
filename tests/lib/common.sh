# Shared by the shell tests (sourced): checks and their tally, background
# processes that go when the script exits, an rnbd-server started and
# waited for, and one-line commands on its control socket.
#
#   pids+=($!)                   after starting something in the background
#   check "what" cmd args...     runs cmd; counts and prints ok/FAIL
#   finish NAME                  prints "NAME: N checks, N failed"; status
#   rnbd_server_start LOG [PREFIX...] -- ARGS...
#                                runs PREFIX rnbd-server ARGS (e.g. PREFIX
#                                "ip netns exec ns"), waits until it listens,
#                                sets $port; fails with its log if it does not
#   ctl SOCKET COMMAND           the control socket's whole answer
#   wait_until SECONDS cmd...    polls cmd every 50 ms; false on timeout
# Needs $build (the build directory) for rnbd_server_start, and python3.

pids=()
fails=0 checks=0

kill_pids() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

check() {
	local what=$1
	shift
	checks=$((checks + 1))
	if "$@"; then
		echo "ok: $what"
	else
		echo "FAIL: $what"
		fails=$((fails + 1))
	fi
}

finish() {
	echo "$1: $checks checks, $fails failed"
	[ "$fails" -eq 0 ]
}

wait_until() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.05
	done
}

rnbd_server_start() {
	local log=$1 prefix=()
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do prefix+=("$1"); shift; done
	shift
	"${prefix[@]}" "$build/daemons/rnbd-server" "$@" >"$log" 2>&1 &
	pids+=($!)
	if ! wait_until 10 grep -q 'listening on port' "$log"; then
		cat "$log"
		echo "FAIL: rnbd-server did not start"
		return 1
	fi
	port=$(grep -o 'listening on port [0-9]*' "$log" | head -1 | grep -o '[0-9]*$')
}

ctl() {
	python3 - "$1" "$2" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
out = b""
while True:
    lines = out.split(b"\n")
    if len(lines) > 1 and lines[-2].startswith((b"ok", b"error")):
        break
    chunk = s.recv(4096)
    if not chunk:
        break
    out += chunk
print(out.decode(), end="")
PY
}
