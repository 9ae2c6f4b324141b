/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the RNBD wire codec (lib/rnbd/rnbd-proto.c) and device
 * paths (lib/rnbd/rnbd-path.c): byte layouts
 * as the kernel's rnbd-proto.h has them, round trips, version negotiation,
 * and every refusal. The IO rules are checked against a table written here
 * independently of the decoder, over every operation and flag combination.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "check.h"
#include "rnbd-access.h"
#include "rnbd-path.h"
#include "rnbd-proto.h"

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)v); put16(p + 2, (uint16_t)(v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

static void test_version(void)
{
	CHECK_EQ(rnbd_version_negotiate(0), 0);
	CHECK_EQ(rnbd_version_negotiate(1), 1);
	CHECK_EQ(rnbd_version_negotiate(2), 2);
	CHECK_EQ(rnbd_version_negotiate(3), 2);
	CHECK_EQ(rnbd_version_negotiate(255), 2);
}

static void test_sess_info(void)
{
	struct rnbd_msg_sess_info m;
	uint8_t want[36] = { 0 };
	const char *why = NULL;
	unsigned ver = 0;

	rnbd_sess_info_encode(&m, false, 2);
	want[4] = 2;
	CHECK(!memcmp(&m, want, sizeof(want)), "SESS_INFO bytes");
	CHECK_EQ(rnbd_sess_info_decode(&m, sizeof(m), false, &ver, &why), 0);
	CHECK_EQ(ver, 2);
	/* A response is not a request, and the other way round. */
	CHECK_EQ(rnbd_sess_info_decode(&m, sizeof(m), true, &ver, &why), -EPROTO);
	rnbd_sess_info_encode(&m, true, 7);
	CHECK_EQ(((uint8_t *)&m)[0], RNBD_MSG_SESS_INFO_RSP);
	CHECK_EQ(rnbd_sess_info_decode(&m, sizeof(m), true, &ver, &why), 0);
	CHECK_EQ(ver, 7);
	CHECK_EQ(rnbd_sess_info_decode(&m, sizeof(m) - 1, true, &ver, &why), -EMSGSIZE);
	m.ver = 0;
	CHECK_EQ(rnbd_sess_info_decode(&m, sizeof(m), true, &ver, &why), -EPROTONOSUPPORT);
	CHECK(why && strstr(why, "version 0"), "%s", why);
}

static void test_msg_type(void)
{
	uint8_t b[4] = { 0 };
	const char *why = NULL;

	for (unsigned t = 0; t <= RNBD_MSG_CLOSE; t++) {
		put16(b, (uint16_t)t);
		CHECK_EQ(rnbd_msg_type(b, sizeof(b), &why), t);
	}
	put16(b, 6);
	CHECK_EQ(rnbd_msg_type(b, sizeof(b), &why), -EPROTO);
	put16(b, 0x100);
	CHECK_EQ(rnbd_msg_type(b, sizeof(b), &why), -EPROTO);
	CHECK_EQ(rnbd_msg_type(b, 3, &why), -EMSGSIZE);
	CHECK_EQ(rnbd_msg_type(b, 0, &why), -EMSGSIZE);
}

static void test_dev_names(void)
{
	static const char *const good[] = {
		"disk.img", "/dev/sdb", "a//b", "//a", "a/", "..a", "a..", ".hidden", "a/.b/c",
		"with space", "x/.../y", "caf\xc3\xa9.img", "\xe2\x82\xac/\xf0\x9f\x92\xbe",
	};
	static const char *const bad[] = {
		"", "/", "//", ".", "..", "../etc/passwd", "a/../b", "a/..", "./a", "a/./b",
		"/..", "tab\there", "nl\n", "del\x7f",
		/* not UTF-8: Latin-1, a cut sequence, overlong '/', a surrogate, past U+10FFFF */
		"caf\xe9", "x\xc3", "a\xc0\xaf\x62", "\xed\xa0\x80", "\xf4\x90\x80\x80",
	};
	char longest[RNBD_DEV_NAME_MAX + 1];
	const char *why;

	for (unsigned i = 0; i < ARRAY_SIZE(good); i++) {
		why = NULL;
		CHECK(rnbd_dev_name_valid(good[i], &why), "\"%s\": %s", good[i], why);
	}
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++) {
		why = NULL;
		CHECK(!rnbd_dev_name_valid(bad[i], &why), "\"%s\" accepted", bad[i]);
		CHECK(why != NULL, "\"%s\" refused without a reason", bad[i]);
	}
	CHECK(!rnbd_dev_name_valid(NULL, &why));
	memset(longest, 'a', sizeof(longest));
	longest[RNBD_DEV_NAME_MAX - 1] = '\0';
	CHECK(rnbd_dev_name_valid(longest, &why), "254 bytes fit the field with its NUL");
	longest[RNBD_DEV_NAME_MAX - 1] = 'a';
	longest[RNBD_DEV_NAME_MAX] = '\0';
	CHECK(!rnbd_dev_name_valid(longest, &why), "255 bytes do not");
}

static void test_open(void)
{
	struct rnbd_open o = { .access_mode = RNBD_ACCESS_MIGRATION, .dev_name = "vm/disk0" }, d;
	struct rnbd_msg_open m;
	uint8_t want[264] = { 0 };
	const char *why = NULL;

	rnbd_open_encode(&m, &o);
	want[0] = RNBD_MSG_OPEN;
	want[4] = RNBD_ACCESS_MIGRATION;
	memcpy(want + 6, "vm/disk0", 8);
	CHECK(!memcmp(&m, want, sizeof(want)), "OPEN bytes");
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), 0);
	CHECK_EQ(d.access_mode, RNBD_ACCESS_MIGRATION);
	CHECK(!strcmp(d.dev_name, "vm/disk0"));

	CHECK_EQ(rnbd_open_decode(&m, sizeof(m) - 1, &d, &why), -EMSGSIZE);
	m.access_mode = 3;
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), -EINVAL);
	CHECK(why && strstr(why, "access mode"), "%s", why);
	m.access_mode = RNBD_ACCESS_RO;
	memset(m.dev_name, 'x', sizeof(m.dev_name));
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), -EINVAL);
	CHECK(why && strstr(why, "terminated"), "%s", why);
	memset(m.dev_name, 0, sizeof(m.dev_name));
	memcpy(m.dev_name, "a/../../etc/shadow", 18);
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), -EINVAL);
	CHECK(why && strstr(why, ".."), "%s", why);
	memset(m.dev_name, 0, sizeof(m.dev_name));
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), -EINVAL);
	/* Another type in the header. */
	rnbd_open_encode(&m, &o);
	put16((uint8_t *)&m, RNBD_MSG_CLOSE);
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), -EPROTO);
	/* A name of 254 bytes survives; a longer one is cut to 254 by the encoder. */
	memset(o.dev_name, 'n', sizeof(o.dev_name));
	o.dev_name[RNBD_DEV_NAME_MAX - 1] = '\0';
	rnbd_open_encode(&m, &o);
	CHECK_EQ(rnbd_open_decode(&m, sizeof(m), &d, &why), 0);
	CHECK_EQ(strlen(d.dev_name), RNBD_DEV_NAME_MAX - 1);
}

static struct rnbd_open_rsp good_rsp(void)
{
	return (struct rnbd_open_rsp){
		.device_id = 0x01020304, .nsectors = 1u << 21, .max_hw_sectors = 256,
		.max_write_zeroes_sectors = 65535, .max_discard_sectors = 65535,
		.discard_granularity = 4096, .discard_alignment = 0,
		.physical_block_size = 4096, .logical_block_size = 512, .max_segments = 1,
		.secure_discard = 0, .cache_policy = RNBD_WRITEBACK | RNBD_FUA,
	};
}

/* Field by field: the struct has padding, which memcmp would compare too. */
static bool rsp_equal(const struct rnbd_open_rsp *a, const struct rnbd_open_rsp *b)
{
	return a->device_id == b->device_id && a->nsectors == b->nsectors &&
	       a->max_hw_sectors == b->max_hw_sectors &&
	       a->max_write_zeroes_sectors == b->max_write_zeroes_sectors &&
	       a->max_discard_sectors == b->max_discard_sectors &&
	       a->discard_granularity == b->discard_granularity &&
	       a->discard_alignment == b->discard_alignment &&
	       a->physical_block_size == b->physical_block_size &&
	       a->logical_block_size == b->logical_block_size &&
	       a->max_segments == b->max_segments && a->secure_discard == b->secure_discard &&
	       a->cache_policy == b->cache_policy;
}

static void test_open_rsp(void)
{
	struct rnbd_open_rsp r = good_rsp(), d;
	struct rnbd_msg_open_rsp m;
	uint8_t want[56] = { 0 };
	const char *why = NULL;

	rnbd_open_rsp_encode(&m, &r);
	want[0] = RNBD_MSG_OPEN_RSP;
	put32(want + 4, r.device_id);
	put64(want + 8, r.nsectors);
	put32(want + 16, 256);
	put32(want + 20, 65535);
	put32(want + 24, 65535);
	put32(want + 28, 4096);
	put32(want + 32, 0);
	put16(want + 36, 4096);
	put16(want + 38, 512);
	put16(want + 40, 1);
	put16(want + 42, 0);
	want[45] = RNBD_WRITEBACK | RNBD_FUA;
	CHECK(!memcmp(&m, want, sizeof(want)), "OPEN_RSP bytes at the kernel's offsets");
	CHECK_EQ(rnbd_open_rsp_decode(&m, sizeof(m), &d, &why), 0);
	CHECK(rsp_equal(&d, &r), "OPEN_RSP round trip");
	CHECK_EQ(rnbd_open_rsp_decode(&m, sizeof(m) - 1, &d, &why), -EMSGSIZE);

#define BAD_RSP(field, value, what)                                                   \
	do {                                                                          \
		struct rnbd_open_rsp bad_ = good_rsp();                                 \
		bad_.field = (value);                                                   \
		rnbd_open_rsp_encode(&m, &bad_);                                        \
		why = NULL;                                                           \
		CHECK_EQ(rnbd_open_rsp_decode(&m, sizeof(m), &d, &why), -EINVAL);     \
		CHECK(why && strstr(why, what), "%s = %llu: %s", #field,              \
		      (unsigned long long)(value), why ? why : "(none)");             \
	} while (0)
	BAD_RSP(logical_block_size, 0, "logical block size");
	BAD_RSP(logical_block_size, 256, "logical block size");
	BAD_RSP(logical_block_size, 768, "logical block size");
	BAD_RSP(physical_block_size, 0, "physical block size");
	BAD_RSP(physical_block_size, 3000, "physical block size");
	BAD_RSP(physical_block_size, 256, "physical block size");
	BAD_RSP(nsectors, UINT64_MAX, "size");
	BAD_RSP(max_hw_sectors, 0, "largest IO");
	BAD_RSP(discard_granularity, 100, "discard");
	BAD_RSP(discard_alignment, 4096, "discard");
	BAD_RSP(cache_policy, 4, "cache policy");
	{
		struct rnbd_open_rsp b = good_rsp();

		b.logical_block_size = 4096;
		b.nsectors = 9; /* not whole 4 KiB blocks */
		rnbd_open_rsp_encode(&m, &b);
		CHECK_EQ(rnbd_open_rsp_decode(&m, sizeof(m), &d, &why), -EINVAL);
		b.nsectors = 16;
		b.max_hw_sectors = 7; /* smaller than one 4 KiB block */
		rnbd_open_rsp_encode(&m, &b);
		CHECK_EQ(rnbd_open_rsp_decode(&m, sizeof(m), &d, &why), -EINVAL);
		/* Without discard, its granularity is not looked at. */
		b = good_rsp();
		b.max_discard_sectors = 0;
		b.discard_granularity = 100;
		rnbd_open_rsp_encode(&m, &b);
		CHECK_EQ(rnbd_open_rsp_decode(&m, sizeof(m), &d, &why), 0);
	}
}

/*
 * The IO rules, written out independently: is (op, flags, bi_size,
 * data_len) a valid request?
 */
static bool io_ok(unsigned op, uint32_t flags, uint32_t bi_size, uint32_t data_len)
{
	bool data = op == RNBD_OP_READ || op == RNBD_OP_WRITE;

	if (op > 5 || (flags & ~0xf00u) || bi_size % 512)
		return false;
	if ((flags & RNBD_F_NOUNMAP) && op != RNBD_OP_WRITE_ZEROES)
		return false;
	if (op == RNBD_OP_READ && (flags & (RNBD_F_FUA | RNBD_F_PREFLUSH)))
		return false;
	if (data ? data_len != bi_size : data_len != 0)
		return false;
	if (op == RNBD_OP_READ)
		return bi_size > 0;
	if (op == RNBD_OP_WRITE)
		return bi_size > 0 || (flags & (RNBD_F_FUA | RNBD_F_PREFLUSH));
	if (op == RNBD_OP_FLUSH)
		return bi_size == 0;
	return bi_size > 0;
}

static void test_io(void)
{
	static const uint32_t sizes[] = { 0, 512, 4096, 1000, 1u << 20 };
	struct rnbd_io io = { .device_id = 9, .sector = 0x123456789aull, .op = RNBD_OP_WRITE,
			      .flags = RNBD_F_FUA | RNBD_F_SYNC, .bi_size = 8192, .prio = 0x4003 },
		      d;
	struct rnbd_msg_io m;
	uint8_t want[32] = { 0 };
	const char *why = NULL;
	unsigned combos = 0;

	rnbd_io_encode(&m, &io);
	want[0] = RNBD_MSG_IO;
	put32(want + 4, 9);
	put64(want + 8, 0x123456789aull);
	put32(want + 16, RNBD_OP_WRITE | RNBD_F_FUA | RNBD_F_SYNC);
	put32(want + 20, 8192);
	put16(want + 24, 0x4003);
	CHECK(!memcmp(&m, want, sizeof(want)), "IO bytes at the kernel's offsets");
	CHECK_EQ(rnbd_io_decode(&m, sizeof(m), 2, 8192, &d, &why), 0);
	CHECK(d.device_id == 9 && d.sector == io.sector && d.op == io.op && d.flags == io.flags &&
	      d.bi_size == 8192 && d.prio == 0x4003, "IO round trip");
	/* prio from version 2 on, and only when sent. */
	CHECK_EQ(rnbd_io_decode(&m, sizeof(m), 1, 8192, &d, &why), 0);
	CHECK_EQ(d.prio, 0);
	CHECK_EQ(rnbd_io_decode(&m, RNBD_MSG_IO_V1_LEN, 2, 8192, &d, &why), 0);
	CHECK_EQ(d.prio, 0);
	CHECK_EQ(rnbd_io_decode(&m, RNBD_MSG_IO_V1_LEN - 1, 2, 8192, &d, &why), -EMSGSIZE);

	/* Every op (and two beyond), every flag set (and one unknown bit), sizes, data. */
	for (unsigned op = 0; op < 8; op++) {
		for (uint32_t f = 0; f < 32; f++) {
			uint32_t flags = (f & 15) << RNBD_OP_BITS | (f & 16 ? 1u << 12 : 0);

			for (unsigned s = 0; s < ARRAY_SIZE(sizes); s++) {
				for (unsigned dl = 0; dl < 3; dl++) {
					uint32_t data_len = dl == 0 ? 0 : dl == 1 ? sizes[s] : 512;
					bool want_ok = io_ok(op, flags, sizes[s], data_len);
					int rc;

					put32((uint8_t *)&m + 16, op | flags);
					put32((uint8_t *)&m + 20, sizes[s]);
					why = NULL;
					rc = rnbd_io_decode(&m, sizeof(m), 2, data_len, &d, &why);
					CHECK(want_ok ? rc == 0 : rc == -EINVAL,
					      "op %u flags 0x%x size %u data %u: %d (%s)", op, flags,
					      sizes[s], data_len, rc, why ? why : "");
					CHECK(rc == 0 || why != NULL);
					combos++;
				}
			}
		}
	}
	CHECK_EQ(combos, 8 * 32 * 5 * 3);

	/* The byte range must fit 64 bits. */
	io = (struct rnbd_io){ .op = RNBD_OP_DISCARD, .bi_size = 512,
			       .sector = (UINT64_MAX >> RNBD_SECTOR_SHIFT) - 1 };
	rnbd_io_encode(&m, &io);
	CHECK_EQ(rnbd_io_decode(&m, sizeof(m), 2, 0, &d, &why), 0);
	io.sector++;
	rnbd_io_encode(&m, &io);
	CHECK_EQ(rnbd_io_decode(&m, sizeof(m), 2, 0, &d, &why), -EINVAL);
	io.sector = UINT64_MAX;
	rnbd_io_encode(&m, &io);
	CHECK_EQ(rnbd_io_decode(&m, sizeof(m), 2, 0, &d, &why), -EINVAL);
	/*
	 * A flush names no range: the kernel's client sends its block layer's
	 * flush requests with sector (sector_t)-1 (seen from mkfs.ext4's
	 * fsync); it reads as sector 0.
	 */
	io = (struct rnbd_io){ .op = RNBD_OP_FLUSH, .flags = RNBD_F_PREFLUSH | RNBD_F_SYNC,
			       .sector = UINT64_MAX };
	rnbd_io_encode(&m, &io);
	CHECK_EQ(rnbd_io_decode(&m, sizeof(m), 2, 0, &d, &why), 0);
	CHECK(d.op == RNBD_OP_FLUSH && d.sector == 0, "a flush at sector -1");
}

static void test_close(void)
{
	struct rnbd_msg_close m;
	uint8_t want[8] = { RNBD_MSG_CLOSE, 0, 0, 0, 0x78, 0x56, 0x34, 0x12 };
	const char *why = NULL;
	uint32_t id = 0;

	rnbd_close_encode(&m, 0x12345678);
	CHECK(!memcmp(&m, want, sizeof(want)), "CLOSE bytes");
	CHECK_EQ(rnbd_close_decode(&m, sizeof(m), &id, &why), 0);
	CHECK_EQ(id, 0x12345678);
	CHECK_EQ(rnbd_close_decode(&m, 7, &id, &why), -EMSGSIZE);
}

static void test_access(void)
{
	for (unsigned w = 0; w < 4; w++) {
		CHECK_EQ(rnbd_access_admit(RNBD_ACCESS_RO, w), 0);
		CHECK_EQ(rnbd_access_admit(RNBD_ACCESS_RW, w), w == 0 ? 0 : -EPERM);
		CHECK_EQ(rnbd_access_admit(RNBD_ACCESS_MIGRATION, w), w < 2 ? 0 : -EPERM);
	}
	CHECK_EQ(rnbd_access_admit((enum rnbd_access_mode)3, 0), -EINVAL);
	/* A second rw map is refused; rw then migration gives two writers, no third. */
	CHECK_EQ(rnbd_access_admit(RNBD_ACCESS_RW, 1), -EPERM);
	CHECK_EQ(rnbd_access_admit(RNBD_ACCESS_MIGRATION, 1), 0);
	CHECK_EQ(rnbd_access_admit(RNBD_ACCESS_MIGRATION, 2), -EPERM);
}

static void test_names(void)
{
	CHECK(!strcmp(rnbd_op_name(RNBD_OP_WRITE_ZEROES), "write zeroes"));
	CHECK(!strcmp(rnbd_op_name((enum rnbd_io_op)9), "unknown"));
	CHECK(!strcmp(rnbd_access_mode_name(RNBD_ACCESS_MIGRATION), "migration"));
	CHECK(!strcmp(rnbd_access_mode_name((enum rnbd_access_mode)3), "unknown"));
}

/* Reads what fd holds, up to 63 bytes. */
static const char *fd_text(int fd)
{
	static char buf[64];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		perror(path);
		exit(1);
	}
	fputs(text, f);
	fclose(f);
}

/*
 * Neither a file nor a block device: refused before anything is opened. A
 * FIFO shows it: its reader sees POLLHUP once a writer has opened it and
 * gone, and an open for writing of the FIFO that was then refused by type
 * would leave exactly that behind. A character device (root can make one:
 * /dev/null's numbers) is refused the same way.
 */
static void test_not_opened(const char *root)
{
	const char *why = NULL;
	char p[512];
	struct pollfd pfd;
	int fd = -1, reader;

	snprintf(p, sizeof(p), "%s/fifo", root);
	CHECK_EQ(mkfifo(p, 0600), 0);
	reader = open(p, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	CHECK(reader >= 0, "%s: %s", p, strerror(errno));
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(rnbd_dev_open(root, "fifo", i ? O_RDWR : O_WRONLY, &fd, &why), -ENOTBLK);
		CHECK(why && strstr(why, "not a file or block device"), "%s", why ? why : "");
		CHECK_EQ(fd, -1);
	}
	pfd = (struct pollfd){ .fd = reader, .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, 0), 0); /* no writer ever came and went */
	CHECK(!(pfd.revents & POLLHUP), "the refused FIFO was opened for writing");
	close(reader);

	snprintf(p, sizeof(p), "%s/chr", root);
	if (geteuid() == 0 && mknod(p, S_IFCHR | 0600, makedev(1, 3)) == 0) {
		CHECK_EQ(rnbd_dev_open(root, "chr", O_RDWR, &fd, &why), -ENOTBLK);
		CHECK_EQ(fd, -1);
	} else {
		fprintf(stderr, "test-rnbd-proto: no character device test (needs root)\n");
	}
}

static void test_paths(void)
{
	const char *top = test_tmpdir("/tmp", "rnbd-path-test");
	char root[256], p[512], search[300];
	const char *why;
	int fd = -1;

	CHECK(top != NULL);
	if (!top)
		return;
	/* top/outside (not exported), top/exp/s1/{disk,sub/d2}, and links. */
	snprintf(p, sizeof(p), "%s/outside", top);
	write_file(p, "secret");
	snprintf(p, sizeof(p), "%s/exp", top);
	mkdir(p, 0700);
	snprintf(p, sizeof(p), "%s/exp/s1", top);
	mkdir(p, 0700);
	snprintf(p, sizeof(p), "%s/exp/s1/sub", top);
	mkdir(p, 0700);
	snprintf(p, sizeof(p), "%s/exp/s1/disk", top);
	write_file(p, "disk one");
	snprintf(p, sizeof(p), "%s/exp/s1/sub/d2", top);
	write_file(p, "disk two");
	snprintf(p, sizeof(p), "%s/exp/s1/abs-out", top);
	CHECK_EQ(symlink("/etc/passwd", p), 0);
	snprintf(p, sizeof(p), "%s/exp/s1/rel-out", top);
	CHECK_EQ(symlink("../../outside", p), 0);
	snprintf(p, sizeof(p), "%s/exp/s1/in-link", top);
	CHECK_EQ(symlink("sub/d2", p), 0);
	snprintf(p, sizeof(p), "%s/exp/s1/up-and-in", top);
	CHECK_EQ(symlink("sub/../disk", p), 0);

	/* %SESSNAME% gives each session its own directory. */
	snprintf(search, sizeof(search), "%s/exp/%%SESSNAME%%", top);
	CHECK_EQ(rnbd_search_root(search, "s1", root, sizeof(root), &why), 0);
	snprintf(p, sizeof(p), "%s/exp/s1", top);
	CHECK(!strcmp(root, p), "%s", root);
	CHECK_EQ(rnbd_search_root("/a/%SESSNAME%/b/%SESSNAME%", "x", p, sizeof(p), &why), 0);
	CHECK(!strcmp(p, "/a/x/b/x"), "%s", p);
	CHECK_EQ(rnbd_search_root("/plain", NULL, p, sizeof(p), &why), 0);
	CHECK(!strcmp(p, "/plain"));
	CHECK_EQ(rnbd_search_root(search, "a/b", p, sizeof(p), &why), -EINVAL);
	CHECK_EQ(rnbd_search_root(search, "..", p, sizeof(p), &why), -EINVAL);
	CHECK_EQ(rnbd_search_root(search, "", p, sizeof(p), &why), -EINVAL);
	CHECK_EQ(rnbd_search_root("", "s1", p, sizeof(p), &why), -EINVAL);
	CHECK_EQ(rnbd_search_root(search, "s1", p, 10, &why), -ENAMETOOLONG);

	/* Names inside the root open, with or without leading and doubled slashes. */
	static const struct { const char *name, *text; } ok[] = {
		{ "disk", "disk one" }, { "/disk", "disk one" }, { "sub//d2", "disk two" },
		{ "//sub/d2", "disk two" }, { "in-link", "disk two" }, { "up-and-in", "disk one" },
	};
	for (unsigned i = 0; i < ARRAY_SIZE(ok); i++) {
		why = NULL;
		fd = -1;
		CHECK_EQ(rnbd_dev_open(root, ok[i].name, O_RDONLY, &fd, &why), 0);
		if (fd >= 0) {
			CHECK(!strcmp(fd_text(fd), ok[i].text), "%s: %s", ok[i].name, fd_text(fd));
			close(fd);
		}
	}
	/* Escapes: refused by name, or by the lookup (symlinks). */
	static const struct { const char *name; int err; } bad[] = {
		{ "../outside", -EINVAL }, { "sub/../../outside", -EINVAL }, { "..", -EINVAL },
		{ ".", -EINVAL }, { "/", -EINVAL }, { "", -EINVAL },
		{ "abs-out", -EACCES }, { "rel-out", -EACCES }, { "missing", -ENOENT },
	};
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++) {
		why = NULL;
		fd = -1;
		CHECK_EQ(rnbd_dev_open(root, bad[i].name, O_RDONLY, &fd, &why), bad[i].err);
		CHECK(why != NULL, "%s: no reason", bad[i].name);
		CHECK_EQ(fd, -1);
		if (fd >= 0)
			close(fd);
	}
	CHECK_EQ(rnbd_dev_open("/nonexistent-rnbd-root", "disk", O_RDONLY, &fd, &why), -ENOENT);
	test_not_opened(root);

	/* One device, one spelling. */
	static const char *const spell[][2] = {
		{ "/a//b/", "a/b" }, { "disk", "disk" }, { "//x", "x" }, { "a/b//", "a/b" },
	};
	for (unsigned i = 0; i < ARRAY_SIZE(spell); i++) {
		snprintf(p, sizeof(p), "%s", spell[i][0]);
		rnbd_dev_name_normalize(p);
		CHECK(!strcmp(p, spell[i][1]), "%s -> %s", spell[i][0], p);
	}
}

/*
 * A kernel rnbd-server before 7.0 drops PREFLUSH and NOUNMAP: PREFLUSH
 * becomes a FLUSH of its own first (a FLUSH needs none), NOUNMAP cannot go.
 * Its block layer (Linux 6.3 on) fails FUA on anything but a write or a
 * flush: FUA comes off a discard, secure erase or write zeroes, and a FLUSH
 * goes after it.
 */
static void test_io_for_kernel(void)
{
	static const enum rnbd_io_op ops[] = { RNBD_OP_WRITE, RNBD_OP_DISCARD,
					       RNBD_OP_SECURE_ERASE, RNBD_OP_WRITE_ZEROES };
	uint32_t flags;
	bool first, after;

	for (size_t i = 0; i < ARRAY_SIZE(ops); i++) {
		bool write = ops[i] == RNBD_OP_WRITE;

		flags = RNBD_F_PREFLUSH | RNBD_F_FUA;
		first = after = false;
		CHECK_EQ(rnbd_io_for_kernel(ops[i], &flags, &first, &after), 0);
		CHECK(first, "%s: a FLUSH first", rnbd_op_name(ops[i]));
		CHECK(after == !write, "%s: a FLUSH after: %d", rnbd_op_name(ops[i]), after);
		CHECK_EQ(flags, write ? RNBD_F_FUA : 0);
		flags = RNBD_F_FUA;
		CHECK_EQ(rnbd_io_for_kernel(ops[i], &flags, &first, &after), 0);
		CHECK(!first && after == !write && flags == (write ? RNBD_F_FUA : 0u));
		flags = 0;
		CHECK_EQ(rnbd_io_for_kernel(ops[i], &flags, &first, &after), 0);
		CHECK(!first && !after && flags == 0);
	}
	flags = RNBD_F_PREFLUSH | RNBD_F_FUA;
	first = after = true;
	CHECK_EQ(rnbd_io_for_kernel(RNBD_OP_FLUSH, &flags, &first, &after), 0);
	CHECK(!first && !after && flags == RNBD_F_FUA, "a FLUSH is one: no second");
	flags = 0;
	CHECK_EQ(rnbd_io_for_kernel(RNBD_OP_READ, &flags, &first, &after), 0);
	CHECK(!first && !after && flags == 0);
	flags = RNBD_F_NOUNMAP;
	CHECK_EQ(rnbd_io_for_kernel(RNBD_OP_WRITE_ZEROES, &flags, &first, &after), -EOPNOTSUPP);
	flags = RNBD_F_NOUNMAP | RNBD_F_PREFLUSH;
	CHECK_EQ(rnbd_io_for_kernel(RNBD_OP_WRITE_ZEROES, &flags, &first, &after), -EOPNOTSUPP);
}

/* The access file (lib/rnbd/rnbd-access.c): what a text grants, and each refusal with its line. */
static void test_access_file(void)
{
	static const char text[] =
		"# host   what it may use\n"
		"\n"
		"  host-a sessions=a-*,shared rw=a.img ro=images/*\r\n"
		"host-b\tsessions=b-1 migration=vm/*\n"
		"host-a rw=extra/x.img\n"
		"* ro=pub/*";
	static const struct { const char *text, *why; } bad[] = {
		{ "host-a rw\n", ":1: a field is not kind=patterns" },
		{ "# c\nhost-a wr=x\n", ":2: unknown kind" },
		{ "host-a\n", ":1: a host with nothing granted" },
		{ "host-a rw=a,,b\n", ":1: an empty pattern" },
		{ "host-a rw=\n", ":1: an empty pattern" },
		{ "host-a rw=a,\n", ":1: an empty pattern" },
		{ "host-a rw=/a.img\n", ":1: a device pattern starting with '/'" },
		{ "ok ro=x\nhost-a ro=x\x01\n", ":2: a control character" },
		{ "rw=vm/* ro=images/*\n", ":1: a host name with '='" },
		{ "hv* ro=x\n", ":1: a host name with '*'" },
		{ "h\xc3\xa9 ro=x\n", ":1: a host name with a byte" },
		{ "h ro=images/[ab\n", ":1: a pattern with a '[' not closed" },
		{ "h ro=a,images\\\n", ":1: a pattern with a '[' not closed by ']' or a '\\' at" },
	};
	struct rnbd_access *a = NULL;
	char err[256], big[300];
	int rc;

	rc = rnbd_access_parse(text, strlen(text), "acc", &a, err, sizeof(err));
	CHECK(rc == 0 && a, "%s", err);
	if (!a)
		return;
	/* Sets and escapes that fnmatch reads as written pass. */
	{
		struct rnbd_access *b = NULL;
		static const char sets[] = "h ro=[]a]q,[!x]y,[^x]z,a\\*b,[a-c]\n";

		rc = rnbd_access_parse(sets, strlen(sets), "acc", &b, err, sizeof(err));
		CHECK(rc == 0 && b, "%s", err);
		CHECK(b && rnbd_access_device(b, "h", "]q", RNBD_ACCESS_RO), "a ']' first in a set");
		CHECK(b && rnbd_access_device(b, "h", "a*b", RNBD_ACCESS_RO), "an escaped '*'");
		CHECK(b && !rnbd_access_device(b, "h", "axb", RNBD_ACCESS_RO), "... is no wildcard");
		rnbd_access_free(b);
	}
	CHECK_EQ(rnbd_access_lines(a), 4);
	CHECK(rnbd_access_session(a, "host-a", "a-1"));
	CHECK(rnbd_access_session(a, "host-a", "shared"));
	CHECK(!rnbd_access_session(a, "host-a", "b-1"), "another host's name");
	CHECK(!rnbd_access_session(a, "host-a", "shared2"), "a pattern matches whole names");
	CHECK(rnbd_access_session(a, "host-b", "b-1"));
	CHECK(!rnbd_access_session(a, "host-b", "b-2"));
	CHECK(!rnbd_access_session(a, "host-c", "a-1"), "a host no line names");
	CHECK(!rnbd_access_session(a, "host-c", "x"), "the * line grants no session name");
	/* Modes: ro < rw < migration. */
	CHECK(rnbd_access_device(a, "host-a", "a.img", RNBD_ACCESS_RO));
	CHECK(rnbd_access_device(a, "host-a", "a.img", RNBD_ACCESS_RW));
	CHECK(!rnbd_access_device(a, "host-a", "a.img", RNBD_ACCESS_MIGRATION));
	CHECK(rnbd_access_device(a, "host-a", "images/base", RNBD_ACCESS_RO));
	CHECK(rnbd_access_device(a, "host-a", "images/x/y", RNBD_ACCESS_RO), "* matches /");
	CHECK(!rnbd_access_device(a, "host-a", "images/base", RNBD_ACCESS_RW));
	CHECK(rnbd_access_device(a, "host-a", "extra/x.img", RNBD_ACCESS_RW), "lines add up");
	CHECK(!rnbd_access_device(a, "host-a", "b.img", RNBD_ACCESS_RO));
	CHECK(rnbd_access_device(a, "host-b", "vm/1", RNBD_ACCESS_MIGRATION));
	CHECK(rnbd_access_device(a, "host-b", "vm/1", RNBD_ACCESS_RO));
	CHECK(!rnbd_access_device(a, "host-b", "a.img", RNBD_ACCESS_RO));
	CHECK(rnbd_access_device(a, "host-c", "pub/doc", RNBD_ACCESS_RO), "the * line");
	CHECK(rnbd_access_device(a, "host-a", "pub/doc", RNBD_ACCESS_RO), "the * line adds up");
	CHECK(!rnbd_access_device(a, "host-c", "pub/doc", RNBD_ACCESS_RW));
	rnbd_access_free(a);
	/* No rules (a file that could not be read): nothing. */
	CHECK(!rnbd_access_session(NULL, "host-a", "a-1"));
	CHECK(!rnbd_access_device(NULL, "host-a", "a.img", RNBD_ACCESS_RO));

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		a = NULL;
		err[0] = '\0';
		rc = rnbd_access_parse(bad[i].text, strlen(bad[i].text), "acc", &a, err, sizeof(err));
		CHECK(rc == -EINVAL && !a && !strncmp(err, "acc", 3) && strstr(err, bad[i].why),
		      "%zu: rc %d, \"%s\", want \"%s\"", i, rc, err, bad[i].why);
		rnbd_access_free(a);
	}
	rc = rnbd_access_parse("h ro=x\0y\n", 9, "acc", &a, err, sizeof(err));
	CHECK(rc == -EINVAL && strstr(err, "a NUL byte"), "%s", err);
	memset(big, 'h', sizeof(big));
	memcpy(big + 224, " ro=x", 6);
	rc = rnbd_access_parse(big, 229, "acc", &a, err, sizeof(err));
	CHECK(rc == -EINVAL && strstr(err, ":1: a host name longer than 223 bytes"), "%s", err);
	rc = rnbd_access_parse("", 0, "acc", &a, err, sizeof(err));
	CHECK(rc == 0 && a && rnbd_access_lines(a) == 0, "an empty file grants nothing");
	rnbd_access_free(a);
	rc = rnbd_access_load("/nonexistent/acc", &a, err, sizeof(err));
	CHECK(rc == -ENOENT && strstr(err, "/nonexistent/acc: "), "%s", err);
	rc = rnbd_access_load("/", &a, err, sizeof(err));
	CHECK(rc == -EINVAL && strstr(err, "not a regular file"), "%s", err);
}

int main(void)
{
	test_io_for_kernel();
	test_version();
	test_msg_type();
	test_sess_info();
	test_dev_names();
	test_open();
	test_open_rsp();
	test_io();
	test_close();
	test_access();
	test_names();
	test_paths();
	test_access_file();
	return test_done("rnbd-proto");
}
