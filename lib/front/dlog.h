/* SPDX-License-Identifier: MIT */
/*
 * A daemon's log (rnbd-server, rnbd-clientd): every line with its time,
 * level and object, on stderr; or to syslog (the journal, under systemd)
 * with the level as the priority. The libraries' lines come here through
 * dlog_sink (rnbd_set_log_fn), the daemon's own through dlog(); both
 * honour one level. Levels are the libraries' (log.h: 0 error .. 3 debug).
 */
#ifndef RTRS_FRONT_DLOG_H
#define RTRS_FRONT_DLOG_H

#include <stdbool.h>

enum { DLOG_ERR, DLOG_WARN, DLOG_INFO, DLOG_DBG };

/* prog names the daemon's own lines ("rnbd-server info: ..."); to syslog when use_syslog. */
void dlog_init(const char *prog, int level, bool use_syslog);
/* A line of the libraries' (their sink): timestamped, or to syslog. */
void dlog_sink(void *priv, int level, const char *line);
/* A line of the daemon's own, if level is within the one set. */
void dlog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
