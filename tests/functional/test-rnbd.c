/* SPDX-License-Identifier: MIT */
/*
 * librnbd's client against its server, in one process over tcp on
 * 127.0.0.1: mapping, IO of every kind larger than one transport request
 * (checked byte for byte, also in the exported file), the sharing rules as
 * a client sees them, read-only mappings, unmap and force-close, and a
 * server restart under a mapped device: IO issued during the outage waits,
 * the device is opened again, and the data is all there; IO issued while a
 * device is being opened again waits at its gate for that open (and a map
 * racing the reconnect, or taking the device's old id meanwhile, changes
 * nothing of where IO goes); and the asynchronous API with more IO in
 * flight than the session has slots (every done called once, the bytes
 * read back, refusals returned, -EDEADLK for a synchronous call from a
 * callback).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "util.h"
#include "rnbd-hooks.h"
#include "rnbd-proto.h"
#include "rnbd.h"

#define DISK_SIZE (16u << 20)
#define BIG (1u << 20)           /* larger than one request: split */

static const char *top; /* test_tmpdir */
static char disk[600];
static struct rnbd_srv *srv;
static int port;
static unsigned fast_io_fail_ms = 10000; /* of the sessions sess_open opens */

static void srv_start(int want_port)
{
	struct rnbd_srv_opts o;

	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = (uint16_t)want_port;
	o.dev_search_path = top;
	o.rtrs.queue_depth = 32;
	o.rtrs.hb_interval_ms = 100;
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	CHECK(port > 0, "port %d", port);
}

static struct rnbd_clt_sess *sess_open(const char *name)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	static char dst[64];
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
	o.hb_interval_ms = 100;
	o.reconnect_delay_ms = 100;
	o.reconnect_jitter_ms = 50;
	o.fast_io_fail_ms = fast_io_fail_ms;
	rc = rnbd_clt_sess_open(&o, &s);
	CHECK(rc == 0, "session %s: %s", name, strerror(-rc));
	return s;
}

struct bg_io {
	struct rnbd_clt_dev *dev;
	uint8_t *buf;
	int rc;
};

static void *bg_read(void *arg)
{
	struct bg_io *b = arg;

	b->rc = rnbd_clt_io(b->dev, RNBD_CLT_READ, 0, 0, b->buf, BIG);
	return NULL;
}

/* One thread of a storm: writes its slot's pattern and reads it back, over and over. */
/* Writes and reads back its slot until stop, or rounds when not 0. */
struct storm {
	struct rnbd_clt_dev *dev;
	unsigned slot, rounds, done;
	bool stop;
	int rc;
};

static void *storm_io(void *arg)
{
	struct storm *st = arg;
	uint8_t *w = malloc(65536), *r = malloc(65536);
	uint64_t off = (uint64_t)(2 + st->slot) << 20;

	test_fill(w, 65536, 100 + st->slot);
	for (unsigned i = 0; st->rounds ? i < st->rounds : !__atomic_load_n(&st->stop, __ATOMIC_RELAXED);
	     __atomic_store_n(&st->done, ++i, __ATOMIC_RELAXED)) {
		st->rc = rnbd_clt_io(st->dev, RNBD_CLT_WRITE, 0, off, w, 65536);
		if (!st->rc)
			st->rc = rnbd_clt_io(st->dev, RNBD_CLT_READ, 0, off, r, 65536);
		if (!st->rc && memcmp(w, r, 65536))
			st->rc = -EILSEQ;
		if (st->rc)
			break;
	}
	free(w);
	free(r);
	return NULL;
}

/* The asynchronous API: N IO in flight at once, more than the session's slots. */
#define AIO_N 80
#define AIO_LEN (128u << 10) /* two pieces each */

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned left;
	unsigned calls[AIO_N];
	int err[AIO_N];
	int nested;             /* rnbd_clt_io from a callback */
	struct rnbd_clt_dev *dev;
} aio = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void aio_done(void *priv, int err)
{
	unsigned i = (unsigned)(uintptr_t)priv;
	uint8_t one[512];
	int nested = i == 0 ? rnbd_clt_io(aio.dev, RNBD_CLT_READ, 0, 0, one, sizeof(one)) : 0;

	pthread_mutex_lock(&aio.lock);
	if (i == 0)
		aio.nested = nested;
	aio.calls[i]++;
	aio.err[i] = err;
	if (--aio.left == 0)
		pthread_cond_broadcast(&aio.cond);
	pthread_mutex_unlock(&aio.lock);
}

/* Submits n reads or writes of AIO_LEN at 4 MiB + i * AIO_LEN (done: aio_wait). */
static void aio_submit(struct rnbd_clt_dev *d, enum rnbd_clt_op op, uint8_t *bufs, unsigned n)
{
	aio.dev = d;
	aio.left = n;
	memset(aio.calls, 0, sizeof(aio.calls));
	for (unsigned i = 0; i < n; i++) {
		int rc = rnbd_clt_submit(d, op, 0, (4u << 20) + (uint64_t)i * AIO_LEN,
					 bufs + (size_t)i * AIO_LEN, AIO_LEN, aio_done,
					 (void *)(uintptr_t)i);

		CHECK(rc == 0, "submit %u: %s", i, strerror(-rc));
		if (rc) {
			aio.calls[i] = 1; /* counted as done, with its error */
			aio.err[i] = rc;
			pthread_mutex_lock(&aio.lock);
			aio.left--;
			pthread_mutex_unlock(&aio.lock);
		}
	}
}

/* Waits for the n IO of aio_submit: each done once, without error. */
static void aio_wait(unsigned n)
{
	pthread_mutex_lock(&aio.lock);
	while (aio.left)
		pthread_cond_wait(&aio.cond, &aio.lock);
	pthread_mutex_unlock(&aio.lock);
	for (unsigned i = 0; i < n; i++) {
		CHECK(aio.calls[i] == 1, "IO %u: done called %u times", i, aio.calls[i]);
		CHECK(aio.err[i] == 0, "IO %u: %s", i, strerror(-aio.err[i]));
	}
}

static void aio_round(struct rnbd_clt_dev *d, enum rnbd_clt_op op, uint8_t *bufs)
{
	aio_submit(d, op, bufs, AIO_N);
	aio_wait(AIO_N);
}

static void test_async(struct rnbd_clt_dev *d)
{
	uint8_t *w = malloc((size_t)AIO_N * AIO_LEN), *r = malloc((size_t)AIO_N * AIO_LEN);
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };

	CHECK_EQ(rnbd_clt_dev_info(d, &in), 0);
	CHECK(in.queue_depth > 0 && in.queue_depth < AIO_N, "queue depth %u: submit waits",
	      in.queue_depth);
	for (unsigned i = 0; i < AIO_N; i++)
		test_fill(w + (size_t)i * AIO_LEN, AIO_LEN, 200 + i);
	aio_round(d, RNBD_CLT_WRITE, w);
	CHECK_EQ(aio.nested, -EDEADLK);
	memset(r, 0, (size_t)AIO_N * AIO_LEN);
	aio_round(d, RNBD_CLT_READ, r);
	CHECK(!memcmp(w, r, (size_t)AIO_N * AIO_LEN), "%u async reads return the async writes",
	      AIO_N);
	CHECK(test_file_has(disk, 4u << 20, w, (size_t)AIO_N * AIO_LEN), "and the file holds them");

	/*
	 * Every IO slot taken by IO waiting for the server: the reopen after
	 * it comes back still gets its admin messages through, and the IO
	 * all completes.
	 */
	rnbd_srv_close(srv);
	memset(r, 0, (size_t)AIO_N * AIO_LEN);
	aio_submit(d, RNBD_CLT_READ, r, in.queue_depth);
	usleep(300 * 1000); /* the heartbeat sees the server gone; the IO is parked */
	/* No slot free: RNBD_CLT_F_NOWAIT returns at once, done not called. */
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_READ, RNBD_CLT_F_NOWAIT, 0, r, 512, aio_done, NULL),
		 -EAGAIN);
	srv_start(port);
	aio_wait(in.queue_depth);
	/* With slots free it takes one, and the flag is not sent (the server would refuse it). */
	memset(r, 0, 512);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, RNBD_CLT_F_NOWAIT, 4u << 20, r, 512), 0);
	CHECK(!memcmp(w, r, 512), "a NOWAIT read returns the data");
	CHECK(!memcmp(w, r, (size_t)in.queue_depth * AIO_LEN),
	      "%u reads parked in every slot across a server restart return the data",
	      in.queue_depth);
	/* Refusals come back from the call, and done is not called. */
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_READ, 0, 1, r, 512, aio_done, NULL), -EINVAL);
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_READ, 0, 0, r, 512, NULL, NULL), -EINVAL);
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_WRITE, 0, 0, NULL, 512, aio_done, NULL), -EINVAL);
	free(w);
	free(r);
}

/* Devices of session sess the server has open (closed or not), and how many of them closed. */
struct srv_count {
	const char *sess;
	unsigned open, closed;
};

static void srv_count_fn(void *priv, const struct rnbd_srv_dev_stats *st)
{
	struct srv_count *c = priv;

	if (!strcmp(st->session, c->sess)) {
		c->open++;
		c->closed += st->closed;
	}
}

static struct srv_count srv_count(const char *sess)
{
	struct srv_count c = { .sess = sess };

	rnbd_srv_list(srv, srv_count_fn, &c);
	return c;
}

static void test_all(void)
{
	static uint8_t a[BIG], b[BIG], zero[BIG];
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };
	struct rnbd_clt_sess *s1, *s2;
	struct rnbd_clt_dev *d1, *d2, *dx, *dv;
	char moved[700], moved_to[700];
	struct bg_io bg;
	pthread_t th;
	int fd;

	snprintf(disk, sizeof(disk), "%s/disk", top);
	fd = open(disk, O_CREAT | O_RDWR, 0600);
	CHECK(fd >= 0 && ftruncate(fd, DISK_SIZE) == 0);
	close(fd);
	srv_start(0);
	s1 = sess_open("c1");
	s2 = sess_open("c2");
	if (!s1 || !s2)
		return;

	/* Map, and what the device says of itself. */
	CHECK_EQ(rnbd_clt_map(s1, "disk", RNBD_CLT_RW, &d1), 0);
	CHECK_EQ(rnbd_clt_dev_info(d1, &in), 0);
	CHECK_EQ(in.bytes, DISK_SIZE);
	CHECK_EQ(in.logical_block_size, 512);
	CHECK(in.max_io > 0 && in.max_io < BIG, "max_io %u: a 1 MiB IO is split", in.max_io);
	CHECK(in.discard && in.write_zeroes && in.write_cache && in.fua && !in.read_only);
	CHECK(!strcmp(in.state, "mapped"), "%s", in.state);
	CHECK_EQ(rnbd_clt_map(s1, "/disk", RNBD_CLT_RW, &dx), -EEXIST);
	CHECK_EQ(rnbd_clt_map(s1, "../etc/passwd", RNBD_CLT_RO, &dx), -EINVAL);
	CHECK_EQ(rnbd_clt_map(s1, "nothing-here", RNBD_CLT_RO, &dx), -ENOENT);

	/* IO of every kind. */
	test_fill(a, BIG, 1);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_WRITE, 0, 4096, a, BIG), 0);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_READ, 0, 4096, b, BIG), 0);
	CHECK(!memcmp(a, b, BIG), "1 MiB read back equals what was written");
	CHECK(test_file_has(disk, 4096, a, BIG), "and the file holds it");
	test_fill(a, 65536, 2);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_WRITE, RNBD_CLT_F_FUA | RNBD_CLT_F_PREFLUSH,
			     8 << 20, a, 65536), 0);
	CHECK(test_file_has(disk, 8 << 20, a, 65536));
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_FLUSH, 0, 0, NULL, 0), 0);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_DISCARD, 0, 4096, NULL, 65536), 0);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_WRITE_ZEROES, RNBD_CLT_F_NOUNMAP, 4096 + 65536, NULL,
			     65536), 0);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_READ, 0, 4096, b, 131072), 0);
	CHECK(!memcmp(b, zero, 131072), "discarded and zeroed ranges read as zeros");
	/* Refused before anything is sent. */
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_READ, 0, 100, b, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_READ, 0, DISK_SIZE - 512, b, 1024), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_READ, 0, 0, NULL, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_FLUSH, 0, 512, NULL, 0), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_SECURE_ERASE, 0, 0, NULL, 4096), -EOPNOTSUPP);

	/* The sharing rule, from another session. */
	CHECK_EQ(rnbd_clt_map(s2, "disk", RNBD_CLT_RW, &d2), -EPERM);
	CHECK_EQ(rnbd_clt_map(s2, "disk", RNBD_CLT_RO, &d2), 0);
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_READ, 0, 8 << 20, b, 65536), 0);
	CHECK(!memcmp(a, b, 65536), "a reader sees the writer's data");
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_WRITE, 0, 0, a, 512), -EROFS);
	CHECK_EQ(rnbd_clt_dev_info(d2, &in), 0);
	CHECK(in.read_only);
	CHECK_EQ(rnbd_clt_unmap(d2, false), 0);
	CHECK_EQ(rnbd_clt_map(s2, "disk", RNBD_CLT_MIGRATION, &d2), 0);
	CHECK_EQ(rnbd_clt_unmap(d2, false), 0);

	/*
	 * Force-close on the server: IO fails with -ENOTCONN, and from then on
	 * the device says it is closed and its IO fails so unsent. A remap
	 * gives the server its id back and opens it again; an unmap of a
	 * closed device gives the id back too.
	 */
	CHECK_EQ(rnbd_clt_map(s2, "disk", RNBD_CLT_RO, &d2), 0);
	CHECK_EQ(rnbd_srv_force_close(srv, "c2", "disk"), 0);
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_READ, 0, 0, b, 4096), -ENOTCONN);
	CHECK_EQ(rnbd_clt_dev_info(d2, &in), 0);
	CHECK(!strcmp(in.state, "closed"), "a force-closed device says so: %s", in.state);
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_READ, 0, 0, b, 4096), -ENOTCONN);
	CHECK(srv_count("c2").open == 1 && srv_count("c2").closed == 1,
	      "the server holds the closed device's id");
	CHECK_EQ(rnbd_clt_remap(d2), 0);
	CHECK_EQ(rnbd_clt_dev_info(d2, &in), 0);
	CHECK(!strcmp(in.state, "mapped"), "remapped: %s", in.state);
	CHECK(srv_count("c2").open == 1 && srv_count("c2").closed == 0,
	      "the remap closed the old id: one device open on the server");
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_READ, 0, 8 << 20, b, 65536), 0);
	CHECK(!memcmp(a, b, 65536), "the remapped device reads the data");
	CHECK_EQ(rnbd_clt_remap(d2), -EALREADY);
	CHECK_EQ(rnbd_srv_force_close(srv, "c2", "disk"), 0);
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_READ, 0, 0, b, 4096), -ENOTCONN);
	CHECK_EQ(rnbd_clt_unmap(d2, false), 0);
	CHECK_EQ(srv_count("c2").open, 0);

	/*
	 * The server restarts under a mapped device. A read issued while it is
	 * down waits, the device is opened again, and the read returns the
	 * data written before.
	 */
	/*
	 * Two more devices, so that each must find its own data after the
	 * restart; the first of them ("vanish", the lower id) is gone while the
	 * server is down: its re-open fails, the next one's must not, and a
	 * remap brings it back once it is there again.
	 */
	for (int i = 0; i < 2; i++) {
		char p2[700];
		int f2;

		snprintf(p2, sizeof(p2), "%s/%s", top, i ? "disk2" : "vanish");
		f2 = open(p2, O_CREAT | O_RDWR, 0600);
		CHECK(f2 >= 0 && ftruncate(f2, DISK_SIZE) == 0);
		close(f2);
	}
	CHECK_EQ(rnbd_clt_map(s1, "vanish", RNBD_CLT_RW, &dv), 0);
	CHECK_EQ(rnbd_clt_map(s1, "disk2", RNBD_CLT_RW, &dx), 0);
	test_fill(a, 65536, 42);
	CHECK_EQ(rnbd_clt_io(dx, RNBD_CLT_WRITE, 0, 0, a, 65536), 0);
	test_fill(a, 65536, 43);
	CHECK_EQ(rnbd_clt_io(dv, RNBD_CLT_WRITE, 0, 0, a, 65536), 0);
	test_fill(a, BIG, 1);
	rnbd_srv_close(srv);
	snprintf(moved, sizeof(moved), "%s/vanish", top);
	snprintf(moved_to, sizeof(moved_to), "%s/vanished", top);
	CHECK_EQ(rename(moved, moved_to), 0);
	bg = (struct bg_io){ .dev = d1, .buf = b };
	memset(b, 0, BIG);
	CHECK_EQ(pthread_create(&th, NULL, bg_read, &bg), 0);
	usleep(300 * 1000);
	srv_start(port);
	pthread_join(th, NULL);
	CHECK_EQ(bg.rc, 0);
	{
		uint8_t *want = malloc(BIG);
		int f = open(disk, O_RDONLY);

		CHECK(f >= 0 && pread(f, want, BIG, 0) == BIG);
		CHECK(!memcmp(want, b, BIG), "the read across the restart returns the device's data");
		close(f);
		free(want);
	}
	CHECK_EQ(rnbd_clt_dev_info(d1, &in), 0);
	CHECK(!strcmp(in.state, "mapped"), "state after the restart: %s", in.state);
	test_fill(a, 65536, 42);
	CHECK_EQ(rnbd_clt_io(dx, RNBD_CLT_READ, 0, 0, b, 65536), 0);
	CHECK(!memcmp(a, b, 65536), "the second device reads its own data after the restart");
	CHECK_EQ(rnbd_clt_unmap(dx, false), 0);
	CHECK_EQ(rnbd_clt_dev_info(dv, &in), 0);
	CHECK(!strcmp(in.state, "disconnected"), "a device gone from the server: %s", in.state);
	CHECK_EQ(rename(moved_to, moved), 0);
	CHECK_EQ(rnbd_clt_remap(dv), 0);
	CHECK_EQ(rnbd_clt_remap(dv), -EALREADY);
	test_fill(a, 65536, 43);
	CHECK_EQ(rnbd_clt_io(dv, RNBD_CLT_READ, 0, 0, b, 65536), 0);
	CHECK(!memcmp(a, b, 65536), "remapped, it reads its data");
	CHECK_EQ(rnbd_clt_unmap(dv, false), 0);
	test_fill(a, 4096, 9);
	CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_WRITE, RNBD_CLT_F_FUA, 0, a, 4096), 0);
	CHECK(test_file_has(disk, 0, a, 4096), "IO goes on after the restart");

	/*
	 * The server stops with IO in flight: it answers all of it before it
	 * goes, and the client's IO waits for the restarted server and ends
	 * well. Writes are of the same pattern each time, so whatever reached
	 * the file before the stop, the file ends with that pattern.
	 */
	{
		struct storm st[6];
		pthread_t ths[6];
		uint8_t *want = malloc(65536), *got = malloc(65536);

		unsigned before[6];

		for (int i = 0; i < 6; i++) {
			st[i] = (struct storm){ .dev = d1, .slot = (unsigned)i };
			CHECK_EQ(pthread_create(&ths[i], NULL, storm_io, &st[i]), 0);
		}
		usleep(100 * 1000);
		rnbd_srv_close(srv); /* returns only when every IO in flight was answered */
		for (int i = 0; i < 6; i++)
			before[i] = __atomic_load_n(&st[i].done, __ATOMIC_RELAXED);
		usleep(200 * 1000);
		srv_start(port);
		/* Each thread goes on against the new server for 20 more rounds. */
		for (int i = 0; i < 6; i++) {
			uint64_t t0 = test_now_ms();

			/* A thread that failed stops counting: its rc is checked after the join. */
			while (__atomic_load_n(&st[i].done, __ATOMIC_RELAXED) < before[i] + 20 &&
			       test_now_ms() - t0 < 30000)
				usleep(10 * 1000);
		}
		for (int i = 0; i < 6; i++)
			__atomic_store_n(&st[i].stop, true, __ATOMIC_RELAXED);
		for (int i = 0; i < 6; i++) {
			pthread_join(ths[i], NULL);
			CHECK(st[i].rc == 0, "IO thread %d: %s after %u rounds", i,
			      strerror(-st[i].rc), st[i].done);
			CHECK(st[i].done >= before[i] + 20, "thread %d: %u rounds, %u before the stop",
			      i, st[i].done, before[i]);
			test_fill(want, 65536, 100 + (unsigned)i);
			CHECK(test_file_has(disk, (uint64_t)(2 + i) << 20, want, 65536),
			      "slot %d holds its pattern", i);
			CHECK_EQ(rnbd_clt_io(d1, RNBD_CLT_READ, 0, (uint64_t)(2 + i) << 20, got, 65536), 0);
			CHECK(!memcmp(want, got, 65536));
		}
		free(want);
		free(got);
	}

	test_async(d1);

	/* Unmapped, the name can be mapped again; sessions close with devices mapped. */
	CHECK_EQ(rnbd_clt_unmap(d1, false), 0);
	CHECK_EQ(rnbd_clt_map(s1, "disk", RNBD_CLT_RW, &d1), 0);
	rnbd_clt_sess_close(s1);
	rnbd_clt_sess_close(s2);
	rnbd_srv_close(srv);
}

/* A file of DISK_SIZE named name below top, its first 64 KiB test_fill(seed). */
static void disk_make(const char *name, unsigned seed)
{
	uint8_t *w = malloc(65536);
	char path[700];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", top, name);
	fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
	CHECK(fd >= 0 && ftruncate(fd, DISK_SIZE) == 0);
	test_fill(w, 65536, seed);
	CHECK(pwrite(fd, w, 65536, 0) == 65536);
	close(fd);
	free(w);
}

/*
 * A map racing a server restart, made reproducible by the library's OPEN
 * hook: the OPEN of "b" is answered by the old server session (id 1, the
 * hole "x" left), then, before the map takes the answer, the server
 * restarts and the reconnect opens "a" and "c" again, which get ids 0 and 1
 * there. The map must not become a mapping under id 1 (that is "c" now): b's
 * writes must reach b's file and leave c's alone. "c" grew while the server
 * was away, and its size after the reopen is the new one.
 */
static struct {
	bool fired;
	char grow[700];
	unsigned devices;
} race;

static void race_count(void *priv, const struct rnbd_srv_dev_stats *st)
{
	(void)priv;
	race.devices += !strcmp(st->session, "race");
}

static void race_hook(void *priv, const char *dev_name)
{
	uint64_t end;

	(void)priv;
	if (strcmp(dev_name, "race-b") || race.fired)
		return;
	race.fired = true;
	rnbd_srv_close(srv);
	CHECK_EQ(truncate(race.grow, 2 * DISK_SIZE), 0);
	srv_start(port);
	/* Until the reconnect has opened a and c on the new server. */
	for (end = test_now_ms() + 10000; test_now_ms() < end; usleep(10 * 1000)) {
		race.devices = 0;
		rnbd_srv_list(srv, race_count, NULL);
		if (race.devices == 2)
			break;
	}
	CHECK_EQ(race.devices, 2);
}

static void test_map_race(void)
{
	static const char *const names[] = { "a", "x", "c", "b" };
	struct rnbd_clt_dev *d[4] = { 0 };
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };
	uint8_t *w = malloc(65536), *r = malloc(65536);
	struct rnbd_clt_sess *s;
	char path[700];

	for (unsigned i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "race-%s", names[i]);
		disk_make(path, 300 + i);
	}
	snprintf(race.grow, sizeof(race.grow), "%s/race-c", top);
	srv_start(0);
	s = sess_open("race");
	if (!s)
		return;
	/* a = 0, x = 1, c = 2; x goes, so the next OPEN gets 1. */
	for (unsigned i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "race-%s", names[i]);
		CHECK_EQ(rnbd_clt_map(s, path, RNBD_CLT_RW, &d[i]), 0);
	}
	CHECK_EQ(rnbd_clt_unmap(d[1], false), 0);
	rnbd_clt_set_open_hook(race_hook, NULL);
	CHECK_EQ(rnbd_clt_map(s, "race-b", RNBD_CLT_RW, &d[3]), 0);
	rnbd_clt_set_open_hook(NULL, NULL);
	CHECK(race.fired, "the hook ran");
	if (d[3]) {
		test_fill(w, 65536, 999);
		CHECK_EQ(rnbd_clt_io(d[3], RNBD_CLT_WRITE, 0, 0, w, 65536), 0);
		snprintf(path, sizeof(path), "%s/race-b", top);
		CHECK(test_file_has(path, 0, w, 65536), "b's write is in b");
		test_fill(w, 65536, 302);
		snprintf(path, sizeof(path), "%s/race-c", top);
		CHECK(test_file_has(path, 0, w, 65536), "c is untouched by b's write");
		CHECK_EQ(rnbd_clt_io(d[2], RNBD_CLT_READ, 0, 0, r, 65536), 0);
		CHECK(!memcmp(w, r, 65536), "c reads its own data");
		CHECK_EQ(rnbd_clt_dev_info(d[3], &in), 0);
		CHECK(!strcmp(in.state, "mapped"), "b: %s", in.state);
	}
	CHECK_EQ(rnbd_clt_dev_info(d[2], &in), 0);
	CHECK_EQ(in.bytes, 2 * DISK_SIZE); /* each OPEN_RSP gives the size */
	CHECK_EQ(rnbd_clt_io(d[2], RNBD_CLT_READ, 0, DISK_SIZE, r, 65536), 0);
	rnbd_clt_sess_close(s);
	rnbd_srv_close(srv);
	free(w);
	free(r);
}

/* ---- the client's own checks, against a server written here ---------------------- */

/*
 * An RNBD server in a few lines over librtrs, whose OPEN_RSP says what the
 * test wants (pieces of 8 KiB, no discard, no write zeroes, no secure
 * erase), that counts what reaches it and can hold writes unanswered.
 */
#define FAKE_SIZE (1u << 20)
#define FAKE_MAX_HW 16 /* sectors: 8 KiB pieces */

static struct {
	struct rtrs_srv_ctx *ctx;
	pthread_mutex_t lock;
	uint8_t mem[FAKE_SIZE];
	unsigned ios[RNBD_OP_WRITE_ZEROES + 1];
	unsigned requests, closes;
	uint32_t biggest;       /* largest bi_size seen */
	bool hold;              /* hold writes */
	struct rtrs_srv_op *held[4];
	struct rnbd_io held_io[4];
	void *held_data[4];
	unsigned nheld;
} fake = { .lock = PTHREAD_MUTEX_INITIALIZER };

static int fake_rdma_ev(void *priv, struct rtrs_srv_op *op, enum rtrs_dir dir, void *data,
			size_t datalen, const void *usr, size_t usrlen)
{
	const char *why = NULL;
	struct rnbd_io io;
	unsigned ver;
	int type = rnbd_msg_type(usr, usrlen, &why), rc = 0;

	(void)priv;
	(void)dir;
	pthread_mutex_lock(&fake.lock);
	fake.requests++;
	if (type == RNBD_MSG_SESS_INFO) {
		rnbd_sess_info_decode(usr, usrlen, false, &ver, &why);
		rnbd_sess_info_encode(data, true, RNBD_PROTO_VER_MAJOR);
	} else if (type == RNBD_MSG_OPEN) {
		struct rnbd_open_rsp r = {
			.device_id = 0, .nsectors = FAKE_SIZE >> 9, .max_hw_sectors = FAKE_MAX_HW,
			.physical_block_size = 4096, .logical_block_size = 512, .max_segments = 1,
			.cache_policy = RNBD_WRITEBACK | RNBD_FUA,
		};

		memset(data, 0, datalen);
		rnbd_open_rsp_encode(data, &r);
	} else if (type == RNBD_MSG_CLOSE) {
		fake.closes++;
	} else if (type == RNBD_MSG_IO && !rnbd_io_decode(usr, usrlen, 2, datalen, &io, &why) &&
		   (io.sector << 9) + io.bi_size <= FAKE_SIZE) {
		fake.ios[io.op]++;
		fake.biggest = MAX(fake.biggest, io.bi_size);
		if (io.op == RNBD_OP_WRITE && fake.hold && fake.nheld < 4) {
			fake.held[fake.nheld] = op;
			fake.held_io[fake.nheld] = io;
			fake.held_data[fake.nheld++] = data;
			pthread_mutex_unlock(&fake.lock);
			return 0; /* answered by fake_release */
		}
		if (io.op == RNBD_OP_READ)
			memcpy(data, fake.mem + (io.sector << 9), io.bi_size);
		else if (io.op == RNBD_OP_WRITE)
			memcpy(fake.mem + (io.sector << 9), data, io.bi_size);
		else if (io.op != RNBD_OP_FLUSH)
			rc = -EOPNOTSUPP;
	} else {
		rc = -EINVAL;
	}
	pthread_mutex_unlock(&fake.lock);
	return rc ? rc : rtrs_srv_resp_rdma(op, 0);
}

static int fake_link_ev(struct rtrs_srv_sess *sess, enum rtrs_srv_link_ev ev, void *priv)
{
	(void)sess;
	(void)ev;
	(void)priv;
	return 0;
}

/* Starts the fake server on port (0: any). */
static void fake_start(int on_port)
{
	struct rtrs_srv_ops ops = { .rdma_ev = fake_rdma_ev, .link_ev = fake_link_ev };
	struct rtrs_srv_opts so;

	rtrs_srv_opts_init(&so, sizeof(so));
	so.addr = test_addr();
	so.provider = test_provider();
	so.port = (uint16_t)on_port;
	so.queue_depth = 16;
	so.hb_interval_ms = 100;
	CHECK_EQ(rtrs_srv_open(&ops, &so, &fake.ctx), 0);
	CHECK_EQ(rtrs_srv_wait_listening(fake.ctx, 5000), 0);
}

/* Answers the held writes (their data written). */
static void fake_release(void)
{
	pthread_mutex_lock(&fake.lock);
	fake.hold = false;
	for (unsigned i = 0; i < fake.nheld; i++) {
		memcpy(fake.mem + (fake.held_io[i].sector << 9), fake.held_data[i],
		       fake.held_io[i].bi_size);
		rtrs_srv_resp_rdma(fake.held[i], 0);
	}
	fake.nheld = 0;
	pthread_mutex_unlock(&fake.lock);
}

static unsigned fake_held(unsigned ms)
{
	uint64_t end = test_now_ms() + ms;
	unsigned n;

	for (;;) {
		pthread_mutex_lock(&fake.lock);
		n = fake.nheld;
		pthread_mutex_unlock(&fake.lock);
		if (n || test_now_ms() >= end)
			return n;
		usleep(1000);
	}
}

static unsigned fake_count(unsigned *what)
{
	unsigned n;

	pthread_mutex_lock(&fake.lock);
	n = *what;
	pthread_mutex_unlock(&fake.lock);
	return n;
}

/* One IO submitted without waiting: its result and how often done ran. */
struct one_io {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned calls;
	int err;
};

static void one_done(void *priv, int err)
{
	struct one_io *o = priv;

	pthread_mutex_lock(&o->lock);
	o->calls++;
	o->err = err;
	pthread_cond_broadcast(&o->cond);
	pthread_mutex_unlock(&o->lock);
}

static int one_wait(struct one_io *o)
{
	pthread_mutex_lock(&o->lock);
	while (!o->calls)
		pthread_cond_wait(&o->cond, &o->lock);
	pthread_mutex_unlock(&o->lock);
	return o->err;
}

static struct {
	struct rnbd_clt_dev *dev;
	int rc;
	bool done;
} unmapper;

static void *unmap_forced(void *arg)
{
	(void)arg;
	unmapper.rc = rnbd_clt_unmap(unmapper.dev, true);
	__atomic_store_n(&unmapper.done, true, __ATOMIC_RELEASE);
	return NULL;
}

static bool dev_state_is(struct rnbd_clt_dev *d, const char *state, unsigned ms)
{
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };
	uint64_t end = test_now_ms() + ms;

	do {
		if (rnbd_clt_dev_info(d, &in) == 0 && !strcmp(in.state, state))
			return true;
		usleep(1000);
	} while (test_now_ms() < end);
	return false;
}

/*
 * IO issued while a device is being opened again after a server restart
 * waits at the device's gate for that open, and only for it. The open hook
 * holds the answer to the worker's OPEN of "win-b" (old id 1; "win-v",
 * id 0, is gone from the server, so b's new id is 0). In that window a map
 * of "win-n" gets id 1 on the new server, b's old id: a write to b must not
 * go out under it (it would land in n), nor reach the server at all before
 * b is open; n, open, takes IO meanwhile. Once the hook lets go, b's write
 * goes under its new id exactly once. IO to v, whose open fails, fails with
 * that open's error instead of waiting for a deadline.
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const char *dev;        /* whose OPEN answer the hook holds */
	bool in, go;
} win = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void win_hook_fn(void *priv, const char *dev_name)
{
	struct timespec dl;

	(void)priv;
	pthread_mutex_lock(&win.lock);
	if (!win.dev || strcmp(dev_name, win.dev) || win.go) {
		pthread_mutex_unlock(&win.lock);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 20;
	win.in = true;
	pthread_cond_broadcast(&win.cond);
	while (!win.go && pthread_cond_timedwait(&win.cond, &win.lock, &dl) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&win.lock);
}

static void win_arm(const char *dev)
{
	pthread_mutex_lock(&win.lock);
	win.dev = dev;
	win.in = win.go = false;
	pthread_mutex_unlock(&win.lock);
	rnbd_clt_set_open_hook(win_hook_fn, NULL);
}

static bool win_wait_in(unsigned ms)
{
	struct timespec dl;
	bool in;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += ms / 1000;
	pthread_mutex_lock(&win.lock);
	while (!win.in && pthread_cond_timedwait(&win.cond, &win.lock, &dl) != ETIMEDOUT)
		;
	in = win.in;
	pthread_mutex_unlock(&win.lock);
	return in;
}

static void win_release(void)
{
	pthread_mutex_lock(&win.lock);
	win.go = true;
	pthread_cond_broadcast(&win.cond);
	pthread_mutex_unlock(&win.lock);
}

/* The server's counters of this session's device dev (writes, reads, id). */
static struct {
	const char *dev;
	bool found;
	uint64_t reads, writes;
	uint32_t id;
} srv_dev;

static void srv_dev_find(void *priv, const struct rnbd_srv_dev_stats *st)
{
	(void)priv;
	if (strcmp(st->session, "window") || strcmp(st->device, srv_dev.dev))
		return;
	srv_dev.found = true;
	srv_dev.reads = st->reads;
	srv_dev.writes = st->writes;
	srv_dev.id = st->device_id;
}

static bool srv_dev_get(const char *dev)
{
	srv_dev.dev = dev;
	srv_dev.found = false;
	rnbd_srv_list(srv, srv_dev_find, NULL);
	return srv_dev.found;
}

static void test_reopen_window(void)
{
	static const char *const names[] = { "win-v", "win-b", "win-n" };
	struct rnbd_clt_dev *v, *b, *n;
	struct one_io wb = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	struct one_io rv = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	uint8_t *w = malloc(65536), *r = malloc(65536);
	char path[700], gone[700];
	struct rnbd_clt_sess *s;

	for (unsigned i = 0; i < 3; i++)
		disk_make(names[i], 400 + i);
	srv_start(0);
	s = sess_open("window");
	if (!s)
		return;
	CHECK_EQ(rnbd_clt_map(s, "win-v", RNBD_CLT_RW, &v), 0);
	CHECK_EQ(rnbd_clt_map(s, "win-b", RNBD_CLT_RW, &b), 0);
	CHECK(srv_dev_get("win-b") && srv_dev.id == 1, "b has id 1");

	/* The restart, with v gone; the worker's OPEN of b is held once answered. */
	win_arm("win-b");
	rnbd_srv_close(srv);
	snprintf(path, sizeof(path), "%s/win-v", top);
	snprintf(gone, sizeof(gone), "%s/win-v.gone", top);
	CHECK_EQ(rename(path, gone), 0);
	srv_start(port);
	CHECK(win_wait_in(20000), "the worker opens b again");
	CHECK(dev_state_is(b, "reopening", 0), "b is being opened again");
	CHECK(srv_dev_get("win-b") && srv_dev.id == 0, "b has id 0 on the new server");

	/* n takes b's old id on the new server. */
	CHECK_EQ(rnbd_clt_map(s, "win-n", RNBD_CLT_RW, &n), 0);
	CHECK(srv_dev_get("win-n") && srv_dev.id == 1, "n has b's old id");
	/* A write to b in the window waits at b's gate. */
	test_fill(w, 65536, 501);
	CHECK_EQ(rnbd_clt_submit(b, RNBD_CLT_WRITE, 0, 0, w, 65536, one_done, &wb), 0);
	/* n is open: its IO goes meanwhile. */
	test_fill(r, 65536, 502);
	CHECK_EQ(rnbd_clt_io(n, RNBD_CLT_WRITE, 0, 65536, r, 65536), 0);
	usleep(200 * 1000);
	pthread_mutex_lock(&wb.lock);
	CHECK_EQ(wb.calls, 0);
	pthread_mutex_unlock(&wb.lock);
	CHECK(srv_dev_get("win-b") && srv_dev.writes == 0, "nothing of b's reached the server");
	CHECK(srv_dev_get("win-n") && srv_dev.writes == 1, "n's one write did: %llu",
	      (unsigned long long)srv_dev.writes);
	test_fill(r, 65536, 402);
	snprintf(path, sizeof(path), "%s/win-n", top);
	CHECK(test_file_has(path, 0, r, 65536), "n's first block is untouched");

	/* The open ends: the write goes, once, under b's new id. */
	win_release();
	CHECK_EQ(one_wait(&wb), 0);
	CHECK_EQ(wb.calls, 1);
	rnbd_clt_set_open_hook(NULL, NULL);
	CHECK(dev_state_is(b, "mapped", 0), "b is open again");
	snprintf(path, sizeof(path), "%s/win-b", top);
	CHECK(test_file_has(path, 0, w, 65536), "b's write is in b");
	CHECK(srv_dev_get("win-b") && srv_dev.writes == 1, "b's write reached the server once: %llu",
	      (unsigned long long)srv_dev.writes);
	snprintf(path, sizeof(path), "%s/win-n", top);
	CHECK(test_file_has(path, 0, r, 65536), "n's first block is still untouched");
	test_fill(r, 65536, 502);
	CHECK(test_file_has(path, 65536, r, 65536), "n holds its own write");
	CHECK(srv_dev_get("win-n") && srv_dev.writes == 1);
	memset(r, 0, 65536);
	CHECK_EQ(rnbd_clt_io(b, RNBD_CLT_READ, 0, 0, r, 65536), 0);
	CHECK(!memcmp(w, r, 65536), "b reads its write back");

	/* v's open failed: IO to it asks for another, and fails with that open's error. */
	CHECK(dev_state_is(v, "disconnected", 0), "v is not open");
	CHECK_EQ(rnbd_clt_submit(v, RNBD_CLT_READ, 0, 0, r, 4096, one_done, &rv), 0);
	CHECK_EQ(one_wait(&rv), -ENOENT);
	CHECK_EQ(rv.calls, 1);
	snprintf(path, sizeof(path), "%s/win-v", top);
	CHECK_EQ(rename(gone, path), 0);
	CHECK_EQ(rnbd_clt_io(v, RNBD_CLT_READ, 0, 0, r, 65536), 0);
	test_fill(w, 65536, 400);
	CHECK(!memcmp(w, r, 65536), "back on the server, v is opened for its IO and reads its data");
	CHECK(dev_state_is(v, "mapped", 0), "v is open again");
	rnbd_clt_sess_close(s);
	rnbd_srv_close(srv);
	free(w);
	free(r);
}

/*
 * What the client checks before sending, against the fake server: pieces
 * of the server's max_hw_sectors; operations the device does not do, and
 * flag combinations the server would refuse, refused with no round trip;
 * a resize within the server's size only; a normal unmap with IO in flight
 * refused, a forced one failing the rest of that IO with -ENODEV and
 * freeing everything (the ASan build checks); a forced unmap of IO waiting
 * for a server that is gone.
 */
static void test_client_checks(void)
{
	static uint8_t w[65536], r[65536];
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };
	struct one_io one = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d, *ro;
	unsigned before, writes;
	uint64_t t0;
	pthread_t th;

	fake_start(0);
	port = rtrs_srv_get_port(fake.ctx);
	fast_io_fail_ms = 1500;
	s = sess_open("checks");
	if (!s)
		return;
	CHECK_EQ(rnbd_clt_map(s, "m", RNBD_CLT_RW, &d), 0);
	CHECK_EQ(rnbd_clt_dev_info(d, &in), 0);
	CHECK_EQ(in.max_io, FAKE_MAX_HW * 512);
	CHECK(!in.discard && !in.write_zeroes && !in.secure_erase);

	/* Pieces of max_hw_sectors. */
	test_fill(w, sizeof(w), 5);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE, 0, 4096, w, sizeof(w)), 0);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, 0, 4096, r, sizeof(r)), 0);
	CHECK(!memcmp(w, r, sizeof(w)), "read back in pieces");
	CHECK(fake_count(&fake.biggest) == FAKE_MAX_HW * 512, "largest piece %u",
	      fake_count(&fake.biggest));
	CHECK_EQ(fake_count(&fake.ios[RNBD_OP_WRITE]), sizeof(w) / (FAKE_MAX_HW * 512));

	/* Refused here, nothing sent. */
	CHECK_EQ(rnbd_clt_map(s, "ro", RNBD_CLT_RO, &ro), 0);
	before = fake_count(&fake.requests);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_DISCARD, 0, 0, NULL, 4096), -EOPNOTSUPP);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE_ZEROES, 0, 0, NULL, 4096), -EOPNOTSUPP);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_SECURE_ERASE, 0, 0, NULL, 4096), -EOPNOTSUPP);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, RNBD_CLT_F_FUA, 0, r, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, RNBD_CLT_F_PREFLUSH, 0, r, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE, RNBD_CLT_F_NOUNMAP, 0, w, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE, 1u << 8, 0, w, 512), -EINVAL); /* SYNC: ours */
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_FLUSH, RNBD_CLT_F_NOUNMAP, 0, NULL, 0), -EINVAL);
	CHECK_EQ(rnbd_clt_io(d, (enum rnbd_clt_op)6, 0, 0, NULL, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_io(ro, RNBD_CLT_WRITE, 0, 0, w, 512), -EROFS);
	CHECK_EQ(rnbd_clt_io(ro, RNBD_CLT_DISCARD, 0, 0, NULL, 512), -EROFS);
	CHECK_EQ(fake_count(&fake.requests), before); /* no round trip for any of them */
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_WRITE, RNBD_CLT_F_FUA | RNBD_CLT_F_PREFLUSH, 0, w, 512),
		 0);
	CHECK_EQ(rnbd_clt_unmap(ro, false), 0);

	/* Resize: within the server's size, whole blocks. */
	CHECK_EQ(rnbd_clt_resize(d, 2 * FAKE_SIZE), -EINVAL);
	CHECK_EQ(rnbd_clt_resize(d, FAKE_SIZE - 100), -EINVAL);
	CHECK_EQ(rnbd_clt_resize(d, 0), -EINVAL);
	CHECK_EQ(rnbd_clt_resize(d, FAKE_SIZE / 2), 0);
	CHECK_EQ(rnbd_clt_dev_info(d, &in), 0);
	CHECK_EQ(in.bytes, FAKE_SIZE / 2);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, 0, FAKE_SIZE / 2, r, 512), -EINVAL);
	CHECK_EQ(rnbd_clt_resize(d, FAKE_SIZE), 0);
	CHECK_EQ(rnbd_clt_io(d, RNBD_CLT_READ, 0, FAKE_SIZE / 2, r, 512), 0);

	/*
	 * Unmap with a write in flight (8 pieces, the first held by the
	 * server): busy without force; forced, the rest of the write is not
	 * sent and it fails with -ENODEV, then CLOSE goes.
	 */
	pthread_mutex_lock(&fake.lock);
	fake.hold = true;
	writes = fake.ios[RNBD_OP_WRITE];
	pthread_mutex_unlock(&fake.lock);
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_WRITE, 0, 0, w, sizeof(w), one_done, &one), 0);
	CHECK_EQ(fake_held(5000), 1);
	CHECK_EQ(rnbd_clt_unmap(d, false), -EBUSY);
	CHECK(dev_state_is(d, "mapped", 0), "still mapped after -EBUSY");
	unmapper.dev = d;
	CHECK_EQ(pthread_create(&th, NULL, unmap_forced, NULL), 0);
	CHECK(dev_state_is(d, "unmapping", 5000), "a forced unmap waits for the piece on the wire");
	CHECK(!__atomic_load_n(&unmapper.done, __ATOMIC_ACQUIRE));
	fake_release();
	pthread_join(th, NULL);
	CHECK_EQ(unmapper.rc, 0);
	CHECK_EQ(one_wait(&one), -ENODEV);
	CHECK_EQ(one.calls, 1);
	CHECK_EQ(fake_count(&fake.ios[RNBD_OP_WRITE]), writes + 1); /* one piece went */
	CHECK_EQ(fake_count(&fake.closes), 2); /* ro, then m */

	/*
	 * A forced unmap of IO at the gate of a device being opened again
	 * (the server restarted; the hook holds the answer to the worker's
	 * OPEN): -ENODEV at once, nothing sent, and the unmap waits for the
	 * OPEN before it closes the device.
	 */
	CHECK_EQ(rnbd_clt_map(s, "m", RNBD_CLT_RW, &d), 0);
	win_arm("m");
	rtrs_srv_close(fake.ctx);
	fake_start(port);
	CHECK(win_wait_in(20000), "the worker opens m again");
	before = fake_count(&fake.ios[RNBD_OP_READ]);
	one.calls = 0;
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_READ, 0, 0, r, 4096, one_done, &one), 0);
	CHECK(dev_state_is(d, "reopening", 0), "at the gate");
	unmapper.dev = d;
	unmapper.done = false;
	CHECK_EQ(pthread_create(&th, NULL, unmap_forced, NULL), 0);
	t0 = test_now_ms();
	CHECK_EQ(one_wait(&one), -ENODEV);
	CHECK(test_now_ms() - t0 < 2000, "IO at the gate failed at the unmap (%llu ms)",
	      (unsigned long long)(test_now_ms() - t0));
	CHECK(!__atomic_load_n(&unmapper.done, __ATOMIC_ACQUIRE), "the unmap waits for the OPEN");
	win_release();
	pthread_join(th, NULL);
	rnbd_clt_set_open_hook(NULL, NULL);
	CHECK_EQ(unmapper.rc, 0);
	CHECK_EQ(one.calls, 1);
	CHECK_EQ(fake_count(&fake.ios[RNBD_OP_READ]), before); /* never sent */

	/*
	 * IO waiting for a path waits in the transport, up to its
	 * fast_io_fail_ms (1500 ms for this session), and only there: a
	 * forced unmap cannot take it back from the transport, so it waits
	 * for the transport's verdict, which the IO gets (-ETIMEDOUT).
	 */
	CHECK_EQ(rnbd_clt_map(s, "m", RNBD_CLT_RW, &d), 0);
	rtrs_srv_close(fake.ctx);
	CHECK(dev_state_is(d, "disconnected", 5000), "the server is gone");
	one.calls = 0;
	t0 = test_now_ms();
	CHECK_EQ(rnbd_clt_submit(d, RNBD_CLT_READ, 0, 0, r, 4096, one_done, &one), 0);
	CHECK_EQ(rnbd_clt_unmap(d, false), -EBUSY);
	CHECK_EQ(rnbd_clt_unmap(d, true), 0);
	CHECK_EQ(one_wait(&one), -ETIMEDOUT);
	CHECK_EQ(one.calls, 1);
	CHECK(test_now_ms() - t0 >= 1400 && test_now_ms() - t0 < 5000,
	      "the transport's bound, once: %llu ms (1500)",
	      (unsigned long long)(test_now_ms() - t0));
	rnbd_clt_sess_close(s);
	fast_io_fail_ms = 10000;
}

int main(void)
{
	top = test_tmpdir(NULL, "rnbd-test");
	if (!top)
		return 1;
	test_all();
	test_map_race();
	test_reopen_window();
	test_client_checks();
	return test_done("test-rnbd");
}
