/* SPDX-License-Identifier: MIT */
/*
 * rnbd: the management command over the daemons' control sockets
 * (JSON-RPC 2.0, lib/rpc; docs/management.md).
 *
 *   rnbd [options] client map DEVICE --session NAME [--server ADDR]... [--mode M]
 *                                    [--no-block-device] [--SESSION-OPTION VALUE]...
 *   rnbd [options] client unmap DEVICE [--session NAME] [--force]
 *   rnbd [options] client remap DEVICE [--session NAME]
 *   rnbd [options] client resize DEVICE SIZE [--session NAME]
 *   rnbd [options] client save
 *   rnbd [options] client list [sessions|paths|devices]
 *   rnbd [options] client path add SESSION SERVER
 *   rnbd [options] client path remove|reconnect|disconnect SESSION PATH-INDEX
 *   rnbd [options] client policy SESSION round-robin|min-inflight|min-latency
 *   rnbd [options] client reconnect-params SESSION [--reconnect-delay-ms MS]
 *                  [--reconnect-jitter-ms MS] [--max-reconnect-attempts N]
 *                  [--reconnect-loss-timeout-ms MS] [--fast-io-fail-ms MS]
 *   rnbd [options] client stats reset SESSION [PATH-INDEX]
 *   rnbd [options] client metrics
 *   rnbd [options] server list [sessions|devices]
 *   rnbd [options] server close SESSION DEVICE
 *   rnbd [options] server stats
 *   rnbd [options] server metrics
 *   rnbd [options] server access reload
 *   rnbd [options] server keys reload
 *   rnbd [options] server qos session|host|device NAME [KEY=VALUE...]
 *   rnbd [options] call METHOD [PARAMS-JSON]
 *
 * The session options of client map are the client front ends' (one table,
 * lib/front/clt-opts.c: the same names, units, checks and refusals as
 * rnbd-client's and the nbdkit plugin's), sent as client.map's "options"
 * by their keys. Tables for people, -o json for scripts (the method's
 * result as it came, one line). Exit codes: 0 done; 1 the daemon refused
 * or failed (its message on stderr); 2 bad usage; 3 no daemon answered on
 * the socket.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clt-opts.h"
#include "opts.h"
#include "rpc.h"
#include "util.h"

#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define EXIT_UNREACHABLE 3
#define EXIT_NO_ANSWER 4   /* the request was sent; no answer within --timeout */

/*
 * The default --timeout: longer than a map takes the daemon at worst with
 * the defaults (a session's paths connect within RTRS_DEFAULT_CONNECT_TIMEOUT_MS,
 * 10 s; an open or OPEN message then waits for a path for up to
 * CLT_FAST_IO_FAIL_MS, 30 s, if the one it had drops meanwhile), so that a
 * map that succeeds is not reported as unanswered. Longer waits (a larger
 * fast_io_fail_ms, the 60 s a remap may wait after a server restart) end
 * with EXIT_NO_ANSWER, which says the request may still complete.
 */
#define TIMEOUT_MS 60000
_Static_assert(TIMEOUT_MS > RTRS_DEFAULT_CONNECT_TIMEOUT_MS + CLT_FAST_IO_FAIL_MS,
	       "the default timeout covers a map's connect and a wait for a path");

static const char *const output_names[] = { "table", "json", NULL };

/*
 * The session options client map takes (every one of the front ends' table
 * but the server, the session and the log level, which are the command's
 * or the daemon's), and the client.reconnect parameter of those that
 * reconnect-params changes on an open session.
 */
static const struct {
	enum clt_opt_id id;
	const char *param;        /* client.reconnect's name for it, or NULL: map only */
} sess_opts[] = {
	{ CLT_OPT_PORT, NULL },
	{ CLT_OPT_PROVIDER, NULL },
	{ CLT_OPT_IO_CONS, NULL },
	{ CLT_OPT_POLICY, NULL },
	{ CLT_OPT_HB_INTERVAL, NULL },
	{ CLT_OPT_FAST_IO_FAIL, "fast_io_fail_ms" },
	{ CLT_OPT_RECONNECT_DELAY, "delay_ms" },
	{ CLT_OPT_RECONNECT_JITTER, "jitter_ms" },
	{ CLT_OPT_MAX_RECONNECTS, "max_attempts" },
	{ CLT_OPT_LOSS_TIMEOUT, "loss_timeout_ms" },
	{ CLT_OPT_BUSY_POLL, NULL },
	{ CLT_OPT_SECRET, NULL },
	{ CLT_OPT_CTRL_SECRET, NULL },
	{ CLT_OPT_HOST_NAME, NULL },
	{ CLT_OPT_SERVER_NAME, NULL },
	{ CLT_OPT_TLS, NULL },
	{ CLT_OPT_TLS_KEY, NULL },
};
#define NR_SESS_OPTS (sizeof(sess_opts) / sizeof(sess_opts[0]))

static struct {
	const char *sopt[NR_SESS_OPTS];   /* the values given, checked */
	const char *socket, *session, *mode;
	unsigned output;
	uint64_t timeout_ms;
	struct opt_list servers;
	bool force, block_device;
	struct clt_cfg check;             /* where the values are checked (the table's checks) */
} g = { .timeout_ms = TIMEOUT_MS, .block_device = true };

/* --server and the session options: checked by the front ends' table, kept as given. */
static int sess_opt_set(const struct opt *o, const char *arg, char *err, size_t errlen)
{
	size_t i = (size_t)(uintptr_t)o->priv;
	int rc;

	if (i == NR_SESS_OPTS) {
		rc = clt_opt_set(&g.check, CLT_OPT_SERVER, arg, err, errlen);
		if (!rc) {
			const char **items = realloc(g.servers.items,
						     (g.servers.n + 1) * sizeof(*items));

			if (!items)
				return opts_errorf(err, errlen, -ENOMEM, "out of memory");
			items[g.servers.n++] = arg;
			g.servers.items = items;
		}
		return rc;
	}
	rc = clt_opt_set(&g.check, sess_opts[i].id, arg, err, errlen);
	if (!rc)
		g.sopt[i] = arg;
	return rc;
}

/* --session: a name the front ends' table takes (the same check and refusal). */
static int session_set(const struct opt *o, const char *arg, char *err, size_t errlen)
{
	int rc = clt_opt_set(&g.check, CLT_OPT_SESSION, arg, err, errlen);

	if (!rc)
		g.session = arg;
	return rc;
}

/* The default --help shows: the front ends' (the daemon's, for a new session). */
static void sess_opt_show(const struct opt *o, char *buf, size_t len)
{
	size_t i = (size_t)(uintptr_t)o->priv;

	clt_opt_show(&g.check, i < NR_SESS_OPTS ? sess_opts[i].id : CLT_OPT_SERVER, buf, len);
}

static const struct opt options[] = {
	{ "socket", 'S', OPT_STRING, &g.socket, .arg = "PATH",
	  .help = "the control socket (default /run/rnbd/client.sock for client ..., "
		  "/run/rnbd/server.sock for server ...)" },
	{ "output", 'o', OPT_CHOICE, &g.output, .choices = output_names, .arg = "FORMAT",
	  .help = "table (for people) or json (for scripts)" },
	{ "timeout", 0, OPT_UINT, &g.timeout_ms, 1, 3600000, .arg = "MS",
	  .help = "wait this long for the daemon's answer (longer than a map takes with the "
		  "default connect timeout and fast_io_fail_ms)" },
	{ "session", 's', OPT_CUSTOM, .set = session_set, .arg = "NAME",
	  .help = "client map/unmap: the RTRS session (the server's %SESSNAME%)" },
	{ "mode", 0, OPT_STRING, &g.mode, .arg = "rw|ro|migration",
	  .help = "client map: the access mode (default rw)" },
	{ "block-device", 0, OPT_FLAG, &g.block_device,
	  .help = "client map: the device as a block device (ublk); --no-block-device maps it "
		  "without one" },
	{ "force", 'f', OPT_FLAG, &g.force,
	  .help = "client unmap: even with IO in flight" },
	{ 0 },
};

/*
 * The whole table: the options above, then --server and the session
 * options from the front ends' table (allocated, with their help).
 */
static struct opt *options_table(void)
{
	size_t nown = sizeof(options) / sizeof(options[0]) - 1, k = nown;
	struct opt *t = calloc(nown + 1 + NR_SESS_OPTS + 1, sizeof(*t));

	if (!t)
		return NULL;
	memcpy(t, options, nown * sizeof(*t));
	for (size_t i = 0; i <= NR_SESS_OPTS; i++) {
		enum clt_opt_id id = i < NR_SESS_OPTS ? sess_opts[i].id : CLT_OPT_SERVER;
		char *help = NULL;

		if (asprintf(&help, "client map, a new session%s: %s",
			     i < NR_SESS_OPTS && sess_opts[i].param ? " (and reconnect-params)" : "",
			     clt_opt_help(id)) < 0) {
			free(t);
			return NULL;
		}
		t[k++] = (struct opt){
			.name = clt_opt_name(id), .type = OPT_CUSTOM, .arg = clt_opt_arg(id),
			.help = help, .set = sess_opt_set, .show = sess_opt_show,
			.priv = (const void *)(uintptr_t)i, .repeat = id == CLT_OPT_SERVER,
			.secret = clt_opt_secret(id),
		};
	}
	return t;
}

static const char usage[] =
	"client map DEVICE --session NAME [--server ADDR]... | client unmap DEVICE | client save |\n"
	"       client remap DEVICE | client resize DEVICE SIZE |\n"
	"       client reconnect-params SESSION [--reconnect-delay-ms MS]... |\n"
	"       client list [sessions|paths|devices] | client path add SESSION SERVER |\n"
	"       client path remove|reconnect|disconnect SESSION PATH | client policy SESSION POLICY |\n"
	"       client stats reset SESSION [PATH] | client metrics |\n"
	"       server list [sessions|devices] | server close SESSION DEVICE | server stats |\n"
	"       server metrics | server access reload | server keys reload |\n"
	"       server qos session|host|device NAME [iops|read_iops|write_iops|bps|read_bps|write_bps=N...] |\n"
	"       call METHOD [PARAMS-JSON]";

/*
 * A table: columns as wide as their widest cell (a session's default name
 * or a long device path does not push the rest out of line), left- or
 * right-aligned ('l', 'r' in align), the last column not padded. Cells
 * are escaped as they are added: control characters as \xNN, so a name
 * cannot forge lines. Out of memory, the cell prints as "?".
 */
#define TABLE_MAX_COLS 12

struct table {
	size_t ncols, nrows, cap;
	const char *align;
	char **cells;              /* nrows x ncols, row 0 the heading */
};

static char *escaped(const char *s)
{
	size_t n = 1;
	char *out, *o;

	if (!s)
		s = "-"; /* null */
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		n += *p < 0x20 || *p == 0x7f ? 4 : 1;
	o = out = malloc(n);
	if (!out)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p < 0x20 || *p == 0x7f)
			o += sprintf(o, "\\x%02x", *p);
		else
			*o++ = (char)*p;
	}
	*o = '\0';
	return out;
}

/* Adds a row of t->ncols cells (NULL-terminated list not needed: ncols of them). */
static void table_row(struct table *t, const char *const *cells)
{
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 16;
		char **c = realloc(t->cells, cap * t->ncols * sizeof(*c));

		if (!c)
			return;
		t->cells = c;
		t->cap = cap;
	}
	for (size_t i = 0; i < t->ncols; i++)
		t->cells[t->nrows * t->ncols + i] = escaped(cells[i]);
	t->nrows++;
}

static void table_init(struct table *t, const char *align, const char *const *heads)
{
	*t = (struct table){ .ncols = strlen(align), .align = align };
	table_row(t, heads);
}

/* Prints and frees the table. */
static void table_print(struct table *t)
{
	size_t w[TABLE_MAX_COLS] = { 0 };

	for (size_t r = 0; r < t->nrows; r++)
		for (size_t c = 0; c < t->ncols; c++) {
			const char *s = t->cells[r * t->ncols + c];

			w[c] = MAX(w[c], s ? strlen(s) : 1);
		}
	for (size_t r = 0; r < t->nrows; r++) {
		for (size_t c = 0; c < t->ncols; c++) {
			const char *s = t->cells[r * t->ncols + c];
			bool last = c + 1 == t->ncols;

			if (!s)
				s = "?";
			if (t->align[c] == 'r')
				printf("%*s", (int)w[c], s);
			else
				printf("%-*s", last ? 0 : (int)w[c], s);
			fputs(last ? "\n" : "  ", stdout);
		}
	}
	for (size_t i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
}

/*
 * What an answer holds, read without trusting its shape: a member that is
 * missing, null or of another type reads as "" (str), 0 (u64) or an empty
 * array (arr, arr_len), never as a NULL a table would dereference.
 */
static const char *str(struct json_object *o, const char *key)
{
	struct json_object *v;
	const char *s;

	if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, key, &v))
		return "";
	s = json_object_get_string(v);
	return s ? s : "";
}

static struct json_object *arr(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;

	return json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v) &&
	       json_object_is_type(v, json_type_array) ? v : NULL;
}

static size_t arr_len(struct json_object *a)
{
	return json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
}

static uint64_t u64(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v) ?
	       json_object_get_uint64(v) : 0;
}

static bool flag(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) && json_object_get_boolean(v);
}

/* A number as a cell: buf must hold 21 bytes. */
static const char *num(char *buf, uint64_t v)
{
	snprintf(buf, 21, "%" PRIu64, v);
	return buf;
}

static void table_sessions(struct json_object *r)
{
	static const char *const heads[] = { "SESSION", "PEER", "INVAL", "PATH", "STATE",
					     "INFLIGHT", "READS", "WRITES", "DEVICES" };
	struct table t;

	table_init(&t, "lllllrrrl", heads);
	for (size_t i = 0; i < arr_len(r); i++) {
		struct json_object *s = json_object_array_get_idx(r, i), *paths, *devs;
		char devices[4096] = "", n[3][21];
		size_t len = 0;

		paths = arr(s, "paths");
		devs = arr(s, "devices");
		for (size_t k = 0; k < arr_len(devs) && len < sizeof(devices); k++) {
			const char *d = json_object_get_string(json_object_array_get_idx(devs, k));

			len += (size_t)snprintf(devices + len, sizeof(devices) - len, "%s%s",
						k ? "," : "", d ? d : "-");
		}
		for (size_t j = 0; j < arr_len(paths); j++) {
			struct json_object *p = json_object_array_get_idx(paths, j);
			const char *row[] = {
				str(s, "name")[0] ? str(s, "name") : "(unnamed)",
				flag(s, "kernel_client") ? "kernel" : "rnbd",
				flag(s, "always_invalidate") ? "on" : "off", str(p, "peer"),
				str(p, "state"), num(n[0], u64(p, "inflight")),
				num(n[1], u64(p, "reads")), num(n[2], u64(p, "writes")), devices,
			};

			table_row(&t, row);
		}
	}
	table_print(&t);
}

static void table_devices(struct json_object *r)
{
	static const char *const heads[] = { "SESSION", "DEVICE", "ID", "MODE", "READS",
					     "READ_BYTES", "WRITES", "WRITE_BYTES", "ERRORS",
					     "INFLIGHT", "STATE" };
	struct table t;

	table_init(&t, "llrlrrrrrrl", heads);
	for (size_t i = 0; i < arr_len(r); i++) {
		struct json_object *d = json_object_array_get_idx(r, i);
		char n[7][21];
		const char *row[] = {
			str(d, "session"), str(d, "device"), num(n[0], u64(d, "id")), str(d, "mode"),
			num(n[1], u64(d, "reads")), num(n[2], u64(d, "read_bytes")),
			num(n[3], u64(d, "writes")), num(n[4], u64(d, "write_bytes")),
			num(n[5], u64(d, "errors")), num(n[6], u64(d, "inflight")),
			flag(d, "closed") ? "closed" : "open",
		};

		table_row(&t, row);
	}
	table_print(&t);
}

static void table_clt_sessions(struct json_object *r)
{
	static const char *const heads[] = { "SESSION", "SERVER", "PATHS", "QD", "MAX_IO",
					     "POLICY" };
	struct table t;

	table_init(&t, "llrrrl", heads);
	for (size_t i = 0; i < arr_len(r); i++) {
		struct json_object *s = json_object_array_get_idx(r, i), *paths;
		char up[48], n[2][21];

		paths = arr(s, "paths");
		snprintf(up, sizeof(up), "%" PRIu64 "/%zu", u64(s, "paths_up"),
			 arr_len(paths));
		const char *row[] = {
			str(s, "name"), str(s, "server"), up, num(n[0], u64(s, "queue_depth")),
			num(n[1], u64(s, "max_io_size")), str(s, "policy"),
		};

		table_row(&t, row);
	}
	table_print(&t);
}

static void table_clt_paths(struct json_object *r)
{
	static const char *const heads[] = { "SESSION", "INDEX", "PATH", "STATE", "INFLIGHT",
					     "READS", "WRITES", "RECONNECTS", "FAILOVERS",
					     "LAST_ERROR" };
	struct table t;

	table_init(&t, "lrllrrrrrl", heads);
	for (size_t i = 0; i < arr_len(r); i++) {
		struct json_object *s = json_object_array_get_idx(r, i), *paths;

		paths = arr(s, "paths");
		for (size_t j = 0; j < arr_len(paths); j++) {
			struct json_object *p = json_object_array_get_idx(paths, j);
			char path[600], n[6][21];
			const char *name = str(p, "name"), *slash = strchr(name, '/');

			/* With a source address: session/SRC@host:port, as --server takes it. */
			if (str(p, "src")[0] && slash)
				snprintf(path, sizeof(path), "%.*s/%s@%s", (int)(slash - name), name,
					 str(p, "src"), slash + 1);
			else
				snprintf(path, sizeof(path), "%s", name);
			const char *row[] = {
				str(s, "name"), num(n[0], u64(p, "index")), path,
				flag(p, "removed") ? "removed" : str(p, "state"),
				num(n[1], u64(p, "inflight")), num(n[2], u64(p, "reads")),
				num(n[3], u64(p, "writes")), num(n[4], u64(p, "reconnects")),
				num(n[5], u64(p, "failovers")),
				str(p, "last_error")[0] ? str(p, "last_error") : "-",
			};

			table_row(&t, row);
		}
	}
	table_print(&t);
}

static void table_clt_devices(struct json_object *r)
{
	static const char *const heads[] = { "SESSION", "DEVICE", "MODE", "BYTES", "STATE" };
	struct table t;

	table_init(&t, "lllrl", heads);
	for (size_t i = 0; i < arr_len(r); i++) {
		struct json_object *d = json_object_array_get_idx(r, i);
		char n[21];
		const char *row[] = {
			str(d, "session"), str(d, "device"), str(d, "mode"),
			num(n, u64(d, "bytes")), str(d, "state"),
		};

		table_row(&t, row);
	}
	table_print(&t);
}

/* metrics: the text as it came (Prometheus's format). */
static void show_text(struct json_object *r)
{
	fputs(str(r, "text"), stdout);
}

static void table_object(struct json_object *r)
{
	static const char *const heads[] = { "KEY", "VALUE" };
	struct table t;

	table_init(&t, "ll", heads);
	json_object_object_foreach(r, key, val) {
		const char *row[] = { key, json_object_get_string(val) };

		table_row(&t, row);
	}
	/* Key and value, without the heading. */
	free(t.cells[0]);
	free(t.cells[1]);
	memmove(t.cells, t.cells + 2, (t.nrows - 1) * 2 * sizeof(*t.cells));
	t.nrows--;
	table_print(&t);
}

/* Calls method; prints the result with show (or as JSON). The exit code. */
static int run(const char *sock, const char *method, struct json_object *params,
	       void (*show)(struct json_object *r))
{
	struct json_object *r = NULL;
	struct rpc_err e;
	int rc = rpc_call(sock, method, params, (unsigned)g.timeout_ms, &r, &e);

	json_object_put(params);
	if (rc == -EREMOTEIO) {
		fprintf(stderr, "rnbd: %s: %s\n", method, e.msg);
		return EXIT_FAILED;
	}
	if (rc == -ETIMEDOUT) {
		/* Sent: the daemon may be working on it still, and may yet succeed. */
		const char *check = !strcmp(method, "client.map") || !strcmp(method, "client.unmap") ||
				    !strcmp(method, "client.remap") || !strcmp(method, "client.resize") ?
				    ": check `rnbd client list devices`" :
				    !strncmp(method, "client.path.", 12) ?
				    ": check `rnbd client list paths`" : "";

		fprintf(stderr, "rnbd: %s: the daemon did not answer within %llu ms; the request "
			"may still complete%s\n", method, (unsigned long long)g.timeout_ms, check);
		return EXIT_NO_ANSWER;
	}
	if (rc) {
		fprintf(stderr, "rnbd: %s\n", e.msg[0] ? e.msg : strerror(-rc));
		return rc == -EBADMSG || rc == -EMSGSIZE ? EXIT_FAILED : EXIT_UNREACHABLE;
	}
	if (g.output == 1 || !show) {
		puts(r ? json_object_to_json_string_ext(r, JSON_C_TO_STRING_PLAIN |
							JSON_C_TO_STRING_NOSLASHESCAPE) : "null");
	} else if (show == table_object || show == show_text ?
		   json_object_is_type(r, json_type_object) :
		   json_object_is_type(r, json_type_array)) {
		show(r);
	} else {
		fprintf(stderr, "rnbd: %s: an answer of an unexpected shape\n", method);
		json_object_put(r);
		return EXIT_FAILED;
	}
	json_object_put(r);
	return fflush(stdout) ? EXIT_FAILED : 0;
}

static struct json_object *params2(const char *k1, const char *v1, const char *k2,
				   const char *v2)
{
	struct json_object *p = json_object_new_object();

	if (!p || json_object_object_add(p, k1, json_object_new_string(v1)) ||
	    json_object_object_add(p, k2, json_object_new_string(v2))) {
		json_object_put(p);
		return NULL;
	}
	return p;
}

static int bad_usage(const char *why)
{
	fprintf(stderr, "rnbd: %s\nusage: rnbd [options] %s\n", why, usage);
	return EXIT_USAGE;
}

/*
 * server qos session|host|device NAME [KEY=VALUE...]: server.qos; IO rates are
 * numbers, byte rates sizes (100M).
 */
static int server_qos(const char *sock, int argc, char **argv)
{
	static const char *const keys[] = { "iops", "read_iops", "write_iops", "bps", "read_bps",
					    "write_bps", NULL };
	struct json_object *p;

	if (argc < 3 ||
	    (strcmp(argv[1], "session") && strcmp(argv[1], "host") && strcmp(argv[1], "device")))
		return bad_usage("server qos needs session|host|device NAME [KEY=VALUE...]");
	p = params2("kind", argv[1], "name", argv[2]);
	if (!p) {
		json_object_put(p);
		return EXIT_FAILED;
	}
	for (int i = 3; i < argc; i++) {
		const char *eq = strchr(argv[i], '=');
		unsigned k;
		uint64_t v;

		for (k = 0; eq && keys[k]; k++)
			if (strlen(keys[k]) == (size_t)(eq - argv[i]) &&
			    !strncmp(argv[i], keys[k], (size_t)(eq - argv[i])))
				break;
		if (!eq || !keys[k]) {
			json_object_put(p);
			fprintf(stderr, "rnbd: server qos: \"%s\" is not KEY=VALUE with KEY one of "
				"iops, read_iops, write_iops, bps, read_bps, write_bps\n", argv[i]);
			return EXIT_USAGE;
		}
		if (k < 3 ? parse_u64(eq + 1, 0, 100000000, &v) :
			    parse_size(eq + 1, 0, 1ull << 50, &v)) {
			json_object_put(p);
			fprintf(stderr, "rnbd: server qos: %s: %s\n", argv[i],
				k < 3 ? "not a number of IOs per second up to 100000000" :
					"not a byte rate up to 1024T (100M, 2G)");
			return EXIT_USAGE;
		}
		if (json_object_object_add(p, keys[k], json_object_new_uint64(v))) {
			json_object_put(p);
			return EXIT_FAILED;
		}
	}
	return run(sock, "server.qos", p, table_object);
}

static int server_cmd(int argc, char **argv)
{
	const char *sock = g.socket ? g.socket : "/run/rnbd/server.sock";

	if (argc < 1)
		return bad_usage("server needs list, close or stats");
	if (!strcmp(argv[0], "list")) {
		if (argc > 2)
			return bad_usage("server list takes at most one of sessions, devices");
		if (argc == 1 || !strcmp(argv[1], "sessions"))
			return run(sock, "server.sessions", NULL, table_sessions);
		if (!strcmp(argv[1], "devices"))
			return run(sock, "server.devices", NULL, table_devices);
		return bad_usage("server list: sessions or devices");
	}
	if (!strcmp(argv[0], "close")) {
		struct json_object *p;

		if (argc != 3)
			return bad_usage("server close needs SESSION DEVICE");
		p = params2("session", argv[1], "device", argv[2]);
		if (!p)
			return EXIT_FAILED;
		return run(sock, "server.close", p, table_object);
	}
	if (!strcmp(argv[0], "stats")) {
		if (argc != 1)
			return bad_usage("server stats takes no arguments");
		return run(sock, "server.stats", NULL, table_object);
	}
	if (!strcmp(argv[0], "metrics")) {
		if (argc != 1)
			return bad_usage("server metrics takes no arguments");
		return run(sock, "metrics", NULL, show_text);
	}
	if (!strcmp(argv[0], "qos"))
		return server_qos(sock, argc, argv);
	if (!strcmp(argv[0], "keys")) {
		if (argc != 2 || strcmp(argv[1], "reload"))
			return bad_usage("server keys: reload");
		return run(sock, "server.keys.reload", NULL, table_object);
	}
	if (!strcmp(argv[0], "access")) {
		if (argc != 2 || strcmp(argv[1], "reload"))
			return bad_usage("server access: reload");
		return run(sock, "server.access.reload", NULL, table_object);
	}
	return bad_usage("server: list, close, stats, metrics, qos, keys reload or access reload");
}

/* A path's index, as client list paths shows it. */
static struct json_object *sess_path_params(const char *sess, const char *path, bool *bad)
{
	struct json_object *p = json_object_new_object();
	char *end;
	unsigned long v = strtoul(path, &end, 10);

	*bad = !*path || *end || v > 1023 || path[0] == '-';
	if (*bad || !p || json_object_object_add(p, "session", json_object_new_string(sess)) ||
	    json_object_object_add(p, "path", json_object_new_uint64(v))) {
		json_object_put(p);
		return NULL;
	}
	return p;
}

/* client map DEVICE: params from --session, --server, --mode, --no-block-device, the options. */
static struct json_object *map_params(const char *device)
{
	struct json_object *p = json_object_new_object(), *servers = NULL, *opts = NULL;
	bool ok = p && !json_object_object_add(p, "device", json_object_new_string(device)) &&
		  !json_object_object_add(p, "session", json_object_new_string(g.session));

	if (ok && g.mode)
		ok = !json_object_object_add(p, "mode", json_object_new_string(g.mode));
	if (ok && !g.block_device)
		ok = !json_object_object_add(p, "block_device", json_object_new_boolean(false));
	if (ok && g.servers.n) {
		servers = json_object_new_array();
		for (unsigned i = 0; servers && i < g.servers.n; i++)
			json_object_array_add(servers, json_object_new_string(g.servers.items[i]));
		ok = servers && !json_object_object_add(p, "server", servers);
	}
	for (size_t i = 0; ok && i < NR_SESS_OPTS; i++) {
		if (!g.sopt[i])
			continue;
		if (!opts) {
			opts = json_object_new_object();
			ok = opts && !json_object_object_add(p, "options", opts);
		}
		ok = ok && !json_object_object_add(opts, clt_opt_key(sess_opts[i].id),
						   json_object_new_string(g.sopt[i]));
	}
	if (!ok) {
		json_object_put(p);
		return NULL;
	}
	return p;
}

/*
 * client reconnect-params SESSION: client.reconnect's params from the
 * options (checked already); none given asks for the values in force.
 * NULL after a message (exit 2) or for want of memory.
 */
static struct json_object *reconnect_params(const char *session)
{
	struct json_object *p = json_object_new_object();
	bool ok = p && !json_object_object_add(p, "session", json_object_new_string(session));

	for (size_t i = 0; ok && i < NR_SESS_OPTS; i++) {
		if (!g.sopt[i])
			continue;
		if (!sess_opts[i].param) {
			fprintf(stderr, "rnbd: --%s: for client map only\n",
				clt_opt_name(sess_opts[i].id));
			ok = false;
		} else {
			/* A number the table took: -1 (attempts) or 0..86400000. */
			ok = !json_object_object_add(p, sess_opts[i].param,
						     json_object_new_int64(strtoll(g.sopt[i], NULL,
										   10)));
		}
	}
	if (!ok) {
		json_object_put(p);
		return NULL;
	}
	return p;
}

/* client remap|resize DEVICE: the device, and --session where given. */
static struct json_object *dev_params(const char *device)
{
	struct json_object *p = json_object_new_object();

	if (!p || json_object_object_add(p, "device", json_object_new_string(device)) ||
	    (g.session && json_object_object_add(p, "session", json_object_new_string(g.session)))) {
		json_object_put(p);
		return NULL;
	}
	return p;
}

static int client_cmd(int argc, char **argv)
{
	const char *sock = g.socket ? g.socket : "/run/rnbd/client.sock";
	struct json_object *p;
	bool bad;

	if (argc >= 1 && !strcmp(argv[0], "map")) {
		if (argc != 2 || !g.session)
			return bad_usage("client map DEVICE --session NAME [--server ADDR]... "
					 "[--mode M] [--no-block-device] [--SESSION-OPTION VALUE]...");
		p = map_params(argv[1]);
		return p ? run(sock, "client.map", p, table_object) : EXIT_USAGE;
	}
	if (argc >= 1 && !strcmp(argv[0], "unmap")) {
		if (argc != 2)
			return bad_usage("client unmap DEVICE [--session NAME] [--force]");
		p = json_object_new_object();
		if (!p || json_object_object_add(p, "device", json_object_new_string(argv[1])) ||
		    (g.session &&
		     json_object_object_add(p, "session", json_object_new_string(g.session))) ||
		    (g.force && json_object_object_add(p, "force", json_object_new_boolean(true)))) {
			json_object_put(p);
			return EXIT_FAILED;
		}
		return run(sock, "client.unmap", p, table_object);
	}
	if (argc >= 1 && !strcmp(argv[0], "remap")) {
		if (argc != 2)
			return bad_usage("client remap DEVICE [--session NAME]");
		p = dev_params(argv[1]);
		return p ? run(sock, "client.remap", p, table_object) : EXIT_FAILED;
	}
	if (argc >= 1 && !strcmp(argv[0], "resize")) {
		uint64_t bytes;

		if (argc != 3)
			return bad_usage("client resize DEVICE SIZE [--session NAME]");
		if (parse_size(argv[2], 1, UINT64_MAX >> 1, &bytes))
			return bad_usage("SIZE: bytes, or with K, M, G or T (powers of 1024)");
		p = dev_params(argv[1]);
		if (p && json_object_object_add(p, "bytes", json_object_new_int64((int64_t)bytes))) {
			json_object_put(p);
			p = NULL;
		}
		return p ? run(sock, "client.resize", p, table_object) : EXIT_FAILED;
	}
	if (argc >= 1 && !strcmp(argv[0], "reconnect-params")) {
		if (argc != 2)
			return bad_usage("client reconnect-params SESSION [--reconnect-delay-ms MS] "
					 "[--reconnect-jitter-ms MS] [--max-reconnect-attempts N] "
					 "[--reconnect-loss-timeout-ms MS] [--fast-io-fail-ms MS]");
		p = reconnect_params(argv[1]);
		return p ? run(sock, "client.reconnect", p, table_object) : EXIT_USAGE;
	}
	if (argc >= 1 && !strcmp(argv[0], "save")) {
		if (argc != 1)
			return bad_usage("client save takes no arguments");
		return run(sock, "client.save", NULL, table_object);
	}

	if (argc < 1)
		return bad_usage("client needs list, path, policy or stats");
	if (!strcmp(argv[0], "list")) {
		if (argc > 2)
			return bad_usage("client list takes at most one of sessions, paths, devices");
		if (argc == 1 || !strcmp(argv[1], "sessions"))
			return run(sock, "client.sessions", NULL, table_clt_sessions);
		if (!strcmp(argv[1], "paths"))
			return run(sock, "client.sessions", NULL, table_clt_paths);
		if (!strcmp(argv[1], "devices"))
			return run(sock, "client.devices", NULL, table_clt_devices);
		return bad_usage("client list: sessions, paths or devices");
	}
	if (!strcmp(argv[0], "path")) {
		static const char *const ops[] = { "remove", "reconnect", "disconnect" };

		if (argc == 4 && !strcmp(argv[1], "add")) {
			p = params2("session", argv[2], "server", argv[3]);
			return p ? run(sock, "client.path.add", p, table_object) : EXIT_FAILED;
		}
		for (size_t i = 0; argc == 4 && i < sizeof(ops) / sizeof(ops[0]); i++) {
			char method[64];

			if (strcmp(argv[1], ops[i]))
				continue;
			p = sess_path_params(argv[2], argv[3], &bad);
			if (bad)
				return bad_usage("PATH is the path's index (client list paths)");
			snprintf(method, sizeof(method), "client.path.%s", ops[i]);
			return p ? run(sock, method, p, table_object) : EXIT_FAILED;
		}
		return bad_usage("client path add SESSION SERVER | "
				 "client path remove|reconnect|disconnect SESSION PATH");
	}
	if (!strcmp(argv[0], "policy")) {
		if (argc != 3)
			return bad_usage("client policy needs SESSION POLICY");
		p = params2("session", argv[1], "policy", argv[2]);
		return p ? run(sock, "client.policy", p, table_object) : EXIT_FAILED;
	}
	if (!strcmp(argv[0], "stats")) {
		if ((argc != 3 && argc != 4) || strcmp(argv[1], "reset"))
			return bad_usage("client stats reset SESSION [PATH]");
		if (argc == 4) {
			p = sess_path_params(argv[2], argv[3], &bad);
			if (bad)
				return bad_usage("PATH is the path's index (client list paths)");
		} else {
			p = json_object_new_object();
			if (p && json_object_object_add(p, "session", json_object_new_string(argv[2]))) {
				json_object_put(p);
				p = NULL;
			}
		}
		return p ? run(sock, "client.stats.reset", p, table_object) : EXIT_FAILED;
	}
	if (!strcmp(argv[0], "metrics")) {
		if (argc != 1)
			return bad_usage("client metrics takes no arguments");
		return run(sock, "metrics", NULL, show_text);
	}
	return bad_usage("client: map, unmap, remap, resize, save, list, path, policy, "
			 "reconnect-params, stats or metrics");
}

static int call_cmd(int argc, char **argv)
{
	struct json_object *p = NULL;

	if (argc < 1 || argc > 2)
		return bad_usage("call needs METHOD [PARAMS-JSON]");
	if (!g.socket)
		return bad_usage("call needs --socket");
	if (argc == 2) {
		enum json_tokener_error te;

		p = json_tokener_parse_verbose(argv[1], &te);
		if (!p || !json_object_is_type(p, json_type_object)) {
			json_object_put(p);
			fprintf(stderr, "rnbd: call %s: PARAMS-JSON is not a JSON object%s%s\n",
				argv[0], p ? "" : ": ", p ? "" : json_tokener_error_desc(te));
			return EXIT_USAGE;
		}
	}
	g.output = 1;
	return run(g.socket, argv[0], p, NULL);
}

static struct opt *table; /* the options with the session options (options_table) */

int main(int argc, char **argv)
{
	char **words = calloc((size_t)argc + 1, sizeof(*words));
	int n = 0, base = 0, pos, rc;

	clt_cfg_init(&g.check, CLT_MAX_PATHS);
	table = options_table();
	if (!words || !table) {
		fprintf(stderr, "rnbd: out of memory\n");
		return EXIT_FAILED;
	}
	if (clt_opts_renamed("rnbd", argc, argv, true)) {
		free(words);
		return EXIT_USAGE;
	}
	/*
	 * Options go anywhere ("rnbd server list -o json"): the table's parser
	 * stops at a word, which then stands as argv[0] for the next round.
	 * After "--" every argument is a word (a device named "-x").
	 */
	for (;;) {
		rc = opts_parse(table, "rnbd", usage, argc - base, argv + base, &pos);
		if (rc) {
			free(words);
			return rc > 0 ? 0 : EXIT_USAGE;
		}
		pos += base;
		if (pos > base + 1 && !strcmp(argv[pos - 1], "--")) {
			while (pos < argc)
				words[n++] = argv[pos++];
			break;
		}
		if (pos >= argc)
			break;
		words[n++] = argv[pos];
		base = pos;
	}
	if (!n)
		rc = bad_usage("what to do?");
	else if (!strcmp(words[0], "client"))
		rc = client_cmd(n - 1, words + 1);
	else if (!strcmp(words[0], "server"))
		rc = server_cmd(n - 1, words + 1);
	else if (!strcmp(words[0], "call"))
		rc = call_cmd(n - 1, words + 1);
	else
		rc = bad_usage("unknown command (client, server, call)");
	free(words);
	return rc;
}
