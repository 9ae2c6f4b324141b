/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the RNBD wire decoders (lib/rnbd/rnbd-proto.c).
 * Byte 0 picks the decoder, the rest is its input; whatever a decoder
 * accepts must keep the invariants the server and client rely on and
 * survive re-encoding. Inputs are decoded from heap copies of exactly their
 * length, so ASan reports any read past them.
 *
 *   0 sess_info   [rsp:u8][msg]
 *   1 open        [msg]
 *   2 open_rsp    [msg]
 *   3 io          [ver:u8][data_len:le32][msg]
 *   4 close       [msg]
 *   5 dev_name    [string]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rnbd-proto.h"

/* No component of name is "." or "..", and it has one that is not empty. */
static bool components_safe(const char *name)
{
	char copy[RNBD_DEV_NAME_MAX + 1], *save = NULL, *c;
	bool any = false;

	snprintf(copy, sizeof(copy), "%s", name);
	for (c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		if (!strcmp(c, ".") || !strcmp(c, ".."))
			return false;
		any = true;
	}
	return any;
}

static void fuzz_sess_info(const uint8_t *p, size_t n)
{
	bool rsp = n && (p[0] & 1);
	struct rnbd_msg_sess_info m;
	const char *why = NULL;
	unsigned ver = 0, again = 0;
	void *b;
	int rc;

	if (n) {
		p++;
		n--;
	}
	b = dup_exact(p, n);
	rc = rnbd_sess_info_decode(b, n, rsp, &ver, &why);
	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(ver == 0 || ver > 255);
	FAIL_IF(rnbd_version_negotiate(ver) == 0 ||
		rnbd_version_negotiate(ver) > RNBD_PROTO_VER_MAJOR);
	rnbd_sess_info_encode(&m, rsp, ver);
	FAIL_IF(rnbd_sess_info_decode(&m, sizeof(m), rsp, &again, NULL) || again != ver);
}

static void fuzz_open(const uint8_t *p, size_t n)
{
	struct rnbd_open o, o2;
	struct rnbd_msg_open m;
	const char *why = NULL;
	void *b = dup_exact(p, n);
	int rc = rnbd_open_decode(b, n, &o, &why);

	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(o.access_mode > RNBD_ACCESS_MIGRATION);
	FAIL_IF(strnlen(o.dev_name, sizeof(o.dev_name)) >= sizeof(o.dev_name));
	FAIL_IF(!components_safe(o.dev_name));
	rnbd_open_encode(&m, &o);
	FAIL_IF(rnbd_open_decode(&m, sizeof(m), &o2, NULL));
	FAIL_IF(o2.access_mode != o.access_mode || strcmp(o2.dev_name, o.dev_name));
}

static void fuzz_open_rsp(const uint8_t *p, size_t n)
{
	struct rnbd_open_rsp r, r2;
	struct rnbd_msg_open_rsp m, m2;
	const char *why = NULL;
	void *b = dup_exact(p, n);
	int rc = rnbd_open_rsp_decode(b, n, &r, &why);

	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(r.logical_block_size < 512 || (r.logical_block_size & (r.logical_block_size - 1)));
	FAIL_IF(r.physical_block_size < r.logical_block_size);
	FAIL_IF(r.nsectors % (r.logical_block_size / 512));
	FAIL_IF(r.nsectors > UINT64_MAX / 512);
	FAIL_IF(r.max_hw_sectors < r.logical_block_size / 512u);
	rnbd_open_rsp_encode(&m, &r);
	FAIL_IF(rnbd_open_rsp_decode(&m, sizeof(m), &r2, NULL));
	/* Compared as wire bytes: the struct's padding is not part of it. */
	rnbd_open_rsp_encode(&m2, &r2);
	FAIL_IF(memcmp(&m, &m2, sizeof(m)));
	/* Everything but the header padding, obsolete_rotational and reserved bytes is kept. */
	FAIL_IF(memcmp((const uint8_t *)&m + 4, p + 4, 40));
	FAIL_IF(m.cache_policy != p[45]);
}

static void fuzz_io(const uint8_t *p, size_t n)
{
	struct rnbd_io io, io2;
	struct rnbd_msg_io m;
	const char *why = NULL;
	unsigned ver;
	uint32_t data_len;
	void *b;
	int rc;

	if (n < 5)
		return;
	ver = take8(&p, &n);
	data_len = take32(&p, &n);
	b = dup_exact(p, n);
	rc = rnbd_io_decode(b, n, ver, data_len, &io, &why);
	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	FAIL_IF(io.op > RNBD_OP_WRITE_ZEROES || (io.flags & ~RNBD_F_ALL));
	FAIL_IF(io.bi_size % 512);
	FAIL_IF(io.sector > (UINT64_MAX - io.bi_size) / 512);
	if (io.op == RNBD_OP_READ || io.op == RNBD_OP_WRITE)
		FAIL_IF(data_len != io.bi_size);
	else
		FAIL_IF(data_len != 0);
	FAIL_IF(io.op == RNBD_OP_READ && !io.bi_size);
	FAIL_IF(io.op == RNBD_OP_FLUSH && io.bi_size);
	FAIL_IF((io.flags & RNBD_F_NOUNMAP) && io.op != RNBD_OP_WRITE_ZEROES);
	FAIL_IF(ver < 2 && io.prio);
	rnbd_io_encode(&m, &io);
	FAIL_IF(rnbd_io_decode(&m, sizeof(m), ver, data_len, &io2, NULL));
	FAIL_IF(io2.device_id != io.device_id || io2.sector != io.sector || io2.op != io.op ||
		io2.flags != io.flags || io2.bi_size != io.bi_size || io2.prio != io.prio);
}

static void fuzz_close(const uint8_t *p, size_t n)
{
	struct rnbd_msg_close m;
	const char *why = NULL;
	uint32_t id = 0, again = 1;
	void *b = dup_exact(p, n);
	int rc = rnbd_close_decode(b, n, &id, &why);

	CHECK_WHY(rc, why);
	free(b);
	if (rc)
		return;
	rnbd_close_encode(&m, id);
	FAIL_IF(rnbd_close_decode(&m, sizeof(m), &again, NULL) || again != id);
}

static void fuzz_dev_name(const uint8_t *p, size_t n)
{
	char name[RNBD_DEV_NAME_MAX + 8];
	size_t len = MIN(n, sizeof(name) - 1);
	const char *why = NULL;
	bool ok;

	memcpy(name, p, len);
	name[len] = '\0';
	ok = rnbd_dev_name_valid(name, &why);
	FAIL_IF(!ok && why == NULL);
	if (!ok)
		return;
	FAIL_IF(strlen(name) >= RNBD_DEV_NAME_MAX);
	FAIL_IF(!components_safe(name));
	for (const char *c = name; *c; c++)
		FAIL_IF((unsigned char)*c < 0x20 || *c == 0x7f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	switch (data[0] % 6) {
	case 0:
		fuzz_sess_info(data + 1, size - 1);
		break;
	case 1:
		fuzz_open(data + 1, size - 1);
		break;
	case 2:
		fuzz_open_rsp(data + 1, size - 1);
		break;
	case 3:
		fuzz_io(data + 1, size - 1);
		break;
	case 4:
		fuzz_close(data + 1, size - 1);
		break;
	case 5:
		fuzz_dev_name(data + 1, size - 1);
		break;
	}
	return 0;
}
