/* SPDX-License-Identifier: MIT */
/*
 * librnbd's client against its server, in one process over tcp on
 * 127.0.0.1: mapping, IO of every kind larger than one transport request
 * (checked byte for byte, also in the exported file), the sharing rules as
 * a client sees them, read-only mappings, unmap and force-close, and a
 * server restart under a mapped device: IO issued during the outage waits,
 * the device is opened again, and the data is all there; and the
 * asynchronous API with more IO in flight than the session has slots (every
 * done called once, the bytes read back, refusals returned, -EDEADLK for a
 * synchronous call from a callback).
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
#include "rnbd-hooks.h"
#include "rnbd.h"

#define DISK_SIZE (16u << 20)
#define BIG (1u << 20)           /* larger than one request: split */

static const char *top; /* test_tmpdir */
static char disk[600];
static struct rnbd_srv *srv;
static int port;

static void srv_start(int want_port)
{
	struct rnbd_srv_opts o;

	rnbd_srv_opts_init(&o, sizeof(o));
	o.addr = test_addr();
	o.provider = test_provider();
	o.port = (uint16_t)want_port;
	o.dev_search_path = top;
	o.queue_depth = 32;
	o.hb_interval_ms = 100;
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
	o.fast_io_fail_ms = 10000;
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
struct storm {
	struct rnbd_clt_dev *dev;
	unsigned slot, rounds, done;
	int rc;
};

static void *storm_io(void *arg)
{
	struct storm *st = arg;
	uint8_t *w = malloc(65536), *r = malloc(65536);
	uint64_t off = (uint64_t)(2 + st->slot) << 20;

	test_fill(w, 65536, 100 + st->slot);
	for (unsigned i = 0; i < st->rounds; __atomic_store_n(&st->done, ++i, __ATOMIC_RELAXED)) {
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
	srv_start(port);
	aio_wait(in.queue_depth);
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

	/* Force-close on the server: IO fails with -ENOTCONN; unmap still works. */
	CHECK_EQ(rnbd_clt_map(s2, "disk", RNBD_CLT_RO, &d2), 0);
	CHECK_EQ(rnbd_srv_force_close(srv, "c2", "disk"), 0);
	CHECK_EQ(rnbd_clt_io(d2, RNBD_CLT_READ, 0, 0, b, 4096), -ENOTCONN);
	CHECK_EQ(rnbd_clt_remap(d2), -EALREADY);
	CHECK_EQ(rnbd_clt_unmap(d2, false), 0);

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

		for (int i = 0; i < 6; i++) {
			st[i] = (struct storm){ .dev = d1, .slot = (unsigned)i, .rounds = 300 };
			CHECK_EQ(pthread_create(&ths[i], NULL, storm_io, &st[i]), 0);
		}
		usleep(100 * 1000);
		{
			unsigned busy = 0;

			for (int i = 0; i < 6; i++)
				busy += __atomic_load_n(&st[i].done, __ATOMIC_RELAXED) < st[i].rounds;
			CHECK(busy > 0, "IO still running when the server stops (%u threads)", busy);
		}
		rnbd_srv_close(srv); /* returns only when every IO in flight was answered */
		usleep(200 * 1000);
		srv_start(port);
		for (int i = 0; i < 6; i++) {
			pthread_join(ths[i], NULL);
			CHECK(st[i].rc == 0, "IO thread %d: %s after %u rounds", i,
			      strerror(-st[i].rc), st[i].done);
			CHECK(st[i].done == st[i].rounds);
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
		int fd;

		snprintf(path, sizeof(path), "%s/race-%s", top, names[i]);
		fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
		CHECK(fd >= 0 && ftruncate(fd, DISK_SIZE) == 0);
		test_fill(w, 65536, 300 + i);
		CHECK(pwrite(fd, w, 65536, 0) == 65536);
		close(fd);
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

int main(void)
{
	top = test_tmpdir(NULL, "rnbd-test");
	if (!top)
		return 1;
	test_all();
	test_map_race();
	return test_done("test-rnbd");
}
