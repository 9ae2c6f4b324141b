/* SPDX-License-Identifier: MIT */
/*
 * What always_invalidate adds per IO on the server, measured alone: one
 * chunk key revoked and a new one registered (fab_mr_dereg + fab_mr_reg
 * with FAB_MR_KEY64), in a domain that holds a session's worth of other
 * chunk registrations, as a server has. Prints nanoseconds per cycle.
 *
 *   mr-cycle [provider] [chunks] [chunk bytes] [cycles]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rtrs-fabric.h"

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	const char *prov = argc > 1 ? argv[1] : "tcp";
	unsigned chunks = argc > 2 ? (unsigned)atoi(argv[2]) : 128;
	size_t chunk = argc > 3 ? (size_t)atol(argv[3]) : 256 * 1024;
	unsigned cycles = argc > 4 ? (unsigned)atoi(argv[4]) : 500000;
	unsigned access = FAB_MR_REMOTE_WRITE |
			  (argc > 5 && !strcmp(argv[5], "31") ? 0 : FAB_MR_KEY64);
	struct fab_mr *mrs;
	struct fab *f;
	char *mem;
	double t0, t;
	int rc;

	rc = fab_open(prov, NULL, "127.0.0.1", "0", true, 16, &f);
	if (rc) {
		fprintf(stderr, "mr-cycle: cannot open provider %s: %s\n", prov, strerror(-rc));
		return 1;
	}
	mem = calloc(chunks, chunk);
	mrs = calloc(chunks, sizeof(*mrs));
	if (!mem || !mrs || !chunks) {
		fprintf(stderr, "mr-cycle: out of memory\n");
		return 1;
	}
	for (unsigned i = 0; i < chunks; i++) {
		rc = fab_mr_reg(f, mem + (size_t)i * chunk, chunk, access, &mrs[i]);
		if (rc) {
			fprintf(stderr, "mr-cycle: registering chunk %u: %s\n", i, strerror(-rc));
			return 1;
		}
	}
	t0 = now_ns();
	for (unsigned n = 0; n < cycles; n++) {
		struct fab_mr *m = &mrs[n % chunks];

		fab_mr_dereg(m);
		rc = fab_mr_reg(f, mem + (size_t)(n % chunks) * chunk, chunk, access, m);
		if (rc) {
			fprintf(stderr, "mr-cycle: cycle %u: %s\n", n, strerror(-rc));
			return 1;
		}
	}
	t = now_ns() - t0;
	printf("%.0f\n", t / cycles);
	for (unsigned i = 0; i < chunks; i++)
		fab_mr_dereg(&mrs[i]);
	fab_close(f);
	free(mrs);
	free(mem);
	return 0;
}
