/* SPDX-License-Identifier: MIT */
/*
 * One log state for librtrs and librnbd: librnbd takes lib/common from
 * librtrs.so, so the level and the sink set through librtrs's public API
 * (rtrs_set_log_level, rtrs_set_log_fn) govern librnbd's lines too, and
 * librnbd's own setters govern librtrs's. With lib/common linked into both
 * libraries (two copies of the state), librnbd's lines went to stderr
 * whatever rtrs_set_log_fn said, and at its own level.
 *
 * librnbd's lines here come from rnbd_srv_open: an unknown engine (an
 * error, before anything starts) and a server of memory devices on port 0
 * (an info line "serving memory devices only" and a warning "no
 * authentication").
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "harness.h"
#include "logcap.h"
#include "rnbd.h"

/* A second sink: lines that reach it are counted, nothing else. */
static atomic_uint other_lines;

static void other_sink(void *priv, int level, const char *line)
{
	(void)priv;
	(void)level;
	(void)line;
	atomic_fetch_add(&other_lines, 1);
}

/* Opens and closes a server of one memory device; rnbd_srv_open's result. */
static int mem_server(void)
{
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv;
	int rc;

	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.mem_devices = "m0:4M";
	rc = rnbd_srv_open(&o, &srv);
	if (!rc)
		rnbd_srv_close(srv);
	return rc;
}

int main(void)
{
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv = NULL;
	size_t mark;

	/* librtrs's sink and level: an error line of librnbd reaches the sink. */
	rtrs_set_log_fn(log_sink, NULL);
	rtrs_set_log_level(0);
	rnbd_srv_opts_init(&o, sizeof(o));
	o.mem_devices = "m0:4M";
	o.engine = "no-such-engine";
	mark = log_mark();
	CHECK_EQ(rnbd_srv_open(&o, &srv), -EINVAL);
	CHECK(log_has_since(mark, "rtrs error: rnbd: unknown engine \"no-such-engine\""),
	      "librnbd's error did not reach rtrs_set_log_fn's sink; it logged: %s",
	      log_since(mark));

	/* Level error (librtrs's setter): librnbd's info and warning lines stay out. */
	mark = log_mark();
	CHECK_EQ(mem_server(), 0);
	CHECK(!log_has_since(mark, "rnbd: serving memory devices only") &&
	      !log_has_since(mark, "rnbd: no authentication"),
	      "rtrs_set_log_level(0) let librnbd's lower lines through: %s", log_since(mark));

	/* Level info: they come, and through the same sink. */
	rtrs_set_log_level(2);
	mark = log_mark();
	CHECK_EQ(mem_server(), 0);
	CHECK(log_has_since(mark, "rtrs info: rnbd: serving memory devices only"),
	      "rtrs_set_log_level(2): no info line of librnbd: %s", log_since(mark));
	CHECK(log_has_since(mark, "rtrs warn: rnbd: no authentication"),
	      "rtrs_set_log_level(2): no warning of librnbd: %s", log_since(mark));

	/* Another sink through librnbd's setter takes librtrs's lines as well. */
	rnbd_set_log_fn(other_sink, NULL);
	rnbd_set_log_level(3);
	mark = log_mark();
	CHECK_EQ(mem_server(), 0);
	CHECK(atomic_load(&other_lines) > 0, "rnbd_set_log_fn's sink got nothing");
	CHECK(!log_has_since(mark, "rtrs"), "the replaced sink still got: %s", log_since(mark));
	/* Level error again, through librtrs: a server that starts well logs nothing. */
	{
		unsigned before;

		rtrs_set_log_level(0);
		before = atomic_load(&other_lines);
		CHECK_EQ(mem_server(), 0);
		CHECK_EQ(atomic_load(&other_lines), before);
	}
	rtrs_set_log_fn(NULL, NULL);
	return test_done("test-log");
}
