/* SPDX-License-Identifier: MIT */
/*
 * The main() of a fake-fabric scenario program: runs the scenarios named on
 * the command line (all of them without arguments), each from a clean
 * frame, and checks after each one that the library left nothing behind
 * in the fabric and that it took less than a second. Included once, by
 * the file that defines `scenarios` (check.h's counters are per file).
 */
#ifndef RTRS_TEST_FAKE_MAIN_H
#define RTRS_TEST_FAKE_MAIN_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fake-env.h"

struct scenario {
	const char *name;
	void (*fn)(void);
};

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/*
 * A scenario that hangs (a teardown waiting for an op that nobody will
 * answer, after a check failed) is reported here with the library's log
 * after FAKE_HANG_S, before meson's timeout (30 s) kills it without a word.
 */
#define FAKE_HANG_S 20

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const char *running; /* the scenario, NULL between them */
	bool stop;
} hang = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false };

static void *hang_watch(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&hang.lock);
	while (!hang.stop) {
		const char *name = hang.running;
		struct timespec until;

		if (!name) {
			pthread_cond_wait(&hang.cond, &hang.lock);
			continue;
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += FAKE_HANG_S;
		while (hang.running == name && !hang.stop &&
		       pthread_cond_timedwait(&hang.cond, &hang.lock, &until) != ETIMEDOUT)
			;
		if (hang.running == name && !hang.stop) {
			fprintf(stderr, "scenario %s: still running after %d s; the library's log:\n",
				name, FAKE_HANG_S);
			env_log_dump();
			_exit(1);
		}
	}
	pthread_mutex_unlock(&hang.lock);
	return NULL;
}

static void hang_mark(const char *name)
{
	pthread_mutex_lock(&hang.lock);
	hang.running = name;
	pthread_cond_signal(&hang.cond);
	pthread_mutex_unlock(&hang.lock);
}

static int run_one(const struct scenario *sc)
{
	int before = g_failures;
	struct timespec t0;
	double ms;

	env_reset();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	hang_mark(sc->name);
	sc->fn();
	CHECK_EQ(fake_settle(), 0);
	hang_mark(NULL);
	ms = ms_since(&t0);
	CHECK(fake_leftovers() == 0, "%s left objects in the fabric", sc->name);
	/*
	 * No scenario waits on time: each takes milliseconds (tens under ASan
	 * or with the CPUs busy). One that waited out a fake wait (5 s) fails
	 * here as well as where it waited. Between 1 s and that it is noted,
	 * not failed: a machine starved of CPU (both CPUs busy and the unit
	 * suite run in parallel) has stretched a scenario past 1 s.
	 */
	CHECK(ms < FAKE_WAIT_MS * 0.8, "%s took %.1f ms", sc->name, ms);
	printf("scenario %-32s %8.1f ms  %s%s\n", sc->name, ms, g_failures == before ? "ok" : "FAILED",
	       ms >= 1000 ? " (over 1 s)" : "");
	fflush(stdout);
	return g_failures == before;
}

static int fake_main(int argc, char **argv, const struct scenario *list, size_t n, const char *prog)
{
	pthread_t watch;
	int rc;

	rtrs_set_log_fn(env_log_sink, NULL);
	rtrs_set_log_level(3);
	rc = fake_init();
	if (rc) {
		fprintf(stderr, "fake_init: %s\n", strerror(-rc));
		return 1;
	}
	rc = pthread_create(&watch, NULL, hang_watch, NULL);
	if (rc) {
		fprintf(stderr, "hang watch: %s\n", strerror(rc));
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		bool want = argc < 2;

		for (int a = 1; a < argc; a++)
			want |= !strcmp(argv[a], list[i].name);
		if (want)
			run_one(&list[i]);
	}
	for (int a = 1; a < argc; a++) {
		bool known = false;

		for (size_t i = 0; i < n; i++)
			known |= !strcmp(argv[a], list[i].name);
		CHECK(known, "no scenario %s", argv[a]);
	}
	pthread_mutex_lock(&hang.lock);
	hang.stop = true;
	pthread_cond_signal(&hang.cond);
	pthread_mutex_unlock(&hang.lock);
	pthread_join(watch, NULL);
	CHECK_EQ(fake_fini(), 0);
	/* The library's log (debug level): on failure, or when FAKE_LOG is set. */
	if (g_failures || getenv("FAKE_LOG"))
		env_log_dump();
	return test_done(prog);
}

#endif
