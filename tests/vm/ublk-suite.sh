#!/usr/bin/env bash
# The ublk suite: rnbd-clientd's mapped devices as real block devices, in a
# QEMU guest booted with Debian's 6.12 backports kernel and ublk_drv
# ('rtrs-vm image --bpo'), rnbd-server in the same guest over soft-RoCE
# (the native RDMA fabric):
#   - map a 64 MiB file export: /dev/ublkbN of 64 MiB, its block size and
#     largest IO from the server's answer;
#   - a 64 MiB random pattern written (O_DIRECT) and read back equal; the
#     server's file holds it; a discard and a write zeroes read back as
#     zeros, on the device and in the server's file, the rest intact;
#   - mkfs.ext4, mount, files written and synced; rnbd-server SIGKILLed and
#     started again under the mounted file system: IO resumes (more files),
#     every file intact; unmount, fsck -n clean;
#   - a normal unmap of a mounted device is refused (EBUSY);
#   - client save, rnbd-clientd stopped (its devices go) and started again:
#     the mapping is restored (after its socket is up), the file system
#     mounts and its files are intact; unmap removes /dev/ublkbN;
#   - polled completions, over tcp on loopback: two devices of one session
#     written and read back at once, four streams each, equal, and one
#     queue thread polls the session for both;
#   - rnbd-clientd stopped (SIGTERM) with its server frozen (SIGSTOP) under
#     a write, fast_io_fail_ms 600000: it ends within 5 s, the write fails
#     with EIO, the block device is gone.
# Usage: ublk-suite.sh BUILD_DIR. Prints "N passed, N failed, N skipped";
# exits 77 when guests cannot be run here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: ublk-suite.sh BUILD_DIR}" && pwd)
vm=$here/rtrs-vm

if [ "$(id -u)" -ne 0 ]; then
	echo "ublk: needs root (QEMU guests, packages); skipping"
	exit 77
fi
logs=$(mktemp -d /tmp/ublk-suite.XXXXXX)
trap 'rm -rf "$logs"' EXIT
if ! "$vm" image --bpo >"$logs/image.log" 2>&1; then
	cat "$logs/image.log"
	echo "ublk: cannot build the 6.12 guest image"
	echo "0 passed, 1 failed, 0 skipped"
	exit 1
fi

cat >"$logs/guest.sh" <<'GUEST'
# In the guest: $1 the build folder. Prints "CHECK name ok|FAIL detail".
B=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
n=0
check() { # NAME STATUS [DETAIL]
	if [ "$2" -eq 0 ]; then echo "CHECK $1 ok ${3:-}"; else echo "CHECK $1 FAIL ${3:-}"; fi
}
wait_for() { # SECONDS CMD...
	local end=$((SECONDS + $1)); shift
	until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}
R() { "$B/tools/rnbd" --socket /tmp/c.sock --timeout 120000 "$@"; }
MIB=64
mkdir -p /tmp/exports
head -c $((MIB << 20)) /dev/zero >/tmp/exports/disk.img
server() {
	"$B/daemons/rnbd-server" --provider verbs -a 198.18.0.1 -p 1234 -s /tmp/exports \
		--log-level info >>/tmp/s.log 2>&1 &
	SPID=$!
	wait_for 60 grep -q 'listening on port' /tmp/s.log
}
clientd() { # each start its own log: "ready" is this one's
	CLOG=/tmp/c$((++NC)).log
	"$B/daemons/rnbd-clientd" --control /tmp/c.sock --mappings /tmp/maps.json \
		--log-level info >"$CLOG" 2>&1 &
	CPID=$!
	wait_for 60 grep -q 'rnbd-clientd ready' "$CLOG"
}
NC=0
server; check server-started $?
clientd; check clientd-started $?
grep -q 'ublk: mapped devices become' "$CLOG"; check clientd-found-ublk $?

R client map disk.img --session ub --server 198.18.0.1 --provider verbs \
	--fast-io-fail-ms 60000 -o json >/tmp/map.json
check map $? "$(cat /tmp/map.json)"
dev=$(python3 -c 'import json; print(json.load(open("/tmp/map.json"))["block_device"] or "")')
[ -b "$dev" ]; check block-device $? "($dev)"
sz=$(blockdev --getsize64 "$dev" 2>/dev/null)
[ "$sz" = $((MIB << 20)) ]; check block-device-size $? "($sz bytes)"
bs=$(blockdev --getss "$dev" 2>/dev/null)
[ "$bs" = 512 ]; check logical-block-size $? "($bs)"

head -c $((MIB << 20)) /dev/urandom >/tmp/pattern
dd if=/tmp/pattern of="$dev" bs=1M oflag=direct status=none &&
	dd if="$dev" of=/tmp/back bs=1M count=$MIB iflag=direct status=none &&
	cmp /tmp/pattern /tmp/back
check pattern-read-back-equal $? "($MIB MiB, O_DIRECT)"
cmp /tmp/pattern /tmp/exports/disk.img; check server-file-holds-pattern $?
rm -f /tmp/back

# Discard and write zeroes reach the server: those ranges read back as
# zeros, through the device and in the server's file; the rest is intact.
blkdiscard -o $((8 << 20)) -l $((4 << 20)) "$dev"; check discard $?
blkdiscard -z -o $((16 << 20)) -l $((4 << 20)) "$dev"; check write-zeroes $?
python3 - "$dev" /tmp/pattern /tmp/exports/disk.img <<'PY'
import mmap, os, sys
dev, pat, srv = sys.argv[1:4]
want = bytearray(open(pat, "rb").read())
for off in (8 << 20, 16 << 20):
    want[off:off + (4 << 20)] = bytes(4 << 20)
fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, len(want))
got = bytearray()
while len(got) < len(want):
    n = os.readv(fd, [buf])
    if n <= 0:
        break
    got += buf[:n]
assert got == want, "the device differs"
assert open(srv, "rb").read() == bytes(want), "the server's file differs"
PY
check discard-zeroes-read-back $? "(device and server file)"

mkfs.ext4 -q -F "$dev"; check mkfs-ext4 $?
mkdir -p /tmp/mnt && mount "$dev" /tmp/mnt; check mount $?
for i in 1 2 3 4; do head -c $((2 << 20)) /dev/urandom >/tmp/mnt/f$i; done
sync; check files-written-synced $?
(cd /tmp/mnt && sha256sum f1 f2 f3 f4) >/tmp/sums
R client unmap disk.img 2>/tmp/unmap.err
[ $? -eq 1 ] && grep -q 'in use' /tmp/unmap.err; check unmap-of-mounted-refused $? "($(cat /tmp/unmap.err))"

kill -KILL "$SPID"; wait "$SPID" 2>/dev/null
sleep 2
server; check server-restarted $?
# IO under the mount resumes once the session is back (the client reopens the device).
for i in 5 6; do head -c $((2 << 20)) /dev/urandom >/tmp/mnt/f$i; done
sync; check io-resumes-after-restart $?
(cd /tmp/mnt && sha256sum f5 f6) >>/tmp/sums
echo 3 >/proc/sys/vm/drop_caches
(cd /tmp/mnt && sha256sum -c --quiet /tmp/sums); check files-intact $?
umount /tmp/mnt; check umount $?
fsck.ext4 -n "$dev" >/tmp/fsck.log 2>&1; check fsck-clean $? "($(tail -n1 /tmp/fsck.log))"

R client save >/dev/null; check client-save $?
kill "$CPID"; wait "$CPID"; check clientd-stopped $?
[ ! -b "$dev" ]; check block-device-gone-with-clientd $?
clientd; check clientd-restarted $?
restored() { # the restored mapping's block device, once it is there (mapped after "ready")
	dev=$(R client list devices -o json | python3 -c '
import json, sys
d = [x for x in json.load(sys.stdin) if x["device"] == "disk.img"]
print(d[0]["block_device"] if d and d[0]["block_device"] else "")')
	[ -b "$dev" ]
}
wait_for 60 restored; check mapping-restored $? "($dev)"
mount "$dev" /tmp/mnt && (cd /tmp/mnt && sha256sum -c --quiet /tmp/sums); check files-intact-after-restore $?
umount /tmp/mnt
R client unmap disk.img >/dev/null; check unmap $?
[ ! -b "$dev" ]; check unmap-removes-block-device $?

# Polled completions (tcp on loopback; soft-RoCE above has none): two
# devices of one session, each with its own ublk queue, written and read
# back at once, four streams each; one queue thread polls the session's
# completions for both (its log says which), the other's come to it.
mkdir -p /tmp/exports2
for f in a b; do head -c $((32 << 20)) /dev/zero >/tmp/exports2/$f.img; done
"$B/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1235 -s /tmp/exports2 \
	--log-level info >/tmp/s2.log 2>&1 &
S2PID=$!
wait_for 60 grep -q 'listening on port' /tmp/s2.log; check tcp-server-started $?
R client map a.img --session tp --server 127.0.0.1:1235 --provider tcp -o json >/tmp/ma.json
check tcp-map-a $? "$(cat /tmp/ma.json)"
R client map b.img --session tp -o json >/tmp/mb.json
check tcp-map-b $? "$(cat /tmp/mb.json)"
da=$(python3 -c 'import json; print(json.load(open("/tmp/ma.json"))["block_device"] or "")')
db=$(python3 -c 'import json; print(json.load(open("/tmp/mb.json"))["block_device"] or "")')
[ -b "$da" ] && [ -b "$db" ]; check tcp-block-devices $? "($da $db)"
streams() { # PATTERN DEVICE: four 8 MiB quarters written and read back at once
	local q pids=() rc=0
	for q in 0 1 2 3; do
		( dd if="$1" of="$2" bs=64k skip=$((q * 128)) seek=$((q * 128)) count=128 \
			oflag=direct conv=notrunc status=none &&
		  dd if="$2" of="$1.$q" bs=64k skip=$((q * 128)) count=128 iflag=direct \
			status=none &&
		  dd if="$1" of="$1.want$q" bs=64k skip=$((q * 128)) count=128 status=none &&
		  cmp "$1.want$q" "$1.$q" ) &
		pids+=($!)
	done
	for q in "${pids[@]}"; do wait "$q" || rc=1; done
	return $rc
}
head -c $((32 << 20)) /dev/urandom >/tmp/pa
head -c $((32 << 20)) /dev/urandom >/tmp/pb
streams /tmp/pa "$da" & PA=$!
streams /tmp/pb "$db" & PB=$!
wait $PA; ra=$?
wait $PB; rb=$?
[ $ra -eq 0 ] && [ $rb -eq 0 ]; check tcp-two-devices-read-back-equal $? "(a $ra, b $rb)"
cmp /tmp/pa /tmp/exports2/a.img && cmp /tmp/pb /tmp/exports2/b.img
check tcp-server-files-hold-patterns $?
np=$(grep -c "queue thread polls the session's completions" "$CLOG")
[ "$np" -eq 1 ]; check tcp-one-queue-thread-polls $? "($np in $CLOG)"
R client unmap a.img --session tp >/dev/null && R client unmap b.img --session tp >/dev/null
check tcp-unmap $?

# The server frozen under a write, fast_io_fail_ms 10 min: SIGTERM ends
# rnbd-clientd within 5 s, the write fails (EIO), the block device goes.
R client map a.img --session fz --server 127.0.0.1:1235 --provider tcp \
	--fast-io-fail-ms 600000 -o json >/tmp/mf.json
check frozen-map $? "$(cat /tmp/mf.json)"
df=$(python3 -c 'import json; print(json.load(open("/tmp/mf.json"))["block_device"] or "")')
kill -STOP "$S2PID"
dd if=/dev/zero of="$df" bs=64k count=256 oflag=direct status=none 2>/tmp/dd.err &
DD=$!
sleep 2
t0=$(date +%s%3N)
kill "$CPID"
wait_for 10 bash -c "! kill -0 $CPID 2>/dev/null"
t=$(($(date +%s%3N) - t0))
[ "$t" -lt 5000 ]; check stop-with-server-frozen-under-io-within-5s $? "($t ms)"
wait "$CPID"; check stop-with-server-frozen-exit-0 $?
wait "$DD"; ddrc=$?
[ "$ddrc" -ne 0 ] && grep -q "Input/output error" /tmp/dd.err
check frozen-write-fails-eio $? "(dd exit $ddrc: $(head -c 200 /tmp/dd.err))"
[ ! -b "$df" ]; check frozen-block-device-gone $?
kill -CONT "$S2PID"
kill "$S2PID"

kill "$CPID" "$SPID"; wait
dmesg | grep -E 'BUG:|Oops|Call Trace' >/tmp/oops; [ ! -s /tmp/oops ]; check kernel-log-clean $?
# In a sanitizer build, the daemons' reports would be in their logs.
! grep -lE 'ERROR: (Address|Leak|Thread)Sanitizer|runtime error:' /tmp/s.log /tmp/s2.log /tmp/c*.log
check no-sanitizer-report $?
echo "--- clientd logs"; tail -n 8 /tmp/c1.log "$CLOG"
GUEST

# The build folder too: a guest has its own /tmp, where a checkout may be.
out=$("$vm" run --bpo --rdma rxe --timeout 900 --mem 1536 --share-ro "$logs" --share-ro "$build" -- \
	bash "$logs/guest.sh" "$build" 2>&1)
rc=$?
passed=0 failed=0
while read -r _ name st detail; do
	if [ "$st" = ok ]; then
		echo "ok   ublk: $name $detail"
		passed=$((passed + 1))
	else
		echo "FAIL ublk: $name $detail"
		failed=$((failed + 1))
	fi
done < <(grep '^CHECK ' <<<"$out")
grep -v '^CHECK ' <<<"$out" | sed 's/^/  /' | tail -n 30
if [ "$passed" -eq 0 ] || [ "$rc" -eq 125 ]; then
	echo "FAIL ublk: the guest gave no result (exit $rc)"
	failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
