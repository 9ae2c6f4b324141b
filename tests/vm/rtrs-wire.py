#!/usr/bin/env python3
"""rtrs-wire: an RTRS/RNBD conversation, as captured on RoCEv2, as text.

  rtrs-wire.py decode PCAP [--first N]
      the normalized sequence, one message a line, in capture order
  rtrs-wire.py compare REF PCAP [--first N] [--shape]
      compares the setup (CM exchange) and the first N messages (40) of
      each connection and direction; exit 0 when equal, 1 when not (with
      a diff), 2 on an unreadable capture. Either may be the text that
      decode printed (a reference kept in the repository) instead of a
      capture. --shape compares what the messages are, not their values:
      every field whose value holds a digit (sizes, ids, chunks, offsets,
      flag words, RNBD limits), names (device, session) and key relations
      (a rotated key is a rotated key, however the server picked it) are
      masked; message kinds, opcodes, immediate types, RTRS and RNBD
      message types, named flags and reserved bytes stay.

Reads captures of UDP port 4791 (tcpdump -i eth0 udp port 4791 in a guest)
through tshark, which hands over each UDP payload; InfiniBand transport
headers, CM MADs, RTRS and RNBD are decoded here (tshark knows no RTRS).

Normalized: addresses, QP numbers, PSNs, CM ids, uuids (placeholders
<uuid-1>... by first appearance), memory keys and buffer addresses. What
stays is what both sides put on the wire by protocol: the conn_req and
conn_rsp fields, reserved bytes (shown as "zero" or in hex), message types,
lengths, flags, chunk numbers and offsets, immediates decoded as RTRS
(type and payload), RNBD messages. Keys become relations: a write names
"rkey=chunk" when it uses the key the server last gave for that chunk; an
RKEY_RSP "rkey=prev+1" when it advances it as ib_inc_rkey does (the low
byte plus one, modulo 256), "prev" or "new" otherwise, a
SEND_WITH_INV "inv=read-desc" when it invalidates the key of the read it
answers.

Transport noise is not in the sequence: acks, NAKs and retransmissions are
counted at the end. Heartbeats are shown, marked [timer], but not compared:
where they fall among the IOs is a matter of time. A PSN gap (tcpdump dropped packets, as it does under
TCG during bulk IO) ends the comparable part of that stream; decoding goes
on after it, marked.
"""

import argparse
import re
import collections
import difflib
import signal
import struct
import subprocess
import sys

# BTH opcodes: name and extension headers, in order.
OPCODES = {
    0x00: ("SEND_FIRST", ()), 0x01: ("SEND_MIDDLE", ()), 0x02: ("SEND_LAST", ()),
    0x03: ("SEND_LAST_IMM", ("imm",)), 0x04: ("SEND_ONLY", ()),
    0x05: ("SEND_ONLY_IMM", ("imm",)), 0x06: ("WRITE_FIRST", ("reth",)),
    0x07: ("WRITE_MIDDLE", ()), 0x08: ("WRITE_LAST", ()),
    0x09: ("WRITE_LAST_IMM", ("imm",)), 0x0a: ("WRITE_ONLY", ("reth",)),
    0x0b: ("WRITE_ONLY_IMM", ("reth", "imm")), 0x0c: ("READ_REQ", ("reth",)),
    0x0d: ("READ_RSP_FIRST", ("aeth",)), 0x0e: ("READ_RSP_MIDDLE", ()),
    0x0f: ("READ_RSP_LAST", ("aeth",)), 0x10: ("READ_RSP_ONLY", ("aeth",)),
    0x11: ("ACK", ("aeth",)), 0x12: ("ATOMIC_ACK", ("aeth", "atomicack")),
    0x13: ("CMP_SWAP", ("atomic",)), 0x14: ("FETCH_ADD", ("atomic",)),
    0x16: ("SEND_LAST_INV", ("ieth",)), 0x17: ("SEND_ONLY_INV", ("ieth",)),
    0x64: ("UD_SEND_ONLY", ("deth",)), 0x65: ("UD_SEND_ONLY_IMM", ("deth", "imm")),
}
EXT_LEN = {"imm": 4, "reth": 16, "aeth": 4, "ieth": 4, "deth": 8, "atomic": 28, "atomicack": 8}
# Responses travel in the requester's direction with the requester's PSNs.
RESPONSES = {0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12}

CM_ATTRS = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU",
            0x15: "DREQ", 0x16: "DREP"}
# Offset of the private data in each CM message (IBA 12.6), after the
# 24-byte MAD header; REQ's begins with the RDMA CM's 36-byte IP header.
CM_PRIVATE = {"REQ": 140, "REJ": 84, "REP": 36, "RTU": 8, "DREQ": 12, "DREP": 8}
CMA_HDR = 36

AFTER_GAP = "   [after a capture gap]"
TIMER = "   [timer]"
RTRS_MAGIC = 0x1BBD
IMM_TYPES = {0: "IO_REQ", 1: "IO_RSP", 2: "IO_RSP_W_INV", 8: "HB_MSG", 9: "HB_ACK"}
RTRS_MSG = {0: "INFO_REQ", 1: "INFO_RSP", 2: "WRITE", 3: "READ", 4: "RKEY_RSP",
            5: "FENCE", 6: "FENCE_ACK", 7: "AUTH"}
RNBD_MSG = {0: "SESS_INFO", 1: "SESS_INFO_RSP", 2: "OPEN", 3: "OPEN_RSP", 4: "IO", 5: "CLOSE"}
RNBD_OPS = {0: "READ", 1: "WRITE", 2: "FLUSH", 3: "DISCARD", 4: "SECURE_ERASE", 5: "WRITE_ZEROES"}
RNBD_FLAGS = {8: "SYNC", 9: "FUA", 10: "PREFLUSH", 11: "NOUNMAP"}
ACCESS = {0: "ro", 1: "rw", 2: "migration"}


class WireError(Exception):
    pass


def zero_or_hex(b):
    return "zero" if not any(b) else b.hex()


def flag_names(value, names):
    out = [n for bit, n in sorted(names.items()) if value & (1 << bit)]
    rest = value & ~sum(1 << bit for bit in names)
    if rest:
        out.append("0x%x" % rest)
    return "|".join(out) if out else "0"


def read_packets(path):
    """(frame, src ip, dst ip, UDP payload) of each RoCEv2 packet."""
    cmd = ["tshark", "-r", path, "-Y", "udp.dstport == 4791", "-T", "fields",
           "-E", "separator=/t", "-e", "frame.number", "-e", "ip.src", "-e", "ip.dst",
           "-e", "udp.payload"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise WireError("tshark is not installed (Debian package tshark)")
    if r.returncode != 0:
        why = [l for l in r.stderr.splitlines() if l and not l.startswith("Running as user")]
        raise WireError("%s: tshark cannot read it: %s" % (path, " ".join(why)))
    pkts = []
    for line in r.stdout.splitlines():
        f = line.split("\t")
        if len(f) != 4 or not f[3]:
            continue
        try:
            pkts.append((int(f[0]), f[1], f[2], bytes.fromhex(f[3].replace(":", ""))))
        except ValueError:
            raise WireError("%s: frame %s: unreadable UDP payload" % (path, f[0]))
    return pkts


class Stream:
    """One direction of one RC connection: its PSNs and a message in assembly."""

    def __init__(self, conn, direction):
        self.conn = conn
        self.dir = direction
        self.next_psn = None
        self.gap = False
        self.msg = None          # [opcode family, reth, parts]


class Conn:
    def __init__(self, client, server, cqpn):
        self.client, self.server = client, server
        self.cqpn, self.sqpn = cqpn, None
        self.cid = None
        self.sess = Session()    # shared by the paths_uuid once the REQ is read
        self.streams = {"C>S": Stream(self, "C>S"), "S>C": Stream(self, "S>C")}

    def name(self):
        return "cid%s" % ("?" if self.cid is None else self.cid)


class Session:
    """What the client learned: queue depth, chunk size, chunk keys."""

    def __init__(self):
        self.queue_depth = None
        self.chunk_size = None
        self.chunks = []         # [addr, key] per chunk (from INFO_RSP)
        self.reads = {}          # chunk -> {"key", "what"} of a read in flight


class Decoder:
    def __init__(self):
        self.events = []         # (stream or None, text) in capture order
        self.conns = {}          # local comm id -> Conn
        self.by_qp = {}          # (dst ip, dst qpn) -> (Conn, direction)
        self.uuids = {}
        self.sessions = {}       # paths_uuid placeholder -> Session
        self.stats = collections.Counter()
        self.closed = False      # a DREQ was seen: the capture holds an end
        self.cm_seen = set()

    # -- output --------------------------------------------------------------

    def emit(self, stream, text):
        if stream is None:
            self.events.append((None, "cm " + text))
            return
        line = "%s %s %s" % (stream.conn.name(), stream.dir, text)
        if stream.gap:
            line += AFTER_GAP
        elif " imm=HB_" in text:
            line += TIMER
        self.events.append(((stream.conn.name(), stream.dir), line))

    def uuid(self, b):
        if b not in self.uuids:
            self.uuids[b] = "<uuid-%d>" % (len(self.uuids) + 1)
        return self.uuids[b]

    # -- CM ------------------------------------------------------------------

    def cm(self, src, dst, mad):
        if len(mad) < 256 or mad[1] != 0x07:
            self.stats["non-CM MADs"] += 1
            return
        attr = CM_ATTRS.get(struct.unpack_from(">H", mad, 16)[0])
        if attr is None:
            self.stats["other CM MADs"] += 1
            return
        data = mad[24:]
        lid, rid = struct.unpack_from(">II", data, 0)
        priv = data[CM_PRIVATE.get(attr, 232):]
        # The CM sends a message again when its answer is late (TCG under
        # load), and MRAs ask for more time: timing, not conversation.
        if attr == "MRA" or (attr, lid, rid) in self.cm_seen:
            self.stats["CM MRAs and retransmissions"] += 1
            return
        self.cm_seen.add((attr, lid, rid))
        if attr == "REQ":
            self.cm_req(src, dst, data, priv)
        elif attr == "REP":
            self.cm_rep(src, dst, rid, data, priv)
        elif attr == "REJ":
            self.cm_rej(src, rid, data, priv)
        else:
            conn = self.conns.get(lid) or self.conns.get(rid)
            side = "C>S" if conn and src == conn.client else "S>C" if conn else "?"
            if attr == "DREQ":
                self.closed = True
            self.emit(None, "%s %s %s" % (side, attr, conn.name() if conn else "cid?"))

    def cm_req(self, src, dst, data, priv):
        lid = struct.unpack_from(">I", data, 0)[0]
        sid = struct.unpack_from(">Q", data, 8)[0]
        cqpn = int.from_bytes(data[32:35], "big")
        conn = Conn(src, dst, cqpn)
        self.conns[lid] = conn
        self.by_qp[(src, cqpn)] = (conn, "S>C")
        ps = (sid >> 16) & 0xffff
        port = sid & 0xffff
        text = "C>S REQ port=%s" % (port if ps == 0x0106 else "service 0x%x" % sid)
        cr = priv[CMA_HDR:]
        if len(cr) < 56:
            self.emit(None, text + " private data too short (%d)" % len(cr))
            return
        magic, ver, cid, cid_num, recon = struct.unpack_from("<HHHHH", cr, 2)
        conn.cid = cid
        sess_u, paths_u = self.uuid(cr[12:28]), self.uuid(cr[28:44])
        conn.sess = self.sessions.setdefault(paths_u, Session())
        text += (" conn_req cma_version=%d ip_version=%d magic=0x%04x version=%d.%d cid=%d"
                 " cid_num=%d recon_cnt=%d sess_uuid=%s paths_uuid=%s flags=0x%02x"
                 " reserved=%s" % (cr[0], cr[1], magic, ver >> 8, ver & 0xff, cid, cid_num,
                                   recon, sess_u, paths_u, cr[44], zero_or_hex(cr[45:56])))
        if cr[56:]:
            text += " tail=%s" % zero_or_hex(cr[56:])
        self.emit(None, text)

    def conn_rsp(self, p):
        if len(p) < 20:
            return "conn_rsp too short (%d)" % len(p)
        magic, ver, err, qd, mio, mhdr, flags = struct.unpack_from("<HHhHIII", p, 0)
        if magic != RTRS_MAGIC:
            return "private data without RTRS magic: %s" % p[:20].hex()
        return ("conn_rsp magic=0x%04x version=%d.%d errno=%d queue_depth=%d max_io_size=%d"
                " max_hdr_size=%d flags=0x%x reserved=%s"
                % (magic, ver >> 8, ver & 0xff, err, qd, mio, mhdr, flags, zero_or_hex(p[20:56])))

    def cm_rep(self, src, dst, rid, data, priv):
        conn = self.conns.get(rid)
        if conn is None:
            self.emit(None, "S>C REP to an unseen REQ")
            return
        conn.sqpn = int.from_bytes(data[12:15], "big")
        self.by_qp[(src, conn.sqpn)] = (conn, "C>S")
        if len(priv) >= 20 and struct.unpack_from("<H", priv, 0)[0] == RTRS_MAGIC:
            _, _, _, qd, mio, mhdr, _ = struct.unpack_from("<HHhHIII", priv, 0)
            conn.sess.queue_depth = qd
            conn.sess.chunk_size = mio + mhdr
        self.emit(None, "S>C REP %s %s" % (conn.name(), self.conn_rsp(priv)))

    def cm_rej(self, src, rid, data, priv):
        conn = self.conns.get(rid)
        reason = struct.unpack_from(">H", data, 10)[0]
        side = "S>C" if conn and src == conn.server else "C>S" if conn else "?"
        self.emit(None, "%s REJ %s reason=%d %s" % (side, conn.name() if conn else "cid?",
                                                    reason, self.conn_rsp(priv)))

    # -- RC transport ----------------------------------------------------------

    def packet(self, src, dst, p):
        if len(p) < 12 + 4:
            raise WireError("shorter than BTH and ICRC")
        op = p[0]
        pad = (p[1] >> 4) & 3
        dqpn = int.from_bytes(p[5:8], "big")
        psn = int.from_bytes(p[9:12], "big")
        if op not in OPCODES:
            self.stats["opcode 0x%02x (unknown)" % op] += 1
            return
        name, exts = OPCODES[op]
        off, hdr = 12, {}
        for e in exts:
            hdr[e] = p[off:off + EXT_LEN[e]]
            off += EXT_LEN[e]
        payload = p[off:len(p) - 4 - pad]
        if dqpn == 1:
            self.cm(src, dst, payload)
            return
        if op in RESPONSES:
            if op == 0x11:
                syn = hdr["aeth"][0]
                kind = {0: "ACKs", 1: "RNR NAKs", 3: "NAKs"}.get(syn >> 5, "AETH other")
                self.stats[kind] += 1
            else:
                self.stats[name] += 1
            return
        found = self.by_qp.get((dst, dqpn))
        if found is None:
            self.stats["packets of unknown connections"] += 1
            return
        conn, direction = found
        st = conn.streams[direction]
        if st.next_psn is not None and psn != st.next_psn:
            behind = (st.next_psn - psn) & 0xffffff
            if behind < 0x800000:
                self.stats["retransmitted packets"] += 1
                return
            lost = (psn - st.next_psn) & 0xffffff
            self.stats["packets lost in the capture"] += lost
            st.gap = True
            st.msg = None
            self.emit(st, "-- capture gap: %d packet(s) lost" % lost)
        st.next_psn = (psn + 1) & 0xffffff
        if op == 0x0c:
            # An RDMA read takes a PSN per response packet; RTRS sends none.
            st.next_psn = None
            self.emit(st, "READ_REQ len=%d" % struct.unpack_from(">I", hdr["reth"], 12)[0])
            return
        self.assemble(st, name, hdr, payload)

    def assemble(self, st, name, hdr, payload):
        family = "SEND" if name.startswith("SEND") else "WRITE"
        first = name.endswith("FIRST") or "ONLY" in name
        last = "LAST" in name or "ONLY" in name
        if first:
            st.msg = [family, hdr.get("reth"), [payload]]
        elif st.msg is None or st.msg[0] != family:
            self.stats["packets of a message begun before the capture or a gap"] += 1
            return
        else:
            st.msg[2].append(payload)
        if last:
            fam, reth, parts = st.msg
            st.msg = None
            data = b"".join(parts)
            imm = struct.unpack(">I", hdr["imm"])[0] if "imm" in hdr else None
            inv = struct.unpack(">I", hdr["ieth"])[0] if "ieth" in hdr else None
            if fam == "SEND":
                self.send(st, data, imm, inv)
            else:
                self.write(st, reth, data, imm)

    # -- RTRS ------------------------------------------------------------------

    def imm_text(self, imm, sess):
        """The immediate as RTRS sees it: (text, chunk or msg id, offset)."""
        t, pl = imm >> 28, imm & 0x0fffffff
        name = IMM_TYPES.get(t, "type%d" % t)
        if t == 0 and sess.queue_depth:
            # chunk << mem_bits | offset; the chunk takes ilog2(qd - 1) + 1 bits
            bits = 28 - max(sess.queue_depth - 1, 1).bit_length()
            chunk, off = pl >> bits, pl & ((1 << bits) - 1)
            return "%s(chunk=%d,off=%d)" % (name, chunk, off), chunk, off
        if t in (1, 2):
            # |errno| << 19 | msg id
            return "%s(id=%d,errno=%d)" % (name, pl & 0x7ffff, pl >> 19), pl & 0x7ffff, None
        return "%s(payload=0x%07x)" % (name, pl), None, None

    def send(self, st, data, imm, inv):
        sess = st.conn.sess
        parts = ["SEND%s%s len=%d" % ("_IMM" if imm is not None else "",
                                       "_INV" if inv is not None else "", len(data))]
        hit = []
        if imm is not None:
            parts.append("imm=" + self.imm_text(imm, sess)[0])
        if inv is not None:
            hit = [c for c, r in sess.reads.items() if r["key"] == inv]
            parts.append("inv=read-desc" if hit else "inv=unknown-key")
        if len(data) >= 2:
            t = struct.unpack_from("<H", data, 0)[0]
            if t == 0 and st.dir == "C>S" and len(data) >= 272:
                name = data[2:257].split(b"\0")[0]
                parts.append("INFO_REQ pathname=%s reserved=%s"
                             % ("<name>" if name else "<empty>", zero_or_hex(data[257:272])))
            elif t == 1 and st.dir == "S>C" and len(data) >= 8:
                parts.append(self.info_rsp(sess, data))
            elif t == 4 and len(data) >= 8:
                parts.append(self.rkey_rsp(sess, data))
            else:
                parts.append("%s %s" % (RTRS_MSG.get(t, "type%d" % t), data[:32].hex()))
        for c in hit:
            sess.reads.pop(c)
        self.emit(st, " ".join(parts))

    def info_rsp(self, sess, data):
        _, sg_cnt = struct.unpack_from("<HH", data, 0)
        descs = []
        for i in range(sg_cnt):
            if 8 + 16 * i + 16 > len(data):
                break
            descs.append(struct.unpack_from("<QII", data, 8 + 16 * i))
        if sess.chunk_size:
            sess.chunks = []
            for addr, key, ln in descs:
                for k in range(ln // sess.chunk_size):
                    sess.chunks.append([addr + k * sess.chunk_size, key])
        lens = collections.Counter(d[2] for d in descs)
        keys = len({d[1] for d in descs})
        # Where the chunks lie (even whether they adjoin) is the server's
        # allocator's business: only their sizes and keys are shown.
        text = ("INFO_RSP sg_cnt=%d reserved=%s descs=%s keys=%d-distinct chunks=%d"
                % (sg_cnt, zero_or_hex(data[4:8]),
                   ",".join("%dx%d" % (n, ln) for ln, n in sorted(lens.items())),
                   keys, len(sess.chunks)))
        if len(descs) < sg_cnt:
            text += " (only %d descs in %d bytes)" % (len(descs), len(data))
        if len(data) > 8 + 16 * sg_cnt:
            text += " tail=%d bytes" % (len(data) - 8 - 16 * sg_cnt)
        return text

    def rkey_rsp(self, sess, data):
        _, buf_id, rkey = struct.unpack_from("<HHI", data, 0)
        rel = "?"
        if buf_id < len(sess.chunks):
            old = sess.chunks[buf_id][1]
            # The kernel's ib_inc_rkey: the low byte (the consumer's key
            # part) plus one, modulo 256; the MR index above it stays.
            if rkey == (old & ~0xff) | ((old + 1) & 0xff):
                rel = "prev+1"
            else:
                rel = "prev" if rkey == old else "new"
            sess.chunks[buf_id][1] = rkey
        return "RKEY_RSP buf_id=%d rkey=%s" % (buf_id, rel)

    def chunk_of(self, sess, va):
        for i, (addr, _) in enumerate(sess.chunks):
            if addr <= va < addr + sess.chunk_size:
                return i
        return None

    def write(self, st, reth, data, imm):
        sess = st.conn.sess
        va, rkey, dlen = struct.unpack(">QII", reth) if reth else (0, 0, len(data))
        parts = ["WRITE%s len=%d" % ("_IMM" if imm is not None else "", dlen)]
        if len(data) != dlen:
            parts.append("(carried %d)" % len(data))
        chunk, off = None, None
        if imm is not None:
            text, chunk, off = self.imm_text(imm, sess)
            parts.append("imm=" + text)
        if st.dir == "C>S" and dlen:
            parts.append(self.client_write(sess, va, rkey, data, chunk, off))
        elif st.dir == "S>C" and dlen:
            parts.append(self.server_write(sess, rkey, data))
        elif dlen == 0 and rkey:
            parts.append("rkey=nonzero")
        self.emit(st, " ".join(parts))

    def client_write(self, sess, va, rkey, data, chunk, off):
        """An IO request: data, user header, RTRS header, into a chunk."""
        where = self.chunk_of(sess, va) if sess.chunks else None
        if where is None:
            return "-> unknown buffer"
        base, key = sess.chunks[where]
        text = "-> chunk%d+%d rkey=%s" % (where, va - base, "chunk" if rkey == key else "STALE")
        if chunk is None or off is None:
            return text
        if chunk != where:
            text += " (imm names chunk %d)" % chunk
        h = off - (va - base)
        if h < 0 or h + 4 > len(data):
            return text + " rtrs header outside the write"
        typ, usr_len = struct.unpack_from("<HH", data, h)
        usr = data[h - usr_len:h] if usr_len <= h else b""
        dlen = h - usr_len
        if typ == 2:
            text += " WRITE data=%d usr_len=%d" % (dlen, usr_len)
            if h + 4 < len(data):
                text += " tail=%d" % (len(data) - h - 4)
        elif typ == 3 and h + 8 <= len(data):
            flags, sg_cnt = struct.unpack_from("<HH", data, h + 4)
            descs = [struct.unpack_from("<QII", data, h + 8 + 16 * i)
                     for i in range(sg_cnt) if h + 8 + 16 * i + 16 <= len(data)]
            text += (" READ usr_len=%d flags=%s sg_cnt=%d desc_len=%s"
                     % (usr_len, flag_names(flags, {0: "NEED_INVAL"}), sg_cnt,
                        ",".join(str(d[2]) for d in descs)))
            if descs:
                what = struct.unpack_from("<H", usr, 0)[0] if len(usr) >= 2 else None
                sess.reads[chunk] = {"key": descs[0][1], "what": what}
        else:
            text += " rtrs type=%d" % typ
        return text + " " + self.rnbd(usr)

    def server_write(self, sess, rkey, data):
        """Read data into a client buffer."""
        hit = [c for c, r in sess.reads.items() if r["key"] == rkey]
        if not hit:
            return "-> unknown client buffer"
        what = sess.reads[hit[0]]["what"]
        text = "-> read-desc of chunk%d" % hit[0]
        if what == 0 and len(data) >= 5:
            text += " RNBD SESS_INFO_RSP type=%d ver=%d reserved=%s" % (
                struct.unpack_from("<H", data, 0)[0], data[4], zero_or_hex(data[5:36]))
        elif what == 2 and len(data) >= 56:
            f = struct.unpack_from("<HHIQIIIIIHHHHBB", data, 0)
            text += (" RNBD OPEN_RSP type=%d device_id=%d nsectors=%d max_hw_sectors=%d"
                     " max_write_same_or_zeroes=%d max_discard_sectors=%d discard_granularity=%d"
                     " discard_alignment=%d physical_block_size=%d logical_block_size=%d"
                     " max_segments=%d secure_discard=%d rotational=%d cache_policy=0x%x reserved=%s"
                     % (f[0], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11],
                        f[12], f[13], f[14], zero_or_hex(data[46:56])))
        return text

    def rnbd(self, usr):
        if len(usr) < 4:
            return "usr=%s" % usr.hex()
        t = struct.unpack_from("<H", usr, 0)[0]
        name = RNBD_MSG.get(t, "type%d" % t)
        if t == 0 and len(usr) >= 36:
            return "RNBD SESS_INFO ver=%d reserved=%s" % (usr[4], zero_or_hex(usr[5:36]))
        if t == 2 and len(usr) >= 264:
            dev = usr[6:261].split(b"\0")[0].decode("utf-8", "replace")
            return "RNBD OPEN access_mode=%s dev_name=%s" % (ACCESS.get(usr[4], usr[4]), dev)
        if t == 4 and len(usr) >= 26:
            dev_id, sector, rw, size, prio = struct.unpack_from("<IQIIH", usr, 4)
            return "RNBD IO dev=%d sector=%d op=%s flags=%s size=%d prio=%d" % (
                dev_id, sector, RNBD_OPS.get(rw & 0xff, rw & 0xff),
                flag_names(rw & ~0xff, RNBD_FLAGS), size, prio)
        if t == 5 and len(usr) >= 8:
            return "RNBD CLOSE dev=%d" % struct.unpack_from("<I", usr, 4)[0]
        return "RNBD %s len=%d" % (name, len(usr))


class Trace:
    """A decoded conversation: setup lines, and the lines of each stream
    (connection and direction) up to its first capture gap."""

    def __init__(self, events, closed):
        self.events = events     # (stream key or None, line)
        self.closed = closed     # it holds a DREQ: not cut off
        self.setup = [line for key, line in events if key is None and not is_teardown(line)]
        self.teardown = [line for key, line in events if key is None and is_teardown(line)]
        self.streams = collections.OrderedDict()
        self.gapped = set()
        for key, line in events:
            if key is None:
                continue
            lines = self.streams.setdefault(key, [])
            if line.endswith(AFTER_GAP):
                self.gapped.add(key)
            elif key not in self.gapped and not line.endswith(TIMER):
                lines.append(line)


def is_teardown(line):
    return line.split(" ")[2:3] in (["DREQ"], ["DREP"])


def trace_of(path):
    """A capture through the decoder, or the text decode printed."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise WireError("%s: %s" % (path, e.strerror))
    if head and head[:1] in (b"c", b"#"):
        events = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line or line.startswith("#"):
                    continue
                w = line.split(" ", 2)
                if w[0] == "cm":
                    events.append((None, line))
                elif w[0].startswith("cid") and len(w) == 3 and w[1] in ("C>S", "S>C"):
                    events.append(((w[0], w[1]), line))
                else:
                    raise WireError("%s:%d: not a line of rtrs-wire decode: %s" % (path, n, line))
        return Trace(events, any(k is None and " DREQ " in l + " " for k, l in events))
    d = Decoder()
    for frame, src, dst, payload in read_packets(path):
        try:
            d.packet(src, dst, payload)
        except (struct.error, IndexError, WireError) as e:
            raise WireError("%s: frame %d: malformed packet (%s)" % (path, frame, e))
    t = Trace(d.events, d.closed)
    t.stats = d.stats
    return t


def cmd_decode(args):
    t = trace_of(args.pcap)
    shown = collections.Counter()
    for key, text in t.events:
        if key is not None:
            shown[key] += 1
            if args.first and shown[key] > args.first:
                continue
        print(text)
    for k, v in sorted(getattr(t, "stats", {}).items()):
        print("# %s: %d" % (k, v))
    return 0


def cmd_compare(args):
    a, b = trace_of(args.ref), trace_of(args.pcap)
    # A capture without a DREQ was cut off, and one with a gap stops being
    # comparable there: such a stream bounds how far both are compared. A
    # stream of a complete capture that is shorter is a difference.
    keys = sorted(set(a.streams) | set(b.streams))
    limits = {}
    for key in keys:
        n = args.first
        for t in (a, b):
            if key in t.gapped or not t.closed:
                n = min(n, len(t.streams.get(key, [])))
        limits[key] = n

    def canonical(t):
        out = list(t.setup)
        for key in keys:
            out.append("== %s %s: first %d messages" % (key[0], key[1], limits[key]))
            out.extend(t.streams.get(key, [])[:limits[key]])
        # The disconnect only when both captures reach it, and only who
        # asked to disconnect which connection: the other side may send a
        # DREQ of its own across the client's, and in any order.
        if a.closed and b.closed:
            out.append("== teardown: the client's DREQs")
            out.extend(sorted({l for l in t.teardown if " C>S DREQ " in l}))
        return out

    def shape(line):
        line = re.sub(r"\b(dev_name|pathname|rkey)=\S+", r"\1=*", line)
        line = re.sub(r"\bchunk\d+\+\d+", "chunk#+#", line)
        return re.sub(r"=(?=[^\s,()]*\d)[^\s,()]+", "=#", line)

    la, lb = canonical(a), canonical(b)
    if args.shape:
        la, lb = [shape(x) for x in la], [shape(x) for x in lb]
    if la == lb:
        print("equal: setup (%d CM messages) and the first messages of each stream: %s" % (
            len(a.setup), ", ".join("%s %s %d" % (k[0], k[1], min(n, len(a.streams.get(k, []))))
                                    for k, n in limits.items())))
        return 0
    sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in la], [x + "\n" for x in lb],
                                               args.ref, args.pcap, n=2))
    return 1


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head: no traceback
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("decode")
    p.add_argument("pcap")
    p.add_argument("--first", type=int, default=0, help="messages per stream (0: all)")
    p = sub.add_parser("compare")
    p.add_argument("ref")
    p.add_argument("pcap")
    p.add_argument("--first", type=int, default=40, help="messages per stream")
    p.add_argument("--shape", action="store_true", help="mask values (docstring)")
    args = ap.parse_args()
    try:
        return cmd_decode(args) if args.cmd == "decode" else cmd_compare(args)
    except WireError as e:
        print("rtrs-wire: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
