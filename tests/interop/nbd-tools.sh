#!/usr/bin/env bash
# Standard NBD tools against RNBD devices, unchanged: an rnbd-server exports
# a file, nbdkit's rnbd plugin serves it as an NBD export, and
#   nbdinfo      shows its size and flags,
#   qemu-img     converts an image onto it, and compare finds them identical,
#   nbdcopy      copies both ways with equal checksums,
#   fio          (nbd engine) random writes with verify=crc32c, then verifies,
#   nbdfuse      exposes it as a file where mkfs.ext4 and fsck -n succeed;
# then the server force-closes the device and IO through NBD fails with EIO
# (ENOTCONN in nbdkit's log: NBD has no ENOTCONN). Every byte is also checked in the server's
# file. Usage: nbd-tools.sh BUILD_DIR. Exits 77 when a tool is missing.
set -euo pipefail
build=$(cd "${1:?usage: nbd-tools.sh BUILD_DIR}" && pwd)
plugin=$build/nbdkit/nbdkit-rnbd-plugin.so

for t in nbdkit nbdinfo nbdcopy nbdfuse qemu-img fio mkfs.ext4 fsck.ext4 python3; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done
[ -e /dev/fuse ] || { echo "SKIP: no /dev/fuse for nbdfuse"; exit 77; }
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "SKIP: fio has no nbd engine"; exit 77; }

. "$(dirname "$0")/../lib/common.sh"
. "$(dirname "$0")/nbdkit-sanitizer.sh" # skips a sanitizer build
dir=$(mktemp -d /var/tmp/rnbd-interop.XXXXXX)
cleanup() {
	mountpoint -q "$dir/mnt" 2>/dev/null && { fusermount3 -u "$dir/mnt" 2>/dev/null || umount "$dir/mnt"; }
	kill_pids
	rm -rf "$dir"
}
trap cleanup EXIT

size=$((64 << 20))
truncate -s "$size" "$dir/disk.img"
rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir" --control "$dir/ctl" \
	--queue-depth 64 || exit 1

nbdkit -f -U "$dir/nbd.sock" "$plugin" server="127.0.0.1:$port" session=interop \
	device=disk.img >"$dir/nbdkit.log" 2>&1 &
pids+=($!)
wait_until 10 test -S "$dir/nbd.sock" || { cat "$dir/nbdkit.log"; echo "FAIL: no nbdkit"; exit 1; }
uri="nbd+unix:///disk.img?socket=$dir/nbd.sock"

# nbdinfo: size and what the export can do.
nbdinfo --json "$uri" >"$dir/info.json"
check "nbdinfo: size and flags" python3 - "$dir/info.json" "$size" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
want = {"export-size": int(sys.argv[2]), "is_read_only": False, "can_flush": True,
        "can_fua": True, "can_trim": True, "can_zero": True, "can_multi_conn": True,
        "block_size_minimum": 512, "block_size_preferred": 4096}
bad = {k: (e.get(k), v) for k, v in want.items() if e.get(k) != v}
if bad:
    print("nbdinfo differs:", bad)
sys.exit(1 if bad else 0)
PY

# qemu-img: an image converted onto the device compares identical.
head -c $((40 << 20)) /dev/urandom >"$dir/image.raw"
truncate -s "$size" "$dir/image.raw"
check "qemu-img convert onto the device" qemu-img convert -n -f raw -O raw "$dir/image.raw" "$uri"
check "qemu-img compare: identical" qemu-img compare -q -f raw -F raw "$dir/image.raw" "$uri"
check "the server's file holds the image" cmp -s "$dir/image.raw" "$dir/disk.img"

# nbdcopy both ways, checksums equal.
head -c "$size" /dev/urandom >"$dir/copy-in.raw"
check "nbdcopy file -> device" nbdcopy "$dir/copy-in.raw" "$uri"
check "nbdcopy device -> file" nbdcopy "$uri" "$dir/copy-out.raw"
sum_in=$(sha256sum <"$dir/copy-in.raw" | cut -d' ' -f1)
check "nbdcopy checksums equal" test "$sum_in" = "$(sha256sum <"$dir/copy-out.raw" | cut -d' ' -f1)"
check "the server's file has the same checksum" \
	test "$sum_in" = "$(sha256sum <"$dir/disk.img" | cut -d' ' -f1)"

# fio, nbd engine: random writes with crc32c, then the verification pass.
check "fio nbd randwrite verify=crc32c" fio --name=verify --ioengine=nbd --uri="$uri" \
	--rw=randwrite --bs=4k --size=32M --iodepth=16 --verify=crc32c --do_verify=1 \
	--verify_fatal=1 --verify_state_save=0 --output="$dir/fio.log"
check "fio reported no errors" grep -q 'err= 0' "$dir/fio.log"

# nbdfuse: a file system made and checked on the device.
mkdir "$dir/mnt"
nbdfuse "$dir/mnt" "$uri" >"$dir/nbdfuse.log" 2>&1 &
pids+=($!)
wait_until 10 test -e "$dir/mnt/nbd" || true # mkfs below fails if not
check "nbdfuse: mkfs.ext4" mkfs.ext4 -q -F "$dir/mnt/nbd"
check "nbdfuse: fsck -n" fsck.ext4 -n -f "$dir/mnt/nbd"
fusermount3 -u "$dir/mnt" 2>/dev/null || umount "$dir/mnt"
check "the server's file holds the file system" fsck.ext4 -n -f "$dir/disk.img"

# Force-close on the server while a connection holds the device (an
# nbdfuse mount): IO through NBD then fails, EIO for the client, ENOTCONN
# from the server in nbdkit's log.
nbdfuse "$dir/mnt" "$uri" >>"$dir/nbdfuse.log" 2>&1 &
pids+=($!)
wait_until 10 test -e "$dir/mnt/nbd" || true # the read below fails if not
check "a read before force-close works" dd if="$dir/mnt/nbd" of=/dev/null bs=4096 count=1 \
	iflag=direct status=none
check "rnbd server close: done" ctl "$dir/ctl" server close interop disk.img
check "a read after force-close fails" bash -c "! dd if='$dir/mnt/nbd' of=/dev/null bs=4096 \
	count=1 skip=100 iflag=direct status=none 2>'$dir/dd.err'"
check "... with EIO for the NBD client (not EINVAL)" grep -q "Input/output error" "$dir/dd.err"
check "... with ENOTCONN in nbdkit's log" grep -q "Transport endpoint is not connected" "$dir/nbdkit.log"
# The device grows while it is closed and the mount still holds it: a new
# connection is refused (the mount was told the old size), and so is the
# one after it, which finds the device opened again by the first; once the
# mount has gone, a new connection gets the new size.
truncate -s $((2 * size)) "$dir/disk.img"
check "grown while closed: a new connection is refused" \
	bash -c "! nbdinfo --size '$uri' >/dev/null 2>'$dir/grown1.err'"
check "... and the next one too (not served the old size)" \
	bash -c "! nbdinfo --size '$uri' >/dev/null 2>'$dir/grown2.err'"
check "... nbdkit says why" grep -q "it changed (size, mode or block size)" "$dir/nbdkit.log"
fusermount3 -u "$dir/mnt" 2>/dev/null || umount "$dir/mnt"
check "the mount gone: a new connection gets the new size" \
	wait_until 10 bash -c "test \"\$(nbdinfo --size '$uri' 2>/dev/null)\" = $((2 * size))"

finish nbd-tools
