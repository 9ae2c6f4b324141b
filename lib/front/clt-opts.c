/* SPDX-License-Identifier: MIT */
/* The client front ends' session options (see clt-opts.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clt-opts.h"
#include "rtrs-proto.h"
#include "util.h"

enum clt_type {
	CT_PATH,     /* [SRC@]HOST[:PORT] through rtrs_addr_parse, appended */
	CT_UINT,     /* unsigned, decimal in [min, max] */
	CT_U16,      /* uint16_t, decimal in [min, max] */
	CT_STRING,   /* const char *, kept by pointer once valid() says yes */
	CT_SECRET,   /* const char *, never printed */
	CT_POLICY,   /* enum rtrs_mp_policy by name */
	CT_LEVEL,    /* int, a log level by name (opts_log_level_parse) */
	CT_ATTEMPTS, /* int, -1 (no limit) or a count in [min, max] */
	CT_TLS,      /* enum rtrs_tls_mode: off, required or concat */
};

struct clt_def {
	const char *name;       /* --NAME */
	const char *key;        /* nbdkit's KEY= */
	enum clt_type type;
	size_t off;             /* of the field in struct clt_cfg */
	unsigned min, max;      /* CT_UINT, CT_U16 */
	bool (*valid)(const char *s); /* CT_STRING, CT_SECRET */
	const char *expect;     /* CT_STRING, CT_SECRET, CT_POLICY, CT_LEVEL: the refusal */
	const char *arg, *help;
};

/* The fabrics librtrs has (fab_impl): a name it would refuse is refused here first. */
/*
 * What librtrs reads as a secret (rtrs_auth_key_load): a DHHC-1 string, or
 * "@FILE" / "file:FILE" naming a file that holds one. The string itself is
 * checked when the session opens, so that its error says which part is
 * wrong without the front end repeating the secret.
 */
static bool secret_valid(const char *s)
{
	return !strncmp(s, "DHHC-1:", 7) || (s[0] == '@' && s[1]) ||
	       (!strncmp(s, "file:", 5) && s[5]);
}

/* A TLS PSK as rtrs_tls_key_load reads it: checked whole when the session opens. */
static bool tls_key_valid(const char *s)
{
	return !strncmp(s, "NVMeTLSkey-1:", 13) || (s[0] == '@' && s[1]) ||
	       (!strncmp(s, "file:", 5) && s[5]);
}

static const char *const tls_names[] = {
	[RTRS_TLS_OFF] = "off",
	[RTRS_TLS_OFFERED] = "offered",   /* a server's; a client refuses it at open */
	[RTRS_TLS_REQUIRED] = "required",
	[RTRS_TLS_CONCAT] = "concat",     /* a client's */
};

static const char *const policy_names[] = {
	[RTRS_MP_POLICY_RR] = "round-robin",
	[RTRS_MP_POLICY_MIN_INFLIGHT] = "min-inflight",
	[RTRS_MP_POLICY_MIN_LATENCY] = "min-latency",
};

static const char *const level_names[] = { "error", "warn", "info", "debug" };

#define F(field) offsetof(struct clt_cfg, field)

static const struct clt_def defs[CLT_OPT_NR] = {
	[CLT_OPT_SERVER] = { "server", "server", CT_PATH, F(paths), .arg = "[SRC@]HOST[:PORT]",
		.help = "a path to the server (repeat for more paths); SRC@ picks the local "
			"address" },
	[CLT_OPT_PORT] = { "port", "port", CT_U16, F(opts.port), 1, 65535, .arg = "N",
		.help = "the server's port, for a path without :PORT" },
	[CLT_OPT_SESSION] = { "session", "session", CT_STRING, F(opts.sessname),
		.valid = rtrs_name_valid,
		.expect = "expected 1..255 printable characters without blanks or '/', not '.' or '..'",
		.arg = "NAME", .help = "session name, the RNBD server's %SESSNAME%" },
	[CLT_OPT_PROVIDER] = { "provider", "provider", CT_STRING, F(opts.provider),
		.valid = opts_provider_valid, .expect = "expected tcp, verbs or rdma",
		.arg = "NAME", .help = "fabric: tcp (native, io_uring) or verbs (RDMA devices, rdma-core)" },
	[CLT_OPT_IO_CONS] = { "io-connections", "io_connections", CT_UINT, F(opts.nr_io_cons),
		0, 1024, .arg = "N", .help = "IO connections per path (0 = one per CPU)" },
	[CLT_OPT_POLICY] = { "policy", "policy", CT_POLICY, F(opts.mp_policy),
		.expect = "expected round-robin, min-inflight or min-latency", .arg = "NAME",
		.help = "how a request picks its path: round-robin, min-inflight or min-latency" },
	[CLT_OPT_HB_INTERVAL] = { "hb-interval-ms", "hb_interval_ms", CT_UINT,
		F(opts.hb_interval_ms), 10, 600000, .arg = "MS", .help = "heartbeat interval" },
	[CLT_OPT_FAST_IO_FAIL] = { "fast-io-fail-ms", "fast_io_fail_ms", CT_UINT,
		F(opts.fast_io_fail_ms), 0, 3600000, .arg = "MS",
		.help = "how long IO waits for a path (0: it fails at once without one)" },
	[CLT_OPT_RECONNECT_DELAY] = { "reconnect-delay-ms", "reconnect_delay_ms", CT_UINT,
		F(opts.reconnect_delay_ms), 0, 3600000, .arg = "MS",
		.help = "delay before a failed path reconnects" },
	[CLT_OPT_BUSY_POLL] = { "busy-poll-us", "busy_poll_us", CT_UINT, F(opts.busy_poll_us),
		0, 1000000, .arg = "US",
		.help = "poll an empty completion queue this long before sleeping (RDMA devices)" },
	[CLT_OPT_POLL_GROUPS] = { "poll-groups", "poll_groups", CT_UINT, F(opts.poll_groups),
		0, RTRS_MAX_POLL_GROUPS, .arg = "N",
		.help = "threads that serve the connections of the process, per fabric (0: one per CPU)" },
	[CLT_OPT_SECRET] = { "secret", "secret", CT_SECRET, F(opts.auth_secret),
		.valid = secret_valid, .expect = "expected DHHC-1:..., @FILE or file:FILE",
		.arg = "DHHC-1:...|@FILE", .help = "this host's DH-HMAC-CHAP secret" },
	[CLT_OPT_CTRL_SECRET] = { "ctrl-secret", "ctrl_secret", CT_SECRET,
		F(opts.auth_ctrl_secret), .valid = secret_valid,
		.expect = "expected DHHC-1:..., @FILE or file:FILE",
		.arg = "DHHC-1:...|@FILE", .help = "authenticate the server too, with this secret" },
	[CLT_OPT_HOST_NAME] = { "host-name", "host_name", CT_STRING, F(opts.auth_host_name),
		.valid = rtrs_auth_name_valid,
		.expect = "expected 1..223 printable characters without blanks",
		.arg = "NQN", .help = "host name for authentication (default: /etc/nvme/hostnqn)" },
	[CLT_OPT_SERVER_NAME] = { "server-name", "server_name", CT_STRING,
		F(opts.auth_server_name), .valid = rtrs_auth_name_valid,
		.expect = "expected 1..223 printable characters without blanks",
		.arg = "NAME",
		.help = "the server's name for authentication, its --auth-name (default rtrs-server)" },
	[CLT_OPT_LOG_LEVEL] = { "log-level", "log_level", CT_LEVEL, F(log_level),
		.expect = "expected error, warn, info or debug", .arg = "LEVEL",
		.help = "error, warn, info or debug (default: RTRS_LOG_LEVEL)" },
	[CLT_OPT_LOSS_TIMEOUT] = { "reconnect-loss-timeout-ms", "reconnect_loss_timeout_ms",
		CT_UINT, F(opts.reconnect_loss_timeout_ms), 0, 86400000, .arg = "MS",
		.help = "give a path up after failing to reconnect for this long (0: never; "
			"nvme-cli's ctrl-loss-tmo)" },
	[CLT_OPT_MAX_RECONNECTS] = { "max-reconnect-attempts", "max_reconnect_attempts",
		CT_ATTEMPTS, F(opts.max_reconnect_attempts), 0, 1000000, .arg = "N",
		.help = "give a path up after N failed reconnects in a row (-1: never, the "
			"default)" },
	[CLT_OPT_RECONNECT_JITTER] = { "reconnect-jitter-ms", "reconnect_jitter_ms", CT_UINT,
		F(opts.reconnect_jitter_ms), 0, 3600000, .arg = "MS",
		.help = "add a random 0..MS to each reconnect delay; unless given, half the delay" },
	[CLT_OPT_TLS] = { "tls", "tls", CT_TLS, F(opts.tls), .expect = "expected off, offered, required or concat",
		.arg = "off|required|concat",
		.help = "TLS 1.3 with a PSK on every connection (tcp): off, required (a configured "
			"or derived PSK), or concat (a PSK each path's DH-HMAC-CHAP exchange "
			"generates)" },
	[CLT_OPT_TLS_KEY] = { "tls-key", "tls_key", CT_SECRET, F(opts.tls_key),
		.valid = tls_key_valid, .expect = "expected NVMeTLSkey-1:..., @FILE or file:FILE",
		.arg = "NVMeTLSkey-1:...|@FILE",
		.help = "the TLS PSK, as nvme gen-tls-key writes it (default: derived from --secret)" },
};

_Static_assert(RTRS_AUTH_WIRE_NAME_MAX == 223 && RTRS_NAME_MAX == 255,
	       "the refusals above name these limits");

void clt_cfg_init(struct clt_cfg *c, unsigned max_paths)
{
	memset(c, 0, sizeof(*c));
	rtrs_clt_opts_init(&c->opts, sizeof(c->opts));
	/* The front ends' defaults, where they differ from librtrs's. */
	c->opts.fast_io_fail_ms = CLT_FAST_IO_FAIL_MS;
	c->opts.reconnect_delay_ms = CLT_RECONNECT_DELAY_MS;
	c->opts.reconnect_jitter_ms = CLT_RECONNECT_DELAY_MS / 2;
	c->opts.paths = c->paths;
	c->max_paths = max_paths < 1 ? 1 : max_paths > CLT_MAX_PATHS ? CLT_MAX_PATHS : max_paths;
	c->log_level = -1;
}

void clt_cfg_finish(struct clt_cfg *c)
{
	if (!c->jitter_given)
		c->opts.reconnect_jitter_ms = c->opts.reconnect_delay_ms / 2;
}

static int add_path(struct clt_cfg *c, const char *value, char *err, size_t errlen)
{
	unsigned i = (unsigned)c->opts.paths_num;
	struct rtrs_addr a = { .size = sizeof(a) };

	if (i >= c->max_paths)
		return opts_errorf(err, errlen, -E2BIG, "at most %u paths", c->max_paths);
	/* Port 0: a path without :PORT takes opts.port, whenever that is set. */
	if (rtrs_addr_parse(value, 0, &a, err, errlen))
		return -EINVAL;
	c->addrs[i] = a;
	rtrs_addr_path(&c->addrs[i], &c->paths[i]);
	c->opts.paths = c->paths;
	c->opts.paths_num = i + 1;
	return 0;
}

int clt_opt_set(struct clt_cfg *c, enum clt_opt_id id, const char *value, char *err,
		size_t errlen)
{
	const struct clt_def *d;
	void *field;
	uint64_t v;
	int level;

	if ((unsigned)id >= CLT_OPT_NR)
		return opts_errorf(err, errlen, -EINVAL, "no such option");
	d = &defs[id];
	field = (char *)c + d->off;
	if (!value || !*value)
		return opts_errorf(err, errlen, -EINVAL, "needs a value");
	switch (d->type) {
	case CT_PATH:
		return add_path(c, value, err, errlen);
	case CT_UINT:
	case CT_U16:
		if (parse_u64(value, d->min, d->max, &v))
			return opts_errorf(err, errlen, -EINVAL, "expected a number in %u..%u",
					   d->min, d->max);
		if (d->type == CT_U16)
			*(uint16_t *)field = (uint16_t)v;
		else
			*(unsigned *)field = (unsigned)v;
		if (id == CLT_OPT_RECONNECT_JITTER)
			c->jitter_given = true;
		return 0;
	case CT_ATTEMPTS:
		if (!strcmp(value, "-1")) {
			*(int *)field = -1;
			return 0;
		}
		if (parse_u64(value, d->min, d->max, &v))
			return opts_errorf(err, errlen, -EINVAL,
					   "expected -1 (no limit) or a number in %u..%u", d->min,
					   d->max);
		*(int *)field = (int)v;
		return 0;
	case CT_STRING:
	case CT_SECRET:
		if (!d->valid(value))
			return opts_errorf(err, errlen, -EINVAL, "%s", d->expect);
		*(const char **)field = value;
		return 0;
	case CT_POLICY:
		for (unsigned i = 0; i < ARRAY_SIZE(policy_names); i++) {
			if (!strcmp(value, policy_names[i])) {
				*(enum rtrs_mp_policy *)field = (enum rtrs_mp_policy)i;
				return 0;
			}
		}
		return opts_errorf(err, errlen, -EINVAL, "%s", d->expect);
	case CT_TLS:
		for (unsigned i = 0; i < ARRAY_SIZE(tls_names); i++) {
			if (tls_names[i] && !strcmp(value, tls_names[i])) {
				*(enum rtrs_tls_mode *)field = (enum rtrs_tls_mode)i;
				return 0;
			}
		}
		return opts_errorf(err, errlen, -EINVAL, "%s", d->expect);
	case CT_LEVEL:
		level = opts_log_level_parse(value);
		if (level < 0)
			return opts_errorf(err, errlen, -EINVAL, "%s", d->expect);
		*(int *)field = level;
		return 0;
	}
	return opts_errorf(err, errlen, -EINVAL, "bad option table");
}

static const struct clt_def *def_of(enum clt_opt_id id)
{
	static const struct clt_def none = { "", "", CT_STRING, 0, .arg = "", .help = "" };

	return (unsigned)id < CLT_OPT_NR ? &defs[id] : &none;
}

const char *clt_opt_key(enum clt_opt_id id)
{
	return def_of(id)->key;
}

const char *clt_opt_name(enum clt_opt_id id)
{
	return def_of(id)->name;
}

const char *clt_opt_arg(enum clt_opt_id id)
{
	return def_of(id)->arg;
}

const char *clt_opt_help(enum clt_opt_id id)
{
	return def_of(id)->help;
}

bool clt_opt_secret(enum clt_opt_id id)
{
	return (unsigned)id < CLT_OPT_NR && defs[id].type == CT_SECRET;
}

int clt_opt_by_key(const char *key)
{
	for (unsigned i = 0; i < CLT_OPT_NR; i++)
		if (!strcmp(defs[i].key, key))
			return (int)i;
	return -1;
}

void clt_opt_show(const struct clt_cfg *c, enum clt_opt_id id, char *buf, size_t len)
{
	const struct clt_def *d;
	const void *field;
	const char *s;
	unsigned u;

	if (!len)
		return;
	buf[0] = '\0';
	if ((unsigned)id >= CLT_OPT_NR)
		return;
	d = &defs[id];
	field = (const char *)c + d->off;
	switch (d->type) {
	case CT_UINT:
	case CT_U16:
		u = d->type == CT_U16 ? *(const uint16_t *)field : *(const unsigned *)field;
		snprintf(buf, len, "%u", u);
		break;
	case CT_ATTEMPTS:
		snprintf(buf, len, "%d", *(const int *)field);
		break;
	case CT_STRING:
		s = *(const char *const *)field;
		snprintf(buf, len, "%s", s ? s : "");
		break;
	case CT_POLICY:
		u = (unsigned)*(const enum rtrs_mp_policy *)field;
		snprintf(buf, len, "%s", u < ARRAY_SIZE(policy_names) ? policy_names[u] : "");
		break;
	case CT_TLS:
		u = (unsigned)*(const enum rtrs_tls_mode *)field;
		snprintf(buf, len, "%s", u < ARRAY_SIZE(tls_names) && tls_names[u] ? tls_names[u] : "");
		break;
	case CT_LEVEL:
		u = (unsigned)*(const int *)field;
		snprintf(buf, len, "%s", u < ARRAY_SIZE(level_names) ? level_names[u] : "");
		break;
	case CT_PATH:
	case CT_SECRET:
		break;
	}
}

/* A path's port: its own, else the session's opts.port (add_path parses with 0). */
static uint16_t path_port(const struct clt_cfg *c, unsigned i)
{
	return c->addrs[i].has_port ? c->addrs[i].port : c->opts.port;
}

bool clt_cfg_same_paths(const struct clt_cfg *a, const struct clt_cfg *b)
{
	if (a->opts.paths_num != b->opts.paths_num)
		return false;
	for (unsigned i = 0; i < a->opts.paths_num; i++)
		if (strcmp(a->addrs[i].src, b->addrs[i].src) ||
		    strcmp(a->addrs[i].host, b->addrs[i].host) || path_port(a, i) != path_port(b, i))
			return false;
	return true;
}

bool clt_cfg_share_path(const struct clt_cfg *a, const struct clt_cfg *b)
{
	for (unsigned i = 0; i < a->opts.paths_num; i++)
		for (unsigned j = 0; j < b->opts.paths_num; j++)
			if (!strcmp(a->addrs[i].host, b->addrs[j].host) &&
			    path_port(a, i) == path_port(b, j))
				return true;
	return false;
}

bool clt_cfg_same_opts(const struct clt_cfg *a, const struct clt_cfg *b)
{
	for (unsigned id = 0; id < CLT_OPT_NR; id++) {
		const struct clt_def *d = &defs[id];
		char va[RTRS_NAME_MAX + 1], vb[RTRS_NAME_MAX + 1];

		if (id == CLT_OPT_SERVER || id == CLT_OPT_SESSION || id == CLT_OPT_PORT ||
		    id == CLT_OPT_LOG_LEVEL || id == CLT_OPT_POLL_GROUPS)
			continue;
		if (d->type == CT_STRING || d->type == CT_SECRET) {
			/* By text: clt_opt_show hides secrets. */
			const char *sa = *(const char *const *)((const char *)a + d->off);
			const char *sb = *(const char *const *)((const char *)b + d->off);

			if (strcmp(sa ? sa : "", sb ? sb : ""))
				return false;
			continue;
		}
		clt_opt_show(a, (enum clt_opt_id)id, va, sizeof(va));
		clt_opt_show(b, (enum clt_opt_id)id, vb, sizeof(vb));
		if (strcmp(va, vb))
			return false;
	}
	return true;
}

/*
 * Names the front ends' command lines had before each option got one name
 * (with its unit) everywhere: refused, with the name to use. Those that
 * were a shorter form of today's name in the same unit still work (the
 * parser takes an unambiguous prefix: --fast-io-fail), but not in the rnbd
 * command, where --reconnect-delay and --reconnect-jitter took seconds.
 */
static const struct {
	const char *old, *now, *how;
	bool rnbd_only;             /* still a prefix of the new name elsewhere */
} renamed[] = {
	{ "dst", "server", "", false },
	{ "sessname", "session", "", false },
	{ "cons", "io-connections", "", false },
	{ "ctrl-loss-tmo", "reconnect-loss-timeout-ms", " (milliseconds; it took seconds)", false },
	{ "fast-io-fail-tmo", "fast-io-fail-ms", " (milliseconds; it took seconds)", false },
	{ "nr-io-queues", "io-connections", "", false },
	{ "dhchap-secret", "secret", "", false },
	{ "dhchap-ctrl-secret", "ctrl-secret", "", false },
	{ "hostnqn", "host-name", "", false },
	{ "option", NULL, ": each option has a flag of its own (--fast-io-fail-ms, --policy, ...; "
	  "see --help)", false },
	{ "reconnect-delay", "reconnect-delay-ms", " (milliseconds; it took seconds)", true },
	{ "reconnect-jitter", "reconnect-jitter-ms", " (milliseconds; it took seconds)", true },
};

int clt_opts_renamed(const char *prog, int argc, char **argv, bool rnbd)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
		const char *a = argv[i];

		if (strncmp(a, "--", 2))
			continue;
		for (size_t k = 0; k < ARRAY_SIZE(renamed); k++) {
			size_t n = strlen(renamed[k].old);

			if ((renamed[k].rnbd_only && !rnbd) || strncmp(a + 2, renamed[k].old, n) ||
			    (a[2 + n] && a[2 + n] != '='))
				continue;
			if (renamed[k].now)
				fprintf(stderr, "%s: --%s is now --%s%s\n", prog, renamed[k].old,
					renamed[k].now, renamed[k].how);
			else
				fprintf(stderr, "%s: --%s is gone%s\n", prog, renamed[k].old,
					renamed[k].how);
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- the command line ----------------------------------------------------------- */

static int cli_set(const struct opt *o, const char *arg, char *err, size_t errlen)
{
	const struct clt_def *d = o->priv;

	return clt_opt_set(o->ptr, (enum clt_opt_id)(d - defs), arg, err, errlen);
}

static void cli_show(const struct opt *o, char *buf, size_t len)
{
	const struct clt_def *d = o->priv;

	clt_opt_show(o->ptr, (enum clt_opt_id)(d - defs), buf, len);
}

struct opt *clt_opts_table(struct clt_cfg *c, const struct clt_opt_pick *picks, size_t npicks,
			   const struct opt *own)
{
	size_t nown = 0, k = 0;
	struct opt *t;

	while (own && own[nown].name)
		nown++;
	t = calloc(npicks + nown + 1, sizeof(*t));
	if (!t)
		return NULL;
	for (size_t i = 0; i < npicks; i++) {
		const struct clt_def *d = def_of(picks[i].id);

		if ((unsigned)picks[i].id >= CLT_OPT_NR)
			continue;
		t[k++] = (struct opt){
			.name = d->name,
			.short_name = picks[i].short_name,
			.type = OPT_CUSTOM,
			.ptr = c,
			.arg = d->arg,
			.help = picks[i].help ? picks[i].help : d->help,
			.set = cli_set,
			.show = cli_show,
			.priv = d,
			.repeat = d->type == CT_PATH,
			.secret = d->type == CT_SECRET,
		};
	}
	if (nown)
		memcpy(t + k, own, nown * sizeof(*t));
	return t;
}
