/* SPDX-License-Identifier: MIT */
/*
 * The RNBD server's backing stores (lib/rnbd/rnbd-backend.c) against a
 * model: every engine (io_uring, threads) over a file, with and without
 * O_DIRECT, and the memory store, take rounds of concurrent requests on
 * disjoint slots (reads, writes with and without FUA and PREFLUSH, flushes,
 * discards, write zeroes with and without NOUNMAP, secure erase); each
 * read must return what the model holds, and at the end the file, read
 * through a descriptor of its own, must equal the model byte for byte;
 * and memory-store writes at every alignment read back equal.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "threads.h"
#include "rnbd-backend.h"
#include "rnbd-hooks.h"
#include "util.h"

#define DEV_SIZE (8u << 20)
#define SLOTS 64
#define SLOT (DEV_SIZE / SLOTS)  /* 128 KiB */
#define ROUNDS 40

struct waiter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned left;
};

struct req {
	struct rnbd_breq r;
	struct waiter *w;
	int err;
	int expect;            /* the errno this request must end with */
	uint8_t *check;        /* reads: what the model holds */
};

/* Until every request of w is done. */
static void waiter_wait(struct waiter *w)
{
	pthread_mutex_lock(&w->lock);
	while (w->left)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

static void req_done(struct rnbd_breq *br, int err)
{
	struct req *q = (struct req *)br;

	q->err = err;
	pthread_mutex_lock(&q->w->lock);
	if (--q->w->left == 0)
		pthread_cond_signal(&q->w->cond);
	pthread_mutex_unlock(&q->w->lock);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t below)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % below);
}

/* One store through ROUNDS rounds; model is the expected content. */
static void exercise(const char *what, struct rnbd_store *s, uint8_t *model, bool direct)
{
	const struct rnbd_store_info *in = rnbd_store_info(s);
	uint32_t unit = direct ? in->logical_block_size : 512;
	static struct req reqs[SLOTS];
	static uint8_t *bufs[SLOTS];
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
	unsigned counts[8] = { 0 }, bad = 0;

	CHECK_EQ(in->size, DEV_SIZE);
	for (unsigned i = 0; i < SLOTS; i++)
		if (!bufs[i] && posix_memalign((void **)&bufs[i], 4096, SLOT))
			abort();
	for (unsigned round = 0; round < ROUNDS; round++) {
		w.left = SLOTS;
		for (unsigned i = 0; i < SLOTS; i++) {
			struct req *q = &reqs[i];
			uint32_t blocks = SLOT / unit;
			uint32_t first = rnd(blocks), n = 1 + rnd(blocks - first);
			uint64_t off = (uint64_t)i * SLOT + (uint64_t)first * unit;
			uint32_t len = n * unit;
			unsigned kind = rnd(10);

			memset(q, 0, sizeof(*q));
			q->w = &w;
			q->r.done = req_done;
			q->r.offset = off;
			q->r.len = len;
			q->r.buf = bufs[i];
			switch (kind) {
			case 0: case 1: case 2:
				q->r.op = RNBD_OP_WRITE;
				q->r.flags = (kind == 1 ? RNBD_F_FUA : 0) |
					     (kind == 2 ? RNBD_F_PREFLUSH : 0);
				for (uint32_t b = 0; b < len; b++)
					bufs[i][b] = (uint8_t)rnd(256);
				memcpy(model + off, bufs[i], len);
				break;
			case 3: case 4: case 5:
				q->r.op = RNBD_OP_READ;
				q->check = model + off;
				memset(bufs[i], 0xee, len);
				break;
			case 6:
				q->r.op = RNBD_OP_FLUSH;
				q->r.offset = q->r.len = 0;
				q->r.flags = rnd(2) ? RNBD_F_PREFLUSH : 0;
				break;
			case 7:
				q->r.op = RNBD_OP_DISCARD;
				memset(model + off, 0, len);
				break;
			case 8:
				q->r.op = RNBD_OP_WRITE_ZEROES;
				q->r.flags = rnd(2) ? RNBD_F_NOUNMAP : 0;
				memset(model + off, 0, len);
				break;
			case 9:
				q->r.op = RNBD_OP_SECURE_ERASE;
				if (!in->secure_erase)
					q->expect = -EOPNOTSUPP; /* content stays */
				else
					memset(model + off, 0, len);
				break;
			}
			counts[q->r.op]++;
		}
		for (unsigned i = 0; i < SLOTS; i++)
			rnbd_store_submit(s, &reqs[i].r);
		waiter_wait(&w);
		for (unsigned i = 0; i < SLOTS; i++) {
			struct req *q = &reqs[i];

			if (q->err != q->expect) {
				bad++;
				CHECK(q->err == q->expect, "%s: %s at %llu+%u: %s", what,
				      rnbd_op_name(q->r.op), (unsigned long long)q->r.offset,
				      q->r.len, strerror(-q->err));
			}
			if (q->check && !q->err && memcmp(q->r.buf, q->check, q->r.len)) {
				bad++;
				CHECK(0, "%s: read at %llu+%u differs from the model", what,
				      (unsigned long long)q->r.offset, q->r.len);
			}
		}
	}
	CHECK(bad == 0, "%s: %u requests wrong", what, bad);
	for (unsigned op = 0; op <= RNBD_OP_WRITE_ZEROES; op++)
		CHECK(counts[op] > 20, "%s: only %u %s requests", what, counts[op],
		      rnbd_op_name((enum rnbd_io_op)op));

	/* Beyond the end, and (O_DIRECT) unaligned: refused before any IO. */
	w.left = 2;
	memset(reqs, 0, 2 * sizeof(reqs[0]));
	for (unsigned i = 0; i < 2; i++) {
		reqs[i].w = &w;
		reqs[i].r.done = req_done;
		reqs[i].r.op = RNBD_OP_READ;
		reqs[i].r.buf = bufs[i];
	}
	reqs[0].r.offset = DEV_SIZE - 512;
	reqs[0].r.len = 1024;
	reqs[1].r.offset = direct ? unit / 2 : DEV_SIZE;
	reqs[1].r.len = direct ? unit : 512;
	rnbd_store_submit(s, &reqs[0].r);
	rnbd_store_submit(s, &reqs[1].r);
	waiter_wait(&w);
	CHECK_EQ(reqs[0].err, -EINVAL);
	CHECK_EQ(reqs[1].err, -EINVAL);
	for (unsigned i = 0; i < SLOTS; i++) {
		free(bufs[i]);
		bufs[i] = NULL;
	}
}

/* The file's content through a descriptor of its own equals the model. */
static void check_file(const char *what, const char *path, const uint8_t *model)
{
	uint8_t *got = malloc(DEV_SIZE);
	int fd = open(path, O_RDONLY);
	ssize_t n = fd >= 0 ? pread(fd, got, DEV_SIZE, 0) : -1;

	CHECK_EQ(n, DEV_SIZE);
	CHECK(n == DEV_SIZE && !memcmp(got, model, DEV_SIZE), "%s: file equals the model", what);
	if (fd >= 0)
		close(fd);
	free(got);
}

static bool direct_untested; /* an O_DIRECT case could not run */

/*
 * inline_w: buffered writes done at once on the submitting thread where the
 * file system cannot write with RWF_NOWAIT (ext4, as /var/tmp here).
 */
static void test_file(enum rnbd_engine_kind kind, bool direct, bool inline_w)
{
	char path[] = "/var/tmp/rnbd-backend-test.XXXXXX", what[64];
	uint8_t *model = calloc(1, DEV_SIZE);
	struct rnbd_engine *e;
	struct rnbd_store *s;
	int fd, rc;

	fd = mkstemp(path);
	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, DEV_SIZE), 0);
	close(fd);
	rc = rnbd_engine_open(kind, 4, 64, &e);
	CHECK(rc == 0, "engine: %s", strerror(-rc));
	if (rc)
		goto out;
	rnbd_engine_set_inline_writes(e, inline_w);
	snprintf(what, sizeof(what), "%s%s%s", rnbd_engine_name(e), direct ? " O_DIRECT" : "",
		 inline_w ? " inline writes" : "");
	CHECK(!strcmp(rnbd_engine_name(e), kind == RNBD_ENGINE_THREADS ? "threads" : "io_uring"),
	      "%s", rnbd_engine_name(e));
	fd = open(path, O_RDWR | (direct ? O_DIRECT : 0));
	if (fd < 0 && direct) {
		printf("# %s: O_DIRECT not supported here (%s), not tested\n", what, strerror(errno));
		direct_untested = true;
		rnbd_engine_close(e);
		goto out;
	}
	CHECK_EQ(rnbd_store_fd(e, fd, direct, &s), 0);
	exercise(what, s, model, direct);
	rnbd_store_close(s);
	rnbd_engine_close(e);
	check_file(what, path, model);
out:
	unlink(path);
	free(model);
}

/* One request on the memory store, which completes it before returning. */
static int mem_io(struct rnbd_store *s, enum rnbd_io_op op, uint64_t off, void *buf, uint32_t len)
{
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1 };
	struct req q = { .w = &w, .err = 1 };

	q.r = (struct rnbd_breq){ .op = op, .offset = off, .len = len, .buf = buf,
				  .done = req_done };
	rnbd_store_submit(s, &q.r);
	CHECK_EQ(w.left, 0u);
	return q.err;
}

/*
 * Writes into the memory store at every alignment of device offset,
 * buffer and length: the aligned ones take non-temporal stores, the rest
 * a plain copy; each reads back equal, and the bytes around it stay.
 */
static void test_memory_alignments(void)
{
	static const uint32_t lens[] = { 1, 63, 64, 65, 512, 4032, 4096, 4100, 65536 };
	static const unsigned shifts[] = { 0, 1, 8, 16, 63, 64 };
	uint8_t *src = NULL, *back = NULL, *model = calloc(1, DEV_SIZE);
	struct rnbd_store *s;
	uint64_t off = 0;

	CHECK(model);
	CHECK_EQ(posix_memalign((void **)&src, 4096, 65536 + 128), 0);
	CHECK_EQ(posix_memalign((void **)&back, 4096, 65536 + 128), 0);
	CHECK_EQ(rnbd_store_memory(DEV_SIZE, &s), 0);
	for (size_t l = 0; l < ARRAY_SIZE(lens); l++)
		for (size_t b = 0; b < ARRAY_SIZE(shifts); b++)
			for (size_t d = 0; d < ARRAY_SIZE(shifts); d++) {
				uint32_t len = lens[l];
				uint64_t at = off + shifts[d];

				CHECK(at + len + 64 <= DEV_SIZE);
				for (uint32_t i = 0; i < len; i++)
					src[shifts[b] + i] = (uint8_t)rnd(256);
				CHECK_EQ(mem_io(s, RNBD_OP_WRITE, at, src + shifts[b], len), 0);
				memcpy(model + at, src + shifts[b], len);
				/* The range and a line either side of it. */
				at = at >= 64 ? at - 64 : 0;
				CHECK_EQ(mem_io(s, RNBD_OP_READ, at, back, len + 128), 0);
				CHECK(memcmp(back, model + at, len + 128) == 0);
				off += ((uint64_t)len + 64 + 4095) & ~4095ull;
			}
	rnbd_store_close(s);
	free(src);
	free(back);
	free(model);
}

static void test_memory(void)
{
	uint8_t *model = calloc(1, DEV_SIZE);
	struct rnbd_store *s;

	CHECK_EQ(rnbd_store_memory(DEV_SIZE, &s), 0);
	CHECK(rnbd_store_info(s)->secure_erase);
	exercise("memory", s, model, false);
	rnbd_store_close(s);
	CHECK_EQ(rnbd_store_memory(0, &s), -EINVAL);
	CHECK_EQ(rnbd_store_memory(1000, &s), -EINVAL);
	free(model);
}

static void test_not_a_store(void)
{
	struct rnbd_engine *e;
	struct rnbd_store *s;
	int fd = open("/var/tmp", O_RDONLY | O_DIRECTORY);

	CHECK_EQ(rnbd_engine_open(RNBD_ENGINE_THREADS, 1, 0, &e), 0);
	CHECK_EQ(rnbd_store_fd(e, fd, false, &s), -ENOTBLK);
	rnbd_engine_close(e);
}

/* Writes text to the loop device's sysfs queue attribute name; false if it cannot. */
static bool queue_set(const char *dev, const char *name, const char *text)
{
	char path[128];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "/sys/block/%s/queue/%s", strrchr(dev, '/') + 1, name);
	f = fopen(path, "w");
	if (!f)
		return false;
	ok = fputs(text, f) >= 0;
	return fclose(f) == 0 && ok;
}

/*
 * A loop device over a file (root, losetup): discard and write zeroes as
 * block ioctls, size and block sizes from the device; buffered and with
 * O_DIRECT, each engine. Buffered it has a write cache and FUA (the page
 * cache); direct, what its queue says in sysfs, as the kernel's
 * rnbd-server announces it: a loop device has a write cache ("write back")
 * and no FUA, and none once "write through" is written there.
 */
static int test_blockdev(void)
{
	char path[] = "/var/tmp/rnbd-backend-bdev.XXXXXX", cmd[256], dev[64] = "";
	uint8_t *model = calloc(1, DEV_SIZE);
	struct rnbd_engine *e;
	struct rnbd_store *s;
	FILE *p;
	int fd;

	if (geteuid() != 0 || system("command -v losetup >/dev/null 2>&1")) {
		fprintf(stderr, "SKIP: a loop device needs root and losetup\n");
		free(model);
		return 77;
	}
	fd = mkstemp(path);
	CHECK(fd >= 0 && ftruncate(fd, DEV_SIZE) == 0);
	close(fd);
	snprintf(cmd, sizeof(cmd), "losetup -f --show '%s'", path);
	p = popen(cmd, "r");
	if (!p || !fgets(dev, sizeof(dev), p))
		dev[0] = '\0';
	if (p)
		pclose(p);
	dev[strcspn(dev, "\n")] = '\0';
	CHECK(dev[0] == '/', "losetup gave a device: '%s'", dev);
	if (dev[0] == '/') {
		for (int k = 0; k < 6; k++) {
			enum rnbd_engine_kind kind = k % 2 ? RNBD_ENGINE_THREADS : RNBD_ENGINE_URING;
			bool direct = k >= 2, through = k >= 4;
			char what[96];

			int rc = rnbd_engine_open(kind, 4, 64, &e);

			CHECK(rc == 0, "engine: %s", strerror(-rc));
			if (rc)
				continue;
			CHECK(queue_set(dev, "write_cache", through ? "write through" : "write back"),
			      "%s: setting its write cache: %s", dev, strerror(errno));
			/* A failed step skips the rest, so the loop device is always detached. */
			fd = open(dev, O_RDWR | (direct ? O_DIRECT : 0));
			CHECK(fd >= 0, "%s: %s", dev, strerror(errno));
			rc = fd < 0 ? -EIO : rnbd_store_fd(e, fd, direct, &s);
			CHECK_EQ(rc, 0);
			if (!rc) {
				const struct rnbd_store_info *in = rnbd_store_info(s);

				CHECK(in->block_device);
				CHECK_EQ(in->logical_block_size, 512);
				CHECK_EQ(in->direct, direct);
				CHECK(in->write_cache == !through, "%s%s: write cache %d",
				      direct ? "direct" : "buffered", through ? ", write through" : "",
				      in->write_cache);
				CHECK(in->fua == !direct, "%s: FUA %d (a loop device has none)",
				      direct ? "direct" : "buffered", in->fua);
				snprintf(what, sizeof(what), "%s on %s%s%s", rnbd_engine_name(e), dev,
					 direct ? ", O_DIRECT" : "", through ? ", write through" : "");
				exercise(what, s, model, direct);
				rnbd_store_close(s);
			}
			rnbd_engine_close(e);
		}
		queue_set(dev, "write_cache", "write back");
		snprintf(cmd, sizeof(cmd), "losetup -d '%s'", dev);
		CHECK_EQ(system(cmd), 0);
		check_file("loop device's file", path, model);
	}
	unlink(path);
	free(model);
	return test_done("rnbd-backend-blockdev");
}

/* One request on store s, waited for; its error. */
static int sync_io(struct rnbd_store *s, enum rnbd_io_op op, uint64_t off, void *buf, uint32_t len)
{
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1 };
	struct req q = { .w = &w, .err = 1 };

	q.r = (struct rnbd_breq){ .op = op, .offset = off, .len = len, .buf = buf,
				  .done = req_done };
	rnbd_store_submit(s, &q.r);
	waiter_wait(&w);
	return q.err;
}

/*
 * The threads engine's pool: a thread starts with the work, ends after
 * 5 s without any (RNBD_POOL_IDLE_MS), and work after that starts one
 * again; closing the engine waits for the one running.
 */
static void test_pool_idle(void)
{
	char path[] = "/var/tmp/rnbd-backend-test.XXXXXX";
	static uint8_t buf[4096], back[4096];
	struct rnbd_engine *e;
	struct rnbd_store *s;
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, 1 << 20), 0);
	CHECK_EQ(rnbd_engine_open(RNBD_ENGINE_THREADS, 2, 0, &e), 0);
	CHECK_EQ(rnbd_store_fd(e, fd, false, &s), 0);
	memset(buf, 0x5a, sizeof(buf));
	CHECK_EQ(sync_io(s, RNBD_OP_FLUSH, 0, NULL, 0), 0);
	CHECK(threads_named("rnbd-pool") >= 1, "a pool thread runs after a request");
	usleep(5500 * 1000);
	CHECK_EQ(threads_left("rnbd-pool"), 0u);
	CHECK_EQ(sync_io(s, RNBD_OP_WRITE, 4096, buf, sizeof(buf)), 0);
	CHECK_EQ(sync_io(s, RNBD_OP_FLUSH, 0, NULL, 0), 0);
	CHECK(threads_named("rnbd-pool") >= 1, "work after the idle end starts one again");
	CHECK_EQ(pread(fd, back, sizeof(back), 4096), (ssize_t)sizeof(back));
	CHECK(!memcmp(back, buf, sizeof(buf)), "the write after the idle end landed");
	rnbd_store_close(s);
	rnbd_engine_close(e);
	CHECK_EQ(threads_left("rnbd-pool"), 0u);
	unlink(path);
}

struct flush_batch {
	struct rnbd_store *s;
	struct req *q;
	unsigned n;
	atomic_bool *release;
};

/*
 * Submits a batch of flushes, as a poll group's thread would, and stays
 * until released: io_uring's workers for what a thread submitted are
 * threads of their own, which go with it.
 */
static void *submit_flushes(void *arg)
{
	struct flush_batch *b = arg;

	for (unsigned i = 0; i < b->n; i++)
		rnbd_store_submit(b->s, &b->q[i].r);
	while (!atomic_load(b->release))
		usleep(1000);
	return NULL;
}

/*
 * The io_uring engine's flusher: 64 flushes submitted at once (from 4
 * threads, as by poll groups) while the
 * page cache holds 16 MiB to write all complete, with fewer fdatasync
 * calls than flushes (one covers those queued meanwhile) and no worker
 * thread of io_uring made for them (an fsync on the ring took up to 8 per
 * submitting thread); a FUA write to the page cache runs a flush after it,
 * and an empty FUA write is one; the flusher's thread ends when idle.
 */
static void test_flusher(void)
{
	enum { N = 64 };
	char path[] = "/var/tmp/rnbd-backend-test.XXXXXX";
	static uint8_t big[1 << 20], buf[4096], back[4096];
	static struct req q[N];
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, N };
	uint64_t flushes, syncs, flushes2, syncs2;
	struct rnbd_engine *e;
	struct rnbd_store *s;
	int fd = mkstemp(path);
	unsigned workers;

	CHECK(fd >= 0);
	CHECK_EQ(ftruncate(fd, 32 << 20), 0);
	CHECK_EQ(rnbd_engine_open(RNBD_ENGINE_URING, 2, 0, &e), 0);
	/* As rnbd-server has it: plain writes at once where RWF_NOWAIT cannot (ext4). */
	rnbd_engine_set_inline_writes(e, true);
	CHECK_EQ(rnbd_store_fd(e, fd, false, &s), 0);
	memset(big, 0xa5, sizeof(big));
	for (unsigned i = 0; i < 16; i++)
		CHECK_EQ(sync_io(s, RNBD_OP_WRITE, (uint64_t)i << 20, big, sizeof(big)), 0);
	workers = threads_named("iou-wrk");
	for (unsigned i = 0; i < N; i++) {
		q[i] = (struct req){ .w = &w, .err = 1 };
		q[i].r = (struct rnbd_breq){ .op = RNBD_OP_FLUSH, .done = req_done };
	}
	pthread_t thr[4];
	struct flush_batch fb[4];
	atomic_bool release = false;
	unsigned workers_after;

	for (unsigned i = 0; i < 4; i++) {
		fb[i] = (struct flush_batch){ .s = s, .q = &q[i * N / 4], .n = N / 4,
					      .release = &release };
		CHECK_EQ(pthread_create(&thr[i], NULL, submit_flushes, &fb[i]), 0);
	}
	waiter_wait(&w);
	workers_after = threads_named("iou-wrk");
	atomic_store(&release, true);
	for (unsigned i = 0; i < 4; i++)
		pthread_join(thr[i], NULL);
	for (unsigned i = 0; i < N; i++)
		CHECK_EQ(q[i].err, 0);
	rnbd_engine_flush_stats(e, &flushes, &syncs);
	CHECK_EQ(flushes, (uint64_t)N);
	CHECK(syncs >= 1 && syncs < flushes, "%" PRIu64 " fdatasync calls for %" PRIu64 " flushes",
	      syncs, flushes);
	CHECK(workers_after <= workers, "io_uring workers: %u after the flushes, %u before",
	      workers_after, workers);
	CHECK_EQ(threads_named("rnbd-flush"), 1u);
	memset(buf, 0x3c, sizeof(buf));
	struct waiter w1 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1 };

	q[0] = (struct req){ .w = &w1, .err = 1 };
	q[0].r = (struct rnbd_breq){ .op = RNBD_OP_WRITE, .flags = RNBD_F_FUA, .offset = 8192,
				     .len = sizeof(buf), .buf = buf, .done = req_done };
	rnbd_store_submit(s, &q[0].r);
	waiter_wait(&w1);
	CHECK_EQ(q[0].err, 0);
	rnbd_engine_flush_stats(e, &flushes2, &syncs2);
	CHECK_EQ(flushes2, flushes + 1); /* the FUA write's flush after it */
	CHECK_EQ(syncs2, syncs + 1);
	CHECK_EQ(pread(fd, back, sizeof(back), 8192), (ssize_t)sizeof(back));
	CHECK(!memcmp(back, buf, sizeof(buf)), "the FUA write landed");
	/* An empty write with FUA (no PREFLUSH): a flush, as the kernel sent them once. */
	struct waiter w2 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1 };
	uint64_t flushes3, syncs3;

	q[0] = (struct req){ .w = &w2, .err = 1 };
	q[0].r = (struct rnbd_breq){ .op = RNBD_OP_WRITE, .flags = RNBD_F_FUA, .offset = 0,
				     .len = 0, .buf = buf, .done = req_done };
	rnbd_store_submit(s, &q[0].r);
	waiter_wait(&w2);
	CHECK_EQ(q[0].err, 0);
	rnbd_engine_flush_stats(e, &flushes3, &syncs3);
	CHECK_EQ(flushes3, flushes2 + 1);
	CHECK_EQ(syncs3, syncs2 + 1);
	usleep(5500 * 1000);
	CHECK_EQ(threads_left("rnbd-flush"), 0u);
	CHECK_EQ(sync_io(s, RNBD_OP_FLUSH, 0, NULL, 0), 0); /* and one starts again */
	rnbd_store_close(s);
	rnbd_engine_close(e);
	CHECK_EQ(threads_left("rnbd-flush"), 0u);
	close(fd);
	unlink(path);
}

/* A sync of fd that fails once (a lost write-back: the kernel reports it to one sync only). */
static atomic_int eio_fd = -1;

static int sync_eio_once(void *priv, int fd)
{
	int want = fd;

	(void)priv;
	if (atomic_compare_exchange_strong(&eio_fd, &want, -1))
		return -EIO;
	return fdatasync(fd) ? -errno : 0;
}

/*
 * A store whose sync failed once fails every later flush with that error
 * (FLUSH, PREFLUSH, FUA): the kernel would have let the next fdatasync
 * succeed with the writes acknowledged before it lost. Another store is
 * not touched, and the store opened again starts clean. Both engines.
 */
static void test_sync_error(enum rnbd_engine_kind kind)
{
	char pa[] = "/var/tmp/rnbd-backend-test.XXXXXX", pb[] = "/var/tmp/rnbd-backend-test.XXXXXX";
	static uint8_t buf[4096];
	struct rnbd_engine *e;
	struct rnbd_store *a, *b;
	int fa = mkstemp(pa), fb = mkstemp(pb), da = dup(fa);

	CHECK(fa >= 0 && fb >= 0 && da >= 0);
	CHECK_EQ(ftruncate(fa, 1 << 20), 0);
	CHECK_EQ(ftruncate(fb, 1 << 20), 0);
	CHECK_EQ(rnbd_engine_open(kind, 2, 0, &e), 0);
	CHECK_EQ(rnbd_store_fd(e, da, false, &a), 0); /* a's own descriptor: the hook's mark */
	CHECK_EQ(rnbd_store_fd(e, fb, false, &b), 0);
	memset(buf, 0x5e, sizeof(buf));
	rnbd_store_set_sync_hook(sync_eio_once, NULL);
	CHECK_EQ(sync_io(a, RNBD_OP_WRITE, 0, buf, sizeof(buf)), 0); /* W1, in the page cache */
	atomic_store(&eio_fd, da);
	CHECK_EQ(sync_io(a, RNBD_OP_FLUSH, 0, NULL, 0), -EIO);
	CHECK_EQ(atomic_load(&eio_fd), -1); /* the failure was taken */
	CHECK_EQ(sync_io(a, RNBD_OP_FLUSH, 0, NULL, 0), -EIO);
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 2 };
	struct req q[2] = { { .w = &w, .err = 1 }, { .w = &w, .err = 1 } };

	q[0].r = (struct rnbd_breq){ .op = RNBD_OP_WRITE, .flags = RNBD_F_PREFLUSH, .offset = 4096,
				     .len = sizeof(buf), .buf = buf, .done = req_done };
	q[1].r = (struct rnbd_breq){ .op = RNBD_OP_WRITE, .flags = RNBD_F_FUA, .offset = 0,
				     .len = 0, .buf = buf, .done = req_done };
	rnbd_store_submit(a, &q[0].r);
	rnbd_store_submit(a, &q[1].r);
	waiter_wait(&w);
	CHECK_EQ(q[0].err, -EIO); /* its PREFLUSH */
	CHECK_EQ(q[1].err, -EIO); /* an empty FUA write: a flush */
	CHECK_EQ(sync_io(b, RNBD_OP_WRITE, 0, buf, sizeof(buf)), 0);
	CHECK_EQ(sync_io(b, RNBD_OP_FLUSH, 0, NULL, 0), 0);
	rnbd_store_close(a);
	CHECK_EQ(rnbd_store_fd(e, fa, false, &a), 0);
	CHECK_EQ(sync_io(a, RNBD_OP_FLUSH, 0, NULL, 0), 0);
	rnbd_store_set_sync_hook(NULL, NULL);
	rnbd_store_close(a);
	rnbd_store_close(b);
	rnbd_engine_close(e);
	unlink(pa);
	unlink(pb);
}

/* A store's fdatasync held, as a hung file system would hold it (rnbd_store_set_sync_hook). */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int fd;              /* the held store's */
	bool release;
	unsigned inside;     /* syncs of fd running now */
	unsigned most;       /* the most at once */
	unsigned calls;      /* syncs of fd in all */
} held = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, -1, false, 0, 0, 0 };

static int held_sync(void *priv, int fd)
{
	(void)priv;
	if (fd != held.fd)
		return fdatasync(fd) ? -errno : 0;
	pthread_mutex_lock(&held.lock);
	held.calls++;
	if (++held.inside > held.most)
		held.most = held.inside;
	pthread_cond_broadcast(&held.cond);
	while (!held.release)
		pthread_cond_wait(&held.cond, &held.lock);
	held.inside--;
	pthread_mutex_unlock(&held.lock);
	return fdatasync(fd) ? -errno : 0;
}

static bool waiter_within(struct waiter *w, unsigned ms)
{
	for (unsigned i = 0; i < ms; i++) {
		bool done;

		pthread_mutex_lock(&w->lock);
		done = !w->left;
		pthread_mutex_unlock(&w->lock);
		if (done)
			return true;
		usleep(1000);
	}
	return false;
}

/* Two stores A and B on 1 MiB files of their own, A's syncs held (held_sync). */
struct two {
	char pa[40], pb[40];
	int fa, fb;
	struct rnbd_engine *e;
	struct rnbd_store *a, *b;
};

static void two_open(struct two *t, enum rnbd_engine_kind kind)
{
	snprintf(t->pa, sizeof(t->pa), "/var/tmp/rnbd-backend-test.XXXXXX");
	snprintf(t->pb, sizeof(t->pb), "/var/tmp/rnbd-backend-test.XXXXXX");
	t->fa = mkstemp(t->pa);
	t->fb = mkstemp(t->pb);
	CHECK(t->fa >= 0 && t->fb >= 0);
	CHECK_EQ(ftruncate(t->fa, 1 << 20), 0);
	CHECK_EQ(ftruncate(t->fb, 1 << 20), 0);
	CHECK_EQ(rnbd_engine_open(kind, 2, 0, &t->e), 0);
	CHECK_EQ(rnbd_store_fd(t->e, t->fa, false, &t->a), 0);
	CHECK_EQ(rnbd_store_fd(t->e, t->fb, false, &t->b), 0);
	pthread_mutex_lock(&held.lock);
	held.fd = t->fa;
	held.release = false;
	held.inside = held.most = held.calls = 0;
	pthread_mutex_unlock(&held.lock);
	rnbd_store_set_sync_hook(held_sync, NULL);
}

/* Closes them; no thread named thread is left. */
static void two_close(struct two *t, const char *thread)
{
	rnbd_store_set_sync_hook(NULL, NULL);
	rnbd_store_close(t->a);
	rnbd_store_close(t->b);
	rnbd_engine_close(t->e);
	CHECK_EQ(threads_left(thread), 0u);
	close(t->fa);
	close(t->fb);
	unlink(t->pa);
	unlink(t->pb);
}

/*
 * One store's fdatasync that hangs holds its own flushes and no other
 * store's: B's flushes complete while A's sync is held; A's flushes
 * queued meanwhile wait for it (one fdatasync of a store at a time) and
 * are covered by one more once it ends. (One flusher for all stores
 * made every tenant's flushes wait behind one slow file system.)
 */
static void test_flush_isolation(void)
{
	struct waiter wa = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1 };
	struct waiter wa2 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 3 };
	struct waiter wb = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 8 };
	static struct req qa[4], qb[8];
	static struct two t;
	struct rnbd_store *a, *b;

	two_open(&t, RNBD_ENGINE_URING);
	a = t.a;
	b = t.b;

	qa[0] = (struct req){ .w = &wa, .err = 1 };
	qa[0].r = (struct rnbd_breq){ .op = RNBD_OP_FLUSH, .done = req_done };
	rnbd_store_submit(a, &qa[0].r);
	pthread_mutex_lock(&held.lock);
	while (!held.inside)
		pthread_cond_wait(&held.cond, &held.lock);
	pthread_mutex_unlock(&held.lock);
	/* A hangs; more of A's flushes come, and B's. */
	for (unsigned i = 1; i < 4; i++) {
		qa[i] = (struct req){ .w = &wa2, .err = 1 };
		qa[i].r = (struct rnbd_breq){ .op = RNBD_OP_FLUSH, .done = req_done };
		rnbd_store_submit(a, &qa[i].r);
	}
	for (unsigned i = 0; i < 8; i++) {
		qb[i] = (struct req){ .w = &wb, .err = 1 };
		qb[i].r = (struct rnbd_breq){ .op = RNBD_OP_FLUSH, .done = req_done };
		rnbd_store_submit(b, &qb[i].r);
	}
	CHECK(waiter_within(&wb, 5000), "B's flushes waited behind A's hung fdatasync");
	for (unsigned i = 0; i < 8; i++)
		CHECK_EQ(qb[i].err, 0);
	CHECK(!waiter_within(&wa, 100), "A's flush completed while its fdatasync hung");
	CHECK(!waiter_within(&wa2, 1), "A's later flushes completed while its fdatasync hung");
	pthread_mutex_lock(&held.lock);
	CHECK_EQ(held.inside, 1u); /* no second fdatasync of A beside the hung one */
	held.release = true;
	pthread_cond_broadcast(&held.cond);
	pthread_mutex_unlock(&held.lock);
	CHECK(waiter_within(&wa, 5000) && waiter_within(&wa2, 5000), "A's flushes once released");
	for (unsigned i = 0; i < 4; i++)
		CHECK_EQ(qa[i].err, 0);
	pthread_mutex_lock(&held.lock);
	CHECK_EQ(held.most, 1u);
	CHECK_EQ(held.calls, 2u); /* the hung one, then one for the three queued behind it */
	pthread_mutex_unlock(&held.lock);
	two_close(&t, "rnbd-flush");
}

/*
 * The pool when every thread hangs on one store, with more of its requests
 * queued than the pool has threads: requests for another store get a
 * thread more once no request was taken for a second, and that thread
 * takes them, not the next of the hung store's (a store holds at most the
 * pool's nthreads); those of the hung store complete when it comes back.
 */
#define STUCK_A 12
static void test_pool_stuck(void)
{
	struct waiter wa = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, STUCK_A };
	struct waiter wb = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 2 };
	static uint8_t buf[2][4096], back[4096];
	static struct req qa[STUCK_A], qb[2];
	static struct two t;
	struct rnbd_store *a, *b;
	int fb;

	two_open(&t, RNBD_ENGINE_THREADS);
	a = t.a;
	b = t.b;
	fb = t.fb;
	for (unsigned i = 0; i < STUCK_A; i++) {
		qa[i] = (struct req){ .w = &wa, .err = 1 };
		qa[i].r = (struct rnbd_breq){ .op = RNBD_OP_FLUSH, .done = req_done };
		rnbd_store_submit(a, &qa[i].r);
	}
	pthread_mutex_lock(&held.lock);
	while (held.inside < 2)
		pthread_cond_wait(&held.cond, &held.lock);
	pthread_mutex_unlock(&held.lock);
	/* Both threads hang on A; B's first write waits, its second comes after a second. */
	for (unsigned i = 0; i < 2; i++) {
		memset(buf[i], 0x40 + (int)i, sizeof(buf[i]));
		qb[i] = (struct req){ .w = &wb, .err = 1 };
		qb[i].r = (struct rnbd_breq){ .op = RNBD_OP_WRITE, .offset = (uint64_t)i << 12,
					      .len = sizeof(buf[i]), .buf = buf[i], .done = req_done };
		rnbd_store_submit(b, &qb[i].r);
		if (!i)
			usleep(1200 * 1000);
	}
	CHECK(waiter_within(&wb, 5000), "B's writes waited behind a pool hung on A");
	for (unsigned i = 0; i < 2; i++) {
		CHECK_EQ(qb[i].err, 0);
		CHECK_EQ(pread(fb, back, sizeof(back), (off_t)i << 12), (ssize_t)sizeof(back));
		CHECK(!memcmp(back, buf[i], sizeof(back)), "B's write %u landed", i);
	}
	CHECK(!waiter_within(&wa, 1), "A's flushes completed while hung");
	pthread_mutex_lock(&held.lock);
	CHECK(held.inside == 2, "%u of A's flushes hang in the pool, not more than its 2 threads",
	      held.inside);
	held.release = true;
	pthread_cond_broadcast(&held.cond);
	pthread_mutex_unlock(&held.lock);
	CHECK(waiter_within(&wa, 5000), "A's flushes once released");
	two_close(&t, "rnbd-pool");
}

int main(int argc, char **argv)
{
	int rc;

	if (argc > 1 && !strcmp(argv[1], "--blockdev"))
		return test_blockdev();
	test_flush_isolation();
	test_pool_stuck();
	test_file(RNBD_ENGINE_URING, false, false);
	test_file(RNBD_ENGINE_URING, false, true);
	test_file(RNBD_ENGINE_THREADS, false, true);
	test_file(RNBD_ENGINE_URING, true, false);
	test_file(RNBD_ENGINE_THREADS, false, false);
	test_file(RNBD_ENGINE_THREADS, true, false);
	test_memory();
	test_not_a_store();
	test_memory_alignments();
	test_pool_idle();
	test_flusher();
	test_sync_error(RNBD_ENGINE_URING);
	test_sync_error(RNBD_ENGINE_THREADS);
	/* A kernel before 5.11: liburing would time the reaper's wait with a request of its own. */
	rnbd_engine_set_features_mask(IORING_FEAT_EXT_ARG);
	test_file(RNBD_ENGINE_URING, false, false);
	test_file(RNBD_ENGINE_URING, true, false);
	rnbd_engine_set_features_mask(0);
	rc = test_done("rnbd-backend");
	if (!rc && direct_untested) {
		fprintf(stderr, "SKIP: O_DIRECT is not supported where the test files are\n");
		return 77; /* passed, but not all of it ran (CI counts a skip as a failure) */
	}
	return rc;
}
