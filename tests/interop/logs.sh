#!/usr/bin/env bash
# The daemons' logs (docs/management.md, "Logs"):
#   - on stderr every line has its time to the millisecond, its level and
#     its object (the session/path, the device);
#   - with --syslog, lines go to syslog (a socket of this test's at
#     /dev/log, in a mount namespace of its own), facility daemon, the
#     level as the priority, "rnbd-server[PID]" / "rnbd-clientd[PID]" as
#     the tag; nothing on stderr but what comes before the log is set up;
#   - RTRS_LOG_LEVEL sets the level of both daemons, --log-level beats it,
#     and a level that is not one stops the daemon naming where it came
#     from.
# Usage: logs.sh BUILD_DIR. Needs root (the mount namespace).
set -euo pipefail
build=$(cd "${1:?usage: logs.sh BUILD_DIR}" && pwd)
rnbd=$build/tools/rnbd
server=$build/daemons/rnbd-server
clientd=$build/daemons/rnbd-clientd

if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null; then
	echo "SKIP: needs root and unshare (a /dev/log of the test's own)"
	exit 77
fi
. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-logs.XXXXXX)
trap 'kill_pids; rm -rf "$dir"' EXIT

stamp='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} '

# ---- stderr ----------------------------------------------------------------
rnbd_server_start "$dir/s.log" -- --port 0 --mem-device "m0:$((4 << 20))" --control "$dir/sctl" \
	--log-level info || exit 1
"$clientd" --control "$dir/cctl" --log-level info >"$dir/c.log" 2>&1 &
pids+=($!)
cpid=$!
wait_until 10 grep -q 'rnbd-clientd ready' "$dir/c.log" || { cat "$dir/c.log"; exit 1; }
"$rnbd" --socket "$dir/cctl" client map m0 --session lg --server "127.0.0.1:$port" \
	--no-block-device >/dev/null
"$rnbd" --socket "$dir/cctl" client unmap m0 >/dev/null
kill "$cpid"
wait "$cpid" 2>/dev/null || true
every_line_stamped() { # LOG: every line but the program's own "ready"/"listening" line
	! grep -vE "$stamp" "$1" | grep -vE '^(rnbd-clientd ready on|rnbd-server listening on)' |
		grep -q .
}
check "rnbd-server: every stderr line has its time to the millisecond" every_line_stamped "$dir/s.log"
check "rnbd-clientd: every stderr line has its time" every_line_stamped "$dir/c.log"
check "... the level and the path (session/host:port)" \
	grep -qE "$stamp"'rtrs info: lg/127\.0\.0\.1:[0-9]+: connected' "$dir/c.log"
check "... the daemon's own lines name the device and session" \
	grep -qE "$stamp"'rnbd-clientd info: device m0 of session lg: mapped rw' "$dir/c.log"
check "... the server's name the session and device" \
	grep -qE "$stamp"'rtrs info: rnbd: lg: .*m0' "$dir/s.log"

# ---- syslog ----------------------------------------------------------------
# A datagram socket at $dir/dev/log collects what the daemons send; the
# daemons see it as /dev/log in a mount namespace whose /dev is $dir/dev.
mkdir "$dir/dev"
python3 - "$dir/dev/log" "$dir/syslog" <<'PY' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(30)
with open(sys.argv[2], "wb") as out:
    try:
        while True:
            out.write(s.recv(65536).rstrip(b"\n") + b"\n")
            out.flush()
    except socket.timeout:
        pass
PY
pids+=($!)
wait_until 10 test -S "$dir/dev/log" || { echo "FAIL: no syslog socket"; exit 1; }
for d in null zero urandom random; do touch "$dir/dev/$d"; done
in_ns() { # CMD...: with $dir/dev as /dev
	exec unshare -m bash -c 'for d in null zero urandom random; do mount --bind /dev/$d "$0/dev/$d"; done
		mount --rbind "$0/dev" /dev && exec "$@"' "$dir" "$@"
}
in_ns "$server" --syslog --port 0 --mem-device "m1:$((4 << 20))" --log-level info \
	>"$dir/s2.log" 2>&1 &
pids+=($!)
spid=$!
wait_until 10 grep -q 'listening on port' "$dir/s2.log" || { cat "$dir/s2.log"; exit 1; }
port2=$(grep -o 'listening on port [0-9]*' "$dir/s2.log" | grep -o '[0-9]*$')
in_ns "$clientd" --syslog --control "$dir/cctl2" --log-level info >"$dir/c2.log" 2>&1 &
pids+=($!)
cpid=$!
wait_until 10 grep -q 'rnbd-clientd ready' "$dir/c2.log" || { cat "$dir/c2.log"; exit 1; }
"$rnbd" --socket "$dir/cctl2" client map m1 --session sl --server "127.0.0.1:$port2" \
	--no-block-device >/dev/null
"$rnbd" --socket "$dir/cctl2" client unmap m1 >/dev/null
kill "$cpid" "$spid"
wait "$cpid" "$spid" 2>/dev/null || true
wait_until 5 grep -q 'rnbd-server\[[0-9]*\]: rnbd-server info: .*stopping' "$dir/syslog" || true
# <30>: facility daemon (3 * 8) + info (6); <28>: warning; the tag is NAME[PID].
check "rnbd-server --syslog: info lines as daemon.info, tagged rnbd-server[PID]" \
	grep -qE '^<30>.* rnbd-server\[[0-9]+\]: rtrs info: listening on' "$dir/syslog"
check "... warnings as daemon.warning" \
	grep -qE '^<28>.* rnbd-server\[[0-9]+\]: rtrs warn: rnbd: no authentication' "$dir/syslog"
check "... the daemon's own lines too" \
	grep -qE '^<30>.* rnbd-server\[[0-9]+\]: rnbd-server info: .*stopping' "$dir/syslog"
check "rnbd-clientd --syslog: its lines, tagged rnbd-clientd[PID], naming the device" \
	grep -qE '^<30>.* rnbd-clientd\[[0-9]+\]: rnbd-clientd info: device m1 of session sl: mapped' \
	"$dir/syslog"
check "... the library's, naming the path" \
	grep -qE '^<30>.* rnbd-clientd\[[0-9]+\]: rtrs info: sl/127\.0\.0\.1:[0-9]+: connected' \
	"$dir/syslog"
check "... and none of them on stderr" bash -c "! grep -q 'rtrs info' '$dir/s2.log' '$dir/c2.log'"

# ---- levels ------------------------------------------------------------------
level_run() { # LOG ENV-LEVEL ARGS...: rnbd-server with RTRS_LOG_LEVEL (- unset), stopped at once
	local log=$1 lvl=$2 envs=(-u RTRS_LOG_LEVEL)
	shift 2
	[ "$lvl" = - ] || envs=("RTRS_LOG_LEVEL=$lvl")
	env "${envs[@]}" "$server" --port 0 --mem-device m:1M "$@" >"$log" 2>&1 &
	local p=$!
	wait_until 10 grep -q 'listening on port' "$log" || true
	kill "$p" 2>/dev/null
	wait "$p" 2>/dev/null || true
}
level_run "$dir/l1.log" error
check "RTRS_LOG_LEVEL=error: no info or warning line" bash -c "! grep -qE 'rtrs (info|warn)' '$dir/l1.log'"
level_run "$dir/l2.log" error --log-level info
check "--log-level info beats RTRS_LOG_LEVEL=error" grep -q 'rtrs info: listening on' "$dir/l2.log"
level_run "$dir/l3.log" -
check "the default: info" grep -q 'rtrs info: listening on' "$dir/l3.log"
rc=0
RTRS_LOG_LEVEL=loud "$server" --port 0 --mem-device m:1M >"$dir/l4.log" 2>&1 || rc=$?
check "RTRS_LOG_LEVEL=loud: rnbd-server stops, naming it" \
	bash -c "[ $rc -eq 2 ] && grep -q 'RTRS_LOG_LEVEL' '$dir/l4.log'"
rc=0
RTRS_LOG_LEVEL=loud "$clientd" --control "$dir/cctl3" >"$dir/l5.log" 2>&1 || rc=$?
check "RTRS_LOG_LEVEL=loud: rnbd-clientd stops, naming it" \
	bash -c "[ $rc -eq 2 ] && grep -q 'RTRS_LOG_LEVEL' '$dir/l5.log'"
rc=0
"$clientd" --control "$dir/cctl3" --log-level chatty >"$dir/l6.log" 2>&1 || rc=$?
check "--log-level chatty: rnbd-clientd stops, naming the option" \
	bash -c "[ $rc -eq 2 ] && grep -q -- '--log-level' '$dir/l6.log'"
RTRS_LOG_LEVEL=error "$clientd" --control "$dir/cctl4" >"$dir/l7.log" 2>&1 &
pids+=($!)
cpid=$!
wait_until 10 test -S "$dir/cctl4" || true
"$rnbd" --socket "$dir/cctl4" client map m0 --session lv --server "127.0.0.1:$port" \
	--no-block-device >/dev/null
kill "$cpid"
wait "$cpid" 2>/dev/null || true
check "RTRS_LOG_LEVEL=error: rnbd-clientd logs no info line" \
	bash -c "! grep -qE ' info: ' '$dir/l7.log'"

finish logs
