/* SPDX-License-Identifier: MIT */
/* The user header the functional tests send to rtrs-test-server. */
#ifndef RTRS_TEST_PROTO_HDR_H
#define RTRS_TEST_PROTO_HDR_H

#include <stdint.h>

#define TEST_MAGIC 0x54535452u

enum test_op {
	TEST_OP_IO = 0,     /* write: store data at offset; read: return it */
	TEST_OP_FAIL = 1,   /* answer with -errno_ */
};

struct test_hdr {
	uint32_t magic;
	uint32_t op;
	uint64_t offset;
	uint32_t len;
	int32_t errno_;
};

#endif
