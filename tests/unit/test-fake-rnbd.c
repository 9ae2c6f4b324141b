/* SPDX-License-Identifier: MIT */
/*
 * RNBD with kernel peers over the fake fabric (docs/protocol.md, "Kernel
 * peers"; librnbd linked with the fabric-level test hooks of rtrs-pri.h).
 * librnbd's client, facing a server that speaks only the kernel's RTRS,
 * sends a PREFLUSH write as a FLUSH and then the write without the flag (a
 * kernel rnbd-server before 7.0 drops it), a FUA discard without the flag
 * and a FLUSH after it (a kernel's block layer fails it), and never write
 * zeroes (an old kernel's operation 5 was WRITE_SAME). Its server, facing a kernel
 * client, offers no write zeroes and refuses operation 5, and serves what
 * such a client sends: FUA and SYNC writes, its FLUSH, an empty FUA write
 * (an old kernel's flush), SYNC reads.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fake-main.h"
#include "rnbd-hooks.h"
#include "rnbd-proto.h"
#include "rnbd.h"
#include "rtrs-pri.h"

#define DEV "m"
#define DEV_BYTES (1u << 20)

static struct rnbd_srv *rsrv;

static uint16_t get16(const uint8_t *p, size_t off)
{
	return (uint16_t)(p[off] | p[off + 1] << 8);
}

static uint32_t get32(const uint8_t *p, size_t off)
{
	return get16(p, off) | (uint32_t)get16(p, off + 2) << 16;
}

/*
 * librnbd's server with a memory device; kernel: its transport answers as
 * a kernel server does (every client then is a kernel client to it).
 */
static bool rnbd_up(bool kernel)
{
	struct rnbd_srv_opts o;
	int rc;

	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.provider = "fake";
	o.rtrs.port = 0;
	o.rtrs.queue_depth = 16;
	o.rtrs.max_chunk_size = 65536;
	o.rtrs.always_invalidate = 0;
	o.rtrs.hb_interval_ms = HB_NEVER;
	o.mem_devices = DEV ":1M";
	o.engine = "threads";
	atomic_store(&rtrs_test_kernel_srv, kernel);
	rc = rnbd_srv_open(&o, &rsrv);
	CHECK(rc == 0, "rnbd server: %s", strerror(-rc));
	if (rc)
		return false;
	/* Listening starts on the transport's loop, 1 ms after the open. */
	CHECK_EQ(fake_advance(1), 0);
	srv.port = rnbd_srv_port(rsrv, 1000);
	CHECK(srv.port > 0, "port %d", srv.port);
	return srv.port > 0;
}

static void rnbd_down(void)
{
	CHECK_EQ(fake_settle(), 0);
	rnbd_srv_close(rsrv);
	rsrv = NULL;
	CHECK_EQ(fake_settle(), 0);
}

/* ---- librnbd's client ------------------------------------------------------------------ */

/* The IO message of an RTRS write request (rnbd rw), or -1: [data | msg | rtrs write hdr]. */
static int64_t req_rw(const struct fake_ev *ev)
{
	const uint8_t *d = ev->data, *h, *m;
	uint16_t usr;

	if (ev->len < 4)
		return -1;
	h = d + ev->len - 4;
	usr = get16(h, 2);
	if (get16(h, 0) != RTRS_MSG_WRITE || usr < sizeof(struct rnbd_msg_io) || usr + 4u > ev->len)
		return -1;
	m = h - usr;
	return get16(m, 0) == RNBD_MSG_IO ? (int64_t)get32(m, 16) : -1;
}

/* A completion (librnbd's done, librtrs's conf): how many, and the last result. */
struct done {
	atomic_int calls, result;
};

static void io_done(void *priv, int result)
{
	struct done *d = priv;

	atomic_store(&d->result, result);
	atomic_fetch_add(&d->calls, 1);
	fake_notify();
}

static bool io_called(void *arg)
{
	return atomic_load(&((struct done *)arg)->calls) > 0;
}

/*
 * An IO through librnbd, which should take `expect` requests: their IO
 * messages, in order, in rws. How many there were, up to one more.
 */
static unsigned submit_seen(struct rnbd_clt_dev *d, enum rnbd_clt_op op, uint32_t flags,
			    uint64_t offset, uint8_t *buf, uint32_t len, unsigned expect,
			    int64_t *rws)
{
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct done dn = { 0 };
	struct fake_ev *ev;
	unsigned n = 0;

	fake_hold(match, &req);
	CHECK_EQ(rnbd_clt_submit(d, op, flags, offset, buf, len, io_done, &dn), 0);
	while (n < expect && (ev = fake_wait_ev(match, &req, "a request"))) {
		rws[n++] = req_rw(ev);
		CHECK_EQ(fake_deliver(ev), 0);
	}
	CHECK_EQ(fake_wait(io_called, &dn, "the write's completion"), 0);
	CHECK_EQ(fake_settle(), 0);
	if ((ev = fake_find(match, &req))) {
		rws[n++] = req_rw(ev);
		fake_unclaim(ev);
	}
	fake_hold(NULL, NULL);
	CHECK_EQ(atomic_load(&dn.result), 0);
	CHECK_EQ(atomic_load(&dn.calls), 1);
	return n;
}

/* A PREFLUSH write, as submit_seen. */
static unsigned preflush_write(struct rnbd_clt_dev *d, uint8_t *buf, unsigned expect,
			       int64_t *rws)
{
	return submit_seen(d, RNBD_CLT_WRITE, RNBD_CLT_F_PREFLUSH, 8192, buf, 4096, expect, rws);
}

/* librnbd's client on a session to the server; its device mapped read-write. */
static bool clt_map(struct clt *c, struct rnbd_clt_sess **s, struct rnbd_clt_dev **d)
{
	int rc;

	clt_init(c, "r", "a");
	c->o.path_ev = NULL; /* its priv is librnbd's */
	rc = rnbd_clt_sess_open(&c->o, s);
	CHECK(rc == 0, "session: %s", strerror(-rc));
	if (rc)
		return false;
	rc = rnbd_clt_map(*s, DEV, RNBD_CLT_RW, d);
	CHECK(rc == 0, "map: %s", strerror(-rc));
	if (rc)
		rnbd_clt_sess_close(*s);
	return rc == 0;
}

/*
 * A PREFLUSH write to a server whose transport speaks only the kernel's
 * RTRS (kernel) or ours, then reading it back and write zeroes with
 * NOUNMAP; the requests the write took, in rws (expect of them). How many.
 */
static unsigned preflush_on(bool kernel, uint8_t seed, unsigned expect, int64_t *rws)
{
	static uint8_t w[4096], r[4096];
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	unsigned n;
	struct clt c;

	if (!rnbd_up(kernel))
		return 0;
	if (!clt_map(&c, &s, &d)) {
		rnbd_down();
		return 0;
	}
	pattern(w, sizeof(w), seed);
	n = preflush_write(d, w, expect, rws);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, 0, 8192, r, sizeof(r)), 0);
	CHECK(!memcmp(r, w, sizeof(r)), "read back");
	/* A kernel server would drop NOUNMAP: refused before anything goes. */
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE_ZEROES, RNBD_CLT_F_NOUNMAP, 0, NULL, 4096),
		 kernel ? -EOPNOTSUPP : 0);
	rnbd_clt_sess_close(s);
	clt_close(&c);
	rnbd_down();
	return n;
}

/*
 * A server that speaks only the kernel's RTRS would drop the PREFLUSH: a
 * FLUSH goes first, then the write without it, and the data lands.
 */
static void rnbd_preflush_kernel_server(void)
{
	int64_t rws[4] = { -1, -1, -1, -1 };

	CHECK_EQ(preflush_on(true, 31, 2, rws), 2);
	CHECK_EQ(rws[0] & RNBD_OP_MASK, RNBD_OP_FLUSH);
	CHECK_EQ(rws[0] & ~(int64_t)RNBD_OP_MASK, RNBD_F_SYNC);
	CHECK_EQ(rws[1] & RNBD_OP_MASK, RNBD_OP_WRITE);
	CHECK(!(rws[1] & RNBD_F_PREFLUSH), "the write goes without PREFLUSH: %#llx",
	      (long long)rws[1]);
}

/* A server of ours takes the PREFLUSH with the write (one request), and NOUNMAP. */
static void rnbd_preflush_project_server(void)
{
	int64_t rws[4] = { -1, -1, -1, -1 };

	CHECK_EQ(preflush_on(false, 32, 1, rws), 1);
	CHECK_EQ(rws[0] & RNBD_OP_MASK, RNBD_OP_WRITE);
	CHECK(rws[0] & RNBD_F_PREFLUSH, "PREFLUSH with the write: %#llx", (long long)rws[0]);
}

/* An OPEN_RSP on its way to the client (the read data of an OPEN). */
static bool is_open_rsp(const struct fake_ev *ev, void *arg)
{
	(void)arg;
	return ev->kind == FAKE_WRITE && !ev->to_server &&
	       ev->len >= sizeof(struct rnbd_msg_open_rsp) &&
	       get16(ev->data, 0) == RNBD_MSG_OPEN_RSP;
}

/*
 * The OPEN_RSP as a kernel server before Linux 5.18 sends it for a disk
 * that does WRITE SAME: bytes 20..23 (max_write_zeroes_sectors to us) are
 * its max_write_same_sectors.
 */
static void offer_write_same(struct fake_ev *ev, void *arg)
{
	uint8_t m[sizeof(struct rnbd_msg_open_rsp)];

	memcpy(m, ev->data, sizeof(m));
	m[20] = 0xff, m[21] = 0xff, m[22] = 0x3f, m[23] = 0;
	CHECK_EQ(fake_rewrite(ev, m, sizeof(m)), 0);
	fake_unclaim(ev);
	*(bool *)arg = true;
}

/*
 * FUA on a discard and write zeroes offered, from a server that speaks only
 * the kernel's RTRS (kernel) or ours. A kernel server's block layer fails a
 * FUA that is not on a write (Linux 6.3 on), so the discard goes without it
 * and a FLUSH after it; and its max_write_zeroes_sectors may be an old
 * kernel's max_write_same_sectors (operation 5 was WRITE_SAME), so write
 * zeroes are not used with it. A server of ours takes both as they are.
 */
static void fua_trim_on(bool kernel)
{
	static uint8_t w[4096], r[4096], zero[4096];
	struct rnbd_clt_dev_info info = { .size = sizeof(info) };
	int64_t rws[4] = { -1, -1, -1, -1 };
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	bool patched = false;
	struct clt c;

	if (!rnbd_up(kernel))
		return;
	fake_on_post(is_open_rsp, NULL, offer_write_same, &patched);
	if (!clt_map(&c, &s, &d)) {
		fake_on_post(NULL, NULL, NULL, NULL);
		rnbd_down();
		return;
	}
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(patched, "the OPEN_RSP went by");
	CHECK_EQ(rnbd_clt_dev_info(d, &info), 0);
	CHECK(info.write_zeroes == !kernel, "write zeroes %s", info.write_zeroes ? "offered" : "not");
	CHECK(info.discard, "discard offered");
	if (kernel)
		CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE_ZEROES, 0, 0, NULL, 4096), -EOPNOTSUPP);
	pattern(w, sizeof(w), 71);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE, 0, 8192, w, sizeof(w)), 0);
	CHECK_EQ(submit_seen(d, RNBD_CLT_DISCARD, RNBD_CLT_F_FUA, 8192, NULL, 4096, kernel ? 2 : 1,
			     rws), kernel ? 2u : 1u);
	CHECK_EQ(rws[0] & RNBD_OP_MASK, RNBD_OP_DISCARD);
	CHECK_EQ(rws[0] & ~(int64_t)RNBD_OP_MASK, kernel ? 0 : RNBD_F_FUA);
	if (kernel) {
		CHECK_EQ(rws[1] & RNBD_OP_MASK, RNBD_OP_FLUSH);
		CHECK_EQ(rws[1] & ~(int64_t)RNBD_OP_MASK, RNBD_F_SYNC);
	}
	/* The memory device gives discarded blocks back as zeros. */
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, 0, 8192, r, sizeof(r)), 0);
	CHECK(!memcmp(r, zero, sizeof(r)), "discarded");
	rnbd_clt_sess_close(s);
	clt_close(&c);
	rnbd_down();
}

static void rnbd_fua_trim_kernel_server(void)
{
	fua_trim_on(true);
}

static void rnbd_fua_trim_project_server(void)
{
	fua_trim_on(false);
}

/* ---- a kernel client, RNBD by hand ------------------------------------------------------ */

/* One RNBD message as the user header of an RTRS request; the answer's errno. */
static int by_hand(struct clt *c, enum rtrs_dir dir, const void *msg, size_t msglen, void *data,
		   size_t len)
{
	struct done a = { 0 };
	struct rtrs_clt_req_ops ops = { .priv = &a, .conf = io_done };
	struct iovec usr = { (void *)msg, msglen }, iov = { data, len };
	struct rtrs_permit *p = rtrs_clt_get_permit(c->sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT);
	int rc;

	if (!p)
		return -ENOBUFS;
	rc = rtrs_clt_request(c->sess, dir, &ops, p, &usr, 1, &iov, len ? 1 : 0);
	if (!rc)
		rc = fake_wait(io_called, &a, "an RNBD answer") ? -ETIMEDOUT : atomic_load(&a.result);
	rtrs_clt_put_permit(c->sess, p);
	return rc;
}

static int io_by_hand(struct clt *c, uint32_t id, enum rnbd_io_op op, uint32_t flags,
		      uint64_t sector, void *data, uint32_t len)
{
	struct rnbd_io io = { .device_id = id, .sector = sector, .op = op, .flags = flags,
			      .bi_size = len };
	struct rnbd_msg_io m;
	bool has_data = op == RNBD_OP_READ || op == RNBD_OP_WRITE;

	rnbd_io_encode(&m, &io);
	return by_hand(c, op == RNBD_OP_READ ? RTRS_READ : RTRS_WRITE, &m, sizeof(m),
		       has_data ? data : NULL, has_data ? len : 0);
}

/* SESS_INFO and OPEN of DEV, by hand: the answer in *rsp. */
static int open_by_hand(struct clt *c, struct rnbd_open_rsp *rsp)
{
	static struct rnbd_msg_sess_info si, si_rsp;
	static struct rnbd_msg_open om;
	static struct rnbd_msg_open_rsp orsp;
	struct rnbd_open o = { .access_mode = RNBD_ACCESS_RW, .dev_name = DEV };
	const char *why = NULL;
	unsigned ver;
	int rc;

	rnbd_sess_info_encode(&si, false, RNBD_PROTO_VER_MAJOR);
	rc = by_hand(c, RTRS_READ, &si, sizeof(si), &si_rsp, sizeof(si_rsp));
	if (!rc)
		rc = rnbd_sess_info_decode(&si_rsp, sizeof(si_rsp), true, &ver, &why);
	rnbd_open_encode(&om, &o);
	if (!rc)
		rc = by_hand(c, RTRS_READ, &om, sizeof(om), &orsp, sizeof(orsp));
	if (!rc)
		rc = rnbd_open_rsp_decode(&orsp, sizeof(orsp), rsp, &why);
	return rc;
}

/*
 * A kernel client (its RTRS without the extension bit) sends what a
 * kernel rnbd-client sends: it is offered no write zeroes, and operation
 * 5 is refused (-EOPNOTSUPP); its SYNC and FUA writes, its FLUSH (SYNC and
 * FUA, as op_is_flush gives; and as its block layer's flush request comes:
 * an RTRS read at sector -1), an empty FUA write (an old kernel's flush)
 * and SYNC reads are served, the data in place.
 */
static void rnbd_kernel_client(void)
{
	static uint8_t w[4096], r[4096];
	struct rnbd_open_rsp rsp;
	struct clt c;

	if (!rnbd_up(false))
		return;
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "a");
	CHECK_EQ(clt_open(&c), 0);
	CHECK_EQ(open_by_hand(&c, &rsp), 0);
	CHECK_EQ(rsp.max_write_zeroes_sectors, 0);
	CHECK_EQ(rsp.nsectors, DEV_BYTES >> 9);
	CHECK_EQ(rsp.max_segments, 128); /* as the kernel's server for an ordinary device */
	CHECK(rsp.max_discard_sectors > 0, "discard is offered");
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_WRITE_ZEROES, 0, 0, NULL, 4096),
		 -EOPNOTSUPP);
	CHECK(env_logged("operation 5 from a kernel client refused"));
	pattern(w, sizeof(w), 33);
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_WRITE, RNBD_F_SYNC | RNBD_F_FUA, 16, w,
			    sizeof(w)), 0);
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_FLUSH, RNBD_F_SYNC | RNBD_F_FUA, 0, NULL, 0),
		 0);
	{
		/*
		 * The flush as a 6.1 kernel client sends its block layer's flush
		 * request (mkfs.ext4's fsync): an RTRS read (rq_data_dir of
		 * REQ_OP_FLUSH), sector (sector_t)-1, PREFLUSH.
		 */
		struct rnbd_io io = { .device_id = rsp.device_id, .sector = UINT64_MAX,
				      .op = RNBD_OP_FLUSH,
				      .flags = RNBD_F_SYNC | RNBD_F_PREFLUSH };
		struct rnbd_msg_io m;

		rnbd_io_encode(&m, &io);
		CHECK_EQ(by_hand(&c, RTRS_READ, &m, sizeof(m), NULL, 0), 0);
	}
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_WRITE, RNBD_F_FUA, 0, NULL, 0), 0);
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_READ, RNBD_F_SYNC, 16, r, sizeof(r)), 0);
	CHECK(!memcmp(r, w, sizeof(r)), "read back");
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_DISCARD, RNBD_F_SYNC, 16, NULL, 4096), 0);
	clt_close(&c);
	rnbd_down();
}

/* A client of ours on the same server is offered write zeroes, and they are served. */
static void rnbd_project_client(void)
{
	struct rnbd_open_rsp rsp;
	struct clt c;

	if (!rnbd_up(false))
		return;
	clt_init(&c, "p", "a");
	CHECK_EQ(clt_open(&c), 0);
	CHECK_EQ(open_by_hand(&c, &rsp), 0);
	CHECK(rsp.max_write_zeroes_sectors > 0, "write zeroes offered");
	CHECK_EQ(io_by_hand(&c, rsp.device_id, RNBD_OP_WRITE_ZEROES, 0, 0, NULL, 4096), 0);
	clt_close(&c);
	rnbd_down();
}

static void dev_count(void *priv, const struct rnbd_srv_dev_stats *st)
{
	(void)st;
	(*(unsigned *)priv)++;
}

/* Devices the server has open, over all sessions. */
static unsigned srv_devs(void)
{
	unsigned n = 0;

	CHECK(rnbd_srv_list(rsrv, dev_count, &n) >= 0, "rnbd_srv_list");
	return n;
}

static bool srv_no_devs(void *arg)
{
	(void)arg;
	return srv_devs() == 0;
}

/*
 * Both paths fail at the client, one of them at the client only (the
 * server keeps it, and so the server session), and the device is
 * unmapped meanwhile: its CLOSE waits
 * and goes once a path is back, to the same server session. Before, it
 * was left out, and the server kept the device (and its writer slot)
 * open until the session ended. Mapped again, it opens.
 */
static void rnbd_unmap_while_down(void)
{
	static uint8_t w[4096], r[4096];
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	struct clt c;

	if (!rnbd_up(false))
		return;
	clt_init(&c, "u", "ab");
	c.o.path_ev = NULL; /* its priv is librnbd's */
	CHECK_EQ(rnbd_clt_sess_open(&c.o, &s), 0);
	CHECK_EQ(rnbd_clt_map(s, DEV, RNBD_CLT_RW, &d), 0);
	CHECK_EQ(srv_devs(), 1);
	CHECK_EQ(fake_fail("u", "a", -1, -ECONNRESET, 0), 2);
	CHECK_EQ(fake_fail("u", "b", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(rnbd_clt_unmap(d, false), 0);
	CHECK_EQ(srv_devs(), 1);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(srv_no_devs, NULL, "the server to close the device"), 0);
	CHECK_EQ(rnbd_clt_map(s, DEV, RNBD_CLT_RW, &d), 0);
	CHECK(env_logged("unmapped while no path was up, closed on the server"),
	      "the CLOSE went after the reconnect");
	CHECK(!env_logged("a new session for us"), "the server session stayed");
	pattern(w, sizeof(w), 61);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE, 0, 0, w, sizeof(w)), 0);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, 0, 0, r, sizeof(r)), 0);
	CHECK(!memcmp(r, w, sizeof(r)), "read back");
	rnbd_clt_sess_close(s);
	clt_close(&c);
	rnbd_down();
}

/*
 * Both paths go down at the server while its store holds a write: the
 * RTRS session stays for that request, the RNBD session and its devices
 * are gone (DISCONNECTED). The path that links the session up again makes
 * a new RNBD session of it; the client hears of a new server session and
 * opens its device again, so its IO goes on (without it, every request
 * failed with EPROTO for good: "request before SESS_INFO").
 */
static struct rnbd_breq *_Atomic held_r;

static bool hold_first(void *priv, struct rnbd_breq *r)
{
	struct rnbd_breq *none = NULL;
	bool took = atomic_compare_exchange_strong(&held_r, &none, r);

	(void)priv;
	if (took)
		fake_notify();
	return took;
}

static bool req_held(void *arg)
{
	(void)arg;
	return atomic_load(&held_r) != NULL;
}

/*
 * The fake clock moves on (reconnect delays, heartbeats) until pred holds,
 * for up to 30 s of real time: what it waits for may also take real time
 * (a release thread, an OPEN asked again after -EBUSY).
 */
static bool advance_until(bool (*pred)(void *arg), void *arg)
{
	for (uint64_t end = now_ms() + 30000; !pred(arg) && now_ms() < end;) {
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
		CHECK_EQ(fake_settle(), 0);
		usleep(5000);
	}
	return pred(arg);
}

/* An IO after the paths went down: the fake clock moves while it waits. */
struct relink_io {
	struct rnbd_clt_dev *d;
	enum rnbd_clt_op op;
	uint64_t off;
	uint8_t *buf;
	atomic_int rc;
	atomic_bool done;
};

static void *relink_io_fn(void *arg)
{
	struct relink_io *r = arg;

	atomic_store(&r->rc, rnbd_clt_io(r->d, r->op, 0, r->off, r->buf, 4096));
	atomic_store(&r->done, true);
	fake_notify();
	return NULL;
}

static bool relink_io_done(void *arg)
{
	return atomic_load(&((struct relink_io *)arg)->done);
}

static int relink_io(struct rnbd_clt_dev *d, enum rnbd_clt_op op, uint64_t off, uint8_t *buf)
{
	struct relink_io r = { .d = d, .op = op, .off = off, .buf = buf };
	pthread_t t;

	CHECK_EQ(pthread_create(&t, NULL, relink_io_fn, &r), 0);
	advance_until(relink_io_done, &r);
	pthread_join(t, NULL);
	return atomic_load(&r.rc);
}

static void rnbd_relink_forgets_devices(void)
{
	static uint8_t w[4096], w2[4096], r[4096];
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	struct done dn = { 0 };
	struct clt c;

	if (!rnbd_up(false))
		return;
	clt_init(&c, "v", "ab");
	c.o.path_ev = NULL;
	CHECK_EQ(rnbd_clt_sess_open(&c.o, &s), 0);
	CHECK_EQ(rnbd_clt_map(s, DEV, RNBD_CLT_RW, &d), 0);
	pattern(w, sizeof(w), 7);
	pattern(w2, sizeof(w2), 8);
	atomic_store(&held_r, NULL);
	rnbd_store_set_hold_hook(hold_first, NULL);
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_WRITE, 0, 0, w, sizeof(w), io_done, &dn), 0);
	CHECK_EQ(fake_wait(req_held, NULL, "the store to hold the write"), 0);
	rnbd_store_set_hold_hook(NULL, NULL);
	CHECK_EQ(fake_fail("v", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_fail("v", "b", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	/* b links the session up again while the write is held (a waits for it). */
	for (int i = 0; i < 10; i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_settle(), 0);
	/* The held write goes (the device's reopening waits for it, as for any old IO). */
	rnbd_store_resume(atomic_load(&held_r));
	CHECK(advance_until(io_called, &dn) && atomic_load(&dn.result) == 0,
	      "the held write completed: %d (%d calls)", atomic_load(&dn.result),
	      atomic_load(&dn.calls));
	CHECK_EQ(relink_io(d, RNBD_CLT_WRITE, 16384, w2), 0);
	CHECK_EQ(relink_io(d, RNBD_CLT_READ, 16384, r), 0);
	CHECK(!memcmp(r, w2, sizeof(r)), "the bytes written after the relink read back");
	CHECK_EQ(relink_io(d, RNBD_CLT_READ, 0, r), 0);
	CHECK(!memcmp(r, w, sizeof(r)), "the held write's bytes are there");
	CHECK_EQ(srv_devs(), 1);
	CHECK_EQ(fake_settle(), 0);
	rnbd_clt_sess_close(s);
	clt_close(&c);
	rnbd_down();
}

/* b goes down while a's reconnect is in its handshake; no IO in flight. */
static void rnbd_relink_during_handshake(void)
{
	static uint8_t w[4096], r[4096];
	struct m info_a = { .kind = FAKE_SEND, .dir = TO_SRV, .host = "a",
			    .msg = MSG(RTRS_MSG_INFO_REQ) };
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	struct fake_ev *ev;
	struct clt c;

	if (!rnbd_up(false))
		return;
	clt_init(&c, "h", "ab");
	c.o.path_ev = NULL;
	CHECK_EQ(rnbd_clt_sess_open(&c.o, &s), 0);
	CHECK_EQ(rnbd_clt_map(s, DEV, RNBD_CLT_RW, &d), 0);
	fake_hold(match, &info_a);
	CHECK_EQ(fake_fail("h", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(2 * RECONNECT_MS), 0);
	ev = fake_wait_ev(match, &info_a, "a's information request");
	CHECK_EQ(fake_fail("h", "b", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	fake_hold(NULL, NULL);
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	CHECK_EQ(fake_settle(), 0);
	pattern(w, sizeof(w), 9);
	CHECK_EQ(relink_io(d, RNBD_CLT_WRITE, 8192, w), 0);
	CHECK_EQ(relink_io(d, RNBD_CLT_READ, 8192, r), 0);
	CHECK(!memcmp(r, w, sizeof(r)), "the bytes written after the relink read back");
	CHECK_EQ(srv_devs(), 1);
	rnbd_clt_sess_close(s);
	clt_close(&c);
	rnbd_down();
}

static const struct scenario scenarios[] = {
	{ "rnbd_preflush_kernel_server", rnbd_preflush_kernel_server },
	{ "rnbd_preflush_project_server", rnbd_preflush_project_server },
	{ "rnbd_fua_trim_kernel_server", rnbd_fua_trim_kernel_server },
	{ "rnbd_fua_trim_project_server", rnbd_fua_trim_project_server },
	{ "rnbd_kernel_client", rnbd_kernel_client },
	{ "rnbd_project_client", rnbd_project_client },
	{ "rnbd_unmap_while_down", rnbd_unmap_while_down },
	{ "rnbd_relink_during_handshake", rnbd_relink_during_handshake },
	{ "rnbd_relink_forgets_devices", rnbd_relink_forgets_devices },
};

int main(int argc, char **argv)
{
	return fake_main(argc, argv, scenarios, ARRAY_SIZE(scenarios), "fake-rnbd");
}
