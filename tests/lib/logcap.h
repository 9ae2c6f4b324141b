/* SPDX-License-Identifier: MIT */
/*
 * Log capture for tests: rtrs_set_log_fn(log_sink, NULL) sends the
 * library's log lines into one growing buffer that checks can search (for
 * the reason of a refusal, or that no secret was ever logged). Safe from
 * library threads; log_text() and log_since() are for when they are quiet.
 */
#ifndef RTRS_TEST_LOGCAP_H
#define RTRS_TEST_LOGCAP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char *log_buf;           /* NUL-terminated; NULL before the first line */
static size_t log_len, log_cap;
static unsigned log_lines;

static inline void log_sink(void *priv, int level, const char *line)
{
	size_t n = strlen(line);

	(void)priv;
	(void)level;
	pthread_mutex_lock(&log_lock);
	if (log_len + n + 2 > log_cap) {
		size_t cap = (log_cap ? log_cap * 2 : 65536) + n + 2;
		char *p = realloc(log_buf, cap);

		if (!p)
			abort();
		log_buf = p;
		log_cap = cap;
	}
	memcpy(log_buf + log_len, line, n);
	log_len += n;
	log_buf[log_len++] = '\n';
	log_buf[log_len] = '\0';
	log_lines++;
	pthread_mutex_unlock(&log_lock);
}

static inline const char *log_text(void)
{
	return log_buf ? log_buf : "";
}

/* Writes everything logged so far to f; safe while the library logs. */
static inline void log_dump_to(FILE *f)
{
	pthread_mutex_lock(&log_lock);
	fputs(log_buf ? log_buf : "", f);
	fflush(f);
	pthread_mutex_unlock(&log_lock);
}

/* A mark for log_since: how much has been logged so far. */
static inline size_t log_mark(void)
{
	size_t n;

	pthread_mutex_lock(&log_lock);
	n = log_len;
	pthread_mutex_unlock(&log_lock);
	return n;
}

/* Whether s was logged since a mark; safe while the library logs. */
static inline bool log_has_since(size_t mark, const char *s)
{
	bool found;

	pthread_mutex_lock(&log_lock);
	found = log_buf && mark <= log_len && strstr(log_buf + mark, s) != NULL;
	pthread_mutex_unlock(&log_lock);
	return found;
}

/* How many times s was logged since a mark; safe while the library logs. */
static inline unsigned log_count_since(size_t mark, const char *s)
{
	unsigned n = 0;

	pthread_mutex_lock(&log_lock);
	if (log_buf && mark <= log_len)
		for (const char *l = log_buf + mark; (l = strstr(l, s)); l++)
			n++;
	pthread_mutex_unlock(&log_lock);
	return n;
}

/* What was logged since a mark (log_mark() at some point). */
static inline const char *log_since(size_t mark)
{
	return log_buf && mark <= log_len ? log_buf + mark : "";
}

static inline bool log_has(const char *s)
{
	bool found;

	pthread_mutex_lock(&log_lock);
	found = log_buf && strstr(log_buf, s) != NULL;
	pthread_mutex_unlock(&log_lock);
	return found;
}

static inline void log_clear(void)
{
	pthread_mutex_lock(&log_lock);
	log_len = 0;
	if (log_buf)
		log_buf[0] = '\0';
	pthread_mutex_unlock(&log_lock);
}

/* Waits up to ms for a line containing s. */
static inline bool log_wait_for(const char *s, unsigned ms)
{
	struct timespec t;
	long long end;

	clock_gettime(CLOCK_MONOTONIC, &t);
	end = t.tv_sec * 1000LL + t.tv_nsec / 1000000 + ms;
	for (;;) {
		if (log_has(s))
			return true;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec * 1000LL + t.tv_nsec / 1000000 >= end)
			return false;
		usleep(1000);
	}
}

static inline void log_free(void)
{
	free(log_buf);
	log_buf = NULL;
	log_len = log_cap = 0;
}

#endif
