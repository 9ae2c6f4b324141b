/* SPDX-License-Identifier: MIT */
/*
 * Deterministic scenarios of the client and server cores over the fake
 * fabric (lib/rtrs/rtrs-fabric-fake.h): IO placed byte for byte, requests
 * and responses split over several writes, full send queues, heartbeats
 * missed and reordered, duplicated and forged immediates, failover after a
 * fence with a response lost, a path failing while it carries a fence,
 * parked requests sent again exactly once, reconnects racing a close,
 * connections failing mid-handshake, a server restart, a stale chunk key
 * refused under always_invalidate, and writes registered per IO whose
 * acknowledgement comes after their response. Each step is an event the
 * scenario delivers, drops, duplicates or holds, and timers fire only when
 * the scenario moves the loops' clock: no sleeps, no timing luck.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "fake-main.h"

/* A server with default options and one client "s" whose paths go to hosts. */
static bool setup(struct clt *c, const char *hosts, void (*tweak)(struct rtrs_srv_opts *so,
								 struct rtrs_clt_opts *o))
{
	struct rtrs_srv_opts so;
	int rc;

	srv_opts(&so);
	if (tweak)
		tweak(&so, NULL);
	rc = srv_start(&so);
	CHECK(rc == 0, "server: %s", strerror(-rc));
	if (rc)
		return false;
	clt_init(c, "s", hosts);
	if (tweak)
		tweak(NULL, &c->o);
	rc = clt_open(c);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc) {
		srv_stop();
		return false;
	}
	return true;
}

static void teardown(struct clt *c)
{
	CHECK_EQ(env_teardown(c), 0);
}

/* The request completed once, with err; its permit goes back. */
static void io_done_once(struct io *io, int err)
{
	CHECK_EQ(io_wait(io), err);
	CHECK_EQ(atomic_load(&io->calls), 1);
	io_put(io);
}

/* Writes with an immediate of type imm that reached hosts's server end / client end. */
static unsigned delivered(int dir, const char *host, int imm)
{
	struct m m = { .kind = FAKE_WRITE, .dir = dir, .host = host, .imm = imm };

	return fake_delivered(match, &m);
}

/* ---- IO -------------------------------------------------------------------------------------------- */

/* Open, write a pattern, read it back: the bytes are the bytes, in the server's area too. */
static void io_exact(void)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK(io_roundtrip(&c, 0, 1), "write then read at 0");
	CHECK(io_roundtrip(&c, 5 * LEN, 2), "write then read at 5 x LEN");
	CHECK(area_has(0, LEN, 1) && area_has(5 * LEN, LEN, 2), "both patterns in the area");
	CHECK_EQ(atomic_load(&srv.rdma_evs), 4);
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_IO_REQ_IMM)), 4);
	CHECK_EQ(delivered(TO_CLT, "a", IMM(RTRS_IO_RSP_IMM)), 4);
	teardown(&c);
}

/*
 * A fabric without wait fds for its queues (the fake one, RDMA devices):
 * rtrs_clt_poll says so at once, whatever its timeout, and requests
 * complete on the library's threads as ever.
 */
static void poll_unsupported(void)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(rtrs_clt_poll(c.sess, 0), -EOPNOTSUPP);
	CHECK_EQ(rtrs_clt_poll(c.sess, 60000), -EOPNOTSUPP);
	CHECK(io_roundtrip(&c, 0, 3), "write then read at 0");
	CHECK_EQ(rtrs_clt_poll(c.sess, -1), -EOPNOTSUPP);
	teardown(&c);
}

/*
 * Two local vectors and two remote ranges per write: a write request of
 * five vectors goes as three writes (the last with the immediate), and a
 * read of five vectors comes back as three.
 */
static void io_split(void)
{
	static uint8_t out[5][600], in[5][600];
	static struct io io;
	struct m srv_w = { .kind = FAKE_WRITE, .dir = TO_SRV };
	struct m clt_w = { .kind = FAKE_WRITE, .dir = TO_CLT };
	struct iovec d[5];
	struct clt c;
	unsigned n0;

	fake_set_limits(2, 2);
	if (!setup(&c, "a", NULL))
		return;
	for (int i = 0; i < 5; i++) {
		pattern(out[i], sizeof(out[i]), (uint8_t)(40 + i));
		d[i] = (struct iovec){ out[i], sizeof(out[i]) };
	}
	n0 = fake_delivered(match, &srv_w);
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 3 * LEN, d, 5), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	/* 5 vectors and the header: 6 local vectors, 2 a write. */
	CHECK_EQ(fake_delivered(match, &srv_w) - n0, 3);
	for (int i = 0; i < 5; i++)
		CHECK(!memcmp(srv.area + 3 * LEN + i * 600, out[i], 600), "vector %d in the area", i);

	for (int i = 0; i < 5; i++)
		d[i] = (struct iovec){ in[i], sizeof(in[i]) };
	n0 = fake_delivered(match, &clt_w);
	CHECK_EQ(io_startv(&io, &c, RTRS_READ, RTRS_IO_CON, 3 * LEN, d, 5), 0);
	io_done_once(&io, 0);
	/* 5 ranges, 2 a write; the chunk's new key rides with the last one. */
	CHECK_EQ(fake_delivered(match, &clt_w) - n0, 3);
	for (int i = 0; i < 5; i++)
		CHECK(!memcmp(in[i], out[i], 600), "vector %d read back", i);
	teardown(&c);
}

/*
 * A fabric that needs local registrations (verbs): a write from memory the
 * session registered goes without a registration of its own, one from
 * elsewhere registers its vector (and still lands); a region that a path
 * registers after the fact, a second overlapping one refused, an unknown
 * one not unregistered; after unregistering, writes register per IO again.
 * The fake refuses a write whose vectors lie outside their descriptors'
 * live registrations, so a stale or wrong descriptor fails the IO.
 */
static void mem_registered(void)
{
	static uint8_t region[4 * LEN], other[LEN];
	static struct io io;
	struct iovec d[2];
	struct clt c;
	uint64_t n0;

	fake_set_mr_local(true);
	if (!setup(&c, "ab", NULL))
		return;
	pattern(region, sizeof(region), 7);
	pattern(other, sizeof(other), 8);
	n0 = fake_local_regs();
	d[0] = (struct iovec){ other, LEN };
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, d, 1), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_local_regs() - n0, 1);
	CHECK(area_has(0, LEN, 8), "the unregistered write landed");

	CHECK_EQ(rtrs_clt_mem_register(c.sess, region, sizeof(region)), 0);
	/* One registration per path that is up. */
	CHECK_EQ(fake_local_regs() - n0, 3);
	CHECK_EQ(rtrs_clt_mem_register(c.sess, region + LEN, LEN), -EEXIST);
	CHECK_EQ(rtrs_clt_mem_register(c.sess, NULL, LEN), -EINVAL);
	CHECK_EQ(rtrs_clt_mem_unregister(c.sess, other), -ENOENT);
	n0 = fake_local_regs();
	for (int i = 0; i < 8; i++) {
		/* Two vectors inside the region, on whichever path the policy picks. */
		d[0] = (struct iovec){ region + (i % 3) * LEN, LEN / 2 };
		d[1] = (struct iovec){ region + (i % 3) * LEN + LEN / 2, LEN / 2 };
		CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, (uint32_t)(8 + i) * LEN, d, 2), 0);
		CHECK_EQ(io_wait(&io), 0);
		io_put(&io);
		CHECK(!memcmp(srv.area + (8 + i) * LEN, region + (i % 3) * LEN, LEN),
		      "write %d from the region landed", i);
	}
	CHECK_EQ(fake_local_regs() - n0, 0);
	/* A vector that runs past the region's end is registered on its own. */
	d[0] = (struct iovec){ region + 3 * LEN + 8, LEN - 8 };
	d[1] = (struct iovec){ other, 8 };
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 20 * LEN, d, 2), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_local_regs() - n0, 2);

	CHECK_EQ(rtrs_clt_mem_unregister(c.sess, region), 0);
	n0 = fake_local_regs();
	d[0] = (struct iovec){ region, LEN };
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 21 * LEN, d, 1), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_local_regs() - n0, 1);
	CHECK(!memcmp(srv.area + 21 * LEN, region, LEN), "the write after unregistering landed");

	/*
	 * A vector that starts beyond a region's end (in memory above it) is
	 * outside it: registered on its own, not sent with the region's
	 * descriptor (an RDMA device refuses that: a local protection error,
	 * on every path the request is tried on).
	 */
	static uint8_t big[8 * LEN];

	pattern(big, sizeof(big), 9);
	CHECK_EQ(rtrs_clt_mem_register(c.sess, big, 4 * LEN), 0);
	n0 = fake_local_regs();
	d[0] = (struct iovec){ big + 5 * LEN, LEN };
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 22 * LEN, d, 1), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_local_regs() - n0, 1);
	CHECK(!memcmp(srv.area + 22 * LEN, big + 5 * LEN, LEN), "the write from above the region");
	CHECK_EQ(rtrs_clt_mem_unregister(c.sess, big), 0);
	teardown(&c);
}

/* After a late-acknowledged write: no local protection error, the path up. */
static bool late_ack_clean(struct clt *c, const char *what)
{
	struct fake_stats st;
	bool ok;

	CHECK_EQ(fake_settle(), 0);
	fake_get_stats(&st);
	ok = !st.local_prot_errs && clt_path_is(c, 0, "connected");
	CHECK(ok, "after %s: %llu local protection errors, the path %s (last error %d)", what,
	      (unsigned long long)st.local_prot_errs, clt_path(c, 0).state,
	      clt_path(c, 0).last_error);
	return ok;
}

/*
 * Writes registered per IO on a fabric that needs local registrations
 * (verbs), each completing late, as when its acknowledgement is lost or
 * late on RC (fake_set_late_ack): the response comes while the device may
 * still send the write again from its vectors, through their
 * registrations. Those are kept until the write's send completed: no
 * local protection error, no path failure, and every byte lands; one
 * request in two writes (two local vectors a write) too.
 */
static void mem_late_ack(void)
{
	static uint8_t out[3][LEN], in[LEN];
	static struct io io;
	struct iovec d[3];
	struct clt c;
	uint64_t n0;

	fake_set_limits(2, 2);
	fake_set_mr_local(true);
	fake_set_late_ack(true);
	if (!setup(&c, "a", NULL))
		return;
	n0 = fake_local_regs();
	for (int i = 0; i < 4; i++) {
		pattern(out[0], LEN, (uint8_t)(60 + i));
		d[0] = (struct iovec){ out[0], LEN };
		CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, (uint32_t)i * LEN, d, 1), 0);
		CHECK_EQ(io_wait(&io), 0);
		io_put(&io);
		CHECK(area_has((uint32_t)i * LEN, LEN, (uint8_t)(60 + i)), "write %d landed", i);
		if (!late_ack_clean(&c, "a write"))
			goto out;
	}
	/* Three vectors and the header: two writes, the first of two registered vectors. */
	for (int i = 0; i < 3; i++) {
		pattern(out[i], LEN, (uint8_t)(70 + i));
		d[i] = (struct iovec){ out[i], LEN };
	}
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 8 * LEN, d, 3), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	for (int i = 0; i < 3; i++)
		CHECK(area_has((uint32_t)(8 + i) * LEN, LEN, (uint8_t)(70 + i)),
		      "vector %d of the split write landed", i);
	if (!late_ack_clean(&c, "the split write"))
		goto out;
	CHECK_EQ(fake_local_regs() - n0, 7);
	d[0] = (struct iovec){ in, LEN };
	CHECK_EQ(io_startv(&io, &c, RTRS_READ, RTRS_IO_CON, 9 * LEN, d, 1), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK(!memcmp(in, out[1], LEN), "read back");
	late_ack_clean(&c, "the read");
	CHECK_EQ(clt_path(&c, 0).reconnects, 0);
	CHECK(!env_logged("local protection error"), "no local protection error logged");
out:
	teardown(&c);
}

/* rtrs_clt_add_path of path "b", on a thread of its own. */
struct adder {
	struct clt *c;
	pthread_t t;
	int rc;
	unsigned idx;
	uint8_t *region;     /* registered as the new path's information response goes */
};

static void *add_b(void *arg)
{
	struct adder *a = arg;
	char dst[64];
	struct rtrs_path_addr b = { .dst = dst };

	snprintf(dst, sizeof(dst), "b:%d", srv.port);
	a->rc = rtrs_clt_add_path(a->c->sess, &b, &a->idx);
	return NULL;
}

static void register_region(struct fake_ev *ev, void *arg)
{
	struct adder *a = arg;

	CHECK_EQ(rtrs_clt_mem_register(a->c->sess, a->region, 4 * LEN), 0);
	fake_unclaim(ev);
}

/*
 * A region registered while a path is being added, after the new path's
 * fabric came up and before rtrs_clt_add_path published it: the new path
 * has it too (it was missed, and a write from the region on that path went
 * with no descriptor). Then unregistered: the new path lets go of it too.
 */
static void mem_registered_while_adding(void)
{
	static uint8_t region[4 * LEN];
	struct m info_b = { .dir = TO_CLT, .host = "b", .msg = MSG(RTRS_MSG_INFO_RSP) };
	static struct io io;
	struct iovec d[1];
	struct adder a = { 0 };
	struct clt c;
	uint64_t n0;

	fake_set_mr_local(true);
	if (!setup(&c, "a", NULL))
		return;
	pattern(region, sizeof(region), 11);
	a.c = &c;
	a.region = region;
	fake_on_post(match, &info_b, register_region, &a);
	CHECK_EQ(pthread_create(&a.t, NULL, add_b, &a), 0);
	pthread_join(a.t, NULL);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK_EQ(a.rc, 0);
	CHECK_EQ(a.idx, 1);
	/* Only the new path is left to carry writes. */
	CHECK_EQ(rtrs_clt_remove_path(c.sess, 0), 0);
	CHECK_EQ(fake_settle(), 0);
	n0 = fake_local_regs();
	for (int i = 0; i < 4; i++) {
		d[0] = (struct iovec){ region + i * LEN, LEN };
		CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, (uint32_t)(30 + i) * LEN, d, 1),
			 0);
		CHECK_EQ(io_wait(&io), 0);
		io_put(&io);
		CHECK(!memcmp(srv.area + (30 + i) * LEN, region + i * LEN, LEN),
		      "write %d from the region landed", i);
	}
	CHECK_EQ(fake_local_regs() - n0, 0);
	CHECK_EQ(rtrs_clt_mem_unregister(c.sess, region), 0);
	n0 = fake_local_regs();
	d[0] = (struct iovec){ region, LEN };
	CHECK_EQ(io_startv(&io, &c, RTRS_WRITE, RTRS_IO_CON, 40 * LEN, d, 1), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_local_regs() - n0, 1);
	teardown(&c);
}

/*
 * The next n writes of one end of the IO connection are refused as a full
 * send queue would refuse them: what was posted waits on the connection's
 * pending list, goes again from the kick, and arrives once.
 */
static void eagain_roundtrip(bool server, unsigned n, int imm)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(fake_eagain("s", "a", 1, server, n), 1);
	CHECK(io_roundtrip(&c, LEN, (uint8_t)(3 + server)), "round trip through a pending list");
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK_EQ(delivered(server ? TO_CLT : TO_SRV, "a", imm), 2);
	CHECK(fake_delivered(match, &(struct m){ .kind = FAKE_KICK,
						    .dir = server ? TO_SRV : TO_CLT }) >= 1,
	      "the kick ran");
	teardown(&c);
}

/* The client's request meets a full send queue twice. */
static void io_eagain_client(void)
{
	eagain_roundtrip(false, 2, IMM(RTRS_IO_REQ_IMM));
}

/* The server's response meets one three times. */
static void io_eagain_server(void)
{
	eagain_roundtrip(true, 3, IMM(RTRS_IO_RSP_IMM));
}

/* An admin permit sends on connection 0, an IO permit on connection 1. */
static void admin_con(void)
{
	struct m req0 = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM),
			  .cid = CID(0) };
	struct m req1 = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM),
			  .cid = CID(1) };
	static struct io io;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_ADMIN_CON, 0, LEN, 5), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_delivered(match, &req0), 1);
	CHECK_EQ(fake_delivered(match, &req1), 0);
	CHECK_EQ(io_start(&io, &c, RTRS_READ, RTRS_IO_CON, 0, LEN, 0), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_delivered(match, &req1), 1);
	CHECK(area_has(0, LEN, 5) && !memcmp(io.buf, srv.area, LEN), "read back");
	teardown(&c);
}


/* ---- heartbeats ---------------------------------------------------------------------------------- */

static void clt_beats(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	if (o)
		o->hb_interval_ms = HB_MS;
}

static void srv_beats(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	if (so)
		so->hb_interval_ms = HB_MS;
}

static struct m to_clt = { .dir = TO_CLT }, to_srv = { .dir = TO_SRV };

/*
 * Nothing from the server reaches the client: three heartbeats go out
 * unanswered and the path stays; the fourth tick fails it (-ETIMEDOUT)
 * and schedules a reconnect.
 */
static void hb_miss_client(void)
{
	struct clt c;

	if (!setup(&c, "a", clt_beats))
		return;
	fake_hold(match, &to_clt);
	for (int i = 1; i <= 3; i++) {
		CHECK_EQ(fake_advance(HB_MS), 0);
		CHECK(clt_path_is(&c, 0, "connected"), "after %d silent ticks", i);
	}
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_HB_MSG_IMM)), 3);
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(clt_path(&c, 0).last_error, -ETIMEDOUT);
	CHECK(env_logged("s/a:"), "the path is named");
	CHECK(env_logged("no heartbeat from the server for 3000 ms"), "the cause is logged");
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_HB_MSG_IMM)), 3);
	teardown(&c);
}

/* The same at the server: its path closes on the fourth silent tick, and the client learns it. */
static void hb_miss_server(void)
{
	struct clt c;

	if (!setup(&c, "a", srv_beats))
		return;
	fake_hold(match, &to_srv);
	for (int i = 1; i <= 3; i++) {
		CHECK_EQ(fake_advance(HB_MS), 0);
		CHECK_EQ(atomic_load(&srv.link_down), 0);
	}
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK_EQ(atomic_load(&srv.link_down), 1);
	CHECK(env_logged("no heartbeat from the client for 3000 ms"), "the cause is logged");
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(clt_path(&c, 0).last_error, -ECONNRESET);
	teardown(&c);
}

/*
 * A response and a heartbeat answer overtake each other: the client has
 * missed three beats when the answer (posted after the response) arrives
 * first, then the response. Either resets the count: the next three ticks
 * keep the path, the request completes once, and only the fourth silent
 * tick after them fails the path.
 */
static void hb_reorder_response(void)
{
	static struct io io;
	struct m ack = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_HB_ACK_IMM) };
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	struct fake_ev *ev_ack, *ev_rsp;
	struct clt c;

	if (!setup(&c, "a", clt_beats))
		return;
	fake_hold(match, &to_clt);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 9), 0);
	CHECK(ev_appears(match, &rsp, "the response"));
	for (int i = 0; i < 3; i++)
		CHECK_EQ(fake_advance(HB_MS), 0);
	ev_ack = fake_find(match, &ack);
	ev_rsp = fake_find(match, &rsp);
	CHECK(ev_ack && ev_rsp && ev_ack->seq > ev_rsp->seq, "the answer came after the response");
	if (!ev_ack || !ev_rsp) {
		teardown(&c);
		return;
	}
	CHECK_EQ(fake_deliver(ev_ack), 0);
	CHECK_EQ(fake_deliver(ev_rsp), 0);
	io_done_once(&io, 0);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(fake_advance(HB_MS), 0);
		CHECK(clt_path_is(&c, 0, "connected"), "tick %d after the reorder", i + 1);
	}
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	teardown(&c);
}

/*
 * The completion of the server's heartbeat answer is held back: while it
 * is out, a second heartbeat gets no second answer; once it completes,
 * the next heartbeat is answered again.
 */
static void hb_ack_completion_delayed(void)
{
	struct m done = { .kind = FAKE_DONE, .dir = TO_SRV };
	struct fake_ev *ev;
	struct clt c;

	if (!setup(&c, "a", clt_beats))
		return;
	fake_hold(match, &done);
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK_EQ(delivered(TO_CLT, "a", IMM(RTRS_HB_ACK_IMM)), 1);
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_HB_MSG_IMM)), 2);
	CHECK_EQ(delivered(TO_CLT, "a", IMM(RTRS_HB_ACK_IMM)), 1);
	ev = fake_find(match, &done);
	CHECK(ev != NULL, "the answer's completion waits");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK_EQ(delivered(TO_CLT, "a", IMM(RTRS_HB_ACK_IMM)), 2);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	teardown(&c);
}

/* ---- duplicated and forged immediates ------------------------------------------------------------------ */

/*
 * The server's response is delivered twice: the request completes once,
 * and the second copy, for a request no longer in flight, fails the path
 * (-EPROTO).
 */
/*
 * A write through c whose response (rsp, held by hold) is copied before it
 * is delivered: the request completed, the copy returned claimed (NULL if
 * no response came).
 */
static struct fake_ev *write_rsp_copy(struct clt *c, struct io *io, fake_pred hold, struct m *rsp)
{
	struct fake_ev *ev, *dup;

	fake_hold(hold, rsp);
	CHECK_EQ(io_start(io, c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 11), 0);
	ev = fake_wait_ev(match, rsp, "the response");
	dup = ev ? fake_dup(ev) : NULL;
	CHECK(dup != NULL);
	if (dup) {
		CHECK_EQ(fake_deliver(ev), 0);
		CHECK_EQ(io_wait(io), 0);
	}
	return dup;
}

static void dup_response(void)
{
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	static struct io io;
	struct fake_ev *dup;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	dup = write_rsp_copy(&c, &io, match, &rsp);
	if (dup)
		CHECK_EQ(fake_deliver(dup), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&io.calls), 1);
	io_put(&io);
	CHECK(env_logged("that is not in flight here"), "the duplicate is named");
	CHECK_EQ(clt_path(&c, 0).last_error, -EPROTO);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	teardown(&c);
}

/*
 * A server user that answers a request and returns an error as well (as
 * rnbd-srv did with its answer's own result): the request is answered
 * once, with the answer it gave, and the library does not answer it
 * again (which, had the op been taken by a next request meanwhile, would
 * have answered that one).
 */
static void answered_and_failed(void)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	atomic_store(&srv.answer_then_fail, -EIO);
	CHECK_EQ(io_sync(&c, RTRS_WRITE, 0, LEN, 7), 0);
	CHECK_EQ(io_sync(&c, RTRS_READ, 0, LEN, 7), 0);
	atomic_store(&srv.answer_then_fail, 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK(!env_logged("that is not waiting for one"), "a request was answered twice");
	CHECK(env_logged("was answered, and its handler also returned"), "the user's slip is logged");
	CHECK(io_roundtrip(&c, 2 * LEN, 8), "the chunks serve the next requests");
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	teardown(&c);
}

static atomic_bool hold_to_srv;

/* Responses and the client's kicks; and, once hold_to_srv, everything to the server. */
static bool rsp_or_clt_kick(const struct fake_ev *ev, void *arg)
{
	return match(ev, arg) || (ev->kind == FAKE_KICK && !ev->to_server) ||
	       (atomic_load(&hold_to_srv) && ev->to_server);
}

/*
 * A response for a request that has not gone out: the permit's next
 * request meets a full send queue and waits on the connection's pending
 * list (its kick held), when a copy of the permit's last response comes.
 * It completes nothing (the request is still the poster's, linked on the
 * list) and fails the path (-EPROTO); the request completes once, later.
 */
static void rsp_before_post(void)
{
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	static struct io io, io2;
	struct fake_ev *dup;
	unsigned id = 0;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	dup = write_rsp_copy(&c, &io, rsp_or_clt_kick, &rsp);
	if (dup) {
		id = rtrs_permit_id(io.permit);
		io_put(&io);
		CHECK_EQ(fake_eagain("s", "a", 1, false, 1), 1);
		CHECK_EQ(io_start(&io2, &c, RTRS_WRITE, RTRS_IO_CON, LEN, LEN, 12), 0);
		CHECK(rtrs_permit_id(io2.permit) == id, "the same permit (its response's id)");
		/* The server's reaction to the connection the client shuts waits (forged_imm). */
		atomic_store(&hold_to_srv, true);
		CHECK_EQ(fake_deliver(dup), 0);
		CHECK_EQ(atomic_load(&io2.calls), 0);
		CHECK(env_logged("that is not in flight here"), "the response is named");
	}
	fake_hold(NULL, NULL);
	atomic_store(&hold_to_srv, false);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(clt_path(&c, 0).last_error, -EPROTO);
	CHECK_EQ(fake_advance(10000), 0);
	io_wait(&io2);
	CHECK_EQ(atomic_load(&io2.calls), 1);
	io_put(&io2);
	teardown(&c);
}

/* A copy of the response with its immediate changed to imm: delivered after the real one. */
static void forged_imm(uint32_t imm, const char *logged)
{
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	static struct io io;
	struct fake_ev *ev, *forged;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	fake_hold(match, &rsp);
	/* A write's response writes only into the key slots, which stay registered. */
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 7), 0);
	ev = fake_wait_ev(match, &rsp, "the response");
	forged = ev ? fake_dup(ev) : NULL;
	CHECK(forged != NULL);
	if (forged) {
		forged->imm = imm;
		CHECK_EQ(fake_deliver(ev), 0);
		CHECK_EQ(io_wait(&io), 0);
		/*
		 * The server's reaction to the connection the client shuts
		 * down waits: the client shuts it before it records why, and
		 * a server quick to close the path would make the reset the
		 * path's recorded error (its statistics say -ECONNRESET).
		 */
		fake_hold(match, &to_srv);
		CHECK_EQ(fake_deliver(forged), 0);
	}
	io_put(&io);
	CHECK_EQ(fake_settle(), 0);
	CHECK(env_logged(logged), "logged: %s", logged);
	CHECK_EQ(clt_path(&c, 0).last_error, -EPROTO);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	teardown(&c);
}

/* A heartbeat on an IO connection breaks the rules: the path fails. */
static void hb_on_io_con(void)
{
	forged_imm(rtrs_to_imm(RTRS_HB_MSG_IMM, 0), "heartbeat on connection 1; failing the path");
}

/* An immediate of a type nobody sends: the path fails. */
static void unknown_imm(void)
{
	forged_imm(rtrs_to_imm((enum rtrs_imm_type)5, 0), "unknown immediate type 5");
}

/*
 * path_ev(up) comes after the state, paths_up and the rest of the path's
 * bookkeeping: waiting for it, not for the state, finds them all done.
 */
static bool path_came_up(void *arg)
{
	return atomic_load(&((struct clt *)arg)->path_up) == 1;
}

static bool path_came_up_twice(void *arg)
{
	return atomic_load(&((struct clt *)arg)->path_up) == 2;
}

/* The second schedule: the failed attempt has armed the next one (it logs after arming). */
static bool attempt_failed(void *arg)
{
	return env_log_count("reconnecting in 100 ms") == 2;
}

static bool reconnected_once(void *arg)
{
	return clt_path(arg, 0).reconnects == 1;
}

/* ---- failover --------------------------------------------------------------------------------- */

static struct m rsp_a = { .kind = FAKE_WRITE, .dir = TO_CLT, .host = "a", .imm = IMM(RTRS_IO_RSP_IMM) };

/*
 * A write at off from c whose response on path a is lost; then the
 * connections of a are cut at both ends and everything settles. The
 * caller holds the responses on a (and whatever else it wants held).
 */
static void write_lose_response_on_a(struct io *io, struct clt *c, uint32_t off, uint8_t seed)
{
	struct fake_ev *ev;

	CHECK_EQ(io_start(io, c, RTRS_WRITE, RTRS_IO_CON, off, LEN, seed), 0);
	ev = fake_wait_ev(match, &rsp_a, "the response on a");
	if (ev)
		fake_drop(ev);
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
}

/*
 * Two paths. A write goes on path a and the server answers, but the
 * response is lost and the connection to a is cut. The client parks the
 * request, asks the server over b to fence a, and once the fence ack (with
 * the chunk keys the lost response carried) is in, sends the request again
 * on b: exactly once, and it completes once.
 */
static void failover_lost_response(void)
{
	static struct io io;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	fake_hold(match, &rsp_a);
	write_lose_response_on_a(&io, &c, 2 * LEN, 13);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(clt_path(&c, 0).failovers, 1);
	CHECK_EQ(atomic_load(&io.calls), 0);
	/* The session's wait timer sends the fence. */
	CHECK_EQ(fake_advance(1), 0);
	io_done_once(&io, 0);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK_EQ(fake_delivered(match, &(struct m){ .dir = TO_SRV, .host = "b",
						    .msg = MSG(RTRS_MSG_FENCE) }), 1);
	CHECK_EQ(fake_delivered(match, &(struct m){ .dir = TO_CLT, .host = "b",
						    .msg = MSG(RTRS_MSG_FENCE_ACK) }), 1);
	CHECK(area_has(2 * LEN, LEN, 13), "the write is in the area");
	teardown(&c);
}

/*
 * The request itself never reaches the server before path a is cut: it
 * is lost with the connection, and after the fence goes once, on b.
 */
static void failover_lost_request(void)
{
	struct m req_a = { .kind = FAKE_WRITE, .dir = TO_SRV, .host = "a", .imm = IMM(RTRS_IO_REQ_IMM) };
	static struct io io;
	struct fake_ev *ev;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	fake_hold(match, &req_a);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 17), 0);
	ev = fake_wait_ev(match, &req_a, "the request on a");
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	/* Its connection is gone at both ends: it can arrive nowhere. */
	if (ev)
		CHECK_EQ(fake_deliver(ev), -ENOTCONN);
	CHECK_EQ(fake_advance(1), 0);
	io_done_once(&io, 0);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 1);
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_IO_REQ_IMM)), 0);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK(area_has(0, LEN, 17), "the write is in the area");
	teardown(&c);
}

static struct m to_clt_b0 = { .dir = TO_CLT, .host = "b", .cid = CID(0) };

static bool rsp_a_or_b0(const struct fake_ev *ev, void *arg)
{
	return match(ev, &rsp_a) || match(ev, &to_clt_b0);
}

/*
 * Inside the client loop's fab_send of the fence: the fence arrives, and
 * what the server sends back on b's connection 0 (the key table, then the
 * ack) arrives in its order.
 */
static void fence_posted(struct fake_ev *ev, void *arg)
{
	struct fake_ev *back;
	bool ack = false;

	*(bool *)arg = true;
	if (fake_deliver(ev))
		return;
	while (!ack && (back = fake_wait_ev(match, &to_clt_b0, "the fence ack"))) {
		ack = match(back, &(struct m){ .msg = MSG(RTRS_MSG_FENCE_ACK) });
		fake_deliver(back);
	}
}

/*
 * The fence's ack arrives before the service loop, which sent the fence,
 * has recorded which path carries it (fence_for): the server answers in
 * microseconds, and the loop thread can be preempted right after its
 * fab_send. Found by these scenarios (about one run in thirty of the
 * failover ones): the client took the ack for a stray one and failed path
 * b too (-EPROTO). Now the carrier is recorded before the send.
 */
static void fence_ack_races_send(void)
{
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io;
	bool ran = false;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	fake_hold(rsp_a_or_b0, NULL);
	write_lose_response_on_a(&io, &c, 0, 97);
	fake_on_post(match, &fence_b, fence_posted, &ran);
	CHECK_EQ(fake_advance(1), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(ran, "the fence went over b");
	io_done_once(&io, 0);
	CHECK(!env_logged("stray fence ack"), "the ack was taken for a stray one");
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK(area_has(0, LEN, 97), "the write is in the area");
	teardown(&c);
}

static bool rsp_a_or_fence(const struct fake_ev *ev, void *arg)
{
	return match(ev, &rsp_a) || match(ev, &(struct m){ .dir = TO_SRV,
							     .msg = MSG(RTRS_MSG_FENCE) });
}

/*
 * Three paths. Path a fails with a request whose response was lost; the
 * fence for a goes over b, and b fails before it is delivered. The fence
 * b carried is forgotten and sent again over c; the request goes once, on
 * c, and completes once.
 */
static void fence_carrier_fails(void)
{
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	struct m fence_c = { .dir = TO_SRV, .host = "c", .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io;
	struct fake_ev *ev, *fb;
	struct clt c;

	if (!setup(&c, "abc", NULL))
		return;
	fake_hold(rsp_a_or_fence, NULL);
	write_lose_response_on_a(&io, &c, LEN, 19);
	CHECK_EQ(fake_advance(1), 0);
	fb = fake_wait_ev(match, &fence_b, "the fence on b");
	CHECK_EQ(fake_fail("s", "b", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 1, "reconnecting"), "b: %s", clt_path(&c, 1).state);
	if (fb)
		CHECK_EQ(fake_deliver(fb), -ENOTCONN);
	CHECK_EQ(atomic_load(&io.calls), 0);
	/* The wait timer's next round sends the fence again, over c. */
	CHECK_EQ(fake_advance(50), 0);
	ev = fake_wait_ev(match, &fence_c, "the fence on c");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	io_done_once(&io, 0);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), 0);
	CHECK_EQ(delivered(TO_SRV, "c", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK(area_has(LEN, LEN, 19), "the write is in the area");
	teardown(&c);
}

static void no_reconnect(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	if (o)
		o->max_reconnect_attempts = 0;
}

/*
 * The only path fails with a request in flight and may not reconnect: the
 * request fails once, with -ECONNABORTED, at the wait timer's next round.
 */
static void failover_nowhere(void)
{
	static struct io io;
	struct clt c;

	if (!setup(&c, "a", no_reconnect))
		return;
	fake_hold(match, &rsp_a);
	write_lose_response_on_a(&io, &c, 0, 23);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	CHECK(!strcmp(clt_path(&c, 0).reconnect_verdict, "out of attempts"), "verdict %s",
	      clt_path(&c, 0).reconnect_verdict);
	CHECK_EQ(fake_advance(1), 0);
	io_done_once(&io, -ECONNABORTED);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 1);
	teardown(&c);
}

static void no_wait(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	(void)so;
	if (o)
		o->fast_io_fail_ms = 0;
}

/* Permits that can be taken now, up to 16 (all put back). */
static unsigned permits_free(struct clt *c)
{
	struct rtrs_permit *p[16];
	unsigned n = 0;

	while (n < 16 && (p[n] = rtrs_clt_get_permit(c->sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT)))
		n++;
	for (unsigned i = 0; i < n; i++)
		rtrs_clt_put_permit(c->sess, p[i]);
	return n;
}

/*
 * fast_io_fail_ms 0 (the kernel's way: no waiting for a path): a write on
 * a whose response (with its chunk's new key, always_invalidate) is lost
 * fails at once with -ECONNABORTED when a is cut. Its permit is not given
 * out again until a is fenced: the next writes go on b with other chunks,
 * whose keys are live, and b stays up. (The same chunk again, with the
 * key the server revoked, was refused by b's fabric and took b's
 * connection with it: both paths down for one lost link.) The fence goes
 * over b at the wait timer's next round, its ack brings the key table,
 * and the permit comes back.
 */
static void abort_quarantines_chunk(void)
{
	static struct io io, more[4];
	struct clt c;

	if (!setup(&c, "ab", no_wait))
		return;
	fake_hold(match, &rsp_a);
	write_lose_response_on_a(&io, &c, 0, 31);
	io_done_once(&io, -ECONNABORTED);
	/* Permits are taken last in, first out: the next write would get the failed one's. */
	for (unsigned i = 0; i < 4; i++) {
		CHECK_EQ(io_start(&more[i], &c, RTRS_WRITE, RTRS_IO_CON, (i + 1) * LEN, LEN,
				  (uint8_t)(40 + i)), 0);
		io_done_once(&more[i], 0);
		CHECK(area_has((i + 1) * LEN, LEN, (uint8_t)(40 + i)), "write %u is in the area", i);
	}
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK_EQ(permits_free(&c), 15u);
	CHECK_EQ(fake_advance(1), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_delivered(match, &(struct m){ .dir = TO_SRV, .host = "b",
						    .msg = MSG(RTRS_MSG_FENCE) }), 1);
	CHECK_EQ(fake_advance(50), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(permits_free(&c), 16u);
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	teardown(&c);
}

static bool one_deferred(void *arg);

/*
 * The server holds a write that came on a; a is cut before the answer, so
 * the op ends without a response and re-keys its chunk on its own, and
 * that registration fails (the device out of memory). The chunk is then
 * without a key. The client fences a over b; before the ack hands out the
 * key table, the server gives the chunk a key (it had handed out key 0,
 * and the write sent again on b with it was refused and took b down: both
 * paths lost for one registration that failed). The write goes again on
 * b, and the chunk serves the next writes.
 */
static void dropped_rekey_repaired(void)
{
	static struct io io, more[2];
	struct clt c;
	int rc;

	if (!setup(&c, "ab", NULL))
		return;
	atomic_store(&srv.defer, true);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 53), 0);
	CHECK_EQ(fake_wait(one_deferred, NULL, "the server to hold the write"), 0);
	CHECK_EQ(clt_path(&c, 0).inflight, 1);
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	fake_fail_regs(1);
	rc = rtrs_srv_resp_rdma(atomic_load(&srv.deferred[0]), 0);
	CHECK_EQ(rc, -ENOTCONN);
	atomic_store(&srv.defer, false);
	CHECK(env_logged("keeps no key"), "the op's own re-key failed");
	/* The wait timer sends the fence on b; the ack brings the table. */
	CHECK_EQ(fake_advance(1), 0);
	CHECK_EQ(fake_settle(), 0);
	io_done_once(&io, 0);
	CHECK(env_logged("lost their keys have new ones"), "the server re-keyed the chunk");
	CHECK(area_has(0, LEN, 53), "the write is in the area");
	/* Permits are taken last in, first out: these use the repaired chunk. */
	for (unsigned i = 0; i < 2; i++) {
		CHECK_EQ(io_start(&more[i], &c, RTRS_WRITE, RTRS_IO_CON, (i + 1) * LEN, LEN,
				  (uint8_t)(54 + i)), 0);
		io_done_once(&more[i], 0);
		CHECK(area_has((i + 1) * LEN, LEN, (uint8_t)(54 + i)), "write %u is in the area", i);
	}
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK_EQ(fake_delivered(match, &(struct m){ .dir = TO_CLT, .host = "b",
						    .msg = MSG(RTRS_MSG_FENCE_ACK) }), 1);
	teardown(&c);
}

/*
 * As above, but the server's second try at the chunk's key, before the
 * fence's ack, fails too: the ack reports the error instead of a table
 * with key 0 in it. The write fails (-EIO) and b stays up; the chunk's
 * permit stays out of use until a comes back, whose info response gives
 * the chunk a key, and then it serves writes again.
 */
/*
 * A write held by the server when path a is cut; the op's own re-key and
 * the fence's (over b) both fail: the write ends with -EIO, its permit
 * quarantined.
 */
static void rekey_fence_fails(struct clt *c, struct io *io)
{
	atomic_store(&srv.defer, true);
	CHECK_EQ(io_start(io, c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 57), 0);
	CHECK_EQ(fake_wait(one_deferred, NULL, "the server to hold the write"), 0);
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	fake_fail_regs(2);
	CHECK_EQ(rtrs_srv_resp_rdma(atomic_load(&srv.deferred[0]), 0), -ENOTCONN);
	atomic_store(&srv.defer, false);
	CHECK_EQ(fake_advance(1), 0);
	CHECK_EQ(fake_settle(), 0);
	io_done_once(io, -EIO);
	CHECK(env_logged("still has no key"), "the fence's re-key failed");
}

static void dropped_rekey_fence_fails(void)
{
	static struct io io, more;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	rekey_fence_fails(&c, &io);
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK_EQ(permits_free(&c), 15u);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(reconnected_once, &c, "a's reconnect"), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK(env_logged("lost their keys have new ones"), "a's info response re-keyed the chunk");
	CHECK_EQ(permits_free(&c), 16u);
	CHECK_EQ(io_start(&more, &c, RTRS_WRITE, RTRS_IO_CON, LEN, LEN, 58), 0);
	io_done_once(&more, 0);
	CHECK(area_has(LEN, LEN, 58), "the write is in the area");
	CHECK(clt_path_is(&c, 0, "connected"), "a: %s", clt_path(&c, 0).state);
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	teardown(&c);
}

static void never_reconnect(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	if (o)
		o->max_reconnect_attempts = 0;
}

/*
 * As above, but path a never comes back (no reconnect attempts): the fence
 * the server answered with an error goes again a while later
 * (RTRS_FENCE_RETRY_MS), and its ack gives the chunk its key and the
 * permit back. Before, the permit stayed out of use for good.
 */
static void fence_error_retried(void)
{
	struct m fence = { .kind = FAKE_SEND, .dir = TO_SRV, .host = "b",
			   .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io, more;
	struct clt c;

	if (!setup(&c, "ab", never_reconnect))
		return;
	rekey_fence_fails(&c, &io);
	CHECK_EQ(fake_delivered(match, &fence), 1);
	CHECK_EQ(permits_free(&c), 15u);
	for (int i = 0; i < 30 && fake_delivered(match, &fence) < 2; i++)
		CHECK_EQ(fake_advance(100), 0);
	CHECK_EQ(fake_delivered(match, &fence), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(permits_free(&c), 16u);
	CHECK(!clt_path_is(&c, 0, "connected"), "a stays down: %s", clt_path(&c, 0).state);
	CHECK_EQ(io_start(&more, &c, RTRS_WRITE, RTRS_IO_CON, LEN, LEN, 58), 0);
	io_done_once(&more, 0);
	CHECK(area_has(LEN, LEN, 58), "the write is in the area");
	teardown(&c);
}

/*
 * Path a fails with a request whose response was lost; its fence goes over
 * b and is held there while a reconnects (the server freed the old a: its
 * request was answered), and the request goes again once a is up. Then
 * the fence arrives: it names the incarnation that failed, so the server
 * acks it at once and leaves the new a up. Before fences named
 * incarnations the server stopped the new a, which had to reconnect again.
 */
static void fence_after_reconnect(void)
{
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io;
	struct fake_ev *fb;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	fake_hold(rsp_a_or_fence, NULL);
	write_lose_response_on_a(&io, &c, 3 * LEN, 23);
	CHECK_EQ(fake_advance(1), 0);
	fb = fake_wait_ev(match, &fence_b, "the fence on b");
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(reconnected_once, &c, "a's reconnect"), 0);
	io_done_once(&io, 0);
	CHECK(clt_path_is(&c, 0, "connected"), "a: %s", clt_path(&c, 0).state);
	if (fb)
		CHECK_EQ(fake_deliver(fb), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_delivered(match, &(struct m){ .dir = TO_CLT, .host = "b",
						    .msg = MSG(RTRS_MSG_FENCE_ACK) }), 1);
	CHECK(env_logged("gone; incarnation"), "the server took the fence for the new a");
	CHECK(!env_logged("fencing s/"), "the server stopped a path");
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "a: %s", clt_path(&c, 0).state);
	CHECK_EQ(clt_path(&c, 0).reconnects, 1);
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK(area_has(3 * LEN, LEN, 23), "the write is in the area");
	teardown(&c);
}

/*
 * Path a fails (incarnation 1) with a request whose response was lost; its
 * fence goes over b and is held there. a comes back (incarnation 2) and
 * the request goes again; then R2 goes on a, the server's user holds it,
 * and a fails at the client only. Now the fence for incarnation 1
 * arrives: the server, holding incarnation 2, acks it at once. That ack
 * says nothing of incarnation 2, whose op the server still holds, so it
 * must not send R2 again: the client fences incarnation 2 over b, the
 * server stops it and acks once the op is answered, and only then R2
 * goes again, once. (Found by a review: the first version took any ack
 * for a's fence as done, and R2 went out while a's copy was still held.)
 */
static void fence_ack_for_earlier_incarnation(void)
{
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io1, io2;
	struct fake_ev *fb;
	unsigned reqs_b;
	struct clt c;
	int rc;

	if (!setup(&c, "ab", NULL))
		return;
	fake_hold(rsp_a_or_fence, NULL);
	write_lose_response_on_a(&io1, &c, 0, 43);
	CHECK_EQ(fake_advance(1), 0);
	fb = fake_wait_ev(match, &fence_b, "the fence for a's first incarnation");
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(reconnected_once, &c, "a's reconnect"), 0);
	io_done_once(&io1, 0);
	reqs_b = delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM));
	atomic_store(&srv.defer, true);
	CHECK_EQ(io_start(&io2, &c, RTRS_WRITE, RTRS_IO_CON, 2 * LEN, LEN, 47), 0);
	CHECK_EQ(fake_wait(one_deferred, NULL, "the server's user to hold R2"), 0);
	CHECK_EQ(clt_path(&c, 0).inflight, 1);
	/* a fails at the client; the server sees nothing of it. */
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, 0), 2);
	CHECK_EQ(fake_advance(1), 0);
	if (fb)
		CHECK_EQ(fake_deliver(fb), 0);
	CHECK_EQ(fake_advance(1), 0);
	CHECK(env_logged("answered after that path failed again"),
	      "the ack for incarnation 1 was taken for incarnation 2");
	CHECK_EQ(atomic_load(&io2.calls), 0);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), reqs_b);
	CHECK_EQ(fake_delivered(match, &fence_b), 2);
	/* The held op is answered (its path is gone); then the server acks. */
	rc = rtrs_srv_resp_rdma(atomic_load(&srv.deferred[0]), 0);
	CHECK(rc == 0 || rc == -ENOTCONN, "the held op's answer: %s", strerror(-rc));
	atomic_store(&srv.defer, false);
	CHECK_EQ(fake_advance(5), 0);
	io_done_once(&io2, 0);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), reqs_b + 1);
	/* Each request twice at the user: on a, lost there, then once more. */
	CHECK_EQ(atomic_load(&srv.rdma_evs), 4);
	CHECK(!env_logged("still in use"), "R2 met its own held copy at the server");
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK(area_has(2 * LEN, LEN, 47), "R2 is in the area");
	teardown(&c);
}

/*
 * On the server's loop, inside its fab_send of the ack of the first fence
 * on b: the key table ahead of it and the ack reach the client, whose loop
 * sends its next fence on b at once, and that reaches the server before
 * the server's fab_send has returned.
 */
static void first_ack_posted(struct fake_ev *ev, void *arg)
{
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	struct fake_ev *next, *w;

	*(bool *)arg = true;
	w = fake_wait_ev(match, &to_clt_b0, "the key table ahead of the ack");
	if (w)
		fake_deliver(w);
	if (fake_deliver(ev))
		return;
	next = fake_wait_ev(match, &fence_b, "the next fence on b");
	if (next)
		fake_deliver(next);
}

/*
 * On the client's loop, inside its fab_send of the fence on b: the fence
 * arrives, b's IO connection fails (its failure queued on the loop), and
 * then the key table and the ack arrive on b's connection 0.
 */
static struct m down_b1 = { .kind = FAKE_DOWN, .dir = TO_CLT, .host = "b", .cid = CID(1) };

static void fence_posted_then_b_fails(struct fake_ev *ev, void *arg)
{
	struct fake_ev *back, *down;
	bool ack = false;

	*(bool *)arg = true;
	if (fake_deliver(ev))
		return;
	while (!ack && (back = fake_wait_ev(match, &to_clt_b0, "the fence ack"))) {
		ack = match(back, &(struct m){ .msg = MSG(RTRS_MSG_FENCE_ACK) });
		if (ack) {
			CHECK_EQ(fake_fail("s", "b", 1, -ECONNRESET, -ECONNRESET), 1);
			down = fake_wait_ev(match, &down_b1, "b's IO connection going down");
			if (down)
				CHECK_EQ(fake_deliver(down), 0);
		}
		fake_deliver(back);
	}
}

static bool rsp_a_or_b0_or_down_b1(const struct fake_ev *ev, void *arg)
{
	return rsp_a_or_b0(ev, arg) || match(ev, &down_b1);
}

/*
 * Three paths. Path a fails with a request whose response was lost; its
 * fence goes over b, and b's IO connection fails just before the ack
 * comes in on b's connection 0: the loop stops b before it takes the
 * ack. The ack counts all the same (the server did fence a): the request
 * goes on c at once, with no second fence. (Before, the stop threw the
 * answer away and the fence went again, over c: a review's finding.)
 */
static void fence_ack_then_carrier_fails(void)
{
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	struct m fence_c = { .dir = TO_SRV, .host = "c", .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io;
	bool ran = false;
	struct clt c;

	if (!setup(&c, "abc", NULL))
		return;
	fake_hold(rsp_a_or_b0_or_down_b1, NULL);
	write_lose_response_on_a(&io, &c, LEN, 59);
	fake_on_post(match, &fence_b, fence_posted_then_b_fails, &ran);
	CHECK_EQ(fake_advance(1), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	fake_hold(NULL, NULL);
	CHECK(ran, "the fence went over b");
	io_done_once(&io, 0);
	CHECK(clt_path_is(&c, 1, "reconnecting"), "b: %s", clt_path(&c, 1).state);
	CHECK_EQ(fake_delivered(match, &fence_c), 0);
	CHECK_EQ(delivered(TO_SRV, "c", IMM(RTRS_IO_REQ_IMM)), 1);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK(area_has(LEN, LEN, 59), "the write is in the area");
	teardown(&c);
}

static bool b0_or_fence_b(const struct fake_ev *ev, void *arg)
{
	return match(ev, &to_clt_b0) ||
	       match(ev, &(struct m){ .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) });
}

/*
 * Three paths; a and c fail, each with a request whose response was lost,
 * and b carries both fences, one after the other. The client sends the
 * second as soon as the first is answered, and here it arrives while the
 * server is still sending that answer: the server takes it, not as a
 * second fence at once (which failed b with -EPROTO: found by a review).
 */
static void fence_answered_then_next(void)
{
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	struct m ack_b = { .dir = TO_CLT, .host = "b", .msg = MSG(RTRS_MSG_FENCE_ACK) };
	struct m fence_b = { .dir = TO_SRV, .host = "b", .msg = MSG(RTRS_MSG_FENCE) };
	static struct io io1, io2, io3;
	struct fake_ev *ev;
	bool ran = false;
	struct clt c;

	if (!setup(&c, "abc", NULL))
		return;
	fake_hold(match, &rsp);
	CHECK_EQ(io_start(&io1, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 51), 0);
	CHECK_EQ(io_start(&io2, &c, RTRS_WRITE, RTRS_IO_CON, LEN, LEN, 52), 0);
	CHECK_EQ(io_start(&io3, &c, RTRS_WRITE, RTRS_IO_CON, 2 * LEN, LEN, 53), 0);
	CHECK(clt_path(&c, 0).inflight == 1 && clt_path(&c, 1).inflight == 1 &&
	      clt_path(&c, 2).inflight == 1, "one request on each path");
	/* a's and c's responses are lost, b's arrives. */
	for (int i = 0; i < 3; i++) {
		struct fake_ev *r = fake_wait_ev(match, &rsp, "a response");

		if (r && !strcmp(r->host, "b"))
			CHECK_EQ(fake_deliver(r), 0);
		else if (r)
			fake_drop(r);
	}
	fake_hold(b0_or_fence_b, NULL);
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_fail("s", "c", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	io_done_once(&io2, 0);
	fake_on_post(match, &ack_b, first_ack_posted, &ran);
	CHECK_EQ(fake_advance(1), 0);
	ev = fake_wait_ev(match, &fence_b, "the first fence on b");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	CHECK_EQ(fake_settle(), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(ran, "the first fence was answered over b");
	/* The second fence's answer: the key table, then the ack. */
	for (bool ack = false; !ack && (ev = fake_wait_ev(match, &to_clt_b0, "the second ack"));) {
		ack = match(ev, &(struct m){ .msg = MSG(RTRS_MSG_FENCE_ACK) });
		CHECK_EQ(fake_deliver(ev), 0);
	}
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_advance(1), 0);
	io_done_once(&io1, 0);
	io_done_once(&io3, 0);
	CHECK(!env_logged("second fence"), "the next fence was taken for a second one at once");
	/* Three requests, a's and c's again on b, once each. */
	CHECK_EQ(atomic_load(&srv.rdma_evs), 5);
	CHECK_EQ(delivered(TO_SRV, "b", IMM(RTRS_IO_REQ_IMM)), 3);
	CHECK(clt_path_is(&c, 1, "connected"), "b: %s", clt_path(&c, 1).state);
	CHECK_EQ(fake_delivered(match, &fence_b), 2);
	CHECK(area_has(0, LEN, 51), "a's request is in the area");
	CHECK(area_has(2 * LEN, LEN, 53), "c's request is in the area");
	teardown(&c);
}

/*
 * The only path fails with a request whose response was lost; it
 * reconnects (the reconnect itself tells that the server let go of the
 * old path), and the request goes again on the new connections, once.
 */
static void failover_same_path(void)
{
	static struct io io;
	struct fake_ev *ev;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	fake_hold(match, &rsp_a);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 29), 0);
	ev = fake_wait_ev(match, &rsp_a, "the response on a");
	if (ev)
		fake_drop(ev);
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_advance(1), 0);
	CHECK_EQ(atomic_load(&io.calls), 0);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	io_done_once(&io, 0);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK_EQ(fake_wait(reconnected_once, &c, "the reconnect to be counted"), 0);
	CHECK_EQ(clt_path(&c, 0).failovers, 1);
	CHECK(area_has(0, LEN, 29), "the write is in the area");
	teardown(&c);
}

/* ---- reconnect, close ---------------------------------------------------------------------------- */


/*
 * A reconnect attempt is waiting for its connection when the session
 * closes: the attempt gives up, its connection request never reaches the
 * server, the close returns, and a request that waited for the path fails
 * once with -ECONNABORTED.
 */
static void reconnect_races_close(void)
{
	struct m connreq = { .kind = FAKE_CONNREQ };
	static struct io io;
	struct fake_ev *ev;
	struct clt c;
	uint64_t reqs;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	/* No path, one coming: the request waits for it. */
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 31), 0);
	reqs = srv_stats().connreqs;
	fake_hold(match, &connreq);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	ev = fake_wait_ev(match, &connreq, "the reconnect's connection request");
	CHECK(ev != NULL);
	io_put(&io); /* the permit: close fails the request, not the permit */
	clt_close(&c);
	CHECK_EQ(atomic_load(&io.calls), 1);
	CHECK_EQ(atomic_load(&io.err), -ECONNABORTED);
	if (ev)
		CHECK_EQ(fake_deliver(ev), -ENOTCONN);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, reqs);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 0);
	teardown(&c);
}

static bool one_deferred(void *arg)
{
	return srv_held() == 1 && atomic_load(&srv.nr_deferred) == 1;
}

/*
 * The session closes while the server still holds a request: the request
 * completes once with -ECONNABORTED; the server's late answer finds the
 * path gone (-ENOTCONN), and the server then frees it.
 */
static void close_with_inflight(void)
{
	static struct io io;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	atomic_store(&srv.defer, true);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 37), 0);
	CHECK_EQ(fake_wait(one_deferred, NULL, "the server to hold the request"), 0);
	io_put(&io);
	clt_close(&c);
	CHECK_EQ(atomic_load(&io.calls), 1);
	CHECK_EQ(atomic_load(&io.err), -ECONNABORTED);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&srv.link_down), 1);
	CHECK_EQ(rtrs_srv_resp_rdma(atomic_load(&srv.deferred[0]), 0), -ENOTCONN);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().sessions, 0);
	teardown(&c);
}

/* A path disconnected by hand stays closed; reconnected by hand it carries IO again. */
static void disconnect_reconnect(void)
{
	static struct io io;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(rtrs_clt_disconnect_path(c.sess, 0), 0);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(atomic_load(&c.path_down), 1);
	/* Nothing can come: a request fails at once. */
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 41), -ECONNABORTED);
	CHECK_EQ(fake_advance(10 * RECONNECT_MS), 0);
	CHECK(clt_path_is(&c, 0, "closed"), "still closed: %s", clt_path(&c, 0).state);
	CHECK_EQ(rtrs_clt_reconnect_path(c.sess, 0), 0);
	CHECK_EQ(fake_advance(1), 0);
	CHECK_EQ(fake_wait(path_came_up, &c, "the path to come back"), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK(io_roundtrip(&c, 0, 43), "IO after the reconnect");
	teardown(&c);
}

/*
 * With no reconnects allowed (max_reconnect_attempts 0), a reconnect by hand
 * still makes one attempt: of a path closed after a failure, and of a path
 * that is up (it was closed for good instead, and a closed one stayed
 * closed). A failure after that is not retried by itself.
 */
static void reconnect_by_hand_no_budget(void)
{
	struct clt c;

	if (!setup(&c, "a", no_reconnect))
		return;
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(rtrs_clt_reconnect_path(c.sess, 0), 0);
	CHECK_EQ(fake_advance(1), 0);
	CHECK_EQ(fake_wait(path_came_up, &c, "the path to come back"), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK(io_roundtrip(&c, 0, 47), "IO after the reconnect");
	/* Up, and reconnected by hand: closed, then connected again. */
	CHECK_EQ(rtrs_clt_reconnect_path(c.sess, 0), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(path_came_up_twice, &c, "the path to come back again"), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK(io_roundtrip(&c, 0, 48), "IO after the second reconnect");
	/* Its budget is none again. */
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(10 * RECONNECT_MS), 0);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	teardown(&c);
}

/*
 * The server restarts: the client's first attempt finds nobody listening,
 * the second finds the new server, which knows nothing of the session.
 * rtrs_clt_query counts the new server session, and IO goes on.
 */
static void server_restart(void)
{
	struct rtrs_attrs at = { .size = sizeof(at) };
	struct rtrs_srv_opts so;
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK(io_roundtrip(&c, 0, 47), "IO before");
	CHECK_EQ(rtrs_clt_query(c.sess, &at), 0);
	CHECK_EQ(at.server_sessions, 1);
	srv_stop();
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(attempt_failed, &c, "the attempt to fail"), 0);
	CHECK(env_logged("connection 0 of 2 failed: Connection refused"), "nobody listened");
	srv_opts(&so);
	so.port = (uint16_t)srv.port;
	CHECK_EQ(srv_start(&so), 0);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(path_came_up, &c, "the path to come back"), 0);
	CHECK_EQ(rtrs_clt_query(c.sess, &at), 0);
	CHECK_EQ(at.server_sessions, 2);
	CHECK_EQ(clt_path(&c, 0).reconnect_failures, 1);
	CHECK(io_roundtrip(&c, LEN, 53), "IO after");
	teardown(&c);
}

/* ---- connections failing while a path is set up ------------------------------------------------------ */

/*
 * Connection 1 is accepted by the server but cut before the client sees
 * the accept: the server drops the half-built path and its session,
 * chunks never mapped, and rtrs_clt_open, which had its answer from the
 * server, starts the path again and opens.
 */
static void handshake_con1_cut(void)
{
	struct m accept1 = { .kind = FAKE_ACCEPT, .cid = CID(1) };
	struct rtrs_srv_opts so;
	struct fake_ev *retry;
	struct clt c;

	srv_opts(&so);
	CHECK_EQ(srv_start(&so), 0);
	clt_init(&c, "s", "a");
	retry = open_cut_at(&c, match, &accept1, "connection 1's accept", 1, false);
	CHECK(retry != NULL);
	CHECK(env_logged("the server dropped the path (Connection reset by peer); trying again"),
	      "the open rode through the cut");
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(srv_stats().chunk_bytes, 0);
	CHECK_EQ(atomic_load(&srv.link_up), 0);
	CHECK_EQ(open_resume(&c, retry), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().sessions, 1);
	CHECK_EQ(atomic_load(&srv.link_up), 1);
	CHECK(io_roundtrip(&c, 0, 39), "IO after the open");
	clt_close(&c);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(srv_stats().chunk_bytes, 0);
	srv_stop();
}

/*
 * The information response is lost and connection 0 is cut: the server
 * had connected the path (link up) and takes it down again (link down),
 * freeing the session; the open tries again and gets a new one.
 */
static void handshake_info_lost(void)
{
	struct m info = { .dir = TO_CLT, .msg = MSG(RTRS_MSG_INFO_RSP) };
	struct rtrs_srv_opts so;
	struct fake_ev *retry;
	struct clt c;

	srv_opts(&so);
	CHECK_EQ(srv_start(&so), 0);
	clt_init(&c, "s", "a");
	retry = open_cut_at(&c, match, &info, "the information response", 0, true);
	CHECK(retry != NULL);
	CHECK_EQ(atomic_load(&srv.link_up), 1);
	CHECK_EQ(atomic_load(&srv.link_down), 1);
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(open_resume(&c, retry), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&srv.link_up), 2);
	CHECK_EQ(atomic_load(&srv.link_down), 1);
	CHECK_EQ(srv_stats().sessions, 1);
	CHECK(io_roundtrip(&c, 0, 41), "IO after the open");
	clt_close(&c);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&srv.link_down), 2);
	CHECK_EQ(srv_stats().sessions, 0);
	srv_stop();
}

struct late_refusal {
	atomic_bool done;
	int rejects;    /* the server's answers to connection 1 that were refusals */
};

static bool late_refusal_done(void *arg)
{
	return atomic_load(&((struct late_refusal *)arg)->done);
}

/*
 * On the connecting thread, inside the post of connection 1's request:
 * the client's end of connection 0 is reset (the server's notices
 * nothing), and the request reaches the server claiming a third
 * connection, which does not fit the path: refused (-EEXIST, retry
 * allowed). The client learns of the reset first and of the refusal
 * after, all before its thread waits for connection 1.
 */
static void con1_requested(struct fake_ev *cr, void *arg)
{
	struct m clt_down = { .kind = FAKE_DOWN, .dir = TO_CLT, .cid = CID(0) };
	struct m reject1 = { .kind = FAKE_REJECT, .cid = CID(1) };
	struct late_refusal *r = arg;
	struct rtrs_msg_conn_req msg;
	struct rtrs_conn_req req;
	struct fake_ev *ev, *rej;
	const char *why = NULL;

	CHECK_EQ(fake_fail("s", NULL, 0, -ECONNRESET, 0), 1);
	CHECK_EQ(rtrs_conn_req_decode(cr->data, cr->len, &req, &why), 0);
	req.cid_num = 3;
	rtrs_conn_req_encode(&msg, &req);
	CHECK_EQ(fake_rewrite(cr, &msg, sizeof(msg)), 0);
	CHECK_EQ(fake_deliver(cr), 0);
	rej = fake_wait_ev(match, &reject1, "the refusal of connection 1");
	ev = fake_wait_ev(match, &clt_down, "the client's end of connection 0 going down");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	if (rej) {
		r->rejects++;
		CHECK_EQ(fake_deliver(rej), 0);
	}
	atomic_store(&r->done, true);
	fake_notify();
}

/*
 * The race CI met in pending_per_peer: a path's connection 0 is reset
 * while connection 1's request is on its way, and the server refuses that
 * request. The refusal answers a connection of a path already lost: the
 * attempt ended with the reset, and rtrs_clt_open, which had the server's
 * answer, starts the path again as for any drop. The server, which saw
 * nothing of the reset, gives up the old handshake when the path's
 * connection 0 comes again (refused, EAGAIN); the attempt after opens.
 */
static void handshake_refused_after_reset(void)
{
	struct m accept0 = { .kind = FAKE_ACCEPT, .cid = CID(0) };
	struct m est0 = { .kind = FAKE_ESTABLISHED, .cid = CID(0) };
	struct m connreq1 = { .kind = FAKE_CONNREQ, .cid = CID(1) };
	struct late_refusal r = { 0 };
	struct rtrs_srv_opts so;
	struct fake_ev *acc, *est;
	struct clt c;

	srv_opts(&so);
	CHECK_EQ(srv_start(&so), 0);
	clt_init(&c, "s", "a");
	acc = open_step_to(&c, match, &accept0, "connection 0's accept");
	est = fake_wait_ev(match, &est0, "the server's end of connection 0");
	if (est)
		CHECK_EQ(fake_deliver(est), 0);
	fake_on_post(match, &connreq1, con1_requested, &r);
	if (acc)
		CHECK_EQ(fake_deliver(acc), 0);
	CHECK_EQ(fake_wait(late_refusal_done, &r, "connection 1's request and its refusal"), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), 0);
	CHECK_EQ(r.rejects, 1);
	CHECK(env_logged("the server dropped the path (Connection reset by peer); trying again"),
	      "the open started the path again after the reset");
	CHECK(env_logged("the client reconnects a path still open here"),
	      "the server gave the old handshake up");
	CHECK(io_roundtrip(&c, 0, 45), "IO after the open");
	clt_close(&c);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().sessions, 0);
	srv_stop();
}

/* ---- always_invalidate --------------------------------------------------------------------------------- */

static void no_inval(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	if (so)
		so->always_invalidate = 0;
}

/*
 * A request write is replayed after its chunk served two IOs. Under
 * always_invalidate its key was revoked when it first arrived: the replay
 * is refused by the fabric, breaks the connection, and the server never
 * sees it; the area keeps the second write. Without always_invalidate the
 * same replay lands and overwrites it (the control: the fake checks
 * registrations, not a rule of its own).
 */
static void replay(bool inval)
{
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct fake_stats st0, st1;
	static struct io io;
	struct fake_ev *ev, *old = NULL;
	struct clt c;

	if (!setup(&c, "a", inval ? NULL : no_inval))
		return;
	fake_hold(match, &req);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, (uint8_t)(59 + i)), 0);
		ev = fake_wait_ev(match, &req, "the request");
		if (!ev)
			break;
		if (i == 0)
			old = fake_dup(ev);
		CHECK_EQ(fake_deliver(ev), 0);
		CHECK_EQ(io_wait(&io), 0);
		io_put(&io);
	}
	CHECK(area_has(0, LEN, 60), "the second write is in the area");
	fake_get_stats(&st0);
	CHECK(old != NULL);
	if (old)
		CHECK_EQ(fake_deliver(old), 0);
	CHECK_EQ(fake_settle(), 0);
	fake_get_stats(&st1);
	if (inval) {
		CHECK_EQ(st1.bad_writes - st0.bad_writes, 1);
		CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
		CHECK(area_has(0, LEN, 60), "the replay did not land");
		CHECK(clt_path_is(&c, 0, "reconnecting"), "state %s", clt_path(&c, 0).state);
		CHECK_EQ(clt_path(&c, 0).last_error, -EACCES);
		CHECK_EQ(atomic_load(&srv.link_down), 1);
	} else {
		CHECK_EQ(st1.bad_writes - st0.bad_writes, 0);
		CHECK_EQ(atomic_load(&srv.rdma_evs), 3);
		CHECK(area_has(0, LEN, 59), "the replay landed");
	}
	teardown(&c);
}

static void replay_stale_key(void)
{
	replay(true);
}

static void replay_no_inval(void)
{
	replay(false);
}

/*
 * The next request for a chunk takes its op while the op's last response
 * is still being posted (SENT; a client may reuse the chunk once the
 * response is in): it is answered, and that answer meets a full send queue
 * and waits (RESPONDING). The first response's post then returns: its end
 * must not free the op the second request holds. A third request for the
 * chunk meanwhile breaks the protocol: the path fails (-EPROTO). Before an
 * op's state carried its take, the first response's end freed the
 * second's op and the third request was taken beside it.
 */
struct reuse_run {
	struct fake_ev *req2;
	int rc2;
	bool ran;
};

/* On the server's post of the first response, before that post returns. */
static void first_rsp_posted(struct fake_ev *ev, void *arg)
{
	struct reuse_run *r = arg;

	r->ran = true;
	CHECK_EQ(fake_deliver(ev), 0); /* the client has its response */
	CHECK_EQ(fake_deliver(r->req2), 0);
	CHECK_EQ(srv_held(), 2);
	CHECK_EQ(fake_eagain("s", "a", 1, true, 1), 1);
	r->rc2 = rtrs_srv_resp_rdma(atomic_load(&srv.deferred[1]), 0);
}

static bool srv_kick(const struct fake_ev *ev, void *arg)
{
	(void)arg;
	return ev->kind == FAKE_KICK && ev->to_server;
}

static void reuse_while_responding(void)
{
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	struct reuse_run r = { 0 };
	struct fake_ev *ev, *req3 = NULL;
	static struct io io;
	struct clt c;

	if (!setup(&c, "a", no_inval))
		return;
	atomic_store(&srv.defer, true);
	fake_hold(match, &req);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 61), 0);
	ev = fake_wait_ev(match, &req, "the request");
	if (ev) {
		/* Copies of the request: the client's next two for the chunk. */
		r.req2 = fake_dup(ev);
		req3 = fake_dup(ev);
		CHECK_EQ(fake_deliver(ev), 0);
	}
	CHECK(r.req2 && req3);
	CHECK_EQ(fake_wait(one_deferred, NULL, "the server to hold the write"), 0);
	if (!r.req2 || !req3 || srv_held() != 1) {
		atomic_store(&srv.defer, false);
		teardown(&c);
		return;
	}
	/* The second answer's retry waits for its kick until the third request is in. */
	fake_hold(srv_kick, NULL);
	fake_on_post(match, &rsp, first_rsp_posted, &r);
	CHECK_EQ(rtrs_srv_resp_rdma(atomic_load(&srv.deferred[0]), 0), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(r.ran, "the first response was posted");
	CHECK_EQ(r.rc2, 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK_EQ(fake_deliver(req3), 0);
	CHECK(env_logged("which is still in use"), "the third request is refused");
	CHECK_EQ(srv_held(), 2);
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	atomic_store(&srv.defer, false);
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 0, "reconnecting") || clt_path_is(&c, 0, "connected"), "state %s",
	      clt_path(&c, 0).state);
	teardown(&c);
}

static void fail_fast_200(struct rtrs_srv_opts *so, struct rtrs_clt_opts *o)
{
	if (o)
		o->fast_io_fail_ms = 200;
}

static bool path_a_down(void *arg)
{
	return atomic_load(&((struct clt *)arg)->path_down) >= 1;
}

/*
 * Every slot taken when the session's only path goes: a slot is then
 * waited for no longer than a request waits for a path. With
 * fast_io_fail_ms 0 none is waited for (ECONNABORTED, in both modes); with
 * 200 ms, NOWAIT says EAGAIN until 200 ms have passed since the path went
 * (real time, as a request's wait), then ETIMEDOUT, and WAIT returns
 * ETIMEDOUT by then. Before, the slots of requests failed with their path
 * stayed quarantined and IO waiting for one outlived fast_io_fail_ms.
 */
static void slots_without_path_(bool zero)
{
	struct rtrs_permit *p[16], *q;
	unsigned n = 0;
	uint64_t t0;
	struct clt c;

	if (!setup(&c, "a", zero ? no_wait : fail_fast_200))
		return;
	while (n < 16 && (p[n] = rtrs_clt_get_permit(c.sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT)))
		n++;
	CHECK_EQ(n, 16u);
	errno = 0;
	CHECK(!rtrs_clt_get_permit(c.sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT) && errno == EAGAIN,
	      "all taken, the path up: EAGAIN (%s)", strerror(errno));
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_wait(path_a_down, &c, "the path to go"), 0);
	t0 = now_ms();
	errno = 0;
	q = rtrs_clt_get_permit(c.sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT);
	CHECK(!q && errno == (zero ? ECONNABORTED : EAGAIN), "NOWAIT, no path: %s",
	      strerror(errno));
	errno = 0;
	q = rtrs_clt_get_permit(c.sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	CHECK(!q && errno == (zero ? ECONNABORTED : ETIMEDOUT), "WAIT, no path: %s",
	      strerror(errno));
	if (!zero) {
		CHECK(now_ms() - t0 >= 150 && now_ms() - t0 < 5000, "WAIT returned after %llu ms",
		      (unsigned long long)(now_ms() - t0));
		errno = 0;
		CHECK(!rtrs_clt_get_permit(c.sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT) &&
		      errno == ETIMEDOUT, "NOWAIT after fast_io_fail_ms: %s", strerror(errno));
	}
	for (unsigned i = 0; i < n; i++)
		rtrs_clt_put_permit(c.sess, p[i]);
	teardown(&c);
}

static void slots_without_path(void)
{
	slots_without_path_(false);
}

static void slots_without_path_fail_fast(void)
{
	slots_without_path_(true);
}

/*
 * A session's link goes down at the server while the session object stays
 * (its user holds a request of a closed path): the user forgot the
 * session (DISCONNECTED), and the path that links it up again gives the
 * user a new one (CONNECTED). The client must hear of a new server
 * session then, as after a restart, or its user (RNBD) would go on with
 * state the server's user no longer has.
 */
static bool link_up_twice(void *arg)
{
	(void)arg;
	return atomic_load(&srv.link_up) >= 2;
}

static void relink_same_session(void)
{
	struct rtrs_attrs at = { .size = sizeof(at) };
	static struct io io;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	atomic_store(&srv.defer, true);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 37), 0);
	CHECK_EQ(fake_wait(one_deferred, NULL, "the server to hold the request"), 0);
	atomic_store(&srv.defer, false);
	fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET);
	fake_fail("s", "b", -1, -ECONNRESET, -ECONNRESET);
	CHECK_EQ(fake_settle(), 0);
	CHECK(atomic_load(&srv.link_down) == 1 && srv_stats().sessions == 1,
	      "the link down, the session kept for its held request: %d, %llu",
	      atomic_load(&srv.link_down), (unsigned long long)srv_stats().sessions);
	for (int i = 0; i < 30 && !link_up_twice(NULL); i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(rtrs_clt_query(c.sess, &at), 0);
	CHECK(atomic_load(&srv.link_up) == 2 && at.server_sessions == 2,
	      "the server's user saw the session linked up again (%d) and the client was told of "
	      "a new server session (%u)", atomic_load(&srv.link_up), (unsigned)at.server_sessions);
	rtrs_srv_resp_rdma(atomic_load(&srv.deferred[0]), 0);
	CHECK_EQ(fake_settle(), 0);
	for (int i = 0; i < 10; i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	io_wait(&io);
	io_put(&io);
	teardown(&c);
}

/*
 * The same with no request held: b goes down while a's reconnect waits for
 * its information response. a's connection 0 was told the session's old
 * incarnation: it is refused (-EAGAIN, a retry) and reconnects to the new
 * one, which its client takes for a new server session.
 */
static bool a_connected(void *arg)
{
	return !strcmp(clt_path((struct clt *)arg, 0).state, "connected");
}

static void relink_during_handshake(void)
{
	struct rtrs_attrs at = { .size = sizeof(at) };
	struct m info_a = { .kind = FAKE_SEND, .dir = TO_SRV, .host = "a",
			    .msg = MSG(RTRS_MSG_INFO_REQ) };
	struct fake_ev *ev;
	struct clt c;

	if (!setup(&c, "ab", NULL))
		return;
	fake_hold(match, &info_a);
	fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(2 * RECONNECT_MS), 0);
	ev = fake_wait_ev(match, &info_a, "a's information request");
	fake_fail("s", "b", -1, -ECONNRESET, -ECONNRESET);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&srv.link_down), 1);
	fake_hold(NULL, NULL);
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	CHECK_EQ(fake_settle(), 0);
	for (int i = 0; i < 30 && !(a_connected(&c) && link_up_twice(NULL)); i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(rtrs_clt_query(c.sess, &at), 0);
	CHECK(atomic_load(&srv.link_up) == 2 && at.server_sessions == 2,
	      "the server's user saw the session linked up again (%d) and the client was told of "
	      "a new server session (%u)", atomic_load(&srv.link_up), (unsigned)at.server_sessions);
	teardown(&c);
}

/*
 * On a fabric that reads a write's data after its post while it waits in a
 * queue (tcp: fab_write_left), a response that comes before the data has
 * left does not complete the write: its caller would free or fill the
 * buffers the fabric still sends from, and the server would get whatever
 * they hold then. Only a lying server answers so; here a copy of the
 * response to an earlier write of the same chunk, delivered while the
 * write is held. The write completes once its data has arrived (the
 * fake's done()); the server's own response then is one too many, and
 * the path fails (-EPROTO).
 */
static void early_response_waits_for_data(void)
{
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	static struct io io;
	struct fake_ev *ev, *lie = NULL;
	struct clt c;

	if (!setup(&c, "a", no_inval))
		return;
	fake_set_tx_queued(true);
	fake_hold(match, &rsp);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 71), 0);
	ev = fake_wait_ev(match, &rsp, "the first response");
	if (ev) {
		lie = fake_dup(ev);
		CHECK_EQ(fake_deliver(ev), 0);
	}
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	fake_hold(match, &req);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 72), 0);
	ev = fake_wait_ev(match, &req, "the second write");
	CHECK(lie != NULL);
	if (lie)
		CHECK_EQ(fake_deliver(lie), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK(atomic_load(&io.calls) == 0, "the write completed before its data left");
	fake_hold(NULL, NULL);
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	CHECK_EQ(io_wait(&io), 0);
	CHECK_EQ(atomic_load(&io.calls), 1);
	io_put(&io);
	CHECK_EQ(fake_settle(), 0);
	CHECK(area_has(0, LEN, 72), "the second write's data is in the area");
	CHECK_EQ(clt_path(&c, 0).last_error, -EPROTO);
	fake_set_tx_queued(false);
	teardown(&c);
}

/* The same data path with the fabric's queue in the way and honest answers: nothing changes. */
static void queued_writes_complete(void)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	fake_set_tx_queued(true);
	for (uint8_t i = 0; i < 20; i++)
		CHECK(io_roundtrip(&c, (uint32_t)(i % 4) * LEN, (uint8_t)(80 + i)));
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	fake_set_tx_queued(false);
	teardown(&c);
}

/*
 * The response to a write comes while the write's post has not returned
 * yet (its server answered as its last bytes went; here the fake delivers
 * the write and the response on the posting thread, inside the post): the
 * poster, which then sees its data left, is the one to complete it, but
 * conf must not run inside rtrs_clt_request. It runs from the
 * connection's pending queue (a kick, held here until the request call
 * has returned), once, with the response's result.
 */

struct early_post {
	struct io *io;
	bool ran;
	int calls_in_post;
};

static void write_posted(struct fake_ev *ev, void *arg)
{
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	struct early_post *e = arg;
	struct fake_ev *r;

	e->ran = true;
	CHECK_EQ(fake_deliver(ev), 0); /* the server takes it and answers */
	r = fake_wait_ev(match, &rsp, "the response");
	if (r)
		CHECK_EQ(fake_deliver(r), 0);
	e->calls_in_post = atomic_load(&e->io->calls);
}

static void response_before_post_returns(void)
{
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	static struct io io;
	struct early_post e = { .io = &io };
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	atomic_store(&hold_to_srv, false);
	fake_hold(rsp_or_clt_kick, &rsp);
	fake_on_post(match, &req, write_posted, &e);
	CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 0, LEN, 91), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(e.ran, "the write was posted");
	CHECK_EQ(e.calls_in_post, 0);
	CHECK(atomic_load(&io.calls) == 0, "conf ran inside rtrs_clt_request");
	fake_hold(NULL, NULL);
	CHECK_EQ(io_wait(&io), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&io.calls), 1);
	io_put(&io);
	CHECK(area_has(0, LEN, 91), "the write's data is in the area");
	CHECK(io_roundtrip(&c, LEN, 92), "the path goes on");
	teardown(&c);
}

static const struct scenario scenarios[] = {
	{ "io_exact", io_exact },
	{ "io_split", io_split },
	{ "poll_unsupported", poll_unsupported },
	{ "mem_registered", mem_registered },
	{ "mem_registered_while_adding", mem_registered_while_adding },
	{ "mem_late_ack", mem_late_ack },
	{ "reconnect_by_hand_no_budget", reconnect_by_hand_no_budget },
	{ "io_eagain_client", io_eagain_client },
	{ "io_eagain_server", io_eagain_server },
	{ "admin_con", admin_con },
	{ "hb_miss_client", hb_miss_client },
	{ "hb_miss_server", hb_miss_server },
	{ "hb_reorder_response", hb_reorder_response },
	{ "hb_ack_completion_delayed", hb_ack_completion_delayed },
	{ "dup_response", dup_response },
	{ "answered_and_failed", answered_and_failed },
	{ "rsp_before_post", rsp_before_post },
	{ "hb_on_io_con", hb_on_io_con },
	{ "unknown_imm", unknown_imm },
	{ "failover_lost_response", failover_lost_response },
	{ "failover_lost_request", failover_lost_request },
	{ "fence_carrier_fails", fence_carrier_fails },
	{ "fence_after_reconnect", fence_after_reconnect },
	{ "fence_ack_for_earlier_incarnation", fence_ack_for_earlier_incarnation },
	{ "fence_answered_then_next", fence_answered_then_next },
	{ "fence_ack_then_carrier_fails", fence_ack_then_carrier_fails },
	{ "fence_ack_races_send", fence_ack_races_send },
	{ "failover_nowhere", failover_nowhere },
	{ "abort_quarantines_chunk", abort_quarantines_chunk },
	{ "dropped_rekey_repaired", dropped_rekey_repaired },
	{ "dropped_rekey_fence_fails", dropped_rekey_fence_fails },
	{ "fence_error_retried", fence_error_retried },
	{ "slots_without_path", slots_without_path },
	{ "slots_without_path_fail_fast", slots_without_path_fail_fast },
	{ "failover_same_path", failover_same_path },
	{ "reconnect_races_close", reconnect_races_close },
	{ "close_with_inflight", close_with_inflight },
	{ "disconnect_reconnect", disconnect_reconnect },
	{ "server_restart", server_restart },
	{ "handshake_con1_cut", handshake_con1_cut },
	{ "handshake_info_lost", handshake_info_lost },
	{ "handshake_refused_after_reset", handshake_refused_after_reset },
	{ "replay_stale_key", replay_stale_key },
	{ "replay_no_inval", replay_no_inval },
	{ "reuse_while_responding", reuse_while_responding },
	{ "relink_during_handshake", relink_during_handshake },
	{ "relink_same_session", relink_same_session },
	{ "early_response_waits_for_data", early_response_waits_for_data },
	{ "queued_writes_complete", queued_writes_complete },
	{ "response_before_post_returns", response_before_post_returns },
};

int main(int argc, char **argv)
{
	return fake_main(argc, argv, scenarios, ARRAY_SIZE(scenarios), "test-fake-io");
}
