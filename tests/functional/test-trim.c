/* SPDX-License-Identifier: MIT */
/*
 * The server gives back what the fabric kept for closed sessions: 50 ms
 * after the last session of a burst is freed, the RTRS server asks its
 * fabric to trim, which gives back what it keeps for registrations long
 * gone while none is open (tcp: the memory regions kept for reuse, a
 * debug line with their count). Here, with librnbd's server and client
 * in one process:
 *   - with one session still open, closing another gives back nothing,
 *     and the open one's IO goes on;
 *   - when the last closes, the kept regions go back (tcp; rdma-core
 *     keeps nothing and says nothing);
 *   - the next session's IO is verified, with the bytes earlier sessions
 *     wrote still in the memory device, and its close gives back again;
 *     three rounds of it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"
#include "logcap.h"
#include "rnbd.h"

#define LEN (64u << 10)
#define ROUNDS 3
#define RELEASED "kept memory regions given back"

static int port;

static struct rnbd_clt_sess *sess_open(const char *name)
{
	static char dst[64];
	struct rtrs_path_addr pa;
	struct rtrs_clt_opts o;
	struct rnbd_clt_sess *s = NULL;
	int rc;

	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), port);
	pa = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = name;
	o.paths = &pa;
	o.paths_num = 1;
	o.provider = test_provider();
	o.nr_io_cons = 2;
	rc = rnbd_clt_sess_open(&o, &s);
	CHECK(rc == 0, "session %s: %s", name, strerror(-rc));
	return rc ? NULL : s;
}

/* Writes LEN bytes of seed's pattern at off through a new mapping of m0, reads them back. */
static bool write_verified(struct rnbd_clt_sess *s, uint64_t off, unsigned seed)
{
	static uint8_t out[LEN], in[LEN];
	struct rnbd_clt_dev *d;
	int rc;

	rc = rnbd_clt_map(s, "m0", RNBD_CLT_RW, &d);
	CHECK(rc == 0, "map m0: %s", strerror(-rc));
	if (rc)
		return false;
	test_fill(out, LEN, seed);
	rc = rnbd_clt_io(d, RNBD_CLT_WRITE, 0, off, out, LEN);
	if (!rc)
		rc = rnbd_clt_io(d, RNBD_CLT_READ, 0, off, in, LEN);
	CHECK(rc == 0, "IO at %llu: %s", (unsigned long long)off, strerror(-rc));
	CHECK_EQ(rnbd_clt_unmap(d, false), 0);
	return !rc && !memcmp(in, out, LEN);
}

/* Reads LEN bytes at off through a new mapping: are they seed's pattern? */
static bool holds(struct rnbd_clt_sess *s, uint64_t off, unsigned seed)
{
	static uint8_t want[LEN], got[LEN];
	struct rnbd_clt_dev *d;
	int rc;

	if (rnbd_clt_map(s, "m0", RNBD_CLT_RO, &d))
		return false;
	test_fill(want, LEN, seed);
	rc = rnbd_clt_io(d, RNBD_CLT_READ, 0, off, got, LEN);
	rnbd_clt_unmap(d, false);
	return !rc && !memcmp(got, want, LEN);
}

int main(void)
{
	bool keeps = !strcmp(test_provider(), "tcp"); /* rdma-core keeps nothing */
	struct rnbd_clt_sess *a, *b, *c;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv;
	char name[32];
	size_t mark;

	rtrs_set_log_fn(log_sink, NULL);
	rtrs_set_log_level(3); /* the release is a debug line */
	if (!keeps)
		printf("test-trim: %s keeps nothing to give back: IO across the rounds only\n",
		       test_provider());
	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.rtrs.queue_depth = 32;
	o.mem_devices = "m0:4M";
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	CHECK(port > 0, "port %d", port);

	/* One session stays while another comes and goes: nothing is released. */
	a = sess_open("trim-a");
	b = sess_open("trim-b");
	if (!a || !b)
		return test_done("test-trim");
	CHECK(write_verified(b, 0, 1), "session b's IO");
	mark = log_mark();
	rnbd_clt_sess_close(b);
	usleep(300 * 1000); /* the trim runs 50 ms after b is freed */
	CHECK(!log_has_since(mark, RELEASED), "released with a session open: %s", log_since(mark));
	CHECK(write_verified(a, LEN, 2), "session a's IO after b closed");
	CHECK(holds(a, 0, 1), "b's bytes are still there");
	mark = log_mark();
	rnbd_clt_sess_close(a);
	if (keeps)
		CHECK(log_wait_for(RELEASED, 3000) && log_has_since(mark, RELEASED),
		      "the last session closed, nothing given back: %s", log_since(mark));

	/* Each round: verified IO, everything written before still there, then given back. */
	for (unsigned r = 0; r < ROUNDS; r++) {
		snprintf(name, sizeof(name), "trim-%u", r);
		c = sess_open(name);
		if (!c)
			break;
		CHECK(write_verified(c, (uint64_t)(2 + r) * LEN, 3 + r), "round %u: IO", r);
		CHECK(holds(c, 0, 1) && holds(c, LEN, 2), "round %u: earlier sessions' bytes", r);
		mark = log_mark();
		rnbd_clt_sess_close(c);
		if (!keeps)
			continue;
		for (unsigned ms = 0; ms < 3000 && !log_has_since(mark, RELEASED); ms += 20)
			usleep(20 * 1000);
		CHECK(log_has_since(mark, RELEASED), "round %u: nothing given back: %s", r, log_since(mark));
	}
	rnbd_srv_close(srv);
	rtrs_set_log_fn(NULL, NULL);
	if (g_failures)
		fprintf(stderr, "captured log:\n%s", log_text());
	return test_done("test-trim");
}
