#!/usr/bin/env bash
# A link cut under fio verify through the NBD front end. rnbd-server runs
# in a "server" namespace, nbdkit's rnbd plugin in a "client" namespace
# with one session over two paths (two veth links, two subnets); fio (nbd
# engine) writes random blocks with crc32c through it, and one link goes
# down in the middle of the writes. The session fails over to the other
# path: fio must see no IO error and its verification pass must succeed.
# Usage: rnbd-linkcut.sh BUILD_DIR. Root, iproute2, nbdkit and fio; exits 77
# without them.
set -euo pipefail
build=$(cd "${1:?usage: rnbd-linkcut.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
for t in ip nbdkit fio; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "SKIP: fio has no nbd engine"; exit 77; }
. "$here/lib.sh"
. "$here/../lib/common.sh"

netns_test_begin linkcut

truncate -s 256M "$dir/disk.img"
rnbd_server_start "$dir/server.log" ip netns exec "$S" -- --port 1234 --dev-search-path "$dir" \
	--hb-interval 200 --control "$dir/ctl" || exit 1
# The server's count of completed writes for the session (control socket).
writes() { # the server's write count for the device (rnbd server list devices)
	ctl "$dir/ctl" server list devices -o json | python3 -c '
import json, sys
d = [x for x in json.load(sys.stdin) if x["session"] == "linkcut" and x["device"] == "disk.img"]
print(d[0]["writes"] if d else "")'
}

# -v: the transport's path events go to nbdkit's debug log.
ip netns exec "$C" nbdkit -f -v -U "$dir/nbd.sock" "$build/nbdkit/nbdkit-rnbd-plugin.so" \
	server=198.18.1.1:1234 server=198.18.2.1:1234 session=linkcut device=disk.img \
	fast_io_fail_ms=30000 >"$dir/nbdkit.log" 2>&1 &
pids+=($!)
wait_until 10 test -S "$dir/nbd.sock" || { tail -20 "$dir/nbdkit.log"; echo "FAIL: no nbdkit"; exit 1; }

# About 8 s of writes at 16 MB/s (4096 a second); the first link goes down
# once the server has answered 2000, and 4000 more must be answered after it
# while fio is still writing.
fio --name=linkcut --ioengine=nbd --uri="nbd+unix:///disk.img?socket=$dir/nbd.sock" \
	--rw=randwrite --bs=4k --size=128M --iodepth=16 --rate=16m --verify=crc32c \
	--do_verify=1 --verify_fatal=1 --verify_state_save=0 --output="$dir/fio.log" &
fio_pid=$!
pids+=($fio_pid)
under_way() { [ "$(writes)" -ge 2000 ] 2>/dev/null; }
wait_until 20 under_way || true
at_cut=$(writes || echo 0)
ip -n "$C" link set "${tag}c1" down
went_on() { [ "$(writes)" -ge $((at_cut + 4000)) ] 2>/dev/null; }
wait_until 20 went_on || true
after=$(writes || echo 0)
rc=0
wait "$fio_pid" || rc=$?
ip -n "$C" link set "${tag}c1" up

check "the cut came under way: $at_cut writes answered before it" test "${at_cut:-0}" -ge 2000
check "fio exited 0" test "$rc" -eq 0
check "fio saw no IO error" grep -q 'err= 0' "$dir/fio.log"
check "writes went on over the other path: $at_cut before the cut, $after after" \
	test "${after:-0}" -ge $((at_cut + 4000))
check "fio's verification read all 128 MiB" grep -q 'READ:.*io=128MiB' "$dir/fio.log"
grep -m1 '198.18.1.1.*\(closed\|failed\|down\|timed out\)' "$dir/nbdkit.log" || true
check "the cut path failed under IO" grep -q '198.18.1.1.*\(closed\|failed\|down\|timed out\)' "$dir/nbdkit.log"
check "no IO error reached nbdkit" bash -c "! grep -q 'IO at' '$dir/nbdkit.log'"
if [ "$fails" -ne 0 ]; then
	tail -30 "$dir/fio.log"
	grep -i 'rtrs\|rnbd' "$dir/nbdkit.log" | tail -30
fi
finish rnbd-linkcut
