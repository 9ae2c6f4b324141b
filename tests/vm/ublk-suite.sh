#!/usr/bin/env bash
# The ublk suite: rnbd-clientd's mapped devices as real block devices, in a
# QEMU guest booted with Debian's 6.12 backports kernel and ublk_drv
# ('rtrs-vm image --bpo'; RTRS_VM_BPO=trixie-backports runs it on Linux 7.x),
# rnbd-server in the same guest over soft-RoCE
# (the native RDMA fabric):
#   - map a 64 MiB file export: /dev/ublkbN of 64 MiB, its block size and
#     largest IO from the server's answer;
#   - a 64 MiB random pattern written (O_DIRECT) and read back equal; the
#     server's file holds it; a discard and a write zeroes read back as
#     zeros, on the device and in the server's file, the rest intact;
#   - mkfs.ext4, mount, files written and synced; rnbd-server SIGKILLed and
#     started again under the mounted file system: IO resumes (more files),
#     every file intact; unmount, fsck -n clean;
#   - a normal unmap of a mounted device is refused (EBUSY), and of one
#     that a process has open (an ordinary open, no O_EXCL); a forced one
#     of the open device is done at once, its character device freed at
#     the close;
#   - client save, rnbd-clientd stopped (its devices go) and started again:
#     the mapping is restored (after its socket is up), the file system
#     mounts and its files are intact; unmap removes /dev/ublkbN;
#   - polled completions, over tcp on loopback: two devices of one session
#     written and read back at once, four streams each, equal, and one
#     queue thread polls the session for both;
#   - rnbd-clientd stopped (SIGTERM, --on-stop remove) with its server
#     frozen (SIGSTOP) under a write, fast_io_fail_ms 600000: it ends
#     within 5 s, the write fails with EIO, the block device is gone;
#   - block devices that outlive the daemon (in a guest of their own): ext4
#     under fio --verify (4 KiB random writes, QD 16), rnbd-clientd killed (SIGKILL) at 20 random
#     moments and 3 times stopped (SIGTERM, handover), started again each
#     time: the device is taken over, its node and its stable name
#     (/dev/rnbd/SESSION/DEVICE) never go, fio ends with no error or bad
#     block, fsck is clean; a path added before the kills is in the
#     record and in the session of every daemon that takes over; unmap
#     removes device, record and name; a daemon killed between a new
#     device's record and its START_DEV: the next one deletes the device
#     that never started, and its record; one killed right after ADD_DEV
#     (no record): the next one deletes the device by its mark and its
#     dead adder, and a map works after; a device whose adder (a daemon
#     of another runtime dir, stopped mid-add) lives is left until that
#     one dies, and an unmarked one (another program's) is left alone; a
#     handover stop while an unmap of an open device is refused hands
#     that device over too;
#   - fenced reissue: a slow backend (dm-delay, writes held 500 ms),
#     sixteen writers stamping generation numbers, the daemon killed with
#     writes held, 20 runs: no block reads back older than its last
#     written generation; a device whose server stays away is removed
#     after --recover-timeout, its IO failed;
#   - md RAID1 (internal bitmap) over block devices from two servers under
#     fio --verify: a server killed, then its link cut, then killed again
#     with rnbd-clientd killed mid-resync: the leg is marked faulty in
#     bounded time, IO goes on, the leg is re-added and resynced from the
#     bitmap, a check finds 0 mismatches, fio ends clean.
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
	echo "ublk: cannot build the guest image (rtrs-vm image --bpo)"
	echo "0 passed, 1 failed, 0 skipped"
	exit 1
fi

cat >"$logs/guest.sh" <<'GUEST'
# In the guest: $1 the build folder, $2 the part (main, recovery). Prints
# "CHECK name ok|FAIL detail".
B=$1 PART=${2:-main}
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
clientd() { # [OPTION...]: each start its own log: "ready" is this one's
	CLOG=/tmp/c$((++NC)).log
	"$B/daemons/rnbd-clientd" --control /tmp/c.sock --mappings /tmp/maps.json \
		--runtime-dir /tmp/rt --log-level info "$@" >"$CLOG" 2>&1 &
	CPID=$!
	wait_for 60 grep -q 'rnbd-clientd ready' "$CLOG"
}
NC=0
takeover_ms=()
restart_cycle() { # SIGNAL: the daemon stopped so, a new one started; the takeover's time
	local t0 t1
	t0=$(date +%s%3N)
	kill "-$1" "$CPID"; wait "$CPID" 2>/dev/null
	clientd || return 1
	wait_for 60 grep -q 'taken over: its IO goes on' "$CLOG" || return 1
	t1=$(date +%s%3N)
	takeover_ms+=($((t1 - t0)))
}
SFX=
if [ "$PART" = recovery ]; then
SFX=-recovery
mkdir -p /tmp/mnt
# Block devices that outlive rnbd-clientd (ublk user recovery): ext4 on a
# mapped device under fio --verify (random 4 KiB writes, QD 16, each block
# verified soon after it is written); rnbd-clientd killed (SIGKILL) at 20
# random moments and started again each time: the new one takes the block
# device over (its record in --runtime-dir), the device node never goes,
# fio ends with no error and no bad block, fsck is clean. Then planned
# restarts (SIGTERM, --on-stop handover, then a new daemon: what a
# package upgrade's restart does) under the same fio.
server; check recovery-server-started $?
rm -f /tmp/maps.json # the file's mapping of disk.img is not restored here
clientd; check recovery-clientd-started $?
R client map disk.img --session rc --server 198.18.0.1 --provider verbs \
	--fast-io-fail-ms 60000 -o json >/tmp/mr.json
check recovery-map $? "$(cat /tmp/mr.json)"
dr=$(python3 -c 'import json; print(json.load(open("/tmp/mr.json"))["block_device"] or "")')
[ -f "/tmp/rt/$(basename "$dr").json" ]; check recovery-record-written $? "(/tmp/rt)"
# A path added at run time: the record follows, so every daemon that takes
# the device over below opens the session with both paths.
R client path add rc 198.18.0.1 >/dev/null &&
	python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))["mapping"]
assert m["server"] == ["198.18.0.1:1234"] * 2, m["server"]' "/tmp/rt/$(basename "$dr").json"
check recovery-record-follows-path-add $? "($(cat "/tmp/rt/$(basename "$dr").json"))"
[ "$(readlink /dev/rnbd/rc/disk.img)" = "$dr" ]
check stable-name-link $? "(/dev/rnbd/rc/disk.img -> $(readlink /dev/rnbd/rc/disk.img))"
mkfs.ext4 -q -F "$dr" && mount "$dr" /tmp/mnt; check recovery-mount $?
rm -f /tmp/gone
( while [ -b "$dr" ]; do sleep 0.05; done; echo "$(date +%s.%N)" >/tmp/gone ) &
WATCH=$!
# At most 200 IOs a second each way (unlimited, some 700 writes a second
# ran here): Debian's 6.12.95 crashes when the daemon is killed as a
# request is being handed to it (a NULL pointer dereference in
# io_fallback_tw as the killed queue thread exits, then an RCU stall: a
# request completed twice, by the queue's cancel and by its task work);
# at the unlimited rate that took the guest down in most runs of this
# section, and fewer requests handed over make it rarer, not gone.
fio --name=rcv --filename=/tmp/mnt/fio.dat --size=16M --rw=randwrite --bs=4k \
	--iodepth=16 --ioengine=libaio --direct=1 --verify=crc32c --verify_backlog=256 \
	--verify_fatal=1 --rate_iops=200 --time_based --runtime=900 --output=/tmp/fio.out \
	>/dev/null 2>&1 &
FIO=$!
sleep 2
# A damaged record beside the real one (a null device name): each start
# names it and leaves it; it took the daemon down through a NULL strcmp.
echo '{"ublk": 999, "pid": 1, "mapping": {"device": null, "session": "rc"}}' \
	>/tmp/rt/ublkb999.json
ok=0
for i in $(seq 20); do
	sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
	restart_cycle KILL || break
	kill -0 "$FIO" 2>/dev/null || break
	ok=$i
done
[ "$ok" -eq 20 ]; check recovery-20-kills-taken-over $? "($ok of 20; ms: ${takeover_ms[*]})"
grep -q 'ublkb999.json: its mapping is not one client.map takes' "$CLOG" &&
	[ -e /tmp/rt/ublkb999.json ]
check recovery-damaged-record-named $? "($(grep ublkb999 "$CLOG" | head -2))"
rm -f /tmp/rt/ublkb999.json
R client list sessions -o json >/tmp/rcs.json &&
	python3 -c 'import json, sys
s = [x for x in json.load(open(sys.argv[1])) if x["name"] == "rc"]
assert len(s) == 1 and len(s[0]["paths"]) == 2, s' /tmp/rcs.json
check recovery-takeover-keeps-added-path $? "($(head -c 600 /tmp/rcs.json))"
okp=0
for i in 1 2 3; do
	sleep 1
	restart_cycle TERM || break
	grep -q 'handed over to the next rnbd-clientd' "/tmp/c$((NC - 1)).log" || break
	okp=$i
done
[ "$okp" -eq 3 ]; check recovery-3-planned-restarts $? "(${takeover_ms[*]:20})"
sleep 3
kill -INT "$FIO"; wait "$FIO"; frc=$? # 128: "terminating on signal", the one sent
errs=$(grep -c 'err= 0' /tmp/fio.out)
{ [ "$frc" -eq 0 ] || [ "$frc" -eq 128 ]; } && [ "$errs" -eq 1 ] &&
	! grep -qiE 'verify failed|bad magic|bad header|mismatch' /tmp/fio.out
check recovery-fio-verify-clean $? "(exit $frc; $(grep -E 'err=|WRITE:' /tmp/fio.out | head -3 | tr '\n' ' '))"
kill "$WATCH" 2>/dev/null; wait "$WATCH" 2>/dev/null
[ ! -e /tmp/gone ]; check recovery-device-node-never-gone $?
[ "$(readlink /dev/rnbd/rc/disk.img)" = "$dr" ]; check stable-name-after-takeovers $?
umount /tmp/mnt; check recovery-umount $?
fsck.ext4 -n "$dr" >/tmp/fsck2.log 2>&1; check recovery-fsck-clean $? "($(tail -n1 /tmp/fsck2.log))"
echo "takeover-ms ${takeover_ms[*]}"
# A kernel whose ublk cannot change a live device's size (before 6.16:
# 6.12) refuses the resize by name and the device keeps its 64 MiB; one
# that can (UBLK_F_UPDATE_SIZE) takes it to 32 MiB and back.
R client resize disk.img 32M --session rc >/dev/null 2>/tmp/resize.err; rrc=$?
rsz=$(blockdev --getsize64 "$dr")
if [ "$(uname -r | awk -F. '{print $1 * 1000 + $2}')" -lt 6016 ]; then
	[ $rrc -eq 1 ] && grep -q 'UBLK_F_UPDATE_SIZE' /tmp/resize.err && [ "$rsz" -eq 67108864 ]
else
	[ $rrc -eq 0 ] && [ "$rsz" -eq 33554432 ] &&
		R client resize disk.img 64M --session rc >/dev/null 2>>/tmp/resize.err &&
		rsz="$rsz, then $(blockdev --getsize64 "$dr")" &&
		[ "$(blockdev --getsize64 "$dr")" -eq 67108864 ]
fi
check resize-as-the-kernel-allows $? "(exit $rrc; $rsz bytes; $(cat /tmp/resize.err))"
R client unmap disk.img --session rc >/dev/null; check recovery-unmap $?
[ ! -b "$dr" ] && [ ! -e "/tmp/rt/$(basename "$dr").json" ] && [ ! -e /dev/rnbd/rc ]
check recovery-unmap-removes-device-record-and-name $?
kill "$CPID"; wait "$CPID"
else
server; check server-started $?
clientd --on-stop remove; check clientd-started $?
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
clientd --on-stop remove; check clientd-restarted $?
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
exec 7<"$dev" # an ordinary open (no O_EXCL), as qemu or dd has it
R client unmap disk.img 2>/tmp/unmap.err
[ $? -eq 1 ] && grep -q 'is open in process' /tmp/unmap.err
check unmap-of-open-refused $? "($(cat /tmp/unmap.err))"
# Forced while still open: done at once (ublk's DEL_DEV waits for the last
# close; the asynchronous delete does not), the block device gone; its
# character device goes with the close.
cid=$(basename "$dev")
cid=${cid#ublkb}
t0=$(date +%s%3N)
"$B/tools/rnbd" --socket /tmp/c.sock --timeout 15000 client unmap disk.img --force >/dev/null
urc=$?
unmap_ms=$(($(date +%s%3N) - t0))
[ "$urc" -eq 0 ] && [ ! -b "$dev" ]
check unmap-force-of-open-device $? "(exit $urc after $unmap_ms ms)"
exec 7<&-
wait_for 20 sh -c "[ ! -e /sys/class/ublk-char/ublkc$cid ]"
check unmap-force-device-freed-at-close $? "($(ls /sys/class/ublk-char 2>&1))"

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
rm -f /tmp/maps.json # the saved mapping of disk.img is not restored below

# A daemon killed the instant a new block device started, before the map
# listed it (a test build's RNBD_CLIENTD_FAULT): the device's record was
# written before START_DEV, so the next daemon takes it over and its IO
# goes on (written after, there was none: a device no daemon serves).
export RNBD_CLIENTD_FAULT=kill-after-start
clientd; check early-record-clientd-started $?
unset RNBD_CLIENTD_FAULT
R client map disk.img --session ks --server 198.18.0.1 --provider verbs >/dev/null 2>&1
wait "$CPID" 2>/dev/null; krc=$?
kr=$(ls /tmp/rt/ublkb*.json 2>/dev/null | head -n1)
kd=/dev/$(basename "${kr:-none}" .json)
[ "$krc" -eq 137 ] && [ -n "$kr" ] && [ -b "$kd" ]
check early-record-written-before-start $? "(exit $krc; record ${kr:-none}; $(ls /dev/ublkb* 2>/dev/null))"
printf 'early-record-%.0s' $(seq 400) | head -c 4096 >/tmp/ks.blk
( dd if=/tmp/ks.blk of="$kd" bs=4096 seek=3 oflag=direct conv=notrunc 2>/tmp/ks.err ) &
KDD=$!
clientd; check early-record-clientd-again $?
wait_for 60 grep -q 'taken over: its IO goes on' "$CLOG" && wait "$KDD" &&
	dd if="$kd" of=/tmp/ks.dev bs=4096 skip=3 count=1 iflag=direct 2>/dev/null &&
	dd if=/tmp/exports/disk.img of=/tmp/ks.srv bs=4096 skip=3 count=1 2>/dev/null &&
	cmp /tmp/ks.dev /tmp/ks.blk && cmp /tmp/ks.srv /tmp/ks.blk
check early-record-device-taken-over-io-goes-on $? "($(grep -E 'ublkb|ks' "$CLOG" | tail -3 | \
	tr '\n' ' ') $(cat /tmp/ks.err))"
R client unmap disk.img --session ks >/dev/null &&
	[ ! -b "$kd" ] && [ ! -e "$kr" ]
check early-record-unmap $?
kill "$CPID"; wait "$CPID"

# A daemon killed after its new device's record and before START_DEV: the
# device was added and never started (no block device; its ADD_DEV carried
# the daemon's pid). The next daemon deletes it with its record: left, it
# kept its number and its character device for good.
export RNBD_CLIENTD_FAULT=kill-before-start
clientd; check never-started-clientd-started $?
unset RNBD_CLIENTD_FAULT
R client map disk.img --session ns --server 198.18.0.1 --provider verbs >/dev/null 2>&1
wait "$CPID" 2>/dev/null; nrc=$?
nr=$(ls /tmp/rt/ublkb*.json 2>/dev/null | head -n1)
nid=$(basename "${nr:-none}" .json)
nid=${nid#ublkb}
[ "$nrc" -eq 137 ] && [ -n "$nr" ] && [ -e "/sys/class/ublk-char/ublkc$nid" ] &&
	[ ! -b "/dev/ublkb$nid" ]
check never-started-device-left $? "(exit $nrc; record ${nr:-none}; $(ls /sys/class/ublk-char 2>&1))"
clientd; check never-started-clientd-again $?
grep -q "ublkb$nid: added by pid [0-9]*, which died before starting it: deleted" "$CLOG" &&
	[ ! -e "/sys/class/ublk-char/ublkc$nid" ] && [ ! -e "$nr" ]
check never-started-device-deleted $? "($(grep "ublkb$nid" "$CLOG" | tail -2 | tr '\n' ' ') \
$(ls /sys/class/ublk-char 2>&1))"
kill "$CPID"; wait "$CPID"

# A daemon killed right after ADD_DEV, before its record (during
# SET_PARAMS or the queue's start): a device never started that no record
# names. The next daemon finds it by its mark (ublksrv_flags) and by the
# adder's pid, which is gone, and deletes it; a map afterwards works.
ublkc_new() { # the number of a ublk character device listed now and not in $1
	local c
	for c in $(ls /sys/class/ublk-char 2>/dev/null); do
		case " $1 " in *" $c "*) ;; *) echo "${c#ublkc}"; return ;; esac
	done
}
ub0=$(ls /sys/class/ublk-char 2>/dev/null | tr '\n' ' ')
export RNBD_CLIENTD_FAULT=kill-after-add
clientd; check unrecorded-clientd-started $?
unset RNBD_CLIENTD_FAULT
R client map disk.img --session ua --server 198.18.0.1 --provider verbs >/dev/null 2>&1
wait "$CPID" 2>/dev/null; arc=$?
aid=$(ublkc_new "$ub0")
[ "$arc" -eq 137 ] && [ -n "$aid" ] && [ ! -e "/tmp/rt/ublkb$aid.json" ] && [ ! -b "/dev/ublkb$aid" ]
check unrecorded-device-left $? "(exit $arc; ublkc${aid:-none}; $(ls /sys/class/ublk-char /tmp/rt 2>&1 | \
	tr '\n' ' '))"
clientd; check unrecorded-clientd-again $?
grep -qE "ublkb$aid: added by (pid [0-9]+|a process the kernel no longer names \(gone\)), which died before recording and starting it: deleted" \
	"$CLOG" && wait_for 5 sh -c "[ ! -e /sys/class/ublk-char/ublkc$aid ] && [ ! -e /dev/ublkc$aid ]"
check unrecorded-device-deleted $? "($(grep "ublkb$aid" "$CLOG" | tail -2 | tr '\n' ' ') \
$(ls /sys/class/ublk-char 2>&1 | tr '\n' ' '))"
R client map disk.img --session ua --server 198.18.0.1 --provider verbs -o json >/tmp/ua.json
check unrecorded-map-after $? "$(cat /tmp/ua.json)"
uad=$(python3 -c 'import json; print(json.load(open("/tmp/ua.json"))["block_device"] or "")')
[ -b "$uad" ] && dd if="$uad" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null &&
	R client unmap disk.img --session ua >/dev/null && [ ! -b "$uad" ]
check unrecorded-map-after-works $? "($uad)"
kill "$CPID"; wait "$CPID"

# An rnbd-clientd of another --runtime-dir (its own socket) stopped in the
# middle of an add (SIGSTOP right after ADD_DEV): its device is dead and
# recorded nowhere here, but its adder lives (the kernel names its pid, or,
# a kernel that names none before START_DEV, its add lock is held), so a
# daemon starting now leaves it. Once the adder is killed, the next daemon
# deletes it.
ub0=$(ls /sys/class/ublk-char 2>/dev/null | tr '\n' ' ')
RNBD_CLIENTD_FAULT=stop-after-add "$B/daemons/rnbd-clientd" --control /tmp/c2.sock \
	--runtime-dir /tmp/rt2 --log-level info >/tmp/c2.log 2>&1 &
C2=$!
wait_for 60 grep -q 'rnbd-clientd ready' /tmp/c2.log; check live-adder-clientd-started $?
"$B/tools/rnbd" --socket /tmp/c2.sock --timeout 120000 client map disk.img --session la \
	--server 198.18.0.1 --provider verbs >/dev/null 2>&1 &
LMAP=$!
wait_for 30 grep -q '^State:.T' "/proc/$C2/status"
lid=$(ublkc_new "$ub0")
[ -n "$lid" ]; check live-adder-device-added $? "($(grep State "/proc/$C2/status"); \
$(ls /sys/class/ublk-char 2>&1 | tr '\n' ' '))"
clientd; check live-adder-clientd-here $?
[ -e "/sys/class/ublk-char/ublkc$lid" ] &&
	grep -qE "ublkb$lid: (added by pid $C2 and not started, not recorded here; pid $C2 runs|not started, not recorded here, and the kernel names no pid for its adder; the add lock is not ours \(another process holds it)" "$CLOG"
check live-adder-device-left $? "($(grep "ublkb$lid" "$CLOG" | tail -2 | tr '\n' ' '))"
kill "$CPID"; wait "$CPID"
kill -KILL "$C2"; wait "$C2" 2>/dev/null; wait "$LMAP" 2>/dev/null
clientd; check live-adder-clientd-after $?
grep -qE "ublkb$lid: added by (pid $C2|a process the kernel no longer names \(gone\)), which died before recording and starting it: deleted" \
	"$CLOG" && wait_for 5 sh -c "[ ! -e /sys/class/ublk-char/ublkc$lid ]"
check live-adder-device-deleted-after-its-death $? "($(grep "ublkb$lid" "$CLOG" | tail -2 | \
	tr '\n' ' '))"
kill "$CPID"; wait "$CPID"

# A device of another program (added unmarked, ublksrv_flags 0, by a
# daemon killed right after ADD_DEV: dead, never started, its adder gone)
# is left alone; it stays until the guest ends.
ub0=$(ls /sys/class/ublk-char 2>/dev/null | tr '\n' ' ')
export RNBD_CLIENTD_FAULT=kill-after-add-foreign
clientd; check foreign-clientd-started $?
unset RNBD_CLIENTD_FAULT
R client map disk.img --session fa --server 198.18.0.1 --provider verbs >/dev/null 2>&1
wait "$CPID" 2>/dev/null; frc=$?
fid=$(ublkc_new "$ub0")
clientd; check foreign-clientd-again $?
[ "$frc" -eq 137 ] && [ -n "$fid" ] && [ -e "/sys/class/ublk-char/ublkc$fid" ] &&
	! grep -q "ublkb$fid" "$CLOG"
check foreign-device-left-alone $? "(exit $frc; ublkc${fid:-none}; $(grep "ublkb$fid" "$CLOG" | \
	tail -2 | tr '\n' ' '))"
kill "$CPID"; wait "$CPID"

# A handover stop while an unmap of an open block device is under way: the
# unmap is refused (the device is open), and the stop hands the device
# over like the others (it waited for the request; it used to remove the
# device once the refused unmap let go of it). The next daemon takes it.
clientd; check unmap-stop-clientd-started $?
R client map disk.img --session us --server 198.18.0.1 --provider verbs -o json >/tmp/us.json
check unmap-stop-map $? "$(cat /tmp/us.json)"
ud=$(python3 -c 'import json; print(json.load(open("/tmp/us.json"))["block_device"] or "")')
exec 8<"$ud"
R client unmap disk.img --session us >/dev/null 2>/tmp/us.err &
UPID=$!
sleep 0.3
kill -TERM "$CPID"; wait "$CPID"; crc=$?
wait "$UPID"; urc=$?
[ "$crc" -eq 0 ] && [ "$urc" -ne 0 ] && [ -b "$ud" ] && [ -e "/tmp/rt/$(basename "$ud").json" ]
check unmap-stop-device-handed-over $? "(stop $crc, unmap $urc: $(cat /tmp/us.err); \
$(grep -E 'us|handed' "$CLOG" | tail -3 | tr '\n' ' '))"
exec 8<&-
clientd; check unmap-stop-clientd-again $?
wait_for 60 grep -q 'taken over: its IO goes on' "$CLOG" &&
	dd if="$ud" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null
check unmap-stop-device-taken-over $? "($(grep -E "$(basename "$ud")" "$CLOG" | tail -2 | tr '\n' ' '))"
R client unmap disk.img --session us >/dev/null && [ ! -b "$ud" ]
check unmap-stop-unmap $?
kill "$CPID"; wait "$CPID"

# A handover while the server does not answer (stopped) and every IO slot
# of the session is taken (two devices of queue depth 15 on a session of
# 15 slots, fio at depth 32 on each): the stop ends within its bound (the
# queue threads never sleep in the library's slot wait; one used to, until
# fast_io_fail_ms, 60 s here). The server goes on, a new daemon takes
# both devices over, and fio ends without an error.
mkdir -p /tmp/exports3
head -c $((16 << 20)) /dev/zero >/tmp/exports3/h1.img
head -c $((16 << 20)) /dev/zero >/tmp/exports3/h2.img
"$B/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1237 -s /tmp/exports3 -q 16 \
	--log-level info >/tmp/sh.log 2>&1 &
SHPID=$!
wait_for 60 grep -q 'listening on port' /tmp/sh.log
clientd; check slots-clientd-started $?
R client map h1.img --session hs --server 127.0.0.1:1237 --provider tcp \
	--fast-io-fail-ms 60000 -o json >/tmp/h1.json &&
	R client map h2.img --session hs -o json >/tmp/h2.json
check slots-two-devices-one-session $? "$(cat /tmp/h1.json /tmp/h2.json)"
h1=$(python3 -c 'import json; print(json.load(open("/tmp/h1.json"))["block_device"] or "")')
h2=$(python3 -c 'import json; print(json.load(open("/tmp/h2.json"))["block_device"] or "")')
# The slots shared fairly: both devices at depth 32 on the 15 slots for
# 5 s, neither starved (each at least a third of the other's IO/s).
for n in 1 2; do
	eval "dev=\$h$n"
	fio --name=f$n --filename="$dev" --rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio \
		--direct=1 --time_based --runtime=5 --output-format=json --output=/tmp/fair$n.json \
		>/dev/null 2>&1 &
	eval "FF$n=\$!"
done
wait "$FF1" && wait "$FF2" && python3 -c '
import json
a, b = (json.load(open("/tmp/fair%d.json" % n))["jobs"][0]["write"]["iops"] for n in (1, 2))
print("iops %.0f %.0f" % (a, b))
assert min(a, b) > 0 and min(a, b) >= max(a, b) / 3' >/tmp/fair.out 2>&1
check slots-shared-fairly $? "($(tail -n1 /tmp/fair.out))"
fio --name=a --filename="$h1" --rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio \
	--direct=1 --time_based --runtime=40 --output=/tmp/fio-h1.out >/dev/null 2>&1 &
F1=$!
fio --name=b --filename="$h2" --rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio \
	--direct=1 --time_based --runtime=40 --output=/tmp/fio-h2.out >/dev/null 2>&1 &
F2=$!
sleep 2
kill -STOP "$SHPID"
sleep 1
t0=$(date +%s%3N)
kill -TERM "$CPID"; wait "$CPID"; crc=$?
stop_ms=$(($(date +%s%3N) - t0))
[ "$crc" -eq 0 ] && [ "$stop_ms" -lt 10000 ] && [ -b "$h1" ] && [ -b "$h2" ]
check slots-full-server-stopped-handover-within-bound $? "(exit $crc after $stop_ms ms; \
$(grep -E 'handed over|stop' "$CLOG" | tail -2 | tr '\n' ' '))"
kill -CONT "$SHPID"
clientd; check slots-clientd-again $?
wait_for 60 sh -c "[ \$(grep -c 'taken over: its IO goes on' '$CLOG') -eq 2 ]"
check slots-both-taken-over $? "($(grep -E 'taken over|hs' "$CLOG" | tail -4 | tr '\n' ' '))"
wait "$F1"; f1=$?
wait "$F2"; f2=$?
[ "$f1" -eq 0 ] && [ "$f2" -eq 0 ] && grep -q 'err= 0' /tmp/fio-h1.out &&
	grep -q 'err= 0' /tmp/fio-h2.out
check slots-fio-ends-clean $? "(exit $f1 $f2; $(grep -h 'err=' /tmp/fio-h1.out /tmp/fio-h2.out | \
	tr '\n' ' '))"
R client unmap h1.img --session hs >/dev/null && R client unmap h2.img --session hs >/dev/null
check slots-unmap $?

# Every slot taken and requests waiting for one when the server dies,
# with fast_io_fail_ms 0: the slots of the requests that failed with the
# path stay quarantined until it is fenced or back, and the requests
# waiting for a slot must fail as a request without a path does (fio ends
# with errors within the bound, the devices unmap). They waited for a slot
# for as long as the server stayed away, and fio and the unmap hung.
R client map h1.img --session hz --server 127.0.0.1:1237 --provider tcp \
	--fast-io-fail-ms 0 --reconnect-delay-ms 60000 -o json >/tmp/z1.json &&
	R client map h2.img --session hz -o json >/tmp/z2.json
check slots-no-path-mapped $? "$(cat /tmp/z1.json /tmp/z2.json)"
z1=$(python3 -c 'import json; print(json.load(open("/tmp/z1.json"))["block_device"] or "")')
z2=$(python3 -c 'import json; print(json.load(open("/tmp/z2.json"))["block_device"] or "")')
for n in 1 2; do
	eval "dev=\$z$n"
	fio --name=z$n --filename="$dev" --rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio \
		--direct=1 --time_based --runtime=120 --output=/tmp/fio-z$n.out >/dev/null 2>&1 &
	eval "FZ$n=\$!"
done
sleep 2
t0=$(date +%s%3N)
kill -KILL "$SHPID"; wait "$SHPID" 2>/dev/null
wait_for 20 sh -c "! kill -0 $FZ1 2>/dev/null && ! kill -0 $FZ2 2>/dev/null"
ended=$?
end_ms=$(($(date +%s%3N) - t0))
check slots-no-path-fio-ends-within-bound $ended "($end_ms ms; \
$(grep -h 'err=' /tmp/fio-z1.out /tmp/fio-z2.out 2>/dev/null | tr '\n' ' '))"
[ $ended -eq 0 ] || kill -KILL "$FZ1" "$FZ2" 2>/dev/null
wait "$FZ1" "$FZ2" 2>/dev/null
timeout 30 "$B/tools/rnbd" --socket /tmp/c.sock --timeout 20000 client unmap h1.img --session hz \
	--force >/dev/null &&
	timeout 30 "$B/tools/rnbd" --socket /tmp/c.sock --timeout 20000 client unmap h2.img \
		--session hz --force >/dev/null
check slots-no-path-unmap $?
kill "$CPID"; wait "$CPID"

# Fenced reissue: a slow backend (dm-delay: every write held 500 ms) under
# rnbd-server over tcp; sixteen writers stamp a block each with generation
# numbers, each block's next generation written once its last one is done;
# rnbd-clientd is killed while writes are held, and its successor maps the
# same blocks without the delay (device-mapper "fast"; its record pointed
# there), so its writes do not queue behind the dead daemon's. The writers
# stop by themselves after two quick writes each (the successor's), and the
# blocks are read back once any held write would have landed. The server
# admits the successor's session only once the dead one's writes are
# finished, so no block reads back older than the last generation written
# to it, 20 runs. Without that wait (the server's takeover check made to
# proceed at once) 8 of 20 runs read back the dead daemon's generation 1
# over the successor's 3.
cat >/tmp/gen.py <<'PY'
import json, mmap, os, struct, sys, threading, time
B = 4096
def write(dev, nblocks, nthreads, stop, out, hold):
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    done, errors = [0] * nblocks, []
    def worker(t):
        buf, g, quick = mmap.mmap(-1, B), 0, 0
        while quick < 2 and not os.path.exists(stop):
            g += 1
            for b in range(t, nblocks, nthreads):
                buf.seek(0)
                buf.write(struct.pack("<QQ", b, g) * (B // 16))
                t0 = time.monotonic()
                try:
                    os.pwritev(fd, [buf], b * B)
                except OSError as e:
                    errors.append("block %d generation %d: %s" % (b, g, e))
                    return
                done[b] = g
                # Two writes in a row that were not held: the successor's.
                quick = quick + 1 if time.monotonic() - t0 < hold / 2 else 0
    ts = [threading.Thread(target=worker, args=(t,)) for t in range(nthreads)]
    for t in ts: t.start()
    for t in ts: t.join()
    json.dump({"done": done, "errors": errors}, open(out, "w"))
def check(dev, state):
    st = json.load(open(state))
    fd, buf, bad = os.open(dev, os.O_RDONLY | os.O_DIRECT), mmap.mmap(-1, B), []
    for b, want in enumerate(st["done"]):
        os.preadv(fd, [buf], b * B)
        blk, g = struct.unpack_from("<QQ", buf, 0)
        if blk != b or g != want:
            bad.append("block %d: generation %d (block %d), last written %d" % (b, g, blk, want))
    print("; ".join(st["errors"] + bad[:4]) or "%d blocks, %d writes" % (len(st["done"]), sum(st["done"])))
    sys.exit(1 if st["errors"] or bad else 0)
if sys.argv[1] == "write":
    write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7]) / 1000)
else:
    check(sys.argv[2], sys.argv[3])
PY
HOLD=500
head -c $((16 << 20)) /dev/zero >/tmp/slow.img
lo=$(losetup -f --show /tmp/slow.img) &&
	dmsetup create slow --noudevsync --table "0 32768 delay $lo 0 0 $lo 0 $HOLD" &&
	dmsetup create fast --noudevsync --table "0 32768 linear $lo 0" &&
	dmsetup mknodes && [ -b /dev/mapper/slow ] && [ -b /dev/mapper/fast ]
check fence-slow-backend $? "(dm-delay over $lo: writes held $HOLD ms; fast: the same blocks)"
"$B/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1236 -s /dev/mapper \
	--log-level info >/tmp/s3.log 2>&1 &
S3PID=$!
wait_for 60 grep -q 'listening on port' /tmp/s3.log; check fence-server-started $?
clientd
R client map slow --session fence --server 127.0.0.1:1236 --provider tcp \
	--fast-io-fail-ms 60000 -o json >/tmp/ms.json
check fence-map $? "$(cat /tmp/ms.json)"
ds=$(python3 -c 'import json; print(json.load(open("/tmp/ms.json"))["block_device"] or "")')
fenced=0 details=""
for run in $(seq 20); do
	rm -f /tmp/gen.stop
	python3 /tmp/gen.py write "$ds" 16 16 /tmp/gen.stop /tmp/gen.json "$HOLD" &
	GW=$!
	sleep "0.$((RANDOM % 5 + 3))"
	t0=$(date +%s%3N)
	kill -KILL "$CPID"; wait "$CPID" 2>/dev/null
	# The successor writes straight to the blocks (fast), not behind the dead one's held writes.
	sed -i 's/"device":"slow"/"device":"fast"/' /tmp/rt/*.json
	clientd && wait_for 60 grep -q 'taken over: its IO goes on' "$CLOG" ||
		{ details="run $run: no takeover"; break; }
	takeover_ms+=($(($(date +%s%3N) - t0)))
	# The writers stop by themselves after two quick writes each (the
	# successor's), before a held write of the dead daemon could land.
	if ! wait_for 30 bash -c "! kill -0 $GW 2>/dev/null"; then
		touch /tmp/gen.stop; wait "$GW"
		details="run $run: the writers saw no quick write in 30 s"
		break
	fi
	wait "$GW"
	# A write of the dead daemon that was not fenced lands by now.
	sleep 1
	if ! out=$(python3 /tmp/gen.py check "$ds" /tmp/gen.json); then
		details="run $run: $out"
		break
	fi
	fenced=$run
	# Back to the slow device for the next run.
	R client unmap fast --session fence >/dev/null &&
		R client map slow --session fence --server 127.0.0.1:1236 --provider tcp \
		--fast-io-fail-ms 60000 -o json >/tmp/ms.json || { details="run $run: remap"; break; }
	ds=$(python3 -c 'import json; print(json.load(open("/tmp/ms.json"))["block_device"] or "")')
done
[ "$fenced" -eq 20 ]
check fence-20-kills-no-older-generation $? "($fenced of 20; ${details:-$out}; takeover ms \
${takeover_ms[*]}; the server waited for the dead session in \
$(grep -c 'taken over after' /tmp/s3.log) runs)"

# A device whose session cannot be opened again: rnbd-clientd killed, then
# its server; a write waits in the kernel; the next daemon, with
# --recover-timeout 3, tries for 3 s and then removes the block device:
# the write fails (EIO), the record and the stable name go.
kill -KILL "$CPID" "$S3PID"; wait "$CPID" "$S3PID" 2>/dev/null
dd if=/dev/zero of="$ds" bs=4k count=1 oflag=direct 2>/tmp/gu.err &
DD=$!
t0=$(date +%s%3N)
clientd --recover-timeout 3
wait_for 30 bash -c "[ ! -b $ds ]"; gone=$?
gone_ms=$(($(date +%s%3N) - t0))
wait "$DD"; ddrc=$?
[ "$gone" -eq 0 ] && [ "$gone_ms" -ge 3000 ] && [ "$ddrc" -ne 0 ] &&
	grep -q 'Input/output error' /tmp/gu.err && [ ! -e "/tmp/rt/$(basename "$ds").json" ] &&
	[ ! -e /dev/rnbd/fence ] && grep -q 'not mapped again after' "$CLOG"
check recover-timeout-removes-device $? "(gone ${gone_ms} ms after the start, dd exit $ddrc: \
$(grep -m1 -i error /tmp/gu.err); $(grep -m1 'not mapped again' "$CLOG" | cut -d' ' -f4-))"
kill "$CPID"; wait "$CPID"
dmsetup remove slow; dmsetup remove fast; losetup -d "$lo"

# md RAID1 across two servers (docs/management.md, "Past one server"): two
# rnbd-servers over tcp, a 32 MiB leg each, mapped by one rnbd-clientd with
# fast_io_fail_ms 2000; md RAID1 with an internal bitmap over both block
# devices, under fio --verify. Server A killed: md marks its leg faulty
# within fast_io_fail + 5 s and IO goes on; A back: the leg re-added, the
# bitmap resyncs, a check finds no mismatch. The same with A's link cut
# (nftables drops its port, nothing answers) instead of a kill; and with
# rnbd-clientd killed and taken over in the middle of the resync.
mkdir -p /tmp/md-a /tmp/md-b
head -c $((32 << 20)) /dev/zero >/tmp/md-a/leg.img
head -c $((32 << 20)) /dev/zero >/tmp/md-b/leg.img
mdserver() { # a|b PORT: the leg's server, started (again)
	"$B/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p "$2" -s "/tmp/md-$1" \
		--log-level info >>"/tmp/md-$1.log" 2>&1 &
	eval "MD_$1=$!"
	wait_for 60 grep -q "listening on port $2" "/tmp/md-$1.log"
}
mdserver a 1237 && mdserver b 1238; check md-servers-started $?
clientd
R client map leg.img --session mda --server 127.0.0.1:1237 --provider tcp \
	--fast-io-fail-ms 2000 --reconnect-delay-ms 500 -o json >/tmp/mda.json &&
	R client map leg.img --session mdb --server 127.0.0.1:1238 --provider tcp \
	--fast-io-fail-ms 2000 --reconnect-delay-ms 500 -o json >/tmp/mdb.json
check md-legs-mapped $?
la=$(python3 -c 'import json; print(json.load(open("/tmp/mda.json"))["block_device"] or "")')
lb=$(python3 -c 'import json; print(json.load(open("/tmp/mdb.json"))["block_device"] or "")')
mdadm --create /dev/md0 --run --level=1 --raid-devices=2 --bitmap=internal \
	--metadata=1.2 --failfast "$la" "$lb" >/tmp/mdadm.log 2>&1 && mdadm --wait /dev/md0
check md-raid1-created $? "($la $lb; $(tail -n1 /tmp/mdadm.log))"
fio --name=md --filename=/dev/md0 --size=16M --rw=randwrite --bs=4k --iodepth=16 \
	--ioengine=libaio --direct=1 --verify=crc32c --verify_backlog=256 --verify_fatal=1 \
	--time_based --runtime=900 --output=/tmp/fio-md.out >/dev/null 2>&1 &
MDFIO=$!
sleep 2
leg_state() { cat "/sys/block/md0/md/dev-$(basename "$1")/state" 2>/dev/null; }
faulty_within() { # LEG SECONDS: ms until md marks LEG faulty, or fail
	local t0 end
	t0=$(date +%s%3N); end=$((t0 + $2 * 1000))
	until leg_state "$1" | grep -q faulty; do
		[ "$(date +%s%3N)" -lt "$end" ] || return 1
		sleep 0.1
	done
	echo $(($(date +%s%3N) - t0))
}
leg_ready() { # SESSION LEG: its device open on its server again, and readable
	R client list devices -o json | python3 -c '
import json, sys
sys.exit(not [d for d in json.load(sys.stdin) if d["session"] == sys.argv[1] and d["state"] == "mapped"])
' "$1" 2>/dev/null && dd if="$2" of=/dev/null bs=4k count=1 iflag=direct status=none 2>/dev/null
}
leg_back() { wait_for 60 leg_ready "$@"; }
re_add() { # LEG: back in the array from its bitmap (re-added, not added anew)
	mdadm /dev/md0 --re-add --failfast "$1" >>/tmp/readd.err 2>&1 && grep -q 're-added' /tmp/readd.err
}
resync() { # LEG: back into the array, the bitmap's blocks copied, then a check
	leg_back mda "$1" || return 1
	mdadm /dev/md0 --remove "$1" >/tmp/readd.err 2>&1 || return 1 # it was faulty: out
	wait_for 60 re_add "$1" || return 1
	mdadm --wait /dev/md0
	wait_for 120 bash -c "grep -q 'idle' /sys/block/md0/md/sync_action" || return 1
	[ "$(cat /sys/block/md0/md/degraded)" = 0 ]
}
check_mismatch() { # a full check of both legs: 0 mismatches
	echo check >/sys/block/md0/md/sync_action
	sleep 1
	mdadm --wait /dev/md0
	wait_for 120 bash -c "grep -q 'idle' /sys/block/md0/md/sync_action" || return 1
	[ "$(cat /sys/block/md0/md/mismatch_cnt)" = 0 ]
}
# 1. Server A killed.
kill -KILL "$MD_a"; wait "$MD_a" 2>/dev/null
ms=$(faulty_within "$la" 7); check md-kill-leg-faulty-within-fast-io-fail-plus-5s $? "($ms ms)"
sleep 2
kill -0 "$MDFIO"; check md-io-goes-on-degraded $?
mdserver a 1237; check md-server-a-back $?
resync "$la"; check md-kill-leg-re-added-resynced $? "($(leg_state "$la"); degraded \
$(cat /sys/block/md0/md/degraded); $(grep -A2 '^md0' /proc/mdstat | tr '\n' ' '); \
$(tail -n 3 /tmp/readd.err | tr '\n' ' '))"
check_mismatch; check md-kill-check-no-mismatch $? "(mismatch_cnt $(cat /sys/block/md0/md/mismatch_cnt))"
# 2. Server A's link cut: its port silently dropped.
nft add table inet mdcut && nft add chain inet mdcut in '{ type filter hook input priority 0; }' &&
	nft add rule inet mdcut in tcp dport 1237 drop && nft add rule inet mdcut in tcp sport 1237 drop
check md-link-cut $?
ms=$(faulty_within "$la" 12); check md-cut-leg-faulty $? "($ms ms: heartbeats, then fast_io_fail)"
sleep 2
nft delete table inet mdcut; check md-link-restored $?
resync "$la"; check md-cut-leg-re-added-resynced $? "($(leg_state "$la"))"
check_mismatch; check md-cut-check-no-mismatch $? "(mismatch_cnt $(cat /sys/block/md0/md/mismatch_cnt))"
# 3. Server A killed again; while its leg resyncs, rnbd-clientd is killed and taken over.
kill -KILL "$MD_a"; wait "$MD_a" 2>/dev/null
faulty_within "$la" 7 >/dev/null; check md-again-leg-faulty $?
mdserver a 1237
leg_back mda "$la"; check md-again-leg-back $?
mdadm /dev/md0 --remove "$la" >/tmp/readd.err 2>&1
wait_for 60 re_add "$la"; check md-again-re-add $? "($(tail -n 2 /tmp/readd.err | tr '\n' ' '))"
restart_cycle KILL; check md-clientd-killed-mid-resync-taken-over $? "(${takeover_ms[*]: -1} ms)"
mdadm --wait /dev/md0
wait_for 120 bash -c "grep -q 'idle' /sys/block/md0/md/sync_action" &&
	[ "$(cat /sys/block/md0/md/degraded)" = 0 ]
check md-resync-done-after-takeover $?
check_mismatch; check md-again-check-no-mismatch $? "(mismatch_cnt $(cat /sys/block/md0/md/mismatch_cnt))"
kill -INT "$MDFIO"; wait "$MDFIO"; frc=$?
{ [ "$frc" -eq 0 ] || [ "$frc" -eq 128 ]; } && [ "$(grep -c 'err= 0' /tmp/fio-md.out)" -eq 1 ] &&
	! grep -qiE 'verify failed|bad magic|bad header|mismatch' /tmp/fio-md.out
check md-fio-verify-clean $? "(exit $frc; $(grep -E 'err=' /tmp/fio-md.out | head -1))"
mdadm --stop /dev/md0 >/dev/null 2>&1; check md-stopped $?
R client unmap leg.img --session mda >/dev/null && R client unmap leg.img --session mdb >/dev/null
check md-legs-unmapped $?
kill "$CPID" "$MD_a" "$MD_b"; wait "$CPID" "$MD_a" "$MD_b" 2>/dev/null

# A takeover is the device's own. A block device whose daemon was killed
# while its server is down (tcp, 127.0.0.1:1238) waits for it:
#   - a client.map of that device meanwhile is refused (it made a second
#     block device, and the takeover then failed "mapped already" and
#     removed the first, its IO failing); the server back, the takeover
#     ends and the device reads the server's bytes;
#   - killed again, and its session opened meanwhile for another device on
#     another server (1239, which has a t.img of its own): the takeover
#     does not join that session (it did: the device then read and wrote
#     the other server's t.img), and after --recover-timeout the block
#     device goes; the other server's t.img is never written.
mkdir -p /tmp/exports4 /tmp/exports5
head -c $((16 << 20)) /dev/urandom >/tmp/exports4/t.img
head -c $((16 << 20)) /dev/urandom >/tmp/exports5/t.img
head -c $((16 << 20)) /dev/zero >/tmp/exports5/other.img
cp /tmp/exports5/t.img /tmp/t5.orig
srv4() {
	"$B/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1238 -s /tmp/exports4 \
		--log-level info >>/tmp/s4.log 2>&1 &
	S4PID=$!
	wait_for 60 sh -c "[ \$(grep -c 'listening on port' /tmp/s4.log) -ge $1 ]"
}
srv4 1
"$B/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1239 -s /tmp/exports5 \
	--log-level info >/tmp/s5.log 2>&1 &
S5PID=$!
wait_for 60 grep -q 'listening on port' /tmp/s5.log
rm -f /tmp/maps.json
clientd --recover-timeout 8; check own-clientd-started $?
R client map t.img --session tk --server 127.0.0.1:1238 --provider tcp -o json >/tmp/tk.json
check own-map $? "$(cat /tmp/tk.json)"
dt=$(python3 -c 'import json; print(json.load(open("/tmp/tk.json"))["block_device"] or "")')
kill "$S4PID"; wait "$S4PID" 2>/dev/null
kill -KILL "$CPID"; wait "$CPID" 2>/dev/null
clientd --recover-timeout 60; check own-clientd-again $?
wait_for 30 grep -q 'mapping it again (try 1)' "$CLOG"
R client map t.img --session tk --server 127.0.0.1:1238 --provider tcp >/dev/null 2>/tmp/tk.err
mrc=$?
[ "$mrc" -ne 0 ] && grep -q 'is being taken over' /tmp/tk.err && [ -b "$dt" ]
check own-map-during-takeover-refused $? "(exit $mrc: $(cat /tmp/tk.err))"
srv4 2
wait_for 60 grep -q 'taken over: its IO goes on' "$CLOG" &&
	cmp -n 65536 "$dt" /tmp/exports4/t.img
check own-takeover-done-reads-its-server $? "($(grep -E 'ublkb|tk' "$CLOG" | tail -3 | tr '\n' ' '))"
kill "$S4PID"; wait "$S4PID" 2>/dev/null
kill -KILL "$CPID"; wait "$CPID" 2>/dev/null
clientd --recover-timeout 8; check own-clientd-third $?
wait_for 30 R client map other.img --session tk --server 127.0.0.1:1239 --provider tcp \
	--no-block-device >/dev/null 2>&1
check own-other-server-opens-session $?
wait_for 40 bash -c "[ ! -b '$dt' ]"
[ ! -b "$dt" ] && grep -q 'has none of: not taken over' "$CLOG" &&
	! grep -q 'taken over: its IO goes on' "$CLOG" && cmp -s /tmp/exports5/t.img /tmp/t5.orig
check own-takeover-never-joins-other-server $? "($(grep -E 'ublkb|tk' "$CLOG" | tail -3 | \
	tr '\n' ' '))"
R client unmap other.img --session tk >/dev/null; check own-unmap-other $?
kill "$CPID" "$S5PID"; wait "$CPID" "$S5PID" 2>/dev/null

fi

kill "$CPID" "$SPID" "$FIO" "$WATCH" "$S3PID" "$SHPID" "$MDFIO" "$MD_a" "$MD_b" 2>/dev/null; wait
dmesg | grep -E 'BUG:|Oops|Call Trace' >/tmp/oops; [ ! -s /tmp/oops ]; check kernel-log-clean$SFX $?
# In a sanitizer build, the daemons' reports would be in their logs.
! grep -qsE 'ERROR: (Address|Leak|Thread)Sanitizer|runtime error:' /tmp/s.log /tmp/s2.log /tmp/c*.log
check no-sanitizer-report$SFX $?
echo "--- clientd logs"; tail -n 8 /tmp/c1.log "$CLOG"
GUEST

# The build folder too: a guest has its own /tmp, where a checkout may be.
# Two guests: the kill-and-takeover section (ext4 under fio, rnbd-clientd
# killed 20 times) in one of its own, the rest in the other. A guest whose
# kernel locks up (an RCU stall under TCG; in the kill-and-takeover
# section, the kernel's crash described there) or panics (once, in
# ip_local_deliver under the md section) is reported with its console and
# run again: the main guest up to three runs, the kill-and-takeover one
# (short) up to four; the last lockup fails.
run_part() { # PART RUNS: sets out and rc
	local attempt
	for attempt in $(seq "$2"); do
		out=$("$vm" run --bpo --rdma rxe --timeout 900 --mem 1536 --share-ro "$logs" \
			--share-ro "$build" -- bash "$logs/guest.sh" "$build" "$1" 2>&1)
		rc=$?
		if [ "$attempt" -lt "$2" ] && [ "$rc" -eq 125 ] &&
			grep -qE 'guest: kernel lockup|console: .*Kernel panic' <<<"$out"; then
			grep -E 'kernel lockup|console: ' <<<"$out" | sed 's/^/  /'
			echo "  ublk: the $1 guest's kernel locked up or panicked after" \
				"$(grep -c '^CHECK ' <<<"$out") checks (above): running it again"
			continue
		fi
		break
	done
}
passed=0 failed=0
for part in main:3 recovery:4; do
	run_part "${part%:*}" "${part#*:}"
	part=${part%:*}
	p0=$passed
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
	if [ "$passed" -eq "$p0" ] || [ "$rc" -eq 125 ]; then
		echo "FAIL ublk: the $part guest gave no result (exit $rc)"
		failed=$((failed + 1))
	fi
done
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
