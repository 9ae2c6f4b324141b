/* SPDX-License-Identifier: MIT */
/*
 * RNBD wire protocol, major version 2, as the kernel's rnbd-proto.h lays it
 * out (docs/protocol.md section 13): messages travel as the RTRS user
 * header of a request; answers to SESS_INFO and OPEN come back as the read
 * data of that request. All fields little-endian.
 *
 * This header is the only place that knows the byte layout of RNBD
 * messages. Every decoder validates every field before anything else uses
 * it; the one layout choice of our own is the IO message, which the kernel
 * leaves to the compiler's padding (26 bytes of fields, sizeof 32): here the
 * six trailing bytes are explicit and sent as zeros.
 */
#ifndef RNBD_PROTO_H
#define RNBD_PROTO_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/util.h"

#define RNBD_PROTO_VER_MAJOR 2
/* Minor 2: PREFLUSH and NOUNMAP (kernel, early 2026); the minor is not sent. */
#define RNBD_PROTO_VER_MINOR 2
#define RNBD_DEFAULT_PORT 1234
#define RNBD_DEV_NAME_MAX 255     /* bytes of dev_name, NUL included */
#define RNBD_SECTOR_SHIFT 9
#define RNBD_SECTOR_SIZE 512u

enum rnbd_msg_type {
	RNBD_MSG_SESS_INFO = 0,
	RNBD_MSG_SESS_INFO_RSP = 1,
	RNBD_MSG_OPEN = 2,
	RNBD_MSG_OPEN_RSP = 3,
	RNBD_MSG_IO = 4,
	RNBD_MSG_CLOSE = 5,
};

enum rnbd_access_mode {
	RNBD_ACCESS_RO = 0,
	RNBD_ACCESS_RW = 1,
	RNBD_ACCESS_MIGRATION = 2, /* a second writer, for VM migration */
};

/* rw = op | flags; the op takes the low 8 bits. */
#define RNBD_OP_BITS 8
#define RNBD_OP_MASK ((1u << RNBD_OP_BITS) - 1)

enum rnbd_io_op {
	RNBD_OP_READ = 0,
	RNBD_OP_WRITE = 1,
	RNBD_OP_FLUSH = 2,
	RNBD_OP_DISCARD = 3,
	RNBD_OP_SECURE_ERASE = 4,
	RNBD_OP_WRITE_ZEROES = 5,
};

enum rnbd_io_flags {
	RNBD_F_SYNC = 1u << (RNBD_OP_BITS + 0),
	RNBD_F_FUA = 1u << (RNBD_OP_BITS + 1),
	RNBD_F_PREFLUSH = 1u << (RNBD_OP_BITS + 2),
	RNBD_F_NOUNMAP = 1u << (RNBD_OP_BITS + 3), /* write zeroes: keep the blocks allocated */
};
#define RNBD_F_ALL (RNBD_F_SYNC | RNBD_F_FUA | RNBD_F_PREFLUSH | RNBD_F_NOUNMAP)

/* open_rsp cache_policy bits */
enum rnbd_cache_policy {
	RNBD_FUA = 1u << 0,
	RNBD_WRITEBACK = 1u << 1,
};

/* ---- messages ------------------------------------------------------------ */

struct rnbd_msg_hdr {
	struct le16 type;
	struct le16 padding;
} __attribute__((packed));
static_assert(sizeof(struct rnbd_msg_hdr) == 4, "rnbd_msg_hdr");

/* SESS_INFO and its response: the sender's major version. */
struct rnbd_msg_sess_info {
	struct rnbd_msg_hdr hdr;
	uint8_t ver;
	uint8_t reserved[31];
} __attribute__((packed));
static_assert(sizeof(struct rnbd_msg_sess_info) == 36, "rnbd_msg_sess_info");

struct rnbd_msg_open {
	struct rnbd_msg_hdr hdr;
	uint8_t access_mode;
	uint8_t resv1;
	char dev_name[RNBD_DEV_NAME_MAX];
	uint8_t reserved[3];
} __attribute__((packed));
static_assert(sizeof(struct rnbd_msg_open) == 264, "rnbd_msg_open");
static_assert(offsetof(struct rnbd_msg_open, dev_name) == 6, "rnbd_msg_open dev_name");

struct rnbd_msg_open_rsp {
	struct rnbd_msg_hdr hdr;
	struct le32 device_id;
	struct le64 nsectors;                 /* 512-byte sectors */
	struct le32 max_hw_sectors;
	struct le32 max_write_zeroes_sectors;
	struct le32 max_discard_sectors;
	struct le32 discard_granularity;      /* bytes */
	struct le32 discard_alignment;        /* bytes */
	struct le16 physical_block_size;
	struct le16 logical_block_size;
	struct le16 max_segments;
	struct le16 secure_discard;
	uint8_t obsolete_rotational;
	uint8_t cache_policy;                 /* enum rnbd_cache_policy */
	uint8_t reserved[10];
} __attribute__((packed));
static_assert(sizeof(struct rnbd_msg_open_rsp) == 56, "rnbd_msg_open_rsp");
static_assert(offsetof(struct rnbd_msg_open_rsp, nsectors) == 8, "open_rsp nsectors");
/* The largest block size OPEN_RSP's 16-bit fields carry (a power of two). */
#define RNBD_MAX_BLOCK_SIZE 32768u
static_assert(offsetof(struct rnbd_msg_open_rsp, physical_block_size) == 36, "open_rsp pbs");
static_assert(offsetof(struct rnbd_msg_open_rsp, cache_policy) == 45, "open_rsp cache_policy");

struct rnbd_msg_io {
	struct rnbd_msg_hdr hdr;
	struct le32 device_id;
	struct le64 sector;
	struct le32 rw;                       /* op | flags */
	struct le32 bi_size;                  /* bytes, also for ops without data */
	struct le16 prio;                     /* version 2 and later */
	uint8_t reserved[6];                  /* the kernel's padding */
} __attribute__((packed));
static_assert(sizeof(struct rnbd_msg_io) == 32, "rnbd_msg_io");
static_assert(offsetof(struct rnbd_msg_io, prio) == 24, "rnbd_msg_io prio");
/* What a version-1 peer sends: the fields before prio. */
#define RNBD_MSG_IO_V1_LEN offsetof(struct rnbd_msg_io, prio)

struct rnbd_msg_close {
	struct rnbd_msg_hdr hdr;
	struct le32 device_id;
} __attribute__((packed));
static_assert(sizeof(struct rnbd_msg_close) == 8, "rnbd_msg_close");

/* The largest RNBD message, which bounds the RTRS user header it travels in. */
#define RNBD_MSG_MAX sizeof(struct rnbd_msg_open)

/* ---- decoded, validated host forms ---------------------------------------- */

struct rnbd_open {
	enum rnbd_access_mode access_mode;
	char dev_name[RNBD_DEV_NAME_MAX];     /* NUL-terminated, not empty */
};

struct rnbd_open_rsp {
	uint32_t device_id;
	uint64_t nsectors;
	uint32_t max_hw_sectors;
	uint32_t max_write_zeroes_sectors;
	uint32_t max_discard_sectors;
	uint32_t discard_granularity;
	uint32_t discard_alignment;
	uint16_t physical_block_size;
	uint16_t logical_block_size;
	uint16_t max_segments;
	uint16_t secure_discard;
	uint8_t cache_policy;
};

struct rnbd_io {
	uint32_t device_id;
	uint64_t sector;
	enum rnbd_io_op op;
	uint32_t flags;                       /* RNBD_F_* */
	uint32_t bi_size;
	uint16_t prio;
};

/* ---- version -------------------------------------------------------------- */

/* The version both sides use: the lower of the two majors; 0 if none fits. */
unsigned rnbd_version_negotiate(unsigned peer);

/* ---- encoders ------------------------------------------------------------- */

void rnbd_sess_info_encode(struct rnbd_msg_sess_info *m, bool rsp, unsigned ver);
void rnbd_open_encode(struct rnbd_msg_open *m, const struct rnbd_open *o);
void rnbd_open_rsp_encode(struct rnbd_msg_open_rsp *m, const struct rnbd_open_rsp *r);
void rnbd_io_encode(struct rnbd_msg_io *m, const struct rnbd_io *io);
void rnbd_close_encode(struct rnbd_msg_close *m, uint32_t device_id);

/* ---- decoders: 0 or a negative errno; the reason is in *why --------------- */

/* The type of a message of len bytes, or a negative errno. */
int rnbd_msg_type(const void *buf, size_t len, const char **why);
/* *ver: the peer's major version (not yet negotiated). */
int rnbd_sess_info_decode(const void *buf, size_t len, bool rsp, unsigned *ver,
			  const char **why);
int rnbd_open_decode(const void *buf, size_t len, struct rnbd_open *out, const char **why);
int rnbd_open_rsp_decode(const void *buf, size_t len, struct rnbd_open_rsp *out,
			 const char **why);
/*
 * The rules of an operation and its flags that do not depend on a device:
 * a known operation and flags, NOUNMAP on write zeroes only, no FUA or
 * PREFLUSH on a read. The server's decoder applies them, and the client
 * before it sends anything. 0 or -EINVAL.
 */
int rnbd_io_op_check(enum rnbd_io_op op, uint32_t flags, const char **why);
/*
 * An IO (op and flags already checked) for a server that is not of this
 * project: a kernel rnbd-server before 7.0 knows only SYNC and FUA, and
 * drops the rest (its rnbd_to_bio_flags). PREFLUSH comes off *flags and
 * goes as a FLUSH of its own before the IO (*flush_first), except on a
 * FLUSH, which is one. FUA stays only on a write or a flush: since Linux
 * 6.3 the block layer fails a FUA discard, secure erase or write zeroes
 * (submit_bio_noacct takes FUA and PREFLUSH on writes only), so it comes off
 * those and a FLUSH goes once the IO is done (*flush_after). NOUNMAP cannot
 * be kept: -EOPNOTSUPP, since such a server may deallocate the blocks the
 * caller wants kept (the caller may write the zeros itself, as nbdkit
 * does). 0 otherwise.
 */
int rnbd_io_for_kernel(enum rnbd_io_op op, uint32_t *flags, bool *flush_first,
		       bool *flush_after);
/*
 * An IO message as the server receives it, with data_len bytes of data in
 * the request: reads and writes must carry exactly bi_size bytes; flush,
 * discard, secure erase and write zeroes carry none. ver is the session's
 * negotiated version (prio is read from version 2 on).
 */
int rnbd_io_decode(const void *buf, size_t len, unsigned ver, size_t data_len,
		   struct rnbd_io *out, const char **why);
int rnbd_close_decode(const void *buf, size_t len, uint32_t *device_id, const char **why);

/*
 * A device name a client may ask for: a path below the server's search path
 * (a leading '/' and repeated '/' are allowed and collapse, as in the
 * kernel), with at least one component, none of them "." or "..", no
 * control characters, shorter than RNBD_DEV_NAME_MAX. The server checks
 * again when it resolves the path (symlinks cannot lead out either).
 */
bool rnbd_dev_name_valid(const char *name, const char **why);

/*
 * The kernel's sharing rule for one backing device that `writers` sessions
 * already have open for writing: read-only always; read-write only when
 * nobody writes; migration while at most one other writes (the second
 * writer of a live VM migration). 0 or -EPERM.
 */
int rnbd_access_admit(enum rnbd_access_mode mode, unsigned writers);

const char *rnbd_op_name(enum rnbd_io_op op);
const char *rnbd_access_mode_name(enum rnbd_access_mode mode);

#endif
