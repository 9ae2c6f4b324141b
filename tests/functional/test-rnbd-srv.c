/* SPDX-License-Identifier: MIT */
/*
 * The RNBD server (lib/rnbd/rnbd-srv.c) against RTRS clients that speak
 * RNBD by hand: the session handshake, IO of every kind on a file checked
 * byte for byte (also through the file itself), the sharing rules across
 * sessions (second rw refused, ro allowed, migration allows two writers),
 * read-only devices refusing writes, device names that try to leave the
 * search path, force-close (IO then fails with -ENOTCONN), and a memory
 * device.
 */
#include <errno.h>
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
#include "rnbd-proto.h"
#include "rnbd.h"
#include "rtrs.h"

#define DISK_SIZE (4u << 20)

static const char *top; /* test_tmpdir */
static int port;

static struct rtrs_clt_sess *sess_open(const char *name)
{
	struct rtrs_path_addr pa;
	struct rtrs_clt_opts o;
	struct rtrs_clt_sess *s = NULL;
	struct rnbd_msg_sess_info m, rsp;
	const char *why = NULL;
	unsigned ver = 0;
	char dst[64];
	int rc;

	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), port);
	pa = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = name;
	o.paths = &pa;
	o.paths_num = 1;
	o.provider = test_provider();
	o.nr_io_cons = 1;
	rc = rtrs_clt_open(&o, &s);
	CHECK(rc == 0, "session %s: %s", name, strerror(-rc));
	if (rc)
		return NULL;
	rnbd_sess_info_encode(&m, false, RNBD_PROTO_VER_MAJOR);
	CHECK_EQ(test_request(s, RTRS_READ, &m, sizeof(m), &rsp, sizeof(rsp)), 0);
	CHECK_EQ(rnbd_sess_info_decode(&rsp, sizeof(rsp), true, &ver, &why), 0);
	CHECK_EQ(ver, RNBD_PROTO_VER_MAJOR);
	return s;
}

/* OPEN; the device id, or a negative errno. */
static int dev_open(struct rtrs_clt_sess *s, const char *name, enum rnbd_access_mode mode,
		    struct rnbd_open_rsp *out)
{
	struct rnbd_open o = { .access_mode = mode };
	struct rnbd_msg_open m;
	struct rnbd_msg_open_rsp rsp;
	struct rnbd_open_rsp r;
	const char *why = NULL;
	int rc;

	snprintf(o.dev_name, sizeof(o.dev_name), "%s", name);
	rnbd_open_encode(&m, &o);
	rc = test_request(s, RTRS_READ, &m, sizeof(m), &rsp, sizeof(rsp));
	if (rc)
		return rc;
	rc = rnbd_open_rsp_decode(&rsp, sizeof(rsp), &r, &why);
	CHECK(rc == 0, "OPEN_RSP: %s", why);
	if (out)
		*out = r;
	return rc ? rc : (int)r.device_id;
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
	o.addr = test_addr();
	o.provider = test_provider();
	o.port = 0;
	o.dev_search_path = search;
	o.mem_devices = "mem0:16M";
	o.queue_depth = 32;
	o.max_chunk_size = 512 << 10;
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
	o.addr = test_addr();
	o.provider = test_provider();
	o.port = 0;
	CHECK_EQ(rnbd_srv_open(&o, &srv), -EINVAL);
	CHECK(log_has("nothing to export"), "%s", log_text());
	o.dev_search_path = "relative/dir";
	CHECK_EQ(rnbd_srv_open(&o, &srv), -EINVAL);

	o.dev_search_path = NULL;
	o.mem_devices = "mem0:1M";
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
	/* The daemon with no search path and no memory device: exit 1, and why. */
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
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "rnbd-server status %d: %s", st, out);
	CHECK(strstr(out, "nothing to export") && !strstr(out, "listening"), "%s", out);
}

int main(void)
{
	top = test_tmpdir(NULL, "rnbd-srv-test");
	if (!top)
		return 1;
	test_defaults();
	test_all();
	return test_done("test-rnbd-srv");
}
