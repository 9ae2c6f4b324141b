/* SPDX-License-Identifier: MIT */
/*
 * The nbdkit plugin's parameters (key=value on nbdkit's command line): the
 * session options from the client front ends' table (lib/front/clt-opts.c,
 * the same names, checks and refusals as rnbd-client's --options), and the
 * plugin's own, device=, mode=, control= and metrics=; one list drives parsing, checking and
 * the help text. Pure: no nbdkit, no network (the fuzzer calls it on its
 * own).
 */
#ifndef RNBD_PLUGIN_PARAMS_H
#define RNBD_PLUGIN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "clt-opts.h"
#include "rnbd.h"

#define RNBD_PLUGIN_MAX_PATHS 8
#define RNBD_PLUGIN_SRC_MAX RTRS_ADDR_HOST_MAX

struct rnbd_plugin_cfg {
	/*
	 * The session: server= (clt.opts.paths, at most 8), session, port,
	 * provider, io_connections, policy, hb_interval_ms, fast_io_fail_ms,
	 * the reconnect parameters, busy_poll_us, the DH-HMAC-CHAP keys, and
	 * log_level
	 * (clt.log_level, -1: not given: RTRS_LOG_LEVEL, else info).
	 */
	struct clt_cfg clt;
	const char *device;
	unsigned mode;              /* enum rnbd_clt_mode */
	const char *control;        /* control=: the management socket, or NULL */
	const char *metrics;        /* metrics=: HOST:PORT of the Prometheus endpoint, or NULL */
	unsigned set;               /* bit i: params[i] was given (repeats are refused) */
};

/* The defaults: session nbdkit-rnbd, port 1234, provider tcp, mode rw, ... */
void rnbd_plugin_cfg_init(struct rnbd_plugin_cfg *c);

/*
 * One key=value. Values are kept by pointer (nbdkit keeps them for the
 * plugin's life). Returns 0, or -EINVAL (-E2BIG for a ninth server) with
 * err (errlen bytes, always terminated) naming the key and the cause.
 */
int rnbd_plugin_cfg_set(struct rnbd_plugin_cfg *c, const char *key, const char *value,
			char *err, size_t errlen);

/* After the last key: what must be there is (server=). 0 or -EINVAL with err. */
int rnbd_plugin_cfg_complete(struct rnbd_plugin_cfg *c, char *err, size_t errlen);

/* "key=VALUE  help" lines for nbdkit's --help, from the list and its defaults. */
const char *rnbd_plugin_cfg_help(void);
/* The same list as scdoc(5) items, for nbdkit-rnbd-plugin(1) (docs/man/); 0 or -EINVAL (opts_man_item). */
int rnbd_plugin_cfg_man(FILE *f);

#endif
