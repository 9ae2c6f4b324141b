# Shared by the shell tests (sourced): checks and their tally, background
# processes that go when the script exits, an rnbd-server started and
# waited for, and the rnbd command on its control socket.
#
#   pids+=($!)                   after starting something in the background
#   check "what" cmd args...     runs cmd; counts and prints ok/FAIL
#   finish NAME                  prints "NAME: N checks, N failed"; status
#   rnbd_server_start LOG [PREFIX...] -- ARGS...
#                                runs PREFIX rnbd-server ARGS (e.g. PREFIX
#                                "ip netns exec ns"), waits until it listens,
#                                sets $port; fails with its log if it does not
#   ctl SOCKET ARGS...           the rnbd command on that control socket
#                                (JSON-RPC): its output, its exit status
#   ctl_dev SOCKET SESS DEV [N]  the server lists DEV open by SESS (with at
#                                least N writes)
#   ctl_none SOCKET              the server lists no open device
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
	local sock=$1
	shift
	"$build/tools/rnbd" --socket "$sock" "$@"
}

ctl_dev() {
	ctl "$1" server list devices -o json | python3 -c '
import json, sys
d = [x for x in json.load(sys.stdin) if x["session"] == sys.argv[1] and x["device"] == sys.argv[2]]
sys.exit(0 if d and d[0]["writes"] >= int(sys.argv[3]) else 1)' "$2" "$3" "${4:-0}"
}

ctl_none() { test "$(ctl "$1" server list devices -o json)" = "[]"; }
