/* SPDX-License-Identifier: MIT */
/*
 * Memory keys that never repeat and cannot be guessed.
 *
 * On a software provider every connection of a domain may aim a write at
 * any key of the domain, so a key taken straight from a counter tells a peer
 * the keys of everyone registered just before and after it. The keys here
 * are the counter passed through a keyed permutation: a block cipher is a
 * bijection, so distinct counters still give distinct keys, and without the
 * domain's secret one key says nothing about the next.
 *
 * The permutation is Speck (Beaulieu et al., "The SIMON and SPECK Families
 * of Lightweight Block Ciphers", 2013): Speck64/128 for 64-bit keys and
 * Speck32/64 for keys that must fit 32 bits, each narrowed to its range by
 * cycle walking (encrypt again until the value lands in range, which keeps
 * a bijection on the range). Tens of nanoseconds per key.
 */
#ifndef RTRS_COMMON_KEYPERM_H
#define RTRS_COMMON_KEYPERM_H

#include <stdint.h>

#define KEYPERM_SECRET_LEN 24 /* 16 bytes for Speck64/128, 8 for Speck32/64 */
#define KEYPERM_KEY64_MIN ((uint64_t)1 << 32)
#define KEYPERM_KEY32_MAX 0xffffffffu

struct keyperm {
	uint32_t rk64[27];
	uint16_t rk32[22];
};

/* A fresh random secret (getrandom). 0 or a negative errno. */
int keyperm_init(struct keyperm *kp);
/* A given secret: tests, and the cipher's published vectors. */
void keyperm_init_secret(struct keyperm *kp, const uint8_t secret[KEYPERM_SECRET_LEN]);

/* The raw ciphers; block words as the paper prints them (x high, y low). */
uint64_t keyperm_speck64(const struct keyperm *kp, uint64_t block);
uint32_t keyperm_speck32(const struct keyperm *kp, uint32_t block);

/* n in [2^32, 2^64) -> a key in [2^32, 2^64), distinct for distinct n. */
uint64_t keyperm_key64(const struct keyperm *kp, uint64_t n);
/* i in [0, 2^32 - 2] -> a key in [1, 2^32 - 1], distinct for distinct i. */
uint32_t keyperm_key32(const struct keyperm *kp, uint32_t i);

/* Wipes the secret. */
void keyperm_clear(struct keyperm *kp);

#endif
