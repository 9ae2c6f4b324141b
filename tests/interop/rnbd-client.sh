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
#            message and exit status 1 or 2;
#   write    input ending inside a block leaves the rest of that block as
#            it was (read-modify-write); input longer than the room from the
#            offset writes nothing from a regular file, and from a pipe not
#            the piece that reaches the end;
#   sessions two runs at once with the default session name both work; two
#            with one --session: the second is told the name is in use;
#   info     says how it mapped the device (ro), not that the device is
#            read-only; errors do not repeat the program's name;
#   logging  RTRS_LOG_LEVEL=info shows librnbd's info lines, unless
#            --log-level says otherwise;
#   restart  perf --verify on a file export while the server is killed and
#            started again on its port: no IO fails, every read matches the
#            run's last write to its block (none lost, none older written
#            again over a newer one), and the device was opened again.
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
head -c "$size" /dev/urandom >"$dir/export/disk.img"
cp "$dir/export/disk.img" "$dir/orig.img"
echo secret >"$dir/outside.txt"
rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir/export" \
	--mem-device "mem0:$((64 << 20))" --control "$dir/ctl" || exit 1
server_pid=${pids[-1]}
c() { "$client" "$1" --server "127.0.0.1:$port" --session cli "${@:2}"; }

head -c $((5 << 20)) /dev/urandom >"$dir/in.bin"
check "write a file onto the export" c write --device disk.img --file "$dir/in.bin" --offset 1M
check "the server's file holds it at the offset" \
	cmp -s "$dir/in.bin" <(tail -c +$(((1 << 20) + 1)) "$dir/export/disk.img" | head -c $((5 << 20)))
check "read it back" c read --device disk.img --file "$dir/out.bin" --offset 1M --length 5M
check "checksums equal" test "$(sha256sum <"$dir/in.bin")" = "$(sha256sum <"$dir/out.bin")"
c info --device disk.img --json >"$dir/info.json"
check "info: size, the mapping's mode, limits" python3 - "$dir/info.json" "$size" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["bytes"] == int(sys.argv[2]), j
assert j["mode"] == "ro" and "read_only" not in j and j["logical_block_size"] == 512, j
assert j["max_io"] > 0 and j["queue_depth"] > 0 and j["discard"] is True, j
PY

# 8 s: the listing below must catch the session while it runs, and on a
# loaded machine each rnbd call takes a while (3 s was too short once).
c perf --device mem0 --rw randrw --bs 4k --iodepth 16 --runtime 8 --verify --json \
	>"$dir/perf.json" 2>"$dir/perf.err" &
perf_pid=$!
pids+=($perf_pid)
# Until every listing shows the session having both read and written (a
# loaded machine may show the first write before the first read, and one
# listing before the next).
listed() {
	ctl "$dir/ctl" server list devices -o json >"$dir/list.json" &&
		ctl "$dir/ctl" server list >"$dir/list.txt" &&
		ctl "$dir/ctl" server list sessions -o json >"$dir/sessions.json" &&
		ctl_dev "$dir/ctl" cli mem0 1 &&
		grep -Eq '^cli +rnbd +on +127\.0\.0\.1:[0-9]+ +connected .* mem0$' "$dir/list.txt" &&
		python3 -c '
import json, sys
s = [x for x in json.load(open(sys.argv[1])) if x["name"] == "cli"]
p = s[0]["paths"] if s else []
d = [x for x in json.load(open(sys.argv[2])) if x["session"] == "cli" and x["device"] == "mem0"]
ok = sum(x["reads"] for x in p) > 0 and sum(x["writes"] for x in p) > 0
ok = ok and d and d[0]["reads"] > 0 and d[0]["writes"] > 0
sys.exit(0 if ok else 1)' "$dir/sessions.json" "$dir/list.json"
}
wait_until 10 listed || true # the checks below say what list showed
wait "$perf_pid" && perf_rc=0 || perf_rc=$?
check "perf --verify exits 0" test "$perf_rc" -eq 0
check "perf: reads verified, writes done, no error" python3 - "$dir/perf.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["errors"] == 0 and j["bad"] == 0 and j["verify"] is True, j
assert j["reads"] > 100 and j["writes"] > 100 and j["iops"] > 0, j
assert j["completions"] == "poll", j
PY
check "perf --completions threads --verify: completions on librnbd's threads, every read verified" \
	python3 - <(c perf --device mem0 --rw randrw --bs 4k --iodepth 16 --runtime 1 --verify --json \
		--completions threads 2>"$dir/perf-thr.err") <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["errors"] == 0 and j["bad"] == 0 and j["completions"] == "threads", j
assert j["reads"] > 100 and j["writes"] > 100, j
PY
for i in $(seq 1 24); do truncate -s 1M "$dir/export/many-$i"; done
check "perf --sessions 24: 24 sessions open at once, each maps its own device, every read verified" \
	python3 - <(c perf --sessions 24 --device many --rw randrw --bs 4k --iodepth 16 --runtime 2 \
		--verify --json 2>"$dir/perf-many.err") <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sessions"] == 24 and j["errors"] == 0 and j["bad"] == 0, j
assert j["reads"] > 100 and j["writes"] > 100 and j["open_seconds"] < 30, j
PY
check "... and the writes reached every one of the 24 files" bash -c \
	'for i in $(seq 1 24); do cmp -s "$0/export/many-$i" <(head -c 1M /dev/zero) && exit 1; done; exit 0' "$dir"
check "--sessions is refused outside perf: exit 2, said" bash -c '"$0" info --server 127.0.0.1:1 --device mem0 --sessions 2 2>&1 | grep -q "sessions is for perf"; [ "${PIPESTATUS[0]}" = 2 ]' "$client"
check "server list devices (JSON) shows the session's device while it runs" \
	python3 - "$dir/list.json" <<'PY'
import json, sys
d = [x for x in json.load(open(sys.argv[1])) if x["session"] == "cli" and x["device"] == "mem0"]
assert len(d) == 1 and d[0]["mode"] == "rw" and d[0]["closed"] is False, d
assert d[0]["reads"] > 0 and d[0]["read_bytes"] > 0 and d[0]["writes"] > 0, d
PY
check "server list sessions (JSON): its paths, their counters, its device" \
	python3 - "$dir/sessions.json" <<'PY'
import json, sys
s = [x for x in json.load(open(sys.argv[1])) if x["name"] == "cli"]
assert len(s) == 1 and s[0]["kernel_client"] is False and "mem0" in s[0]["devices"], s
p = s[0]["paths"]
assert p and all(x["state"] == "connected" and x["peer"].startswith("127.0.0.1:") for x in p), s
assert sum(x["reads"] for x in p) > 0 and sum(x["writes"] for x in p) > 0, s
PY
check "server list (a table): a line per path, the session and its device" \
	grep -Eq '^cli +rnbd +on +127\.0\.0\.1:[0-9]+ +connected .* mem0$' "$dir/list.txt"
check "list after the client left: nothing" ctl_none "$dir/ctl"
check "an unknown method is refused with exit 1" \
	bash -c "! '$build/tools/rnbd' --socket '$dir/ctl' call frobnicate 2>'$dir/frob.err' && grep -q 'no method' '$dir/frob.err'"

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
	bash -c "[ $rc5 = 1 ] && grep -q 'do not fit in the 4194304 bytes of disk.img from offset 12582912; nothing written' '$dir/err5'"
check "no --server: usage error" bash -c "[ $rc4 = 1 ] && grep -q -- '--server' '$dir/err4'"
# says WHAT CMD...: exit 1, and stderr holds WHAT (the cause, not only an errno).
says() {
	local want=$1 rc=0
	shift
	"$@" >/dev/null 2>"$dir/says.err" || rc=$?
	[ "$rc" -eq 1 ] && grep -qF -- "$want" "$dir/says.err" ||
		{ echo "  exit $rc: $(tail -1 "$dir/says.err")"; return 1; }
}
check "a host name that does not resolve: said so" \
	says "to nosuchhost.invalid: cannot resolve nosuchhost.invalid: " \
	"$client" info --server nosuchhost.invalid --device disk.img
check "a key file that is not there: named" \
	says "host secret file $dir/nokey: cannot open the key file: No such file or directory" \
	c info --device disk.img --secret "@$dir/nokey"
check "the server is still up and holds nothing" ctl_none "$dir/ctl"

# ---- write: the bytes around the input ------------------------------------

# dev_bytes OFFSET LENGTH [FILE]: those bytes of the server's file (or FILE).
dev_bytes() {
	dd if="${3:-$dir/export/disk.img}" iflag=skip_bytes,count_bytes skip="$1" count="$2" \
		bs=64K status=none
}
max_io=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_io"])' "$dir/info.json")

# Input ending inside a block: the block's other bytes stay.
off=$((2 << 20))
dev_bytes "$off" 4096 >"$dir/before.bin"
head -c 1000 /dev/urandom >"$dir/short.bin"
check "write of 1000 bytes" c write --device disk.img --file "$dir/short.bin" --offset 2M
check "... they are on the device" cmp -s "$dir/short.bin" <(dev_bytes "$off" 1000)
check "... and the rest of their last block is as it was" \
	cmp -s <(dev_bytes 1000 24 "$dir/before.bin") <(dev_bytes $((off + 1000)) 24)
check "... and so is the block after it" \
	cmp -s <(dev_bytes 1024 3072 "$dir/before.bin") <(dev_bytes $((off + 1024)) 3072)

# Input longer than the room from the offset: a regular file writes nothing.
dev_bytes $((12 << 20)) $((4 << 20)) "$dir/orig.img" >"$dir/tail-before.bin"
check "an input file too long for the device (above): nothing written" \
	cmp -s "$dir/tail-before.bin" <(dev_bytes $((12 << 20)) $((4 << 20)))
# From a pipe: the pieces (max_io from the offset) before the last are
# written, the last one, which reaches the end, is not.
last=$(((4 << 20) % max_io))
[ "$last" -gt 0 ] || last=$max_io
set +e
cat "$dir/in.bin" | c write --device disk.img --file - --offset 12M >/dev/null 2>"$dir/err6"
rc6=$?
set -e
check "a pipe too long for the device: exit 1, said" \
	bash -c "[ $rc6 = 1 ] && grep -q 'input longer than the 4194304 bytes of disk.img from offset 12582912; the last $last bytes that fit were not written' '$dir/err6'"
check "... the piece reaching the end is not written" \
	cmp -s <(dev_bytes $(((4 << 20) - last)) "$last" "$dir/tail-before.bin") \
	<(dev_bytes $(((16 << 20) - last)) "$last")
check "... the pieces before it are" \
	cmp -s <(dev_bytes 0 $(((4 << 20) - last)) "$dir/in.bin") \
	<(dev_bytes $((12 << 20)) $(((4 << 20) - last)))

# ---- session names, info labels, messages -----------------------------------

both() { # two runs at once with the default session name
	"$client" perf --server "127.0.0.1:$port" --device mem0 --runtime 2 >/dev/null 2>"$dir/s1.err" &
	local p=$!
	sleep 0.5
	"$client" info --server "127.0.0.1:$port" --device mem0 >/dev/null 2>"$dir/s2.err"
	local r=$?
	wait "$p" && [ $r -eq 0 ] || { cat "$dir/s1.err" "$dir/s2.err"; return 1; }
}
check "two runs at once with the default session name" both
# aligned FILE: every line of the table has its columns where the heading
# has them (a default session name is longer than any fixed column).
aligned() {
	python3 - "$1" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
fields = lambda l: [(m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", l)]
head = fields(lines[0])
assert len(lines) > 1, lines
for l in lines[1:]:
    row = fields(l)
    assert len(row) == len(head), (l, lines[0])
    # each cell lies under its heading: left-aligned ones start with it,
    # right-aligned ones end with it
    for (hs, he), (s, e) in zip(head, row):
        assert s == hs or e == he, (lines[0][hs:he], l[s:e], lines)
PY
}
# Listed with its device open: a listing taken as the session closes has
# no DEVICES cell (a loaded machine took one after a 3 s run had ended).
long_listed() {
	ctl "$dir/ctl" server list >"$dir/long.txt" && grep -q '^rnbd-client-.* mem0$' "$dir/long.txt"
}
"$client" perf --server "127.0.0.1:$port" --device mem0 --runtime 8 >/dev/null 2>&1 &
long=$!
pids+=($long)
check "server list with a default session name: listed" wait_until 10 long_listed
check "... its columns stay in line" aligned "$dir/long.txt"
wait "$long" || true
c perf --device mem0 --runtime 6 >/dev/null 2>&1 & # long enough for a loaded machine
busy=$!
pids+=($busy)
cli_listed() { ctl_dev "$dir/ctl" cli mem0; }
wait_until 10 cli_listed || true # the check below fails if it never came
set +e
c info --device disk.img >/dev/null 2>"$dir/err7"
rc7=$?
set -e
wait "$busy" || true # it ends by itself: the session closes cleanly
check "one --session twice at once: the second is told the name is in use" \
	bash -c "[ $rc7 = 1 ] && grep -q 'session cli to 127.0.0.1:$port: the name is in use' '$dir/err7'"

check "info on a writable file: says the mapping is ro, not the device read-only" \
	bash -c "out=\$('$client' info --server 127.0.0.1:$port --device disk.img) &&
		[[ \$out == *', mapped ro'* && \$out != *read-only* ]] || { echo \"  \$out\"; false; }"
check "info --mode rw: mode rw in JSON" \
	bash -c "'$client' info --server 127.0.0.1:$port --device disk.img --mode rw --json |
		python3 -c 'import json,sys; assert json.load(sys.stdin)[\"mode\"] == \"rw\"'"
check "errors do not repeat the program's name" \
	bash -c "! grep -h 'rnbd-client: rnbd-client' '$dir'/err*"
"$client" info --server "127.0.0.1:$port" --device nothing-here >/dev/null 2>"$dir/err8" || true
check "... not with the default session either" \
	bash -c "grep -q 'rnbd-client: session rnbd-client-.*: device nothing-here (ro): No such file' '$dir/err8' &&
		! grep -q 'rnbd-client: rnbd-client' '$dir/err8'"

# ---- log level ------------------------------------------------------------------

RTRS_LOG_LEVEL=info c info --device disk.img >/dev/null 2>"$dir/log-info.err" || true
check "RTRS_LOG_LEVEL=info: librnbd's info lines" grep -q 'rtrs info: .*mapped disk.img' "$dir/log-info.err"
RTRS_LOG_LEVEL=info c info --device disk.img --log-level warn >/dev/null 2>"$dir/log-warn.err" || true
check "--log-level warn wins over it" bash -c "! grep -q 'rtrs info' '$dir/log-warn.err'"
c info --device disk.img >/dev/null 2>"$dir/log-default.err" || true
check "neither: warnings only (the default)" bash -c "! grep -q 'rtrs info' '$dir/log-default.err'"
set +e
RTRS_LOG_LEVEL=chatty c info --device disk.img >/dev/null 2>"$dir/log-bad.err"
rc9=$?
set -e
check "a bad RTRS_LOG_LEVEL: exit 2, said" \
	bash -c "[ $rc9 = 2 ] && grep -q 'RTRS_LOG_LEVEL=chatty: expected error, warn, info or debug' '$dir/log-bad.err'"

# ---- a server restart under IO --------------------------------------------------

# IO in flight and IO issued during the outage waits (in librtrs for a path,
# then at the device's gate for its reopen) and goes to the new server.
head -c $((8 << 20)) /dev/zero >"$dir/export/restart.img"
c perf --device restart.img --rw randrw --bs 4k --iodepth 16 --runtime 6 --verify --json \
	--fast-io-fail-ms 20000 --log-level info >"$dir/perf-restart.json" 2>"$dir/perf-restart.err" &
rperf=$!
pids+=($rperf)
perf_writes() { ctl_dev "$dir/ctl" cli restart.img 1; }
check "perf runs before the restart" wait_until 10 perf_writes
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null || true
sleep 0.5
rnbd_server_start "$dir/server2.log" -- --port "$port" --dev-search-path "$dir/export" \
	--mem-device "mem0:$((64 << 20))" --control "$dir/ctl" || exit 1
wait "$rperf" && rperf_rc=0 || rperf_rc=$?
check "perf across a restart exits 0" test "$rperf_rc" -eq 0
check "perf across a restart: no error, every read verified" python3 - "$dir/perf-restart.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["errors"] == 0 and j["bad"] == 0 and j["verify"] is True, j
assert j["reads"] > 100 and j["writes"] > 100, j
PY
check "the client opened the device again on the new server" \
	grep -q 'restart.img open again' "$dir/perf-restart.err"
check "... after librtrs told it of the new server session" \
	grep -q 'the server has a new session for us' "$dir/perf-restart.err"

# ---- authentication: the server's name ---------------------------------------------

umask 077
"$build/tools/rtrs-key" gen --hmac 1 >"$dir/host1.key"
echo "host1 $(cat "$dir/host1.key")" >"$dir/keys"
(umask 022)
echo '* sessions=* migration=*' >"$dir/all.access"
rnbd_server_start "$dir/auth.log" -- --port 0 --mem-device m:1M --auth-keys "$dir/keys" \
	--access "$dir/all.access" --auth-name storage1 || exit 1
a() { "$client" info --server "127.0.0.1:$port" --device m --host-name host1 "$@"; }
check "authenticated with the server's name: works" \
	a --secret "@$dir/host1.key" --server-name storage1
check "another server name: told the server is not named that" \
	says "the server is not named storage2 (authentication names the server: set the client's server name to the server's --auth-name, default rtrs-server)" \
	a --secret "@$dir/host1.key" --server-name storage2
check "the default server name (rtrs-server): told so too" \
	says "the server is not named rtrs-server" a --secret "@$dir/host1.key"
"$build/tools/rtrs-key" gen --hmac 1 >"$dir/other.key"
check "a wrong key: told the server refused authentication" \
	says "the server refused authentication: authentication failed" \
	a --secret "@$dir/other.key" --server-name storage1

finish rnbd-client
