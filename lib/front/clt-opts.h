/* SPDX-License-Identifier: MIT */
/*
 * The session options of the client front ends (rtrs-perf, rnbd-client,
 * the rnbd command's client map and rnbd-clientd, the nbdkit plugin), in
 * one table: each option's one name, on a command line (--NAME) and as a
 * key (KEY=VALUE: the plugin's, and client.map's "options"), the same but
 * for '-' and '_' and with its unit in it (fast_io_fail_ms,
 * --fast-io-fail-ms); its type, bounds, check, help text, default, and the
 * field of struct rtrs_clt_opts it sets. The front ends differ only in
 * what they pick from it, a short letter, and help text that says more;
 * the checks, the refusals and the defaults are the same everywhere.
 * Pure: no network, no library state (the fuzzer builds it).
 */
#ifndef RTRS_FRONT_CLT_OPTS_H
#define RTRS_FRONT_CLT_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#include "opts.h"
#include "rtrs.h"

/* Paths a front end may take at most; each front end sets its own limit up to it. */
#define CLT_MAX_PATHS 16

/*
 * The front ends' defaults where they are not librtrs's: IO waits 30 s for
 * a path, a failed path reconnects after 1 s plus up to half that.
 */
#define CLT_FAST_IO_FAIL_MS 30000
#define CLT_RECONNECT_DELAY_MS 1000

enum clt_opt_id {
	CLT_OPT_SERVER,          /* [SRC@]HOST[:PORT], repeatable: opts.paths */
	CLT_OPT_PORT,            /* opts.port, for a path without :PORT */
	CLT_OPT_SESSION,         /* opts.sessname */
	CLT_OPT_PROVIDER,        /* opts.provider */
	CLT_OPT_IO_CONS,         /* opts.nr_io_cons */
	CLT_OPT_POLICY,          /* opts.mp_policy */
	CLT_OPT_HB_INTERVAL,     /* opts.hb_interval_ms */
	CLT_OPT_FAST_IO_FAIL,    /* opts.fast_io_fail_ms */
	CLT_OPT_RECONNECT_DELAY, /* opts.reconnect_delay_ms */
	CLT_OPT_BUSY_POLL,       /* opts.busy_poll_us */
	CLT_OPT_SECRET,          /* opts.auth_secret */
	CLT_OPT_CTRL_SECRET,     /* opts.auth_ctrl_secret */
	CLT_OPT_HOST_NAME,       /* opts.auth_host_name */
	CLT_OPT_SERVER_NAME,     /* opts.auth_server_name */
	CLT_OPT_LOG_LEVEL,       /* log_level below (librtrs and librnbd log through one state) */
	CLT_OPT_LOSS_TIMEOUT,    /* opts.reconnect_loss_timeout_ms */
	CLT_OPT_MAX_RECONNECTS,  /* opts.max_reconnect_attempts */
	CLT_OPT_RECONNECT_JITTER, /* opts.reconnect_jitter_ms */
	CLT_OPT_POLL_GROUPS,     /* opts.poll_groups */
	CLT_OPT_TLS,             /* opts.tls: off or required */
	CLT_OPT_TLS_KEY,         /* opts.tls_key */
	CLT_OPT_NR
};

/*
 * What the options fill. opts.paths points at paths (and those at addrs),
 * so a clt_cfg is not copied; a copy of opts keeps pointing into it.
 * Strings are kept by pointer: values must live as long as the cfg (argv,
 * nbdkit's strings, config files kept by opts.c).
 */
struct clt_cfg {
	struct rtrs_clt_opts opts;
	struct rtrs_addr addrs[CLT_MAX_PATHS];
	struct rtrs_path_addr paths[CLT_MAX_PATHS];
	unsigned max_paths;     /* this front end's limit, 1 .. CLT_MAX_PATHS */
	int log_level;          /* 0 error .. 3 debug; -1 not given */
	bool jitter_given;      /* reconnect_jitter_ms was set */
};

/*
 * The front ends' defaults (librtrs's, with CLT_FAST_IO_FAIL_MS and
 * CLT_RECONNECT_DELAY_MS), no path yet, log level not given.
 */
void clt_cfg_init(struct clt_cfg *c, unsigned max_paths);
/* After the options: the reconnect jitter is half the delay, unless given. */
void clt_cfg_finish(struct clt_cfg *c);

/*
 * Sets option id from text value (not empty): checked, then stored in c.
 * Returns 0, or -EINVAL (-E2BIG for a path past max_paths) with why in err
 * (errlen bytes, always terminated). The reason does not repeat the value:
 * the caller prints it with the option's name and, unless
 * clt_opt_secret(id), the value ("--port 0: expected a number in
 * 1..65535", "port=0: ...").
 */
int clt_opt_set(struct clt_cfg *c, enum clt_opt_id id, const char *value, char *err,
		size_t errlen);

/* The option's nbdkit key, its command-line name, argument and help text. */
const char *clt_opt_key(enum clt_opt_id id);
const char *clt_opt_name(enum clt_opt_id id);
const char *clt_opt_arg(enum clt_opt_id id);
const char *clt_opt_help(enum clt_opt_id id);
/* Its value must never be printed (the DH-HMAC-CHAP secrets). */
bool clt_opt_secret(enum clt_opt_id id);
/* The option whose nbdkit key is key, or -1. */
int clt_opt_by_key(const char *key);
/* Its value in c as --help shows a default ("" for none: paths, secrets, unset). */
void clt_opt_show(const struct clt_cfg *c, enum clt_opt_id id, char *buf, size_t len);

/*
 * Whether a and b (each after clt_cfg_finish) set up the same session,
 * however their values were written (a port given or the default, 7 or
 * "7", a default given or left out): clt_cfg_same_paths, the same paths
 * in order (source, host, port); clt_cfg_same_opts, every other option but
 * the session's name, the port (a default for paths), the log level and
 * poll_groups (the process's).
 */
bool clt_cfg_same_paths(const struct clt_cfg *a, const struct clt_cfg *b);
bool clt_cfg_same_opts(const struct clt_cfg *a, const struct clt_cfg *b);
/* Whether a and b name one server address at least (host and port; any source). */
bool clt_cfg_share_path(const struct clt_cfg *a, const struct clt_cfg *b);

/* A command-line option from the table: a short letter, more help. */
struct clt_opt_pick {
	enum clt_opt_id id;
	char short_name;        /* 0: none */
	const char *help;       /* NULL: the table's */
};

/*
 * Whether argv (up to "--") gives a name the front ends no longer have:
 * -EINVAL after printing "PROG: --OLD is now --NEW" (rnbd: the rnbd
 * command, whose --reconnect-delay and --reconnect-jitter took seconds);
 * else 0.
 */
int clt_opts_renamed(const char *prog, int argc, char **argv, bool rnbd);

/*
 * A front end's command-line table (lib/common/opts.h): the session
 * options picks names, filling c, then the front end's own options (own,
 * ending with a zeroed entry). Allocated; NULL when out of memory. The
 * caller frees it when it no longer parses (opts.c keeps no pointer).
 */
struct opt *clt_opts_table(struct clt_cfg *c, const struct clt_opt_pick *picks, size_t npicks,
			   const struct opt *own);

#endif
