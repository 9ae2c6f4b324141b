#!/usr/bin/env bash
# rnbd-clientd's signals and its control plane under servers that do not
# answer (docs/management.md, "rnbd-clientd's own methods"; the man page's
# SIGNALS), on a host without ublk:
#   - SIGHUP, SIGUSR1 and SIGUSR2 are logged and change nothing: the daemon
#     goes on answering with its mapping; SIGQUIT stops it as SIGTERM does
#     (exit 0, its socket removed, the server left with nothing open);
#   - a map to a server that accepts TCP and says nothing (a silent
#     listener) holds only its own request: client list answers within a
#     second meanwhile, and a map to a good server goes through;
#   - --mappings is restored after the control socket is up, every mapping
#     at once: with four mappings to the silent listener the socket answers
#     at once, and a good mapping in the same file is mapped while the
#     others still hang;
#   - SIGTERM ends the daemon within 5 s in every phase: while it starts
#     (restoring mappings), while a map hangs, while it serves, and with its
#     server frozen (SIGSTOP) before and after the heartbeats noticed, with
#     fast_io_fail_ms at 600000; each time with exit 0 and no socket left.
# Usage: clientd-stop.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: clientd-stop.sh BUILD_DIR}" && pwd)
rnbd=$build/tools/rnbd
clientd=$build/daemons/rnbd-clientd

command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }
[ -e /dev/ublk-control ] && echo "note: this kernel has ublk; the maps below ask for none"

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-clientd-stop.XXXXXX)
cleanup() {
	# A frozen server must be thawed to be killed.
	for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
	kill_pids
	rm -rf "$dir"
}
trap cleanup EXIT

rnbd_server_start "$dir/server.log" -- --port 0 --mem-device "mem0:$((8 << 20))" \
	--mem-device "mem1:$((8 << 20))" --control "$dir/sctl" || exit 1
gport=$port

# The silent listener: accepts every connection, reads and never answers.
python3 - "$dir/silent.port" <<'PY' &
import select, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(128)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
held = []
while True:
    r, _, _ = select.select([s] + held, [], [])
    for x in r:
        if x is s:
            held.append(s.accept()[0])
        elif not x.recv(65536):
            held.remove(x)
            x.close()
PY
pids+=($!)
wait_until 10 test -s "$dir/silent.port" || { echo "FAIL: no silent listener"; exit 1; }
sport=$(cat "$dir/silent.port")

n=0
daemon_start() { # [ARGS...]: a daemon on $dir/cctl, its log $dir/dN.log; waits for "ready"
	n=$((n + 1))
	log=$dir/d$n.log
	"$clientd" --control "$dir/cctl" --log-level info "$@" >"$log" 2>&1 &
	pids+=($!)
	dpid=$!
	wait_until 10 grep -q 'rnbd-clientd ready' "$log" || { cat "$log"; echo "FAIL: no daemon"; exit 1; }
}
c() { "$rnbd" --socket "$dir/cctl" client "$@"; }
alive() { kill -0 "$dpid" 2>/dev/null && c list devices -o json >/dev/null; }
# ms since the epoch
now_ms() { date +%s%3N; }
# stops_within SIG SECONDS: the daemon exits 0 within SECONDS of SIG, its socket gone.
stops_within() {
	local t0 rc=0
	t0=$(now_ms)
	kill -"$1" "$dpid" || { echo "  not running"; return 1; }
	wait_until "$2" bash -c "! kill -0 $dpid 2>/dev/null" || {
		echo "  still running after $2 s"
		kill -9 "$dpid"
		return 1
	}
	wait "$dpid" || rc=$?
	echo "  stopped in $(($(now_ms) - t0)) ms, exit $rc"
	[ "$rc" -eq 0 ] && [ ! -e "$dir/cctl" ]
}
# answers_within SECONDS CMD...: CMD succeeds, in less than SECONDS.
answers_within() {
	local max=$1 t0 t
	shift
	t0=$(now_ms)
	"$@" >/dev/null || { echo "  failed"; return 1; }
	t=$(($(now_ms) - t0))
	echo "  answered in $t ms"
	[ "$t" -lt $((max * 1000)) ]
}

# ---- signals that do not stop it ----------------------------------------------
daemon_start
check "map mem0 (no block device asked)" \
	c map mem0 --session sig --server "127.0.0.1:$gport" --no-block-device
for s in HUP USR1 USR2; do
	kill -"$s" "$dpid" || true
	check "SIG$s: logged" wait_until 5 grep -q "SIG$s" "$log"
	check "... the daemon goes on, its mapping with it" \
		bash -c "'$rnbd' --socket '$dir/cctl' client list devices -o json | grep -q mem0"
done
check "SIGPIPE: ignored" bash -c "kill -PIPE $dpid; sleep 0.2; kill -0 $dpid"
check "SIGQUIT stops it as SIGTERM does (exit 0, socket removed)" stops_within QUIT 5
check "... logged" grep -q "stopping" "$log"
check "... the server has nothing open" wait_until 5 ctl_none "$dir/sctl"

# ---- a map that hangs holds nothing else ----------------------------------------
daemon_start
c map mem0 --session hang --server "127.0.0.1:$sport" --no-block-device >"$dir/hang.out" 2>&1 &
hang=$!
sleep 0.5
check "while a map to the silent listener hangs: client list answers within 1 s" \
	answers_within 1 c list
check "... client list devices too" answers_within 1 c list devices
check "... and a map to a good server goes through" \
	answers_within 3 c map mem1 --session good --server "127.0.0.1:$gport" --no-block-device
check "... the map is still waiting" kill -0 "$hang"
check "SIGTERM while the map hangs: stopped within 5 s" stops_within TERM 5
rc=0
wait "$hang" || rc=$?
check "... the hanging map failed (exit 1), naming the session" \
	bash -c "[ $rc -eq 1 ] && grep -q 'session hang' '$dir/hang.out'"
check "... the server has nothing open" wait_until 5 ctl_none "$dir/sctl"

# ---- restoring mappings ------------------------------------------------------
python3 - "$dir/maps.json" "$sport" "$gport" <<'PY'
import json, sys
m = [{"device": "d%d" % i, "session": "silent%d" % i, "server": ["127.0.0.1:" + sys.argv[2]],
      "block_device": False} for i in range(4)]
m.append({"device": "mem0", "session": "restored", "server": ["127.0.0.1:" + sys.argv[3]],
          "block_device": False})
json.dump(m, open(sys.argv[1], "w"))
PY
t0=$(now_ms)
daemon_start --mappings "$dir/maps.json"
t=$(($(now_ms) - t0))
check "four mappings to a silent server: the socket is up within 2 s ($t ms)" test "$t" -lt 2000
check "... client list answers within 1 s" answers_within 1 c list
check "... the good mapping is restored meanwhile" \
	wait_until 5 bash -c "'$rnbd' --socket '$dir/cctl' client list devices -o json | grep -q restored"
check "... while the others still hang" bash -c "! grep -q 'mapping .*silent' '$log'"
check "SIGTERM while restoring: stopped within 5 s" stops_within TERM 5
check "... the server has nothing open" wait_until 5 ctl_none "$dir/sctl"

# Right after the start: the restore just begun.
"$clientd" --control "$dir/cctl" --mappings "$dir/maps.json" >"$dir/early.log" 2>&1 &
pids+=($!)
dpid=$!
wait_until 10 test -S "$dir/cctl" || true
check "SIGTERM as it starts: stopped within 5 s" stops_within TERM 5

# SIGTERM at any moment of the start, in the unit's environment: 0 (taken by
# the daemon) or 143 (the default action, before main), within 5 s; never a
# library's silent exit 1 (libinfinipath's handler).
unit_env=()
while IFS= read -r l; do unit_env+=("${l#Environment=}"); done \
	< <(grep '^Environment=' "$(dirname "$0")/../../systemd/rnbd-clientd.service.in")
term_at() {
	local rc=0 t0
	env "${unit_env[@]}" "$clientd" --control "$dir/tctl" >"$dir/start.log" 2>&1 &
	local p=$!
	sleep "$1"
	t0=$EPOCHREALTIME
	kill -TERM "$p"
	wait "$p" || rc=$?
	python3 -c "import sys; sys.exit(0 if $EPOCHREALTIME - $t0 < 5 else 1)" &&
		{ [ "$rc" -eq 0 ] || [ "$rc" -eq 143 ]; } && [ ! -e "$dir/tctl" ] ||
		{ echo "  exit $rc: $(cat "$dir/start.log")"; return 1; }
}
for at in 0.02 0.1 0.2 0.3 0.5; do
	check "SIGTERM $at s into the start (the unit's environment): exit 0 or 143 within 5 s" \
		term_at "$at"
done

# ---- a frozen server ---------------------------------------------------------
frozen() { # SECONDS_FROZEN_BEFORE_SIGTERM
	local spid
	rnbd_server_start "$dir/fserver$1.log" -- --port 0 --mem-device "mem0:$((8 << 20))" \
		--control "$dir/fctl$1" || return 1
	spid=${pids[-1]}
	daemon_start
	c map mem0 --session "frozen$1" --server "127.0.0.1:$port" --no-block-device \
		--fast-io-fail-ms 600000 >"$dir/frozen.out" 2>&1 ||
		{ echo "  map: $(cat "$dir/frozen.out")"; kill "$spid"; return 1; }
	kill -STOP "$spid"
	sleep "$1"
	stops_within TERM 5 || { kill -CONT "$spid"; kill "$spid"; return 1; }
	kill -CONT "$spid"
	kill "$spid"
	wait "$spid" 2>/dev/null || true
}
check "serving, the server frozen (SIGSTOP) just now: SIGTERM stops it within 5 s" frozen 0
check "... frozen for 5 s (its path failed, reconnecting): within 5 s" frozen 5

finish clientd-stop
