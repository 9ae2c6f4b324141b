/* SPDX-License-Identifier: MIT */
/*
 * RNBD message codec: encoders write every byte (reserved ones as zeros);
 * decoders check every field and say why they refuse.
 */
#include <errno.h>
#include <string.h>

#include "rnbd-proto.h"
#include "utf8.h"

unsigned rnbd_version_negotiate(unsigned peer)
{
	return peer ? MIN(peer, (unsigned)RNBD_PROTO_VER_MAJOR) : 0;
}

static struct rnbd_msg_hdr hdr_of(enum rnbd_msg_type type)
{
	return (struct rnbd_msg_hdr){ .type = le16_put((uint16_t)type) };
}

/* ---- encoders -------------------------------------------------------------- */

void rnbd_sess_info_encode(struct rnbd_msg_sess_info *m, bool rsp, unsigned ver)
{
	memset(m, 0, sizeof(*m));
	m->hdr = hdr_of(rsp ? RNBD_MSG_SESS_INFO_RSP : RNBD_MSG_SESS_INFO);
	m->ver = (uint8_t)ver;
}

void rnbd_open_encode(struct rnbd_msg_open *m, const struct rnbd_open *o)
{
	memset(m, 0, sizeof(*m));
	m->hdr = hdr_of(RNBD_MSG_OPEN);
	m->access_mode = (uint8_t)o->access_mode;
	/* At most RNBD_DEV_NAME_MAX - 1 bytes: the field keeps its NUL. */
	memcpy(m->dev_name, o->dev_name, strnlen(o->dev_name, sizeof(m->dev_name) - 1));
}

void rnbd_open_rsp_encode(struct rnbd_msg_open_rsp *m, const struct rnbd_open_rsp *r)
{
	memset(m, 0, sizeof(*m));
	m->hdr = hdr_of(RNBD_MSG_OPEN_RSP);
	m->device_id = le32_put(r->device_id);
	m->nsectors = le64_put(r->nsectors);
	m->max_hw_sectors = le32_put(r->max_hw_sectors);
	m->max_write_zeroes_sectors = le32_put(r->max_write_zeroes_sectors);
	m->max_discard_sectors = le32_put(r->max_discard_sectors);
	m->discard_granularity = le32_put(r->discard_granularity);
	m->discard_alignment = le32_put(r->discard_alignment);
	m->physical_block_size = le16_put(r->physical_block_size);
	m->logical_block_size = le16_put(r->logical_block_size);
	m->max_segments = le16_put(r->max_segments);
	m->secure_discard = le16_put(r->secure_discard);
	m->cache_policy = r->cache_policy;
}

void rnbd_io_encode(struct rnbd_msg_io *m, const struct rnbd_io *io)
{
	memset(m, 0, sizeof(*m));
	m->hdr = hdr_of(RNBD_MSG_IO);
	m->device_id = le32_put(io->device_id);
	m->sector = le64_put(io->sector);
	m->rw = le32_put((uint32_t)io->op | io->flags);
	m->bi_size = le32_put(io->bi_size);
	m->prio = le16_put(io->prio);
}

void rnbd_close_encode(struct rnbd_msg_close *m, uint32_t device_id)
{
	memset(m, 0, sizeof(*m));
	m->hdr = hdr_of(RNBD_MSG_CLOSE);
	m->device_id = le32_put(device_id);
}

/* ---- decoders -------------------------------------------------------------- */

int rnbd_msg_type(const void *buf, size_t len, const char **why)
{
	struct rnbd_msg_hdr h;
	unsigned type;

	if (len < sizeof(h))
		REJECT(-EMSGSIZE, "message shorter than its header");
	memcpy(&h, buf, sizeof(h));
	type = le16_get(h.type);
	if (type > RNBD_MSG_CLOSE)
		REJECT(-EPROTO, "unknown message type");
	return (int)type;
}

/* The header of a message that must be of type want and at least min bytes. */
static int expect(const void *buf, size_t len, enum rnbd_msg_type want, size_t min,
		  const char **why)
{
	int type = rnbd_msg_type(buf, len, why);

	if (type < 0)
		return type;
	if (type != (int)want)
		REJECT(-EPROTO, "unexpected message type");
	if (len < min)
		REJECT(-EMSGSIZE, "message too short for its type");
	return 0;
}

int rnbd_sess_info_decode(const void *buf, size_t len, bool rsp, unsigned *ver,
			  const char **why)
{
	struct rnbd_msg_sess_info m;
	int rc = expect(buf, len, rsp ? RNBD_MSG_SESS_INFO_RSP : RNBD_MSG_SESS_INFO,
			sizeof(m), why);

	if (rc)
		return rc;
	memcpy(&m, buf, sizeof(m));
	if (m.ver == 0)
		REJECT(-EPROTONOSUPPORT, "protocol version 0");
	*ver = m.ver;
	return 0;
}

bool rnbd_dev_name_valid(const char *name, const char **why)
{
	const char *p = name, *end;
	size_t len;
	bool any = false;

	if (!name)
		REJECT(false, "no device name");
	len = strnlen(name, RNBD_DEV_NAME_MAX);
	if (len == 0)
		REJECT(false, "empty device name");
	if (len >= RNBD_DEV_NAME_MAX)
		REJECT(false, "device name too long");
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			REJECT(false, "control character in device name");
	if (!utf8_valid(name, len))
		REJECT(false, "device name not UTF-8");
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		end = strchrnul(p, '/');
		if ((end - p == 1 && p[0] == '.') || (end - p == 2 && p[0] == '.' && p[1] == '.'))
			REJECT(false, "\".\" or \"..\" in device name");
		any = true;
		p = end;
	}
	if (!any)
		REJECT(false, "device name without a component");
	return true;
}

int rnbd_open_decode(const void *buf, size_t len, struct rnbd_open *out, const char **why)
{
	struct rnbd_msg_open m;
	int rc = expect(buf, len, RNBD_MSG_OPEN, sizeof(m), why);

	if (rc)
		return rc;
	memcpy(&m, buf, sizeof(m));
	if (m.access_mode > RNBD_ACCESS_MIGRATION)
		REJECT(-EINVAL, "unknown access mode");
	if (!memchr(m.dev_name, '\0', sizeof(m.dev_name)))
		REJECT(-EINVAL, "device name not terminated");
	if (!rnbd_dev_name_valid(m.dev_name, why))
		return -EINVAL;
	out->access_mode = m.access_mode;
	memcpy(out->dev_name, m.dev_name, sizeof(out->dev_name));
	return 0;
}

int rnbd_open_rsp_decode(const void *buf, size_t len, struct rnbd_open_rsp *out,
			 const char **why)
{
	struct rnbd_msg_open_rsp m;
	struct rnbd_open_rsp r;
	int rc = expect(buf, len, RNBD_MSG_OPEN_RSP, sizeof(m), why);

	if (rc)
		return rc;
	memcpy(&m, buf, sizeof(m));
	r = (struct rnbd_open_rsp){
		.device_id = le32_get(m.device_id),
		.nsectors = le64_get(m.nsectors),
		.max_hw_sectors = le32_get(m.max_hw_sectors),
		.max_write_zeroes_sectors = le32_get(m.max_write_zeroes_sectors),
		.max_discard_sectors = le32_get(m.max_discard_sectors),
		.discard_granularity = le32_get(m.discard_granularity),
		.discard_alignment = le32_get(m.discard_alignment),
		.physical_block_size = le16_get(m.physical_block_size),
		.logical_block_size = le16_get(m.logical_block_size),
		.max_segments = le16_get(m.max_segments),
		.secure_discard = le16_get(m.secure_discard),
		.cache_policy = m.cache_policy,
	};
	if (!is_pow2(r.logical_block_size) || r.logical_block_size < RNBD_SECTOR_SIZE)
		REJECT(-EINVAL, "logical block size not a power of two of at least 512");
	if (!is_pow2(r.physical_block_size) || r.physical_block_size < r.logical_block_size)
		REJECT(-EINVAL, "physical block size not a power of two of at least the logical");
	if (r.nsectors % (r.logical_block_size >> RNBD_SECTOR_SHIFT))
		REJECT(-EINVAL, "size not a multiple of the logical block size");
	if (r.nsectors > UINT64_MAX >> RNBD_SECTOR_SHIFT)
		REJECT(-EINVAL, "size beyond 64-bit bytes");
	if (r.max_hw_sectors < (uint32_t)(r.logical_block_size >> RNBD_SECTOR_SHIFT))
		REJECT(-EINVAL, "largest IO smaller than a block");
	if (r.max_discard_sectors &&
	    (r.discard_granularity % RNBD_SECTOR_SIZE ||
	     (r.discard_granularity && r.discard_alignment >= r.discard_granularity)))
		REJECT(-EINVAL, "discard granularity or alignment out of line");
	if (r.cache_policy & ~(RNBD_FUA | RNBD_WRITEBACK))
		REJECT(-EINVAL, "unknown cache policy bits");
	*out = r;
	return 0;
}

int rnbd_io_op_check(enum rnbd_io_op op, uint32_t flags, const char **why)
{
	if ((unsigned)op > RNBD_OP_WRITE_ZEROES)
		REJECT(-EINVAL, "unknown IO operation");
	if (flags & ~RNBD_F_ALL)
		REJECT(-EINVAL, "unknown IO flags");
	if ((flags & RNBD_F_NOUNMAP) && op != RNBD_OP_WRITE_ZEROES)
		REJECT(-EINVAL, "NOUNMAP on an operation other than write zeroes");
	if ((flags & (RNBD_F_FUA | RNBD_F_PREFLUSH)) && op == RNBD_OP_READ)
		REJECT(-EINVAL, "FUA or PREFLUSH on a read");
	return 0;
}

int rnbd_io_for_kernel(enum rnbd_io_op op, uint32_t *flags, bool *flush_first,
		       bool *flush_after)
{
	*flush_first = *flush_after = false;
	if (*flags & RNBD_F_NOUNMAP)
		return -EOPNOTSUPP;
	if (*flags & RNBD_F_PREFLUSH) {
		*flags &= ~(uint32_t)RNBD_F_PREFLUSH;
		*flush_first = op != RNBD_OP_FLUSH;
	}
	if ((*flags & RNBD_F_FUA) && op != RNBD_OP_WRITE && op != RNBD_OP_FLUSH) {
		*flags &= ~(uint32_t)RNBD_F_FUA;
		*flush_after = true;
	}
	return 0;
}

int rnbd_io_decode(const void *buf, size_t len, unsigned ver, size_t data_len,
		   struct rnbd_io *out, const char **why)
{
	struct rnbd_msg_io m = { 0 };
	struct rnbd_io io;
	uint32_t rw;
	bool data_op;
	int rc = expect(buf, len, RNBD_MSG_IO, RNBD_MSG_IO_V1_LEN, why);

	if (rc)
		return rc;
	memcpy(&m, buf, MIN(len, sizeof(m)));
	rw = le32_get(m.rw);
	io = (struct rnbd_io){
		.device_id = le32_get(m.device_id),
		.sector = le64_get(m.sector),
		.op = rw & RNBD_OP_MASK,
		.flags = rw & ~RNBD_OP_MASK,
		.bi_size = le32_get(m.bi_size),
		.prio = ver >= 2 && len >= RNBD_MSG_IO_V1_LEN + 2 ? le16_get(m.prio) : 0,
	};
	rc = rnbd_io_op_check(io.op, io.flags, why);
	if (rc)
		return rc;
	if (io.bi_size % RNBD_SECTOR_SIZE)
		REJECT(-EINVAL, "IO size not a multiple of 512");
	/*
	 * A flush names no range: the kernel's client sends its block layer's
	 * flush requests with their sector as it is, (sector_t)-1.
	 */
	if (io.op == RNBD_OP_FLUSH)
		io.sector = 0;
	if (io.sector > (UINT64_MAX - io.bi_size) >> RNBD_SECTOR_SHIFT)
		REJECT(-EINVAL, "IO range beyond 64-bit bytes");
	data_op = io.op == RNBD_OP_READ || io.op == RNBD_OP_WRITE;
	if (data_op && data_len != io.bi_size)
		REJECT(-EINVAL, "IO size differs from the data carried");
	if (!data_op && data_len)
		REJECT(-EINVAL, "data with an operation that takes none");
	switch (io.op) {
	case RNBD_OP_READ:
		if (!io.bi_size)
			REJECT(-EINVAL, "empty read");
		break;
	case RNBD_OP_WRITE:
		/* An empty write is a flush (PREFLUSH; older clients sent FUA). */
		if (!io.bi_size && !(io.flags & (RNBD_F_FUA | RNBD_F_PREFLUSH)))
			REJECT(-EINVAL, "empty write without FUA or PREFLUSH");
		break;
	case RNBD_OP_FLUSH:
		if (io.bi_size)
			REJECT(-EINVAL, "flush with a size");
		break;
	default:
		if (!io.bi_size)
			REJECT(-EINVAL, "discard, secure erase or write zeroes of nothing");
		break;
	}
	*out = io;
	return 0;
}

int rnbd_close_decode(const void *buf, size_t len, uint32_t *device_id, const char **why)
{
	struct rnbd_msg_close m;
	int rc = expect(buf, len, RNBD_MSG_CLOSE, sizeof(m), why);

	if (rc)
		return rc;
	memcpy(&m, buf, sizeof(m));
	*device_id = le32_get(m.device_id);
	return 0;
}

int rnbd_access_admit(enum rnbd_access_mode mode, unsigned writers)
{
	switch (mode) {
	case RNBD_ACCESS_RO:
		return 0;
	case RNBD_ACCESS_RW:
		return writers == 0 ? 0 : -EPERM;
	case RNBD_ACCESS_MIGRATION:
		return writers < 2 ? 0 : -EPERM;
	}
	return -EINVAL;
}

const char *rnbd_op_name(enum rnbd_io_op op)
{
	static const char *const names[] = {
		[RNBD_OP_READ] = "read", [RNBD_OP_WRITE] = "write", [RNBD_OP_FLUSH] = "flush",
		[RNBD_OP_DISCARD] = "discard", [RNBD_OP_SECURE_ERASE] = "secure erase",
		[RNBD_OP_WRITE_ZEROES] = "write zeroes",
	};

	return (unsigned)op < ARRAY_SIZE(names) ? names[op] : "unknown";
}

const char *rnbd_access_mode_name(enum rnbd_access_mode mode)
{
	static const char *const names[] = {
		[RNBD_ACCESS_RO] = "ro", [RNBD_ACCESS_RW] = "rw",
		[RNBD_ACCESS_MIGRATION] = "migration",
	};

	return (unsigned)mode < ARRAY_SIZE(names) ? names[mode] : "unknown";
}
