/* SPDX-License-Identifier: MIT */
/*
 * Minimal test assertions: a failed CHECK prints where and why, counts, and
 * the test goes on; test_done() exits non-zero if anything failed.
 */
#ifndef RTRS_TEST_CHECK_H
#define RTRS_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_failures;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		g_checks++;                                                    \
		if (!(cond)) {                                                 \
			g_failures++;                                          \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, \
				__LINE__, #cond);                              \
			fprintf(stderr, "" __VA_ARGS__);                       \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

#define CHECK_EQ(a, b)                                                          \
	do {                                                                    \
		long long a_ = (long long)(a), b_ = (long long)(b);             \
		CHECK(a_ == b_, "%s = %lld, %s = %lld", #a, a_, #b, b_);        \
	} while (0)

/* Skip (exit 77) with a reason, as meson and automake understand it. */
#define SKIP(...)                                     \
	do {                                          \
		fprintf(stderr, "SKIP: " __VA_ARGS__); \
		fputc('\n', stderr);                  \
		exit(77);                             \
	} while (0)

static inline int test_done(const char *name)
{
	printf("%s: %d checks, %d failed\n", name, g_checks, g_failures);
	return g_failures ? 1 : 0;
}

#endif
