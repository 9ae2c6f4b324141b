/* SPDX-License-Identifier: MIT */
/*
 * Deterministic scenarios of the client and server cores over the fake
 * fabric (lib/rtrs/rtrs-fabric-fake.h): IO placed byte for byte, requests
 * and responses split over several writes, full send queues, heartbeats
 * missed and reordered, duplicated and forged immediates, failover after a
 * fence with a response lost, a path failing while it carries a fence,
 * parked requests sent again exactly once, reconnects racing a close,
 * connections failing mid-handshake, a server restart, and a stale chunk
 * key refused under always_invalidate. Each step is an event the scenario
 * delivers, drops, duplicates or holds, and timers fire only when the
 * scenario moves the loops' clock: no sleeps, no timing luck.
 */
#include <errno.h>
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
	fake_hold(NULL, NULL);
	clt_close(c);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
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
	CHECK_EQ(io_wait(&io), 0);
	CHECK_EQ(atomic_load(&io.calls), 1);
	io_put(&io);
	/* 5 ranges, 2 a write; the chunk's new key rides with the last one. */
	CHECK_EQ(fake_delivered(match, &clt_w) - n0, 3);
	for (int i = 0; i < 5; i++)
		CHECK(!memcmp(in[i], out[i], 600), "vector %d read back", i);
	teardown(&c);
}

/*
 * The client's IO connection refuses two writes as a full send queue
 * would: the request waits on the connection's pending list, is posted
 * again from the kick, and arrives once.
 */
static void io_eagain_client(void)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(fake_eagain("s", "a", 1, false, 2), 1);
	CHECK(io_roundtrip(&c, 0, 3), "round trip through the pending list");
	CHECK_EQ(atomic_load(&srv.rdma_evs), 2);
	CHECK_EQ(delivered(TO_SRV, "a", IMM(RTRS_IO_REQ_IMM)), 2);
	CHECK(fake_delivered(match, &(struct m){ .kind = FAKE_KICK, .dir = TO_CLT }) >= 1,
	      "the client's kick ran");
	teardown(&c);
}

/* The same at the server: the response waits for its kick and goes once. */
static void io_eagain_server(void)
{
	struct clt c;

	if (!setup(&c, "a", NULL))
		return;
	CHECK_EQ(fake_eagain("s", "a", 1, true, 3), 1);
	CHECK(io_roundtrip(&c, LEN, 4), "round trip through the server's pending list");
	CHECK_EQ(delivered(TO_CLT, "a", IMM(RTRS_IO_RSP_IMM)), 2);
	CHECK(fake_delivered(match, &(struct m){ .kind = FAKE_KICK, .dir = TO_SRV }) >= 1,
	      "the server's kick ran");
	teardown(&c);
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

static const struct scenario scenarios[] = {
	{ "io_exact", io_exact },
	{ "io_split", io_split },
	{ "io_eagain_client", io_eagain_client },
	{ "io_eagain_server", io_eagain_server },
	{ "admin_con", admin_con },
};

int main(int argc, char **argv)
{
	return fake_main(argc, argv, scenarios, ARRAY_SIZE(scenarios), "test-fake-io");
}
