#!/usr/bin/env bash
# rnbd-server's own front: its config file and command line.

#   config   a file named with an abbreviated --conf is read; a bad line, a
#            nested config line, a directory or a missing file stop the
#            server with the file (and line) named, exit status 2, also for
#            values checked after reading (--qos, --provider, --log-level,
#            --metrics, --addr, --dev-search-path, --auth-name); a flag the
#            file sets is cleared with --no-FLAG; '#' inside a value and a
#            quoted value with " #" reach the server intact.
#   control  --control at a regular file, or at a socket a live server
#            answers on, is refused and left alone; a stale socket (its
#            server killed) is replaced; SIGTERM and SIGINT remove the
#            socket (mode 0600); a client that leaves without reading does
#            not kill the server (SIGPIPE); the management plane is JSON-RPC
#            (the rnbd command): bad requests get a JSON-RPC error with
#            their reason, the server unaffected.
#   SIGHUP   checks the key file and logs the outcome, good or bad; the
#            server keeps serving.
#   transport --addr, --provider, --queue-depth, --chunk-size, --auth-keys,
#            --auth-name, --no-invalidate and --hb-interval each reach librtrs:
#            its listening line (always_invalidate on or off), what a client
#            sees, a client refused, a stopped client dropped within 3
#            heartbeats.
#   log level RTRS_LOG_LEVEL is honoured (error: no info lines; debug:
#            debug lines) unless --log-level or --quiet says otherwise; a
#            bad value stops the server.
#   checks   options are checked before anything starts (exit 2, the option
#            or file and the cause, nothing listening, no control socket
#            left): an option without its argument, a FIFO as the config
#            file (at once, not blocked in open), a search path that is not
#            a directory, a key file that lists no host, memory devices
#            beyond the machine's RAM and swap, a size with an unknown unit,
#            a bad --metrics address, a --chunk-size that is no power of two.
#   block devices (root and losetup, else skipped, said): a loop device is
#            opened with O_DIRECT and announced with the write cache and FUA
#            its queue has in sysfs (write back: a write cache, no FUA;
#            write through: neither), as the kernel's rnbd-server does;
#            bytes written through the server are on the device (read with
#            O_DIRECT); --buffered-bdev serves it through the page cache,
#            announcing a write cache and FUA.
#   listening a taken port or a missing address: the cause is logged at
#            once; SIGTERM stops the waiting server within 5 s (exit 0);
#            SIGHUP does not; --listen-timeout ends the wait with exit 1
#            and the real errno; without it the server keeps retrying and
#            listens once the port is free. Started as the systemd unit
#            starts it (its Environment= lines), SIGTERM at any moment of the
#            start ends it with exit 0, or by the default action before main
#            runs, never with libinfinipath's silent exit 1.
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

# refused NAME STATUS WANT ARGS...: the server exits STATUS at once, WANT in its stderr.
refused() {
	local name=$1 status=$2 want=$3 rc=0
	shift 3
	timeout 10 "$server" "$@" >"$dir/$name.out" 2>"$dir/$name.err" || rc=$?
	if [ "$rc" -ne "$status" ] || ! grep -qF -- "$want" "$dir/$name.err"; then
		echo "  exit $rc (want $status); stderr: $(cat "$dir/$name.err")"
		return 1
	fi
}

# stop_server [SIGNAL]: the last server started goes (SIGTERM) and is waited
# for; its exit status is in $stopped.
stop_server() {
	kill "-${1:-TERM}" "${pids[-1]}" 2>/dev/null || true
	stopped=0
	wait "${pids[-1]}" 2>/dev/null || stopped=$?
	unset 'pids[-1]'
}

# ---- config file ------------------------------------------------------------

printf 'port 0\nqueue-depth 70000\n' >"$dir/bad.conf"
check "a bad line through --conf: exit 2 naming the file and line" \
	refused bad 2 "$dir/bad.conf:2: queue-depth 70000: expected a number in 1..65535" \
	--conf "$dir/bad.conf"
# Values checked after the file is read name their line as well.
printf 'port 0\n# rates\nqos session:a:iops=10\nqos session:b:iop=10\n' >"$dir/qos.conf"
check "a rate limit that does not parse: its file and line" \
	refused qosline 2 "$dir/qos.conf:4: qos session:b:iop=10: an unknown limit" -m m:1M \
	-c "$dir/qos.conf"
printf 'port 0\nqos session:hv1:iops=2000\n\nqos session:hv1:bps=100M\n' >"$dir/qos2.conf"
check "two rate limits for one name: refused with both lines (the second replaced the first)" \
	refused qostwice 2 "$dir/qos2.conf:4: qos session:hv1:bps=100M: session hv1 has its limits already ($dir/qos2.conf:2: qos)" \
	-m m:1M -c "$dir/qos2.conf"
check "one device written two ways: the same name, refused" \
	refused qosnorm 2 "--qos device:/vm//a/:bps=1M: device vm/a has its limits already" \
	-m m:1M --port 0 --qos device:vm/a:iops=5 --qos device:/vm//a/:bps=1M
check "a limit twice in one spec: refused" \
	refused qoskey 2 "--qos session:s:iops=5,iops=0: a limit given twice" \
	-m m:1M --port 0 --qos session:s:iops=5,iops=0
check "a device name of slashes only: refused with the option" \
	refused qosslash 2 "--qos device:/:iops=5: a device name of slashes only" \
	-m m:1M --port 0 --qos device:/:iops=5
check "--mem-device a:4K,b:8K: one option, one device (not two)" \
	refused memcomma 2 'memory device "a:4K,b": a name with' --port 0 --mem-device a:4K,b:8K
printf 'port 0\nprovider tpc\n' >"$dir/prov.conf"
check "an unknown provider: its file and line" \
	refused provline 2 "$dir/prov.conf:2: provider tpc: expected tcp, verbs or rdma" -m m:1M \
	-c "$dir/prov.conf"
printf '\nlog-level chatty\n' >"$dir/level.conf"
check "an unknown log level: its file and line" \
	refused levelline 2 "$dir/level.conf:2: log-level chatty: expected error, warn" -m m:1M \
	--port 0 -c "$dir/level.conf"
printf 'port 0\n\n\nmetrics nowhere\n' >"$dir/metrics.conf"
check "a metrics address without a port: its file and line" \
	refused metricsline 2 "$dir/metrics.conf:4: metrics nowhere: expected HOST:PORT" -m m:1M \
	-c "$dir/metrics.conf"
printf 'port 0\naddr 10.0.0.300\n' >"$dir/addr.conf"
check "a listen address that is no address: its file and line, at once (not retried)" \
	refused addrline 2 "$dir/addr.conf:2: addr 10.0.0.300: not an IPv4 or IPv6 address" -m m:1M \
	-c "$dir/addr.conf"
check "--addr fe80::1::2: refused at once" \
	refused addrarg 2 "rnbd-server: --addr fe80::1::2: not an IPv4 or IPv6 address" -m m:1M \
	--addr fe80::1::2
printf 'port 0\naddr 10.0.0.1 10.0.0.2\n' >"$dir/addr2.conf"
check "two addresses on one addr line: its file and line, at once (a name that never resolves)" \
	refused addrtwo 2 "$dir/addr2.conf:2: addr 10.0.0.1 10.0.0.2: not an IPv4 or IPv6 address, and not a host name (a blank" \
	-m m:1M -c "$dir/addr2.conf"
check "--addr a..b: refused at once" \
	refused addrlabel 2 "rnbd-server: --addr a..b: not an IPv4 or IPv6 address, and not a host name (an empty label)" \
	-m m:1M --addr a..b
printf 'port 0\n# exports\ndev-search-path %s\n' "$dir/none" >"$dir/search.conf"
check "a search path that does not exist: its file and line" \
	refused searchline 2 "$dir/search.conf:3: dev-search-path $dir/none: No such file or directory" \
	-c "$dir/search.conf"
printf 'port 0\nmem-device m:1M\nauth-name "two words"\n' >"$dir/name.conf"
check "an authentication name with a blank: its file and line" \
	refused nameline 2 "$dir/name.conf:3: auth-name two words: a blank or a character" \
	-c "$dir/name.conf"
printf 'port 0\n' >"$dir/inner.conf"
printf '# outer\nconfig %s\n' "$dir/inner.conf" >"$dir/nested.conf"
check "a config line in a config file: refused" \
	refused nested 2 "$dir/nested.conf:2: config: config files do not nest" -c "$dir/nested.conf"
check "a directory as the config file: refused" \
	refused isdir 2 "config file $dir: is a directory" --config "$dir"
check "a missing config file: refused" \
	refused missing 2 "config file $dir/none.conf: No such file or directory" \
	--config="$dir/none.conf"
check "an unknown option on the command line: refused" refused unknown 2 "--bogus" --bogus

# The file says quiet; --no-quiet on the command line wins.
printf 'port 0\nquiet\nmem-device m:1M\n' >"$dir/quiet.conf"
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
	test "$(ctl "$dir/ctl #2" server list devices -o json)" = "[]"
stop_server

# ---- options checked before anything starts ------------------------------------

# early NAME WANT ARGS...: exit 2 within 5 s, WANT in stderr, and nothing was
# started: no listening line, no control socket left.
early() {
	local name=$1 want=$2 t0=$SECONDS
	shift 2
	refused "$name" 2 "$want" --port 0 --control "$dir/early.sock" "$@" || return 1
	[ $((SECONDS - t0)) -le 5 ] || { echo "  took $((SECONDS - t0)) s"; return 1; }
	! grep -q 'listening' "$dir/$name.out" "$dir/$name.err" ||
		{ echo "  it listened: $(cat "$dir/$name.err")"; return 1; }
	[ ! -e "$dir/early.sock" ] || { echo "  the control socket was left"; return 1; }
}
check "-p without its argument: said so, not 'unknown option'" \
	early noarg "rnbd-server: option -p needs an argument" -m m:1M -p
check "--port without its argument: said so" \
	early noarg-long "rnbd-server: option --port needs an argument" -m m:1M --port
mkfifo "$dir/fifo.conf"
check "a FIFO as the config file: refused at once, not opened for a writer" \
	early fifo "config file $dir/fifo.conf: not a regular file (a FIFO)" -c "$dir/fifo.conf"
check "a search path that does not exist" \
	early nodir "rnbd-server: --dev-search-path $dir/none: No such file or directory" -s "$dir/none"
check "a search path whose fixed part does not exist" \
	early nodir2 "--dev-search-path $dir/none/%SESSNAME%: $dir/none: No such file" \
	-s "$dir/none/%SESSNAME%"
echo "a file" >"$dir/plain"
check "a search path that is a file" \
	early notdir "rnbd-server: --dev-search-path $dir/plain: not a directory" -s "$dir/plain"
(umask 077 && : >"$dir/empty.keys" && printf '# nobody yet\n\n' >"$dir/comment.keys")
echo '* sessions=* migration=*' >"$dir/all.access" # every authenticated host: everything
check "an empty key file: refused, not refusing every host later" \
	early emptykeys "key file $dir/empty.keys lists no host" -m m:1M --auth-keys "$dir/empty.keys" \
	--access "$dir/all.access"
check "a key file of comments only: the same" \
	early commentkeys "key file $dir/comment.keys lists no host" -m m:1M \
	--auth-keys "$dir/comment.keys" --access "$dir/all.access"
check "a missing key file: named" \
	early nokeys "--auth-keys $dir/none.keys: No such file or directory" -m m:1M \
	--auth-keys "$dir/none.keys" --access "$dir/all.access"
# More than RAM and swap together, whatever this machine has.
toobig=$(awk '/^(MemTotal|SwapTotal):/ { kb += $2 } END { printf "%dG", kb / 1048576 + 2 }' \
	/proc/meminfo)
check "-m mem0:$toobig, more than RAM and swap: refused with the machine's memory" \
	early bigmem "memory device mem0: $toobig is more than this machine's memory" -m "mem0:$toobig"
check "-m mem0:1P: the unit is the cause, not '4 KiB multiples'" \
	early petamem 'memory device mem0: size "1P": expected a number of bytes, with K, M, G or T' \
	-m mem0:1P
printf '# two devices\nmem-device ok:1M\nmem-device a/../b:1M\n' >"$dir/memname.conf"
check "a memory device's name with \"..\": its file and line" \
	early memname "$dir/memname.conf:3: mem-device a/../b:1M: memory device \"a/../b\": \".\" or \"..\" in device name" \
	-c "$dir/memname.conf"
check "-m mem0:5000: not a multiple of 4 KiB" \
	early oddmem "memory device mem0: size 5000 is not a multiple of 4 KiB" -m mem0:5000
check "--metrics without a port: refused before the listener" \
	early metrics "rnbd-server: --metrics nowhere: expected HOST:PORT" -m m:1M --metrics nowhere
check "--chunk-size 100k: not a power of two, refused before the listener" \
	early chunk "rnbd-server: --chunk-size 100k: 102400 is not a power of two" -m m:1M --chunk-size 100k
check "queue depth x chunk size beyond the immediate: refused by librtrs, exit 2" \
	early qdchunk "do not fit the 28-bit immediate" -m m:1M -q 65535 --chunk-size 128M

# ---- listening: a taken port, a missing address, signals ------------------------

# SIGTERM while the server starts, in the unit's environment: 0 (taken by
# the server) or 143 (the default action, before main), within 5 s.
unit_env=()
while IFS= read -r l; do unit_env+=("${l#Environment=}"); done \
	< <(grep '^Environment=' "$(dirname "$0")/../../systemd/rnbd-server.service.in")
term_at() {
	local rc=0 t0
	env "${unit_env[@]}" "$server" --port 0 --mem-device m:1M >"$dir/start.log" 2>&1 &
	local p=$!
	sleep "$1"
	t0=$EPOCHREALTIME
	kill -TERM "$p"
	wait "$p" || rc=$?
	python3 -c "import sys; sys.exit(0 if $EPOCHREALTIME - $t0 < 5 else 1)" &&
		{ [ "$rc" -eq 0 ] || [ "$rc" -eq 143 ]; } ||
		{ echo "  exit $rc: $(cat "$dir/start.log")"; return 1; }
}
for at in 0.02 0.1 0.2 0.3 0.5; do
	check "SIGTERM $at s into the start (the unit's environment): exit 0 or 143 within 5 s" \
		term_at "$at"
done

# The first server holds a port; a second one on it cannot listen.
rnbd_server_start "$dir/holder.log" -- --port 0 --mem-device m:1M || exit 1
held=$port
holder=${pids[-1]}
# waiter NAME ARGS...: a server started on the held port, in the background.
waiter() {
	local name=$1
	shift
	"$server" --port "$held" --mem-device m:1M "$@" >"$dir/$name.log" 2>&1 &
	pids+=($!)
}
# stops_within SECONDS SIGNAL: the last server started exits 0 that soon after SIGNAL.
stops_within() {
	local t0=$EPOCHREALTIME ms
	stop_server "$2"
	ms=$(python3 -c "print(int(($EPOCHREALTIME - $t0) * 1000))")
	echo "  (stopped in $ms ms, exit $stopped)"
	[ "$stopped" -eq 0 ] && [ "$ms" -lt $(($1 * 1000)) ]
}
waiter taken
check "a taken port: the real cause logged at once" \
	wait_until 5 grep -qs "cannot listen on 0.0.0.0:$held .*(Address already in use)" \
	"$dir/taken.log"
kill -HUP "${pids[-1]}"
sleep 0.5
check "SIGHUP while waiting to listen: handled, the server waits on" \
	bash -c "kill -0 ${pids[-1]} && grep -q 'SIGHUP: no --auth-keys file' '$dir/taken.log'"
check "SIGTERM while waiting to listen: exit 0 within 5 s" stops_within 5 TERM
check "... and said" grep -q "Terminated before listening, stopping" "$dir/taken.log"
waiter taken-int
wait_until 5 grep -qs "cannot listen" "$dir/taken-int.log" || true
check "SIGINT while waiting to listen: exit 0 within 5 s" stops_within 5 INT

# listen_fails NAME WANT ARGS...: exit 1 after --listen-timeout 1 (within 6 s),
# its message the real errno, not a timeout.
listen_fails() {
	local name=$1 want=$2 rc=0 t0=$SECONDS
	shift 2
	timeout 20 "$server" --mem-device m:1M --listen-timeout 1 "$@" >"$dir/$name.out" \
		2>"$dir/$name.err" || rc=$?
	[ "$rc" -eq 1 ] && [ $((SECONDS - t0)) -le 6 ] && grep -qF -- "$want" "$dir/$name.err" &&
		! grep -q 'timed out' "$dir/$name.err" ||
		{ echo "  exit $rc after $((SECONDS - t0)) s: $(cat "$dir/$name.err")"; return 1; }
}
check "--listen-timeout 1 on a taken port: exit 1, Address already in use" \
	listen_fails inuse "not listening on 0.0.0.0:$held after 1 s (--listen-timeout): Address already in use" \
	--port "$held"
check "--listen-timeout 1 on an address this host lacks: exit 1, Cannot assign requested address" \
	listen_fails noaddr "not listening on 192.0.2.1:0 after 1 s (--listen-timeout): Cannot assign" \
	--addr 192.0.2.1 --port 0

# Without --listen-timeout the server keeps retrying: it listens once the port is free.
waiter forever
wait_until 5 grep -qs "cannot listen" "$dir/forever.log" || true
sleep 1.5
check "without --listen-timeout: still waiting after the first retries" kill -0 "${pids[-1]}"
kill -TERM "$holder"
wait "$holder" 2>/dev/null || true
check "... and listening on the port once it is free" \
	wait_until 10 grep -qs "listening on port $held" "$dir/forever.log"
check "... reading through it" \
	"$client" info --server "127.0.0.1:$held" --session forever --device m
check "SIGTERM while serving: exit 0 within 5 s" stops_within 5 TERM
for i in "${!pids[@]}"; do [ "${pids[$i]}" != "$holder" ] || unset "pids[$i]"; done
pids=("${pids[@]}")

# ---- control socket ---------------------------------------------------------

echo "a disk image, not a socket" >"$dir/image.raw"
cp "$dir/image.raw" "$dir/image.orig"
check "--control at a regular file: refused" \
	refused regular 1 "--control $dir/image.raw: exists and is not a socket" \
	--port 0 --control "$dir/image.raw"
check "... and the file is intact" cmp -s "$dir/image.raw" "$dir/image.orig"

rnbd_server_start "$dir/a.log" -- --port 0 --mem-device m:1M --control "$dir/ctl" || exit 1
check "--control at a live server's socket: refused" \
	refused live 1 "--control $dir/ctl: another server answers on this socket" \
	--port 0 --control "$dir/ctl"
check "... and that server still answers on it" \
	test "$(ctl "$dir/ctl" server list devices -o json)" = "[]"
check "the socket is the owner's only (0600)" test "$(stat -c %a "$dir/ctl")" = 600

# A client that sends and leaves at once: the answer meets a closed socket.
for _ in 1 2 3; do
	python3 - "$dir/ctl" <<'PY' || true # a failure shows in the check below
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc":"2.0","method":"server.sessions","id":1}')
s.close()
PY
done
check "a client leaving without reading does not kill the server" \
	test "$(ctl "$dir/ctl" server list devices -o json)" = "[]"

# Bad requests: a JSON-RPC error with the reason; the server goes on.
rpc() { # BYTES: the server's whole answer to them
	python3 - "$dir/ctl" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode("utf-8", "surrogateescape"))
s.shutdown(socket.SHUT_WR)
out = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode("utf-8", "replace"))
PY
}
# answer BYTES CODE TEXT: one answer, an error with CODE whose message has TEXT
answer() {
	python3 - "$(rpc "$1")" "$2" "$3" <<'PY'
import json, sys
a = json.loads(sys.argv[1])
assert a["jsonrpc"] == "2.0" and a["error"]["code"] == int(sys.argv[2]), a
assert sys.argv[3] in a["error"]["message"], a
PY
}
req() { printf '{"jsonrpc":"2.0","method":"%s","params":%s,"id":1}' "$1" "$2"; }
check "close without a device" answer "$(req server.close '{"session":"cli"}')" -32602 \
	'missing parameter "device"'
check "close with a number for a name" \
	answer "$(req server.close '{"session":1,"device":"d"}')" -32602 'must be a string'
check "close with an unknown parameter" \
	answer "$(req server.close '{"session":"a","device":"d","x":1}')" -32602 'unknown parameter'
check "list with a parameter" answer "$(req server.sessions '{"all":true}')" -32602 \
	'unknown parameter "all"'
check "an unknown device, named" \
	answer "$(req server.close '{"session":"s p","device":"q\"x"}')" 2 \
	'session s p has no device q"x open'
check "an unknown method" answer "$(req frobnicate '{}')" -32601 'no method "frobnicate"'
check "not JSON" answer 'list' -32700 'not JSON'
check "garbage bytes" answer $'\x01\x02{' -32700 'not JSON'
big_request() {
	python3 - "$dir/ctl" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
req = json.dumps({"jsonrpc": "2.0", "method": "server.close", "id": 1,
                  "params": {"session": "s" * (1 << 20), "device": "d"}}).encode()
try:
    s.sendall(req)  # the server may close before it has all: fine
except OSError:
    pass
out = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
a = json.loads(out)
assert a["error"]["code"] == -32600 and "1 MiB" in a["error"]["message"], a
PY
}
check "a request over 1 MiB: refused, the connection closed" big_request
# exits WANT CMD...: CMD's exit status is WANT (its stderr in $dir/cmd.err)
exits() {
	local want=$1 rc=0
	shift
	"$@" 2>"$dir/cmd.err" >/dev/null || rc=$?
	[ "$rc" -eq "$want" ] || { echo "  exit $rc: $(cat "$dir/cmd.err")"; return 1; }
}
check "the rnbd command: an unknown device, exit 1" \
	exits 1 ctl "$dir/ctl" server close cli nothing
check "... and its message names it" grep -q 'session cli has no device nothing open' "$dir/cmd.err"
check "the rnbd command: bad usage, exit 2" exits 2 ctl "$dir/ctl" server close cli
# A name with a newline (JSON "\n") cannot forge a log line of its own.
ctl "$dir/ctl" server close cli $'x\nrnbd-server error: forged' >/dev/null 2>&1 || true
check "a newline in a name: one log line, the newline shown as \\x0a" bash -c \
	"grep -q 'close cli x\\\\x0arnbd-server error: forged' '$dir/a.log' &&
	 ! grep -q '^rnbd-server error: forged' '$dir/a.log'"
check "the rnbd command: no daemon, exit 3" exits 3 ctl "$dir/nobody" server list
check "... and the server still answers" \
	test "$(ctl "$dir/ctl" server list devices -o json)" = "[]"

stop_server TERM
check "SIGTERM: exit 0" test "$stopped" -eq 0
check "SIGTERM: the socket is gone" test ! -e "$dir/ctl"

# A server killed with SIGKILL leaves its socket; the next one replaces it.
rnbd_server_start "$dir/b.log" -- --port 0 --mem-device m:1M --control "$dir/ctl" || exit 1
stop_server KILL
check "SIGKILL leaves the socket" test -S "$dir/ctl"
rnbd_server_start "$dir/c.log" -- --port 0 --mem-device m:1M --control "$dir/ctl" || exit 1
check "a stale socket is replaced" ctl_none "$dir/ctl"
stop_server INT
check "SIGINT: exit 0" test "$stopped" -eq 0
check "SIGINT: the socket is gone" test ! -e "$dir/ctl"

# ---- SIGHUP: the key file ------------------------------------------------------

umask 077
"$build/tools/rtrs-key" gen --hmac 1 >"$dir/host1.key"
echo "host1 $(cat "$dir/host1.key")" >"$dir/keys"
rnbd_server_start "$dir/hup.log" -- --port 0 --control "$dir/ctl" --auth-keys "$dir/keys" \
	--access "$dir/all.access" --mem-device m:1M || exit 1
hup_pid=${pids[-1]}
kill -HUP "$hup_pid" || true
check "SIGHUP with a good key file: logged as reloaded" \
	wait_until 10 grep -q "rnbd-server info: SIGHUP: key file $dir/keys reloaded: valid" "$dir/hup.log"
echo "host2 DHHC-1:01:not-a-key:" >>"$dir/keys"
kill -HUP "$hup_pid" || true
check "SIGHUP with a broken key file: its line and reason logged as an error" \
	wait_until 10 grep -q "rnbd-server error: SIGHUP: key file $dir/keys: " "$dir/hup.log"
check "... the line named by librtrs" grep -q "server: $dir/keys line 2: " "$dir/hup.log"
check "log lines carry their time" \
	grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ rnbd-server error: SIGHUP' "$dir/hup.log"
check "after both SIGHUPs the server still answers" ctl_none "$dir/ctl"
# auth SESSION: a client with host1's key gets the memory device's info.
auth() {
	"$client" info --server "127.0.0.1:$port" --session "$1" --device m --host-name host1 \
		--secret "@$dir/host1.key" >/dev/null 2>"$dir/auth-$1.err" ||
		{ echo "  $(cat "$dir/auth-$1.err")"; return 1; }
}
no_auth() { ! auth "$@" >/dev/null; }
check "... refuses a good key while the file is broken, as logged" no_auth hup1
echo "host1 $(cat "$dir/host1.key")" >"$dir/keys"
kill -HUP "$hup_pid" || true
reloads() { test "$(grep -c 'SIGHUP: key file .* reloaded: valid' "$dir/hup.log")" -eq "$1"; }
check "SIGHUP after the fix: reloaded" wait_until 10 reloads 2
check "... and the good key authenticates again" auth hup2
stop_server TERM
check "SIGTERM after SIGHUP: exit 0, socket gone" \
	bash -c "[ $stopped -eq 0 ] && [ ! -e '$dir/ctl' ]"

# ---- transport options: each one reaches librtrs ---------------------------------

# The key file from above, good again; a server name of its own.
srvname=nqn.2026-11.io.rnbd:opts-test
opts=(--addr 127.0.0.1 --provider tcp --queue-depth 40 --chunk-size 64k --hb-interval 100
      --auth-keys "$dir/keys" --access "$dir/all.access" --auth-name "$srvname" --mem-device m:4M)
creds=(--host-name host1 --secret "@$dir/host1.key" --server-name "$srvname")
rnbd_server_start "$dir/opts.log" -- --port 0 "${opts[@]}" || exit 1
check "--addr, --provider, --queue-depth, --chunk-size: librtrs listens with them" \
	grep -q "rtrs info: listening on 127.0.0.1:$port (tcp), queue depth 40, chunk 65536" \
	"$dir/opts.log"
# info_json SESSION ARGS...: rnbd-client info of m, its JSON in $dir/info-SESSION.json.
info_json() {
	"$client" info --server "127.0.0.1:$port" --session "$1" --device m --json "${@:2}" \
		>"$dir/info-$1.json" 2>"$dir/info-$1.err"
}
no_info() { ! info_json "$@"; }
sizes_seen() {
	info_json qd "${creds[@]}" || { cat "$dir/info-qd.err"; return 1; }
	python3 -c "import json; j = json.load(open('$dir/info-qd.json'))
assert j['queue_depth'] == 39 and 32768 < j['max_io'] <= 65536, j"
}
check "a client sees the queue depth (one slot kept for admin) and the chunk size" sizes_seen
check "--auth-keys: a client without a secret is refused" \
	no_info nokey --host-name host1 --server-name "$srvname"
check "--auth-name: the host's answer covers the server's name; another name is refused" \
	no_info othername --host-name host1 --secret "@$dir/host1.key"
check "... and the right name with the key is let in" info_json rightname "${creds[@]}"

# --no-invalidate: librtrs listens with always_invalidate off (its listening
# line says so, the default server's says on), and a client reads and
# writes through it. A client with a path to each of the two servers no
# longer meets the switch: its second path, new to the second server, does
# not carry first_conn (the kernel's rule) and that server, which does not
# know the session, refuses it (ENXIO); test-rnbd-srv restarts one server
# without always_invalidate on its port for the switch itself.
check "the default server invalidates" grep -q "always_invalidate on" "$dir/opts.log"
rnbd_server_start "$dir/opts2.log" -- --port 0 --no-invalidate "${opts[@]}" || exit 1
check "--no-invalidate: librtrs listens with always_invalidate off" \
	grep -q "rtrs info: listening on .*, always_invalidate off" "$dir/opts2.log"
check "--no-invalidate: a client gets its device's size through it" info_json noinval "${creds[@]}"

# --hb-interval 100: a client that stops answering (SIGSTOP) is taken down
# after 3 missed heartbeats, well before the default 1 s period would.
"$client" perf --server "127.0.0.1:$port" --session hbstop --device m --runtime 30 \
	--iodepth 4 "${creds[@]}" >/dev/null 2>"$dir/hbstop.err" &
pids+=($!)
perf_pid=$!
check "a perf client's session is up" wait_until 10 grep -q "rnbd: session hbstop up" "$dir/opts2.log"
kill -STOP "$perf_pid"
t0=$EPOCHREALTIME
wait_until 10 grep -q "rnbd: session hbstop down" "$dir/opts2.log" || true
took=$(python3 -c "print(int(($EPOCHREALTIME - $t0) * 1000))")
check "--hb-interval 100: a silent client's session goes within 2 s (took $took ms; the default: 3 s or more)" \
	test "$took" -lt 2000
kill -KILL "$perf_pid" 2>/dev/null || true
wait "$perf_pid" 2>/dev/null || true
unset 'pids[-1]'
stop_server
stop_server

# ---- block devices: O_DIRECT, the device's own write cache and FUA ---------------

if [ "$(id -u)" = 0 ] && command -v losetup >/dev/null; then
	truncate -s 16M "$dir/lo.img"
	loopdev=$(losetup -f --show "$dir/lo.img")
	trap 'kill_pids; losetup -d "$loopdev"; rm -rf "$dir"' EXIT
	q=/sys/block/${loopdev#/dev/}/queue
	mkdir "$dir/bdev"
	mknod "$dir/bdev/disk" b $((0x$(stat -c %t "$loopdev"))) $((0x$(stat -c %T "$loopdev")))
	# announced NAME WC FUA [ARGS]: the client is told write cache WC and FUA FUA (1/0).
	announced() {
		"$client" info --server "127.0.0.1:$port" --session "$1" --device disk --json \
			>"$dir/bd-$1.json" 2>"$dir/bd-$1.err" || { cat "$dir/bd-$1.err"; return 1; }
		python3 - "$dir/bd-$1.json" "$2" "$3" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
want = (sys.argv[2] == "1", sys.argv[3] == "1")
assert (j["write_cache"], j["fua"]) == want, (j["write_cache"], j["fua"], want)
PY
	}
	echo "write back" >"$q/write_cache"
	rnbd_server_start "$dir/bd.log" -- --port 0 -s "$dir/bdev" || exit 1
	check "a block device: a write cache, no FUA, as its queue says ($(cat "$q/write_cache"), fua $(cat "$q/fua"))" \
		announced bd1 1 "$(cat "$q/fua")"
	check "... opened with O_DIRECT, said in the log" grep -q \
		"bd1: opened disk (ro) as device 0, 16777216 bytes, block device, O_DIRECT, write cache, no FUA" \
		"$dir/bd.log"
	echo "write through" >"$q/write_cache"
	check "the device made write-through: announced without a write cache or FUA" \
		announced bd2 0 0
	head -c 1048576 /dev/urandom >"$dir/bd.pattern"
	bd_bytes() {
		"$client" write --server "127.0.0.1:$port" --session bd3 --device disk \
			--offset 1048576 --file "$dir/bd.pattern" 2>"$dir/bd3.err" >/dev/null &&
		"$client" read --server "127.0.0.1:$port" --session bd4 --device disk \
			--offset 1048576 --length 1048576 --file "$dir/bd.back" 2>>"$dir/bd3.err" \
			>/dev/null && cmp -s "$dir/bd.pattern" "$dir/bd.back" &&
		dd if="$loopdev" of="$dir/bd.direct" bs=1M skip=1 count=1 iflag=direct \
			status=none && cmp -s "$dir/bd.pattern" "$dir/bd.direct" ||
			{ cat "$dir/bd3.err"; return 1; }
	}
	check "1 MiB written through the server reads back, and is on the device (O_DIRECT read)" \
		bd_bytes
	stop_server
	echo "write back" >"$q/write_cache"
	rnbd_server_start "$dir/bdbuf.log" -- --port 0 -s "$dir/bdev" --buffered-bdev || exit 1
	check "--buffered-bdev: announced with a write cache and FUA (the page cache's)" \
		announced bd5 1 1
	check "... and not opened with O_DIRECT" grep -q \
		"bd5: opened disk (ro) as device 0, 16777216 bytes, block device, write cache, FUA" \
		"$dir/bdbuf.log"
	stop_server
	losetup -d "$loopdev"
	trap 'kill_pids; rm -rf "$dir"' EXIT
else
	echo "skip: block devices (needs root and losetup)"
fi

# ---- log level: RTRS_LOG_LEVEL, unless an option says otherwise -------------------

# levels NAME ENV ARGS...: a server started with RTRS_LOG_LEVEL=ENV and ARGS,
# stopped at once; its log in $dir/NAME.log.
levels() {
	local name=$1 env=$2
	shift 2
	rnbd_server_start "$dir/$name.log" env "RTRS_LOG_LEVEL=$env" -- --port 0 --mem-device m:1M \
		"$@" || return 1
	stop_server
}
levels env-error error
check "RTRS_LOG_LEVEL=error: no info lines" bash -c "! grep -q ' info: ' '$dir/env-error.log'"
levels env-debug debug
check "RTRS_LOG_LEVEL=debug: debug lines" grep -q 'rtrs debug: ' "$dir/env-debug.log"
levels cli-info error --log-level info
check "--log-level info wins over RTRS_LOG_LEVEL=error" grep -q 'rtrs info: ' "$dir/cli-info.log"
levels cli-quiet debug --quiet
check "--quiet wins over RTRS_LOG_LEVEL=debug" bash -c "! grep -Eq ' (info|debug): ' '$dir/cli-quiet.log'"
RTRS_LOG_LEVEL=loud check "a bad RTRS_LOG_LEVEL: refused" \
	refused env-bad 2 "RTRS_LOG_LEVEL=loud: expected error, warn, info or debug" --port 0
check "a bad --log-level: refused" \
	refused cli-bad 2 "--log-level 7: expected error, warn, info or debug" --port 0 --log-level 7

finish rnbd-server
