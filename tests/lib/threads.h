/* SPDX-License-Identifier: MIT */
/* Tests: the threads of this process by name (/proc/self/task/N/comm). */
#ifndef TESTS_THREADS_H
#define TESTS_THREADS_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Threads of this process whose name starts with prefix ("" for all). */
static inline unsigned threads_named(const char *prefix)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	unsigned n = 0;

	while (d && (de = readdir(d))) {
		char path[64], comm[32] = "";
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* it ended meanwhile */
		if (fgets(comm, sizeof(comm), f))
			n += !strncmp(comm, prefix, strlen(prefix));
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
