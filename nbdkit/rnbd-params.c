/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "opts.h"
#include "rnbd-params.h"
#include "rnbd-proto.h"
#include "util.h"

/* A key of the plugin's own; the session's keys come from clt-opts.c. */
enum param_type {
	P_SESSION_OPT, /* clt: a session option of the client front ends' table */
	P_DEVICE,      /* an RNBD device name */
	P_MODE,        /* rw, ro, migration */
	P_CONTROL,     /* the management plane's Unix socket */
	P_METRICS,     /* HOST:PORT of the Prometheus endpoint */
};

struct param {
	enum param_type type;
	enum clt_opt_id clt;        /* P_SESSION_OPT */
	const char *key, *arg;      /* the plugin's own (P_SESSION_OPT: from the table) */
	const char *help;           /* NULL: the table's */
	const char *dflt;           /* the default in words, where the table's value is not it */
};

#define SESSION_OPT(id, ...) { .type = P_SESSION_OPT, .clt = (id), __VA_ARGS__ }

/* In --help's order. */
static const struct param params[] = {
	SESSION_OPT(CLT_OPT_SERVER, .help = "a path of the session (repeat for more, at most 8); "
		    "SRC@ picks the local address"),
	SESSION_OPT(CLT_OPT_SESSION, .help = "RTRS session name, the server's %SESSNAME%"),
	{ P_DEVICE, .key = "device", .arg = "NAME", .help = "the default export (and the one listed)" },
	SESSION_OPT(CLT_OPT_PORT, .help = "port for a server= without :PORT"),
	SESSION_OPT(CLT_OPT_PROVIDER),
	{ P_MODE, .key = "mode", .arg = "rw|ro|migration", .help = "access mode" },
	{ P_CONTROL, .key = "control", .arg = "PATH",
	  .help = "serve the management plane (JSON-RPC: client.* methods, the rnbd command) on "
		  "this Unix socket" },
	{ P_METRICS, .key = "metrics", .arg = "HOST:PORT",
	  .help = "serve Prometheus metrics at http://HOST:PORT/metrics" },
	SESSION_OPT(CLT_OPT_IO_CONS),
	SESSION_OPT(CLT_OPT_POLICY),
	SESSION_OPT(CLT_OPT_HB_INTERVAL),
	SESSION_OPT(CLT_OPT_FAST_IO_FAIL, .help = "how long IO waits for a path and a reopen"),
	SESSION_OPT(CLT_OPT_RECONNECT_DELAY, .help = "delay before a failed path reconnects"),
	SESSION_OPT(CLT_OPT_LOSS_TIMEOUT),
	SESSION_OPT(CLT_OPT_MAX_RECONNECTS),
	SESSION_OPT(CLT_OPT_RECONNECT_JITTER, .help = "add a random 0..MS to each reconnect delay",
		    .dflt = "half the reconnect delay"),
	SESSION_OPT(CLT_OPT_BUSY_POLL),
	SESSION_OPT(CLT_OPT_POLL_GROUPS),
	SESSION_OPT(CLT_OPT_SECRET),
	SESSION_OPT(CLT_OPT_CTRL_SECRET),
	SESSION_OPT(CLT_OPT_HOST_NAME),
	SESSION_OPT(CLT_OPT_SERVER_NAME),
	SESSION_OPT(CLT_OPT_TLS),
	SESSION_OPT(CLT_OPT_TLS_KEY),
	SESSION_OPT(CLT_OPT_LOG_LEVEL, .help = "librnbd's lines (info and debug as nbdkit debug, "
		    "-v)", .dflt = "RTRS_LOG_LEVEL, else info"),
};

_Static_assert(ARRAY_SIZE(params) <= 32, "set has a bit per key");

static const char *const mode_names[] = { "ro", "rw", "migration" };
static const unsigned mode_values[] = { RNBD_CLT_RO, RNBD_CLT_RW, RNBD_CLT_MIGRATION };

static const char *param_key(const struct param *p)
{
	return p->type == P_SESSION_OPT ? clt_opt_key(p->clt) : p->key;
}

void rnbd_plugin_cfg_init(struct rnbd_plugin_cfg *c)
{
	memset(c, 0, sizeof(*c));
	clt_cfg_init(&c->clt, RNBD_PLUGIN_MAX_PATHS);
	c->clt.opts.sessname = "nbdkit-rnbd";
	c->mode = RNBD_CLT_RW;
}

static int set_value(struct rnbd_plugin_cfg *c, const struct param *p, const char *value,
		     char *err, size_t errlen)
{
	const char *why = NULL;
	char reason[300];
	int rc;

	switch (p->type) {
	case P_SESSION_OPT:
		rc = clt_opt_set(&c->clt, p->clt, value, reason, sizeof(reason));
		if (!rc)
			return 0;
		/* A secret is never echoed. */
		if (clt_opt_secret(p->clt))
			return opts_errorf(err, errlen, rc, "%s=: %s", param_key(p), reason);
		return opts_errorf(err, errlen, rc, "%s=%s: %s", param_key(p), value, reason);
	case P_DEVICE:
		if (!rnbd_dev_name_valid(value, &why))
			return opts_errorf(err, errlen, -EINVAL, "%s=%s: %s", p->key, value,
					   why ? why : "not a device name");
		c->device = value;
		return 0;
	case P_MODE:
		for (unsigned i = 0; i < ARRAY_SIZE(mode_names); i++) {
			if (!strcmp(value, mode_names[i])) {
				c->mode = mode_values[i];
				return 0;
			}
		}
		return opts_errorf(err, errlen, -EINVAL, "%s=%s: expected rw, ro or migration", p->key,
				   value);
	case P_CONTROL:
		/* sockaddr_un's sun_path: 108 bytes with the NUL. */
		if (strlen(value) > 107)
			return opts_errorf(err, errlen, -EINVAL, "%s=: a socket path of at most 107 "
					   "bytes", p->key);
		c->control = value;
		return 0;
	case P_METRICS:
		/* Checked when the endpoint starts (get_ready): a numeric address and a port. */
		if (strlen(value) > 80 || !strchr(value, ':'))
			return opts_errorf(err, errlen, -EINVAL, "%s=%s: expected HOST:PORT", p->key,
					   value);
		c->metrics = value;
		return 0;
	}
	return opts_errorf(err, errlen, -EINVAL, "%s: bad parameter table", p->key);
}

int rnbd_plugin_cfg_set(struct rnbd_plugin_cfg *c, const char *key, const char *value,
			char *err, size_t errlen)
{
	for (unsigned i = 0; i < ARRAY_SIZE(params); i++) {
		const struct param *p = &params[i];
		bool repeat = p->type == P_SESSION_OPT && p->clt == CLT_OPT_SERVER;
		int rc;

		if (strcmp(key, param_key(p)))
			continue;
		if (!repeat && (c->set & (1u << i)))
			return opts_errorf(err, errlen, -EINVAL, "%s= given twice", key);
		if (!*value)
			return opts_errorf(err, errlen, -EINVAL, "%s= needs a value", key);
		rc = set_value(c, p, value, err, errlen);
		if (!rc)
			c->set |= 1u << i;
		return rc;
	}
	return opts_errorf(err, errlen, -EINVAL, "unknown parameter %s (see --help)", key);
}

int rnbd_plugin_cfg_complete(struct rnbd_plugin_cfg *c, char *err, size_t errlen)
{
	if (!c->clt.opts.paths_num)
		return opts_errorf(err, errlen, -EINVAL, "server=[SRC@]HOST[:PORT] is required");
	clt_cfg_finish(&c->clt);
	return 0;
}

/* Parameter i's "key=", argument, help and default (dflt, len bytes; "" for none). */
static void param_doc(unsigned i, const struct rnbd_plugin_cfg *d, const char **key,
		      const char **arg, const char **help, char *dflt, size_t len)
{
	const struct param *p = &params[i];
	bool opt = p->type == P_SESSION_OPT;

	*key = param_key(p);
	*arg = opt ? clt_opt_arg(p->clt) : p->arg;
	*help = p->help ? p->help : clt_opt_help(p->clt);
	dflt[0] = 0;
	if (p->dflt)
		snprintf(dflt, len, "%s", p->dflt);
	else if (opt)
		clt_opt_show(&d->clt, p->clt, dflt, len);
	for (unsigned m = 0; p->type == P_MODE && m < ARRAY_SIZE(mode_values); m++)
		if (mode_values[m] == d->mode)
			snprintf(dflt, len, "%s", mode_names[m]);
}

const char *rnbd_plugin_cfg_help(void)
{
	static char help[4096];
	static struct rnbd_plugin_cfg dflt;

	if (!help[0]) {
		size_t used = 0;

		rnbd_plugin_cfg_init(&dflt);
		for (unsigned i = 0; i < ARRAY_SIZE(params) && used < sizeof(help); i++) {
			const char *key, *arg, *text;
			char lhs[64], val[256];

			param_doc(i, &dflt, &key, &arg, &text, val, sizeof(val));
			snprintf(lhs, sizeof(lhs), "%s=%s", key, arg);
			used += (size_t)snprintf(help + used, sizeof(help) - used, "%s%-36s %s%s%s%s",
						 i ? "\n" : "", lhs, text, val[0] ? " (default " : "",
						 val, val[0] ? ")" : "");
		}
	}
	return help;
}

int rnbd_plugin_cfg_man(FILE *f)
{
	struct rnbd_plugin_cfg dflt;

	rnbd_plugin_cfg_init(&dflt);
	for (unsigned i = 0; i < ARRAY_SIZE(params); i++) {
		const char *key, *arg, *text;
		char term[64], val[256];

		param_doc(i, &dflt, &key, &arg, &text, val, sizeof(val));
		snprintf(term, sizeof(term), "%s=", key);
		if (opts_man_item(f, term, arg, text, val))
			return -EINVAL;
	}
	return 0;
}
