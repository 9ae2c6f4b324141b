/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for every RTRS wire decoder (lib/rtrs/rtrs-proto.c).
 *
 * Input layout: byte 0 picks the decoder; the bytes after it give that
 * decoder's limits (if any) and then the message. Whatever a decoder accepts
 * must satisfy the invariants the rest of the library relies on, and must
 * survive re-encoding unchanged; a violation aborts so libFuzzer keeps the
 * input. Messages are decoded from heap copies of exactly their length, and
 * chunks are heap buffers of exactly chunk_size bytes, so ASan reports any
 * read past either.
 *
 *   0 conn_req   [msg]
 *   1 conn_rsp   [msg]
 *   2 info_req   [msg]           (decoded as from a client of ours and from a kernel one)
 *   3 info_rsp   [qd:le16][key64:bit 7, kernel peer:bit 6, chunk shift:bits 0-5][msg]
 *   4 io_req     [chunk shift:u8][qd:le16][max_hdr:le16][payload:le32][chunk bytes]
 *   5 io_rsp     [qd:le32][payload:le32]
 *   6 rkey_rsp   [qd:le32][msg]
 *   7 name       [string]
 *   8 auth       [msg]           (DH-HMAC-CHAP messages in their envelope)
 *   9 new_rkey   [buf_id:le16][slot]
 *  10 fence      [ack?:1][msg]   (FENCE or FENCE_ACK, re-encoded)
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rtrs-proto.h"


/* Chunk sizes 8 KiB .. 128 KiB; larger ones add nothing but memory. */
#define CHUNK_SHIFT_MIN 13
#define CHUNK_SHIFTS 5
/* A few distinct chunk buffers; chunk i uses buffer i % NBUFS. */
#define NBUFS 3

static uint8_t *bufs[CHUNK_SHIFTS][NBUFS];
static void **bases[CHUNK_SHIFTS];

static void init_once(void)
{
	static int done;

	if (done)
		return;
	done = 1;
	for (int s = 0; s < CHUNK_SHIFTS; s++) {
		size_t cs = (size_t)1 << (CHUNK_SHIFT_MIN + s);

		bases[s] = malloc(RTRS_MAX_SESS_QUEUE_DEPTH * sizeof(void *));
		if (!bases[s])
			abort();
		for (int b = 0; b < NBUFS; b++) {
			/* Exactly one chunk: ASan's redzone starts at its end. */
			bufs[s][b] = malloc(cs);
			if (!bufs[s][b])
				abort();
		}
		for (unsigned i = 0; i < RTRS_MAX_SESS_QUEUE_DEPTH; i++)
			bases[s][i] = bufs[s][i % NBUFS];
	}
}

static void fuzz_conn_req(const uint8_t *p, size_t n)
{
	struct rtrs_conn_req r, r2;
	struct rtrs_msg_conn_req m;
	const char *why = NULL;
	void *b = dup_exact(p, n);
	int rc = rtrs_conn_req_decode(b, n, &r, &why);

	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(r.cid_num == 0 || r.cid_num > RTRS_MAX_CONNS || r.cid >= r.cid_num);
	rtrs_conn_req_encode(&m, &r);
	FAIL_IF(rtrs_conn_req_decode(&m, sizeof(m), &r2, NULL) != 0);
	FAIL_IF(r2.cid != r.cid || r2.cid_num != r.cid_num || r2.recon_cnt != r.recon_cnt ||
		r2.first_conn != r.first_conn || r2.ext != r.ext || r2.fence != r.fence ||
		r2.auth != r.auth ||
		memcmp(r2.sess_uuid, r.sess_uuid, RTRS_UUID_LEN) ||
		memcmp(r2.paths_uuid, r.paths_uuid, RTRS_UUID_LEN));
	/* Our bits only with EXT: a kernel client's reserved bits mean nothing. */
	FAIL_IF(!r.ext && (r.fence || r.auth));
	/* Everything but the CM bytes, reserved bits and the minor version is preserved. */
	FAIL_IF(memcmp((const uint8_t *)&m + 6, p + 6, 38));
}

static void fuzz_conn_rsp(const uint8_t *p, size_t n)
{
	struct rtrs_conn_rsp r, r2;
	struct rtrs_msg_conn_rsp m;
	const char *why = NULL;
	void *b = dup_exact(p, n);
	int rc = rtrs_conn_rsp_decode(b, n, &r, &why);

	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(r.err > 0);
	/* What a 6.1 kernel client could take for a pointer never gets through. */
	FAIL_IF(r.err < RTRS_REJ_ERRNO_MIN);
	/* Without EXT only the kernel's bit, and nothing of the reserved bytes. */
	FAIL_IF(!r.ext && (r.flags & ~RTRS_MSG_NEW_RKEY_F || r.imm_desc.addr || r.imm_desc.key ||
			   r.imm_desc.len || r.sess_id));
	if (r.err) {
		FAIL_IF(r.queue_depth || r.chunk_size);
	} else {
		FAIL_IF(n < sizeof(m));
		FAIL_IF(r.queue_depth == 0);
		FAIL_IF(r.max_hdr_size < 24 || r.max_hdr_size > RTRS_MAX_HDR_SIZE);
		FAIL_IF(r.max_io_size == 0);
		FAIL_IF((uint64_t)r.max_io_size + r.max_hdr_size != r.chunk_size);
		FAIL_IF(!is_pow2(r.chunk_size) || r.chunk_size < RTRS_MIN_CHUNK_SIZE ||
			r.chunk_size > RTRS_MAX_CHUNK_SIZE);
		FAIL_IF(!rtrs_imm_fits(r.queue_depth, r.chunk_size));
		/* The last chunk and its last byte must survive the immediate. */
		{
			unsigned mb = rtrs_mem_bits(r.queue_depth), type;
			uint32_t payload;

			rtrs_from_imm(rtrs_to_io_req_imm(r.queue_depth, r.queue_depth - 1u,
							 r.chunk_size - 1u), &type, &payload);
			FAIL_IF(type != RTRS_IO_REQ_IMM);
			FAIL_IF(payload >> mb != r.queue_depth - 1u);
			FAIL_IF((payload & ((1u << mb) - 1)) != r.chunk_size - 1u);
		}
	}
	rtrs_conn_rsp_encode(&m, &r);
	FAIL_IF(rtrs_conn_rsp_decode(&m, sizeof(m), &r2, NULL) != 0);
	FAIL_IF(r2.err != r.err || r2.queue_depth != r.queue_depth ||
		r2.max_io_size != r.max_io_size || r2.max_hdr_size != r.max_hdr_size ||
		r2.chunk_size != r.chunk_size || r2.flags != r.flags || r2.ext != r.ext ||
		r2.kernel_inval != r.kernel_inval || r2.dnr != r.dnr || r2.sess_id != r.sess_id ||
		r2.imm_desc.addr != r.imm_desc.addr || r2.imm_desc.key != r.imm_desc.key ||
		r2.imm_desc.len != r.imm_desc.len);
}

static void fuzz_info_req(const uint8_t *p, size_t n)
{
	struct rtrs_info_req r, r2;
	struct rtrs_msg_info_req m;
	const char *why = NULL;
	void *b = dup_exact(p, n);
	int rc = rtrs_info_req_decode(b, n, true, &r, &why);
	int rc_kernel = rtrs_info_req_decode(b, n, false, &r2, NULL);

	CHECK_WHY(rc, why);
	free(b);
	/* From a kernel client: the same verdict, the same name, no imm target. */
	FAIL_IF(rc != rc_kernel);
	if (rc)
		return;
	FAIL_IF(strcmp(r.pathname, r2.pathname) || r2.imm_addr || r2.imm_key);
	FAIL_IF(!rtrs_name_valid(r.pathname));
	FAIL_IF(strlen(r.pathname) > RTRS_NAME_MAX);
	rtrs_info_req_encode(&m, &r);
	FAIL_IF(rtrs_info_req_decode(&m, sizeof(m), true, &r2, NULL) != 0);
	FAIL_IF(strcmp(r.pathname, r2.pathname) || r.imm_addr != r2.imm_addr ||
		r.imm_key != r2.imm_key);
}

static void fuzz_info_rsp(const uint8_t *p, size_t n)
{
	struct rtrs_limits lim = { 0 };
	struct rtrs_desc *chunks;
	uint32_t *gens;
	int verdict;
	bool dnr;
	const char *why = NULL;
	unsigned sg_cnt;
	uint8_t shape;
	void *b;
	int rc;

	lim.queue_depth = take16(&p, &n);
	shape = take8(&p, &n);
	lim.key64 = shape & 0x80;
	lim.ext = !(shape & 0x40);
	lim.chunk_size = 1u << (CHUNK_SHIFT_MIN + (shape & 0x3f) % 15); /* .. 128 MiB */
	lim.max_hdr_size = RTRS_MAX_HDR_SIZE;
	if (!lim.queue_depth)
		lim.queue_depth = 1;
	/* Exactly queue_depth entries: ASan reports a write past them. */
	chunks = malloc(lim.queue_depth * sizeof(*chunks));
	gens = malloc(lim.queue_depth * sizeof(*gens));
	b = dup_exact(p, n);
	if (!chunks || !gens)
		abort();
	rc = rtrs_info_rsp_decode(b, n, &lim, chunks, gens, &verdict, &dnr, &why);
	CHECK_WHY(rc, why);
	free(b);
	if (rc || verdict) {
		FAIL_IF(verdict > 0);
		FAIL_IF(verdict && !lim.ext); /* a kernel server sends no verdicts */
		free(chunks);
		free(gens);
		return;
	}
	sg_cnt = (unsigned)(p[2] | p[3] << 8);
	FAIL_IF(sg_cnt == 0 || lim.queue_depth % sg_cnt ||
		n < rtrs_info_rsp_size(sg_cnt, lim.ext && lim.key64 ? lim.queue_depth : 0));
	for (unsigned i = 0; i < lim.queue_depth; i++) {
		unsigned per = lim.queue_depth / sg_cnt, d = i / per;
		const uint8_t *rec = p + 8 + 16 * (size_t)sg_cnt + 16 * (size_t)i;
		uint64_t base, key64;
		uint32_t key, gen;

		memcpy(&base, p + 8 + 16 * d, 8);
		memcpy(&key, p + 8 + 16 * d + 8, 4);
		base = le64toh(base);
		FAIL_IF(chunks[i].len != lim.chunk_size);
		if (lim.ext && lim.key64) {
			/* Each chunk's key and generation from its own record. */
			memcpy(&gen, rec + 4, 4);
			memcpy(&key64, rec + 8, 8);
			FAIL_IF((rec[0] | rec[1] << 8) != RTRS_MSG_RKEY_RSP);
			FAIL_IF((unsigned)(rec[2] | rec[3] << 8) != (i & 0xffff));
			FAIL_IF(chunks[i].key != le64toh(key64) || gens[i] != le32toh(gen));
		} else {
			FAIL_IF(chunks[i].key != le32toh(key));
		}
		FAIL_IF(chunks[i].addr != base + (uint64_t)(i % per) * lim.chunk_size);
		/* The whole chunk is addressable without wrapping. */
		FAIL_IF(chunks[i].addr > UINT64_MAX - lim.chunk_size + 1);
	}
	free(chunks);
	free(gens);
}

/*
 * Whatever the authentication decoder accepts is structurally sound: its
 * pointers stay inside the message, its lengths agree with the hash and
 * group, and encoding it again gives a message that decodes to the same.
 */
static void fuzz_auth(const uint8_t *p, size_t n)
{
	struct rtrs_auth_msg m, m2;
	static uint8_t out[RTRS_AUTH_MSG_MAX];
	const char *why = NULL;
	uint8_t *b = dup_exact(p, n);
	const uint8_t *end = b + n;
	size_t len;
	int rc = rtrs_auth_decode(b, n, &m, &why);

	CHECK_WHY(rc, why);
	if (rc) {
		free(b);
		return;
	}
	FAIL_IF(m.c && (m.c < b || m.c + m.hl > end));
	FAIL_IF(m.r && (m.r < b || m.r + m.hl > end));
	FAIL_IF(m.dhv && (m.dhv < b || m.dhv + m.dhvlen > end));
	FAIL_IF(m.dhvlen > RTRS_AUTH_WIRE_MAX_DHV);
	switch (m.id) {
	case RTRS_AUTH_NEGOTIATE:
		FAIL_IF(!m.nr_hashes || m.nr_hashes > RTRS_AUTH_MAX_IDS);
		FAIL_IF(!m.nr_groups || m.nr_groups > RTRS_AUTH_MAX_IDS);
		FAIL_IF(!rtrs_auth_name_valid(m.host) || !rtrs_auth_name_valid(m.server));
		break;
	case RTRS_AUTH_CHALLENGE:
		FAIL_IF(!m.c || m.hl != rtrs_auth_wire_hash_len(m.hash));
		FAIL_IF(m.dhvlen != rtrs_auth_wire_dh_len(m.group));
		FAIL_IF(m.group && !m.dhv);
		break;
	case RTRS_AUTH_REPLY:
		FAIL_IF(!m.r || m.valid != (m.c != NULL));
		break;
	case RTRS_AUTH_SUCCESS1:
		FAIL_IF(m.valid != (m.r != NULL));
		break;
	}
	len = rtrs_auth_encode(out, sizeof(out), &m);
	FAIL_IF(len == 0 || len > n);
	FAIL_IF(rtrs_auth_decode(out, len, &m2, &why) != 0);
	FAIL_IF(m2.id != m.id || m2.tid != m.tid || m2.hl != m.hl || m2.seq != m.seq ||
		m2.valid != m.valid || m2.dhvlen != m.dhvlen || m2.fail_exp != m.fail_exp ||
		m2.hash != m.hash || m2.group != m.group || m2.scc != m.scc);
	FAIL_IF(m2.nr_hashes != m.nr_hashes || m2.nr_groups != m.nr_groups ||
		memcmp(m2.hashes, m.hashes, m.nr_hashes) ||
		memcmp(m2.groups, m.groups, m.nr_groups) ||
		strcmp(m2.host, m.host) || strcmp(m2.server, m.server));
	FAIL_IF((m.c != NULL) != (m2.c != NULL) || (m.c && memcmp(m.c, m2.c, m.hl)));
	FAIL_IF((m.r != NULL) != (m2.r != NULL) || (m.r && memcmp(m.r, m2.r, m.hl)));
	FAIL_IF((m.dhv != NULL) != (m2.dhv != NULL) ||
		(m.dhv && memcmp(m.dhv, m2.dhv, m.dhvlen)));
	free(b);
}

/* A key slot: accepted only when it names the chunk it sits in. */
static void fuzz_new_rkey(const uint8_t *p, size_t n)
{
	uint32_t id = take16(&p, &n), gen = 0;
	uint64_t key = 0;
	const char *why = NULL;
	struct rtrs_msg_new_rkey again;
	uint8_t *slot;
	int rc;

	if (n < sizeof(struct rtrs_msg_new_rkey))
		return;
	slot = dup_exact(p, sizeof(struct rtrs_msg_new_rkey));
	rc = rtrs_new_rkey_decode(slot, id, &gen, &key, &why);
	CHECK_WHY(rc, why);
	if (!rc) {
		rtrs_new_rkey_encode(&again, id, gen, key);
		FAIL_IF(memcmp(&again, slot, sizeof(again)));
	}
	free(slot);
}

static void fuzz_io_req(const uint8_t *p, size_t n)
{
	unsigned shift = take8(&p, &n) % CHUNK_SHIFTS;
	uint32_t cs = 1u << (CHUNK_SHIFT_MIN + shift);
	/* The largest queue depth whose ids fit beside this chunk size. */
	uint32_t qd_max = MIN(1u << (RTRS_IMM_PAYL_BITS - (CHUNK_SHIFT_MIN + shift)),
			      (uint32_t)RTRS_MAX_SESS_QUEUE_DEPTH);
	struct rtrs_limits lim = { 0 };
	struct rtrs_io_req r;
	const char *why = NULL;
	uint32_t payload, chunk, off, raw;
	unsigned mb;
	const uint8_t *base, *end;
	uint8_t *target;
	int rc;

	lim.chunk_size = cs;
	lim.queue_depth = 1 + take16(&p, &n) % qd_max;
	lim.max_hdr_size = 24 + take16(&p, &n) % (RTRS_MAX_HDR_SIZE - 24 + 1);
	raw = take32(&p, &n);
	/* Mostly a proper 28-bit payload, sometimes whatever came in. */
	payload = raw & 0x80000000u ? raw : raw & RTRS_IMM_PAYL_MASK;
	if (!rtrs_imm_fits(lim.queue_depth, cs))
		abort(); /* the harness computed qd_max wrongly */

	/* Put the rest of the input where the payload says the header is. */
	mb = rtrs_mem_bits(lim.queue_depth);
	chunk = payload >> mb;
	off = payload & ((1u << mb) - 1);
	if (chunk < lim.queue_depth) {
		target = bufs[shift][chunk % NBUFS];
		memset(target, 0, cs);
		if (off < cs)
			memcpy(target + off, p, MIN(n, cs - off));
	}

	static struct rtrs_desc sgbuf[RTRS_MAX_READ_SG];

	rc = rtrs_io_req_decode(payload, &lim, bases[shift], sgbuf, &r, &why);
	CHECK_WHY(rc, why);
	if (rc)
		return;

	base = bufs[shift][r.chunk % NBUFS];
	end = base + cs;
	FAIL_IF(r.chunk != chunk || r.off != off);
	FAIL_IF(r.chunk >= lim.queue_depth);
	FAIL_IF(r.type != RTRS_MSG_WRITE && r.type != RTRS_MSG_READ);
	FAIL_IF((uint64_t)r.data_len + r.usr_len != r.off);
	FAIL_IF(r.data_len > cs - lim.max_hdr_size);
	FAIL_IF(r.usr_len + rtrs_io_hdr_size(r.type == RTRS_MSG_READ, r.sg_cnt) >
		lim.max_hdr_size);
	FAIL_IF(r.off + rtrs_io_hdr_size(r.type == RTRS_MSG_READ, r.sg_cnt) > cs);
	if (r.type == RTRS_MSG_WRITE) {
		uint8_t hdr[4];

		FAIL_IF(r.sg || r.sg_cnt || r.flags);
		rtrs_write_hdr_encode(hdr, r.usr_len);
		FAIL_IF(memcmp(hdr, base + r.off, sizeof(hdr)));
	} else {
		const uint8_t *sg = base + r.off + 8;
		struct rtrs_desc d[RTRS_MAX_READ_SG];
		uint8_t hdr[8 + 16 * RTRS_MAX_READ_SG];
		uint64_t sum = 0;

		FAIL_IF(r.sg_cnt > RTRS_MAX_READ_SG);
		FAIL_IF(r.flags & ~RTRS_MSG_NEED_INVAL_F);
		FAIL_IF(r.sg != sgbuf);
		FAIL_IF(sg < base || sg + 16 * (size_t)r.sg_cnt > end);
		for (unsigned i = 0; i < r.sg_cnt; i++) {
			uint64_t a;
			uint32_t k, l;

			memcpy(&a, sg + 16 * i, 8);
			memcpy(&k, sg + 16 * i + 8, 4);
			memcpy(&l, sg + 16 * i + 12, 4);
			d[i] = (struct rtrs_desc){ le64toh(a), le32toh(k), le32toh(l) };
			FAIL_IF(d[i].len == 0);
			sum += d[i].len;
		}
		FAIL_IF(sum != r.data_len);
		rtrs_read_hdr_encode(hdr, r.usr_len, r.flags, d, r.sg_cnt);
		FAIL_IF(memcmp(hdr, base + r.off, rtrs_io_hdr_size(true, r.sg_cnt)));
	}
	/* The client's encoder names the same place. */
	{
		unsigned type;
		uint32_t again;

		rtrs_from_imm(rtrs_to_io_req_imm(lim.queue_depth, r.chunk, r.off), &type, &again);
		FAIL_IF(type != RTRS_IO_REQ_IMM || again != payload);
	}
}

static void fuzz_io_rsp(const uint8_t *p, size_t n)
{
	uint32_t qd = take32(&p, &n), payload = take32(&p, &n), id = 0;
	const char *why = NULL;
	int err = 1, rc;

	rc = rtrs_io_rsp_decode(payload, qd, &id, &err, &why);
	CHECK_WHY(rc, why);
	if (rc)
		return;
	FAIL_IF(id >= qd || id > RTRS_RSP_ID_MAX);
	FAIL_IF(err > 0 || err < -(int)RTRS_RSP_ERRNO_MAX);
	/* Re-encoding gives the same payload, up to bits beyond the 28. */
	{
		unsigned type;
		uint32_t again;

		rtrs_from_imm(rtrs_to_io_rsp_imm(id, err), &type, &again);
		FAIL_IF(type != RTRS_IO_RSP_IMM || again != (payload & RTRS_IMM_PAYL_MASK));
	}
}

static void fuzz_rkey_rsp(const uint8_t *p, size_t n)
{
	uint32_t qd = take32(&p, &n), id = UINT32_MAX, rkey;
	const char *why = NULL;
	void *b = dup_exact(p, n);
	int rc = rtrs_rkey_rsp_decode(b, n, qd, &id, &rkey, &why);

	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(id >= qd);
	FAIL_IF(id != (uint32_t)(p[2] | p[3] << 8));
}

/* A fence or its ack: what decodes encodes back to the same bytes, as far as they mean anything. */
static void fuzz_fence(const uint8_t *p, size_t n)
{
	enum rtrs_msg_type type = n && (p[0] & 1) ? RTRS_MSG_FENCE_ACK : RTRS_MSG_FENCE;
	uint8_t uuid[RTRS_UUID_LEN];
	struct rtrs_msg_fence m;
	const char *why = NULL;
	int32_t recon = INT32_MIN, recon2;
	int err = INT_MIN, err2, rc;
	void *b;

	if (n) {
		p++;
		n--;
	}
	b = dup_exact(p, n);
	rc = rtrs_fence_decode(b, n, type, uuid, &recon, &err, &why);
	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(recon < -1 || recon > UINT16_MAX);
	FAIL_IF(err > 0 || err < INT16_MIN || (type == RTRS_MSG_FENCE && err));
	rtrs_fence_encode(&m, type == RTRS_MSG_FENCE_ACK, uuid, recon, err);
	FAIL_IF(rtrs_fence_decode(&m, sizeof(m), type, uuid, &recon2, &err2, &why));
	FAIL_IF(recon2 != recon || err2 != err);
	FAIL_IF(memcmp(m.path_uuid, p + 8, RTRS_UUID_LEN));
}

static void fuzz_name(const uint8_t *p, size_t n)
{
	char s[RTRS_NAME_MAX + 8];
	size_t len = MIN(n, sizeof(s) - 1);
	bool ok;

	memcpy(s, p, len);
	s[len] = '\0';
	ok = rtrs_name_valid(s);
	len = strlen(s);
	/* Printable ASCII without space and '/', and not "." or "..". */
	FAIL_IF(ok != (len >= 1 && len <= RTRS_NAME_MAX &&
		       strspn(s, "!\"#$%&'()*+,-.0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ"
				 "[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~") == len &&
		       strcmp(s, ".") && strcmp(s, "..")));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	init_once();
	switch (data[0] % 11) {
	case 0:
		fuzz_conn_req(data + 1, size - 1);
		break;
	case 1:
		fuzz_conn_rsp(data + 1, size - 1);
		break;
	case 2:
		fuzz_info_req(data + 1, size - 1);
		break;
	case 3:
		fuzz_info_rsp(data + 1, size - 1);
		break;
	case 4:
		fuzz_io_req(data + 1, size - 1);
		break;
	case 5:
		fuzz_io_rsp(data + 1, size - 1);
		break;
	case 6:
		fuzz_rkey_rsp(data + 1, size - 1);
		break;
	case 7:
		fuzz_name(data + 1, size - 1);
		break;
	case 8:
		fuzz_auth(data + 1, size - 1);
		break;
	case 9:
		fuzz_new_rkey(data + 1, size - 1);
		break;
	case 10:
		fuzz_fence(data + 1, size - 1);
		break;
	}
	return 0;
}
