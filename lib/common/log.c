/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

int g_log_level = LOG_WARN;

static _Atomic(log_sink_fn) g_sink;
static void *g_sink_priv;

void log_set_sink(log_sink_fn fn, void *priv)
{
	g_sink_priv = priv;
	atomic_store(&g_sink, fn);
}

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	int saved = errno;
	char line[1024];
	va_list ap;
	int n;

	n = snprintf(line, sizeof(line), "rtrs %s: ", level_names[lvl]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	log_sink_fn sink = atomic_load(&g_sink);

	if (sink)
		sink(g_sink_priv, (int)lvl, line);
	else
		/* One write per line so lines from several threads do not interleave. */
		fprintf(stderr, "%s\n", line);
	errno = saved;
}

static __thread char t_detail[512];

void err_detail(const char *fmt, ...)
{
	int saved = errno;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(t_detail, sizeof(t_detail), fmt, ap);
	va_end(ap);
	errno = saved;
}

void err_detail_clear(void)
{
	t_detail[0] = '\0';
}

const char *err_detail_get(void)
{
	return t_detail;
}

int log_ratelimit_ok(struct log_ratelimit *rl)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	uint64_t now = now_ms();
	int ok;

	pthread_mutex_lock(&lock);
	if (now - rl->window_start_ms >= 5000) {
		if (rl->suppressed)
			log_msg(LOG_WARN, "%u log lines suppressed by the rate limit",
				rl->suppressed);
		rl->window_start_ms = now;
		rl->printed = 0;
		rl->suppressed = 0;
	}
	ok = rl->printed < 10;
	if (ok)
		rl->printed++;
	else
		rl->suppressed++;
	pthread_mutex_unlock(&lock);
	return ok;
}
