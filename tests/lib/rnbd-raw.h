/* SPDX-License-Identifier: MIT */
/*
 * RTRS clients that speak RNBD by hand, for tests of the RNBD server
 * (test-rnbd-srv, test-rnbd-alloc): a session of one path to
 * test_addr():port with the RNBD handshake (SESS_INFO), and OPEN.
 *
 *   struct test_rnbd_clt c;
 *   test_rnbd_clt_init(&c, "name", port);
 *   c.o.hb_interval_ms = 100;            (whatever the test needs)
 *   rc = test_rnbd_clt_open(&c, &sess);
 */
#ifndef RTRS_TEST_RNBD_RAW_H
#define RTRS_TEST_RNBD_RAW_H

#include <stdio.h>

#include "check.h"
#include "harness.h"
#include "rnbd-proto.h"
#include "rtrs.h"

struct test_rnbd_clt {
	char dst[64];
	struct rtrs_path_addr pa;
	struct rtrs_clt_opts o;
};

/* Options of a session called name, one path to port, one IO connection. */
static inline void test_rnbd_clt_init(struct test_rnbd_clt *c, const char *name, int port)
{
	snprintf(c->dst, sizeof(c->dst), "%s:%d", test_addr(), port);
	c->pa = (struct rtrs_path_addr){ .dst = c->dst };
	rtrs_clt_opts_init(&c->o, sizeof(c->o));
	c->o.sessname = name;
	c->o.paths = &c->pa;
	c->o.paths_num = 1;
	c->o.provider = test_provider();
	c->o.nr_io_cons = 1;
}

/*
 * Opens the session and exchanges SESS_INFO (this protocol version must
 * come back): 0, or the errno of the open (*out NULL) or of the handshake
 * (the session is closed again).
 */
static inline int test_rnbd_clt_open(struct test_rnbd_clt *c, struct rtrs_clt_sess **out)
{
	struct rnbd_msg_sess_info m, rsp;
	const char *why = NULL;
	unsigned ver = 0;
	int rc;

	*out = NULL;
	rc = rtrs_clt_open(&c->o, out);
	if (rc)
		return rc;
	rnbd_sess_info_encode(&m, false, RNBD_PROTO_VER_MAJOR);
	rc = test_request(*out, RTRS_READ, &m, sizeof(m), &rsp, sizeof(rsp));
	if (!rc)
		rc = rnbd_sess_info_decode(&rsp, sizeof(rsp), true, &ver, &why);
	CHECK(rc || ver == RNBD_PROTO_VER_MAJOR, "SESS_INFO_RSP: version %u", ver);
	if (!rc && ver != RNBD_PROTO_VER_MAJOR)
		rc = -EPROTO;
	if (rc) {
		rtrs_clt_close(*out);
		*out = NULL;
	}
	return rc;
}

/* OPEN: the device id, or a negative errno; the response in *out (if not NULL). */
static inline int test_rnbd_dev_open(struct rtrs_clt_sess *s, const char *name,
				     enum rnbd_access_mode mode, struct rnbd_open_rsp *out)
{
	struct rnbd_open o = { .access_mode = mode };
	struct rnbd_msg_open_rsp rsp;
	struct rnbd_msg_open m;
	struct rnbd_open_rsp r;
	const char *why = NULL;
	int rc;

	snprintf(o.dev_name, sizeof(o.dev_name), "%s", name);
	rnbd_open_encode(&m, &o);
	rc = test_request(s, RTRS_READ, &m, sizeof(m), &rsp, sizeof(rsp));
	if (rc)
		return rc;
	rc = rnbd_open_rsp_decode(&rsp, sizeof(rsp), &r, &why);
	CHECK(rc == 0, "OPEN_RSP of %s: %s", name, why);
	if (out)
		*out = r;
	return rc ? rc : (int)r.device_id;
}

#endif
