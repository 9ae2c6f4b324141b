/* SPDX-License-Identifier: MIT */
/* Tests: the threads of this process by name (/proc/self/task/N/comm). */
#ifndef TESTS_THREADS_H
#define TESTS_THREADS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * One pass over this process's threads: counts[i] of those whose name
 * starts with prefixes[i] (the first that matches; NULL ends the list).
 * Returns how many threads there are in all.
 */
static inline unsigned threads_scan(const char *const *prefixes, unsigned *counts)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	unsigned n = 0;

	for (unsigned i = 0; prefixes[i]; i++)
		counts[i] = 0;
	while (d && (de = readdir(d))) {
		char path[64], comm[32] = "";
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* it ended meanwhile */
		if (fgets(comm, sizeof(comm), f)) {
			n++;
			for (unsigned i = 0; prefixes[i]; i++) {
				if (!strncmp(comm, prefixes[i], strlen(prefixes[i]))) {
					counts[i]++;
					break;
				}
			}
		}
		fclose(f);
	}
	if (d)
		closedir(d);
	return n;
}

/* Threads of this process whose name starts with prefix ("" for all). */
static inline unsigned threads_named(const char *prefix)
{
	const char *const p[] = { prefix, NULL };
	unsigned c[1];

	threads_scan(p, c);
	return c[0];
}

/*
 * Threads whose name starts with prefix that are in system call nr now
 * (the first field of /proc/self/task/N/syscall; "running" and -1, not in
 * one, are neither). A thread blocked in the kernel shows the call it
 * blocks in.
 */
static inline unsigned threads_in_syscall(const char *prefix, long nr)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	unsigned n = 0;

	while (d && (de = readdir(d))) {
		char path[64], comm[32] = "", sc[32] = "";
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(comm, sizeof(comm), f) || strncmp(comm, prefix, strlen(prefix))) {
			fclose(f);
			continue;
		}
		fclose(f);
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/syscall", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fscanf(f, "%31s", sc) == 1 && sc[0] >= '0' && sc[0] <= '9' &&
		    strtol(sc, NULL, 10) == nr)
			n++;
		fclose(f);
	}
	if (d)
		closedir(d);
	return n;
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
