/* SPDX-License-Identifier: MIT */
/*
 * RTRS wire protocol 2.0, the Linux kernel's (drivers/infiniband/ulp/rtrs).
 *
 * This header is the only place that knows the byte layout of RTRS messages.
 * Layouts are the kernel's rtrs-pri.h byte for byte (magic 0x1BBD, version
 * 2.0, all fields little-endian; the connection messages are 56 bytes, the
 * request with its two RDMA CM bytes first), so that plain kernel peers
 * work. This project's extensions (authentication, fencing, 64-bit chunk
 * keys, verdicts, the "imm targets") live in bytes and bits the kernel
 * reserves, and only between peers that both speak them: a client says so
 * with RTRS_CONN_EXT in its connection request, a server answers with
 * RTRS_MSG_EXT_F. Without them each side speaks exactly the kernel's
 * protocol (docs/protocol.md, "Kernel peers").
 * Every decode function validates every field before anything else uses it,
 * including what the kernel forgets (usr_len beyond the header offset, read
 * lengths beyond the chunk).
 */
#ifndef RTRS_PROTO_H
#define RTRS_PROTO_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/util.h"

#define RTRS_MAGIC 0x1BBD
#define RTRS_PROTO_VER_MAJOR 2
#define RTRS_PROTO_VER_MINOR 0
#define RTRS_PROTO_VER ((RTRS_PROTO_VER_MAJOR << 8) | RTRS_PROTO_VER_MINOR)

#define RTRS_MAX_SESS_QUEUE_DEPTH 65535
#define RTRS_MIN_CHUNK_SIZE 8192u
#define RTRS_MAX_CHUNK_SIZE (128u << 20)
#define RTRS_MAX_HDR_SIZE 4096u
#define RTRS_MAX_PATHS 128
#define RTRS_MAX_CONNS 4096
#define RTRS_NAME_MAX 255
#define RTRS_UUID_LEN 16
/*
 * Connection request, response and reject: 56 bytes each, as the kernel
 * sends them. A receiver accepts more (an IB/RoCE CM pads a REP to 196 and
 * a REJ to 148 bytes) and ignores the rest; less is an error.
 */
#define RTRS_CM_MSG_LEN 56
/* Errnos a reject may carry: a 6.1 kernel client passes anything else on as a pointer. */
#define RTRS_REJ_ERRNO_MIN (-4095)
/* Read requests may name up to this many client buffers (kernel: 1). */
#define RTRS_MAX_READ_SG 128

/* ---- immediate data: 4 bits type, 28 bits payload --------------------- */

#define RTRS_IMM_TYPE_BITS 4
#define RTRS_IMM_PAYL_BITS 28
#define RTRS_IMM_PAYL_MASK ((1u << RTRS_IMM_PAYL_BITS) - 1)

enum rtrs_imm_type {
	RTRS_IO_REQ_IMM = 0,
	RTRS_IO_RSP_IMM = 1,
	RTRS_IO_RSP_W_INV_IMM = 2,
	RTRS_HB_MSG_IMM = 8,
	RTRS_HB_ACK_IMM = 9,
};

/* Response payload: 9 bits |errno|, 19 bits msg id. */
#define RTRS_RSP_ERRNO_BITS 9
#define RTRS_RSP_ID_BITS 19
#define RTRS_RSP_ERRNO_MAX ((1u << RTRS_RSP_ERRNO_BITS) - 1)
#define RTRS_RSP_ID_MAX ((1u << RTRS_RSP_ID_BITS) - 1)

static inline uint32_t rtrs_to_imm(enum rtrs_imm_type type, uint32_t payload)
{
	return ((uint32_t)type << RTRS_IMM_PAYL_BITS) | (payload & RTRS_IMM_PAYL_MASK);
}

static inline void rtrs_from_imm(uint32_t imm, unsigned *type, uint32_t *payload)
{
	*type = imm >> RTRS_IMM_PAYL_BITS;
	*payload = imm & RTRS_IMM_PAYL_MASK;
}

/*
 * Request payload: chunk id in the high bits, byte offset of the rtrs header
 * inside the chunk in the low mem_bits bits.
 */
static inline unsigned rtrs_chunk_bits(unsigned queue_depth)
{
	return queue_depth > 1 ? bits_for(queue_depth - 1) : 1;
}

static inline unsigned rtrs_mem_bits(unsigned queue_depth)
{
	return RTRS_IMM_PAYL_BITS - rtrs_chunk_bits(queue_depth);
}

/* True when queue_depth chunks of chunk_size bytes can be named in an imm. */
static inline bool rtrs_imm_fits(unsigned queue_depth, uint32_t chunk_size)
{
	return rtrs_chunk_bits(queue_depth) + bits_for(chunk_size - 1) <= RTRS_IMM_PAYL_BITS;
}

static inline uint32_t rtrs_to_io_req_imm(unsigned queue_depth, uint32_t chunk, uint32_t off)
{
	return rtrs_to_imm(RTRS_IO_REQ_IMM, (chunk << rtrs_mem_bits(queue_depth)) | off);
}

/* The chunk an IO request's payload names; not checked against queue_depth. */
static inline uint32_t rtrs_io_req_chunk(unsigned queue_depth, uint32_t payload)
{
	return payload >> rtrs_mem_bits(queue_depth);
}

static inline uint32_t rtrs_to_io_rsp_imm(uint32_t msg_id, int errno_neg)
{
	/* Unsigned negation: -INT_MIN would be undefined (and read as 0 by gcc -O2). */
	uint32_t e = errno_neg < 0 ? 0u - (uint32_t)errno_neg : (uint32_t)errno_neg;

	if (e > RTRS_RSP_ERRNO_MAX)
		e = 5; /* EIO: the field has 9 bits */
	return rtrs_to_imm(RTRS_IO_RSP_IMM,
			   (e << RTRS_RSP_ID_BITS) | (msg_id & RTRS_RSP_ID_MAX));
}

/*
 * The same for a read whose client asked to have its buffer's key
 * invalidated (RTRS_MSG_NEED_INVAL_F), answered by a SEND_WITH_INV first.
 */
static inline uint32_t rtrs_to_io_rsp_w_inv_imm(uint32_t msg_id, int errno_neg)
{
	return rtrs_to_imm(RTRS_IO_RSP_W_INV_IMM,
			   rtrs_to_io_rsp_imm(msg_id, errno_neg) & RTRS_IMM_PAYL_MASK);
}

/* ---- structures --------------------------------------------------------- */

struct rtrs_sg_desc {
	struct le64 addr;
	struct le32 key;
	struct le32 len;
} __attribute__((packed));
static_assert(sizeof(struct rtrs_sg_desc) == 16, "rtrs_sg_desc");

/*
 * conn_req.flags. The kernel's byte is first_conn:1 and 7 reserved bits,
 * which its client leaves 0. The others are this project's, and a server
 * reads FENCE and AUTH only with EXT.
 */
#define RTRS_CONN_FIRST 0x01 /* this connect may create a new server session */
#define RTRS_CONN_FENCE 0x02 /* the client fences before failover */
#define RTRS_CONN_AUTH 0x04  /* the client speaks DH-HMAC-CHAP */
/*
 * The client reads conn_rsp bytes 20..55 and the flags below beyond bit 1,
 * and the extended info_req and info_rsp: a peer of this project.
 */
#define RTRS_CONN_EXT 0x08
/*
 * Secure channel concatenation (docs/security.md section 9.3): a plain
 * connection whose only purpose is a DH-HMAC-CHAP exchange with SC_C
 * NEWTLSPSK that gives the path its TLS PSK; its session and path uuids
 * are the path's with every byte ^ 0x5c (a session of its own at the
 * server), it is connection 0 of 1, and the server closes it
 * once the exchange is done. With EXT and AUTH only.
 */
#define RTRS_CONN_CONCAT 0x10

/* The kernel's layout: 56 bytes, the two RDMA CM bytes first (sent as 0). */
struct rtrs_msg_conn_req {
	uint8_t cma_version;       /* the kernel's __cma_version: 0 */
	uint8_t ip_version;        /* the kernel's __ip_version: 0 */
	struct le16 magic;
	struct le16 version;
	struct le16 cid;
	struct le16 cid_num;
	struct le16 recon_cnt;
	uint8_t sess_uuid[RTRS_UUID_LEN];  /* path */
	uint8_t paths_uuid[RTRS_UUID_LEN]; /* session */
	uint8_t flags;
	uint8_t reserved[11];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_conn_req) == RTRS_CM_MSG_LEN, "rtrs_msg_conn_req");
static_assert(offsetof(struct rtrs_msg_conn_req, flags) == 44, "conn_req flags at 44");

/*
 * conn_rsp.flags. Bit 1 is the kernel's: always_invalidate the kernel's
 * way (one MR per chunk, a new key in an 8-byte RKEY_RSP sent with each
 * response). The others are this project's and mean something only with
 * RTRS_MSG_EXT_F, which a server sets only for a client that set
 * RTRS_CONN_EXT; a decoder drops them otherwise (a kernel server sends 0).
 */
#define RTRS_MSG_NEW_RKEY_F (1u << 1)
#define RTRS_MSG_FENCE_F (1u << 2) /* the server answers fences */
#define RTRS_MSG_AUTH_F (1u << 3)  /* authenticate on connection 0 before anything else */
#define RTRS_MSG_DNR_F (1u << 4)   /* in a reject or verdict: do not retry */
/*
 * always_invalidate with 64-bit keys that never repeat: the info response
 * appends one record per chunk, and each response writes an
 * rtrs_msg_new_rkey into the client's key slots (docs/protocol.md 11).
 */
#define RTRS_MSG_KEY64_F (1u << 5)
#define RTRS_MSG_EXT_F (1u << 6)   /* bytes 20..55 and the flags above are this project's */

/*
 * The kernel's layout, 56 bytes: 36 reserved bytes after flags, where a
 * server of this project puts, for a client that set RTRS_CONN_EXT, its
 * imm target and session incarnation. A reject is the same 56 bytes with
 * magic, version, errno and (ours) DNR in flags; the rest zero.
 */
struct rtrs_msg_conn_rsp {
	struct le16 magic;
	struct le16 version;
	struct le16 errno_;    /* 0 on accept, -errno (two's complement) on reject */
	struct le16 queue_depth;
	struct le32 max_io_size;
	struct le32 max_hdr_size;
	struct le32 flags;
	/* Ours, with RTRS_MSG_EXT_F: */
	struct rtrs_sg_desc imm_desc;
	/*
	 * The server's session incarnation (random at its creation), so a
	 * client sees that a server restarted and forgets chunk keys it
	 * learned from the old one.
	 */
	struct le64 sess_id;
	uint8_t reserved[12];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_conn_rsp) == RTRS_CM_MSG_LEN, "rtrs_msg_conn_rsp");
static_assert(offsetof(struct rtrs_msg_conn_rsp, imm_desc) == 20, "conn_rsp extension at 20");

enum rtrs_msg_type {
	RTRS_MSG_INFO_REQ = 0,
	RTRS_MSG_INFO_RSP = 1,
	RTRS_MSG_WRITE = 2,
	RTRS_MSG_READ = 3,
	RTRS_MSG_RKEY_RSP = 4,
	RTRS_MSG_FENCE = 5,       /* extension: stop path uuid, answer when drained */
	RTRS_MSG_FENCE_ACK = 6,
	RTRS_MSG_AUTH = 7,        /* extension: a DH-HMAC-CHAP message */
};

#define RTRS_MSG_NEED_INVAL_F (1u << 0)

/* Two-sided message on the admin connection: 272 bytes as in the kernel. */
struct rtrs_msg_info_req {
	struct le16 type;
	uint8_t pathname[RTRS_NAME_MAX];
	/* kernel: reserved[15]; ours, with RTRS_CONN_EXT: the client's imm target */
	struct le64 imm_addr;
	struct le32 imm_key;
	uint8_t reserved[3];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_info_req) == 272, "rtrs_msg_info_req");

/*
 * Kernel layout: 8 + 16 x sg_cnt bytes. Between peers of this project
 * (RTRS_MSG_EXT_F) the reserved bytes carry a verdict: a server that
 * refuses the path after accepting its connections (session name in use,
 * refused by its user) answers with errno set, sg_cnt 0, and flags
 * RTRS_MSG_DNR_F when retrying cannot help. With RTRS_MSG_KEY64_F there
 * is one descriptor per chunk, its key field unused (0), and queue_depth
 * rtrs_msg_new_rkey records, chunk by chunk, follow the descriptors.
 */
struct rtrs_msg_info_rsp {
	struct le16 type;
	struct le16 sg_cnt;
	struct le16 errno_;       /* ours, with EXT: 0 or -errno (two's complement) */
	struct le16 flags;        /* ours, with EXT: RTRS_MSG_DNR_F */
	struct rtrs_sg_desc desc[];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_info_rsp) == 8, "rtrs_msg_info_rsp");

/*
 * The kernel's always_invalidate (RTRS_MSG_NEW_RKEY_F): a chunk's new
 * 32-bit key, sent with the response as a send with immediate.
 */
struct rtrs_msg_rkey_rsp {
	struct le16 type;
	struct le16 buf_id;
	struct le32 rkey;
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_rkey_rsp) == 8, "rtrs_msg_rkey_rsp");

/*
 * always_invalidate with 64-bit keys, one record per chunk: the response to
 * an IO on chunk buf_id writes it into the client's key slot buf_id (the
 * client's imm region holds queue_depth slots, then a table of
 * queue_depth records the server fills before a fence ack) with the
 * response immediate, so the key is in place when the client sees the
 * response. gen counts the chunk's rotations; a receiver keeps the key of
 * the highest gen it has seen. The info response carries the same records.
 */
struct rtrs_msg_new_rkey {
	struct le16 type;         /* RTRS_MSG_RKEY_RSP */
	struct le16 buf_id;
	struct le32 gen;
	struct le64 rkey;
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_new_rkey) == 16, "rtrs_msg_new_rkey");
#define RTRS_RKEY_SLOT sizeof(struct rtrs_msg_new_rkey)

struct rtrs_msg_rdma_read {
	struct le16 type;
	struct le16 usr_len;
	struct le16 flags;
	struct le16 sg_cnt;
	struct rtrs_sg_desc desc[];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_rdma_read) == 8, "rtrs_msg_rdma_read");

struct rtrs_msg_rdma_write {
	struct le16 type;
	struct le16 usr_len;
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_rdma_write) == 4, "rtrs_msg_rdma_write");

/*
 * Fence (extension, offered through RTRS_CONN_FENCE / RTRS_MSG_FENCE_F):
 * two-sided on an admin connection. FENCE names a path of the same session
 * and, with RTRS_FENCE_RECON_F, its incarnation: the recon_cnt of the
 * connection request that made it. The server stops that incarnation and
 * sends FENCE_ACK once every IO it dispatched from it has been answered, so
 * none of it can land after the ack; a later incarnation (the path
 * reconnected before the fence arrived) is left alone. The ack echoes both.
 */
struct rtrs_msg_fence {
	struct le16 type;
	struct le16 errno_;       /* ack: 0 or -errno (two's complement) */
	struct le16 recon_cnt;    /* with RTRS_FENCE_RECON_F: the incarnation */
	struct le16 flags;        /* RTRS_FENCE_RECON_F; other bits sent 0, ignored */
	uint8_t path_uuid[RTRS_UUID_LEN];
} __attribute__((packed));
#define RTRS_FENCE_RECON_F (1u << 0)
static_assert(sizeof(struct rtrs_msg_fence) == 24, "rtrs_msg_fence");

/*
 * Authentication (extension, offered through RTRS_CONN_AUTH and required
 * through RTRS_MSG_AUTH_F): DH-HMAC-CHAP exactly as NVMe over Fabrics runs
 * it (NVMe Base 2.0 8.13.5), as two-sided messages on connection 0. Each is
 * an 8-byte envelope followed by the NVMe message byte for byte; NEGOTIATE
 * appends the host and server names that NVMe carries in its Connect.
 */
enum rtrs_auth_msg_id {
	RTRS_AUTH_NEGOTIATE = 0x00,
	RTRS_AUTH_CHALLENGE = 0x01,
	RTRS_AUTH_REPLY = 0x02,
	RTRS_AUTH_SUCCESS1 = 0x03,
	RTRS_AUTH_SUCCESS2 = 0x04,
	RTRS_AUTH_FAILURE2 = 0xf0,
	RTRS_AUTH_FAILURE1 = 0xf1,
	/*
	 * This project's: the server asks the client of a connected path to
	 * authenticate again (its key file changed), with a new transaction
	 * from NEGOTIATE on. Eight bytes, the layout of FAILURE1 with rescode
	 * and rescode_exp 0.
	 */
	RTRS_AUTH_REAUTH = 0xe0,
};

/* Failure explanations (rescode_exp); the reason code is always 1, "failed". */
enum rtrs_auth_fail {
	RTRS_AUTH_FAIL_FAILED = 0x01,
	RTRS_AUTH_FAIL_NOT_USABLE = 0x02,
	RTRS_AUTH_FAIL_CONCAT_MISMATCH = 0x03,
	RTRS_AUTH_FAIL_HASH_UNUSABLE = 0x04,
	RTRS_AUTH_FAIL_DHGROUP_UNUSABLE = 0x05,
	RTRS_AUTH_FAIL_INCORRECT_PAYLOAD = 0x06,
	RTRS_AUTH_FAIL_INCORRECT_MESSAGE = 0x07,
	/* This project's: the NEGOTIATE named a server other than this one. */
	RTRS_AUTH_FAIL_SERVER_NAME = 0xf0,
};

#define RTRS_AUTH_TYPE_COMMON 0x00    /* NEGOTIATE, FAILURE1/2 */
#define RTRS_AUTH_TYPE_DHCHAP 0x01    /* CHALLENGE .. SUCCESS2 */
#define RTRS_AUTH_PROTO_DHCHAP 0x01   /* authid of the protocol descriptor */
#define RTRS_AUTH_MAX_IDS 30          /* hash ids, then DH group ids, in idlist */
#define RTRS_AUTH_WIRE_NAME 256       /* name fields: NUL-padded */
#define RTRS_AUTH_WIRE_NAME_MAX 223   /* ... holding 1..223 printable chars, as an NQN */
#define RTRS_AUTH_WIRE_MAX_HL 64
#define RTRS_AUTH_WIRE_MAX_DHV 1024
/* NEGOTIATE's SC_C, as NVMe's: no concatenation, or a new TLS PSK from this exchange. */
#define RTRS_AUTH_SCC_NONE 0x00
#define RTRS_AUTH_SCC_NEWTLSPSK 0x01

struct rtrs_msg_auth {
	struct le16 type;         /* RTRS_MSG_AUTH */
	struct le16 len;          /* bytes of the NVMe message that follows */
	uint8_t reserved[4];
	uint8_t data[];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_msg_auth) == 8, "rtrs_msg_auth");

struct rtrs_auth_negotiate {
	uint8_t auth_type;        /* common */
	uint8_t auth_id;          /* NEGOTIATE */
	uint8_t rsvd1[2];
	struct le16 t_id;
	uint8_t sc_c;             /* secure channel concatenation: RTRS_AUTH_SCC_* */
	uint8_t napd;             /* protocol descriptors: 1 */
	/* the one descriptor */
	uint8_t authid;           /* RTRS_AUTH_PROTO_DHCHAP */
	uint8_t rsvd2;
	uint8_t halen;
	uint8_t dhlen;
	uint8_t idlist[2 * RTRS_AUTH_MAX_IDS];
	/* ours: the names NVMe carries in its Connect */
	char host[RTRS_AUTH_WIRE_NAME];
	char server[RTRS_AUTH_WIRE_NAME];
} __attribute__((packed));
static_assert(offsetof(struct rtrs_auth_negotiate, host) == 72, "negotiate: NVMe part");
static_assert(sizeof(struct rtrs_auth_negotiate) == 584, "rtrs_auth_negotiate");

struct rtrs_auth_challenge {
	uint8_t auth_type, auth_id;
	uint8_t rsvd1[2];
	struct le16 t_id;
	uint8_t hl;
	uint8_t rsvd2;
	uint8_t hashid;
	uint8_t dhgid;
	struct le16 dhvlen;
	struct le32 seqnum;
	uint8_t cval[];           /* C1 (hl bytes), then g^y (dhvlen bytes) */
} __attribute__((packed));
static_assert(sizeof(struct rtrs_auth_challenge) == 16, "rtrs_auth_challenge");

struct rtrs_auth_reply {
	uint8_t auth_type, auth_id;
	uint8_t rsvd1[2];
	struct le16 t_id;
	uint8_t hl;
	uint8_t rsvd2;
	uint8_t cvalid;
	uint8_t rsvd3;
	struct le16 dhvlen;
	struct le32 seqnum;
	uint8_t rval[];           /* R1, C2 (zero unless cvalid), g^x */
} __attribute__((packed));
static_assert(sizeof(struct rtrs_auth_reply) == 16, "rtrs_auth_reply");

struct rtrs_auth_success1 {
	uint8_t auth_type, auth_id;
	uint8_t rsvd1[2];
	struct le16 t_id;
	uint8_t hl;
	uint8_t rsvd2;
	uint8_t rvalid;
	uint8_t rsvd3[7];
	uint8_t rval[];           /* R2 (hl bytes, meaningful if rvalid) */
} __attribute__((packed));
static_assert(sizeof(struct rtrs_auth_success1) == 16, "rtrs_auth_success1");

struct rtrs_auth_success2 {
	uint8_t auth_type, auth_id;
	uint8_t rsvd1[2];
	struct le16 t_id;
	uint8_t rsvd2[10];
} __attribute__((packed));
static_assert(sizeof(struct rtrs_auth_success2) == 16, "rtrs_auth_success2");

struct rtrs_auth_failure {
	uint8_t auth_type, auth_id;
	uint8_t rsvd1[2];
	struct le16 t_id;
	uint8_t rescode;
	uint8_t rescode_exp;
} __attribute__((packed));
static_assert(sizeof(struct rtrs_auth_failure) == 8, "rtrs_auth_failure");

/* Largest authentication message: a reply with SHA-512 and ffdhe8192. */
#define RTRS_AUTH_MSG_MAX \
	(sizeof(struct rtrs_msg_auth) + sizeof(struct rtrs_auth_reply) + \
	 2 * RTRS_AUTH_WIRE_MAX_HL + RTRS_AUTH_WIRE_MAX_DHV)
static_assert(RTRS_AUTH_MSG_MAX <= 4096, "auth messages fit an admin receive");

/* ---- decoded, validated host forms --------------------------------------- */

struct rtrs_conn_req {
	uint16_t cid;
	uint16_t cid_num;
	uint16_t recon_cnt;
	bool first_conn;
	bool ext;               /* RTRS_CONN_EXT: a peer of this project */
	bool fence;             /* RTRS_CONN_FENCE (decoded with ext only) */
	bool auth;              /* RTRS_CONN_AUTH (decoded with ext only) */
	bool concat;            /* RTRS_CONN_CONCAT (decoded with ext only) */
	uint8_t sess_uuid[RTRS_UUID_LEN];
	uint8_t paths_uuid[RTRS_UUID_LEN];
};

struct rtrs_desc {
	uint64_t addr;
	uint64_t key;           /* 32 bits on the wire, except chunk keys with KEY64_F */
	uint32_t len;
};

/*
 * An accept or a reject. Encoding: with ext false the message is the
 * kernel's (only flag bit 1 and, in a reject, DNR; bytes 20..55 zero).
 * Decoding: ext says the server set RTRS_MSG_EXT_F; without it flags keeps
 * bit 1 alone and imm_desc, sess_id are 0.
 */
struct rtrs_conn_rsp {
	int err;                /* 0 = accepted, else negative errno (reject) */
	bool dnr;               /* reject: RTRS_MSG_DNR_F, do not retry */
	bool ext;               /* RTRS_MSG_EXT_F: a server of this project */
	/*
	 * Flag bit 1 without ext: the kernel's always_invalidate (a key per
	 * chunk in the info response, an RKEY_RSP with every response).
	 */
	bool kernel_inval;
	uint16_t queue_depth;
	uint32_t max_io_size;
	uint32_t max_hdr_size;
	uint32_t chunk_size;    /* max_io_size + max_hdr_size */
	uint32_t flags;
	struct rtrs_desc imm_desc;
	uint64_t sess_id;
};

/* imm_addr and imm_key travel only between peers of this project (RTRS_CONN_EXT). */
struct rtrs_info_req {
	char pathname[RTRS_NAME_MAX + 1];
	uint64_t imm_addr;
	uint32_t imm_key;
};

/*
 * An authentication message, decoded: only the fields of its id are set.
 * Pointers point into the buffer given to the decoder.
 */
struct rtrs_auth_msg {
	uint8_t id;               /* enum rtrs_auth_msg_id */
	uint16_t tid;
	/* NEGOTIATE */
	uint8_t scc;
	uint8_t nr_hashes, hashes[RTRS_AUTH_MAX_IDS];
	uint8_t nr_groups, groups[RTRS_AUTH_MAX_IDS];
	char host[RTRS_AUTH_WIRE_NAME];
	char server[RTRS_AUTH_WIRE_NAME];
	/* CHALLENGE, REPLY, SUCCESS1 */
	uint8_t hl;
	uint8_t hash, group;      /* CHALLENGE */
	uint32_t seq;             /* CHALLENGE S1, REPLY S2 */
	bool valid;               /* REPLY cvalid, SUCCESS1 rvalid */
	const uint8_t *c;         /* CHALLENGE C1, REPLY C2 */
	const uint8_t *r;         /* REPLY R1, SUCCESS1 R2 */
	uint16_t dhvlen;
	const uint8_t *dhv;       /* CHALLENGE g^y, REPLY g^x */
	/* FAILURE1/2 */
	uint8_t fail_exp;
};

/* Host and server names as the wire carries them: 1..223 printable, no blanks. */
bool rtrs_auth_name_valid(const char *name);

/* Digest size of an NVMe hash id, DH public value size of a group id; 0: unknown. */
size_t rtrs_auth_wire_hash_len(unsigned hash);
size_t rtrs_auth_wire_dh_len(unsigned group);

/* A server IO request as found in a chunk, after validation. */
struct rtrs_io_req {
	enum rtrs_msg_type type;  /* RTRS_MSG_WRITE or RTRS_MSG_READ */
	uint32_t chunk;
	uint32_t off;             /* of the rtrs header inside the chunk */
	uint32_t usr_len;
	uint32_t data_len;
	uint16_t flags;
	uint16_t sg_cnt;          /* read only */
	struct rtrs_desc *sg;     /* read only: the caller's copy, validated */
};

/* Limits a receiver validates against. */
struct rtrs_limits {
	uint32_t queue_depth;
	uint32_t chunk_size;
	uint32_t max_hdr_size;
	bool ext;               /* the peer is of this project: info_rsp may be a verdict */
	bool key64;             /* RTRS_MSG_KEY64_F: info carries 64-bit chunk keys */
};

/* ---- encoders ------------------------------------------------------------ */

/* fence and auth are sent only with ext. */
void rtrs_conn_req_encode(struct rtrs_msg_conn_req *m, const struct rtrs_conn_req *r);
/*
 * An accept, or a reject (r->err != 0: magic, version, errno and flags
 * (DNR), the rest zero). A reject's errno must be within
 * RTRS_REJ_ERRNO_MIN..-1 (asserted; clamped to -ECONNRESET without
 * assertions): a 6.1 kernel client oopses on anything else.
 */
void rtrs_conn_rsp_encode(struct rtrs_msg_conn_rsp *m, const struct rtrs_conn_rsp *r);
void rtrs_info_req_encode(struct rtrs_msg_info_req *m, const struct rtrs_info_req *r);
/*
 * Returns the message size; buf must hold rtrs_info_rsp_size(n, nr_keys)
 * bytes. With KEY64_F, nr_keys (= queue depth) records follow the
 * descriptors: the caller writes them at rtrs_info_rsp_keys(buf, sg_cnt).
 */
size_t rtrs_info_rsp_size(unsigned sg_cnt, unsigned nr_keys);
void rtrs_info_rsp_encode(void *buf, const struct rtrs_desc *descs, unsigned sg_cnt);
static inline struct rtrs_msg_new_rkey *rtrs_info_rsp_keys(void *buf, unsigned sg_cnt)
{
	return (struct rtrs_msg_new_rkey *)((char *)buf + sizeof(struct rtrs_msg_info_rsp) +
					     (size_t)sg_cnt * sizeof(struct rtrs_sg_desc));
}
/*
 * A refusal after the connections were accepted: errno, no descriptors.
 * Only to a peer of this project: a kernel client takes it for a broken
 * info response.
 */
void rtrs_info_rsp_encode_verdict(void *buf, int err, bool dnr);
void rtrs_new_rkey_encode(struct rtrs_msg_new_rkey *m, uint32_t buf_id, uint32_t gen,
			  uint64_t rkey);
/* The kernel's always_invalidate: chunk buf_id's new 32-bit key. */
void rtrs_rkey_rsp_encode(struct rtrs_msg_rkey_rsp *m, uint32_t buf_id, uint32_t rkey);
/*
 * Encodes an authentication message (envelope included) from the fields of
 * m->id; returns its size, or 0 when cap is too small or m is inconsistent.
 */
size_t rtrs_auth_encode(void *buf, size_t cap, const struct rtrs_auth_msg *m);
/* Header sizes: write 4; read 8 + 16 * sg_cnt. */
size_t rtrs_io_hdr_size(bool read, unsigned sg_cnt);
void rtrs_write_hdr_encode(void *at, uint32_t usr_len);
void rtrs_read_hdr_encode(void *at, uint32_t usr_len, uint16_t flags,
			  const struct rtrs_desc *sg, unsigned sg_cnt);

/* ---- decoders: 0 or a negative errno; the reason is in *why ------------- */

/*
 * The connection messages: len may exceed the message (a CM pads it); the
 * bytes beyond it are ignored.
 */
int rtrs_conn_req_decode(const void *buf, size_t len, struct rtrs_conn_req *out,
			 const char **why);
int rtrs_conn_rsp_decode(const void *buf, size_t len, struct rtrs_conn_rsp *out,
			 const char **why);
/* ext: the client set RTRS_CONN_EXT; without it the imm target reads 0. */
int rtrs_info_req_decode(const void *buf, size_t len, bool ext, struct rtrs_info_req *out,
			 const char **why);
/*
 * Expands the descriptors into one (addr, key) per chunk: chunks must have
 * room for queue_depth entries; with lim->key64 the keys come from the
 * records, and gens (queue_depth entries) gets their generations. With
 * lim->ext, a verdict gives its errno in *verdict (and *dnr), returning 0
 * with no chunks filled; without it bytes 4..7 are reserved.
 */
int rtrs_info_rsp_decode(const void *buf, size_t len, const struct rtrs_limits *lim,
			 struct rtrs_desc *chunks, uint32_t *gens, int *verdict, bool *dnr,
			 const char **why);
/* A key slot written by the server for chunk buf_id (KEY64_F). */
int rtrs_new_rkey_decode(const void *slot, uint32_t buf_id, uint32_t *gen, uint64_t *rkey,
			 const char **why);
/* Validates an authentication message: structure and lengths, not semantics. */
int rtrs_auth_decode(const void *buf, size_t len, struct rtrs_auth_msg *out, const char **why);
/*
 * Decodes the payload of an RTRS_IO_REQ_IMM and the header it points at.
 * Read descriptors are copied to sg_buf (RTRS_MAX_READ_SG entries) and the
 * copy is validated: the client may still write the chunk, so nothing is
 * checked where it could change afterwards. out->sg points at sg_buf.
 */
int rtrs_io_req_decode(uint32_t payload, const struct rtrs_limits *lim,
		       void *const *chunk_bases, struct rtrs_desc *sg_buf,
		       struct rtrs_io_req *out, const char **why);
/* Decodes the payload of an RTRS_IO_RSP_IMM. */
int rtrs_io_rsp_decode(uint32_t payload, uint32_t queue_depth, uint32_t *msg_id,
		       int *err, const char **why);
int rtrs_rkey_rsp_decode(const void *buf, size_t len, uint32_t queue_depth,
			 uint32_t *buf_id, uint32_t *rkey, const char **why);
/* recon: the incarnation's recon_cnt (0..65535), or -1 for none (any incarnation). */
void rtrs_fence_encode(struct rtrs_msg_fence *m, bool ack, const uint8_t *uuid, int32_t recon,
		       int err);
/*
 * type is RTRS_MSG_FENCE or RTRS_MSG_FENCE_ACK as expected by the caller;
 * *recon as rtrs_fence_encode took it (-1 from a peer that names none).
 */
int rtrs_fence_decode(const void *buf, size_t len, enum rtrs_msg_type type, uint8_t *uuid,
		      int32_t *recon, int *err, const char **why);

/* The type of a two-sided message (its first le16), or -1 when too short. */
static inline int rtrs_msg_type(const void *buf, size_t len)
{
	struct le16 t;

	if (len < sizeof(t))
		return -1;
	__builtin_memcpy(&t, buf, sizeof(t));
	return le16_get(t);
}

/*
 * The TCP fabric's frames (lib/rtrs/rtrs-fabric-tcp.c, docs/protocol.md
 * section 15). Over TCP, RTRS's operations travel on the byte stream as
 * frames: this 32-byte header, then len bytes of payload. CONNECT, ACCEPT
 * and REJECT carry the RDMA CM's private data (the 56-byte conn_req and
 * conn_rsp above); WRITE puts its payload at off in the region of key (an
 * RDMA write) and, with RTRS_TCP_F_IMM, delivers imm after it (a write
 * with immediate; len may then be 0); SEND is a two-sided message, with
 * RTRS_TCP_F_IMM followed by its immediate. The layout is the same on any
 * byte stream (kernel TLS or OpenSSL may sit under it).
 */
#define RTRS_TCP_MAGIC 0x52      /* 'R' */
#define RTRS_TCP_VERSION 1
#define RTRS_TCP_HDR_LEN 32
#define RTRS_TCP_CM_MAX 256      /* private data of CONNECT, ACCEPT, REJECT */
#define RTRS_TCP_SEND_MAX (64u << 10)
#define RTRS_TCP_WRITE_MAX RTRS_MAX_CHUNK_SIZE
#define RTRS_TCP_F_IMM 0x01

enum rtrs_tcp_op {
	RTRS_TCP_CONNECT = 1,
	RTRS_TCP_ACCEPT = 2,
	RTRS_TCP_REJECT = 3,
	RTRS_TCP_WRITE = 4,
	RTRS_TCP_SEND = 5,
};

struct rtrs_tcp_hdr {
	uint8_t magic;          /* RTRS_TCP_MAGIC */
	uint8_t version;        /* RTRS_TCP_VERSION */
	uint8_t op;             /* enum rtrs_tcp_op */
	uint8_t flags;          /* RTRS_TCP_F_IMM (WRITE, SEND); 0 otherwise */
	struct le32 len;        /* payload bytes that follow */
	struct le64 key;        /* WRITE: the region's key; 0 otherwise */
	struct le64 off;        /* WRITE: byte offset in the region; 0 otherwise */
	struct le32 imm;        /* RTRS_TCP_F_IMM: the immediate; 0 otherwise */
	struct le32 reserved;   /* 0 */
} __attribute__((packed));
static_assert(sizeof(struct rtrs_tcp_hdr) == RTRS_TCP_HDR_LEN, "rtrs_tcp_hdr");
static_assert(offsetof(struct rtrs_tcp_hdr, key) == 8, "rtrs_tcp_hdr key at 8");
static_assert(offsetof(struct rtrs_tcp_hdr, imm) == 24, "rtrs_tcp_hdr imm at 24");

struct rtrs_tcp_frame {
	enum rtrs_tcp_op op;
	bool has_imm;
	uint32_t len;
	uint64_t key;
	uint64_t off;
	uint32_t imm;
};

void rtrs_tcp_hdr_encode(struct rtrs_tcp_hdr *h, const struct rtrs_tcp_frame *f);
/*
 * Checks every field: magic, version, a known op, flags the op may have,
 * zeros where the op has none, len within the op's bound (and off + len
 * without overflow), an empty WRITE only with an immediate. 0, or -EPROTO
 * or -EMSGSIZE with *why.
 */
int rtrs_tcp_hdr_decode(const void *buf, size_t len, struct rtrs_tcp_frame *out,
			const char **why);

/*
 * Session names: 1..255 bytes, printable ASCII without blanks, no '/'
 * (the kernel takes any name without '/'; a host name with dots is a
 * common one), and not "." or ".." (the name is a directory with
 * %SESSNAME%).
 */
bool rtrs_name_valid(const char *name);

#endif
