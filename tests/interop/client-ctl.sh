#!/usr/bin/env bash
# A client process managed at run time (docs/management.md): nbdkit with
# the rnbd plugin and control=, two paths to rnbd-server at 127.0.0.1, from
# 127.0.0.2 and 127.0.0.3 (README's demo), the rnbd command on its socket,
# while a loop writes random data through NBD and reads it back (nbdcopy
# both ways, cmp):
#   - client list -o json: the session, both paths with their addresses,
#     states and counters; client list devices: the export while it is used;
#   - path remove, path add, path disconnect and reconnect, each under that
#     IO: the loop sees no error, and every round's data reads back equal;
#   - a policy switch to round-robin shows in the per-path counters: both
#     paths carry writes afterwards;
#   - metrics over HTTP (client and server) and through rnbd client metrics,
#     parsed by Prometheus's parser, the path and device counters rising;
#     no two series share their labels, before and after a path is removed
#     and added again, and the server's path labels stay as they were across
#     the re-add and a reconnect;
#   - bad requests: an unknown session or path, a bad policy, a bad address:
#     exit 1 with the object named; the plugin goes on;
#   - the server force-closes the export while an NBD client (qemu-io)
#     holds it: the NBD read fails with EIO (not EINVAL), and client list
#     devices shows it "closed" (not "mapped"), its metric 0; a new
#     connection meanwhile (naming it /mem0) opens it again and reads.
# Usage: client-ctl.sh BUILD_DIR. Exits 77 when a tool is missing.
set -euo pipefail
build=$(cd "${1:?usage: client-ctl.sh BUILD_DIR}" && pwd)
plugin=$build/nbdkit/nbdkit-rnbd-plugin.so
rnbd=$build/tools/rnbd

for t in nbdkit nbdcopy python3 curl; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/nbdkit-sanitizer.sh" # skips a sanitizer build
dir=$(mktemp -d /var/tmp/rnbd-cctl.XXXXXX)
cleanup() {
	touch "$dir/stop"
	[ -e "$dir/nbdkit.pid" ] && kill "$(cat "$dir/nbdkit.pid")" 2>/dev/null || true
	kill_pids
	rm -rf "$dir"
}
trap cleanup EXIT

size=$((16 << 20))
# Prometheus's parser is Debian's python3-prometheus-client (Debian's python3).
prom_py=
for py in /usr/bin/python3 python3; do
	"$py" -c 'import prometheus_client' 2>/dev/null && { prom_py=$py; break; }
done
[ -n "$prom_py" ] || { echo "SKIP: python3-prometheus-client is not installed"; exit 77; }
rnbd_server_start "$dir/server.log" -- --port 0 --mem-device "mem0:$size" \
	--control "$dir/sctl" --metrics 127.0.0.1:0 || exit 1
smport=$(grep -o 'metrics on port [0-9]*' "$dir/server.log" | grep -o '[0-9]*$')
# A free port for the plugin's metrics (it prints none: it forks).
cmport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
nbdkit -P "$dir/nbdkit.pid" -U "$dir/nbd.sock" "$plugin" server="127.0.0.2@127.0.0.1:$port" \
	server="127.0.0.3@127.0.0.1:$port" session=cc device=mem0 control="$dir/cctl" \
	metrics="127.0.0.1:$cmport" reconnect_delay_ms=200 2>"$dir/nbdkit.log" ||
	{ cat "$dir/nbdkit.log"; exit 1; }
# The background process opens the session and the socket after nbdkit forked.
wait_until 10 test -S "$dir/cctl" || { cat "$dir/nbdkit.log"; echo "FAIL: no control socket"; exit 1; }
uri="nbd+unix:///mem0?socket=$dir/nbd.sock"
c() { "$rnbd" --socket "$dir/cctl" client "$@"; }

c list -o json >"$dir/list0.json"
check "client list -o json: one session, two paths connected, counters" \
	python3 - "$dir/list0.json" "$port" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert len(s) == 1 and s[0]["name"] == "cc" and s[0]["server"] == "rnbd", s
p = s[0]["paths"]
assert [x["index"] for x in p] == [0, 1], p
assert all(x["name"] == "cc/127.0.0.1:" + sys.argv[2] for x in p), p
assert [x["src"] for x in p] == ["127.0.0.2", "127.0.0.3"], p
assert all(x["state"] == "connected" and "writes" in x and "read_bytes" in x for x in p), p
assert s[0]["paths_up"] == 2 and s[0]["queue_depth"] > 0, s
PY

# The IO loop: random data written whole and read back, until told to stop.
io_loop() {
	local n=0 bad=0
	while [ ! -e "$dir/stop" ]; do
		head -c "$size" /dev/urandom >"$dir/w.bin"
		if nbdcopy "$dir/w.bin" "$uri" 2>>"$dir/io.err" &&
			nbdcopy "$uri" "$dir/r.bin" 2>>"$dir/io.err" &&
			cmp -s "$dir/w.bin" "$dir/r.bin"; then
			n=$((n + 1))
		else
			bad=$((bad + 1))
		fi
		echo "$n $bad" >"$dir/io.count.new"
		mv "$dir/io.count.new" "$dir/io.count"
	done
}
io_loop &
io_pid=$!
pids+=($io_pid)
rounds() { local n=0; [ -e "$dir/io.count" ] && read -r n _ <"$dir/io.count"; echo "$n"; }
rounds_at_least() { [ "$(rounds)" -ge "$1" ]; }
# more_rounds N: N more rounds complete from now (30 s at most)
more_rounds() { wait_until 30 rounds_at_least $(($(rounds) + $1)); }
check "IO runs" more_rounds 1
# The export is mapped while an NBD connection uses it (each nbdcopy opens one).
export_listed() {
	c list devices -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if any(x["device"] == "mem0" and x["session"] == "cc" and x["bytes"] == int(sys.argv[1])
                  and x["state"] == "mapped" and x["mode"] == "rw" for x in d) else 1)' "$size"
}
check "client list devices: the export, mapped, while IO uses it" wait_until 10 export_listed

# Metrics: scraped twice over HTTP while IO runs, parsed by Prometheus's own
# parser; the counters rose, with session, path and device labels.
scrape() { # NAME: both endpoints into $dir/NAME-{clt,srv}.prom, and rnbd client metrics
	curl -sf "http://127.0.0.1:$cmport/metrics" >"$dir/$1-clt.prom" &&
		curl -sf "http://127.0.0.1:$smport/metrics" >"$dir/$1-srv.prom" &&
		c metrics >"$dir/$1-cmd.prom"
}
# series_unique NAME: no two series of the scrape NAME share their labels
# (the check of docs/management.md: every line but comments, less its value).
series_unique() {
	local f d
	for f in "$dir/$1"-{clt,srv,cmd}.prom; do
		d=$(grep -v '^#' "$f" | sed 's/ [^ ]*$//' | sort | uniq -d)
		[ -z "$d" ] || { echo "  duplicate series in $(basename "$f"):"; echo "$d" | head -5; return 1; }
	done
}
# path_series NAME CLIENT_PATHS: the client's path series are the paths
# CLIENT_PATHS ("0:127.0.0.2 1:127.0.0.3", index:source, all to 127.0.0.1),
# and the server's are its two paths, by address (127.0.0.2@127.0.0.1 and
# 127.0.0.3@127.0.0.1), however often they reconnected.
path_series() {
	"$prom_py" - "$dir" "$1" "$port" "$2" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families as parse
d, name, port, want = sys.argv[1:5]
def labels(kind, metric):
    return [s.labels for f in parse(open(f"{d}/{name}-{kind}.prom").read())
            for s in f.samples if s.name == metric]
clt = sorted((l["session"], l["path"], l["src"], l["dst"])
             for l in labels("clt", "rnbd_client_path_up"))
exp = sorted(("cc", w.split(":")[0], w.split(":")[1], "127.0.0.1:" + port) for w in want.split())
assert clt == exp, (clt, exp)
srv = sorted((l["session"], l["path"]) for l in labels("srv", "rnbd_server_path_up"))
assert srv == [("cc", "127.0.0.2@127.0.0.1"), ("cc", "127.0.0.3@127.0.0.1")], srv
PY
}
check "metrics scraped (client, server, rnbd client metrics)" scrape m1
check "... no two series share their labels" series_unique m1
check "... a series per path: index, source and destination; the server's by address" \
	path_series m1 "0:127.0.0.2 1:127.0.0.3"
check "... IO goes on" more_rounds 2
check "metrics scraped again" scrape m2
check "... no two series share their labels" series_unique m2
check "the metrics parse (prometheus_client) and the counters rose" "$prom_py" - "$dir" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families as parse

def load(name):
    out = {}
    for fam in parse(open(sys.argv[1] + "/" + name).read()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out

c1, c2 = load("m1-clt.prom"), load("m2-clt.prom")
s1, s2 = load("m1-srv.prom"), load("m2-srv.prom")
cmd = load("m1-cmd.prom")
# Devices come and go with the NBD connections; the rest is always there.
steady = lambda m: {n for n in m if not n.startswith("rnbd_client_device_")}
assert steady(cmd) == steady(c1) and len(steady(c1)) >= 13, (steady(cmd) ^ steady(c1))
w = "rnbd_client_path_writes_total"
assert sorted((l["session"], l["path"], l["src"]) for l, v in c2[w]) == \
    [("cc", "0", "127.0.0.2"), ("cc", "1", "127.0.0.3")], c2[w]
assert sum(v for l, v in c2[w]) > sum(v for l, v in c1[w]), (c1[w], c2[w])
assert all(v == 1 for l, v in c2["rnbd_client_path_up"]), c2["rnbd_client_path_up"]
assert c2["rnbd_client_session_paths_up"] == [({"session": "cc"}, 2.0)], c2["rnbd_client_session_paths_up"]
sw = "rnbd_server_path_writes_total"
assert sum(v for l, v in s2[sw]) > sum(v for l, v in s1[sw]), (s1[sw], s2[sw])
assert all(l["session"] == "cc" for l, v in s2[sw]), s2[sw]
assert s2["rnbd_server_sessions"][0][1] == 1, s2["rnbd_server_sessions"]
assert s2["rnbd_server_connection_requests_total"][0][1] >= 4
PY
# The devices' metrics exist while the export is open (each round opens it).
device_metrics() {
	curl -sf "http://127.0.0.1:$smport/metrics" >"$dir/dev-srv.prom" &&
		curl -sf "http://127.0.0.1:$cmport/metrics" >"$dir/dev-clt.prom" &&
		"$prom_py" - "$dir" "$size" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families as parse
def samples(name):
    return [(s.name, s.labels, s.value) for f in parse(open(sys.argv[1] + "/" + name).read())
            for s in f.samples]
srv = samples("dev-srv.prom")
clt = samples("dev-clt.prom")
# Each NBD connection opens the device again (its server counters start at 0).
ok = any(n == "rnbd_server_device_write_bytes_total" and l == {"session": "cc", "device": "mem0"}
         and v >= 0 for n, l, v in srv)
ok = ok and any(n == "rnbd_client_device_size_bytes" and l == {"session": "cc", "device": "mem0"}
                and v == int(sys.argv[2]) for n, l, v in clt)
sys.exit(0 if ok else 1)
PY
}
check "device metrics while the export is open: the server's counters, the client's size" \
	wait_until 30 device_metrics
check "a path other than /metrics: 404" test "$(curl -s -o /dev/null -w '%{http_code}' \
	"http://127.0.0.1:$smport/")" = 404

# path_field INDEX FIELD: a field of that path now
path_field() {
	c list -o json | python3 -c '
import json, sys
p = [x for x in json.load(sys.stdin)[0]["paths"] if x["index"] == int(sys.argv[1])]
print(p[0][sys.argv[2]] if p else "")' "$1" "$2"
}
path_is() { test "$(path_field "$1" state)" = "$2"; }

check "path remove 1" c path remove cc 1
check "... path 1 is closed" wait_until 10 path_is 1 closed
check "... IO goes on" more_rounds 2
removed_gone() { scrape m3 && series_unique m3 && ! grep -q 'path="1"' "$dir/m3-clt.prom"; }
check "... metrics: the removed path has no series, none is doubled" removed_gone
check "path add 127.0.0.3@127.0.0.1 again: index 2" bash -c "'$rnbd' --socket '$dir/cctl' client \
	path add cc 127.0.0.3@127.0.0.1:$port | grep -Eq '^index +2$'"
check "... path 2 is connected" wait_until 10 path_is 2 connected
scrape_paths() { scrape "$1" && series_unique "$1" >/dev/null && path_series "$1" "$2" >/dev/null 2>&1; }
check "... metrics: paths 0 and 2 (from 127.0.0.3 again), no series doubled; the server's labels as before" \
	wait_until 10 scrape_paths m4 "0:127.0.0.2 2:127.0.0.3"
check "policy round-robin" c policy cc round-robin
check "... IO goes on" more_rounds 1
w0=$(path_field 0 writes) w2=$(path_field 2 writes)
check "... both paths carry writes after the switch" more_rounds 2
d0=$(($(path_field 0 writes) - w0)) d2=$(($(path_field 2 writes) - w2))
check "... the counters show it (path 0 +$d0, path 2 +$d2)" \
	test "$d0" -gt 0 -a "$d2" -gt 0 -a $((d0 * 3)) -gt "$d2" -a $((d2 * 3)) -gt "$d0"
check "path disconnect 0" c path disconnect cc 0
check "... path 0 is closed" wait_until 10 path_is 0 closed
check "... IO goes on" more_rounds 2
check "path reconnect 0" c path reconnect cc 0
check "... path 0 is connected again" wait_until 10 path_is 0 connected
check "... metrics: the same series after the reconnect, on both sides" \
	wait_until 10 scrape_paths m5 "0:127.0.0.2 2:127.0.0.3"
check "... IO goes on" more_rounds 2
touch "$dir/stop"
wait "$io_pid" || true
check "stats reset cc 2" c stats reset cc 2
check "... zeroes path 2's counters, not path 0's" \
	test "$(path_field 2 writes)" = 0 -a "$(path_field 2 reads)" = 0 -a "$(path_field 0 writes)" -gt 0
check "path 0 counted its reconnect" test "$(path_field 0 reconnects)" -gt 0
check "stats reset cc 0" c stats reset cc 0
# every_zero PATH FIELD...: each of the path's counters is 0.
every_zero() {
	local p=$1 f
	shift
	for f in "$@"; do
		[ "$(path_field "$p" "$f")" = 0 ] || { echo "  path $p: $f = $(path_field "$p" "$f")"; return 1; }
	done
}
check "... zeroes every counter of path 0, reconnects and failovers too" every_zero 0 \
	reads read_bytes writes write_bytes reconnects reconnect_failures failovers auth_runs
read -r n bad <"$dir/io.count"
check "the IO loop: $n rounds of 16 MiB, every one read back equal, 0 errors" \
	test "$bad" -eq 0 -a "$n" -ge 10
[ "$bad" -eq 0 ] || tail -n 20 "$dir/io.err"

# Bad requests: exit 1, the object named; the plugin goes on.
fails() { # TEXT CMD...: exit 1 with TEXT on stderr
	local want=$1 rc=0
	shift
	"$@" >/dev/null 2>"$dir/err" || rc=$?
	[ "$rc" -eq 1 ] && grep -qF -- "$want" "$dir/err" || { echo "  exit $rc: $(cat "$dir/err")"; return 1; }
}
check "an unknown session" fails "no session nope" c path remove nope 0
check "an unknown path" fails "session cc has no path 9" c path reconnect cc 9
check "a bad policy" fails "policy fastest: not round-robin" c policy cc fastest
check "a bad address" fails "server [::1" c path add cc "[::1"
check "a path index that is not one: exit 2" bash -c "'$rnbd' --socket '$dir/cctl' client \
	path remove cc x 2>/dev/null; [ \$? -eq 2 ]"
check "reconnect parameters: max_attempts -1 taken" bash -c "'$rnbd' --socket '$dir/cctl' \
	call client.reconnect '{\"session\":\"cc\",\"delay_ms\":100,\"jitter_ms\":10,\"max_attempts\":-1}' | grep -q '\"max_attempts\":-1'"
check "reconnect parameters: a string refused" fails "max_attempts" \
	"$rnbd" --socket "$dir/cctl" call client.reconnect \
	'{"session":"cc","delay_ms":100,"jitter_ms":10,"max_attempts":"x"}'
check "reconnect-params: loss timeout and fast IO fail too, the rest kept" bash -c \
	"'$rnbd' --socket '$dir/cctl' client reconnect-params cc \
	--reconnect-loss-timeout-ms 120000 --fast-io-fail-ms 2500 -o json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r == {\"delay_ms\": 100, \"jitter_ms\": 10, \"max_attempts\": -1,
             \"loss_timeout_ms\": 120000, \"fast_io_fail_ms\": 2500}, r'"
check "... and client.sessions shows them with the policy" bash -c "'$rnbd' --socket \
	'$dir/cctl' client list -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]
assert s[\"reconnect\"][\"fast_io_fail_ms\"] == 2500 and s[\"policy\"] == \"round-robin\", s'"
check "bad input on every method (the plugin): JSON-RPC errors naming the cause" \
	python3 "$(dirname "$0")/rpc-every-method.py" "$dir/cctl"
check "the plugin still serves" bash -c "nbdcopy '$uri' '$dir/r.bin' && cmp -s '$dir/w.bin' '$dir/r.bin'"
check "... and answers" c list

# The server closes the export while an NBD client holds it (qemu-io: a
# read, a pause, a read): the client lists the device as closed, the NBD
# read fails with EIO (the device's failure; NBD has no ENOTCONN, and
# nbdkit would send EINVAL, "your request is wrong"), nbdkit's log names
# ENOTCONN. A new connection meanwhile opens it again.
if command -v qemu-io >/dev/null; then
	dev_state() { # STATE: the export's state is STATE
		c list devices -o json | python3 -c '
import json, sys
sys.exit(0 if any(x["device"] == "mem0" and x["state"] == sys.argv[1] for x in json.load(sys.stdin))
         else 1)' "$1"
	}
	# qemu-io's output comes at its end (a file is block-buffered): it is read then.
	qemu-io -f raw "$uri" -c "read 0 4096" -c "sleep 3000" -c "read 4096 4096" \
		-c "sleep 5000" >"$dir/qio.out" 2>&1 &
	qio=$!
	wait_until 10 dev_state mapped || true
	sleep 0.5
	check "rnbd server close of the export in use" ctl "$dir/sctl" server close cc mem0
	check "... once IO met it, the export is listed as closed, not mapped (held still)" \
		wait_until 8 dev_state closed
	check "... the metric says it is not mapped" bash -c "'$rnbd' --socket '$dir/cctl' client \
		metrics | grep -q '^rnbd_client_device_mapped{.*device=\"mem0\".*} 0'"
	# A new connection while the first still holds the closed export: it is
	# opened again for it (before, it joined the dead mapping and every
	# request failed until the last connection closed). Named with a
	# leading slash: the same device, one mapping.
	check "a new connection to the closed export (as /mem0) reads: opened again" \
		qemu-io -f raw "nbd+unix:////mem0?socket=$dir/nbd.sock" -c "read 0 4096"
	check "... and it is listed as mapped" dev_state mapped
	wait "$qio" || true
	sed 's/^/  qemu-io: /' "$dir/qio.out" | head -5
	check "... the read after the close failed with EIO" \
		grep -q "read failed: Input/output error" "$dir/qio.out"
	check "... the read before it went through" \
		grep -q "^read 4096/4096 bytes at offset 0" "$dir/qio.out"
else
	echo "note: no qemu-io: the force-close part is skipped"
fi

# An open waiting on the server (stopped: its OPEN is not answered) holds
# only its own export: meanwhile client.devices answers and a second
# connection to the export already mapped opens (the plugin used to hold
# one lock across a map's round trips, up to 60 s with a reconnecting
# session). Then the server goes on and the waiting open fails: there is
# no such device.
if command -v qemu-io >/dev/null && command -v nbdinfo >/dev/null; then
	server_pid=${pids[0]}
	qemu-io -f raw "$uri" -c "read 0 4096" -c "sleep 6000" >/dev/null 2>&1 &
	holder=$!
	wait_until 10 dev_state mapped || true
	kill -STOP "$server_pid"
	nbdinfo --size "nbd+unix:///nosuch?socket=$dir/nbd.sock" >/dev/null 2>"$dir/nosuch.err" &
	waiter=$!
	sleep 0.5
	check "an open waiting on a stopped server: client list devices answers meanwhile" \
		timeout 2 bash -c "'$rnbd' --socket '$dir/cctl' client list devices -o json | \
		grep -q mem0"
	check "... and another connection to the mapped export opens" \
		timeout 2 nbdinfo --size "$uri"
	kill -CONT "$server_pid"
	waiter_failed() { ! wait "$waiter"; }
	check "... the waiting open ends once the server answers: no such device" waiter_failed
	wait "$holder" || true
	check "... IO goes on" bash -c "nbdcopy '$uri' '$dir/r.bin' && cmp -s '$dir/w.bin' '$dir/r.bin'"
else
	echo "note: no qemu-io or nbdinfo: the waiting-open part is skipped"
fi

finish client-ctl
