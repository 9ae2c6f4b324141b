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

finish json
