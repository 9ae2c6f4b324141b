/* SPDX-License-Identifier: MIT */
/*
 * The RNBD server's IO path allocates nothing: every allocation of the
 * code linked into this program (librnbd, its backing stores, the common
 * code, this test) goes through a counting wrapper (-Wl,--wrap, see
 * meson.build: no LD_PRELOAD, and it works under the sanitizers, whose
 * allocator the wrappers call). RTRS clients in this process (librtrs is a
 * shared library, outside the count) write and read back 4 KiB blocks at
 * queue depth 16 on a memory device and on a file, with a flush in every
 * round, through the thread pool engine and through io_uring; after a
 * warm-up, thousands of IOs must add no allocation at all. A new session
 * then must count (its slots are allocated once, there): that shows the
 * wrappers see the server's allocations.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "rnbd-proto.h"
#include "rnbd-raw.h"
#include "rnbd.h"
#include "rtrs.h"

/* ---- counting allocator ------------------------------------------------------ */

static atomic_ulong n_allocs;

/* __wrap_NAME counts, then calls the real NAME (__real_NAME, resolved by the linker). */
#define COUNTED(ret, name, params, args)                                       \
	ret __real_##name params;                                              \
	ret __wrap_##name params;                                              \
	ret __wrap_##name params                                               \
	{                                                                      \
		atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed); \
		return __real_##name args;                                     \
	}

COUNTED(void *, malloc, (size_t size), (size))
COUNTED(void *, calloc, (size_t n, size_t size), (n, size))
COUNTED(void *, realloc, (void *p, size_t size), (p, size))
COUNTED(void *, reallocarray, (void *p, size_t n, size_t size), (p, n, size))
COUNTED(void *, aligned_alloc, (size_t align, size_t size), (align, size))
COUNTED(int, posix_memalign, (void **out, size_t align, size_t size), (out, align, size))
COUNTED(char *, strdup, (const char *s), (s))
COUNTED(char *, strndup, (const char *s, size_t n), (s, n))

static unsigned long allocs(void)
{
	return atomic_load(&n_allocs);
}

/* ---- IO at a queue depth -------------------------------------------------------- */

#define QD 16
#define BS 4096u
#define DISK_SIZE (1u << 20)
#define BLOCKS (DISK_SIZE / BS)

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned done;
	int err;
} batch = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };

static void io_conf(void *priv, int err)
{
	(void)priv;
	pthread_mutex_lock(&batch.lock);
	batch.done++;
	if (err && !batch.err)
		batch.err = err;
	pthread_cond_broadcast(&batch.cond);
	pthread_mutex_unlock(&batch.lock);
}

static struct {
	struct rnbd_msg_io msg;
	struct rtrs_permit *permit;
	uint8_t buf[BS] __attribute__((aligned(4096)));
	uint8_t want[BS];
} slots[QD];

/* Two IO connections: requests complete on two threads. */
static struct rtrs_clt_sess *sess_open(const char *name, int port)
{
	struct rtrs_clt_sess *s;
	struct test_rnbd_clt c;
	int rc;

	test_rnbd_clt_init(&c, name, port);
	c.o.nr_io_cons = 2;
	rc = test_rnbd_clt_open(&c, &s);
	CHECK(rc == 0, "session %s: %s", name, strerror(-rc));
	return s;
}

static int dev_open(struct rtrs_clt_sess *s, const char *name)
{
	int id = test_rnbd_dev_open(s, name, RNBD_ACCESS_RW, NULL);

	CHECK(id >= 0, "OPEN %s: %s", name, strerror(-id));
	return id;
}

/*
 * One round: QD requests in flight at once, then waited for. Even rounds
 * write a pattern to each slot's block (even slots on the memory device,
 * odd ones on the file); odd rounds read the same blocks back and compare.
 * The last slot flushes the file instead. Returns the IOs that failed or
 * read wrong.
 */
static unsigned round_run(struct rtrs_clt_sess *s, const uint32_t dev[2], unsigned round)
{
	struct rtrs_clt_req_ops ops = { .conf = io_conf };
	bool writing = round % 2 == 0;
	unsigned sent = 0, bad = 0;

	batch.done = 0;
	batch.err = 0;
	for (unsigned i = 0; i < QD; i++) {
		unsigned block = ((round / 2) * QD + i) % BLOCKS;
		struct rnbd_io io = { .device_id = dev[i % 2], .sector = block * (BS >> 9),
				      .op = writing ? RNBD_OP_WRITE : RNBD_OP_READ, .bi_size = BS };
		struct iovec u = { &slots[i].msg, sizeof(slots[i].msg) };
		struct iovec d = { slots[i].buf, BS };
		int rc;

		if (i == QD - 1)
			io = (struct rnbd_io){ .device_id = dev[1], .op = RNBD_OP_FLUSH };
		if (writing) {
			test_fill(slots[i].want, BS, round * QD + i);
			memcpy(slots[i].buf, slots[i].want, BS);
		} else {
			memset(slots[i].buf, 0, BS);
		}
		rnbd_io_encode(&slots[i].msg, &io);
		slots[i].permit = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
		if (!slots[i].permit) {
			bad++;
			continue;
		}
		rc = rtrs_clt_request(s, io.op == RNBD_OP_READ ? RTRS_READ : RTRS_WRITE, &ops,
				      slots[i].permit, &u, 1, &d, io.op == RNBD_OP_FLUSH ? 0 : 1);
		if (rc) {
			bad++;
			rtrs_clt_put_permit(s, slots[i].permit);
			slots[i].permit = NULL;
			continue;
		}
		sent++;
	}
	pthread_mutex_lock(&batch.lock);
	while (batch.done < sent)
		pthread_cond_wait(&batch.cond, &batch.lock);
	pthread_mutex_unlock(&batch.lock);
	if (batch.err)
		bad++;
	for (unsigned i = 0; i < QD; i++) {
		if (slots[i].permit)
			rtrs_clt_put_permit(s, slots[i].permit);
		slots[i].permit = NULL;
		if (!writing && i != QD - 1 && memcmp(slots[i].buf, slots[i].want, BS))
			bad++;
	}
	return bad;
}

static void run_engine(const char *top, const char *engine)
{
	struct rtrs_clt_sess *s, *s2;
	unsigned long before, after, bad = 0;
	const unsigned rounds = 200;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv;
	uint32_t dev[2];
	int port, id;

	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.dev_search_path = top;
	o.mem_devices = "mem0:1M";
	o.engine = engine;
	o.rtrs.queue_depth = 32;
	if (rnbd_srv_open(&o, &srv)) {
		fprintf(stderr, "test-rnbd-alloc: no %s engine here, not checked\n", engine);
		return;
	}
	port = rnbd_srv_port(srv, 5000);
	CHECK(port > 0, "port %d", port);
	s = sess_open("alloc", port);
	if (!s)
		goto out;
	id = dev_open(s, "mem0");
	dev[0] = (uint32_t)id;
	id = dev_open(s, "disk");
	dev[1] = (uint32_t)id;
	if (id < 0)
		goto out;

	/* Warm-up: every slot of the session has seen IO of each kind. */
	for (unsigned r = 0; r < 8; r++)
		bad += round_run(s, dev, r);
	before = allocs();
	for (unsigned r = 8; r < 8 + rounds; r++)
		bad += round_run(s, dev, r);
	after = allocs();
	CHECK_EQ(bad, 0);
	CHECK(after == before, "%s engine: %lu allocations in %u IOs (%.2f per IO)", engine,
	      after - before, rounds * QD, (double)(after - before) / (rounds * QD));
	printf("%s engine: %lu allocations in %u IOs after the warm-up\n", engine, after - before,
	       rounds * QD);

	/* The wrappers see the server: a new session allocates (itself, and its slots). */
	before = allocs();
	s2 = sess_open("alloc2", port);
	after = allocs();
	CHECK(after > before, "a new session: %lu allocations counted", after - before);
	if (s2)
		rtrs_clt_close(s2);
out:
	if (s)
		rtrs_clt_close(s);
	rnbd_srv_close(srv);
}

int main(void)
{
	const char *top = test_tmpdir(NULL, "rnbd-alloc-test");
	char path[256];
	int fd;

	if (!top)
		return 1;
	snprintf(path, sizeof(path), "%s/disk", top);
	fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
	CHECK(fd >= 0 && ftruncate(fd, DISK_SIZE) == 0, "%s", path);
	if (fd >= 0)
		close(fd);
	rnbd_set_log_level(1);
	run_engine(top, "threads");
	run_engine(top, "io_uring");
	return test_done("test-rnbd-alloc");
}
