/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the RTRS wire codec (lib/rtrs/rtrs-proto.c).
 *
 * Every rejection is produced by changing one field of a message that the
 * test first proves is accepted, so an errno check cannot pass because some
 * other field happened to be wrong. Decoders are fed heap copies of exactly
 * the advertised length, so that under ASan a decoder reading past its
 * input fails the test instead of reading the rest of a stack struct.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "rtrs-proto.h"

/* ---- helpers ------------------------------------------------------------ */

/*
 * Runs a decoder call twice: first with a reason pointer, which must come
 * back set, then with why == NULL, which must give the same errno and not
 * crash. The call names its why argument WHY.
 */
#define CHECK_REJECT(expect, call)                                                 \
	do {                                                                       \
		const char *why_ = NULL;                                           \
		const char **WHY = &why_;                                          \
		int rc_ = (call);                                                  \
		CHECK(rc_ == (expect), "%s = %d (%s), want %d", #call, rc_,        \
		      why_ ? why_ : "no reason", (int)(expect));                   \
		CHECK(why_ != NULL && why_[0] != '\0', "%s: no reason set", #call); \
		WHY = NULL;                                                        \
		rc_ = (call);                                                      \
		CHECK(rc_ == (expect), "%s (why=NULL) = %d, want %d", #call, rc_,  \
		      (int)(expect));                                              \
	} while (0)

/* A decoder call that must succeed; prints the reason if it does not. */
#define CHECK_ACCEPT(call)                                                         \
	do {                                                                       \
		const char *why_ = NULL;                                           \
		const char **WHY = &why_;                                          \
		int rc_ = (call);                                                  \
		CHECK(rc_ == 0, "%s = %d (%s)", #call, rc_, why_ ? why_ : "-");    \
	} while (0)

static void *dup_exact(const void *p, size_t len)
{
	/* malloc(0) may return NULL; one spare byte the decoder must not need. */
	void *b = malloc(len ? len : 1);

	if (!b) {
		perror("malloc");
		exit(1);
	}
	if (len)
		memcpy(b, p, len);
	return b;
}

static int conn_req_dec(const void *m, size_t len, struct rtrs_conn_req *out, const char **why)
{
	void *b = dup_exact(m, len);
	int rc = rtrs_conn_req_decode(b, len, out, why);

	free(b);
	return rc;
}

static int conn_rsp_dec(const void *m, size_t len, struct rtrs_conn_rsp *out, const char **why)
{
	void *b = dup_exact(m, len);
	int rc = rtrs_conn_rsp_decode(b, len, out, why);

	free(b);
	return rc;
}

static int info_req_dec_ext(const void *m, size_t len, bool ext, struct rtrs_info_req *out,
			    const char **why)
{
	void *b = dup_exact(m, len);
	int rc = rtrs_info_req_decode(b, len, ext, out, why);

	free(b);
	return rc;
}

static int info_req_dec(const void *m, size_t len, struct rtrs_info_req *out, const char **why)
{
	return info_req_dec_ext(m, len, true, out, why);
}

static int info_rsp_dec_verdict(const void *m, size_t len, const struct rtrs_limits *lim,
				struct rtrs_desc *chunks, int *verdict, bool *dnr, const char **why)
{
	void *b = dup_exact(m, len);
	uint32_t gens[16];
	int rc;

	rc = rtrs_info_rsp_decode(b, len, lim, chunks, gens, verdict, dnr, why);
	free(b);
	return rc;
}

static int info_rsp_dec(const void *m, size_t len, const struct rtrs_limits *lim,
			struct rtrs_desc *chunks, const char **why)
{
	int verdict, rc;
	bool dnr;

	rc = info_rsp_dec_verdict(m, len, lim, chunks, &verdict, &dnr, why);
	/* These tests send no verdicts: one showing up is a decoding bug. */
	return rc ? rc : verdict ? -EBADMSG : 0;
}

static int rkey_rsp_dec(const void *m, size_t len, uint32_t qd, uint32_t *buf_id,
			uint32_t *rkey, const char **why)
{
	void *b = dup_exact(m, len);
	int rc = rtrs_rkey_rsp_decode(b, len, qd, buf_id, rkey, why);

	free(b);
	return rc;
}

static uint16_t get16(const void *p, size_t off)
{
	const uint8_t *b = p;

	return (uint16_t)(b[off] | b[off + 1] << 8);
}

static uint32_t get32(const void *p, size_t off)
{
	return get16(p, off) | (uint32_t)get16(p, off + 2) << 16;
}

static uint64_t get64(const void *p, size_t off)
{
	return get32(p, off) | (uint64_t)get32(p, off + 4) << 32;
}

static void put16(void *p, size_t off, uint16_t v)
{
	uint8_t *b = p;

	b[off] = (uint8_t)v;
	b[off + 1] = (uint8_t)(v >> 8);
}

static void put32(void *p, size_t off, uint32_t v)
{
	put16(p, off, (uint16_t)v);
	put16(p, off + 2, (uint16_t)(v >> 16));
}

static void put64(void *p, size_t off, uint64_t v)
{
	put32(p, off, (uint32_t)v);
	put32(p, off + 4, (uint32_t)(v >> 32));
}

/* ---- conn_req ------------------------------------------------------------ */

static void good_conn_req(struct rtrs_conn_req *r)
{
	memset(r, 0, sizeof(*r));
	r->cid = 3;
	r->cid_num = 9;
	r->recon_cnt = 0xbeef;
	r->first_conn = true;
	for (int i = 0; i < RTRS_UUID_LEN; i++) {
		r->sess_uuid[i] = (uint8_t)(0x10 + i);
		r->paths_uuid[i] = (uint8_t)(0xf0 - i);
	}
}

static void test_conn_req(void)
{
	struct rtrs_msg_conn_req m;
	struct rtrs_conn_req in, out;
	const uint8_t *b = (const uint8_t *)&m;

	good_conn_req(&in);
	rtrs_conn_req_encode(&m, &in);

	/* Wire layout: the kernel's 56 bytes, its two RDMA CM bytes first and 0. */
	CHECK_EQ(sizeof(m), 56);
	CHECK_EQ(b[0], 0);
	CHECK_EQ(b[1], 0);
	CHECK_EQ(get16(&m, 2), 0x1BBD);
	CHECK_EQ(get16(&m, 4), 0x0200);
	CHECK_EQ(get16(&m, 6), 3);
	CHECK_EQ(get16(&m, 8), 9);
	CHECK_EQ(get16(&m, 10), 0xbeef);
	CHECK_EQ(b[12], 0x10);
	CHECK_EQ(b[27], 0x1f);
	CHECK_EQ(b[28], 0xf0);
	CHECK_EQ(b[43], 0xe1);
	/* A kernel client's request: first_conn alone in its flags byte. */
	CHECK_EQ(b[44], RTRS_CONN_FIRST);
	for (size_t i = 45; i < sizeof(m); i++)
		CHECK_EQ(b[i], 0);

	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.cid, 3);
	CHECK_EQ(out.cid_num, 9);
	CHECK_EQ(out.recon_cnt, 0xbeef);
	CHECK(out.first_conn);
	CHECK(!out.ext && !out.fence && !out.auth);
	CHECK(!memcmp(out.sess_uuid, in.sess_uuid, RTRS_UUID_LEN));
	CHECK(!memcmp(out.paths_uuid, in.paths_uuid, RTRS_UUID_LEN));

	/* Fence and auth are sent only with EXT: a kernel client sets no bit but the first. */
	in.fence = in.auth = true;
	rtrs_conn_req_encode(&m, &in);
	CHECK_EQ(b[44], RTRS_CONN_FIRST);
	in.ext = true;
	rtrs_conn_req_encode(&m, &in);
	CHECK_EQ(b[44], RTRS_CONN_FIRST | RTRS_CONN_EXT | RTRS_CONN_FENCE | RTRS_CONN_AUTH);
	CHECK_EQ(b[44], 0x0f);
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK(out.first_conn && out.ext && out.fence && out.auth);
	in.fence = false;
	rtrs_conn_req_encode(&m, &in);
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK(out.ext && !out.fence && out.auth);

	in.first_conn = false;
	in.ext = false;
	rtrs_conn_req_encode(&m, &in);
	CHECK_EQ(b[44], 0);
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK(!out.first_conn && !out.ext);

	/*
	 * Unknown flag bits are ignored, the known ones still read; FENCE and
	 * AUTH without EXT are a kernel client's reserved bits.
	 */
	m.flags = RTRS_CONN_FENCE | RTRS_CONN_AUTH | 0xf0;
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK(!out.first_conn && !out.ext && !out.fence && !out.auth);
	m.flags = 0xff;
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK(out.first_conn && out.ext && out.fence && out.auth);
	/* The CM bytes are the CM's (it writes them for AF_IB): not checked. */
	m.cma_version = 0x12;
	m.ip_version = 0x40;
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));

	/* Extremes of the connection count. */
	in.cid = 0;
	in.cid_num = 1;
	rtrs_conn_req_encode(&m, &in);
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.cid_num, 1);
	in.cid = RTRS_MAX_CONNS - 1;
	in.cid_num = RTRS_MAX_CONNS;
	rtrs_conn_req_encode(&m, &in);
	CHECK_ACCEPT(conn_req_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.cid, RTRS_MAX_CONNS - 1);

	/* A longer buffer is fine (an IB CM REQ holds 92 bytes): only the message is read. */
	{
		uint8_t big[92];

		memset(big, 0x5a, sizeof(big));
		memcpy(big, &m, sizeof(m));
		CHECK_ACCEPT(conn_req_dec(big, sizeof(big), &out, WHY));
		CHECK_EQ(out.cid, RTRS_MAX_CONNS - 1);
		CHECK(!out.ext, "the padding is not the flags");
	}

	/* Rejections, each one field away from an accepted message. */
	good_conn_req(&in);
	rtrs_conn_req_encode(&m, &in);
	CHECK_REJECT(-EMSGSIZE, conn_req_dec(&m, sizeof(m) - 1, &out, WHY));
	/* The old 54-byte layout (without the CM bytes), and nothing at all. */
	CHECK_REJECT(-EMSGSIZE, conn_req_dec(b + 2, 54, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, conn_req_dec(&m, 0, &out, WHY));
	{
		struct rtrs_msg_conn_req c = m;
		uint8_t shifted[56] = { 0 };

		/* The kernel's request read two bytes off: its first bytes are not the magic. */
		memcpy(shifted, b + 2, 54);
		CHECK_REJECT(-EPROTO, conn_req_dec(shifted, sizeof(shifted), &out, WHY));

		c.magic = le16_put(0xBD1B);
		CHECK_REJECT(-EPROTO, conn_req_dec(&c, sizeof(c), &out, WHY));
		c = m;
		c.version = le16_put(0x0300);
		CHECK_REJECT(-EPROTONOSUPPORT, conn_req_dec(&c, sizeof(c), &out, WHY));
		c.version = le16_put(0x0100);
		CHECK_REJECT(-EPROTONOSUPPORT, conn_req_dec(&c, sizeof(c), &out, WHY));
		/* Kernel convention: the minor version is informative only. */
		c.version = le16_put(0x0207);
		CHECK_ACCEPT(conn_req_dec(&c, sizeof(c), &out, WHY));
		c.version = le16_put(0x02ff);
		CHECK_ACCEPT(conn_req_dec(&c, sizeof(c), &out, WHY));

		c = m;
		c.cid = le16_put(0);
		c.cid_num = le16_put(0);
		CHECK_REJECT(-EINVAL, conn_req_dec(&c, sizeof(c), &out, WHY));
		c.cid_num = le16_put(RTRS_MAX_CONNS + 1);
		CHECK_REJECT(-EINVAL, conn_req_dec(&c, sizeof(c), &out, WHY));
		c.cid_num = le16_put(0xffff);
		CHECK_REJECT(-EINVAL, conn_req_dec(&c, sizeof(c), &out, WHY));
		c.cid_num = le16_put(9);
		c.cid = le16_put(9);
		CHECK_REJECT(-EINVAL, conn_req_dec(&c, sizeof(c), &out, WHY));
		c.cid = le16_put(0xffff);
		CHECK_REJECT(-EINVAL, conn_req_dec(&c, sizeof(c), &out, WHY));
	}
}

/* ---- conn_rsp ------------------------------------------------------------ */

static void good_conn_rsp(struct rtrs_conn_rsp *r)
{
	memset(r, 0, sizeof(*r));
	r->ext = true;
	r->queue_depth = 512;
	r->max_hdr_size = RTRS_MAX_HDR_SIZE;
	r->max_io_size = (128u << 10) - RTRS_MAX_HDR_SIZE;
	r->flags = RTRS_MSG_KEY64_F | RTRS_MSG_FENCE_F;
	r->imm_desc.addr = 0x123456789abcdef0ull;
	r->imm_desc.key = 0xdeadbeef;
	r->imm_desc.len = 64;
	r->sess_id = 0x0102030405060708ull;
}

/* Encodes an accept with the given sizes and decodes it. */
static int conn_rsp_try(unsigned qd, uint32_t io, uint32_t hdr, struct rtrs_conn_rsp *out,
			const char **why)
{
	struct rtrs_conn_rsp r;
	struct rtrs_msg_conn_rsp m;

	good_conn_rsp(&r);
	r.queue_depth = (uint16_t)qd;
	r.max_io_size = io;
	r.max_hdr_size = hdr;
	rtrs_conn_rsp_encode(&m, &r);
	return conn_rsp_dec(&m, sizeof(m), out, why);
}

/*
 * A reject's errno out of -4095..-1 trips the encoder's assertion (a 6.1
 * kernel client would take it for a pointer); without assertions it goes
 * out as -ECONNRESET. Run in a child: true when the encoder kept to that.
 */
static bool rej_errno_guarded(int err)
{
	struct rtrs_conn_rsp r = { .err = err };
	struct rtrs_msg_conn_rsp m;
	int status;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		/* The assertion's message would look like a failure in the test's log. */
		if (!freopen("/dev/null", "w", stderr))
			_exit(3);
		rtrs_conn_rsp_encode(&m, &r);
		_exit(get16(&m, 4) == (uint16_t)-ECONNRESET ? 0 : 2);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return false;
#ifdef NDEBUG
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
#else
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
#endif
}

static void test_conn_rsp(void)
{
	struct rtrs_msg_conn_rsp m;
	struct rtrs_conn_rsp in, out;
	const uint8_t *w = (const uint8_t *)&m;

	/* To a client of this project: the extension in the kernel's reserved bytes. */
	good_conn_rsp(&in);
	rtrs_conn_rsp_encode(&m, &in);
	CHECK_EQ(sizeof(m), 56);
	CHECK_EQ(get16(&m, 0), 0x1BBD);
	CHECK_EQ(get16(&m, 2), 0x0200);
	CHECK_EQ(get16(&m, 4), 0);
	CHECK_EQ(get16(&m, 6), 512);
	CHECK_EQ(get32(&m, 8), (128u << 10) - 4096);
	CHECK_EQ(get32(&m, 12), 4096);
	CHECK_EQ(get32(&m, 16), RTRS_MSG_KEY64_F | RTRS_MSG_FENCE_F | RTRS_MSG_EXT_F);
	CHECK(get64(&m, 20) == 0x123456789abcdef0ull);
	CHECK_EQ(get32(&m, 28), 0xdeadbeef);
	CHECK_EQ(get32(&m, 32), 64);
	CHECK(get64(&m, 36) == 0x0102030405060708ull);
	for (size_t i = 44; i < sizeof(m); i++)
		CHECK_EQ(w[i], 0);

	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(conn_rsp_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.err, 0);
	CHECK(out.ext);
	CHECK(!out.kernel_inval);
	CHECK_EQ(out.queue_depth, 512);
	CHECK_EQ(out.max_io_size, (128u << 10) - 4096);
	CHECK_EQ(out.max_hdr_size, 4096);
	CHECK_EQ(out.chunk_size, 128u << 10);
	CHECK_EQ(out.flags, RTRS_MSG_KEY64_F | RTRS_MSG_FENCE_F | RTRS_MSG_EXT_F);
	CHECK(out.imm_desc.addr == 0x123456789abcdef0ull);
	CHECK_EQ(out.imm_desc.key, 0xdeadbeef);
	CHECK_EQ(out.imm_desc.len, 64);
	CHECK(out.sess_id == 0x0102030405060708ull);

	/*
	 * To a kernel client: the kernel's answer byte for byte. Of the flags
	 * only bit 1 (its always_invalidate) can go; bytes 20..55 are zero.
	 */
	in.ext = false;
	in.flags = RTRS_MSG_FENCE_F | RTRS_MSG_AUTH_F | RTRS_MSG_DNR_F | RTRS_MSG_KEY64_F |
		   RTRS_MSG_EXT_F;
	rtrs_conn_rsp_encode(&m, &in);
	CHECK_EQ(get16(&m, 6), 512);
	CHECK_EQ(get32(&m, 16), 0);
	for (size_t i = 20; i < sizeof(m); i++)
		CHECK_EQ(w[i], 0);
	in.flags |= RTRS_MSG_NEW_RKEY_F;
	rtrs_conn_rsp_encode(&m, &in);
	CHECK_EQ(get32(&m, 16), RTRS_MSG_NEW_RKEY_F);
	for (size_t i = 20; i < sizeof(m); i++)
		CHECK_EQ(w[i], 0);

	/*
	 * A kernel server's REP as the pcap shows it: flags 0x2, zeros, and on
	 * IB/RoCE 196 bytes of private data. The padding is ignored; so are
	 * the reserved bytes and our flag bits without EXT.
	 */
	{
		uint8_t rep[196];

		memset(rep, 0, sizeof(rep));
		put16(rep, 0, 0x1BBD);
		put16(rep, 2, 0x0200);
		put16(rep, 6, 512);
		put32(rep, 8, 126976);
		put32(rep, 12, 4096);
		put32(rep, 16, 0x2);
		memset(rep + 56, 0x77, sizeof(rep) - 56);
		memset(&out, 0xaa, sizeof(out));
		CHECK_ACCEPT(conn_rsp_dec(rep, sizeof(rep), &out, WHY));
		CHECK(!out.ext && out.kernel_inval);
		CHECK_EQ(out.flags, RTRS_MSG_NEW_RKEY_F);
		CHECK_EQ(out.chunk_size, 128u << 10);
		CHECK(out.imm_desc.addr == 0 && out.imm_desc.key == 0 && out.imm_desc.len == 0);
		CHECK(out.sess_id == 0);
		CHECK_ACCEPT(conn_rsp_dec(rep, 56, &out, WHY));
		CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(rep, 55, &out, WHY));
		/* Bits and bytes a kernel reserves mean nothing without EXT. */
		put32(rep, 16, RTRS_MSG_FENCE_F | RTRS_MSG_AUTH_F | RTRS_MSG_KEY64_F);
		memset(rep + 20, 0x55, 36);
		CHECK_ACCEPT(conn_rsp_dec(rep, sizeof(rep), &out, WHY));
		CHECK(!out.ext && !out.kernel_inval);
		CHECK_EQ(out.flags, 0);
		CHECK(out.imm_desc.addr == 0 && out.imm_desc.key == 0 && out.sess_id == 0);
		put32(rep, 16, 0);
		CHECK_ACCEPT(conn_rsp_dec(rep, sizeof(rep), &out, WHY));
		CHECK(!out.ext && !out.kernel_inval);
	}

	/* Reject: 56 bytes, magic, version, errno and DNR; the rest zero. */
	memset(&in, 0, sizeof(in));
	in.err = -ECONNREFUSED;
	in.queue_depth = 77; /* must not reach the wire */
	in.ext = true;
	in.flags = RTRS_MSG_FENCE_F;
	rtrs_conn_rsp_encode(&m, &in);
	CHECK_EQ(get16(&m, 0), 0x1BBD);
	CHECK_EQ(get16(&m, 4), (uint16_t)-ECONNREFUSED);
	for (size_t i = 6; i < sizeof(m); i++)
		CHECK_EQ(w[i], 0);
	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(conn_rsp_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.err, -ECONNREFUSED);
	CHECK(!out.dnr);
	CHECK_EQ(out.queue_depth, 0);
	CHECK_EQ(out.chunk_size, 0);
	in.dnr = true;
	rtrs_conn_rsp_encode(&m, &in);
	CHECK_EQ(get32(&m, 16), RTRS_MSG_DNR_F);
	for (size_t i = 20; i < sizeof(m); i++)
		CHECK_EQ(w[i], 0);
	/* An IB CM pads a REJ to 148 bytes. */
	{
		uint8_t rej[148];

		memset(rej, 0x33, sizeof(rej));
		memcpy(rej, &m, sizeof(m));
		memset(&out, 0xaa, sizeof(out));
		CHECK_ACCEPT(conn_rsp_dec(rej, sizeof(rej), &out, WHY));
		CHECK_EQ(out.err, -ECONNREFUSED);
		CHECK(out.dnr);
	}
	/* Shorter than 56 bytes (the 20-byte reject of before, a CM's length byte eating one). */
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 55, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 20, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 6, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 4, &out, WHY));
	/* Errnos a reject may carry: -4095 .. -1, the range of an ERR_PTR. */
	put16(&m, 4, (uint16_t)-4095);
	CHECK_ACCEPT(conn_rsp_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.err, -4095);
	put16(&m, 4, 0xffff);
	CHECK_ACCEPT(conn_rsp_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(out.err, -1);
	/* What a CM's one-byte length header made of the kernel's reject: -23038. */
	put16(&m, 4, 0xa602);
	CHECK_REJECT(-EPROTO, conn_rsp_dec(&m, sizeof(m), &out, WHY));
	put16(&m, 4, (uint16_t)-4096);
	CHECK_REJECT(-EPROTO, conn_rsp_dec(&m, sizeof(m), &out, WHY));
	put16(&m, 4, 0x8000);
	CHECK_REJECT(-EPROTO, conn_rsp_dec(&m, sizeof(m), &out, WHY));
	/* And the encoder never sends one outside it. */
	for (int e = -4095; e <= -1; e += 1023) {
		in.err = e;
		rtrs_conn_rsp_encode(&m, &in);
		CHECK_EQ(get16(&m, 4), (uint16_t)e);
	}
	CHECK(rej_errno_guarded(-4096), "errno -4096");
	CHECK(rej_errno_guarded(-23038), "errno -23038");
	CHECK(rej_errno_guarded(INT_MIN), "errno INT_MIN");
	CHECK(rej_errno_guarded(5), "errno 5");

	/* Size boundaries that must be accepted. */
	CHECK_ACCEPT(conn_rsp_try(1, 8192 - 24, 24, &out, WHY));
	CHECK_EQ(out.chunk_size, 8192);
	CHECK_ACCEPT(conn_rsp_try(2048, (128u << 10) - 4096, 4096, &out, WHY));
	CHECK_ACCEPT(conn_rsp_try(32768, 8192 - 4096, 4096, &out, WHY));
	CHECK_ACCEPT(conn_rsp_try(1, RTRS_MAX_CHUNK_SIZE - 4096, 4096, &out, WHY));
	CHECK_EQ(out.chunk_size, RTRS_MAX_CHUNK_SIZE);
	CHECK_ACCEPT(conn_rsp_try(2, RTRS_MAX_CHUNK_SIZE - 4096, 4096, &out, WHY));

	/* Rejections. */
	good_conn_rsp(&in);
	rtrs_conn_rsp_encode(&m, &in);
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 5, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 0, &out, WHY));
	/* An accept must be complete, as a reject. */
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, sizeof(m) - 1, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, conn_rsp_dec(&m, 6, &out, WHY));
	{
		struct rtrs_msg_conn_rsp b = m;

		b.magic = le16_put(0);
		CHECK_REJECT(-EPROTO, conn_rsp_dec(&b, sizeof(b), &out, WHY));
		b = m;
		b.version = le16_put(0x0100);
		CHECK_REJECT(-EPROTONOSUPPORT, conn_rsp_dec(&b, sizeof(b), &out, WHY));
		b.version = le16_put(0x0300);
		CHECK_REJECT(-EPROTONOSUPPORT, conn_rsp_dec(&b, sizeof(b), &out, WHY));
		b.version = le16_put(0x0201);
		CHECK_ACCEPT(conn_rsp_dec(&b, sizeof(b), &out, WHY));
		b.version = le16_put(0x02ff);
		CHECK_ACCEPT(conn_rsp_dec(&b, sizeof(b), &out, WHY));

		b = m;
		b.errno_ = le16_put(1);
		CHECK_REJECT(-EPROTO, conn_rsp_dec(&b, sizeof(b), &out, WHY));
		b.errno_ = le16_put(5);
		CHECK_REJECT(-EPROTO, conn_rsp_dec(&b, sizeof(b), &out, WHY));
		b.errno_ = le16_put(0x7fff);
		CHECK_REJECT(-EPROTO, conn_rsp_dec(&b, sizeof(b), &out, WHY));

		b = m;
		b.queue_depth = le16_put(0);
		CHECK_REJECT(-EINVAL, conn_rsp_dec(&b, sizeof(b), &out, WHY));
	}
	/* Header size: room for a read header with one descriptor .. 4096. */
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 8192 - 23, 23, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 8192, 0, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 16384 - 4097, 4097, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 8192, 0xffffffffu, &out, WHY));
	/* io size zero, and io + hdr wrapping 32 bits (to 0 and to 4095). */
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 0, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(1, 0xfffff000u, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(1, 0xffffffffu, 4096, &out, WHY));
	/* Chunk size: power of two, 8 KiB .. 128 MiB. */
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 9000, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 8192, 4096 - 1, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(512, 4096 - 24, 24, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(1, 1, 4095, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(1, 2 * RTRS_MAX_CHUNK_SIZE - 4096, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(1, 0x80000000u - 4096, 4096, &out, WHY));
	/* Queue depth and chunk size must share the 28-bit immediate. */
	CHECK_REJECT(-EINVAL, conn_rsp_try(2049, (128u << 10) - 4096, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(4096, (128u << 10) - 4096, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(32769, 8192 - 4096, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(65535, 8192 - 4096, 4096, &out, WHY));
	CHECK_REJECT(-EINVAL, conn_rsp_try(3, RTRS_MAX_CHUNK_SIZE - 4096, 4096, &out, WHY));
}

/* ---- session names and info_req ------------------------------------------ */

static void test_names(void)
{
	char s[300];

	CHECK(rtrs_name_valid("a"));
	CHECK(rtrs_name_valid("blk-sess_01:host@x~!"));
	memset(s, 'n', sizeof(s));
	s[RTRS_NAME_MAX] = '\0';
	CHECK(rtrs_name_valid(s));
	s[RTRS_NAME_MAX] = 'n';
	s[RTRS_NAME_MAX + 1] = '\0';
	CHECK(!rtrs_name_valid(s)); /* 256 characters */
	s[sizeof(s) - 1] = '\0';
	CHECK(!rtrs_name_valid(s));

	CHECK(!rtrs_name_valid(""));
	CHECK(!rtrs_name_valid("/"));
	CHECK(!rtrs_name_valid("a/b"));
	CHECK(!rtrs_name_valid("."));
	CHECK(!rtrs_name_valid(".."));
	/* As the kernel: dots are fine (host names), only "." and ".." are not. */
	CHECK(rtrs_name_valid("sess.1"));
	CHECK(rtrs_name_valid("host1.example.com"));
	CHECK(rtrs_name_valid("..a"));
	CHECK(rtrs_name_valid("..."));
	CHECK(!rtrs_name_valid("a b"));
	CHECK(!rtrs_name_valid("a\tb"));
	CHECK(!rtrs_name_valid("a\nb"));
	CHECK(!rtrs_name_valid("\x01"));
	CHECK(!rtrs_name_valid("ab\x1f"));
	CHECK(!rtrs_name_valid("ab\x7f"));
	CHECK(!rtrs_name_valid("caf\xc3\xa9"));
}

static void test_info_req(void)
{
	struct rtrs_msg_info_req m;
	struct rtrs_info_req in, out;

	memset(&in, 0, sizeof(in));
	strcpy(in.pathname, "client-sess");
	in.imm_addr = 0xfedcba9876543210ull;
	in.imm_key = 0x01020304;
	rtrs_info_req_encode(&m, &in);
	CHECK_EQ(get16(&m, 0), RTRS_MSG_INFO_REQ);
	CHECK(!memcmp((uint8_t *)&m + 2, "client-sess", 12));
	CHECK(get64(&m, 257) == 0xfedcba9876543210ull);
	CHECK_EQ(get32(&m, 265), 0x01020304);
	for (size_t i = 269; i < sizeof(m); i++)
		CHECK_EQ(((uint8_t *)&m)[i], 0);

	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(info_req_dec(&m, sizeof(m), &out, WHY));
	CHECK(!strcmp(out.pathname, "client-sess"), "got '%.40s'", out.pathname);
	CHECK(out.imm_addr == 0xfedcba9876543210ull);
	CHECK_EQ(out.imm_key, 0x01020304);
	/* From a kernel client the same bytes are reserved: no imm target. */
	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(info_req_dec_ext(&m, sizeof(m), false, &out, WHY));
	CHECK(!strcmp(out.pathname, "client-sess"), "got '%.40s'", out.pathname);
	CHECK(out.imm_addr == 0);
	CHECK_EQ(out.imm_key, 0);
	/* A kernel client's request: the name, then zeros to 272 bytes. */
	{
		struct rtrs_info_req k = { .pathname = "interop" };

		rtrs_info_req_encode(&m, &k);
		CHECK_EQ(sizeof(m), 272);
		CHECK(!memcmp(&m, "\0\0interop", 9));
		for (size_t i = 9; i < sizeof(m); i++)
			CHECK_EQ(((uint8_t *)&m)[i], 0);
	}

	/* A name filling the field has no terminator on the wire. */
	memset(in.pathname, 'z', RTRS_NAME_MAX);
	in.pathname[RTRS_NAME_MAX] = '\0';
	rtrs_info_req_encode(&m, &in);
	CHECK_EQ(m.pathname[RTRS_NAME_MAX - 1], 'z');
	CHECK_EQ(get64(&m, 257) >> 56, 0xfe); /* not overwritten by the name */
	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(info_req_dec(&m, sizeof(m), &out, WHY));
	CHECK_EQ(strlen(out.pathname), RTRS_NAME_MAX);
	CHECK(out.imm_addr == 0xfedcba9876543210ull);

	strcpy(in.pathname, "ok");
	rtrs_info_req_encode(&m, &in);
	CHECK_REJECT(-EMSGSIZE, info_req_dec(&m, sizeof(m) - 1, &out, WHY));
	CHECK_REJECT(-EMSGSIZE, info_req_dec(&m, 0, &out, WHY));
	{
		struct rtrs_msg_info_req b = m;
		static const char *const bad[] = { "", "a/b", "/", ".", "..", "a b",
						   "tab\t", "\x01", "del\x7f", "hi\xff" };

		b.type = le16_put(RTRS_MSG_INFO_RSP);
		CHECK_REJECT(-EPROTO, info_req_dec(&b, sizeof(b), &out, WHY));
		b.type = le16_put(0x100);
		CHECK_REJECT(-EPROTO, info_req_dec(&b, sizeof(b), &out, WHY));

		for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
			b = m;
			memset(b.pathname, 0, sizeof(b.pathname));
			memcpy(b.pathname, bad[i], strlen(bad[i]));
			CHECK_REJECT(-EINVAL, info_req_dec(&b, sizeof(b), &out, WHY));
		}
		/* A valid prefix does not hide a bad character after it. */
		b = m;
		memset(b.pathname, 'q', RTRS_NAME_MAX);
		b.pathname[RTRS_NAME_MAX - 1] = '/';
		CHECK_REJECT(-EINVAL, info_req_dec(&b, sizeof(b), &out, WHY));
		/* A host name, as the kernel's client takes it. */
		b = m;
		memset(b.pathname, 0, sizeof(b.pathname));
		memcpy(b.pathname, "host1.example.com", 17);
		CHECK_ACCEPT(info_req_dec(&b, sizeof(b), &out, WHY));
		CHECK(!strcmp(out.pathname, "host1.example.com"), "%s", out.pathname);
	}
}

/* ---- info_rsp ------------------------------------------------------------ */

#define SENTINEL_ADDR 0x5e5e5e5e5e5e5e5eull

/* Decodes into a heap array of qd entries plus one sentinel that must survive. */
static int info_rsp_try(const void *m, size_t len, const struct rtrs_limits *lim,
			struct rtrs_desc *copy, const char **why)
{
	struct rtrs_desc *chunks = calloc(lim->queue_depth + 1, sizeof(*chunks));
	int rc;

	if (!chunks)
		exit(1);
	chunks[lim->queue_depth].addr = SENTINEL_ADDR;
	rc = info_rsp_dec(m, len, lim, chunks, why);
	CHECK(chunks[lim->queue_depth].addr == SENTINEL_ADDR, "wrote past queue_depth entries");
	if (copy)
		memcpy(copy, chunks, lim->queue_depth * sizeof(*chunks));
	free(chunks);
	return rc;
}

/*
 * Verdicts and 64-bit keys are ours: read only from a server of this
 * project (lim.ext); a kernel server's bytes 4..7 are reserved.
 */
static void test_info_rsp_ext(void)
{
	struct rtrs_limits lim = { .queue_depth = 8, .chunk_size = 8192, .max_hdr_size = 1024,
				   .ext = true };
	struct rtrs_desc d[8], chunks[8];
	uint8_t m[8 + 32 * 8];
	int verdict;
	bool dnr;

	rtrs_info_rsp_encode_verdict(m, -EPERM, true);
	CHECK_EQ(get16(m, 0), RTRS_MSG_INFO_RSP);
	CHECK_EQ(get16(m, 2), 0);
	CHECK_EQ(get16(m, 4), (uint16_t)-EPERM);
	CHECK_EQ(get16(m, 6), RTRS_MSG_DNR_F);
	CHECK_ACCEPT(info_rsp_dec_verdict(m, 8, &lim, chunks, &verdict, &dnr, WHY));
	CHECK_EQ(verdict, -EPERM);
	CHECK(dnr);
	/* A verdict stays within 1..4095, as a connection's rejection does. */
	put16(m, 4, (uint16_t)-4095);
	CHECK_ACCEPT(info_rsp_dec_verdict(m, 8, &lim, chunks, &verdict, &dnr, WHY));
	CHECK_EQ(verdict, -4095);
	put16(m, 4, (uint16_t)-4096);
	CHECK_REJECT(-EPROTO, info_rsp_dec_verdict(m, 8, &lim, chunks, &verdict, &dnr, WHY));
	put16(m, 4, (uint16_t)-20000);
	CHECK_REJECT(-EPROTO, info_rsp_dec_verdict(m, 8, &lim, chunks, &verdict, &dnr, WHY));
	rtrs_info_rsp_encode_verdict(m, -EPERM, true);
	/* From a kernel server: sg_cnt 0 is just a broken response. */
	lim.ext = false;
	CHECK_REJECT(-EINVAL, info_rsp_dec_verdict(m, 8, &lim, chunks, &verdict, &dnr, WHY));
	CHECK_EQ(verdict, 0);

	/* Reserved bytes with something in them do not make a kernel server's response a verdict. */
	d[0] = (struct rtrs_desc){ .addr = 0x4000, .key = 9, .len = 8 * 8192 };
	rtrs_info_rsp_encode(m, d, 1);
	put16(m, 4, (uint16_t)-EIO);
	put16(m, 6, RTRS_MSG_DNR_F);
	CHECK_ACCEPT(info_rsp_dec_verdict(m, rtrs_info_rsp_size(1, 0), &lim, chunks, &verdict, &dnr,
					  WHY));
	CHECK_EQ(verdict, 0);
	CHECK(!dnr);
	CHECK(chunks[3].addr == 0x4000 + 3 * 8192);
	lim.ext = true;
	CHECK_REJECT(-EPROTO, info_rsp_dec_verdict(m, rtrs_info_rsp_size(1, 0), &lim, chunks,
						   &verdict, &dnr, WHY));

	/*
	 * KEY64: records after the descriptors, only from a server of ours;
	 * the kernel's always_invalidate has no records (8 + 16 x qd bytes).
	 */
	for (unsigned i = 0; i < 8; i++)
		d[i] = (struct rtrs_desc){ .addr = 0x10000 * i, .key = 0, .len = 8192 };
	rtrs_info_rsp_encode(m, d, 8);
	for (unsigned i = 0; i < 8; i++)
		rtrs_new_rkey_encode(&rtrs_info_rsp_keys(m, 8)[i], i, 1, (1ull << 32) + i);
	lim.key64 = true;
	CHECK_ACCEPT(info_rsp_dec_verdict(m, rtrs_info_rsp_size(8, 8), &lim, chunks, &verdict, &dnr,
					  WHY));
	CHECK(chunks[5].key == (1ull << 32) + 5);
	CHECK_REJECT(-EMSGSIZE, info_rsp_dec_verdict(m, rtrs_info_rsp_size(8, 8) - 1, &lim, chunks,
						     &verdict, &dnr, WHY));
	lim.ext = false;
	CHECK_ACCEPT(info_rsp_dec_verdict(m, rtrs_info_rsp_size(8, 0), &lim, chunks, &verdict, &dnr,
					  WHY));
	CHECK_EQ(chunks[5].key, 0);
	CHECK_EQ(rtrs_info_rsp_size(512, 0), 8 + 16 * 512);
}

static void test_info_rsp(void)
{
	struct rtrs_limits lim = { .queue_depth = 8, .chunk_size = 8192, .max_hdr_size = 1024 };
	struct rtrs_desc d[8], chunks[8];
	uint8_t m[8 + 16 * 16];
	size_t len;

	/* Two descriptors of four chunks each: expanded per chunk. */
	d[0] = (struct rtrs_desc){ .addr = 0x100000, .key = 0x11, .len = 4 * 8192 };
	d[1] = (struct rtrs_desc){ .addr = 0xffff0000000ull, .key = 0x22, .len = 4 * 8192 };
	len = rtrs_info_rsp_size(2, 0);
	CHECK_EQ(len, 8 + 2 * 16);
	memset(m, 0xee, sizeof(m));
	rtrs_info_rsp_encode(m, d, 2);
	CHECK_EQ(get16(m, 0), RTRS_MSG_INFO_RSP);
	CHECK_EQ(get16(m, 2), 2);
	CHECK_EQ(get32(m, 4), 0);
	CHECK(get64(m, 8) == 0x100000);
	CHECK_EQ(get32(m, 16), 0x11);
	CHECK_EQ(get32(m, 20), 4 * 8192);
	CHECK(get64(m, 24) == 0xffff0000000ull);
	CHECK_EQ(get32(m, 32), 0x22);
	CHECK_EQ(m[len], 0xee); /* stays within rtrs_info_rsp_size() */

	CHECK_ACCEPT(info_rsp_try(m, len, &lim, chunks, WHY));
	for (unsigned i = 0; i < 8; i++) {
		uint64_t want = i < 4 ? 0x100000 + i * 8192ull
				      : 0xffff0000000ull + (i - 4) * 8192ull;

		CHECK(chunks[i].addr == want, "chunk %u addr %#llx", i,
		      (unsigned long long)chunks[i].addr);
		CHECK_EQ(chunks[i].key, i < 4 ? 0x11 : 0x22);
		CHECK_EQ(chunks[i].len, 8192);
	}

	/* One descriptor per chunk (sg_cnt == queue_depth). */
	for (unsigned i = 0; i < 8; i++)
		d[i] = (struct rtrs_desc){ .addr = 0x7000000 - i * 0x10000, .key = 100 + i,
					   .len = 8192 };
	rtrs_info_rsp_encode(m, d, 8);
	CHECK_ACCEPT(info_rsp_try(m, rtrs_info_rsp_size(8, 0), &lim, chunks, WHY));
	for (unsigned i = 0; i < 8; i++) {
		CHECK(chunks[i].addr == 0x7000000 - i * 0x10000);
		CHECK_EQ(chunks[i].key, 100 + i);
	}

	/* One descriptor for all; trailing bytes ignored. */
	d[0] = (struct rtrs_desc){ .addr = 0, .key = 7, .len = 8 * 8192 };
	rtrs_info_rsp_encode(m, d, 1);
	CHECK_ACCEPT(info_rsp_try(m, rtrs_info_rsp_size(1, 0) + 5, &lim, chunks, WHY));
	CHECK(chunks[7].addr == 7 * 8192);
	CHECK_EQ(chunks[7].key, 7);

	/* A range ending just below 2^64 is fine. */
	d[0].addr = UINT64_MAX - 8 * 8192;
	rtrs_info_rsp_encode(m, d, 1);
	CHECK_ACCEPT(info_rsp_try(m, rtrs_info_rsp_size(1, 0), &lim, chunks, WHY));
	CHECK(chunks[7].addr == UINT64_MAX - 8192);

	/* Rejections. */
	d[0] = (struct rtrs_desc){ .addr = 0x100000, .key = 0x11, .len = 4 * 8192 };
	d[1] = (struct rtrs_desc){ .addr = 0x200000, .key = 0x22, .len = 4 * 8192 };
	rtrs_info_rsp_encode(m, d, 2);
	len = rtrs_info_rsp_size(2, 0);
	CHECK_ACCEPT(info_rsp_try(m, len, &lim, NULL, WHY));
	CHECK_REJECT(-EMSGSIZE, info_rsp_try(m, 7, &lim, NULL, WHY));
	CHECK_REJECT(-EMSGSIZE, info_rsp_try(m, 0, &lim, NULL, WHY));
	CHECK_REJECT(-EMSGSIZE, info_rsp_try(m, len - 1, &lim, NULL, WHY));
	CHECK_REJECT(-EMSGSIZE, info_rsp_try(m, 8, &lim, NULL, WHY));
	{
		uint8_t b[sizeof(m)];

		memcpy(b, m, sizeof(m));
		put16(b, 0, RTRS_MSG_INFO_REQ);
		CHECK_REJECT(-EPROTO, info_rsp_try(b, len, &lim, NULL, WHY));
		put16(b, 0, RTRS_MSG_RKEY_RSP);
		CHECK_REJECT(-EPROTO, info_rsp_try(b, len, &lim, NULL, WHY));

		memcpy(b, m, sizeof(m));
		put16(b, 2, 0);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
		put16(b, 2, 3); /* does not divide 8 */
		CHECK_REJECT(-EINVAL, info_rsp_try(b, sizeof(b), &lim, NULL, WHY));
		put16(b, 2, 16); /* more descriptors than chunks */
		CHECK_REJECT(-EINVAL, info_rsp_try(b, sizeof(b), &lim, NULL, WHY));
		put16(b, 2, 0xffff);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, sizeof(b), &lim, NULL, WHY));
		/*
		 * Three descriptors of the rounded-down share (2 chunks each)
		 * would leave chunks 6 and 7 unset.
		 */
		for (unsigned i = 0; i < 3; i++)
			d[i] = (struct rtrs_desc){ .addr = 0x100000 * (i + 1), .key = 1,
						   .len = 2 * 8192 };
		rtrs_info_rsp_encode(b, d, 3);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, rtrs_info_rsp_size(3, 0), &lim, NULL, WHY));
		/* sg_cnt 4 divides 8, but the message only holds two descriptors. */
		memcpy(b, m, sizeof(m));
		put16(b, 2, 4);
		CHECK_REJECT(-EMSGSIZE, info_rsp_try(b, len, &lim, NULL, WHY));

		/* Each descriptor must cover exactly its share of chunks. */
		memcpy(b, m, sizeof(m));
		put32(b, 8 + 16 + 12, 4 * 8192 - 1);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
		put32(b, 8 + 16 + 12, 4 * 8192 + 1);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
		put32(b, 8 + 16 + 12, 8 * 8192);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
		put32(b, 8 + 16 + 12, 0);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));

		/* Address ranges that wrap around 2^64. */
		memcpy(b, m, sizeof(m));
		put64(b, 8 + 16, UINT64_MAX - 4 * 8192 + 2);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
		put64(b, 8 + 16, UINT64_MAX);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
		put64(b, 8, UINT64_MAX - 8192);
		CHECK_REJECT(-EINVAL, info_rsp_try(b, len, &lim, NULL, WHY));
	}
}

/* ---- IO requests in chunks ----------------------------------------------- */

#define IO_QD 4
#define IO_CHUNK 8192u
#define IO_HDR 1024u

static const struct rtrs_limits io_lim = {
	.queue_depth = IO_QD, .chunk_size = IO_CHUNK, .max_hdr_size = IO_HDR,
};
/* Heap chunks of exactly IO_CHUNK bytes: ASan sees any read past a chunk. */
static void *io_bases[IO_QD];

static void io_clear(void)
{
	for (int i = 0; i < IO_QD; i++)
		memset(io_bases[i], 0, IO_CHUNK);
}

/* The IMM payload naming (chunk, off), through the encoder under test. */
static uint32_t io_payload(const struct rtrs_limits *lim, uint32_t chunk, uint32_t off)
{
	unsigned type;
	uint32_t payload;

	rtrs_from_imm(rtrs_to_io_req_imm(lim->queue_depth, chunk, off), &type, &payload);
	CHECK_EQ(type, RTRS_IO_REQ_IMM);
	return payload;
}

/* Raw payload, for offsets the encoder would not be asked to produce. */
static uint32_t io_raw_payload(const struct rtrs_limits *lim, uint32_t chunk, uint32_t off)
{
	return chunk << rtrs_mem_bits(lim->queue_depth) | off;
}

/* Lays out [data | user msg | write hdr] in a chunk; returns the payload. */
static uint32_t put_write(uint32_t chunk, uint32_t data_len, uint32_t usr_len)
{
	rtrs_write_hdr_encode((uint8_t *)io_bases[chunk] + data_len + usr_len, usr_len);
	return io_payload(&io_lim, chunk, data_len + usr_len);
}

static uint32_t put_read(uint32_t chunk, uint32_t data_len, uint32_t usr_len, uint16_t flags,
			 const struct rtrs_desc *sg, unsigned sg_cnt)
{
	rtrs_read_hdr_encode((uint8_t *)io_bases[chunk] + data_len + usr_len, usr_len, flags,
			     sg, sg_cnt);
	return io_payload(&io_lim, chunk, data_len + usr_len);
}

static struct rtrs_desc io_sgbuf[RTRS_MAX_READ_SG];

static int io_dec(uint32_t payload, struct rtrs_io_req *out, const char **why)
{
	return rtrs_io_req_decode(payload, &io_lim, io_bases, io_sgbuf, out, why);
}

static void test_io_write(void)
{
	struct rtrs_io_req out;
	uint32_t p;
	uint8_t *c;

	CHECK_EQ(rtrs_io_hdr_size(false, 0), 4);
	CHECK_EQ(rtrs_io_hdr_size(false, 9), 4);
	CHECK_EQ(rtrs_io_hdr_size(true, 0), 8);
	CHECK_EQ(rtrs_io_hdr_size(true, 3), 8 + 48);

	io_clear();
	p = put_write(2, 1000, 10);
	c = (uint8_t *)io_bases[2] + 1010;
	CHECK_EQ(get16(c, 0), RTRS_MSG_WRITE);
	CHECK_EQ(get16(c, 2), 10);
	CHECK_EQ(c[4], 0); /* a write header is 4 bytes */
	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(io_dec(p, &out, WHY));
	CHECK_EQ(out.type, RTRS_MSG_WRITE);
	CHECK_EQ(out.chunk, 2);
	CHECK_EQ(out.off, 1010);
	CHECK_EQ(out.usr_len, 10);
	CHECK_EQ(out.data_len, 1000);
	CHECK_EQ(out.flags, 0);
	CHECK_EQ(out.sg_cnt, 0);
	CHECK(out.sg == NULL);

	/* No data and no user message: header at offset 0. */
	io_clear();
	p = put_write(0, 0, 0);
	CHECK_EQ(p, 0);
	CHECK_ACCEPT(io_dec(p, &out, WHY));
	CHECK_EQ(out.off, 0);
	CHECK_EQ(out.data_len, 0);

	/* Largest of everything: the header ends exactly at the chunk end. */
	io_clear();
	p = put_write(3, IO_CHUNK - IO_HDR, IO_HDR - 4);
	CHECK_ACCEPT(io_dec(p, &out, WHY));
	CHECK_EQ(out.chunk, 3);
	CHECK_EQ(out.off, IO_CHUNK - 4);
	CHECK_EQ(out.data_len, IO_CHUNK - IO_HDR);
	CHECK_EQ(out.usr_len, IO_HDR - 4);

	/* user + rtrs header one byte over max_hdr_size. */
	io_clear();
	p = put_write(1, 0, IO_HDR - 3);
	CHECK_REJECT(-EMSGSIZE, io_dec(p, &out, WHY));
	/* Data one byte over max_io_size. */
	io_clear();
	p = put_write(1, IO_CHUNK - IO_HDR + 1, 0);
	CHECK_REJECT(-EMSGSIZE, io_dec(p, &out, WHY));
	io_clear();
	p = put_write(1, IO_CHUNK - IO_HDR, 0);
	CHECK_ACCEPT(io_dec(p, &out, WHY));

	/* usr_len beyond the offset would make data_len negative (kernel bug). */
	io_clear();
	p = put_write(1, 0, 10);
	put16(io_bases[1], 10 + 2, 11);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	put16(io_bases[1], 10 + 2, 0xffff);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	put16(io_bases[1], 10 + 2, 10);
	CHECK_ACCEPT(io_dec(p, &out, WHY));

	/* Unknown message types at the offset. */
	{
		static const uint16_t types[] = { RTRS_MSG_INFO_REQ, RTRS_MSG_INFO_RSP,
						  RTRS_MSG_RKEY_RSP, 5, 0x0102, 0xffff };

		for (size_t i = 0; i < ARRAY_SIZE(types); i++) {
			io_clear();
			p = put_write(0, 20, 4);
			put16(io_bases[0], 24, types[i]);
			CHECK_REJECT(-EPROTO, io_dec(p, &out, WHY));
		}
	}

	/* Offsets that leave no room for the header in the chunk. */
	io_clear();
	CHECK_REJECT(-EINVAL, io_dec(io_raw_payload(&io_lim, 1, IO_CHUNK - 3), &out, WHY));
	CHECK_REJECT(-EINVAL, io_dec(io_raw_payload(&io_lim, 1, IO_CHUNK), &out, WHY));
	CHECK_REJECT(-EINVAL, io_dec(io_raw_payload(&io_lim, 1, IO_CHUNK * 2), &out, WHY));
	CHECK_REJECT(-EINVAL, io_dec(io_raw_payload(&io_lim, 0, (1u << 26) - 1), &out, WHY));
}

static void test_io_read(void)
{
	struct rtrs_desc sg[RTRS_MAX_READ_SG + 1];
	struct rtrs_io_req out;
	uint32_t p, off;
	uint8_t *c;

	/* Three destination buffers for 3000 bytes; header at an odd offset. */
	sg[0] = (struct rtrs_desc){ .addr = 0x1000, .key = 1, .len = 1000 };
	sg[1] = (struct rtrs_desc){ .addr = 0xa0000000ull, .key = 2, .len = 1499 };
	sg[2] = (struct rtrs_desc){ .addr = 0xffffffff00000000ull, .key = 3, .len = 501 };
	io_clear();
	p = put_read(1, 3000, 21, RTRS_MSG_NEED_INVAL_F, sg, 3);
	off = 3021;
	c = (uint8_t *)io_bases[1] + off;
	CHECK_EQ(get16(c, 0), RTRS_MSG_READ);
	CHECK_EQ(get16(c, 2), 21);
	CHECK_EQ(get16(c, 4), RTRS_MSG_NEED_INVAL_F);
	CHECK_EQ(get16(c, 6), 3);
	CHECK(get64(c, 8 + 16) == 0xa0000000ull);
	CHECK_EQ(get32(c, 8 + 16 + 8), 2);
	CHECK_EQ(get32(c, 8 + 16 + 12), 1499);
	CHECK_EQ(c[8 + 48], 0);
	memset(&out, 0xaa, sizeof(out));
	CHECK_ACCEPT(io_dec(p, &out, WHY));
	CHECK_EQ(out.type, RTRS_MSG_READ);
	CHECK_EQ(out.chunk, 1);
	CHECK_EQ(out.off, off);
	CHECK_EQ(out.usr_len, 21);
	CHECK_EQ(out.data_len, 3000);
	CHECK_EQ(out.flags, RTRS_MSG_NEED_INVAL_F);
	CHECK_EQ(out.sg_cnt, 3);
	/* The descriptors are a copy, not a pointer into client memory. */
	CHECK(out.sg == io_sgbuf, "sg %p, want the caller's buffer %p", (void *)out.sg,
	      (void *)io_sgbuf);
	for (int i = 0; i < 3; i++) {
		struct rtrs_desc d = out.sg[i];

		CHECK(d.addr == sg[i].addr);
		CHECK_EQ(d.key, sg[i].key);
		CHECK_EQ(d.len, sg[i].len);
	}

	/* A read with nothing to return: no descriptors, no flags. */
	io_clear();
	p = put_read(0, 0, 12, 0, NULL, 0);
	CHECK_ACCEPT(io_dec(p, &out, WHY));
	CHECK_EQ(out.type, RTRS_MSG_READ);
	CHECK_EQ(out.sg_cnt, 0);
	CHECK_EQ(out.data_len, 0);
	CHECK_EQ(out.usr_len, 12);

	/* The largest descriptor count, each 8 bytes of a full data area. */
	{
		struct rtrs_limits lim = { .queue_depth = 1, .chunk_size = 8192,
					   .max_hdr_size = RTRS_MAX_HDR_SIZE };
		uint8_t *chunk = calloc(1, 8192);
		void *bases[1] = { chunk };
		uint32_t data = 8192 - RTRS_MAX_HDR_SIZE;

		for (int i = 0; i < RTRS_MAX_READ_SG; i++)
			sg[i] = (struct rtrs_desc){ .addr = (uint64_t)i << 20, .key = 9,
						    .len = data / RTRS_MAX_READ_SG };
		rtrs_read_hdr_encode(chunk + data, 0, 0, sg, RTRS_MAX_READ_SG);
		CHECK_ACCEPT(rtrs_io_req_decode(io_payload(&lim, 0, data), &lim, bases, io_sgbuf, &out, WHY));
		CHECK_EQ(out.sg_cnt, RTRS_MAX_READ_SG);
		CHECK(out.sg[RTRS_MAX_READ_SG - 1].addr == (uint64_t)127 << 20);
		/* One more is too many, even with room in the chunk and the header. */
		sg[RTRS_MAX_READ_SG - 1].len = data / RTRS_MAX_READ_SG / 2;
		sg[RTRS_MAX_READ_SG] = sg[RTRS_MAX_READ_SG - 1];
		memset(chunk, 0, 8192);
		rtrs_read_hdr_encode(chunk + data, 0, 0, sg, RTRS_MAX_READ_SG + 1);
		CHECK_REJECT(-EINVAL, rtrs_io_req_decode(io_payload(&lim, 0, data), &lim, bases, io_sgbuf,
							 &out, WHY));
		free(chunk);
	}

	sg[0] = (struct rtrs_desc){ .addr = 0x1000, .key = 1, .len = 600 };
	sg[1] = (struct rtrs_desc){ .addr = 0x2000, .key = 1, .len = 400 };

	/* Flags: only NEED_INVAL is defined. */
	{
		static const uint16_t bad[] = { 2, 4, 0x8000, RTRS_MSG_NEED_INVAL_F | 2, 0xffff };

		for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
			io_clear();
			p = put_read(2, 1000, 8, bad[i], sg, 2);
			CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
		}
		io_clear();
		p = put_read(2, 1000, 8, 0, sg, 2);
		CHECK_ACCEPT(io_dec(p, &out, WHY));
		CHECK_EQ(out.flags, 0);
	}

	/* Descriptor count beyond the limit. */
	io_clear();
	p = put_read(2, 1000, 8, 0, sg, 2);
	put16(io_bases[2], 1008 + 6, RTRS_MAX_READ_SG + 1);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	put16(io_bases[2], 1008 + 6, 0xffff);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));

	/* usr_len beyond the offset. */
	io_clear();
	p = put_read(2, 0, 8, 0, NULL, 0);
	put16(io_bases[2], 8 + 2, 9);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));

	/* A read header that does not fit in what is left of the chunk. */
	io_clear();
	off = IO_CHUNK - 7;
	put16(io_bases[3], off, RTRS_MSG_READ);
	CHECK_REJECT(-EINVAL, io_dec(io_payload(&io_lim, 3, off), &out, WHY));
	/*
	 * Descriptors running past the chunk end by one byte. Every byte left
	 * in the chunk is non-zero, so a decoder that read on would find
	 * plausible lengths and step over the edge (which ASan reports).
	 */
	io_clear();
	off = IO_CHUNK - 8 - 2 * 16 + 1;
	memset((uint8_t *)io_bases[3] + off, 0x01, IO_CHUNK - off);
	put16(io_bases[3], off, RTRS_MSG_READ);
	put16(io_bases[3], off + 2, 0);
	put16(io_bases[3], off + 4, 0);
	put16(io_bases[3], off + 6, 2);
	CHECK_REJECT(-EINVAL, io_dec(io_payload(&io_lim, 3, off), &out, WHY));
	put16(io_bases[3], off + 6, RTRS_MAX_READ_SG);
	CHECK_REJECT(-EINVAL, io_dec(io_payload(&io_lim, 3, off), &out, WHY));

	/* An empty descriptor, even when the sum would match. */
	io_clear();
	sg[2] = (struct rtrs_desc){ .addr = 0x3000, .key = 1, .len = 0 };
	p = put_read(0, 1000, 0, 0, sg, 3);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));

	/* Lengths must add up to the data area exactly. */
	io_clear();
	sg[1].len = 401;
	p = put_read(0, 1000, 0, 0, sg, 2);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	io_clear();
	sg[1].len = 399;
	p = put_read(0, 1000, 0, 0, sg, 2);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	io_clear();
	p = put_read(0, 1000, 0, 0, NULL, 0); /* data area but nothing to fill it */
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	io_clear();
	sg[0].len = 1;
	p = put_read(0, 0, 0, 0, sg, 1); /* a descriptor but no data area */
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	/* A sum that equals data_len only modulo 2^32. */
	io_clear();
	sg[0].len = 0xffffffffu;
	sg[1].len = 1000 + 1;
	p = put_read(0, 1000, 0, 0, sg, 2);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));
	io_clear();
	sg[0].len = 0x80000000u;
	sg[1].len = 0x80000000u;
	sg[2].len = 1000;
	p = put_read(0, 1000, 0, 0, sg, 3);
	CHECK_REJECT(-EINVAL, io_dec(p, &out, WHY));

	/* usr_len + read header beyond max_hdr_size: 1020 + 8 + 16 > 1024. */
	io_clear();
	sg[0].len = 100;
	p = put_read(1, 100, IO_HDR - 24 + 1, 0, sg, 1);
	CHECK_REJECT(-EMSGSIZE, io_dec(p, &out, WHY));
	io_clear();
	p = put_read(1, 100, IO_HDR - 24, 0, sg, 1);
	CHECK_ACCEPT(io_dec(p, &out, WHY));
	/* Read data beyond max_io_size. */
	io_clear();
	sg[0].len = IO_CHUNK - IO_HDR + 1;
	p = put_read(1, IO_CHUNK - IO_HDR + 1, 0, 0, sg, 1);
	CHECK_REJECT(-EMSGSIZE, io_dec(p, &out, WHY));
	io_clear();
	sg[0].len = IO_CHUNK - IO_HDR;
	p = put_read(1, IO_CHUNK - IO_HDR, 0, 0, sg, 1);
	CHECK_ACCEPT(io_dec(p, &out, WHY));
}

/* Chunk ids at or beyond a queue depth that is not a power of two. */
static void test_io_chunk_id(void)
{
	const struct rtrs_limits lim = { .queue_depth = 3, .chunk_size = IO_CHUNK,
					 .max_hdr_size = IO_HDR };
	/* Exactly three bases: ASan catches a lookup before the id check. */
	void **bases = calloc(3, sizeof(*bases));
	struct rtrs_io_req out;

	io_clear();
	for (int i = 0; i < 3; i++)
		bases[i] = io_bases[i];
	rtrs_write_hdr_encode(io_bases[2], 0);
	CHECK_ACCEPT(rtrs_io_req_decode(io_payload(&lim, 2, 0), &lim, bases, io_sgbuf, &out, WHY));
	CHECK_EQ(out.chunk, 2);
	CHECK_REJECT(-EINVAL, rtrs_io_req_decode(io_raw_payload(&lim, 3, 0), &lim, bases, io_sgbuf, &out,
						 WHY));
	/* Payload bits above the 28 are not ours: they make a huge chunk id. */
	CHECK_REJECT(-EINVAL, rtrs_io_req_decode(0xffffffffu, &lim, bases, io_sgbuf, &out, WHY));
	CHECK_REJECT(-EINVAL, rtrs_io_req_decode(RTRS_IMM_PAYL_MASK, &lim, bases, io_sgbuf, &out, WHY));
	free(bases);
}

/* ---- immediates ---------------------------------------------------------- */

static void test_imm_generic(void)
{
	unsigned type;
	uint32_t payload;

	CHECK_EQ(rtrs_to_imm(RTRS_HB_MSG_IMM, 0), 0x80000000u);
	CHECK_EQ(rtrs_to_imm(RTRS_HB_ACK_IMM, 0), 0x90000000u);
	CHECK_EQ(rtrs_to_imm(RTRS_IO_RSP_W_INV_IMM, 0x0abcdef), 0x20abcdefu);
	/* The payload is masked and cannot spill into the type. */
	CHECK_EQ(rtrs_to_imm(RTRS_IO_RSP_IMM, 0xffffffffu), 0x1fffffffu);
	rtrs_from_imm(0x9123abcdu, &type, &payload);
	CHECK_EQ(type, 9);
	CHECK_EQ(payload, 0x123abcd);

	/* Values from the kernel's formula ilog2(qd - 1) + 1. */
	CHECK_EQ(rtrs_chunk_bits(1), 1);
	CHECK_EQ(rtrs_chunk_bits(2), 1);
	CHECK_EQ(rtrs_chunk_bits(3), 2);
	CHECK_EQ(rtrs_chunk_bits(512), 9);
	CHECK_EQ(rtrs_chunk_bits(513), 10);
	CHECK_EQ(rtrs_chunk_bits(65535), 16);
	/* Known kernel immediate: qd 512, chunk 3, offset 100. */
	CHECK_EQ(rtrs_to_io_req_imm(512, 3, 100), (3u << 19) | 100);
}

static void test_imm_req(void)
{
	static const struct {
		unsigned qd;
		uint32_t chunk_size;  /* the largest that fits */
		unsigned mem_bits;
	} cases[] = {
		{ 1, RTRS_MAX_CHUNK_SIZE, 27 },
		{ 2, RTRS_MAX_CHUNK_SIZE, 27 },
		{ 512, 512u << 10, 19 },
		{ 2048, 128u << 10, 17 },
		{ 65535, 4096, 12 },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		unsigned qd = cases[i].qd, mb = cases[i].mem_bits;
		uint32_t cs = cases[i].chunk_size;
		const uint32_t ids[] = { 0, qd / 2, qd - 1 };
		const uint32_t offs[] = { 0, 1, cs / 2 + 3, cs - 4, cs - 1 };

		CHECK_EQ(rtrs_mem_bits(qd), mb);
		CHECK(rtrs_imm_fits(qd, cs), "qd %u chunk %u", qd, cs);
		CHECK(rtrs_imm_fits(qd, cs / 2));
		CHECK(!rtrs_imm_fits(qd, cs * 2), "qd %u chunk %u", qd, cs * 2);
		/* One more chunk needs one more id bit, except from 1 to 2. */
		if (qd == 1)
			CHECK(rtrs_imm_fits(2, cs));
		else if (qd < RTRS_MAX_SESS_QUEUE_DEPTH)
			CHECK(!rtrs_imm_fits(qd + 1, cs), "qd %u chunk %u", qd + 1, cs);

		for (size_t j = 0; j < ARRAY_SIZE(ids); j++) {
			for (size_t k = 0; k < ARRAY_SIZE(offs); k++) {
				uint32_t imm = rtrs_to_io_req_imm(qd, ids[j], offs[k]);
				unsigned type;
				uint32_t payload;

				rtrs_from_imm(imm, &type, &payload);
				CHECK_EQ(type, RTRS_IO_REQ_IMM);
				CHECK_EQ(payload >> mb, ids[j]);
				CHECK_EQ(payload & ((1u << mb) - 1), offs[k]);
			}
		}

		/*
		 * And through the decoder: all other chunks are zero (an invalid
		 * type), so decoding from the wrong chunk cannot pass.
		 */
		{
			uint32_t csz = MIN(cs, 64u << 10);
			struct rtrs_limits lim = { .queue_depth = qd, .chunk_size = csz,
						   .max_hdr_size = 1024 };
			void **bases = malloc(qd * sizeof(*bases));
			uint8_t *decoy = calloc(1, csz), *real = calloc(1, csz);
			uint32_t data = csz - 1024, usr = 16;

			for (size_t j = 0; j < ARRAY_SIZE(ids); j++) {
				struct rtrs_io_req out;
				uint32_t payload;
				unsigned type;

				for (unsigned c = 0; c < qd; c++)
					bases[c] = decoy;
				bases[ids[j]] = real;
				memset(real, 0, csz);
				rtrs_write_hdr_encode(real + data + usr, usr);
				rtrs_from_imm(rtrs_to_io_req_imm(qd, ids[j], data + usr), &type,
					      &payload);
				CHECK_ACCEPT(rtrs_io_req_decode(payload, &lim, bases, io_sgbuf, &out, WHY));
				CHECK_EQ(out.chunk, ids[j]);
				CHECK_EQ(out.off, data + usr);
				CHECK_EQ(out.data_len, data);
			}
			free(bases);
			free(decoy);
			free(real);
		}
	}
}

static void test_imm_rsp(void)
{
	static const uint32_t ids[] = { 0, 1, 4095, 65534, RTRS_RSP_ID_MAX };
	static const struct {
		int in, out;
	} errs[] = {
		{ 0, 0 }, { -1, -1 }, { -EIO, -EIO }, { -ENOMEM, -ENOMEM },
		{ -ECONNRESET, -ECONNRESET },
		{ -511, -511 }, { 7, -7 }, { 511, -511 },
		/* more than 9 bits: EIO rather than a truncated, unrelated errno */
		{ -512, -EIO }, { 512, -EIO }, { -4095, -EIO }, { -1025, -EIO },
		{ INT_MAX, -EIO }, { INT_MIN + 1, -EIO }, { INT_MIN, -EIO },
	};
	uint32_t id;
	int err;

	for (size_t i = 0; i < ARRAY_SIZE(ids); i++) {
		for (size_t j = 0; j < ARRAY_SIZE(errs); j++) {
			uint32_t imm = rtrs_to_io_rsp_imm(ids[i], errs[j].in), payload;
			unsigned type;

			rtrs_from_imm(imm, &type, &payload);
			CHECK_EQ(type, RTRS_IO_RSP_IMM);
			id = 0xdead;
			err = 0xdead;
			CHECK_ACCEPT(rtrs_io_rsp_decode(payload, RTRS_RSP_ID_MAX + 1, &id, &err,
							WHY));
			CHECK_EQ(id, ids[i]);
			CHECK(err == errs[j].out, "id %u errno %d -> %d, want %d", ids[i],
			      errs[j].in, err, errs[j].out);
		}
	}
	/* Kernel bit layout: |errno| << 19 | id. */
	CHECK_EQ(rtrs_to_io_rsp_imm(3, -5), 0x10000000u | (5u << 19) | 3);
	CHECK_EQ(rtrs_to_io_rsp_imm(RTRS_RSP_ID_MAX, -511), 0x1fffffffu);

	CHECK_ACCEPT(rtrs_io_rsp_decode(99, 100, &id, &err, WHY));
	CHECK_EQ(id, 99);
	CHECK_EQ(err, 0);
	CHECK_REJECT(-EINVAL, rtrs_io_rsp_decode(100, 100, &id, &err, WHY));
	CHECK_REJECT(-EINVAL, rtrs_io_rsp_decode((5u << 19) | 100, 100, &id, &err, WHY));
	CHECK_REJECT(-EINVAL, rtrs_io_rsp_decode(RTRS_RSP_ID_MAX, 65535, &id, &err, WHY));
	CHECK_REJECT(-EINVAL, rtrs_io_rsp_decode(0, 0, &id, &err, WHY));
}

/* ---- rkey_rsp ------------------------------------------------------------ */

static void test_rkey_rsp(void)
{
	uint8_t m[8];
	uint32_t id, rkey;

	put16(m, 0, RTRS_MSG_RKEY_RSP);
	put16(m, 2, 511);
	put32(m, 4, 0xcafef00d);
	id = rkey = 0;
	CHECK_ACCEPT(rkey_rsp_dec(m, sizeof(m), 512, &id, &rkey, WHY));
	CHECK_EQ(id, 511);
	CHECK_EQ(rkey, 0xcafef00d);
	put16(m, 2, 0);
	CHECK_ACCEPT(rkey_rsp_dec(m, sizeof(m), 1, &id, &rkey, WHY));
	CHECK_EQ(id, 0);

	put16(m, 2, 511);
	CHECK_REJECT(-EMSGSIZE, rkey_rsp_dec(m, 7, 512, &id, &rkey, WHY));
	CHECK_REJECT(-EMSGSIZE, rkey_rsp_dec(m, 0, 512, &id, &rkey, WHY));
	CHECK_REJECT(-EINVAL, rkey_rsp_dec(m, sizeof(m), 511, &id, &rkey, WHY));
	put16(m, 2, 0xffff);
	CHECK_REJECT(-EINVAL, rkey_rsp_dec(m, sizeof(m), 65535, &id, &rkey, WHY));
	put16(m, 2, 1);
	put16(m, 0, RTRS_MSG_INFO_RSP);
	CHECK_REJECT(-EPROTO, rkey_rsp_dec(m, sizeof(m), 512, &id, &rkey, WHY));
	put16(m, 0, RTRS_MSG_RKEY_RSP | 0x100);
	CHECK_REJECT(-EPROTO, rkey_rsp_dec(m, sizeof(m), 512, &id, &rkey, WHY));
}

static void test_fence(void)
{
	struct rtrs_msg_fence m;
	uint8_t uuid[RTRS_UUID_LEN], out[RTRS_UUID_LEN];
	const char *why;
	int32_t recon;
	int err;

	for (int i = 0; i < RTRS_UUID_LEN; i++)
		uuid[i] = (uint8_t)(i * 7 + 1);
	rtrs_fence_encode(&m, false, uuid, -1, 0);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE, out, &recon, &err, &why), 0);
	CHECK(!memcmp(uuid, out, sizeof(out)) && err == 0);
	CHECK_EQ(recon, -1);
	/* What a peer without incarnations sends: bytes 4..7 zero, any incarnation. */
	CHECK_EQ(((const uint8_t *)&m)[4] | ((const uint8_t *)&m)[5] | ((const uint8_t *)&m)[6] |
		 ((const uint8_t *)&m)[7], 0);
	/* An incarnation: le16 at 4, RTRS_FENCE_RECON_F in the le16 at 6. */
	rtrs_fence_encode(&m, false, uuid, 0x1234, 0);
	CHECK(((const uint8_t *)&m)[4] == 0x34 && ((const uint8_t *)&m)[5] == 0x12 &&
	      ((const uint8_t *)&m)[6] == 0x01 && ((const uint8_t *)&m)[7] == 0);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE, out, &recon, &err, &why), 0);
	CHECK_EQ(recon, 0x1234);
	rtrs_fence_encode(&m, false, uuid, 0, 0); /* incarnation 0 is one: the counter wrapped */
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE, out, &recon, &err, &why), 0);
	CHECK_EQ(recon, 0);
	m.flags = le16_put(0x8000); /* other bits: ignored, no incarnation */
	m.recon_cnt = le16_put(7);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE, out, &recon, &err, &why), 0);
	CHECK_EQ(recon, -1);
	rtrs_fence_encode(&m, true, uuid, -1, -EIO);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE_ACK, out, &recon, &err, &why), 0);
	CHECK_EQ(err, -EIO);
	why = NULL;
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE, out, &recon, &err, &why), -EPROTO);
	CHECK(why != NULL);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m) - 1, RTRS_MSG_FENCE_ACK, out, &recon, &err, &why),
		 -EMSGSIZE);
	rtrs_fence_encode(&m, false, uuid, -1, -EIO); /* a fence carries no errno */
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE, out, &recon, &err, &why), -EPROTO);
	m.errno_ = le16_put(5); /* positive */
	m.type = le16_put(RTRS_MSG_FENCE_ACK);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE_ACK, out, &recon, &err, &why), -EPROTO);
	m.errno_ = le16_put((uint16_t)-4096); /* beyond 1..4095 */
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE_ACK, out, &recon, &err, &why), -EPROTO);
	m.errno_ = le16_put((uint16_t)-4095);
	CHECK_EQ(rtrs_fence_decode(&m, sizeof(m), RTRS_MSG_FENCE_ACK, out, &recon, &err, &why), 0);
	CHECK_EQ(err, -4095);
}

/* Authentication names: what the wire carries, and what open/start accept. */
static void test_auth_names(void)
{
	char max[RTRS_AUTH_WIRE_NAME_MAX + 2];

	CHECK(rtrs_auth_name_valid("nqn.2014-08.org.nvmexpress:uuid:1"));
	CHECK(rtrs_auth_name_valid("rtrs-server"));
	CHECK(!rtrs_auth_name_valid(NULL));
	CHECK(!rtrs_auth_name_valid(""));
	CHECK(!rtrs_auth_name_valid("two words"));
	CHECK(!rtrs_auth_name_valid("tab\there"));
	CHECK(!rtrs_auth_name_valid("del\x7f"));
	CHECK(!rtrs_auth_name_valid("high\x80"));
	memset(max, 'n', sizeof(max));
	max[RTRS_AUTH_WIRE_NAME_MAX] = '\0';
	CHECK(rtrs_auth_name_valid(max));
	max[RTRS_AUTH_WIRE_NAME_MAX] = 'n';
	max[RTRS_AUTH_WIRE_NAME_MAX + 1] = '\0';
	CHECK(!rtrs_auth_name_valid(max));
}

/* A negotiate must offer at least one hash and one group, as the encoder demands. */
static void test_auth_negotiate_lists(void)
{
	static uint8_t buf[RTRS_AUTH_MSG_MAX];
	struct rtrs_auth_msg m = { .id = RTRS_AUTH_NEGOTIATE, .tid = 3, .nr_hashes = 1,
				   .hashes = { 1 }, .nr_groups = 1, .groups = { 0 },
				   .host = "nqn.test", .server = "srv" }, out;
	size_t at = sizeof(struct rtrs_msg_auth), len;
	const char *why = NULL;

	len = rtrs_auth_encode(buf, sizeof(buf), &m);
	CHECK(len > 0);
	CHECK_EQ(rtrs_auth_decode(buf, len, &out, &why), 0);
	CHECK_EQ(out.nr_hashes, 1u);
	buf[at + offsetof(struct rtrs_auth_negotiate, halen)] = 0;
	CHECK_EQ(rtrs_auth_decode(buf, len, &out, &why), -EINVAL);
	CHECK(why && strstr(why, "no hash or no group"), "%s", why);
	buf[at + offsetof(struct rtrs_auth_negotiate, halen)] = 1;
	buf[at + offsetof(struct rtrs_auth_negotiate, dhlen)] = 0;
	CHECK_EQ(rtrs_auth_decode(buf, len, &out, &why), -EINVAL);
	m.nr_groups = 0;
	CHECK_EQ(rtrs_auth_encode(buf, sizeof(buf), &m), 0u);
}

int main(void)
{
	test_fence();
	test_auth_names();
	test_auth_negotiate_lists();
	for (int i = 0; i < IO_QD; i++) {
		io_bases[i] = calloc(1, IO_CHUNK);
		if (!io_bases[i])
			return 1;
	}

	test_conn_req();
	test_conn_rsp();
	test_names();
	test_info_req();
	test_info_rsp();
	test_info_rsp_ext();
	test_io_write();
	test_io_read();
	test_io_chunk_id();
	test_imm_generic();
	test_imm_req();
	test_imm_rsp();
	test_rkey_rsp();

	for (int i = 0; i < IO_QD; i++)
		free(io_bases[i]);
	return test_done("proto");
}
