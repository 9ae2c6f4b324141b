/* SPDX-License-Identifier: MIT */
/*
 * Encode and validate RTRS wire messages. Nothing else in the project reads
 * or writes raw RTRS bytes.
 */
#include <errno.h>
#include <string.h>

#include "rtrs-proto.h"

#define REJECT(err, reason)          \
	do {                         \
		if (why)             \
			*why = (reason); \
		return (err);        \
	} while (0)

bool rtrs_name_valid(const char *name)
{
	size_t n = strnlen(name, RTRS_NAME_MAX + 1);

	if (n == 0 || n > RTRS_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];

		if (c <= ' ' || c >= 0x7f || c == '/' || c == '.')
			return false;
	}
	return true;
}

/* ---- connection messages ------------------------------------------------ */

void rtrs_conn_req_encode(struct rtrs_msg_conn_req *m, const struct rtrs_conn_req *r)
{
	memset(m, 0, sizeof(*m));
	m->magic = le16_put(RTRS_MAGIC);
	m->version = le16_put(RTRS_PROTO_VER);
	m->cid = le16_put(r->cid);
	m->cid_num = le16_put(r->cid_num);
	m->recon_cnt = le16_put(r->recon_cnt);
	memcpy(m->sess_uuid, r->sess_uuid, RTRS_UUID_LEN);
	memcpy(m->paths_uuid, r->paths_uuid, RTRS_UUID_LEN);
	m->flags = (r->first_conn ? RTRS_CONN_FIRST : 0) | (r->fence ? RTRS_CONN_FENCE : 0);
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

	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "connect request too short");
	memcpy(&m, buf, sizeof(m));
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
	/* Unknown flag bits are extensions this side does not speak: ignored. */
	out->first_conn = m.flags & RTRS_CONN_FIRST;
	out->fence = m.flags & RTRS_CONN_FENCE;
	memcpy(out->sess_uuid, m.sess_uuid, RTRS_UUID_LEN);
	memcpy(out->paths_uuid, m.paths_uuid, RTRS_UUID_LEN);
	return 0;
}

static struct rtrs_sg_desc desc_put(const struct rtrs_desc *d)
{
	return (struct rtrs_sg_desc){
		.addr = le64_put(d->addr), .key = le32_put(d->key), .len = le32_put(d->len),
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
	m->errno_ = le16_put((uint16_t)(int16_t)r->err);
	if (r->err)
		return; /* a reject carries magic, version and errno only */
	m->queue_depth = le16_put(r->queue_depth);
	m->max_io_size = le32_put(r->max_io_size);
	m->max_hdr_size = le32_put(r->max_hdr_size);
	m->flags = le32_put(r->flags);
	m->imm_desc = desc_put(&r->imm_desc);
}

int rtrs_conn_rsp_decode(const void *buf, size_t len, struct rtrs_conn_rsp *out,
			 const char **why)
{
	struct rtrs_msg_conn_rsp m;
	uint32_t chunk;
	int rc;

	/* A reject may be shorter: magic, version and errno are enough. */
	if (len < offsetof(struct rtrs_msg_conn_rsp, queue_depth))
		REJECT(-EMSGSIZE, "connect response too short");
	memset(&m, 0, sizeof(m));
	memcpy(&m, buf, MIN(len, sizeof(m)));
	rc = check_magic_version(m.magic, m.version, why);
	if (rc)
		return rc;
	memset(out, 0, sizeof(*out));
	out->err = (int16_t)le16_get(m.errno_);
	if (out->err > 0)
		REJECT(-EPROTO, "positive errno in connect response");
	if (out->err)
		return 0;
	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "connect response too short");
	out->queue_depth = le16_get(m.queue_depth);
	out->max_io_size = le32_get(m.max_io_size);
	out->max_hdr_size = le32_get(m.max_hdr_size);
	out->flags = le32_get(m.flags);
	out->imm_desc = desc_get(&m.imm_desc);
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

int rtrs_info_req_decode(const void *buf, size_t len, struct rtrs_info_req *out,
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
	out->imm_addr = le64_get(m.imm_addr);
	out->imm_key = le32_get(m.imm_key);
	return 0;
}

size_t rtrs_info_rsp_size(unsigned sg_cnt)
{
	return sizeof(struct rtrs_msg_info_rsp) + (size_t)sg_cnt * sizeof(struct rtrs_sg_desc);
}

void rtrs_info_rsp_encode(void *buf, const struct rtrs_desc *descs, unsigned sg_cnt)
{
	struct rtrs_msg_info_rsp *m = buf;

	memset(m, 0, sizeof(*m));
	m->type = le16_put(RTRS_MSG_INFO_RSP);
	m->sg_cnt = le16_put((uint16_t)sg_cnt);
	for (unsigned i = 0; i < sg_cnt; i++) {
		struct rtrs_sg_desc d = desc_put(&descs[i]);

		memcpy(&m->desc[i], &d, sizeof(d));
	}
}

int rtrs_info_rsp_decode(const void *buf, size_t len, const struct rtrs_limits *lim,
			 struct rtrs_desc *chunks, const char **why)
{
	const struct rtrs_msg_info_rsp *m = buf;
	uint32_t per_desc, total = 0;
	unsigned sg_cnt;

	if (len < sizeof(*m))
		REJECT(-EMSGSIZE, "info response too short");
	if (le16_get(m->type) != RTRS_MSG_INFO_RSP)
		REJECT(-EPROTO, "not an info response");
	sg_cnt = le16_get(m->sg_cnt);
	if (sg_cnt == 0 || sg_cnt > lim->queue_depth || lim->queue_depth % sg_cnt)
		REJECT(-EINVAL, "descriptor count does not divide the queue depth");
	if (len < rtrs_info_rsp_size(sg_cnt))
		REJECT(-EMSGSIZE, "info response shorter than its descriptors");
	per_desc = lim->queue_depth / sg_cnt;
	for (unsigned i = 0; i < sg_cnt; i++) {
		struct rtrs_desc d = desc_get(&m->desc[i]);
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
	uint32_t chunk = payload >> mem_bits;
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

void rtrs_fence_encode(struct rtrs_msg_fence *m, bool ack, const uint8_t *uuid, int err)
{
	memset(m, 0, sizeof(*m));
	m->type = le16_put(ack ? RTRS_MSG_FENCE_ACK : RTRS_MSG_FENCE);
	m->errno_ = le16_put((uint16_t)(int16_t)err);
	memcpy(m->path_uuid, uuid, RTRS_UUID_LEN);
}

int rtrs_fence_decode(const void *buf, size_t len, enum rtrs_msg_type type, uint8_t *uuid,
		      int *err, const char **why)
{
	struct rtrs_msg_fence m;

	if (len < sizeof(m))
		REJECT(-EMSGSIZE, "fence message too short");
	memcpy(&m, buf, sizeof(m));
	if (le16_get(m.type) != type)
		REJECT(-EPROTO, "not the expected fence message");
	*err = (int16_t)le16_get(m.errno_);
	if (*err > 0 || (type == RTRS_MSG_FENCE && *err))
		REJECT(-EPROTO, "fence errno out of place");
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
