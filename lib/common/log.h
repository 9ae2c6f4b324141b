/* SPDX-License-Identifier: MIT */
/*
 * Logging: levels, an object-name prefix on every line, and a rate limit for
 * the data path. The level is warn until rtrs_set_log_level() says otherwise
 * (the library reads no environment: programs take RTRS_LOG_LEVEL through
 * opts_log_level()); rtrs_set_log_fn() redirects lines. Loggers preserve
 * errno.
 */
#ifndef RTRS_COMMON_LOG_H
#define RTRS_COMMON_LOG_H

#include <stdint.h>

#include "export.h"

enum log_level { LOG_ERR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DBG = 3 };

/* The state lives in librtrs.so, once per process (export.h). */
COMMON_EXPORT_VIS extern int g_log_level COMMON_LINK_NAME(log_level);

/* Where lines go: stderr unless a sink is installed (rtrs_set_log_fn). */
typedef void (*log_sink_fn)(void *priv, int level, const char *line);
COMMON_EXPORT_VIS void log_set_sink(log_sink_fn fn, void *priv) COMMON_LINK_NAME(log_set_sink);

COMMON_EXPORT_VIS void log_msg(enum log_level lvl, const char *fmt, ...)
	COMMON_LINK_NAME(log_msg) __attribute__((format(printf, 2, 3)));

/* Per call site: allow a burst of 10 lines per 5 s, then count suppressions. */
struct log_ratelimit {
	uint64_t window_start_ms;
	unsigned printed;
	unsigned suppressed;
};
COMMON_EXPORT_VIS int log_ratelimit_ok(struct log_ratelimit *rl) COMMON_LINK_NAME(log_ratelimit_ok);

#define log_at(lvl, ...)                                 \
	do {                                             \
		if ((int)(lvl) <= g_log_level)           \
			log_msg((lvl), __VA_ARGS__);     \
	} while (0)

#define log_err(...) log_at(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_INFO, __VA_ARGS__)
#define log_dbg(...) log_at(LOG_DBG, __VA_ARGS__)

#define log_rl(lvl, ...)                                                 \
	do {                                                             \
		static struct log_ratelimit rl_;                         \
		if ((int)(lvl) <= g_log_level && log_ratelimit_ok(&rl_)) \
			log_msg((lvl), __VA_ARGS__);                     \
	} while (0)

/*
 * Why the call failing on this thread failed, where its errno alone does
 * not say (a host name that does not resolve, a key file that cannot be
 * read): the last err_detail() before it returns; rtrs_last_error() hands
 * it to the caller. err_detail_clear() at the start of such a call.
 */
COMMON_EXPORT_VIS void err_detail(const char *fmt, ...)
	COMMON_LINK_NAME(err_detail) __attribute__((format(printf, 1, 2)));
COMMON_EXPORT_VIS void err_detail_clear(void) COMMON_LINK_NAME(err_detail_clear);
COMMON_EXPORT_VIS const char *err_detail_get(void) COMMON_LINK_NAME(err_detail_get);

#define log_err_rl(...) log_rl(LOG_ERR, __VA_ARGS__)
#define log_warn_rl(...) log_rl(LOG_WARN, __VA_ARGS__)

#endif
