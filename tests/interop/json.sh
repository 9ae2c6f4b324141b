#!/usr/bin/env bash
# Every JSON document the tools print parses, whatever the names in it:
#   rnbd-client info --json and perf --json on a device named q"x\y.raw
#   (a quote and a backslash) give that name back exactly;
#   rtrs-perf client --json parses with its paths and counters.
# Usage: json.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: json.sh BUILD_DIR}" && pwd)
client=$build/tools/rnbd-client
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-json.XXXXXX)
trap 'kill_pids; rm -rf "$dir"' EXIT

name='q"x\y.raw'
mkdir "$dir/export"
truncate -s $((4 << 20)) "$dir/export/$name"
rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir/export" || exit 1

# parses FILE NAME PYTHON-ASSERTIONS: FILE is one JSON object (j) and they hold.
parses() {
	python3 - "$@" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
try:
    j = json.loads(text)
except ValueError as e:
    print("  not JSON (%s): %s" % (e, text.strip()))
    sys.exit(1)
name = sys.argv[2]
try:
    exec(sys.argv[3])
except AssertionError:
    print("  assertion failed:", sys.argv[3], "on", j)
    sys.exit(1)
PY
}

"$client" info --server "127.0.0.1:$port" --device "$name" --json >"$dir/info.json" || true
check "info --json: valid, the device's name exact" parses "$dir/info.json" "$name" \
	'assert j["device"] == name and j["bytes"] == 4 << 20 and j["mode"] == "ro"'

"$client" perf --server "127.0.0.1:$port" --device "$name" --runtime 1 --iodepth 4 --json \
	>"$dir/perf.json" || true
check "perf --json: valid, the device's name exact" parses "$dir/perf.json" "$name" \
	'assert j["device"] == name and j["errors"] == 0 and j["reads"] + j["writes"] > 0 and j["lat_us"]["max"] > 0'

"$build/tools/rtrs-perf" server --port 0 >"$dir/perf-server.log" 2>&1 &
pids+=($!)
wait_until 10 grep -q 'listening on port' "$dir/perf-server.log" || { cat "$dir/perf-server.log"; exit 1; }
pport=$(grep -o 'listening on port [0-9]*' "$dir/perf-server.log" | grep -o '[0-9]*$')
"$build/tools/rtrs-perf" client --server "127.0.0.1:$pport" --duration 1 --json >"$dir/rtrs.json" || true
check "rtrs-perf --json: valid, with its paths and counters" parses "$dir/rtrs.json" "" \
	'assert j["paths"][0]["state"] == "connected" and j["ops"] > 0 and j["errors"] == 0 and j["provider"] == "tcp"'

# The rnbd tool reads answers without trusting their shape: a server (here
# a fake one) whose answers hold nulls, missing members or values of
# another type gets a table of what there is, or "an answer of an
# unexpected shape", never a crash (json-c asserts on the length of
# something that is not an array; a null name was dereferenced).
python3 - "$dir/fake.sock" <<'PY' >"$dir/fake.log" 2>&1 &
import json, socket, sys
odd = [[{"name": None, "paths": [{}]}], [{}], [None, 3, "x"],
       [{"name": "s", "paths": None, "devices": [None, 3]}],
       [{"name": "s/h", "paths": [{"name": None, "src": None, "state": 5}]}],
       [{"name": "s", "paths": [{"name": "s/h:1", "src": "10.0.0.1"}], "devices": "d"}],
       {"a": None, "b": [1]}, None]
srv = socket.socket(socket.AF_UNIX)
srv.bind(sys.argv[1])
srv.listen(16)
i = 0
while True:
    c, _ = srv.accept()
    data, req = b"", None
    while req is None:
        got = c.recv(65536)
        if not got:
            break
        data += got
        try:
            req = json.loads(data)
        except ValueError:
            pass
    if req is not None:
        ans = {"jsonrpc": "2.0", "result": odd[i % len(odd)], "id": req.get("id")}
        c.sendall((json.dumps(ans) + "\n").encode())
        i += 1
    c.close()
PY
pids+=($!)
wait_until 10 test -S "$dir/fake.sock" || { cat "$dir/fake.log"; exit 1; }
odd_answers() {
	local rc bad=0
	for _ in 1 2 3 4 5 6 7 8; do
		for cmd in "server list sessions" "server list devices" "client list sessions" \
			"client list paths" "client list devices" "server stats"; do
			rc=0
			# shellcheck disable=SC2086
			"$build/tools/rnbd" --socket "$dir/fake.sock" $cmd >"$dir/odd.out" 2>"$dir/odd.err" ||
				rc=$?
			if [ "$rc" -ge 128 ]; then
				echo "  rnbd $cmd: exit $rc: $(cat "$dir/odd.err")"
				bad=1
			fi
		done
	done
	return $bad
}
check "rnbd: answers of odd shapes (nulls, missing members, other types): no crash" odd_answers

finish json
