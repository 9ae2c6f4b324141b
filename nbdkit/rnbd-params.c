/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "opts.h"
#include "rnbd-params.h"
#include "rnbd-proto.h"
#include "rtrs-proto.h"
#include "util.h"

enum param_type {
	P_PATH,      /* server=: appended to paths */
	P_SESSION,   /* an RTRS session name */
	P_DEVICE,    /* an RNBD device name */
	P_WORD,      /* printable, no blanks */
	P_SECRET,    /* DHHC-1:..., @FILE or file:FILE (librtrs reads and checks it) */
	P_AUTH_NAME, /* a DH-HMAC-CHAP name */
	P_UINT,      /* decimal in [min, max] */
	P_MODE,      /* rw, ro, migration */
	P_LOG_LEVEL, /* error, warn, info, debug */
};

struct param {
	const char *key;
	enum param_type type;
	size_t off;                 /* of the field in struct rnbd_plugin_cfg */
	unsigned min, max;          /* P_UINT */
	const char *arg, *help;
};

#define F(field) offsetof(struct rnbd_plugin_cfg, field)

static const struct param params[] = {
	{ "server", P_PATH, 0, 0, 0, "[SRC@]HOST[:PORT]",
	  "a path of the session (repeat for more, at most 8); SRC@ picks the local address" },
	{ "session", P_SESSION, F(session), 0, 0, "NAME",
	  "RTRS session name, the server's %SESSNAME% (default nbdkit-rnbd)" },
	{ "device", P_DEVICE, F(device), 0, 0, "NAME", "the default export (and the one listed)" },
	{ "port", P_UINT, F(port), 1, 65535, "N", "port for a server= without :PORT (default 1234)" },
	{ "provider", P_WORD, F(provider), 0, 0, "NAME", "libfabric provider (default tcp)" },
	{ "mode", P_MODE, F(mode), 0, 0, "rw|ro|migration", "access mode (default rw)" },
	{ "io_connections", P_UINT, F(io_cons), 0, 1024, "N",
	  "IO connections per path (default 0: one per CPU)" },
	{ "fast_io_fail_ms", P_UINT, F(fast_io_fail_ms), 0, 3600000, "MS",
	  "how long IO waits for a path and a reopen (default 30000)" },
	{ "reconnect_delay_ms", P_UINT, F(reconnect_delay_ms), 0, 3600000, "MS",
	  "delay before a failed path reconnects; jitter is half of it (default 500)" },
	{ "secret", P_SECRET, F(secret), 0, 0, "DHHC-1:...|@FILE",
	  "this host's DH-HMAC-CHAP secret" },
	{ "ctrl_secret", P_SECRET, F(ctrl_secret), 0, 0, "DHHC-1:...|@FILE",
	  "authenticate the server too, with this secret" },
	{ "host_name", P_AUTH_NAME, F(host_name), 0, 0, "NQN",
	  "host name for authentication (default /etc/nvme/hostnqn)" },
	{ "server_name", P_AUTH_NAME, F(server_name), 0, 0, "NAME",
	  "the server's name for authentication" },
	{ "log_level", P_LOG_LEVEL, F(log_level), 0, 0, "error|warn|info|debug",
	  "librnbd's lines (info and debug as nbdkit debug, -v) (default: RTRS_LOG_LEVEL, else info)" },
};

static const char *const mode_names[] = { "ro", "rw", "migration" };
static const unsigned mode_values[] = { RNBD_CLT_RO, RNBD_CLT_RW, RNBD_CLT_MIGRATION };

__attribute__((format(printf, 3, 4)))
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

void rnbd_plugin_cfg_init(struct rnbd_plugin_cfg *c)
{
	memset(c, 0, sizeof(*c));
	c->session = "nbdkit-rnbd";
	c->provider = "tcp";
	c->mode = RNBD_CLT_RW;
	c->port = RNBD_DEFAULT_PORT_NR;
	c->fast_io_fail_ms = 30000;
	c->reconnect_delay_ms = 500;
	c->log_level = -1;
}

/* Printable ASCII, no blank: what addresses, providers and ports are made of. */
static bool word_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
			return false;
	return n > 0;
}

/* HOST[:PORT] or [HOST][:PORT], as librtrs splits it. */
static int check_hostport(const char *key, const char *value, const char *d, char *err,
			  size_t errlen)
{
	const char *colon = NULL;
	size_t hl;
	uint64_t port;

	if (*d == '[') {
		const char *end = strchr(d, ']');

		if (!end)
			return fail(err, errlen, "%s=%s: no ']' after '['", key, value);
		hl = (size_t)(end - d - 1);
		if (end[1] == ':')
			colon = end + 1;
		else if (end[1])
			return fail(err, errlen, "%s=%s: text after ']'", key, value);
	} else {
		colon = strrchr(d, ':');
		/* More than one colon without brackets: a bare IPv6 address. */
		if (colon && strchr(d, ':') != colon)
			colon = NULL;
		hl = colon ? (size_t)(colon - d) : strlen(d);
	}
	if (!hl)
		return fail(err, errlen, "%s=%s: no host", key, value);
	if (hl > 255)
		return fail(err, errlen, "%s=%s: host longer than 255 bytes", key, value);
	if (colon && parse_u64(colon + 1, 1, 65535, &port))
		return fail(err, errlen, "%s=%s: port '%s' is not a number in 1..65535", key, value,
			    colon + 1);
	return 0;
}

static int set_path(struct rnbd_plugin_cfg *c, const char *key, const char *value, char *err,
		    size_t errlen)
{
	const char *at = strchr(value, '@'), *dst = at ? at + 1 : value;
	unsigned i = c->npaths;
	int rc;

	if (i == RNBD_PLUGIN_MAX_PATHS) {
		fail(err, errlen, "%s=%s: at most %d paths", key, value, RNBD_PLUGIN_MAX_PATHS);
		return -E2BIG;
	}
	if (!word_ok(value, strlen(value)))
		return fail(err, errlen, "%s=%s: expected [SRC@]HOST[:PORT], printable and without "
			    "blanks", key, value);
	if (at && strchr(dst, '@'))
		return fail(err, errlen, "%s=%s: more than one '@'", key, value);
	if (at && at == value)
		return fail(err, errlen, "%s=%s: no source address before '@'", key, value);
	if (at && (size_t)(at - value) > RNBD_PLUGIN_SRC_MAX)
		return fail(err, errlen, "%s=%s: source address longer than %d bytes", key, value,
			    RNBD_PLUGIN_SRC_MAX);
	rc = check_hostport(key, value, dst, err, errlen);
	if (rc)
		return rc;
	c->paths[i] = (struct rtrs_path_addr){ .dst = dst };
	if (at) {
		memcpy(c->srcs[i], value, (size_t)(at - value));
		c->srcs[i][at - value] = '\0';
		c->paths[i].src = c->srcs[i];
	}
	c->npaths++;
	return 0;
}

static int set_value(struct rnbd_plugin_cfg *c, const struct param *p, const char *value,
		     char *err, size_t errlen)
{
	const char **str = (const char **)((char *)c + p->off);
	unsigned *num = (unsigned *)((char *)c + p->off);
	const char *why = NULL;
	uint64_t v;

	switch (p->type) {
	case P_PATH:
		return set_path(c, p->key, value, err, errlen);
	case P_SESSION:
		if (!rtrs_name_valid(value))
			return fail(err, errlen, "%s=%s: expected 1..255 printable characters without "
				    "blanks, '/' or '.'", p->key, value);
		break;
	case P_DEVICE:
		if (!rnbd_dev_name_valid(value, &why))
			return fail(err, errlen, "%s=%s: %s", p->key, value,
				    why ? why : "not a device name");
		break;
	case P_WORD:
		if (!word_ok(value, strlen(value)))
			return fail(err, errlen, "%s=%s: expected printable characters without blanks",
				    p->key, value);
		break;
	case P_SECRET:
		/* The secret itself is never echoed. */
		if (strncmp(value, "DHHC-1:", 7) &&
		    !(value[0] == '@' && value[1]) && !(!strncmp(value, "file:", 5) && value[5]))
			return fail(err, errlen, "%s=: expected DHHC-1:..., @FILE or file:FILE", p->key);
		break;
	case P_AUTH_NAME:
		if (!rtrs_auth_name_valid(value))
			return fail(err, errlen, "%s=%s: expected 1..%d printable characters without "
				    "blanks", p->key, value, RTRS_AUTH_WIRE_NAME_MAX);
		break;
	case P_UINT:
		if (parse_u64(value, p->min, p->max, &v))
			return fail(err, errlen, "%s=%s: expected a number in %u..%u", p->key, value,
				    p->min, p->max);
		*num = (unsigned)v;
		return 0;
	case P_MODE:
		for (unsigned i = 0; i < ARRAY_SIZE(mode_names); i++) {
			if (!strcmp(value, mode_names[i])) {
				*num = mode_values[i];
				return 0;
			}
		}
		return fail(err, errlen, "%s=%s: expected rw, ro or migration", p->key, value);
	case P_LOG_LEVEL: {
		int level = opts_log_level_parse(value);

		if (level < 0)
			return fail(err, errlen, "%s=%s: expected error, warn, info or debug", p->key,
				    value);
		*(int *)num = level;
		return 0;
	}
	}
	*str = value;
	return 0;
}

int rnbd_plugin_cfg_set(struct rnbd_plugin_cfg *c, const char *key, const char *value,
			char *err, size_t errlen)
{
	for (unsigned i = 0; i < ARRAY_SIZE(params); i++) {
		const struct param *p = &params[i];
		int rc;

		if (strcmp(key, p->key))
			continue;
		if (p->type != P_PATH && (c->set & (1u << i)))
			return fail(err, errlen, "%s= given twice", key);
		if (!*value)
			return fail(err, errlen, "%s= needs a value", key);
		rc = set_value(c, p, value, err, errlen);
		if (!rc)
			c->set |= 1u << i;
		return rc;
	}
	return fail(err, errlen, "unknown parameter %s (see --help)", key);
}

int rnbd_plugin_cfg_complete(const struct rnbd_plugin_cfg *c, char *err, size_t errlen)
{
	if (!c->npaths)
		return fail(err, errlen, "server=[SRC@]HOST[:PORT] is required");
	return 0;
}

const char *rnbd_plugin_cfg_help(void)
{
	static char help[2048];

	if (!help[0]) {
		size_t used = 0;

		for (unsigned i = 0; i < ARRAY_SIZE(params) && used < sizeof(help); i++) {
			char lhs[64];

			snprintf(lhs, sizeof(lhs), "%s=%s", params[i].key, params[i].arg);
			used += (size_t)snprintf(help + used, sizeof(help) - used, "%s%-36s %s",
						 i ? "\n" : "", lhs, params[i].help);
		}
	}
	return help;
}
