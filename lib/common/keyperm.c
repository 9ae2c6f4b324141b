/* SPDX-License-Identifier: MIT */
/*
 * Keyed permutations for memory keys (see keyperm.h). Speck as specified in
 * the 2013 paper: round function x = (x >>> a) + y ^ k, y = (y <<< b) ^ x,
 * with a = 8, b = 3, 27 rounds for Speck64/128 and a = 7, b = 2, 22 rounds
 * for Speck32/64; the key schedule runs the same round over the key words.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "keyperm.h"
#include "util.h"

static inline uint32_t ror32(uint32_t v, unsigned r) { return v >> r | v << (32 - r); }
static inline uint32_t rol32(uint32_t v, unsigned r) { return v << r | v >> (32 - r); }
static inline uint16_t ror16(uint16_t v, unsigned r) { return (uint16_t)(v >> r | v << (16 - r)); }
static inline uint16_t rol16(uint16_t v, unsigned r) { return (uint16_t)(v << r | v >> (16 - r)); }

#define R64(x, y, k) (x = (ror32(x, 8) + y) ^ (k), y = rol32(y, 3) ^ x)
#define R32(x, y, k) (x = (uint16_t)((ror16(x, 7) + y) ^ (k)), y = rol16(y, 2) ^ x)

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * The secret's words, least significant first: k0 = bytes 0..3, then l0,
 * l1, l2 (Speck64/128), and k0 = bytes 16..17, l0..l2 (Speck32/64). The
 * paper prints keys most significant word first: "1b1a1918 ... 03020100"
 * is the byte string 00 01 02 03 08 09 0a 0b ... here.
 */
void keyperm_init_secret(struct keyperm *kp, const uint8_t secret[KEYPERM_SECRET_LEN])
{
	uint32_t k = get32(secret), l[3] = { get32(secret + 4), get32(secret + 8),
					      get32(secret + 12) };
	uint16_t k16 = (uint16_t)(secret[16] | secret[17] << 8), l16[3];

	for (int i = 0; i < 3; i++)
		l16[i] = (uint16_t)(secret[18 + 2 * i] | secret[19 + 2 * i] << 8);
	for (uint32_t i = 0; i < 27; i++) {
		kp->rk64[i] = k;
		R64(l[i % 3], k, i);
	}
	for (uint16_t i = 0; i < 22; i++) {
		kp->rk32[i] = k16;
		R32(l16[i % 3], k16, i);
	}
}

int keyperm_init(struct keyperm *kp)
{
	uint8_t secret[KEYPERM_SECRET_LEN];
	int rc = rand_bytes(secret, sizeof(secret));

	if (rc)
		return rc;
	keyperm_init_secret(kp, secret);
	explicit_bzero(secret, sizeof(secret));
	return 0;
}

uint64_t keyperm_speck64(const struct keyperm *kp, uint64_t block)
{
	uint32_t x = (uint32_t)(block >> 32), y = (uint32_t)block;

	for (int i = 0; i < 27; i++)
		R64(x, y, kp->rk64[i]);
	return (uint64_t)x << 32 | y;
}

uint32_t keyperm_speck32(const struct keyperm *kp, uint32_t block)
{
	uint16_t x = (uint16_t)(block >> 16), y = (uint16_t)block;

	for (int i = 0; i < 22; i++)
		R32(x, y, kp->rk32[i]);
	return (uint32_t)x << 16 | y;
}

/*
 * Cycle walking: the orbit of n under the cipher returns to n, which is in
 * range, so it meets the range again; taking the first value in range is a
 * bijection of the range onto itself. The range is all but 2^-32 of the
 * 64-bit space, and all of the 32-bit space but 0: one step, almost always.
 * (A 31-bit range took two steps on average: 2.8 times the time per key.)
 */
uint64_t keyperm_key64(const struct keyperm *kp, uint64_t n)
{
	uint64_t v = n;

	do
		v = keyperm_speck64(kp, v);
	while (v < KEYPERM_KEY64_MIN);
	return v;
}

uint32_t keyperm_key32(const struct keyperm *kp, uint32_t i)
{
	uint32_t v = i + 1;

	assert(i < KEYPERM_KEY32_MAX); /* v = 0 would share E(0) with the counter D(0) - 1 */

	do
		v = keyperm_speck32(kp, v);
	while (!v);
	return v;
}

void keyperm_clear(struct keyperm *kp)
{
	explicit_bzero(kp, sizeof(*kp));
}
