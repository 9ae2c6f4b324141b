/* SPDX-License-Identifier: MIT */
/* A daemon's log (dlog.h). syslog.h's LOG_* names stay in this file. */
#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
#include <time.h>

#include "dlog.h"

static struct {
	const char *prog;
	int level;
	bool syslog;
} d = { .prog = "rnbd", .level = DLOG_INFO };

void dlog_init(const char *prog, int level, bool use_syslog)
{
	d.prog = prog;
	d.level = level;
	d.syslog = use_syslog;
	if (use_syslog)
		openlog(prog, LOG_PID, LOG_DAEMON);
}

void dlog_sink(void *priv, int level, const char *line)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	struct timespec ts;
	struct tm tm;
	char when[32], safe[4096];
	size_t o = 0;

	(void)priv;
	/*
	 * One line each: a control character in a name (a newline through a
	 * JSON request's "\n") is shown as \xNN, never starts a line of its
	 * own that would pass for the program's.
	 */
	for (const unsigned char *p = (const unsigned char *)line; *p && o + 5 < sizeof(safe); p++) {
		if (*p < 0x20 || *p == 0x7f)
			o += (size_t)snprintf(safe + o, sizeof(safe) - o, "\\x%02x", *p);
		else
			safe[o++] = (char)*p;
	}
	safe[o] = '\0';
	line = safe;
	if (d.syslog) {
		/* The journal stamps the time itself. */
		syslog(prio[level < DLOG_ERR ? DLOG_ERR : level > DLOG_DBG ? DLOG_DBG : level], "%s",
		       line);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	/* One write per line, so lines from several threads do not interleave. */
	fprintf(stderr, "%s.%03ld %s\n", when, ts.tv_nsec / 1000000, line);
}

void dlog(int level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	char line[1024];
	va_list ap;
	int n;

	if (level > d.level || level < DLOG_ERR)
		return;
	n = snprintf(line, sizeof(line), "%s %s: ", d.prog, names[level]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	dlog_sink(NULL, level, line);
}
