#!/usr/bin/env bash
# rnbd-client against rnbd-server, no NBD hop:
#   write    a file onto a file export; the server's file holds its bytes,
#   read     it back; the checksums are equal,
#   info     (JSON) reports the export's size and the session's limits,
#   perf     random read/write with --verify on a memory device: every read
#            matches what the run wrote, no IO fails,
#   list     on the server's control socket shows the session's device and
#            its counters while perf runs, and nothing once it is gone,
#   bad input (a missing device, an unaligned --bs, a path escaping the
#            search path, input longer than the device) fails with a clear
#            message and exit status 1 or 2.
# Usage: rnbd-client.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: rnbd-client.sh BUILD_DIR}" && pwd)
client=$build/tools/rnbd-client
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-client.XXXXXX)
trap 'kill_pids; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT

size=$((16 << 20))
mkdir "$dir/export"
truncate -s "$size" "$dir/export/disk.img"
echo secret >"$dir/outside.txt"
rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir/export" \
	--mem-device "mem0:$((64 << 20))" --control "$dir/ctl" || exit 1
c() { "$client" "$1" --server "127.0.0.1:$port" --session cli "${@:2}"; }

head -c $((5 << 20)) /dev/urandom >"$dir/in.bin"
check "write a file onto the export" c write --device disk.img --file "$dir/in.bin" --offset 1M
check "the server's file holds it at the offset" \
	cmp -s "$dir/in.bin" <(tail -c +$(((1 << 20) + 1)) "$dir/export/disk.img" | head -c $((5 << 20)))
check "read it back" c read --device disk.img --file "$dir/out.bin" --offset 1M --length 5M
check "checksums equal" test "$(sha256sum <"$dir/in.bin")" = "$(sha256sum <"$dir/out.bin")"
c info --device disk.img --json >"$dir/info.json"
check "info: size, read-only map, limits" python3 - "$dir/info.json" "$size" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["bytes"] == int(sys.argv[2]), j
assert j["read_only"] is True and j["logical_block_size"] == 512, j
assert j["max_io"] > 0 and j["queue_depth"] > 0 and j["discard"] is True, j
PY

c perf --device mem0 --rw randrw --bs 4k --iodepth 16 --runtime 3 --verify --json \
	>"$dir/perf.json" 2>"$dir/perf.err" &
perf_pid=$!
pids+=($perf_pid)
listed() { ctl "$dir/ctl" list >"$dir/list.out" && grep -q '^cli mem0 .*writes=[1-9]' "$dir/list.out"; }
wait_until 10 listed || true # the checks below say what list showed
wait "$perf_pid" && perf_rc=0 || perf_rc=$?
check "perf --verify exits 0" test "$perf_rc" -eq 0
check "perf: reads verified, writes done, no error" python3 - "$dir/perf.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["errors"] == 0 and j["bad"] == 0 and j["verify"] is True, j
assert j["reads"] > 100 and j["writes"] > 100 and j["iops"] > 0, j
PY
check "list shows the session's device while it runs" \
	grep -Eq '^cli mem0 id=0 mode=rw reads=[1-9][0-9]* read_bytes=[1-9][0-9]* writes=[1-9]' \
	"$dir/list.out"
check "list ends with ok and the count" grep -qx 'ok 1 device' "$dir/list.out"
check "list after the client left: nothing" test "$(ctl "$dir/ctl" list)" = "ok 0 devices"
check "an unknown control command is refused" \
	bash -c "[[ \"\$1\" == 'error: unknown command'* ]]" _ "$(ctl "$dir/ctl" frobnicate)"

set +e
c info --device nothing-here >/dev/null 2>"$dir/err1"
rc1=$?
c perf --device mem0 --bs 1000 --runtime 1 >/dev/null 2>"$dir/err2"
rc2=$?
c read --device ../outside.txt --file "$dir/x" >/dev/null 2>"$dir/err3"
rc3=$?
"$client" perf --device mem0 >/dev/null 2>"$dir/err4"
rc4=$?
c write --device disk.img --file "$dir/in.bin" --offset 12M >/dev/null 2>"$dir/err5"
rc5=$?
set -e
check "a missing device: exit 1, named, ENOENT" \
	bash -c "[ $rc1 = 1 ] && grep -q 'nothing-here.*No such file' '$dir/err1'"
check "an unaligned --bs: refused with the reason" \
	bash -c "[ $rc2 -ge 1 ] && grep -q -- '--bs 1000 must be whole' '$dir/err2'"
check "a path out of the search path: refused" \
	bash -c "[ $rc3 = 1 ] && grep -q 'outside.txt (ro): Invalid argument' '$dir/err3'"
check "input past the device's end: exit 1, said" \
	bash -c "[ $rc5 = 1 ] && grep -q 'input longer than disk.img' '$dir/err5'"
check "no --server: usage error" bash -c "[ $rc4 = 1 ] && grep -q -- '--server' '$dir/err4'"
check "the server is still up and holds nothing" test "$(ctl "$dir/ctl" list)" = "ok 0 devices"

finish rnbd-client
