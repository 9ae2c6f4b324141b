/* SPDX-License-Identifier: MIT */
/* Tests: the threads of this process by name (/proc/self/task/N/comm). */
#ifndef TESTS_THREADS_H
#define TESTS_THREADS_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first line of /proc/self/task/TID/NAME into buf; false if the thread ended meanwhile. */
static inline bool thread_file(const char *tid, const char *name, char *buf, size_t len)
{
	char path[96];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "/proc/self/task/%.20s/%s", tid, name);
	f = fopen(path, "r");
	if (!f)
		return false;
	ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	return ok;
}

/*
 * Calls fn(tid, comm, arg) for every thread of this process (comm: its
 * name with the newline); returns how many there are.
 */
static inline unsigned threads_each(void (*fn)(const char *tid, const char *comm, void *arg),
				    void *arg)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	unsigned n = 0;

	while (d && (de = readdir(d))) {
		char comm[32];

		if (de->d_name[0] == '.' || !thread_file(de->d_name, "comm", comm, sizeof(comm)))
			continue;
		n++;
		fn(de->d_name, comm, arg);
	}
	if (d)
		closedir(d);
	return n;
}

struct threads_scan_arg {
	const char *const *prefixes;
	unsigned *counts;
};

static inline void threads_scan_one(const char *tid, const char *comm, void *arg)
{
	struct threads_scan_arg *a = arg;

	(void)tid;
	for (unsigned i = 0; a->prefixes[i]; i++) {
		if (!strncmp(comm, a->prefixes[i], strlen(a->prefixes[i]))) {
			a->counts[i]++;
			break;
		}
	}
}

/*
 * One pass over this process's threads: counts[i] of those whose name
 * starts with prefixes[i] (the first that matches; NULL ends the list).
 * Returns how many threads there are in all.
 */
static inline unsigned threads_scan(const char *const *prefixes, unsigned *counts)
{
	struct threads_scan_arg a = { prefixes, counts };

	for (unsigned i = 0; prefixes[i]; i++)
		counts[i] = 0;
	return threads_each(threads_scan_one, &a);
}

/* Threads of this process whose name starts with prefix ("" for all). */
static inline unsigned threads_named(const char *prefix)
{
	const char *const p[] = { prefix, NULL };
	unsigned c[1];

	threads_scan(p, c);
	return c[0];
}

struct threads_syscall_arg {
	const char *prefix;
	long nr;
	unsigned n;
};

static inline void threads_syscall_one(const char *tid, const char *comm, void *arg)
{
	struct threads_syscall_arg *a = arg;
	char sc[32];

	if (strncmp(comm, a->prefix, strlen(a->prefix)) ||
	    !thread_file(tid, "syscall", sc, sizeof(sc)))
		return;
	if (sc[0] >= '0' && sc[0] <= '9' && strtol(sc, NULL, 10) == a->nr)
		a->n++;
}

/*
 * Threads whose name starts with prefix that are in system call nr now
 * (the first field of /proc/self/task/N/syscall; "running" and -1, not in
 * one, are neither). A thread blocked in the kernel shows the call it
 * blocks in.
 */
static inline unsigned threads_in_syscall(const char *prefix, long nr)
{
	struct threads_syscall_arg a = { prefix, nr, 0 };

	threads_each(threads_syscall_one, &a);
	return a.n;
}

/*
 * Threads named so once those on their way out have gone: a thread that
 * has let go of everything (detached, or just joined) may still be listed
 * while it exits; waits up to 2 s for the count to reach 0.
 */
static inline unsigned threads_left(const char *prefix)
{
	unsigned n = threads_named(prefix);

	for (int i = 0; n && i < 200; i++) {
		usleep(10000);
		n = threads_named(prefix);
	}
	return n;
}

#endif
