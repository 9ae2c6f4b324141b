/* SPDX-License-Identifier: MIT */
/*
 * Minimal test assertions: a failed CHECK prints where and why, counts, and
 * the test goes on; test_done() exits non-zero if anything failed.
 */
#ifndef RTRS_TEST_CHECK_H
#define RTRS_TEST_CHECK_H

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Atomic: tests check from their worker threads too. */
static atomic_int g_checks, g_failures, g_skipped_parts;

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

/*
 * A new directory in base (TMPDIR or /var/tmp when NULL), named prefix
 * plus a random suffix, removed with everything in it when the test
 * process ends however it ends (a failed check, an abort, a signal, a
 * timeout's kill): a watcher in its own session waits for the end of a
 * pipe only this process holds, then runs rm -rf. The path, or NULL.
 */
static inline const char *test_tmpdir(const char *base, const char *prefix)
{
	static char dir[128]; /* room for file names after it in callers' 256 */
	int fds[2];
	pid_t pid;

	if (!base)
		base = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	snprintf(dir, sizeof(dir), "%s/%s.XXXXXX", base, prefix);
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return NULL;
	}
	if (pipe2(fds, O_CLOEXEC))
		return dir;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		char c;

		/* Nothing of the test's but the pipe (a socket kept open would keep a port). */
		dup2(fds[0], STDIN_FILENO);
		close_range(3, ~0u, 0);
		setsid(); /* outlives a kill of the test's process group */
		while (read(STDIN_FILENO, &c, 1) < 0 && errno == EINTR)
			;
		execlp("rm", "rm", "-rf", "--", dir, (char *)NULL);
		_exit(127);
	}
	close(fds[0]); /* the write end stays open until this process is gone */
	return dir;
}

/*
 * A part of the test that cannot run here (a build without fault
 * injection, say): says why, and the test ends with 77 (skipped) unless
 * something else failed, since it did not test everything.
 */
#define SKIP_PART(...)                                      \
	do {                                                \
		g_skipped_parts++;                          \
		fprintf(stderr, "SKIP part: " __VA_ARGS__); \
		fputc('\n', stderr);                        \
	} while (0)

static inline int test_done(const char *name)
{
	printf("%s: %d checks, %d failed", name, g_checks, g_failures);
	if (g_skipped_parts)
		printf(", %d part%s skipped", g_skipped_parts, g_skipped_parts > 1 ? "s" : "");
	printf("\n");
	return g_failures ? 1 : g_skipped_parts ? 77 : 0;
}

#endif
