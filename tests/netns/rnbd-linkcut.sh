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

dir=$(mktemp -d /var/tmp/rnbd-linkcut.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	netns_cleanup
	rm -rf "$dir"
}
trap cleanup EXIT
netns_setup || { echo "FAIL: cannot set up the namespaces"; exit 1; }

truncate -s 256M "$dir/disk.img"
ip netns exec "$S" "$build/daemons/rnbd-server" --port 1234 --dev-search-path "$dir" \
	--hb-interval 200 >"$dir/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q 'listening on port' "$dir/server.log" && break; sleep 0.05; done
grep -q 'listening on port' "$dir/server.log" || { cat "$dir/server.log"; echo "FAIL: no server"; exit 1; }

# -v: the transport's path events go to nbdkit's debug log.
ip netns exec "$C" nbdkit -f -v -U "$dir/nbd.sock" "$build/nbdkit/nbdkit-rnbd-plugin.so" \
	server=198.18.1.1:1234 server=198.18.2.1:1234 session=linkcut device=disk.img \
	fast_io_fail_ms=30000 >"$dir/nbdkit.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -S "$dir/nbd.sock" ] && break; sleep 0.05; done
[ -S "$dir/nbd.sock" ] || { tail -20 "$dir/nbdkit.log"; echo "FAIL: no nbdkit"; exit 1; }

# About 8 s of writes at 16 MB/s; the first link goes down 2 s in.
fio --name=linkcut --ioengine=nbd --uri="nbd+unix:///disk.img?socket=$dir/nbd.sock" \
	--rw=randwrite --bs=4k --size=128M --iodepth=16 --rate=16m --verify=crc32c \
	--do_verify=1 --verify_fatal=1 --verify_state_save=0 --output="$dir/fio.log" &
fio_pid=$!
sleep 2
ip -n "$C" link set "${tag}c1" down
cut_at=$(date +%s)
rc=0
wait "$fio_pid" || rc=$?
ip -n "$C" link set "${tag}c1" up

fails=0
check() {
	if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
check "fio exited 0" "[ $rc -eq 0 ]"
check "fio saw no IO error" "grep -q 'err= 0' '$dir/fio.log'"
check "fio verified what it wrote" "! grep -qi 'verify.*fail\|bad magic\|crc32c.*mismatch' '$dir/fio.log'"
check "the writes outlasted the cut" "[ \$(( \$(date +%s) - cut_at )) -ge 2 ]"
grep -m1 '198.18.1.1.*\(closed\|failed\|down\|timed out\)' "$dir/nbdkit.log" || true
check "the cut path failed under IO" "grep -q '198.18.1.1.*\(closed\|failed\|down\|timed out\)' '$dir/nbdkit.log'"
check "no IO error reached nbdkit" "! grep -q 'IO at' '$dir/nbdkit.log'"
if [ "$fails" -ne 0 ]; then
	tail -30 "$dir/fio.log"
	grep -i 'rtrs\|rnbd' "$dir/nbdkit.log" | tail -30
fi
echo "rnbd-linkcut: $fails failed"
[ "$fails" -eq 0 ]
