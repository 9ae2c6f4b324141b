/* SPDX-License-Identifier: MIT */
/*
 * Encode and validate RTRS wire messages. Nothing else in the project reads
 * or writes raw RTRS bytes.
 */
#include <errno.h>
#include <string.h>

#include "rtrs-proto.h"

bool rtrs_name_valid(const char *name)
{
	size_t n = strnlen(name, RTRS_NAME_MAX + 1);

	if (n == 0 || n > RTRS_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];

		if (c <= ' ' || c >= 0x7f || c == '/')
			return false;
	}
	/* A path component of its own (%SESSNAME%): not "." or "..". */
	return strcmp(name, ".") && strcmp(name, "..");
}

/* ---- connection messages ------------------------------------------------ */

void rtrs_conn_req_encode(struct rtrs_msg_conn_req *m, const struct rtrs_conn_req *r)
{
	memset(m, 0, sizeof(*m)); /* the two CM bytes too: 0, as the kernel sends them */
	m->magic = le16_put(RTRS_MAGIC);
	m->version = le16_put(RTRS_PROTO_VER);
	m->cid = le16_put(r->cid);
	m->cid_num = le16_put(r->cid_num);
	m->recon_cnt = le16_put(r->recon_cnt);
	memcpy(m->sess_uuid, r->sess_uuid, RTRS_UUID_LEN);
	memcpy(m->paths_uuid, r->paths_uuid, RTRS_UUID_LEN);
	m->flags = r->first_conn ? RTRS_CONN_FIRST : 0;
	if (r->ext)
		m->flags |= RTRS_CONN_EXT | (r->fence ? RTRS_CONN_FENCE : 0) |
			    (r->auth ? RTRS_CONN_AUTH : 0) | (r->concat ? RTRS_CONN_CONCAT : 0);
}

static int check_magic_version(struct le16 magic, struct le16 version, const char **why)
{
	if (le16_get(magic) != RTRS_MAGIC)
		REJECT(-EPROTO, "bad magic");
	if ((le16_get(version) >> 8) != RTRS_PROTO_VER_MAJOR)
		REJECT(-EPROTONOSUPPORT, "unsupported protocol major version");
	return 0;
}

int rtrs_conn_req_decode(const void *buf, size_t len, struct rtrs_conn_req *out,
			 const char **why)
{
	struct rtrs_msg_conn_req m;
	int rc;

	/* A CM may deliver more than was sent (it pads): only the message is read. */
	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "connect request shorter than 56 bytes");
	memcpy(&m, buf, sizeof(m));
	/* The two CM bytes are not checked: the CM may write them (AF_IB). */
	rc = check_magic_version(m.magic, m.version, why);
	if (rc)
		return rc;
	out->cid = le16_get(m.cid);
	out->cid_num = le16_get(m.cid_num);
	out->recon_cnt = le16_get(m.recon_cnt);
	if (out->cid_num == 0 || out->cid_num > RTRS_MAX_CONNS)
		REJECT(-EINVAL, "connection count out of range");
	if (out->cid >= out->cid_num)
		REJECT(-EINVAL, "connection id beyond connection count");
	/*
	 * Unknown flag bits are extensions this side does not speak: ignored.
	 * Ours count only with EXT: a kernel client's bits 1..7 are reserved.
	 */
	out->first_conn = m.flags & RTRS_CONN_FIRST;
	out->ext = m.flags & RTRS_CONN_EXT;
	out->fence = out->ext && (m.flags & RTRS_CONN_FENCE);
	out->auth = out->ext && (m.flags & RTRS_CONN_AUTH);
	out->concat = out->ext && (m.flags & RTRS_CONN_CONCAT);
	memcpy(out->sess_uuid, m.sess_uuid, RTRS_UUID_LEN);
	memcpy(out->paths_uuid, m.paths_uuid, RTRS_UUID_LEN);
	return 0;
}

/* Keys in descriptors are 32-bit: the fabric layer hands out no wider ones for them. */
static struct rtrs_sg_desc desc_put(const struct rtrs_desc *d)
{
	return (struct rtrs_sg_desc){
		.addr = le64_put(d->addr), .key = le32_put((uint32_t)d->key),
		.len = le32_put(d->len),
	};
}

static struct rtrs_desc desc_get(const struct rtrs_sg_desc *w)
{
	struct rtrs_sg_desc d;

	memcpy(&d, w, sizeof(d));
	return (struct rtrs_desc){
		.addr = le64_get(d.addr), .key = le32_get(d.key), .len = le32_get(d.len),
	};
}

void rtrs_conn_rsp_encode(struct rtrs_msg_conn_rsp *m, const struct rtrs_conn_rsp *r)
{
	memset(m, 0, sizeof(*m));
	m->magic = le16_put(RTRS_MAGIC);
	m->version = le16_put(RTRS_PROTO_VER);
	if (r->err) {
		int err = r->err;

		/*
		 * A 6.1 kernel client hands the errno of a reject up as an
		 * ERR_PTR, which IS_ERR() does not see outside -4095..-1: its
		 * rnbd-client then dereferences it.
		 */
		assert(err >= RTRS_REJ_ERRNO_MIN && err <= -1);
		if (err < RTRS_REJ_ERRNO_MIN || err > -1)
			err = -ECONNRESET;
		/* A reject carries magic, version, errno and flags only. */
		m->errno_ = le16_put((uint16_t)(int16_t)err);
		m->flags = le32_put(r->dnr ? RTRS_MSG_DNR_F : 0);
		return;
	}
	m->queue_depth = le16_put(r->queue_depth);
	m->max_io_size = le32_put(r->max_io_size);
	m->max_hdr_size = le32_put(r->max_hdr_size);
	if (!r->ext) {
		/* The kernel's answer: its one flag, and zeros where it has reserved bytes. */
		m->flags = le32_put(r->flags & RTRS_MSG_NEW_RKEY_F);
		return;
	}
	m->flags = le32_put(r->flags | RTRS_MSG_EXT_F);
	m->imm_desc = desc_put(&r->imm_desc);
	m->sess_id = le64_put(r->sess_id);
}

int rtrs_conn_rsp_decode(const void *buf, size_t len, struct rtrs_conn_rsp *out,
			 const char **why)
{
	struct rtrs_msg_conn_rsp m;
	uint32_t chunk, flags;
	int rc;

	/* Rejects too are 56 bytes; an IB CM pads both (REP 196, REJ 148 bytes). */
	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "connect response shorter than 56 bytes");
	memcpy(&m, buf, sizeof(m));
	rc = check_magic_version(m.magic, m.version, why);
	if (rc)
		return rc;
	memset(out, 0, sizeof(*out));
	out->err = (int16_t)le16_get(m.errno_);
	flags = le32_get(m.flags);
	if (out->err > 0)
		REJECT(-EPROTO, "positive errno in connect response");
	if (out->err) {
		if (out->err < RTRS_REJ_ERRNO_MIN)
			REJECT(-EPROTO, "reject errno beyond -4095");
		/* A kernel server sends 0 there: retry. */
		out->dnr = flags & RTRS_MSG_DNR_F;
		return 0;
	}
	out->queue_depth = le16_get(m.queue_depth);
	out->max_io_size = le32_get(m.max_io_size);
	out->max_hdr_size = le32_get(m.max_hdr_size);
	out->ext = flags & RTRS_MSG_EXT_F;
	out->kernel_inval = flags & RTRS_MSG_NEW_RKEY_F;
	if (out->ext) {
		out->flags = flags;
		out->imm_desc = desc_get(&m.imm_desc);
		out->sess_id = le64_get(m.sess_id);
	} else {
		/* A kernel server: its reserved bytes and bits mean nothing to us. */
		out->flags = flags & RTRS_MSG_NEW_RKEY_F;
	}
	if (out->queue_depth == 0)
		REJECT(-EINVAL, "queue depth 0");
	if (out->max_hdr_size < sizeof(struct rtrs_msg_rdma_read) + sizeof(struct rtrs_sg_desc) ||
	    out->max_hdr_size > RTRS_MAX_HDR_SIZE)
		REJECT(-EINVAL, "header size out of range");
	if (out->max_io_size == 0 || add_overflow(out->max_io_size, out->max_hdr_size, &chunk))
		REJECT(-EINVAL, "io size out of range");
	if (!is_pow2(chunk) || chunk < RTRS_MIN_CHUNK_SIZE || chunk > RTRS_MAX_CHUNK_SIZE)
		REJECT(-EINVAL, "chunk size not a power of two in range");
	if (!rtrs_imm_fits(out->queue_depth, chunk))
		REJECT(-EINVAL, "queue depth and chunk size do not fit the immediate");
	if ((uint32_t)out->queue_depth - 1u > RTRS_RSP_ID_MAX)
		REJECT(-EINVAL, "queue depth beyond response id space");
	out->chunk_size = chunk;
	return 0;
}

/* ---- info exchange ----------------------------------------------------- */

void rtrs_info_req_encode(struct rtrs_msg_info_req *m, const struct rtrs_info_req *r)
{
	memset(m, 0, sizeof(*m));
	m->type = le16_put(RTRS_MSG_INFO_REQ);
	memcpy(m->pathname, r->pathname, strnlen(r->pathname, RTRS_NAME_MAX));
	m->imm_addr = le64_put(r->imm_addr);
	m->imm_key = le32_put(r->imm_key);
}

int rtrs_info_req_decode(const void *buf, size_t len, bool ext, struct rtrs_info_req *out,
			 const char **why)
{
	struct rtrs_msg_info_req m;

	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "info request too short");
	memcpy(&m, buf, sizeof(m));
	if (le16_get(m.type) != RTRS_MSG_INFO_REQ)
		REJECT(-EPROTO, "not an info request");
	memset(out, 0, sizeof(*out));
	memcpy(out->pathname, m.pathname, RTRS_NAME_MAX);
	out->pathname[RTRS_NAME_MAX] = '\0';
	if (!rtrs_name_valid(out->pathname))
		REJECT(-EINVAL, "invalid session name");
	/* A kernel client's reserved bytes: no imm target (empty writes go nowhere). */
	if (ext) {
		out->imm_addr = le64_get(m.imm_addr);
		out->imm_key = le32_get(m.imm_key);
	}
	return 0;
}

size_t rtrs_info_rsp_size(unsigned sg_cnt, unsigned nr_keys)
{
	return sizeof(struct rtrs_msg_info_rsp) + (size_t)sg_cnt * sizeof(struct rtrs_sg_desc) +
	       (size_t)nr_keys * sizeof(struct rtrs_msg_new_rkey);
}

void rtrs_info_rsp_encode(void *buf, const struct rtrs_desc *descs, unsigned sg_cnt)
{
	struct rtrs_msg_info_rsp *m = buf;
	char *at = (char *)m->desc;

	memset(m, 0, sizeof(*m));
	m->type = le16_put(RTRS_MSG_INFO_RSP);
	m->sg_cnt = le16_put((uint16_t)sg_cnt);
	for (unsigned i = 0; i < sg_cnt; i++) {
		struct rtrs_sg_desc d = desc_put(&descs[i]);

		memcpy(at, &d, sizeof(d));
		at += sizeof(d);
	}
}

void rtrs_info_rsp_encode_verdict(void *buf, int err, bool dnr)
{
	struct rtrs_msg_info_rsp *m = buf;

	memset(m, 0, sizeof(*m));
	m->type = le16_put(RTRS_MSG_INFO_RSP);
	m->errno_ = le16_put((uint16_t)(int16_t)err);
	m->flags = le16_put(dnr ? RTRS_MSG_DNR_F : 0);
}

int rtrs_info_rsp_decode(const void *buf, size_t len, const struct rtrs_limits *lim,
			 struct rtrs_desc *chunks, uint32_t *gens, int *verdict, bool *dnr,
			 const char **why)
{
	struct rtrs_msg_info_rsp m;
	const char *descs = (const char *)buf + sizeof(m);
	uint32_t per_desc, total = 0;
	unsigned sg_cnt, nr_keys;
	int err;

	*verdict = 0;
	*dnr = false;
	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "info response too short");
	memcpy(&m, buf, sizeof(m));
	if (le16_get(m.type) != RTRS_MSG_INFO_RSP)
		REJECT(-EPROTO, "not an info response");
	sg_cnt = le16_get(m.sg_cnt);
	/* Bytes 4..7 are reserved for a kernel server: only a peer of ours sends a verdict. */
	err = lim->ext ? (int16_t)le16_get(m.errno_) : 0;
	if (err > 0 || err < RTRS_REJ_ERRNO_MIN)
		REJECT(-EPROTO, "info response errno outside 1..4095");
	if (err) {
		if (sg_cnt)
			REJECT(-EPROTO, "info response with both an errno and descriptors");
		*verdict = err;
		*dnr = le16_get(m.flags) & RTRS_MSG_DNR_F;
		return 0;
	}
	if (sg_cnt == 0 || sg_cnt > lim->queue_depth || lim->queue_depth % sg_cnt)
		REJECT(-EINVAL, "descriptor count does not divide the queue depth");
	nr_keys = lim->ext && lim->key64 ? lim->queue_depth : 0;
	if (len < rtrs_info_rsp_size(sg_cnt, nr_keys))
		REJECT(-EMSGSIZE, "info response shorter than its descriptors and keys");
	per_desc = lim->queue_depth / sg_cnt;
	for (unsigned i = 0; i < sg_cnt; i++) {
		struct rtrs_desc d =
			desc_get((const struct rtrs_sg_desc *)(descs + i * sizeof(struct rtrs_sg_desc)));
		uint64_t want = (uint64_t)per_desc * lim->chunk_size;

		if (d.len != want)
			REJECT(-EINVAL, "descriptor length is not its share of chunks");
		if (add_overflow(d.addr, want, &(uint64_t){ 0 }))
			REJECT(-EINVAL, "descriptor address range wraps");
		for (uint32_t c = 0; c < per_desc; c++) {
			chunks[total].addr = d.addr + (uint64_t)c * lim->chunk_size;
			chunks[total].key = d.key;
			chunks[total].len = lim->chunk_size;
			total++;
		}
	}
	for (unsigned i = 0; i < nr_keys; i++) {
		const char *rec = descs + (size_t)sg_cnt * sizeof(struct rtrs_sg_desc) +
				  (size_t)i * RTRS_RKEY_SLOT;

		if (rtrs_new_rkey_decode(rec, i, &gens[i], &chunks[i].key, why))
			return -EPROTO;
	}
	return 0;
}

void rtrs_new_rkey_encode(struct rtrs_msg_new_rkey *m, uint32_t buf_id, uint32_t gen,
			  uint64_t rkey)
{
	memset(m, 0, sizeof(*m));
	m->type = le16_put(RTRS_MSG_RKEY_RSP);
	m->buf_id = le16_put((uint16_t)buf_id);
	m->gen = le32_put(gen);
	m->rkey = le64_put(rkey);
}

void rtrs_rkey_rsp_encode(struct rtrs_msg_rkey_rsp *m, uint32_t buf_id, uint32_t rkey)
{
	m->type = le16_put(RTRS_MSG_RKEY_RSP);
	m->buf_id = le16_put((uint16_t)buf_id);
	m->rkey = le32_put(rkey);
}

int rtrs_new_rkey_decode(const void *slot, uint32_t buf_id, uint32_t *gen, uint64_t *rkey,
			 const char **why)
{
	struct rtrs_msg_new_rkey m;

	memcpy(&m, slot, sizeof(m));
	if (le16_get(m.type) != RTRS_MSG_RKEY_RSP)
		REJECT(-EPROTO, "key slot holds no key");
	if (le16_get(m.buf_id) != (uint16_t)buf_id)
		REJECT(-EPROTO, "key slot names another chunk");
	*gen = le32_get(m.gen);
	*rkey = le64_get(m.rkey);
	return 0;
}

/* ---- IO --------------------------------------------------------------------- */

size_t rtrs_io_hdr_size(bool read, unsigned sg_cnt)
{
	return read ? sizeof(struct rtrs_msg_rdma_read) + (size_t)sg_cnt * sizeof(struct rtrs_sg_desc)
		    : sizeof(struct rtrs_msg_rdma_write);
}

void rtrs_write_hdr_encode(void *at, uint32_t usr_len)
{
	struct rtrs_msg_rdma_write m = {
		.type = le16_put(RTRS_MSG_WRITE), .usr_len = le16_put((uint16_t)usr_len),
	};

	memcpy(at, &m, sizeof(m));
}

void rtrs_read_hdr_encode(void *at, uint32_t usr_len, uint16_t flags,
			  const struct rtrs_desc *sg, unsigned sg_cnt)
{
	struct rtrs_msg_rdma_read m = {
		.type = le16_put(RTRS_MSG_READ),
		.usr_len = le16_put((uint16_t)usr_len),
		.flags = le16_put(flags),
		.sg_cnt = le16_put((uint16_t)sg_cnt),
	};
	uint8_t *p = at;

	memcpy(p, &m, sizeof(m));
	p += sizeof(m);
	for (unsigned i = 0; i < sg_cnt; i++) {
		struct rtrs_sg_desc d = desc_put(&sg[i]);

		memcpy(p, &d, sizeof(d));
		p += sizeof(d);
	}
}

int rtrs_io_req_decode(uint32_t payload, const struct rtrs_limits *lim,
		       void *const *chunk_bases, struct rtrs_desc *sg_buf,
		       struct rtrs_io_req *out, const char **why)
{
	unsigned mem_bits = rtrs_mem_bits(lim->queue_depth);
	uint32_t chunk = rtrs_io_req_chunk(lim->queue_depth, payload);
	uint32_t off = payload & ((1u << mem_bits) - 1);
	const uint8_t *base;
	struct le16 type_le, usr_le;
	size_t hdr_len;

	if (chunk >= lim->queue_depth)
		REJECT(-EINVAL, "chunk id beyond queue depth");
	if (off > lim->chunk_size - sizeof(struct rtrs_msg_rdma_write))
		REJECT(-EINVAL, "header offset beyond chunk");
	base = chunk_bases[chunk];
	memcpy(&type_le, base + off, sizeof(type_le));
	memcpy(&usr_le, base + off + 2, sizeof(usr_le));
	memset(out, 0, sizeof(*out));
	out->chunk = chunk;
	out->off = off;
	out->usr_len = le16_get(usr_le);
	if (out->usr_len > off)
		REJECT(-EINVAL, "user header longer than its offset");
	out->data_len = off - out->usr_len;

	switch (le16_get(type_le)) {
	case RTRS_MSG_WRITE:
		out->type = RTRS_MSG_WRITE;
		hdr_len = sizeof(struct rtrs_msg_rdma_write);
		break;
	case RTRS_MSG_READ: {
		struct rtrs_msg_rdma_read r;
		uint64_t sum = 0;

		out->type = RTRS_MSG_READ;
		if (off > lim->chunk_size - sizeof(r))
			REJECT(-EINVAL, "read header beyond chunk");
		memcpy(&r, base + off, sizeof(r));
		out->flags = le16_get(r.flags);
		out->sg_cnt = le16_get(r.sg_cnt);
		if (out->flags & ~RTRS_MSG_NEED_INVAL_F)
			REJECT(-EINVAL, "unknown read flags");
		if (out->sg_cnt > RTRS_MAX_READ_SG)
			REJECT(-EINVAL, "too many read descriptors");
		hdr_len = rtrs_io_hdr_size(true, out->sg_cnt);
		if (hdr_len > lim->chunk_size - off)
			REJECT(-EINVAL, "read descriptors beyond chunk");
		/* Copy first, then check the copy: the chunk is client memory. */
		for (unsigned i = 0; i < out->sg_cnt; i++)
			sg_buf[i] = desc_get((const struct rtrs_sg_desc *)(base + off + sizeof(r)) + i);
		out->sg = sg_buf;
		for (unsigned i = 0; i < out->sg_cnt; i++) {
			if (sg_buf[i].len == 0)
				REJECT(-EINVAL, "empty read descriptor");
			sum += sg_buf[i].len;
		}
		/* The kernel trusts desc.len; we insist it matches the data area. */
		if (sum != out->data_len)
			REJECT(-EINVAL, "read length does not match the data area");
		break;
	}
	default:
		REJECT(-EPROTO, "unknown IO message type");
	}
	if (out->usr_len + hdr_len > lim->max_hdr_size)
		REJECT(-EMSGSIZE, "user and rtrs headers exceed the header size");
	if (out->data_len > lim->chunk_size - lim->max_hdr_size)
		REJECT(-EMSGSIZE, "data beyond max io size");
	return 0;
}

int rtrs_io_rsp_decode(uint32_t payload, uint32_t queue_depth, uint32_t *msg_id,
		       int *err, const char **why)
{
	uint32_t id = payload & RTRS_RSP_ID_MAX;
	uint32_t e = (payload >> RTRS_RSP_ID_BITS) & RTRS_RSP_ERRNO_MAX;

	if (id >= queue_depth)
		REJECT(-EINVAL, "response id beyond queue depth");
	*msg_id = id;
	*err = -(int)e;
	return 0;
}

void rtrs_fence_encode(struct rtrs_msg_fence *m, bool ack, const uint8_t *uuid, int32_t recon,
		       int err)
{
	memset(m, 0, sizeof(*m));
	m->type = le16_put(ack ? RTRS_MSG_FENCE_ACK : RTRS_MSG_FENCE);
	m->errno_ = le16_put((uint16_t)(int16_t)err);
	if (recon >= 0 && recon <= UINT16_MAX) {
		m->recon_cnt = le16_put((uint16_t)recon);
		m->flags = le16_put(RTRS_FENCE_RECON_F);
	}
	memcpy(m->path_uuid, uuid, RTRS_UUID_LEN);
}

int rtrs_fence_decode(const void *buf, size_t len, enum rtrs_msg_type type, uint8_t *uuid,
		      int32_t *recon, int *err, const char **why)
{
	struct rtrs_msg_fence m;

	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "fence message too short");
	memcpy(&m, buf, sizeof(m));
	if (le16_get(m.type) != type)
		REJECT(-EPROTO, "not the expected fence message");
	*err = (int16_t)le16_get(m.errno_);
	if (*err > 0 || *err < RTRS_REJ_ERRNO_MIN || (type == RTRS_MSG_FENCE && *err))
		REJECT(-EPROTO, "fence errno out of place or outside 1..4095");
	*recon = le16_get(m.flags) & RTRS_FENCE_RECON_F ? (int32_t)le16_get(m.recon_cnt) : -1;
	memcpy(uuid, m.path_uuid, RTRS_UUID_LEN);
	return 0;
}

int rtrs_rkey_rsp_decode(const void *buf, size_t len, uint32_t queue_depth,
			 uint32_t *buf_id, uint32_t *rkey, const char **why)
{
	struct rtrs_msg_rkey_rsp m;

	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "rkey response too short");
	memcpy(&m, buf, sizeof(m));
	if (le16_get(m.type) != RTRS_MSG_RKEY_RSP)
		REJECT(-EPROTO, "not an rkey response");
	if (le16_get(m.buf_id) >= queue_depth)
		REJECT(-EINVAL, "rkey response chunk beyond queue depth");
	*buf_id = le16_get(m.buf_id);
	*rkey = le32_get(m.rkey);
	return 0;
}

/* ---- authentication ------------------------------------------------------- */

size_t rtrs_auth_wire_hash_len(unsigned hash)
{
	static const uint8_t len[] = { [1] = 32, [2] = 48, [3] = 64 };

	return hash < ARRAY_SIZE(len) ? len[hash] : 0;
}

size_t rtrs_auth_wire_dh_len(unsigned group)
{
	static const uint16_t len[] = { [1] = 256, [2] = 384, [3] = 512, [4] = 768, [5] = 1024 };

	return group < ARRAY_SIZE(len) ? len[group] : 0;
}

static bool hl_valid(unsigned hl)
{
	return hl == 32 || hl == 48 || hl == 64;
}

/* n bytes of a name: 1..RTRS_AUTH_WIRE_NAME_MAX printable, no blanks. */
static bool auth_name_ok(const char *s, size_t n)
{
	if (n == 0 || n > RTRS_AUTH_WIRE_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
			return false;
	return true;
}

bool rtrs_auth_name_valid(const char *name)
{
	return name && auth_name_ok(name, strnlen(name, RTRS_AUTH_WIRE_NAME));
}

/* A name field: NUL-terminated inside the field. */
static bool auth_name_get(char *dst, const char *src)
{
	size_t n = strnlen(src, RTRS_AUTH_WIRE_NAME);

	if (!auth_name_ok(src, n))
		return false;
	memcpy(dst, src, n);
	dst[n] = '\0';
	return true;
}

static bool auth_name_put(char *dst, const char *src)
{
	size_t n = strnlen(src, RTRS_AUTH_WIRE_NAME);

	if (!auth_name_ok(src, n))
		return false;
	memset(dst, 0, RTRS_AUTH_WIRE_NAME);
	memcpy(dst, src, n);
	return true;
}

size_t rtrs_auth_encode(void *buf, size_t cap, const struct rtrs_auth_msg *m)
{
	struct rtrs_msg_auth env = { .type = le16_put(RTRS_MSG_AUTH) };
	uint8_t *p = (uint8_t *)buf + sizeof(env);
	size_t hl = m->hl, len;

	switch (m->id) {
	case RTRS_AUTH_NEGOTIATE: {
		struct rtrs_auth_negotiate n = {
			.auth_type = RTRS_AUTH_TYPE_COMMON, .auth_id = m->id,
			.t_id = le16_put(m->tid), .sc_c = m->scc, .napd = 1,
			.authid = RTRS_AUTH_PROTO_DHCHAP,
			.halen = m->nr_hashes, .dhlen = m->nr_groups,
		};

		len = sizeof(n);
		if (cap < sizeof(env) + len || !m->nr_hashes || !m->nr_groups ||
		    m->nr_hashes > RTRS_AUTH_MAX_IDS || m->nr_groups > RTRS_AUTH_MAX_IDS ||
		    !auth_name_put(n.host, m->host) || !auth_name_put(n.server, m->server))
			return 0;
		memcpy(n.idlist, m->hashes, m->nr_hashes);
		memcpy(n.idlist + RTRS_AUTH_MAX_IDS, m->groups, m->nr_groups);
		memcpy(p, &n, len);
		break;
	}
	case RTRS_AUTH_CHALLENGE: {
		struct rtrs_auth_challenge c = {
			.auth_type = RTRS_AUTH_TYPE_DHCHAP, .auth_id = m->id,
			.t_id = le16_put(m->tid), .hl = m->hl, .hashid = m->hash,
			.dhgid = m->group, .dhvlen = le16_put(m->dhvlen),
			.seqnum = le32_put(m->seq),
		};

		len = sizeof(c) + hl + m->dhvlen;
		if (cap < sizeof(env) + len || !hl_valid(hl) || (m->dhvlen && !m->dhv) || !m->c)
			return 0;
		memcpy(p, &c, sizeof(c));
		memcpy(p + sizeof(c), m->c, hl);
		if (m->dhvlen)
			memcpy(p + sizeof(c) + hl, m->dhv, m->dhvlen);
		break;
	}
	case RTRS_AUTH_REPLY: {
		struct rtrs_auth_reply r = {
			.auth_type = RTRS_AUTH_TYPE_DHCHAP, .auth_id = m->id,
			.t_id = le16_put(m->tid), .hl = m->hl, .cvalid = m->valid,
			.dhvlen = le16_put(m->dhvlen), .seqnum = le32_put(m->seq),
		};

		len = sizeof(r) + 2 * hl + m->dhvlen;
		if (cap < sizeof(env) + len || !hl_valid(hl) || !m->r || (m->valid && !m->c) ||
		    (m->dhvlen && !m->dhv))
			return 0;
		memcpy(p, &r, sizeof(r));
		memcpy(p + sizeof(r), m->r, hl);
		if (m->valid)
			memcpy(p + sizeof(r) + hl, m->c, hl);
		else
			memset(p + sizeof(r) + hl, 0, hl);
		if (m->dhvlen)
			memcpy(p + sizeof(r) + 2 * hl, m->dhv, m->dhvlen);
		break;
	}
	case RTRS_AUTH_SUCCESS1: {
		struct rtrs_auth_success1 s1 = {
			.auth_type = RTRS_AUTH_TYPE_DHCHAP, .auth_id = m->id,
			.t_id = le16_put(m->tid), .hl = m->hl, .rvalid = m->valid,
		};

		len = sizeof(s1) + hl;
		if (cap < sizeof(env) + len || !hl_valid(hl) || (m->valid && !m->r))
			return 0;
		memcpy(p, &s1, sizeof(s1));
		if (m->valid)
			memcpy(p + sizeof(s1), m->r, hl);
		else
			memset(p + sizeof(s1), 0, hl);
		break;
	}
	case RTRS_AUTH_SUCCESS2: {
		struct rtrs_auth_success2 s2 = {
			.auth_type = RTRS_AUTH_TYPE_DHCHAP, .auth_id = m->id,
			.t_id = le16_put(m->tid),
		};

		len = sizeof(s2);
		if (cap < sizeof(env) + len)
			return 0;
		memcpy(p, &s2, len);
		break;
	}
	case RTRS_AUTH_FAILURE1:
	case RTRS_AUTH_FAILURE2:
	case RTRS_AUTH_REAUTH: {
		struct rtrs_auth_failure f = {
			.auth_type = RTRS_AUTH_TYPE_COMMON, .auth_id = m->id,
			.t_id = le16_put(m->tid), .rescode = m->id == RTRS_AUTH_REAUTH ? 0 : 1,
			.rescode_exp = m->id == RTRS_AUTH_REAUTH ? 0 : m->fail_exp,
		};

		len = sizeof(f);
		if (cap < sizeof(env) + len)
			return 0;
		memcpy(p, &f, len);
		break;
	}
	default:
		return 0;
	}
	env.len = le16_put((uint16_t)len);
	memcpy(buf, &env, sizeof(env));
	return sizeof(env) + len;
}

int rtrs_auth_decode(const void *buf, size_t len, struct rtrs_auth_msg *out, const char **why)
{
	struct rtrs_msg_auth env;
	const uint8_t *p = (const uint8_t *)buf + sizeof(env);
	size_t plen;

	if (len < sizeof(env))
		REJECT(-EMSGSIZE, "authentication message too short");
	memcpy(&env, buf, sizeof(env));
	if (le16_get(env.type) != RTRS_MSG_AUTH)
		REJECT(-EPROTO, "not an authentication message");
	plen = le16_get(env.len);
	if (plen > len - sizeof(env))
		REJECT(-EMSGSIZE, "authentication message longer than received");
	if (plen < 2)
		REJECT(-EMSGSIZE, "authentication message without a header");
	memset(out, 0, sizeof(*out));
	out->id = p[1];
	switch (out->id) {
	case RTRS_AUTH_NEGOTIATE: {
		struct rtrs_auth_negotiate n;

		if (p[0] != RTRS_AUTH_TYPE_COMMON)
			REJECT(-EPROTO, "negotiate with a wrong message type");
		if (plen != sizeof(n))
			REJECT(-EMSGSIZE, "negotiate of a wrong size");
		memcpy(&n, p, sizeof(n));
		out->tid = le16_get(n.t_id);
		out->scc = n.sc_c;
		if (n.napd != 1 || n.authid != RTRS_AUTH_PROTO_DHCHAP)
			REJECT(-EPROTO, "negotiate offers no DH-HMAC-CHAP descriptor");
		if (n.halen > RTRS_AUTH_MAX_IDS || n.dhlen > RTRS_AUTH_MAX_IDS)
			REJECT(-EINVAL, "negotiate with too many hash or group ids");
		if (!n.halen || !n.dhlen)
			REJECT(-EINVAL, "negotiate offers no hash or no group");
		out->nr_hashes = n.halen;
		out->nr_groups = n.dhlen;
		memcpy(out->hashes, n.idlist, n.halen);
		memcpy(out->groups, n.idlist + RTRS_AUTH_MAX_IDS, n.dhlen);
		if (!auth_name_get(out->host, n.host) || !auth_name_get(out->server, n.server))
			REJECT(-EINVAL, "negotiate with an invalid host or server name");
		return 0;
	}
	case RTRS_AUTH_CHALLENGE: {
		struct rtrs_auth_challenge c;

		if (p[0] != RTRS_AUTH_TYPE_DHCHAP || plen < sizeof(c))
			REJECT(-EPROTO, "malformed challenge");
		memcpy(&c, p, sizeof(c));
		out->tid = le16_get(c.t_id);
		out->hl = c.hl;
		out->hash = c.hashid;
		out->group = c.dhgid;
		out->dhvlen = le16_get(c.dhvlen);
		out->seq = le32_get(c.seqnum);
		if (!rtrs_auth_wire_hash_len(c.hashid) || c.hl != rtrs_auth_wire_hash_len(c.hashid))
			REJECT(-EPROTO, "challenge with an unknown hash or a wrong hash length");
		if (c.dhgid > RTRS_AUTH_MAX_IDS || out->dhvlen != rtrs_auth_wire_dh_len(c.dhgid) ||
		    (c.dhgid && !out->dhvlen))
			REJECT(-EPROTO, "challenge with a DH value that does not fit its group");
		if (plen != sizeof(c) + out->hl + out->dhvlen)
			REJECT(-EMSGSIZE, "challenge of a wrong size");
		out->c = p + sizeof(c);
		out->dhv = out->dhvlen ? p + sizeof(c) + out->hl : NULL;
		return 0;
	}
	case RTRS_AUTH_REPLY: {
		struct rtrs_auth_reply r;

		if (p[0] != RTRS_AUTH_TYPE_DHCHAP || plen < sizeof(r))
			REJECT(-EPROTO, "malformed reply");
		memcpy(&r, p, sizeof(r));
		out->tid = le16_get(r.t_id);
		out->hl = r.hl;
		out->dhvlen = le16_get(r.dhvlen);
		out->seq = le32_get(r.seqnum);
		if (!hl_valid(r.hl) || r.cvalid > 1 || out->dhvlen > RTRS_AUTH_WIRE_MAX_DHV)
			REJECT(-EINVAL, "reply with a bad hash length, cvalid or DH length");
		/* The bound nvmet learned late: 16 + 2 hl + dhvlen must be all there is. */
		if (plen != sizeof(r) + 2 * (size_t)out->hl + out->dhvlen)
			REJECT(-EMSGSIZE, "reply of a wrong size");
		out->valid = r.cvalid;
		out->r = p + sizeof(r);
		out->c = r.cvalid ? p + sizeof(r) + out->hl : NULL;
		out->dhv = out->dhvlen ? p + sizeof(r) + 2 * out->hl : NULL;
		return 0;
	}
	case RTRS_AUTH_SUCCESS1: {
		struct rtrs_auth_success1 s1;

		if (p[0] != RTRS_AUTH_TYPE_DHCHAP || plen < sizeof(s1))
			REJECT(-EPROTO, "malformed success1");
		memcpy(&s1, p, sizeof(s1));
		out->tid = le16_get(s1.t_id);
		out->hl = s1.hl;
		if (!hl_valid(s1.hl) || s1.rvalid > 1)
			REJECT(-EINVAL, "success1 with a bad hash length or rvalid");
		if (plen != sizeof(s1) + out->hl)
			REJECT(-EMSGSIZE, "success1 of a wrong size");
		out->valid = s1.rvalid;
		out->r = s1.rvalid ? p + sizeof(s1) : NULL;
		return 0;
	}
	case RTRS_AUTH_SUCCESS2: {
		struct rtrs_auth_success2 s2;

		if (p[0] != RTRS_AUTH_TYPE_DHCHAP || plen != sizeof(s2))
			REJECT(-EPROTO, "malformed success2");
		memcpy(&s2, p, sizeof(s2));
		out->tid = le16_get(s2.t_id);
		return 0;
	}
	case RTRS_AUTH_FAILURE1:
	case RTRS_AUTH_FAILURE2: {
		struct rtrs_auth_failure f;

		if (p[0] != RTRS_AUTH_TYPE_COMMON || plen != sizeof(f))
			REJECT(-EPROTO, "malformed failure");
		memcpy(&f, p, sizeof(f));
		out->tid = le16_get(f.t_id);
		out->fail_exp = f.rescode_exp;
		return 0;
	}
	case RTRS_AUTH_REAUTH: {
		struct rtrs_auth_failure f;

		if (p[0] != RTRS_AUTH_TYPE_COMMON || plen != sizeof(f))
			REJECT(-EPROTO, "malformed re-authentication request");
		memcpy(&f, p, sizeof(f));
		if (f.rescode || f.rescode_exp)
			REJECT(-EPROTO, "re-authentication request with a reason");
		out->tid = le16_get(f.t_id);
		return 0;
	}
	default:
		REJECT(-EPROTO, "unknown authentication message");
	}
}

void rtrs_tcp_hdr_encode(struct rtrs_tcp_hdr *h, const struct rtrs_tcp_frame *f)
{
	*h = (struct rtrs_tcp_hdr){
		.magic = RTRS_TCP_MAGIC, .version = RTRS_TCP_VERSION, .op = (uint8_t)f->op,
		.flags = f->has_imm ? RTRS_TCP_F_IMM : 0, .len = le32_put(f->len),
		.key = le64_put(f->key), .off = le64_put(f->off),
		.imm = le32_put(f->has_imm ? f->imm : 0),
	};
}

int rtrs_tcp_hdr_decode(const void *buf, size_t len, struct rtrs_tcp_frame *out,
			const char **why)
{
	struct rtrs_tcp_hdr h;
	uint32_t max = 0;

	if (len < sizeof(h))
		REJECT(-EMSGSIZE, "frame header shorter than 32 bytes");
	memcpy(&h, buf, sizeof(h));
	if (h.magic != RTRS_TCP_MAGIC)
		REJECT(-EPROTO, "not an RTRS frame (bad magic)");
	if (h.version != RTRS_TCP_VERSION)
		REJECT(-EPROTO, "unknown frame version");
	memset(out, 0, sizeof(*out));
	out->op = h.op;
	out->has_imm = h.flags & RTRS_TCP_F_IMM;
	out->len = le32_get(h.len);
	out->key = le64_get(h.key);
	out->off = le64_get(h.off);
	out->imm = le32_get(h.imm);
	switch (h.op) {
	case RTRS_TCP_CONNECT:
	case RTRS_TCP_ACCEPT:
	case RTRS_TCP_REJECT:
		max = RTRS_TCP_CM_MAX;
		if (h.flags)
			REJECT(-EPROTO, "flags on a connection frame");
		break;
	case RTRS_TCP_WRITE:
		max = RTRS_TCP_WRITE_MAX;
		if (!out->len && !out->has_imm)
			REJECT(-EPROTO, "empty write without an immediate");
		if (out->off > UINT64_MAX - out->len)
			REJECT(-EPROTO, "write offset and length overflow");
		break;
	case RTRS_TCP_SEND:
		max = RTRS_TCP_SEND_MAX;
		if (!out->len)
			REJECT(-EPROTO, "empty send");
		break;
	default:
		REJECT(-EPROTO, "unknown frame op");
	}
	if (h.flags & ~RTRS_TCP_F_IMM)
		REJECT(-EPROTO, "unknown frame flags");
	if (h.op != RTRS_TCP_WRITE && (out->key || out->off))
		REJECT(-EPROTO, "key or offset on a frame that is not a write");
	if (!out->has_imm && out->imm)
		REJECT(-EPROTO, "immediate without its flag");
	if (le32_get(h.reserved))
		REJECT(-EPROTO, "reserved frame bytes not zero");
	if (out->len > max)
		REJECT(-EMSGSIZE, "frame longer than its op allows");
	return 0;
}
