// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * What a server's key-file lookup costs as the file grows: writes a key
 * file of --hosts host lines, then --threads threads look hosts up through
 * the server's reader (rtrs_keyfile_lookup, as each DH-HMAC-CHAP NEGOTIATE
 * does) for --seconds; prints one line "hosts threads lookups/s CPU-us-per-
 * lookup" (CPU: the process's user + system time). Run by
 * bench/keyfile-lookup.sh, which builds it against two trees.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "rtrs-auth.h"

static struct rtrs_keyfile *kf;
static unsigned nhosts;
static atomic_bool stop;
static atomic_ulong done, failed;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu(void)
{
	struct rusage r;

	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
	       (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static void *worker(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;

	while (!atomic_load(&stop)) {
		struct rtrs_auth_key hk, ck;
		const char *why;
		unsigned line;
		char host[64];

		snprintf(host, sizeof(host), "nqn.2014-08.org.nvmexpress:uuid:host-%08u",
			 rand_r(&seed) % nhosts);
		if (rtrs_keyfile_lookup(kf, host, &hk, &ck, &line, &why) || hk.len != 32)
			atomic_fetch_add(&failed, 1);
		atomic_fetch_add(&done, 1);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	unsigned threads = 4;
	double seconds = 3;
	char path[] = "/tmp/rtrs-keyfile-bench.XXXXXX";
	pthread_t t[64];
	FILE *f;
	int fd;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--hosts"))
			nhosts = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--threads"))
			threads = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = strtod(argv[i + 1], NULL);
		else
			break;
	}
	if (!nhosts || !threads || threads > 64 || seconds <= 0 || argc % 2 == 0) {
		fprintf(stderr, "usage: %s --hosts N [--threads 1..64] [--seconds S]\n", argv[0]);
		return 2;
	}
	fd = mkstemp(path);
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		perror(path);
		return 1;
	}
	for (unsigned i = 0; i < nhosts; i++) {
		struct rtrs_auth_key k = { .hmac = 1, .len = 32 };
		char s[RTRS_AUTH_KEY_STR_MAX];

		memset(k.key, (int)i, sizeof(k.key));
		memcpy(k.key, &i, sizeof(i));
		if (rtrs_auth_key_format(&k, s, sizeof(s)))
			return 1;
		fprintf(f, "nqn.2014-08.org.nvmexpress:uuid:host-%08u %s\n", i, s);
	}
	if (fclose(f) || rtrs_keyfile_new(path, &kf)) {
		unlink(path);
		return 1;
	}
	double t0 = now(), c0 = cpu();

	for (unsigned i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	usleep((useconds_t)(seconds * 1e6));
	atomic_store(&stop, true);
	for (unsigned i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	double el = now() - t0, c = cpu() - c0;
	unsigned long n = atomic_load(&done);

	rtrs_keyfile_free(kf);
	unlink(path);
	if (atomic_load(&failed)) {
		fprintf(stderr, "%lu of %lu lookups failed\n", atomic_load(&failed), n);
		return 1;
	}
	printf("%u %u %.1f %.2f\n", nhosts, threads, (double)n / el, n ? c * 1e6 / (double)n : 0);
	return 0;
}
