#!/usr/bin/env bash
# rtrs-wire.py without guests: a capture made here byte by byte (RoCEv2
# frames of a small RTRS conversation with a retransmitted CM REQ, a
# multi-packet SEND, an RKEY_RSP whose key byte wraps, a retransmitted and
# a lost packet) is decoded and compared; compare's rules are checked on
# the kernel-interop references (text). Usage: rtrs-wire-test.sh.
# Exits 77 without tshark.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/common.sh"
wire=$here/rtrs-wire.py
ref=$here/kernel-interop-ref.txt
command -v tshark >/dev/null || { echo "SKIP: tshark is not installed"; exit 77; }
tmp=$(mktemp -d /tmp/rtrs-wire-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp/conv.pcap" <<'PY'
import struct, sys

C, S = bytes([198, 18, 0, 2]), bytes([198, 18, 0, 1])
CQP, SQP = 0x11, 0x22
frames = []

def ip_csum(h):
    s = sum(struct.unpack("!10H", h))
    s = (s & 0xffff) + (s >> 16)
    return (~(s + (s >> 16))) & 0xffff

def frame(src, dst, roce):
    udp = struct.pack("!HHHH", 49152, 4791, 8 + len(roce), 0) + roce
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0, src, dst))
    struct.pack_into("!H", ip, 10, ip_csum(bytes(ip)))
    frames.append(b"\x52\x54\x00\x00\x00\x02\x52\x54\x00\x00\x00\x01\x08\x00" + bytes(ip) + udp)

def bth(op, qp, psn, pad=0):
    return struct.pack("!BBHI I", op, pad << 4, 0xffff, qp, psn)

def rc(src, dst, op, qp, psn, ext=b"", payload=b""):
    pad = -len(payload) % 4
    frame(src, dst, bth(op, qp, psn, pad) + ext + payload + b"\0" * pad + b"ICRC")

def cm(src, dst, attr, data):
    mad = bytes([1, 7, 2, 3]) + b"\0" * 4 + struct.pack("!QHHI", 7, attr, 0, 0)
    mad += data.ljust(232, b"\0")
    frame(src, dst, bth(0x64, 1, 0) + struct.pack("!II", 0x80010000, 1) + mad + b"ICRC")

# CM: REQ (twice: the CM resends it when the REP is late), REP, RTU.
conn_req = struct.pack("<BBHHHHH", 0, 0, 0x1bbd, 0x0200, 0, 1, 1) + b"U" * 16 + b"P" * 16 + b"\x01" + b"\0" * 11
req = bytearray(140) + b"\0" * 36 + conn_req
struct.pack_into("!I", req, 0, 0xc1)
struct.pack_into("!Q", req, 8, 0x0000000001060000 | 1234)
req[32:35] = CQP.to_bytes(3, "big")
cm(C, S, 0x10, bytes(req))
cm(C, S, 0x10, bytes(req))
rep = bytearray(36) + struct.pack("<HHhHIII", 0x1bbd, 0x0200, 0, 512, 126976, 4096, 2) + b"\0" * 36
struct.pack_into("!II", rep, 0, 0x5e, 0xc1)
rep[12:15] = SQP.to_bytes(3, "big")
cm(S, C, 0x13, bytes(rep))
cm(C, S, 0x14, struct.pack("!II", 0xc1, 0x5e))

# INFO_REQ; INFO_RSP in two packets: 2 descs of 256 chunks, keys 0x1ff and 0x300.
rc(C, S, 0x04, SQP, 0, payload=struct.pack("<H", 0) + b"test".ljust(255, b"\0") + b"\0" * 15)
A0 = 0xffff888000000000
info = struct.pack("<HHI", 1, 2, 0) + struct.pack("<QII", A0, 0x1ff, 256 << 17) + \
    struct.pack("<QII", A0 + (256 << 17), 0x300, 256 << 17)
rc(S, C, 0x00, CQP, 100, payload=info[:20])
rc(S, C, 0x02, CQP, 101, payload=info[20:])

# A write of 8 bytes to sector 8 in chunk 0: data, RNBD IO (usr), RTRS write header.
usr = struct.pack("<HHIQIIH", 4, 0, 0, 8, 1 | 1 << 8, 8, 0).ljust(32, b"\0")
msg = b"D" * 8 + usr + struct.pack("<HH", 2, 32)
reth = struct.pack("!QII", A0, 0x1ff, len(msg))
rc(C, S, 0x0b, SQP, 1, reth + struct.pack("!I", 40), msg)
rc(C, S, 0x0b, SQP, 1, reth + struct.pack("!I", 40), msg)          # retransmitted
# The response: IO_RSP id 0 carrying the chunk's new key, 0x1ff -> 0x100.
rc(S, C, 0x05, CQP, 102, struct.pack("!I", 1 << 28), struct.pack("<HHI", 4, 0, 0x100))
rc(S, C, 0x11, CQP, 1, struct.pack("!I", 1))                       # an ACK
# PSN 2 lost; then a write to chunk 0 with its old key, after the gap.
rc(C, S, 0x0b, SQP, 3, reth + struct.pack("!I", 40), msg)
cm(C, S, 0x15, struct.pack("!II", 0xc1, 0x5e))

with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1))
    for i, fr in enumerate(frames):
        f.write(struct.pack("<IIII", 1700000000, i * 1000, len(fr), len(fr)) + fr)
PY

"$wire" decode "$tmp/conv.pcap" >"$tmp/conv.txt" 2>&1
cat "$tmp/conv.txt"
has() { grep -qF -- "$1" "$tmp/conv.txt"; }
check "decode: the conn_req, once (the CM's resent REQ is not a second one)" \
	test "$(grep -c 'C>S REQ port=1234 conn_req cma_version=0 ip_version=0 magic=0x1bbd version=2.0 cid=0 cid_num=1 recon_cnt=1 sess_uuid=<uuid-1> paths_uuid=<uuid-2> flags=0x01 reserved=zero' "$tmp/conv.txt")" = 1
check "decode: the conn_rsp" has "cm S>C REP cid0 conn_rsp magic=0x1bbd version=2.0 errno=0 queue_depth=512 max_io_size=126976 max_hdr_size=4096 flags=0x2 reserved=zero"
check "decode: INFO_REQ" has "cid0 C>S SEND len=272 INFO_REQ pathname=<name> reserved=zero"
check "decode: INFO_RSP from two packets, 512 chunks" has "cid0 S>C SEND len=40 INFO_RSP sg_cnt=2 reserved=zero descs=2x33554432 keys=2-distinct chunks=512"
check "decode: the write as RTRS and RNBD" has "cid0 C>S WRITE_IMM len=44 imm=IO_REQ(chunk=0,off=40) -> chunk0+0 rkey=chunk WRITE data=8 usr_len=32 RNBD IO dev=0 sector=8 op=WRITE flags=SYNC size=8 prio=0"
check "decode: a key byte that wraps (0x1ff -> 0x100) is ib_inc_rkey's prev+1" has "cid0 S>C SEND_IMM len=8 imm=IO_RSP(id=0,errno=0) RKEY_RSP buf_id=0 rkey=prev+1"
check "decode: the retransmitted write is counted, not shown" has "# retransmitted packets: 1"
check "decode: the lost packet is a gap" has "cid0 C>S -- capture gap: 1 packet(s) lost   [after a capture gap]"
check "decode: after the gap, a write with the chunk's old key is STALE" has "-> chunk0+0 rkey=STALE"
check "decode: acks are counted" has "# ACKs: 1"
check "decode: the DREQ" has "cm C>S DREQ cid0"

cmp_rc() { # expected-status file-a file-b
	"$wire" compare "$2" "$3" >"$tmp/cmp.out" 2>&1
	local rc=$?
	[ "$rc" -eq "$1" ] || { cat "$tmp/cmp.out"; return 1; }
}
# The text of a decode compares equal with its capture, up to the gap.
grep -v '^#' "$tmp/conv.txt" >"$tmp/conv-text.txt"
check "compare: a capture and its own decoded text are equal" cmp_rc 0 "$tmp/conv-text.txt" "$tmp/conv.pcap"
check "compare: ... and the stale write after the gap is not compared" \
	grep -q 'cid0 C>S 2,' "$tmp/cmp.out"

check "compare: the reference with itself" cmp_rc 0 "$ref" "$ref"
sed 's/flags=0x2 reserved=zero/flags=0x0 reserved=zero/' "$ref" >"$tmp/flags.txt"
check "compare: a conn_rsp flag differs" cmp_rc 1 "$ref" "$tmp/flags.txt"
check "compare: ... and the diff shows it" grep -q '^+cm S>C REP cid0 .* flags=0x0' "$tmp/cmp.out"
# A message missing from a stream shifts it: found although both are cut short.
awk '/^cid1 C>S / && ++n == 2 { next } { print }' "$ref" >"$tmp/missing.txt"
check "compare: a message missing from a stream" cmp_rc 1 "$ref" "$tmp/missing.txt"
# Both cut short: what lies beyond the shorter stream is not compared.
awk '/^cid1 C>S / && ++n > 5 { next } { print }' "$ref" >"$tmp/short.txt"
check "compare: a stream cut short bounds the comparison" cmp_rc 0 "$ref" "$tmp/short.txt"
# A complete conversation (it holds a DREQ) must hold what the other has.
{ cat "$tmp/short.txt"; echo "cm C>S DREQ cid0"; } >"$tmp/closed.txt"
check "compare: a complete conversation shorter than a cut-short one differs" \
	cmp_rc 1 "$ref" "$tmp/closed.txt"
# Heartbeats fall where time puts them: not compared.
awk '{ print } /^cid1 C>S / && ++n == 2 { print "cid1 C>S WRITE_IMM len=0 imm=HB_MSG(payload=0x0000000)   [timer]" }' \
	"$ref" >"$tmp/hb.txt"
check "compare: a heartbeat among the IOs is not a difference" cmp_rc 0 "$ref" "$tmp/hb.txt"
printf 'cm C>S RTU cid0\nnot a decoded line\n' >"$tmp/bad.txt"
check "compare: a line it does not understand stops it, with file and line" cmp_rc 2 "$ref" "$tmp/bad.txt"
check "compare: ... and says which" grep -q "bad.txt:2: not a line of rtrs-wire decode" "$tmp/cmp.out"
echo garbage >"$tmp/garbage.pcap"
check "decode: a file that is no capture is refused (status 2)" \
	bash -c '"$1" decode "$2" >/dev/null 2>&1; [ $? -eq 2 ]' _ "$wire" "$tmp/garbage.pcap"
finish rtrs-wire
