#!/usr/bin/env bash
# fio's external engine for RNBD (bench/fio/rnbd-fio.c), loaded into the fio
# it was built against (bench/fio-build.sh, meson -Dfio_src): verified IO
# through rnbd-server with completions polled on fio's thread (rnbd_poll=1)
# and on librnbd's threads (rnbd_poll=0), a known pattern found at its
# offset in the server's file, and a server killed under a polling job: the
# job ends with errors, it does not hang.
# Usage: fio-engine.sh BUILD_DIR. Exits 77 when the build has no engine
# (configured without -Dfio_src).
set -euo pipefail
build=$(cd "${1:?usage: fio-engine.sh BUILD_DIR}" && pwd)
engine=$build/bench/rnbd-fio.so
fio_src=$(meson introspect --buildoptions "$build" |
	python3 -c 'import json, sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "fio_src"][0])')
if [ ! -f "$engine" ] || [ -z "$fio_src" ] || [ ! -x "$fio_src/fio" ]; then
	echo "fio-engine: this build has no fio engine (configure with -Dfio_src=\$(bench/fio-build.sh))"
	exit 77
fi
fio=$fio_src/fio

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-fio-engine.XXXXXX)
trap 'kill_pids; rm -rf "$dir"' EXIT
truncate -s 64M "$dir/disk.img"
rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir" --mem-device mem0:64M

# job NAME DEVICE ARGS...: fio through the engine, its JSON in $dir/NAME.json.
job() {
	local name=$1 dev=$2
	shift 2
	timeout 120 "$fio" --name="$name" --ioengine="external:$engine" \
		--rnbd_server="127.0.0.1:$port" --rnbd_session="fio-$name" --filename="$dev" \
		--thread --output-format=json --output="$dir/$name.json" "$@" \
		>"$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; return 1; }
}
# no_errors NAME: the job's JSON says no IO error and some IO done.
no_errors() {
	python3 - "$dir/$1.json" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
sys.exit(0 if j["error"] == 0 and ios > 0 else 1)
PY
}
verify=(--rw=randwrite --bsrange=4k-64k --size=32M --iodepth=32 --verify=crc32c
	--do_verify=1 --verify_fatal=1 --norandommap --randrepeat=0)

check "polled: random writes of 4-64 KiB at QD 32 read back with crc32c (memory)" \
	job poll-mem mem0 "${verify[@]}" --rnbd_poll=1
check "  no IO error" no_errors poll-mem
check "on librnbd's threads: the same on the file export" \
	job thr-file disk.img "${verify[@]}" --rnbd_poll=0
check "  no IO error" no_errors thr-file
check "polled: the same on the file export" \
	job poll-file disk.img "${verify[@]}" --rnbd_poll=1
check "polled: randrw for 3 s at QD 64" job poll-rw mem0 --rw=randrw --bs=4k --size=32M \
	--iodepth=64 --runtime=3 --time_based --rnbd_poll=1
check "  no IO error" no_errors poll-rw

# A pattern written at 1 MiB through the engine is in the server's file there.
check "a 0x5aa5c33c pattern written at 1 MiB (polled)" job pattern disk.img --rw=write --bs=64k \
	--offset=1M --size=1M --iodepth=8 --buffer_pattern=0x5aa5c33c --rnbd_poll=1
check "  is in the server's file at 1 MiB" python3 - \
	"$dir/disk.img" <<'PY'
import sys
with open(sys.argv[1], "rb") as f:
    f.seek(1 << 20)
    got = f.read(1 << 20)
sys.exit(0 if got == bytes.fromhex("5aa5c33c") * (1 << 18) else 1)
PY

# The server dies under a polling job: its IO fails (fast_io_fail_ms) and fio ends.
job_bg() {
	"$fio" --name=death --ioengine="external:$engine" --rnbd_server="127.0.0.1:$port" \
		--rnbd_session=fio-death --filename=mem0 --thread --rw=randrw --bs=4k --size=32M \
		--iodepth=32 --runtime=60 --time_based --rnbd_poll=1 \
		--rnbd_opts=fast_io_fail_ms=2000,reconnect_delay_ms=500 >"$dir/death.out" 2>&1
}
job_bg &
fpid=$!
pids+=($fpid)
sleep 2
spid=${pids[0]}
kill -9 "$spid"
start=$SECONDS
rc=0
wait_until 30 bash -c "! kill -0 $fpid 2>/dev/null" || rc=1
check "server killed under a polling job: fio ends within 30 s" test "$rc" = 0
wait "$fpid" 2>/dev/null && frc=0 || frc=$?
check "  with an error (exit $frc, after $((SECONDS - start)) s)" test "$frc" != 0
check "  the IO failed with the transport's verdict (ETIMEDOUT or ECONNABORTED)" grep -qE \
	'io_u error on file mem0: (Connection timed out|Software caused connection abort)' \
	"$dir/death.out"

finish fio-engine
