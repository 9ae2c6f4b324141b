/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the TCP fabric's frame decoder (rtrs_tcp_hdr_decode,
 * lib/rtrs/rtrs-proto.c): the input is a byte stream as a socket delivers
 * it, read the way lib/rtrs/rtrs-fabric-tcp.c reads it: a 32-byte header
 * from an exact-length heap copy, then its payload skipped, then the next.
 * Every accepted header keeps the decoder's contract (a known op, flags it
 * may have, zeros where the op has none, a length within the op's bound,
 * no offset overflow, no empty write without an immediate) and re-encodes
 * to the same 32 bytes; every refusal names its reason.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rtrs-proto.h"

static uint32_t op_max(enum rtrs_tcp_op op)
{
	switch (op) {
	case RTRS_TCP_CONNECT:
	case RTRS_TCP_ACCEPT:
	case RTRS_TCP_REJECT:
		return RTRS_TCP_CM_MAX;
	case RTRS_TCP_WRITE:
		return RTRS_TCP_WRITE_MAX;
	case RTRS_TCP_SEND:
		return RTRS_TCP_SEND_MAX;
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t pos = 0;

	while (size - pos >= 1) {
		size_t n = size - pos < RTRS_TCP_HDR_LEN ? size - pos : RTRS_TCP_HDR_LEN;
		uint8_t *copy = malloc(n ? n : 1);
		struct rtrs_tcp_frame f;
		struct rtrs_tcp_hdr again;
		const char *why = NULL;
		int rc;

		memcpy(copy, data + pos, n);
		rc = rtrs_tcp_hdr_decode(copy, n, &f, &why);
		CHECK_WHY(rc, why);
		if (rc) {
			FAIL_IF(rc != -EPROTO && rc != -EMSGSIZE);
			free(copy);
			break;
		}
		FAIL_IF(n != RTRS_TCP_HDR_LEN);
		FAIL_IF(op_max(f.op) == 0);
		FAIL_IF(f.len > op_max(f.op));
		if (f.op == RTRS_TCP_WRITE) {
			FAIL_IF(!f.len && !f.has_imm);
			FAIL_IF(f.off > UINT64_MAX - f.len);
		} else {
			FAIL_IF(f.key || f.off);
		}
		if (f.op == RTRS_TCP_SEND)
			FAIL_IF(!f.len);
		if (f.op != RTRS_TCP_WRITE && f.op != RTRS_TCP_SEND)
			FAIL_IF(f.has_imm);
		FAIL_IF(!f.has_imm && f.imm);
		rtrs_tcp_hdr_encode(&again, &f);
		FAIL_IF(memcmp(&again, copy, sizeof(again)) != 0);
		free(copy);
		pos += RTRS_TCP_HDR_LEN;
		/* The payload goes to its place; the next header follows it. */
		if (f.len > size - pos)
			break;
		pos += f.len;
	}
	return 0;
}
