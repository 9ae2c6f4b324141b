/* SPDX-License-Identifier: MIT */
/*
 * The RNBD server (lib/rnbd/rnbd-srv.c) against RTRS clients that speak
 * RNBD by hand: the session handshake, IO of every kind on a file checked
 * byte for byte (also through the file itself), the sharing rules across
 * sessions (second rw refused, ro allowed, migration allows two writers),
 * read-only devices refusing writes, device names that try to leave the
 * search path, force-close (IO then fails with -ENOTCONN; IO held by a
 * rate limit is answered so), and a memory device; and a backing file
 * whose IO hangs, which holds its own device and nothing else of the
 * server.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "logcap.h"
#include "rnbd-backend.h"
#include "rnbd-hooks.h"
#include "rnbd-proto.h"
#include "rnbd-raw.h"
#include "rnbd.h"
#include "rtrs.h"
#include "util.h"

#define DISK_SIZE (4u << 20)

static const char *top; /* test_tmpdir */
static int port;

static unsigned clt_hb_ms; /* 0: the default */

static struct rtrs_clt_sess *sess_open(const char *name)
{
	struct rtrs_clt_sess *s;
	struct test_rnbd_clt c;
	int rc;

	test_rnbd_clt_init(&c, name, port);
	if (clt_hb_ms)
		c.o.hb_interval_ms = clt_hb_ms;
	rc = test_rnbd_clt_open(&c, &s);
	CHECK(rc == 0, "session %s: %s", name, strerror(-rc));
	return s;
}

/* OPEN; the device id, or a negative errno. */
static int dev_open(struct rtrs_clt_sess *s, const char *name, enum rnbd_access_mode mode,
		    struct rnbd_open_rsp *out)
{
	return test_rnbd_dev_open(s, name, mode, out);
}

static int dev_close(struct rtrs_clt_sess *s, uint32_t id)
{
	struct rnbd_msg_close m;

	rnbd_close_encode(&m, id);
	return test_request(s, RTRS_WRITE, &m, sizeof(m), NULL, 0);
}

static int io(struct rtrs_clt_sess *s, uint32_t id, enum rnbd_io_op op, uint32_t flags,
	      uint64_t off, void *buf, uint32_t len)
{
	struct rnbd_io i = { .device_id = id, .sector = off >> 9, .op = op, .flags = flags,
			     .bi_size = len };
	struct rnbd_msg_io m;
	bool data = op == RNBD_OP_READ || op == RNBD_OP_WRITE;

	rnbd_io_encode(&m, &i);
	return test_request(s, op == RNBD_OP_READ ? RTRS_READ : RTRS_WRITE, &m, sizeof(m),
		   data ? buf : NULL, data ? len : 0);
}

static void mkfile(const char *path, size_t size)
{
	int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);

	CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0, "%s", path);
	if (fd >= 0)
		close(fd);
}

static void test_all(void)
{
	static uint8_t a[256 << 10], b[256 << 10], zero[256 << 10];
	char path[512], disk[512], search[512];
	struct rtrs_clt_sess *s1, *s2, *s3, *s4;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv;
	struct rnbd_open_rsp r;
	int id, id2, id3, rc;

	/* top/<session>/disk: one file, hard-linked into every session's directory. */
	for (int i = 1; i <= 4; i++) {
		snprintf(path, sizeof(path), "%s/s%d", top, i);
		CHECK_EQ(mkdir(path, 0700), 0);
	}
	snprintf(disk, sizeof(disk), "%s/s1/disk", top);
	mkfile(disk, DISK_SIZE);
	for (int i = 2; i <= 4; i++) {
		snprintf(path, sizeof(path), "%s/s%d/disk", top, i);
		CHECK_EQ(link(disk, path), 0);
	}
	snprintf(path, sizeof(path), "%s/s1/out", top);
	CHECK_EQ(symlink("../s2/disk", path), 0);
	snprintf(path, sizeof(path), "%s/outside", top);
	mkfile(path, 4096);
	snprintf(path, sizeof(path), "%s/s1/fifo", top);
	CHECK_EQ(mkfifo(path, 0600), 0);

	rnbd_srv_opts_init(&o, sizeof(o));
	snprintf(search, sizeof(search), "%s/%%SESSNAME%%", top);
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.dev_search_path = search;
	o.mem_devices = "mem0:16M";
	o.rtrs.queue_depth = 32;
	o.rtrs.max_chunk_size = 512 << 10;
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	CHECK(port > 0, "port %d", port);

	s1 = sess_open("s1");
	s2 = sess_open("s2");
	s3 = sess_open("s3");
	s4 = sess_open("s4");
	if (!s1 || !s2 || !s3 || !s4)
		goto out;

	/* IO of every kind on a file. */
	id = dev_open(s1, "disk", RNBD_ACCESS_RW, &r);
	CHECK_EQ(id, 0);
	CHECK_EQ(r.nsectors, DISK_SIZE / 512);
	CHECK_EQ(r.logical_block_size, 512);
	CHECK(r.max_discard_sectors > 0 && r.max_write_zeroes_sectors > 0);
	CHECK(r.cache_policy == (RNBD_WRITEBACK | RNBD_FUA));
	test_fill(a, sizeof(a), 1);
	CHECK_EQ(io(s1, id, RNBD_OP_WRITE, 0, 8192, a, sizeof(a)), 0);
	CHECK_EQ(io(s1, id, RNBD_OP_READ, 0, 8192, b, sizeof(b)), 0);
	CHECK(!memcmp(a, b, sizeof(a)), "read back what was written");
	CHECK(test_file_has(disk, 8192, a, sizeof(a)), "the file holds it");
	test_fill(a, 4096, 2);
	CHECK_EQ(io(s1, id, RNBD_OP_WRITE, RNBD_F_FUA | RNBD_F_PREFLUSH, 0, a, 4096), 0);
	CHECK(test_file_has(disk, 0, a, 4096), "FUA write in the file");
	CHECK_EQ(io(s1, id, RNBD_OP_FLUSH, 0, 0, NULL, 0), 0);
	CHECK_EQ(io(s1, id, RNBD_OP_WRITE, RNBD_F_PREFLUSH, 0, NULL, 0), 0); /* empty: a flush */
	CHECK_EQ(io(s1, id, RNBD_OP_DISCARD, 0, 8192, NULL, 65536), 0);
	CHECK_EQ(io(s1, id, RNBD_OP_WRITE_ZEROES, RNBD_F_NOUNMAP, 8192 + 65536, NULL, 65536), 0);
	CHECK_EQ(io(s1, id, RNBD_OP_READ, 0, 8192, b, 131072), 0);
	CHECK(!memcmp(b, zero, 131072), "discarded and zeroed ranges read as zeros");
	CHECK(test_file_has(disk, 8192 + 131072, (test_fill(a, sizeof(a), 1), a + 131072), 65536),
	      "the rest stayed");
	CHECK_EQ(io(s1, id, RNBD_OP_SECURE_ERASE, 0, 0, NULL, 4096), -EOPNOTSUPP);
	/* Beyond the end; a device that is not open. */
	CHECK_EQ(io(s1, id, RNBD_OP_READ, 0, DISK_SIZE - 4096, b, 8192), -EINVAL);
	CHECK_EQ(io(s1, 7, RNBD_OP_READ, 0, 0, b, 4096), -ENOTCONN);
	/* Opening the same name again gives the same device. */
	CHECK_EQ(dev_open(s1, "/disk", RNBD_ACCESS_RW, NULL), 0);

	/* Sharing: a second writer refused, readers allowed, migration adds one. */
	CHECK_EQ(dev_open(s2, "disk", RNBD_ACCESS_RW, NULL), -EPERM);
	id2 = dev_open(s2, "disk", RNBD_ACCESS_RO, NULL);
	CHECK_EQ(id2, 0);
	CHECK_EQ(io(s2, id2, RNBD_OP_READ, 0, 0, b, 4096), 0);
	test_fill(a, 4096, 2);
	CHECK(!memcmp(a, b, 4096), "the reader sees the writer's data");
	CHECK_EQ(io(s2, id2, RNBD_OP_WRITE, 0, 0, a, 4096), -EROFS);
	id3 = dev_open(s3, "disk", RNBD_ACCESS_MIGRATION, NULL);
	CHECK_EQ(id3, 0);
	CHECK_EQ(dev_open(s4, "disk", RNBD_ACCESS_MIGRATION, NULL), -EPERM);
	CHECK_EQ(io(s3, id3, RNBD_OP_WRITE, 0, 4096, a, 4096), 0);

	/* Names that try to leave the search path. */
	CHECK_EQ(dev_open(s1, "../s2/disk", RNBD_ACCESS_RO, NULL), -EINVAL);
	CHECK_EQ(dev_open(s1, "out", RNBD_ACCESS_RO, NULL), -EACCES);
	CHECK_EQ(dev_open(s1, "../outside", RNBD_ACCESS_RO, NULL), -EINVAL);
	CHECK_EQ(dev_open(s1, "missing", RNBD_ACCESS_RO, NULL), -ENOENT);
	/* A FIFO is refused at once (opening it must not wait for a writer). */
	CHECK_EQ(dev_open(s1, "fifo", RNBD_ACCESS_RO, NULL), -ENOTBLK);
	CHECK_EQ(dev_open(s1, "fifo", RNBD_ACCESS_RW, NULL), -ENOTBLK);

	/* Force-close: IO fails with -ENOTCONN; the id stays until the client closes. */
	CHECK_EQ(rnbd_srv_force_close(srv, "s1", "//disk"), 0); /* any spelling */
	CHECK_EQ(rnbd_srv_force_close(srv, "s1", "disk"), -ENOENT);
	CHECK_EQ(io(s1, id, RNBD_OP_READ, 0, 0, b, 4096), -ENOTCONN);
	CHECK_EQ(dev_open(s1, "disk", RNBD_ACCESS_RW, NULL), -EPERM); /* s3 still writes */
	CHECK_EQ(dev_close(s3, (uint32_t)id3), 0);
	CHECK_EQ(dev_close(s3, (uint32_t)id3), -ENOENT);
	rc = dev_open(s1, "disk", RNBD_ACCESS_RW, NULL);
	CHECK_EQ(rc, 1); /* id 0 is still the force-closed one */
	CHECK_EQ(dev_close(s1, 0), 0);
	CHECK_EQ(dev_close(s1, 1), 0);

	/* A memory device, shared by name. */
	id = dev_open(s1, "mem0", RNBD_ACCESS_RW, &r);
	CHECK_EQ(id, 0);
	CHECK_EQ(r.nsectors, (16u << 20) / 512);
	test_fill(a, sizeof(a), 3);
	CHECK_EQ(io(s1, id, RNBD_OP_WRITE, 0, 1 << 20, a, sizeof(a)), 0);
	id2 = dev_open(s4, "mem0", RNBD_ACCESS_RO, NULL);
	CHECK(id2 >= 0);
	CHECK_EQ(io(s4, (uint32_t)id2, RNBD_OP_READ, 0, 1 << 20, b, sizeof(b)), 0);
	CHECK(!memcmp(a, b, sizeof(a)), "memory device: another session reads it back");
	CHECK_EQ(io(s1, id, RNBD_OP_SECURE_ERASE, 0, 1 << 20, NULL, 4096), 0);
	CHECK_EQ(io(s4, (uint32_t)id2, RNBD_OP_READ, 0, 1 << 20, b, 4096), 0);
	CHECK(!memcmp(b, zero, 4096), "erased");

out:
	/* Sessions go with devices still open: the server closes them. */
	for (struct rtrs_clt_sess **s = (struct rtrs_clt_sess *[]){ s1, s2, s3, s4 }, **e = s + 4;
	     s < e; s++)
		if (*s)
			rtrs_clt_close(*s);
	rnbd_srv_close(srv);
}

/*
 * Nothing is exported that was not asked for: by default there is no search
 * path, a server with nothing to export does not start (nor does the
 * daemon), and one with memory devices only opens no file, whatever the
 * name (a name is always below the search path; "/etc/passwd" is
 * "etc/passwd"), with a log line naming the session and the device.
 */
static void test_defaults(void)
{
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv = NULL;
	struct rtrs_clt_sess *s;
	const char *daemon = getenv("RNBD_SERVER");
	char cmd[1200], out[4096];
	size_t n = 0;
	FILE *f;
	int st;

	rnbd_set_log_fn(log_sink, NULL);
	rnbd_srv_opts_init(&o, sizeof(o));
	CHECK(o.dev_search_path == NULL, "default search path %s", o.dev_search_path);
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	CHECK_EQ(rnbd_srv_open(&o, &srv), -EINVAL);
	CHECK(log_has("nothing to export"), "%s", log_text());
	o.dev_search_path = "relative/dir";
	CHECK_EQ(rnbd_srv_open(&o, &srv), -EINVAL);

	o.dev_search_path = NULL;
	o.mem_devices = "mem0:1M";
	{
		/* Two specs for one name (a device written two ways): refused, not the last kept. */
		static const char *const twice[] = { "device:vm/a:iops=5", "device:/vm//a/:bps=1M",
						     NULL };

		o.qos = twice;
		log_clear();
		CHECK_EQ(rnbd_srv_open(&o, &srv), -EINVAL);
		CHECK(log_has("device:/vm//a/:bps=1M\": its name has limits already"), "%s",
		      log_text());
		o.qos = NULL;
	}
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	s = sess_open("nosearch");
	if (s) {
		log_clear();
		CHECK_EQ(dev_open(s, "/etc/passwd", RNBD_ACCESS_RO, NULL), -ENOENT);
		CHECK(log_has("nosearch: cannot open etc/passwd (ro): no file devices are "
			      "exported"), "%s", log_text());
		CHECK_EQ(dev_open(s, "etc/hostname", RNBD_ACCESS_RW, NULL), -ENOENT);
		CHECK_EQ(dev_open(s, "mem0", RNBD_ACCESS_RW, NULL), 0);
		rtrs_clt_close(s);
	}
	rnbd_srv_close(srv);
	rnbd_set_log_fn(NULL, NULL);

	if (!daemon) {
		fprintf(stderr, "test-rnbd-srv: RNBD_SERVER not set, the daemon is not checked\n");
		return;
	}
	/* The daemon with no search path and no memory device: refused options, exit 2, and why. */
	snprintf(cmd, sizeof(cmd), "timeout 10 %s --addr %s --port 0 --provider %s 2>&1",
		 daemon, test_addr(), test_provider());
	f = popen(cmd, "r");
	CHECK(f != NULL);
	if (!f)
		return;
	while (n < sizeof(out) - 1 && fgets(out + n, (int)(sizeof(out) - n), f))
		n += strlen(out + n);
	out[n] = '\0';
	st = pclose(f);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2, "rnbd-server status %d: %s", st, out);
	CHECK(strstr(out, "nothing to export") && !strstr(out, "listening"), "%s", out);
}

/* ---- a backing file that hangs ------------------------------------------------ */

/* One request sent without waiting: areq_wait collects it. */
struct areq {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int err;
	struct rtrs_clt_sess *s;
	struct rtrs_permit *permit;
	union {
		struct rnbd_msg_open open;
		struct rnbd_msg_close close;
		struct rnbd_msg_io io;
	} msg;
	struct rnbd_msg_open_rsp rsp;
	uint8_t data[4096];
};

static void areq_conf(void *priv, int err)
{
	struct areq *a = priv;

	pthread_mutex_lock(&a->lock);
	a->done = true;
	a->err = err;
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(&a->lock);
}

static int areq_send(struct areq *a, struct rtrs_clt_sess *s, enum rtrs_dir dir, size_t msglen,
		     void *data, size_t len)
{
	struct rtrs_clt_req_ops ops = { .priv = a, .conf = areq_conf };
	struct iovec u = { &a->msg, msglen }, d = { data, len };
	int rc;

	pthread_mutex_init(&a->lock, NULL);
	cond_init_mono(&a->cond);
	a->done = false;
	a->s = s;
	a->permit = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	if (!a->permit)
		return -ENOBUFS;
	rc = rtrs_clt_request(s, dir, &ops, a->permit, &u, 1, &d, len ? 1 : 0);
	if (rc)
		areq_conf(a, rc);
	return 0;
}

/* The request's result, or -EINPROGRESS if it is not answered within ms. */
static int areq_wait(struct areq *a, unsigned ms)
{
	struct timespec dl = deadline_ms(ms);
	int rc;

	pthread_mutex_lock(&a->lock);
	while (!a->done && pthread_cond_timedwait(&a->cond, &a->lock, &dl) != ETIMEDOUT)
		;
	rc = a->done ? a->err : -EINPROGRESS;
	pthread_mutex_unlock(&a->lock);
	if (a->done) {
		if (a->s) /* NULL: its session was closed, and its permits with it */
			rtrs_clt_put_permit(a->s, a->permit);
		pthread_mutex_destroy(&a->lock);
		pthread_cond_destroy(&a->cond);
	}
	return rc;
}

static int aopen(struct areq *a, struct rtrs_clt_sess *s, const char *name,
		 enum rnbd_access_mode mode)
{
	struct rnbd_open o = { .access_mode = mode };

	snprintf(o.dev_name, sizeof(o.dev_name), "%s", name);
	rnbd_open_encode(&a->msg.open, &o);
	return areq_send(a, s, RTRS_READ, sizeof(a->msg.open), &a->rsp, sizeof(a->rsp));
}

static int aclose(struct areq *a, struct rtrs_clt_sess *s, uint32_t id)
{
	rnbd_close_encode(&a->msg.close, id);
	return areq_send(a, s, RTRS_WRITE, sizeof(a->msg.close), NULL, 0);
}

static int awrite(struct areq *a, struct rtrs_clt_sess *s, uint32_t id, uint64_t off)
{
	struct rnbd_io i = { .device_id = id, .sector = off >> 9, .op = RNBD_OP_WRITE,
			     .bi_size = sizeof(a->data) };

	test_fill(a->data, sizeof(a->data), 77);
	rnbd_io_encode(&a->msg.io, &i);
	return areq_send(a, s, RTRS_WRITE, sizeof(a->msg.io), a->data, sizeof(a->data));
}

/* An empty write with flags (PREFLUSH, FUA): a flush as a kernel client sends one. */
static int aflush(struct areq *a, struct rtrs_clt_sess *s, uint32_t id, uint32_t flags)
{
	struct rnbd_io i = { .device_id = id, .op = RNBD_OP_WRITE, .flags = flags };

	rnbd_io_encode(&a->msg.io, &i);
	return areq_send(a, s, RTRS_WRITE, sizeof(a->msg.io), NULL, 0);
}

/*
 * Requests of the "hang" file are held in the store (rnbd-hooks.h) as a
 * backing file system that does not answer would hold them.
 */
static struct {
	pthread_mutex_t lock;
	ino_t ino;
	struct rnbd_breq *held[8];
	unsigned n;
} hang = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool hang_hold(void *priv, struct rnbd_breq *r)
{
	bool hold;

	(void)priv;
	pthread_mutex_lock(&hang.lock);
	hold = rnbd_store_info(r->store)->ino == hang.ino && hang.n < ARRAY_SIZE(hang.held);
	if (hold)
		hang.held[hang.n++] = r;
	pthread_mutex_unlock(&hang.lock);
	return hold;
}

static unsigned hang_count(unsigned want, unsigned ms)
{
	uint64_t end = test_now_ms() + ms;
	unsigned n;

	for (;;) {
		pthread_mutex_lock(&hang.lock);
		n = hang.n;
		pthread_mutex_unlock(&hang.lock);
		if (n >= want || test_now_ms() >= end)
			return n;
		usleep(1000);
	}
}

static void hang_release(void)
{
	pthread_mutex_lock(&hang.lock);
	for (unsigned i = 0; i < hang.n; i++)
		rnbd_store_resume(hang.held[i]);
	hang.n = 0;
	pthread_mutex_unlock(&hang.lock);
}

/*
 * A's result within 2 s. If it is stuck (behind the hung file: the bug),
 * the held IO is let go so that the test goes on, and it fails.
 */
static int in_time(struct areq *a, const char *what, const char *when)
{
	int rc = areq_wait(a, 2000);

	CHECK(rc != -EINPROGRESS, "%s: %s not answered within 2 s", when, what);
	if (rc == -EINPROGRESS) {
		hang_release();
		rc = areq_wait(a, 30000);
	}
	return rc;
}

/* OPEN in time: the device id, or a negative errno. */
static int open_in_time(struct rtrs_clt_sess *s, const char *name, enum rnbd_access_mode mode,
			const char *when)
{
	struct rnbd_open_rsp r;
	const char *why = NULL;
	struct areq a;
	int rc;

	aopen(&a, s, name, mode);
	rc = in_time(&a, "OPEN", when);
	if (!rc)
		rc = rnbd_open_rsp_decode(&a.rsp, sizeof(a.rsp), &r, &why);
	return rc ? rc : (int)r.device_id;
}

/* What another session can do meanwhile: open, write and close, each answered in time. */
static void other_works(struct rtrs_clt_sess *o, const char *when)
{
	struct areq a;
	int id = open_in_time(o, "disk", RNBD_ACCESS_RW, when);

	CHECK(id >= 0, "%s: another session's OPEN: %s", when, strerror(-id));
	if (id < 0)
		return;
	awrite(&a, o, (uint32_t)id, 0);
	CHECK_EQ(in_time(&a, "write", when), 0);
	aclose(&a, o, (uint32_t)id);
	CHECK_EQ(in_time(&a, "CLOSE", when), 0);
}

/* o's path stays up, with no reconnect: the server's loop kept its heartbeats. */
static void other_alive(struct rtrs_clt_sess *o, const char *when)
{
	struct rtrs_path_stats st = { .size = sizeof(st) };

	CHECK_EQ(rtrs_clt_path_stats(o, 0, &st), 0);
	CHECK(!strcmp(st.state, "connected") && st.reconnects == 0 && st.last_error == 0,
	      "%s: the other session's path: %s, %llu reconnects, last error %d", when, st.state,
	      (unsigned long long)st.reconnects, st.last_error);
}

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool inside, go;
	int rc;
} slow = { .lock = PTHREAD_MUTEX_INITIALIZER }; /* cond: test_hung_io */

/* A list callback that does not return until told: a control client that reads nothing. */
static void slow_fn(void *priv, const struct rnbd_srv_dev_stats *st)
{
	struct timespec dl = deadline_ms(5000);

	(void)priv;
	(void)st;
	pthread_mutex_lock(&slow.lock);
	slow.inside = true;
	pthread_cond_broadcast(&slow.cond);
	while (!slow.go && pthread_cond_timedwait(&slow.cond, &slow.lock, &dl) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&slow.lock);
}

static void *slow_list(void *arg)
{
	slow.rc = rnbd_srv_list(arg, slow_fn, NULL);
	return NULL;
}

static struct {
	struct rnbd_srv *srv;
	int rc;
	bool done;
} fc;

/* A session that connects while another goes away with hung IO. */
static struct {
	struct rtrs_clt_sess *s;
	bool done;
} late;

static void *late_open(void *arg)
{
	(void)arg;
	late.s = sess_open("late");
	__atomic_store_n(&late.done, true, __ATOMIC_RELEASE);
	return NULL;
}

/* Whether *flag is set within ms. */
static bool set_within(bool *flag, unsigned ms)
{
	uint64_t end = test_now_ms() + ms;

	while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE) && test_now_ms() < end)
		usleep(1000);
	return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

static void *force_close_thread(void *arg)
{
	(void)arg;
	fc.rc = rnbd_srv_force_close(fc.srv, "h1", "hang");
	__atomic_store_n(&fc.done, true, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * A backing file whose IO hangs holds its own device and nothing else:
 * with a write of it held in the store, its session's CLOSE waits (for the
 * write), while another session opens, writes and closes in time; the
 * hung session going away does not stop the server's heartbeats (the other
 * session's path stays up); a list whose reader does not read holds no
 * lock; a force-close returns -EINPROGRESS instead of waiting. Released,
 * everything completes and the writer slot comes back.
 */
static void test_hung_io(void)
{
	char search[512], path[600];
	struct rtrs_clt_sess *h1, *h2, *o;
	struct rnbd_srv_opts so;
	struct rnbd_srv *srv;
	static struct areq w1, c1, w2, w3;
	struct stat st;
	pthread_t th;
	int id;

	cond_init_mono(&slow.cond); /* slow_fn waits with a deadline */
	snprintf(search, sizeof(search), "%s/hung", top);
	CHECK_EQ(mkdir(search, 0700), 0);
	snprintf(path, sizeof(path), "%s/hang", search);
	mkfile(path, DISK_SIZE);
	CHECK_EQ(stat(path, &st), 0);
	hang.ino = st.st_ino;
	snprintf(path, sizeof(path), "%s/disk", search);
	mkfile(path, DISK_SIZE);
	snprintf(path, sizeof(path), "%s/listed", search);
	mkfile(path, DISK_SIZE);

	rnbd_srv_opts_init(&so, sizeof(so));
	so.rtrs.addr = test_addr();
	so.rtrs.provider = test_provider();
	so.rtrs.port = 0;
	so.dev_search_path = search;
	so.rtrs.queue_depth = 32;
	so.rtrs.hb_interval_ms = 100;
	CHECK_EQ(rnbd_srv_open(&so, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	clt_hb_ms = 100;
	h1 = sess_open("h1");
	h2 = sess_open("h2");
	o = sess_open("o");
	clt_hb_ms = 0;
	if (!h1 || !h2 || !o)
		goto out;
	rnbd_store_set_hold_hook(hang_hold, NULL);

	/* h1's write hangs; its CLOSE waits for it; o goes on. */
	CHECK_EQ(dev_open(h1, "hang", RNBD_ACCESS_RW, NULL), 0);
	awrite(&w1, h1, 0, 0);
	CHECK_EQ(hang_count(1, 2000), 1);
	aclose(&c1, h1, 0);
	other_works(o, "CLOSE of a hung device");
	/* h1 still writes, closing: -EBUSY (its slot comes back; a kernel client gets -EPERM) */
	CHECK_EQ(open_in_time(o, "hang", RNBD_ACCESS_RW, "CLOSE of a hung device"), -EBUSY);
	CHECK_EQ(areq_wait(&c1, 0), -EINPROGRESS);
	hang_release();
	CHECK_EQ(areq_wait(&w1, 5000), 0);
	CHECK_EQ(areq_wait(&c1, 5000), 0);
	snprintf(path, sizeof(path), "%s/hang", search);
	CHECK(test_file_has(path, 0, w1.data, sizeof(w1.data)), "the held write landed");
	id = dev_open(o, "hang", RNBD_ACCESS_RW, NULL); /* the CLOSE gave the slot back */
	CHECK(id >= 0, "%s", strerror(-id));
	if (id >= 0)
		CHECK_EQ(dev_close(o, (uint32_t)id), 0);

	/* A force-close of a hung device does not wait for it; its IO still completes. */
	CHECK_EQ(dev_open(h1, "hang", RNBD_ACCESS_RW, NULL), 0);
	awrite(&w3, h1, 0, 4096);
	CHECK_EQ(hang_count(1, 2000), 1);
	fc.srv = srv;
	CHECK_EQ(pthread_create(&th, NULL, force_close_thread, NULL), 0);
	CHECK(set_within(&fc.done, 3000), "force-close returned");
	other_works(o, "force-close of a hung device");
	hang_release();
	pthread_join(th, NULL);
	CHECK_EQ(fc.rc, -EINPROGRESS);
	CHECK_EQ(areq_wait(&w3, 5000), 0);
	CHECK_EQ(dev_close(h1, 0), 0);

	/* h2 goes away with a write hung: the server's loop keeps everyone's heartbeats. */
	CHECK_EQ(dev_open(h2, "hang", RNBD_ACCESS_RW, NULL), 0);
	awrite(&w2, h2, 0, 0);
	CHECK_EQ(hang_count(1, 2000), 1);
	rtrs_clt_close(h2); /* its write fails here, it stays held there */
	h2 = NULL;
	w2.s = NULL;
	CHECK_EQ(areq_wait(&w2, 0), -ECONNABORTED);
	usleep(1000 * 1000); /* ten heartbeat periods */
	other_alive(o, "a session with hung IO gone");
	/* The server's service loop, which takes the session down, also accepts. */
	CHECK_EQ(pthread_create(&th, NULL, late_open, NULL), 0);
	CHECK(set_within(&late.done, 3000), "a new session connects meanwhile");
	if (!late.done)
		hang_release();
	pthread_join(th, NULL);
	if (late.s)
		rtrs_clt_close(late.s);
	other_works(o, "a session with hung IO gone");

	/* A list whose reader does not read holds up nothing. */
	CHECK(open_in_time(o, "listed", RNBD_ACCESS_RO, "list") >= 0);
	CHECK_EQ(pthread_create(&th, NULL, slow_list, srv), 0);
	pthread_mutex_lock(&slow.lock);
	while (!slow.inside)
		pthread_cond_wait(&slow.cond, &slow.lock);
	pthread_mutex_unlock(&slow.lock);
	other_works(o, "a list blocked in its callback");
	pthread_mutex_lock(&slow.lock);
	slow.go = true;
	pthread_cond_broadcast(&slow.cond);
	pthread_mutex_unlock(&slow.lock);
	pthread_join(th, NULL);
	CHECK(slow.rc >= 1, "list: %d", slow.rc);

	hang_release(); /* h2's write: then its device is released */
	for (uint64_t end = test_now_ms() + 5000; test_now_ms() < end; usleep(10 * 1000)) {
		id = open_in_time(o, "hang", RNBD_ACCESS_RW, "the end");
		if (id != -EBUSY)
			break;
	}
	CHECK(id >= 0, "hang opens rw once h2's write completed: %s", strerror(-id));
	other_alive(o, "the end");
out:
	rnbd_store_set_hold_hook(NULL, NULL);
	hang_release();
	for (struct rtrs_clt_sess **s = (struct rtrs_clt_sess *[]){ h1, h2, o }, **e = s + 3;
	     s < e; s++)
		if (*s)
			rtrs_clt_close(*s);
	rnbd_srv_close(srv);
}

/* ---- rate limits ----------------------------------------------------------------- */

/*
 * A force-close of a device with writes held by its rate limit (1 byte/s:
 * after the first write, the others would wait an hour): they are answered
 * with -ENOTCONN at once and never reach the file, the close completes (0,
 * not -EINPROGRESS), and another session opens the device for writing at
 * once: its writer slot is back.
 */
static void test_qos_force_close(void)
{
	static const char *const qos[] = { "device:qdisk:write_bps=1", NULL };
	static const uint8_t zero[4096];
	static struct areq w[5], c;
	int res[ARRAY_SIZE(w)];
	struct rnbd_qos_limits l = { .size = sizeof(l) };
	struct rnbd_qos_stats st = { .size = sizeof(st) };
	char search[512], path[600];
	struct rtrs_clt_sess *q1, *q2;
	struct rnbd_srv_opts so;
	struct rnbd_srv *srv;
	int rc = 0, crc = 0, went = 0, dropped = 0;

	for (unsigned i = 0; i < ARRAY_SIZE(w); i++)
		res[i] = 0; /* nothing sent */
	snprintf(search, sizeof(search), "%s/qos", top);
	CHECK_EQ(mkdir(search, 0700), 0);
	snprintf(path, sizeof(path), "%s/qdisk", search);
	mkfile(path, DISK_SIZE);
	rnbd_srv_opts_init(&so, sizeof(so));
	so.rtrs.addr = test_addr();
	so.rtrs.provider = test_provider();
	so.rtrs.port = 0;
	so.dev_search_path = search;
	so.rtrs.queue_depth = 32;
	so.qos = qos;
	CHECK_EQ(rnbd_srv_open(&so, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	q1 = sess_open("q1");
	q2 = sess_open("q2");
	if (!q1 || !q2)
		goto out;
	CHECK_EQ(dev_open(q1, "qdisk", RNBD_ACCESS_RW, NULL), 0);
	for (unsigned i = 0; i < ARRAY_SIZE(w); i++) {
		res[i] = -EINPROGRESS; /* not collected */
		awrite(&w[i], q1, 0, i * 4096u);
	}
	for (uint64_t end = test_now_ms() + 10000; test_now_ms() < end; usleep(1000)) {
		rc = rnbd_srv_qos_get(srv, RNBD_QOS_DEVICE, "qdisk", &l, &st);
		if (rc || st.queued == ARRAY_SIZE(w) - 1)
			break;
	}
	CHECK_EQ(rc, 0);
	CHECK_EQ(st.queued, ARRAY_SIZE(w) - 1); /* the first took the burst */
	/* A flush is never held, nor an empty write with PREFLUSH or FUA, which is one. */
	{
		static struct areq f[2];
		const uint32_t fl[2] = { RNBD_F_PREFLUSH, RNBD_F_FUA };

		for (unsigned i = 0; i < 2; i++) {
			CHECK_EQ(aflush(&f[i], q1, 0, fl[i]), 0);
			rc = areq_wait(&f[i], 2000);
			CHECK(rc == 0, "an empty write with %s behind held writes: %s",
			      i ? "FUA" : "PREFLUSH", rc == -EINPROGRESS ? "held" : strerror(-rc));
			if (rc == -EINPROGRESS)
				f[i].s = NULL; /* failed by the close below, never collected */
		}
	}

	CHECK_EQ(rnbd_srv_force_close(srv, "q1", "qdisk"), 0);
	for (unsigned i = 0; i < ARRAY_SIZE(w); i++) {
		rc = res[i] = areq_wait(&w[i], 5000);
		if (!rc) {
			went++;
		} else if (rc == -ENOTCONN) {
			dropped++;
			CHECK(test_file_has(path, i * 4096u, zero, sizeof(zero)),
			      "a write answered -ENOTCONN reached the file");
		} else {
			CHECK(false, "write %u: %s", i, strerror(-rc));
		}
	}
	CHECK(went == 1 && dropped == ARRAY_SIZE(w) - 1, "%d went, %d answered -ENOTCONN", went,
	      dropped);
	CHECK_EQ(rnbd_srv_qos_get(srv, RNBD_QOS_DEVICE, "qdisk", &l, &st), 0);
	CHECK_EQ(st.queued, 0);
	rc = dev_open(q2, "qdisk", RNBD_ACCESS_RW, NULL);
	CHECK(rc >= 0, "another session opens it for writing: %s", strerror(-rc));
	/* Answered once the device is released: held IO would hold it back. */
	aclose(&c, q1, 0);
	crc = areq_wait(&c, 5000);
	CHECK_EQ(crc, 0);
out:
	if (q1)
		rtrs_clt_close(q1);
	/* Without the drop, what is still held: failed by the close (permits gone), collected. */
	for (unsigned i = 0; i < ARRAY_SIZE(w); i++) {
		if (res[i] == -EINPROGRESS) {
			w[i].s = NULL;
			areq_wait(&w[i], 5000);
		}
	}
	if (crc == -EINPROGRESS) {
		c.s = NULL;
		areq_wait(&c, 5000);
	}
	if (q2)
		rtrs_clt_close(q2);
	rnbd_srv_close(srv);
}

/* ---- transport options --------------------------------------------------------- */

/* Made with rtrs-key gen, as `nvme gen-dhchap-key` writes them. */
#define HOST_KEY "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:"
#define HOST_NAME "nqn.2014-08.org.nvmexpress:uuid:7e1d2c9a-0000-4000-8000-00000000a001"
#define SRV_NAME "nqn.2026-11.io.rnbd:opts-server"

/*
 * An RTRS session to the server, authenticating with secret (NULL: none)
 * and expecting the server to be called srv_name (NULL: librtrs's default
 * name); a failed path is retried after 50 ms. 0 or the open's errno.
 */
static int opts_sess_open(const char *name, const char *secret, const char *srv_name,
			  struct rtrs_clt_sess **out)
{
	struct test_rnbd_clt c;

	test_rnbd_clt_init(&c, name, port);
	c.o.reconnect_delay_ms = 50;
	c.o.reconnect_jitter_ms = 0;
	c.o.auth_secret = secret;
	c.o.auth_host_name = HOST_NAME;
	c.o.auth_server_name = srv_name;
	return test_rnbd_clt_open(&c, out);
}

/* The access file beside the key file: the host may use everything. */
static char opts_access[512];

static void opts_srv_init(struct rnbd_srv_opts *o, const char *keys, uint16_t want_port)
{
	rnbd_srv_opts_init(o, sizeof(*o));
	o->rtrs.addr = test_addr();
	o->rtrs.provider = test_provider();
	o->rtrs.port = want_port;
	o->rtrs.queue_depth = 24;
	o->rtrs.max_chunk_size = 64 << 10;
	o->rtrs.max_sessions = 1;
	o->rtrs.listen_retry_ms = 50;
	o->rtrs.auth_keys_file = keys;
	o->access_file = keys ? opts_access : NULL;
	o->rtrs.auth_name = SRV_NAME;
	o->mem_devices = "mem0:1M";
}

/*
 * The server's options embed librtrs's own (rnbd_srv_opts.rtrs), handed to
 * rtrs_srv_open whole, so every transport option applies, also those the
 * RNBD options did not carry before (max_sessions, listen_retry_ms here).
 * Each is checked by what a client meets: the key file (no secret:
 * -ENOKEY) and the server's name, which the host's answer covers (another
 * name: -EKEYREJECTED); the queue depth and the chunk size (rtrs_clt_query);
 * max_sessions 1 (a second session refused); always_invalidate (a server
 * restarted on the same port without it: the client notices the switch and
 * does not reconnect).
 */
static void test_transport_opts(void)
{
	struct rtrs_path_stats st = { .size = sizeof(st) };
	struct rtrs_attrs at = { .size = sizeof(at) };
	struct rtrs_clt_sess *s, *s2;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv;
	char keys[512];
	FILE *f;
	int rc;

	snprintf(keys, sizeof(keys), "%s/keys", top);
	f = fopen(keys, "w");
	CHECK(f != NULL, "%s", keys);
	if (!f)
		return;
	fprintf(f, "%s %s\n", HOST_NAME, HOST_KEY);
	fclose(f);
	chmod(keys, 0600);
	snprintf(opts_access, sizeof(opts_access), "%s/access", top);
	f = fopen(opts_access, "w");
	CHECK(f != NULL, "%s", opts_access);
	if (!f)
		return;
	fprintf(f, "%s sessions=* migration=*\n", HOST_NAME);
	fclose(f);
	rnbd_set_log_fn(log_sink, NULL);

	opts_srv_init(&o, keys, 0);
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	port = rnbd_srv_port(srv, 5000);
	CHECK(port > 0, "port %d", port);
	CHECK_EQ(opts_sess_open("opts", NULL, SRV_NAME, &s), -ENOKEY);
	CHECK_EQ(opts_sess_open("opts", HOST_KEY, NULL, &s), -EKEYREJECTED);
	rc = opts_sess_open("opts", HOST_KEY, SRV_NAME, &s);
	CHECK(rc == 0, "with the key and the server's name: %s", strerror(-rc));
	if (rc)
		goto out;
	CHECK_EQ(rtrs_clt_query(s, &at), 0);
	CHECK_EQ(at.queue_depth, 24);
	CHECK(at.max_io_size > 32768 && at.max_io_size <= 65536, "max_io_size %u", at.max_io_size);
	CHECK_EQ(opts_sess_open("opts2", HOST_KEY, SRV_NAME, &s2), -ENOSPC);
	if (s2)
		rtrs_clt_close(s2);

	/* The same server again on its port, but without always_invalidate. */
	log_clear();
	rnbd_srv_close(srv);
	opts_srv_init(&o, keys, (uint16_t)port);
	o.rtrs.always_invalidate = 0;
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	CHECK(log_wait_for("the server switched always_invalidate off", 5000), "%s", log_text());
	/* The verdict follows the log line: given a moment to land. */
	for (uint64_t end = test_now_ms() + 2000; test_now_ms() < end; usleep(10 * 1000)) {
		CHECK_EQ(rtrs_clt_path_stats(s, 0, &st), 0);
		if (!strcmp(st.reconnect_verdict, "do not retry"))
			break;
	}
	CHECK(!strcmp(st.reconnect_verdict, "do not retry"), "verdict %s", st.reconnect_verdict);
	CHECK(strcmp(st.state, "connected"), "the path is %s", st.state);
	rtrs_clt_close(s);
out:
	rnbd_srv_close(srv);
	rnbd_set_log_fn(NULL, NULL);
	unlink(keys);
}

/*
 * A session's OPENs: one that asks to write a device the session has open
 * read-only is refused (it would be told it may write, and every write
 * would fail with EROFS); past max_devs_per_session an OPEN is refused with
 * -EMFILE until a device is closed; a remap in the same mode is the device
 * it has.
 */
static void test_open_limits(void)
{
	struct rnbd_open_rsp r1, r2, r3;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv = NULL;
	struct rtrs_clt_sess *s;

	rnbd_set_log_fn(log_sink, NULL);
	rnbd_srv_opts_init(&o, sizeof(o));
	CHECK_EQ(o.max_devs_per_session, RNBD_DEFAULT_MAX_DEVS_PER_SESSION);
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.mem_devices = "m0:64K,m1:64K,m2:64K";
	o.max_devs_per_session = 2;
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	if (!srv)
		return;
	port = rnbd_srv_port(srv, 5000);
	s = sess_open("limits");
	if (s) {
		log_clear();
		CHECK(dev_open(s, "m0", RNBD_ACCESS_RO, &r1) >= 0);
		CHECK_EQ(dev_open(s, "m0", RNBD_ACCESS_RW, NULL), -EBUSY);
		CHECK(log_has("limits: cannot open m0 (rw): the session has it open read-only"),
		      "%s", log_text());
		CHECK(dev_open(s, "m0", RNBD_ACCESS_RO, &r2) >= 0);
		CHECK_EQ(r2.device_id, r1.device_id);
		CHECK(dev_open(s, "m1", RNBD_ACCESS_RW, &r2) >= 0);
		CHECK(dev_open(s, "m1", RNBD_ACCESS_RO, &r3) >= 0); /* a writer covers a reader */
		CHECK_EQ(r3.device_id, r2.device_id);
		CHECK_EQ(dev_open(s, "m2", RNBD_ACCESS_RW, NULL), -EMFILE);
		CHECK(log_has("limits: cannot open m2: the session has 2 devices open"), "%s",
		      log_text());
		CHECK_EQ(dev_close(s, r1.device_id), 0);
		CHECK(dev_open(s, "m2", RNBD_ACCESS_RW, &r3) >= 0);
		/* Once closed, the device opens again in any mode. */
		CHECK_EQ(dev_close(s, r3.device_id), 0);
		CHECK(dev_open(s, "m0", RNBD_ACCESS_RW, NULL) >= 0);
		rtrs_clt_close(s);
	}
	rnbd_srv_close(srv);
	rnbd_set_log_fn(NULL, NULL);
}

/*
 * A client opening and closing a device in a loop: its session's open and
 * close lines stop after a burst (10 per 5 s), another session's are still
 * logged.
 */
static void test_open_log_limit(void)
{
	struct rnbd_open_rsp r;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv = NULL;
	struct rtrs_clt_sess *a, *b;
	unsigned opened, closing;
	size_t mark;

	rnbd_set_log_fn(log_sink, NULL);
	rnbd_set_log_level(2); /* info; warn again at the end */
	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.mem_devices = "m0:64K,m1:64K";
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	if (!srv)
		return;
	port = rnbd_srv_port(srv, 5000);
	a = sess_open("looper");
	b = sess_open("other");
	if (a && b) {
		mark = log_mark();
		for (int i = 0; i < 40; i++) {
			CHECK_EQ(dev_open(a, "m0", RNBD_ACCESS_RW, &r), 0);
			CHECK_EQ(dev_close(a, r.device_id), 0);
		}
		CHECK(dev_open(b, "m1", RNBD_ACCESS_RW, &r) >= 0);
		opened = log_count_since(mark, "looper: opened m0");
		closing = log_count_since(mark, "looper: closing m0");
		CHECK(opened >= 1 && opened + closing <= 10, "looper's lines: %u opened, %u closing",
		      opened, closing);
		CHECK(log_has_since(mark, "other: opened m1"), "%s", log_since(mark));
	}
	if (a)
		rtrs_clt_close(a);
	if (b)
		rtrs_clt_close(b);
	rnbd_srv_close(srv);
	rnbd_set_log_fn(NULL, NULL);
	rnbd_set_log_level(1);
}

/* This process's resident memory, in KiB (VmRSS), or 0. */
static unsigned long rss_kib(void)
{
	char line[256];
	unsigned long kib = 0;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lu", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

/*
 * A memory device discarded whole (as mkfs does) gives its pages back, not
 * make every page never written resident; the partial pages at the edges
 * are cleared, the bytes outside the range kept.
 */
static void test_mem_discard(void)
{
	static uint8_t a[8192], b[8192], r[8192], zero[8192];
	const uint64_t size = 128u << 20;
	struct rnbd_open_rsp rsp;
	struct rnbd_srv_opts o;
	struct rnbd_srv *srv = NULL;
	struct rtrs_clt_sess *s;
	unsigned long before, after;
	int id;

	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = test_addr();
	o.rtrs.provider = test_provider();
	o.rtrs.port = 0;
	o.mem_devices = "big:128M";
	CHECK_EQ(rnbd_srv_open(&o, &srv), 0);
	if (!srv)
		return;
	port = rnbd_srv_port(srv, 5000);
	s = sess_open("discard");
	id = s ? dev_open(s, "big", RNBD_ACCESS_RW, &rsp) : -1;
	CHECK(id >= 0, "open: %d", id);
	if (id >= 0) {
		test_fill(a, sizeof(a), 31);
		test_fill(b, sizeof(b), 32);
		CHECK_EQ(io(s, (uint32_t)id, RNBD_OP_WRITE, 0, 0, a, sizeof(a)), 0);
		CHECK_EQ(io(s, (uint32_t)id, RNBD_OP_WRITE, 0, size - sizeof(b), b, sizeof(b)), 0);
		before = rss_kib();
		CHECK_EQ(io(s, (uint32_t)id, RNBD_OP_DISCARD, 0, 512, NULL, (uint32_t)(size - 1024)),
			 0);
		after = rss_kib();
		CHECK(after < before + (32u << 10), "a 128 MiB discard made %lu KiB resident",
		      after > before ? after - before : 0);
		CHECK_EQ(io(s, (uint32_t)id, RNBD_OP_READ, 0, 0, r, sizeof(r)), 0);
		CHECK(!memcmp(r, a, 512) && !memcmp(r + 512, zero, sizeof(r) - 512),
		      "the first page: its first sector kept, the rest zeroes");
		CHECK_EQ(io(s, (uint32_t)id, RNBD_OP_READ, 0, size - sizeof(r), r, sizeof(r)), 0);
		CHECK(!memcmp(r, zero, sizeof(r) - 512) &&
		      !memcmp(r + sizeof(r) - 512, b + sizeof(b) - 512, 512),
		      "the last page: zeroes, its last sector kept");
	}
	if (s)
		rtrs_clt_close(s);
	rnbd_srv_close(srv);
}

int main(void)
{
	top = test_tmpdir(NULL, "rnbd-srv-test");
	if (!top)
		return 1;
	test_defaults();
	test_open_limits();
	test_open_log_limit();
	test_mem_discard();
	test_all();
	test_hung_io();
	test_qos_force_close();
	test_transport_opts();
	return test_done("test-rnbd-srv");
}
