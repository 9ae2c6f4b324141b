/* SPDX-License-Identifier: MIT */
/*
 * Shared by the libFuzzer targets: invariant checks that abort (so libFuzzer
 * keeps the input), exact-length heap copies (so ASan sees any read past a
 * message), and little-endian readers of the target's own input prefix.
 */
#ifndef RTRS_FUZZ_UTIL_H
#define RTRS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FAIL_IF(cond)                                                          \
	do {                                                                   \
		if (cond) {                                                    \
			fprintf(stderr, "%s:%d: invariant broken: %s\n",       \
				__FILE__, __LINE__, #cond);                    \
			abort();                                               \
		}                                                              \
	} while (0)

/* Every rejection names its reason. */
#define CHECK_WHY(rc, why) FAIL_IF((rc) && (why) == NULL)

/* Readers of the input: 0 (and nothing taken) when it has run out. */
static inline uint16_t take16(const uint8_t **p, size_t *n)
{
	uint16_t v = 0;

	if (*n >= 2) {
		v = (uint16_t)((*p)[0] | (*p)[1] << 8);
		*p += 2;
		*n -= 2;
	}
	return v;
}

static inline uint32_t take32(const uint8_t **p, size_t *n)
{
	uint32_t lo = take16(p, n);

	return lo | (uint32_t)take16(p, n) << 16;
}

static inline uint8_t take8(const uint8_t **p, size_t *n)
{
	uint8_t v = 0;

	if (*n) {
		v = **p;
		(*p)++;
		(*n)--;
	}
	return v;
}

/* A heap copy of exactly n bytes: ASan reports a read past them. */
static inline void *dup_exact(const uint8_t *p, size_t n)
{
	void *b = malloc(n ? n : 1);

	if (!b)
		abort();
	if (n)
		memcpy(b, p, n);
	return b;
}

#endif
