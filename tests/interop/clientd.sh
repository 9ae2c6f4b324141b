#!/usr/bin/env bash
# rnbd-clientd, the long-lived client, managed with the rnbd command
# (docs/management.md), on a host without ublk (this one):
#   - a map that asks for a block device (the default) fails, exit 1, saying
#     why none can be made here, and leaves nothing open on the server;
#   - two devices mapped without one (--no-block-device) over two paths of
#     one session, with the front ends' option names; client list -o json
#     shows both paths (addresses, states, counters) and both devices, each
#     saying it has no block device because none was asked for;
#   - client save writes the mappings; a restarted daemon maps them again
#     (once its socket is up), and only then sends READY=1 to NOTIFY_SOCKET;
#   - run-time changes (reconnect-params, path add and remove, policy) are
#     what client save writes, and what a restarted daemon restores; a
#     path add past 16 paths (the limit of a map) is refused;
#     resize and remap;
#   - unmapping the last device closes the session;
#   - metrics scraped over HTTP parse with Prometheus's parser;
#   - a map that outlasts --timeout: exit 4, saying it may still complete;
#   - bad input: an unknown option, device or session, a bad mode, garbage
#     and a request over 1 MiB on the socket, and bad input on every method
#     of both daemons (rpc-every-method.py): errors naming the object, exit
#     codes 1 and 2, the daemon unaffected; a mappings file that is not JSON
#     stops the daemon with the file named.
# Usage: clientd.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: clientd.sh BUILD_DIR}" && pwd)
rnbd=$build/tools/rnbd
clientd=$build/daemons/rnbd-clientd

for t in python3 curl; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done
[ -e /dev/ublk-control ] && echo "note: this kernel has ublk; the no-ublk checks below expect none"

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-clientd.XXXXXX)
trap 'kill_pids; umount "$dir/full" 2>/dev/null || true; rm -rf "$dir"' EXIT

rnbd_server_start "$dir/server.log" -- --port 0 --mem-device "mem0:$((16 << 20))" \
	--mem-device "mem1:$((8 << 20))" --control "$dir/sctl" || exit 1

daemon_start() { # LOG
	"$clientd" --control "$dir/cctl" --mappings "$dir/maps.json" --metrics 127.0.0.1:0 \
		--log-level info >"$1" 2>&1 &
	pids+=($!)
	daemon_pid=$!
	wait_until 10 grep -q 'rnbd-clientd ready' "$1" || { cat "$1"; echo "FAIL: no daemon"; exit 1; }
	mport=$(grep -o 'metrics on port [0-9]*' "$1" | grep -o '[0-9]*$')
}
c() { "$rnbd" --socket "$dir/cctl" client "$@"; }
fails() { # CODE TEXT CMD...: exits CODE with TEXT on stderr
	local want=$1 text=$2 rc=0
	shift 2
	"$@" >/dev/null 2>"$dir/err" || rc=$?
	[ "$rc" -eq "$want" ] && grep -qF -- "$text" "$dir/err" ||
		{ echo "  exit $rc: $(cat "$dir/err")"; return 1; }
}
daemon_start "$dir/d1.log"

check "a map asking for a block device where none can be made: exit 1, why" \
	fails 1 "device mem0 of session nob: no block device can be made here: /dev/ublk-control" \
	c map mem0 --session nob --server "127.0.0.1:$port"
check "... nothing is mapped" test "$(c list devices -o json)" = "[]"
check "... the server has nothing open" ctl_none "$dir/sctl"
check "map mem0 over two paths (the front ends' option names)" c map mem0 --session cd \
	--server "127.0.0.1:$port" --server "127.0.0.2:$port" --no-block-device \
	--policy round-robin --fast-io-fail-ms 5000 --reconnect-delay-ms 1000 \
	--reconnect-loss-timeout-ms 60000 --io-connections 2
check "map mem1 through the same session" c map mem1 --session cd --mode ro --no-block-device
c list -o json >"$dir/sessions.json"
c list devices -o json >"$dir/devices.json"
check "client list -o json: both paths, addresses, states, counters" \
	python3 - "$dir/sessions.json" "$port" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert len(s) == 1 and s[0]["name"] == "cd" and s[0]["paths_up"] == 2, s
names = [p["name"] for p in s[0]["paths"]]
assert names == ["cd/127.0.0.1:" + sys.argv[2], "cd/127.0.0.2:" + sys.argv[2]], names
assert all(p["state"] == "connected" and p["reads"] >= 1 and "writes" in p for p in s[0]["paths"]), s
PY
check "client list devices: both, their sizes and modes, no block device and why" \
	python3 - "$dir/devices.json" <<'PY'
import json, sys
d = {x["device"]: x for x in json.load(open(sys.argv[1]))}
assert d["mem0"]["bytes"] == 16 << 20 and d["mem0"]["mode"] == "rw", d
assert d["mem1"]["bytes"] == 8 << 20 and d["mem1"]["mode"] == "ro", d
for x in d.values():
    assert x["session"] == "cd" and x["state"] == "mapped" and x["block_device"] is None, x
    assert "none was asked for" in x["note"], x
PY
check "the server sees the session and both devices" \
	bash -c "'$rnbd' --socket '$dir/sctl' server list -o json | python3 -c '
import json, sys
s = [x for x in json.load(sys.stdin) if x[\"name\"] == \"cd\"]
assert len(s) == 1 and sorted(s[0][\"devices\"]) == [\"mem0\", \"mem1\"] and len(s[0][\"paths\"]) == 2, s'"

curl -sf "http://127.0.0.1:$mport/metrics" >"$dir/m.prom"
prom_py=
for py in /usr/bin/python3 python3; do
	"$py" -c 'import prometheus_client' 2>/dev/null && { prom_py=$py; break; }
done
if [ -n "$prom_py" ]; then
	check "metrics: parsed by prometheus_client, paths and devices labelled" \
		"$prom_py" - "$dir/m.prom" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families as parse
s = {}
for f in parse(open(sys.argv[1]).read()):
    for x in f.samples:
        s.setdefault(x.name, []).append((x.labels, x.value))
assert len(s["rnbd_client_path_up"]) == 2 and all(v == 1 for l, v in s["rnbd_client_path_up"]), s
sizes = {l["device"]: v for l, v in s["rnbd_client_device_size_bytes"]}
assert sizes == {"mem0": 16 << 20, "mem1": 8 << 20}, sizes
PY
else
	check "metrics: python3-prometheus-client is installed" false
fi

check "client save" c save
check "... the file holds both mappings, with the session's options in milliseconds" python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
assert sorted(x["device"] for x in m) == ["mem0", "mem1"] and all(len(x["server"]) == 2 for x in m), m
assert all(x["block_device"] is False for x in m), m
o = m[0]["options"]
assert o == {"policy": "round-robin", "fast_io_fail_ms": "5000", "reconnect_delay_ms": "1000",
             "reconnect_loss_timeout_ms": "60000", "io_connections": "2",
             "reconnect_jitter_ms": "500", "max_reconnect_attempts": "-1"}, o
' "$dir/maps.json"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
check "a stopped daemon unmapped everything: the server has nothing open" ctl_none "$dir/sctl"
# The mappings are restored once the socket is up: wait until there are N.
mapped_n() { [ "$(c list devices -o json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')" = "$1" ]; }
# Under systemd (Type=notify): READY=1 on NOTIFY_SOCKET once the mappings
# are restored. A listener takes it and at once asks what is mapped.
python3 - "$dir/notify" "$rnbd" "$dir/cctl" "$dir/ready.json" <<'PY' &
import json, os, socket, subprocess, sys
path, rnbd, ctl, out = sys.argv[1:5]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(30)
msgs = []
while True:
    m = s.recv(4096).decode()
    msgs.append(m)
    if "READY=1" in m.split("\n"):
        break
devs = json.loads(subprocess.run([rnbd, "--socket", ctl, "client", "list", "devices", "-o", "json"],
                                 capture_output=True, text=True).stdout)
json.dump({"messages": msgs, "devices": devs}, open(out, "w"))
PY
listener=$!
wait_until 10 test -S "$dir/notify" || true
NOTIFY_SOCKET=$dir/notify daemon_start "$dir/d2.log"
wait_until 10 mapped_n 2 || true
wait "$listener" || true
check "READY=1 on NOTIFY_SOCKET, once both mappings are restored" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert any("READY=1" in m and "STATUS=2 devices mapped" in m for m in r["messages"]), r["messages"]
d = sorted((x["device"], x["state"]) for x in r["devices"])
assert d == [("mem0", "mapped"), ("mem1", "mapped")], d
' "$dir/ready.json"
check "restarted: both mappings restored" bash -c "'$rnbd' --socket '$dir/cctl' client list \
	devices -o json | python3 -c '
import json, sys
d = sorted((x[\"device\"], x[\"mode\"], x[\"state\"]) for x in json.load(sys.stdin))
assert d == [(\"mem0\", \"rw\", \"mapped\"), (\"mem1\", \"ro\", \"mapped\")], d'"
check "... through one session with its two paths again" bash -c "'$rnbd' --socket '$dir/cctl' \
	client list -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert len(s) == 1 and s[0][\"name\"] == \"cd\" and s[0][\"paths_up\"] == 2, s'"

# Run-time changes (reconnect parameters, paths, policy) are what client save writes.
check "client reconnect-params: the values in force" bash -c "'$rnbd' --socket '$dir/cctl' \
	client reconnect-params cd -o json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r == {\"delay_ms\": 1000, \"jitter_ms\": 500, \"max_attempts\": -1,
             \"loss_timeout_ms\": 60000, \"fast_io_fail_ms\": 5000}, r'"
check "client reconnect-params: changed (the map's option names, milliseconds)" bash -c \
	"'$rnbd' --socket '$dir/cctl' client reconnect-params cd --reconnect-delay-ms 250 \
	--max-reconnect-attempts 7 --fast-io-fail-ms 9000 -o json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r == {\"delay_ms\": 250, \"jitter_ms\": 500, \"max_attempts\": 7,
             \"loss_timeout_ms\": 60000, \"fast_io_fail_ms\": 9000}, r'"
check "client path add 127.0.0.3" c path add cd "127.0.0.3:$port"
check "client path remove 0" c path remove cd 0
check "client policy min-latency" c policy cd min-latency
check "client list paths: path 0 removed, 1 and 2 connected" bash -c "'$rnbd' --socket \
	'$dir/cctl' client list paths | awk '\$2 == 0 { a = \$4 } \$2 == 2 { b = \$4 }
	END { exit !(a == \"removed\" && b == \"connected\") }'"
check "client resize mem0 8M: the size this client uses" bash -c "'$rnbd' --socket '$dir/cctl' \
	client resize mem0 8M -o json | python3 -c '
import json, sys
assert json.load(sys.stdin)[\"bytes\"] == 8 << 20'"
check "client remap of an open device: refused, named" fails 1 "device mem0 of session cd" \
	c remap mem0
check "client save after the changes" c save
check "... the file holds the paths and settings in force" python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
port = sys.argv[2]
for x in m:
    assert x["server"] == ["127.0.0.2:" + port, "127.0.0.3:" + port], x
    o = x["options"]
    assert (o["reconnect_delay_ms"], o["max_reconnect_attempts"], o["fast_io_fail_ms"],
            o["policy"], o["io_connections"]) == ("250", "7", "9000", "min-latency", "2"), o
' "$dir/maps.json" "$port"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
daemon_start "$dir/d2b.log"
wait_until 10 mapped_n 2 || true
check "restarted: the session as it was left (paths, policy, reconnect parameters)" bash -c \
	"'$rnbd' --socket '$dir/cctl' client list -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]
names = [p[\"name\"] for p in s[\"paths\"]]
assert names == [\"cd/127.0.0.2:$port\", \"cd/127.0.0.3:$port\"] and s[\"paths_up\"] == 2, s
assert s[\"policy\"] == \"min-latency\" and s[\"reconnect\"][\"delay_ms\"] == 250, s
assert s[\"reconnect\"][\"max_attempts\"] == 7, s'"

# Bad input: exit 1 naming the object, exit 2 for usage; the daemon goes on.
map_call() { # PARAMS-JSON: client.map by hand (what the command line checks itself)
	"$rnbd" --socket "$dir/cctl" call client.map "$1"
}
check "an unknown session option (the daemon's check)" fails 1 "unknown option colour" \
	map_call "{\"device\": \"mem0\", \"session\": \"other\", \"block_device\": false,
	\"server\": [\"127.0.0.1:$port\"], \"options\": {\"colour\": \"blue\"}}"
check "a bad option value (the daemon's check)" fails 1 \
	"option policy=fastest: expected round-robin, min-inflight or min-latency" \
	map_call "{\"device\": \"mem0\", \"session\": \"other\", \"block_device\": false,
	\"server\": [\"127.0.0.1:$port\"], \"options\": {\"policy\": \"fastest\"}}"
check "... the command line's: exit 2, the same reason" fails 2 \
	"rnbd: --policy fastest: expected round-robin, min-inflight or min-latency" \
	c map mem0 --session other --server "127.0.0.1:$port" --policy fastest
check "a device the server does not have" fails 1 "device nothing of session other" \
	c map nothing --session other --server "127.0.0.1:$port" --no-block-device
connreqs() {
	ctl "$dir/sctl" server stats -o json |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["connection_requests"])'
}
before=$(connreqs)
check "a name that leads out (../etc/passwd): refused with the reason" fails 1 \
	'device ../etc/passwd: "." or ".." in device name' \
	c map ../etc/passwd --session esc --server "127.0.0.1:$port" --no-block-device
check "... before any session was opened for it" test "$(connreqs)" = "$before"
check "a server that does not resolve: said so" fails 1 \
	"session dns: cannot resolve nosuch.invalid: Name or service not known" \
	c map mem0 --session dns --server nosuch.invalid --no-block-device
check "a key file that is not there: named" fails 1 \
	"session key: host secret file $dir/nokey: cannot open the key file: No such file or directory" \
	c map mem0 --session key --server "127.0.0.1:$port" --secret "@$dir/nokey" --no-block-device
check "a bad mode" fails 1 "mode rx: expected rw, ro or migration" \
	c map mem0 --session cd --mode rx
check "a new session without a server" fails 1 'missing parameter "server"' \
	c map mem0 --session newone --no-block-device
check "the same session, other servers" fails 1 "session cd is open already" \
	c map mem0 --session cd --server 127.0.0.9 --no-block-device
check "unmap of a device not mapped" fails 1 "device nothing is not mapped" c unmap nothing
check "map without --session: exit 2" fails 2 "client map DEVICE --session" c map mem0
check "--option: exit 2, the flags to use instead" fails 2 \
	"--option is gone: each option has a flag of its own (--fast-io-fail-ms" \
	c map mem0 --session x --server 127.0.0.1 --option policy=round-robin
check "nvme-cli's --ctrl-loss-tmo (seconds): exit 2, renamed" fails 2 \
	"--ctrl-loss-tmo is now --reconnect-loss-timeout-ms (milliseconds; it took seconds)" \
	c map mem0 --session x --server 127.0.0.1 --ctrl-loss-tmo 60
check "a bad --reconnect-loss-timeout-ms: exit 2" fails 2 \
	"--reconnect-loss-timeout-ms soon: expected a number in 0..86400000" \
	c map mem0 --session x --server 127.0.0.1 --reconnect-loss-timeout-ms soon
check "reconnect-params: --reconnect-delay (it took seconds) is refused, exit 2" fails 2 \
	"--reconnect-delay is now --reconnect-delay-ms" c reconnect-params cd --reconnect-delay 1
check "reconnect-params: a bad --reconnect-delay-ms, exit 2" fails 2 \
	"--reconnect-delay-ms 1.5: expected a number in 0..3600000" \
	c reconnect-params cd --reconnect-delay-ms 1.5
check "reconnect-params: attempts below -1, exit 2" fails 2 \
	"--max-reconnect-attempts -2: expected -1 (no limit) or a number in 0..1000000" \
	c reconnect-params cd --max-reconnect-attempts -2
check "reconnect-params: a map-only flag, exit 2" fails 2 "--io-connections: for client map only" \
	c reconnect-params cd --io-connections 4
check "reconnect-params: an unknown session, exit 1" fails 1 "no session nope" \
	c reconnect-params nope --reconnect-delay-ms 1000
check "resize: a size that is not one, exit 2" fails 2 "SIZE: bytes, or with K, M, G or T" \
	c resize mem0 lots
# A server that takes the connection and never answers (never accepted):
# the map waits for the connect timeout (10 s), longer than --timeout.
python3 -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True); time.sleep(300)' >"$dir/hole.port" &
pids+=($!)
wait_until 10 test -s "$dir/hole.port" || true
check "no answer within --timeout to a map sent: exit 4, it may still complete" fails 4 \
	"rnbd: client.map: the daemon did not answer within 500 ms; the request may still complete: check \`rnbd client list devices\`" \
	c map mem0 --session hole --server "127.0.0.1:$(cat "$dir/hole.port")" --no-block-device \
	--timeout 500
check "the default --timeout is longer than such a map (60 s)" \
	bash -c "'$rnbd' --help | grep -q -- '--timeout MS .*(default 60000)'"
check "bad input on every method (rnbd-clientd): JSON-RPC errors naming the cause" \
	python3 "$(dirname "$0")/rpc-every-method.py" "$dir/cctl"
check "bad input on every method (rnbd-server)" \
	python3 "$(dirname "$0")/rpc-every-method.py" "$dir/sctl"
check "garbage on the socket: a parse error" bash -c "printf '\\x01{' | python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.stdin.buffer.read())
s.shutdown(socket.SHUT_WR); a = s.recv(4096)
assert b\"-32700\" in a, a' '$dir/cctl'"
check "a request over 1 MiB: refused" python3 - "$dir/cctl" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
try:
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "client.map",
                          "params": {"device": "d" * (1 << 20), "session": "s"}}).encode())
except OSError:
    pass
out = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    out += b
assert json.loads(out)["error"]["code"] == -32600, out
PY
check "the daemon is unaffected" bash -c "'$rnbd' --socket '$dir/cctl' client list devices -o json \
	| python3 -c 'import json, sys; assert len(json.load(sys.stdin)) == 2'"

check "unmap mem0" c unmap mem0
check "unmap mem1 (the last): the session closes" c unmap mem1 --session cd
check "... no session left" test "$(c list -o json)" = "[]"
check "... the server has nothing open" ctl_none "$dir/sctl"

# A session has at most 16 paths (not removed), the limit of client.map and
# of the mappings file: client.path.add refuses a 17th, so that what
# client.save writes can be mapped again.
check "a session of 16 paths: mapped over one, 15 added" bash -c "
	'$rnbd' --socket '$dir/cctl' client map mem0 --session many --server 127.0.0.1:$port \
		--no-block-device >/dev/null &&
	for i in \$(seq 2 16); do
		'$rnbd' --socket '$dir/cctl' client path add many 127.0.0.\$i:$port >/dev/null || exit 1
	done"
check "... a 17th path: refused, exit 1, the limit named" fails 1 \
	"session many: at most 16 paths (not removed) per session" \
	c path add many "127.0.0.17:$port"
check "... one removed, a path may be added again" bash -c "
	'$rnbd' --socket '$dir/cctl' client path remove many 15 >/dev/null &&
	'$rnbd' --socket '$dir/cctl' client path add many 127.0.0.17:$port >/dev/null"
check "... saved" c save
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
daemon_start "$dir/d6.log"
wait_until 20 mapped_n 1 || true
check "restarted: the session of 16 paths mapped again" bash -c "'$rnbd' --socket '$dir/cctl' \
	client list -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert len(s) == 1 and s[0][\"name\"] == \"many\" and s[0][\"paths_up\"] == 16, s'"
check "... unmapped" c unmap mem0 --session many

# A map through an open session with the servers and options it was opened
# with is taken, before a restart and after it (the session then comes
# from the saved mapping, which writes out the port and every default).
s1=(--session s1 --server "127.0.0.1:$port" --io-connections 1 --no-block-device)
check "the same map command twice through one session: both taken" bash -c \
	"'$rnbd' --socket '$dir/cctl' client map mem0 ${s1[*]} >/dev/null &&
	'$rnbd' --socket '$dir/cctl' client map mem1 ${s1[*]} >/dev/null"
check "... mem1 unmapped, saved" bash -c "'$rnbd' --socket '$dir/cctl' client unmap mem1 \
	>/dev/null && '$rnbd' --socket '$dir/cctl' client save >/dev/null"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
daemon_start "$dir/d7.log"
wait_until 20 mapped_n 1 || true
check "restarted: other options through the restored session are refused" fails 1 \
	"session s1 is open already with other servers or options" \
	c map mem1 --session s1 --server "127.0.0.1:$port" --io-connections 2 --no-block-device
check "... the same command as before the restart is taken" c map mem1 "${s1[@]}"
check "... both unmapped" bash -c "'$rnbd' --socket '$dir/cctl' client unmap mem0 >/dev/null &&
	'$rnbd' --socket '$dir/cctl' client unmap mem1 >/dev/null"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true

# A mapping that fails at start (its server is not there yet) is kept by a
# save: the file says what should be mapped, and lost it at the next save.
printf '[{"device": "mem1", "session": "later", "server": ["127.0.0.1:1"],\n  "block_device": false},\n {"device": "mem0", "session": "now", "server": ["127.0.0.1:%s"], "block_device": false}]\n' \
	"$port" >"$dir/maps.json"
daemon_start "$dir/d5.log"
wait_until 30 grep -q "mapping 1: .*client.save keeps it in the file" "$dir/d5.log" || true
wait_until 10 mapped_n 1 || true
check "a mapping whose server is down: kept through a save" bash -c "'$rnbd' --socket \
	'$dir/cctl' client save >/dev/null && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
assert sorted((x[\"session\"], x[\"device\"]) for x in m) == [(\"later\", \"mem1\"), (\"now\", \"mem0\")], m
' '$dir/maps.json'"
# A link planted where the temporary file goes is removed, not written through.
echo keep >"$dir/victim"
ln -s "$dir/victim" "$dir/maps.json.new"
check "client save with a link planted at its temporary file" c save
check "... the link's target untouched" grep -qx keep "$dir/victim"
check "... the mappings file is a file of its own" bash -c "[ -f '$dir/maps.json' ] && \
	[ ! -L '$dir/maps.json' ] && [ ! -e '$dir/maps.json.new' ]"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true

# A save while the file's mappings are still being made keeps them: a server
# that takes the connection and never answers holds one mapping's map (the
# save wrote [] while it hung); an unmap forgets the file's mapping of its
# device, even when the file spelled its name otherwise ("/mem0//").
python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
held = []
while True:
    held.append(s.accept()[0])
' >"$dir/mute.port" &
pids+=($!)
mute_pid=$!
wait_until 10 test -s "$dir/mute.port" || true
mport_mute=$(cat "$dir/mute.port")
printf '[{"device": "mem1", "session": "mute", "server": ["127.0.0.1:%s"],\n  "block_device": false},\n {"device": "/mem0//", "session": "now", "server": ["127.0.0.1:%s"], "block_device": false}]\n' \
	"$mport_mute" "$port" >"$dir/maps.json"
daemon_start "$dir/d8.log"
wait_until 10 mapped_n 1 || true
check "a save while a mapping of the file is still being made: both kept" bash -c "'$rnbd' \
	--socket '$dir/cctl' client save >/dev/null && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
assert sorted((x[\"session\"], x[\"device\"]) for x in m) == [(\"mute\", \"mem1\"), (\"now\", \"mem0\")], m
' '$dir/maps.json'"
check "... mem0 unmapped (by its one name) and saved: the file's mapping of it is gone" bash -c \
	"'$rnbd' --socket '$dir/cctl' client unmap mem0 --session now >/dev/null &&
	'$rnbd' --socket '$dir/cctl' client save >/dev/null && python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
assert [(x[\"session\"], x[\"device\"]) for x in m] == [(\"mute\", \"mem1\")], m
' '$dir/maps.json'"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
kill "$mute_pid" 2>/dev/null || true

# A write that fails says why: the mappings file on a full file system (a
# tmpfs of 64 KiB, filled up).
if [ "$(id -u)" -eq 0 ]; then
	mkdir "$dir/full"
	mount -t tmpfs -o size=64k rnbd-test "$dir/full"
	cp "$dir/maps.json" "$dir/full/maps.json"
	"$clientd" --control "$dir/cctl" --mappings "$dir/full/maps.json" --log-level info \
		>"$dir/dfull.log" 2>&1 &
	pids+=($!)
	daemon_pid=$!
	wait_until 30 grep -q 'rnbd-clientd ready' "$dir/dfull.log" ||
		{ echo "  the daemon did not start:"; sed 's/^/    /' "$dir/dfull.log"; }
	cp "$dir/full/maps.json" "$dir/maps.before"
	dd if=/dev/zero of="$dir/full/fill" bs=4k 2>/dev/null || true
	f0=$fails
	check "client save on a full disk: ENOSPC said, not EIO" fails 1 \
		"saving the mappings to $dir/full/maps.json: No space left on device" c save
	[ "$fails" -eq "$f0" ] ||
		{ echo "  its log:"; sed 's/^/    /' "$dir/dfull.log"; }
	check "... the file as it was" cmp -s "$dir/full/maps.json" "$dir/maps.before"
	kill "$daemon_pid"
	wait "$daemon_pid" 2>/dev/null || true
	umount "$dir/full"
else
	echo "not root: the full-disk check needs a tmpfs mount; left out"
fi

echo '[{"device": "mem0",' >"$dir/bad.json"
rc=0
"$clientd" --control "$dir/cctl2" --mappings "$dir/bad.json" >"$dir/d3.log" 2>&1 || rc=$?
check "a mappings file that is not JSON stops the daemon, naming the file" \
	bash -c "[ $rc -eq 1 ] && grep -q -- '--mappings $dir/bad.json' '$dir/d3.log'"
check "... and no socket is left" test ! -e "$dir/cctl2"
# bad_maps NAME REASON: the daemon stops, exit 1, naming the file and the reason
# (one that takes the file and runs is stopped: exit 124).
bad_maps() {
	local rc=0
	timeout 10 "$clientd" --control "$dir/cctl2" --mappings "$dir/$1" >"$dir/d4.log" 2>&1 || rc=$?
	[ "$rc" -eq 1 ] && grep -qF -- "--mappings $dir/$1: $2" "$dir/d4.log" && [ ! -e "$dir/cctl2" ] ||
		{ echo "  exit $rc: $(cat "$dir/d4.log")"; return 1; }
}
check "... the line and json-c's reason, not its state word" \
	bad_maps bad.json "line 2: not JSON: it ends too early"
: >"$dir/empty.json"
check "an empty mappings file: said so" bad_maps empty.json 'is empty: a mappings file is a JSON array'
printf '{"device": "mem0", "session": "a", "server": ["127.0.0.1:1"]}\n' >"$dir/object.json"
check "a mapping, not an array of them: said so" bad_maps object.json 'not a JSON array of mappings'
echo null >"$dir/null.json"
check "null: said so" bad_maps null.json 'not a JSON array of mappings'
mkdir "$dir/dir.json"
check "a directory: said so" bad_maps dir.json "is a directory, not a file"
printf '[\n {"device": "mem0",\n  "session" 1}\n]\n' >"$dir/line3.json"
check "an error on line 3: that line" bad_maps line3.json "line 3: not JSON: "
# Parsed as strictly as a request: what json-c takes by default is refused,
# with its line.
printf '[\n {"device": "mem0", "session": "a", "server": ["127.0.0.1:1"],\n  "mode": "ro", "mode": "rw"}\n]\n' \
	>"$dir/dupkey.json"
check "a member given twice (json-c keeps the last): refused, its entry's line" bad_maps \
	dupkey.json 'line 2: mapping 1: a member name given twice in one object'
printf '[\n {"device": "mem0", "session": "a", "server": ["127.0.0.1:1"]},\n]\n' >"$dir/comma.json"
check "a trailing comma: refused, its line" bad_maps comma.json 'line 3: not JSON: '
printf '[\n // the disks\n {"device": "mem0", "session": "a", "server": ["127.0.0.1:1"]}\n]\n' \
	>"$dir/comment.json"
check "a comment: refused, its line" bad_maps comment.json 'line 2: not JSON: '
printf "[{'device': 'mem0', 'session': 'a', 'server': ['127.0.0.1:1']}]\n" >"$dir/quote.json"
check "single quotes: refused" bad_maps quote.json 'line 1: not JSON: '
printf '[{"device": "mem0", "session": "a", "server": ["127.0.0.1:1"],\n  "options": {"io_connections": 01}}]\n' \
	>"$dir/zero.json"
check "a number with a leading zero: refused, its line" bad_maps zero.json 'line 2: not JSON: '
mkfifo "$dir/fifo.json"
check "a FIFO: refused at once, not waited on" timeout 5 bash -c "$(declare -f bad_maps); \
	clientd='$clientd' dir='$dir' bad_maps fifo.json 'is not a regular file'"
# Every entry is checked before anything is mapped: one that client.map
# would refuse stops the daemon with its line (it mapped the others and
# left it, said by its index only).
printf '[\n {"device": "mem0", "session": "a", "server": ["127.0.0.1:1"]},\n\n {"device": "mem0",\n  "session": "b", "server": ["127.0.0.1:1"], "mode": "rwx"}\n]\n' \
	>"$dir/mode.json"
check "an entry with an unknown mode: its line and the cause" bad_maps mode.json \
	'line 4: mapping 2: mode rwx: expected rw, ro or migration'
printf '[{"device": "mem0", "session": "a", "server": ["127.0.0.1:1"]}, "x"]\n' >"$dir/str.json"
check "an entry that is not an object: said so" bad_maps str.json 'line 1: mapping 2: not an object'
printf '[{"device": "../etc/passwd", "session": "a", "server": ["127.0.0.1:1"]}]\n' >"$dir/name.json"
check "an entry with a device name leading out: said so" bad_maps name.json \
	'line 1: mapping 1: device ../etc/passwd: '
printf '[{"device": "mem0", "session": "a", "server": ["127.0.0.1:1"], "colour": 1}]\n' \
	>"$dir/member.json"
check "an entry with an unknown member: said so" bad_maps member.json \
	'line 1: mapping 1: unknown parameter "colour"'
printf '[{"device": "mem0", "session": "a", "server": []}]\n' >"$dir/noserver.json"
check "an entry without a server: said so" bad_maps noserver.json \
	'line 1: mapping 1: server: at least one path is needed'

finish clientd
