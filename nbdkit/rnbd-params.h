/* SPDX-License-Identifier: MIT */
/*
 * The nbdkit plugin's parameters (key=value on nbdkit's command line),
 * from one table that drives parsing, checking and the help text. Pure:
 * no nbdkit, no network (the fuzzer calls it on its own).
 */
#ifndef RNBD_PLUGIN_PARAMS_H
#define RNBD_PLUGIN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "rnbd.h"

#define RNBD_PLUGIN_MAX_PATHS 8
#define RNBD_PLUGIN_SRC_MAX 255

struct rnbd_plugin_cfg {
	struct rtrs_path_addr paths[RNBD_PLUGIN_MAX_PATHS]; /* dst points at the value */
	char srcs[RNBD_PLUGIN_MAX_PATHS][RNBD_PLUGIN_SRC_MAX + 1];
	unsigned npaths;
	const char *session, *device, *provider;
	const char *secret, *ctrl_secret, *host_name, *server_name;
	int log_level;              /* 0..3, or -1: not given (RTRS_LOG_LEVEL, else info) */
	unsigned mode;              /* enum rnbd_clt_mode */
	unsigned port, io_cons, fast_io_fail_ms, reconnect_delay_ms;
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
int rnbd_plugin_cfg_complete(const struct rnbd_plugin_cfg *c, char *err, size_t errlen);

/* "key=VALUE  help" lines for nbdkit's --help, from the table. */
const char *rnbd_plugin_cfg_help(void);

#endif
