/* SPDX-License-Identifier: MIT */
/*
 * Latency histogram for the benchmarks: 32 linear sub-buckets per power of
 * two (3 % precision), lock-free adds from any thread.
 */
#ifndef RTRS_COMMON_HIST_H
#define RTRS_COMMON_HIST_H

#include <stdatomic.h>
#include <stdint.h>

#define HIST_SUB 32
#define HIST_BUCKETS (64 * HIST_SUB)

struct hist {
	atomic_uint_fast64_t b[HIST_BUCKETS];
};

static inline unsigned hist_index(uint64_t v)
{
	unsigned e;

	if (v < HIST_SUB)
		return (unsigned)v;
	e = 63 - (unsigned)__builtin_clzll(v); /* >= 5 */
	return (e - 4) * HIST_SUB + (unsigned)((v >> (e - 5)) & (HIST_SUB - 1));
}

static inline uint64_t hist_value(unsigned idx)
{
	unsigned e;

	if (idx < HIST_SUB)
		return idx;
	e = idx / HIST_SUB + 4;
	return ((uint64_t)(HIST_SUB + idx % HIST_SUB)) << (e - 5);
}

static inline void hist_add(struct hist *h, uint64_t v)
{
	atomic_fetch_add_explicit(&h->b[hist_index(v)], 1, memory_order_relaxed);
}

/* The value below which pct percent of the total samples lie. */
static inline uint64_t hist_percentile(struct hist *h, double pct, uint64_t total)
{
	uint64_t want = (uint64_t)(pct / 100.0 * (double)total + 0.5), seen = 0;

	if (want == 0)
		want = 1;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		seen += atomic_load_explicit(&h->b[i], memory_order_relaxed);
		if (seen >= want)
			return hist_value(i);
	}
	return 0;
}

#endif
