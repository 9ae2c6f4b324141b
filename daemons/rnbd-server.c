/* SPDX-License-Identifier: MIT */
/*
 * rnbd-server: exports files and block devices found below a search path
 * (and memory devices, for benchmarks) to RNBD clients.
 *
 *   rnbd-server [--config FILE] [options]
 *
 * Options come from one table, read from the config file first and then
 * from the command line (which wins). SIGINT or SIGTERM stops the server
 * after every IO in flight was answered, and removes its control socket;
 * SIGHUP checks the authentication key file again and logs the outcome.
 * With --control PATH the server serves its management plane on a Unix
 * socket (mode 0600; only a stale socket there is replaced): JSON-RPC 2.0
 * (lib/rpc), the methods server.sessions, server.devices, server.close
 * and server.stats, which the rnbd command calls (docs/management.md).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dlog.h"
#include "opts.h"
#include "metrics.h"
#include "rnbd.h"
#include "rpc.h"
#include "util.h"

static const char *const engine_names[] = { "auto", "io_uring", "threads", NULL };
/* enum rtrs_tls_mode's order */
static const char *const tls_names[] = { "off", "offered", "required", NULL };

static struct {
	const char *config, *addr, *provider, *search, *auth_keys, *auth_name, *access, *control;
	const char *metrics;
	const char *log_level;
	struct opt_list mem, qos;
	uint64_t port, queue_depth, chunk_size, threads, hb_ms, busy_poll_us, listen_timeout;
	uint64_t poll_groups, srq_depth;
	uint64_t max_sessions, max_sessions_per_peer, max_chunk_mem, max_pending, max_devs,
		 max_pending_per_peer, handshake_ms;
	unsigned engine, tls;
	bool no_ktls;
	bool direct, buffered_bdev, inline_writes, invalidate, quiet, syslog;
} g = {
	.provider = "tcp", .port = RNBD_DEFAULT_PORT_NR, .queue_depth = 512,
	.chunk_size = 128 << 10, .threads = 4, .hb_ms = 1000, .invalidate = true, .inline_writes = true,
	.max_sessions = RTRS_DEFAULT_MAX_SESSIONS,
	.max_sessions_per_peer = RTRS_DEFAULT_MAX_SESSIONS_PER_PEER,
	.max_devs = RNBD_DEFAULT_MAX_DEVS_PER_SESSION,
	.max_pending = RTRS_DEFAULT_MAX_PENDING, .max_pending_per_peer = RTRS_DEFAULT_MAX_PENDING_PER_PEER,
	.handshake_ms = RTRS_DEFAULT_HANDSHAKE_TIMEOUT_MS, .srq_depth = RTRS_DEFAULT_SRQ_DEPTH,
};

/*
 * --mem-device NAME:SIZE: the form, the name (rnbd_dev_name_check) and
 * the size checked here, so that a mistake in a config file is said with
 * its file and line; a name given twice and the machine's memory are
 * librnbd's to check (it says which and why).
 */
static int mem_set(const struct opt *o, const char *arg, char *err, size_t errlen)
{
	const char *colon = strrchr(arg, ':');
	const char **n;
	uint64_t size;

	int rc;

	(void)o;
	if (!colon || colon == arg)
		return opts_errorf(err, errlen, -EINVAL, "expected NAME:SIZE");
	{
		char name[4096];
		const char *why = NULL;

		snprintf(name, sizeof(name), "%.*s", (int)(colon - arg), arg);
		/* The values go to librnbd joined by commas (join_mem): one is one device. */
		if (strchr(name, ','))
			return opts_errorf(err, errlen, -EINVAL, "memory device \"%s\": a name with "
					   "',' (one NAME:SIZE a --mem-device)", name);
		if (rnbd_dev_name_check(name, &why))
			return opts_errorf(err, errlen, -EINVAL, "memory device \"%s\": %s", name,
					   why ? why : "not a device name");
	}
	/* Said as librnbd says it (mem_devices_parse), the cause first. */
	rc = parse_size(colon + 1, 4096, UINT64_MAX >> 1, &size);
	if (rc == -ERANGE && !parse_size(colon + 1, 0, UINT64_MAX, &size) && size < 4096)
		return opts_errorf(err, errlen, -EINVAL, "memory device %.*s: size %s is less than "
				   "4 KiB", (int)(colon - arg), arg, colon + 1);
	if (rc)
		return opts_errorf(err, errlen, -EINVAL, "memory device %.*s: size \"%s\": %s",
				   (int)(colon - arg), arg, colon + 1, rc == -ERANGE ? "too large" :
				   "expected a number of bytes, with K, M, G or T (KiB, MiB, GiB, TiB)");
	if (size % 4096)
		return opts_errorf(err, errlen, -EINVAL, "memory device %.*s: size %s is not a "
				   "multiple of 4 KiB", (int)(colon - arg), arg, colon + 1);
	n = realloc(g.mem.items, (g.mem.n + 1) * sizeof(*n));
	if (!n)
		return opts_errorf(err, errlen, -ENOMEM, "out of memory");
	n[g.mem.n++] = arg;
	g.mem.items = n;
	return 0;
}

static const struct opt options[] = {
	{ "config", 'c', OPT_CONFIG, &g.config, .arg = "FILE",
	  .help = "read options from FILE first (\"name value\" per line, see below)" },
	{ "addr", 'a', OPT_STRING, &g.addr, .arg = "ADDR", .help = "listen address (default all)" },
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N",
	  .help = "listen port (0: any, printed)" },
	{ "listen-timeout", 0, OPT_UINT, &g.listen_timeout, 0, 31536000, .arg = "SEC",
	  .help = "while the address is missing or the port taken, retry listening every second "
		  "for this long, then exit 1 with the cause (0: for ever; the cause is logged at "
		  "once and every minute)" },
	{ "provider", 0, OPT_STRING, &g.provider, .arg = "NAME",
	  .help = "fabric: tcp (native, io_uring) or verbs (RDMA devices, rdma-core)" },
	{ "dev-search-path", 's', OPT_STRING, &g.search, .arg = "DIR",
	  .help = "export the files and block devices below DIR (none without it); "
		  "%SESSNAME% is the session's name" },
	{ "mem-device", 'm', OPT_CUSTOM, .set = mem_set, .repeat = true, .arg = "NAME:SIZE",
	  .help = "also export SIZE bytes of memory as NAME (repeatable; SIZE a multiple of 4K)" },
	{ "engine", 'e', OPT_CHOICE, &g.engine, .choices = engine_names, .arg = "NAME",
	  .help = "IO engine" },
	{ "threads", 't', OPT_UINT, &g.threads, 1, 256, .arg = "N", .help = "IO pool threads at most, started as requests find none idle" },
	{ "direct", 0, OPT_FLAG, &g.direct, .help = "open files with O_DIRECT (no page cache)" },
	{ "buffered-bdev", 0, OPT_FLAG, &g.buffered_bdev,
	  .help = "serve block devices through the page cache, announcing a write cache and FUA; "
		  "without it they are opened with O_DIRECT and announced with the write cache "
		  "and FUA the device has, as the kernel's rnbd-server does" },
	{ "inline-writes", 0, OPT_FLAG, &g.inline_writes,
	  .help = "write buffered files at once on the receiving thread where the file system "
		  "cannot write with RWF_NOWAIT (ext4)" },
	{ "queue-depth", 'q', OPT_UINT, &g.queue_depth, 1, 65535, .arg = "N",
	  .help = "requests in flight per session" },
	{ "chunk-size", 0, OPT_SIZE, &g.chunk_size, 8192, 128 << 20, .arg = "BYTES", .pow2 = true,
	  .help = "largest request plus its header (a power of two)" },
	{ "invalidate", 0, OPT_FLAG, &g.invalidate,
	  .help = "revoke a chunk's key while its IO is served (always_invalidate)" },
	{ "auth-keys", 0, OPT_STRING, &g.auth_keys, .arg = "FILE",
	  .help = "require DH-HMAC-CHAP; FILE maps host names to secrets" },
	{ "auth-name", 0, OPT_STRING, &g.auth_name, .arg = "NAME",
	  .help = "this server's name in authentication, which clients must be told "
		  "(their --server-name; default rtrs-server)" },
	{ "tls", 0, OPT_CHOICE, &g.tls, .choices = tls_names, .arg = "MODE",
	  .help = "TLS 1.3 with PSKs on tcp: off, offered (a client may) or required (a client "
		  "must); the PSKs are in the --auth-keys file (tls=NVMeTLSkey-1:..., else "
		  "derived from the host's secret)" },
	{ "no-ktls", 0, OPT_FLAG, &g.no_ktls,
	  .help = "keep TLS records in user space where the kernel could take them" },
	{ "qos", 0, OPT_LIST, &g.qos, .arg = "KIND:NAME:LIMITS",
	  .help = "rate limits of a session name, an authenticated host or a device name, "
		  "repeatable: session:hv1:iops=2000, host:NQN:bps=1G or "
		  "device:vm/a.img:read_bps=100M,write_iops=500 "
		  "(iops, read_iops, write_iops, bps, read_bps, write_bps; rnbd server qos at run time)" },
	{ "access", 0, OPT_STRING, &g.access, .arg = "FILE",
	  .help = "which host may use which session names and open which devices in which "
		  "modes (required with --auth-keys; read again on SIGHUP)" },
	{ "hb-interval", 0, OPT_UINT, &g.hb_ms, 10, 600000, .arg = "MS",
	  .help = "heartbeat period" },
	{ "poll-groups", 0, OPT_UINT, &g.poll_groups, 0, RTRS_MAX_POLL_GROUPS, .arg = "N",
	  .help = "threads that serve the connections of the process, per fabric (0: one per CPU)" },
	{ "srq-depth", 0, OPT_UINT, &g.srq_depth, 0, 1u << 20, .arg = "N",
	  .help = "RDMA devices: receives of the queue that a poll group's IO connections on a "
		  "device share (0: each connection posts its own, queue depth + 16)" },
	{ "busy-poll", 0, OPT_UINT, &g.busy_poll_us, 0, 1000000, .arg = "US",
	  .help = "poll an empty completion queue this long before sleeping (RDMA devices)" },
	{ "max-sessions", 0, OPT_UINT, &g.max_sessions, 1, 100000, .arg = "N",
	  .help = "sessions in all; one more is refused (ENOSPC)" },
	{ "max-sessions-per-peer", 0, OPT_UINT, &g.max_sessions_per_peer, 1, 100000, .arg = "N",
	  .help = "sessions of one client address, or with --auth-keys of one host name (those "
		  "still in their handshake counted), and as many paths of that host proven but "
		  "not connected yet" },
	{ "max-devices-per-session", 0, OPT_UINT, &g.max_devs, 1, 65536, .arg = "N",
	  .help = "devices one session may have open at once; one more OPEN is refused "
		  "(EMFILE)" },
	{ "max-chunk-mem", 0, OPT_SIZE, &g.max_chunk_mem, 0, 1ull << 50, .arg = "BYTES",
	  .help = "chunk memory of all sessions, queue depth x chunk size each (0: a quarter "
		  "of this machine's memory)" },
	{ "max-pending", 0, OPT_UINT, &g.max_pending, 1, 100000, .arg = "N",
	  .help = "connections still in their handshake, in all" },
	{ "max-pending-per-peer", 0, OPT_UINT, &g.max_pending_per_peer, 1, 100000, .arg = "N",
	  .help = "connections still in their handshake from one address" },
	{ "handshake-timeout", 0, OPT_UINT, &g.handshake_ms, 100, 600000, .arg = "MS",
	  .help = "close a connection that sends no connection request in MS; a handshake that "
		  "makes no step in a quarter of it may be closed for a newcomer" },
	{ "control", 0, OPT_STRING, &g.control, .arg = "PATH",
	  .help = "serve the management plane (JSON-RPC, the rnbd command) on this Unix socket" },
	{ "metrics", 0, OPT_STRING, &g.metrics, .arg = "HOST:PORT",
	  .help = "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any, printed)" },
	{ "syslog", 0, OPT_FLAG, &g.syslog, .help = "log to syslog (the journal) instead of stderr" },
	{ "quiet", 0, OPT_FLAG, &g.quiet, .help = "log errors only (--log-level error)" },
	{ "log-level", 0, OPT_STRING, &g.log_level, .arg = "LEVEL",
	  .help = "error, warn, info or debug (default: RTRS_LOG_LEVEL, else info)" },
	{ 0 },
};

static struct rnbd_srv *srv;
static struct rpc_server *ctl;
static struct metrics_http *mhttp;
static int log_level = DLOG_INFO;

/* ---- control socket: JSON-RPC (docs/management.md) ----------------------------------- */

/* Set once the server runs: methods called before it answer -EAGAIN. */
static struct rnbd_srv *_Atomic live;

static struct rnbd_srv *live_srv(struct rpc_err *err)
{
	struct rnbd_srv *s = atomic_load(&live);

	if (!s)
		rpc_errf(err, -EAGAIN, "the server is starting");
	return s;
}

static const char *const no_params[] = { NULL };

/* Adds v under key to o; false once anything failed (v is dropped). */
static bool put(struct json_object *o, const char *key, struct json_object *v)
{
	if (!o || !v || json_object_object_add(o, key, v)) {
		json_object_put(v);
		return false;
	}
	return true;
}

/* put, where v NULL means nothing to put. */
static bool put_opt(struct json_object *o, const char *key, struct json_object *v)
{
	return !v || put(o, key, v);
}

struct list_ctx {
	struct json_object *arr;
	/*
	 * server.sessions: every session's device names, by session, from
	 * one listing of the devices (one per session would copy every
	 * device of every session once for each session, under the
	 * server's lock, on each metrics scrape).
	 */
	struct json_object *by_sess;
	bool failed;
};

/* ---- rate limits ---------------------------------------------------------------- */

static const char *const qos_keys[] = { "iops", "read_iops", "write_iops", "bps", "read_bps",
					"write_bps", NULL };

static uint64_t *qos_field(struct rnbd_qos_limits *l, unsigned i)
{
	uint64_t *f[] = { &l->iops, &l->read_iops, &l->write_iops, &l->bps, &l->read_bps,
			  &l->write_bps };

	return f[i];
}

/* {"limits": {...}, "delayed", "queued", "wait_us"} of a name, or NULL (none set, no memory). */
static struct json_object *qos_json(struct rnbd_srv *s, enum rnbd_qos_kind kind, const char *name)
{
	struct rnbd_qos_limits l = { .size = sizeof(l) };
	struct rnbd_qos_stats st = { .size = sizeof(st) };
	struct json_object *o, *lo;
	bool ok;

	if (!name[0] || rnbd_srv_qos_get(s, kind, name, &l, &st))
		return NULL;
	o = json_object_new_object();
	lo = json_object_new_object();
	ok = o && lo;
	for (unsigned i = 0; ok && qos_keys[i]; i++)
		ok = put(lo, qos_keys[i], json_object_new_uint64(*qos_field(&l, i)));
	ok = ok && put(o, "limits", lo);
	lo = NULL;
	ok = ok && put(o, "delayed", json_object_new_uint64(st.delayed)) &&
	     put(o, "queued", json_object_new_uint64(st.queued)) &&
	     put(o, "wait_us", json_object_new_uint64(st.wait_us));
	if (!ok) {
		json_object_put(o);
		json_object_put(lo);
		return NULL;
	}
	return o;
}

static void dev_one(void *priv, const struct rnbd_srv_dev_stats *st)
{
	struct list_ctx *c = priv;
	struct json_object *o;

	if (c->failed)
		return;
	if (c->by_sess) {
		struct json_object *names;

		if (!json_object_object_get_ex(c->by_sess, st->session, &names)) {
			names = json_object_new_array();
			if (!names || json_object_object_add(c->by_sess, st->session, names)) {
				json_object_put(names);
				c->failed = true;
				return;
			}
		}
		if (json_object_array_add(names, json_object_new_string(st->device)))
			c->failed = true;
		return;
	}
	o = json_object_new_object();
	c->failed = !(put(o, "session", json_object_new_string(st->session)) &&
		      put(o, "device", json_object_new_string(st->device)) &&
		      put(o, "id", json_object_new_uint64(st->device_id)) &&
		      put(o, "mode", json_object_new_string(st->mode)) &&
		      put(o, "closed", json_object_new_boolean(st->closed)) &&
		      put(o, "reads", json_object_new_uint64(st->reads)) &&
		      put(o, "read_bytes", json_object_new_uint64(st->read_bytes)) &&
		      put(o, "writes", json_object_new_uint64(st->writes)) &&
		      put(o, "write_bytes", json_object_new_uint64(st->write_bytes)) &&
		      put(o, "other", json_object_new_uint64(st->other)) &&
		      put(o, "errors", json_object_new_uint64(st->errors)) &&
		      put(o, "inflight", json_object_new_uint64(st->inflight)) &&
		      put_opt(o, "qos", qos_json(atomic_load(&live), RNBD_QOS_DEVICE, st->device))) ||
		    json_object_array_add(c->arr, o);
	if (c->failed)
		json_object_put(o);
}

static int m_devices(void *priv, struct json_object *params, struct json_object **result,
		     struct rpc_err *err)
{
	struct list_ctx c = { .arr = json_object_new_array() };
	struct rnbd_srv *s = live_srv(err);
	int rc;

	if (!s || (rc = rpc_params_check(params, no_params, err))) {
		json_object_put(c.arr);
		return s ? rc : -EAGAIN;
	}
	if (!c.arr)
		return -ENOMEM;
	rc = rnbd_srv_list(s, dev_one, &c);
	if (rc < 0 || c.failed) {
		json_object_put(c.arr);
		return rc < 0 ? rc : -ENOMEM;
	}
	*result = c.arr;
	return 0;
}

static void sess_one(void *priv, const struct rtrs_srv_sess_info *si)
{
	struct list_ctx *c = priv;
	struct json_object *o = json_object_new_object(), *paths = json_object_new_array();
	struct list_ctx devs = { 0 };
	bool ok;

	if (c->failed)
		goto drop;
	for (uint32_t i = 0; paths && i < si->paths_num; i++) {
		const struct rtrs_srv_path_info *pi = &si->paths[i];
		struct json_object *po = json_object_new_object();

		ok = put(po, "peer", json_object_new_string(pi->peer)) &&
		     put(po, "local", json_object_new_string(pi->local)) &&
		     put(po, "state", json_object_new_string(pi->state)) &&
		     put(po, "age_ms", json_object_new_uint64(pi->age_ms)) &&
		     put(po, "connections", json_object_new_uint64(pi->cons)) &&
		     put(po, "inflight", json_object_new_uint64(pi->inflight)) &&
		     put(po, "reads", json_object_new_uint64(pi->reads)) &&
		     put(po, "read_bytes", json_object_new_uint64(pi->read_bytes)) &&
		     put(po, "writes", json_object_new_uint64(pi->writes)) &&
		     put(po, "write_bytes", json_object_new_uint64(pi->write_bytes)) &&
		     (!pi->auth_host[0] ||
		      put(po, "auth_host", json_object_new_string(pi->auth_host)));
		if (!ok || json_object_array_add(paths, po)) {
			json_object_put(po);
			c->failed = true;
			goto drop;
		}
	}
	/* Its names from the one listing (shared with it: a reference each). */
	if (!si->name[0] || !json_object_object_get_ex(c->by_sess, si->name, &devs.arr))
		devs.arr = json_object_new_array();
	else
		json_object_get(devs.arr);
	ok = devs.arr && put(o, "name", json_object_new_string(si->name)) &&
	     put(o, "kernel_client", json_object_new_boolean(si->kernel_client)) &&
	     put(o, "always_invalidate", json_object_new_boolean(si->always_invalidate)) &&
	     put(o, "queue_depth", json_object_new_uint64(si->queue_depth)) &&
	     put(o, "chunk_size", json_object_new_uint64(si->chunk_size)) &&
	     put(o, "paths_up", json_object_new_uint64(si->paths_up));
	/* Each put takes its value or drops it: both, whatever came before. */
	ok = put(o, "paths", paths) && ok;
	ok = put(o, "devices", devs.arr) && ok;
	paths = devs.arr = NULL;
	ok = ok && put_opt(o, "qos", qos_json(atomic_load(&live), RNBD_QOS_SESSION, si->name));
	/* Its host's, shared with the host's other sessions. */
	if (ok && si->paths_num && si->paths[0].auth_host[0])
		ok = put(o, "host", json_object_new_string(si->paths[0].auth_host)) &&
		     put_opt(o, "host_qos", qos_json(atomic_load(&live), RNBD_QOS_HOST,
						     si->paths[0].auth_host));
	if (!ok || json_object_array_add(c->arr, o)) {
		c->failed = true;
		goto drop;
	}
	return;
drop:
	json_object_put(o);
	json_object_put(paths);
	json_object_put(devs.arr);
}

static int m_sessions(void *priv, struct json_object *params, struct json_object **result,
		      struct rpc_err *err)
{
	struct list_ctx c = { .arr = json_object_new_array() };
	struct rnbd_srv *s = live_srv(err);
	int rc;

	if (!s || (rc = rpc_params_check(params, no_params, err))) {
		json_object_put(c.arr);
		return s ? rc : -EAGAIN;
	}
	c.by_sess = json_object_new_object();
	if (!c.arr || !c.by_sess) {
		json_object_put(c.arr);
		json_object_put(c.by_sess);
		return -ENOMEM;
	}
	rc = rnbd_srv_list(s, dev_one, &c);
	if (rc >= 0 && !c.failed)
		rc = rtrs_srv_sessions(rnbd_srv_rtrs(s), sess_one, &c);
	json_object_put(c.by_sess);
	if (rc < 0 || c.failed) {
		json_object_put(c.arr);
		return rc < 0 ? rc : -ENOMEM;
	}
	*result = c.arr;
	return 0;
}

static int m_close(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err)
{
	static const char *const names[] = { "session", "device", NULL };
	const char *sess = NULL, *dev = NULL;
	struct rnbd_srv *s = live_srv(err);
	int rc;

	if (!s)
		return -EAGAIN;
	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "session", true, &sess, err)) ||
	    (rc = rpc_param_str(params, "device", true, &dev, err)))
		return rc;
	rc = rnbd_srv_force_close(s, sess, dev);
	dlog(rc ? DLOG_WARN : DLOG_INFO, "control: close %s %s: %s", sess, dev,
		rc ? strerror(-rc) : "done");
	if (rc == -ENOENT)
		return rpc_errf(err, rc, "session %s has no device %s open", sess, dev);
	if (rc == -EINPROGRESS)
		return rpc_errf(err, rc, "device %s of session %s: closed, its IO still in flight "
				"after 1 s (it is released when that IO completes)", dev, sess);
	if (rc)
		return rpc_errf(err, rc, "closing device %s of session %s: %s", dev, sess,
				strerror(-rc));
	*result = json_object_new_object();
	return put(*result, "closed", json_object_new_boolean(true)) ? 0 : -ENOMEM;
}

static int m_stats(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err)
{
	struct rtrs_srv_stats st = { .size = sizeof(st) };
	struct rnbd_srv *s = live_srv(err);
	struct json_object *o;
	int rc;

	if (!s)
		return -EAGAIN;
	if ((rc = rpc_params_check(params, no_params, err)) ||
	    (rc = rtrs_srv_get_stats(rnbd_srv_rtrs(s), &st)))
		return rc;
	o = json_object_new_object();
	if (!(put(o, "connection_requests", json_object_new_uint64(st.connreqs)) &&
	      put(o, "rejects", json_object_new_uint64(st.rejects)) &&
	      put(o, "auth_ok", json_object_new_uint64(st.auth_ok)) &&
	      put(o, "auth_failed", json_object_new_uint64(st.auth_failed)) &&
	      put(o, "auth_timeouts", json_object_new_uint64(st.auth_timeouts)) &&
	      put(o, "key_rotations", json_object_new_uint64(st.key_rotations)) &&
	      put(o, "sessions", json_object_new_uint64(st.sessions)) &&
	      put(o, "chunk_bytes", json_object_new_uint64(st.chunk_bytes)) &&
	      put(o, "pending_evicted", json_object_new_uint64(st.pending_evicted)) &&
	      put(o, "raw_closed", json_object_new_uint64(st.raw_closed)) &&
	      put(o, "limit_refusals", json_object_new_uint64(st.limit_refusals)))) {
		json_object_put(o);
		return -ENOMEM;
	}
	*result = o;
	return 0;
}

/* ---- metrics (Prometheus) ---------------------------------------------------------- */

enum { SRC_STATS, SRC_SESSIONS, SRC_DEVICES, SRC_HOSTS, SRC_NR };

#define STAT(n, t, f, h) { .name = "rnbd_server_" n, .type = t, .help = h, .src = SRC_STATS, \
			   .shape = METRICS_OBJ, .field = f }
/*
 * A path's series: session, and path, the client's address and this
 * server's, without ports ("10.0.0.2@10.0.0.1"): a path reconnecting keeps
 * its series, and two paths of one session from different addresses (or to
 * different ones) have one each (metrics_paths).
 */
#define PATHS(n, t, h) .name = "rnbd_server_path_" n, .type = t, .help = h, \
		       .src = SRC_SESSIONS, .shape = METRICS_NESTED, .nested = "paths", \
		       .labels = { { "session", "name", false }, { "path", "label", true } }
#define PATH(n, t, f, h) { PATHS(n, t, h), .field = f }
#define DEVS(n, t, h) .name = "rnbd_server_device_" n, .type = t, .help = h, \
		      .src = SRC_DEVICES, .shape = METRICS_ARRAY, \
		      .labels = { { "session", "session", false }, { "device", "device", false } }
#define DEV(n, t, f, h) { DEVS(n, t, h), .field = f }

static const struct metrics_def metric_defs[] = {
	STAT("connection_requests_total", "counter", "connection_requests",
	     "RTRS connection requests that arrived"),
	STAT("rejects_total", "counter", "rejects", "connection requests refused at once"),
	STAT("auth_ok_total", "counter", "auth_ok", "paths that authenticated"),
	STAT("auth_failed_total", "counter", "auth_failed", "authentications refused"),
	STAT("auth_timeouts_total", "counter", "auth_timeouts",
	     "paths closed for not authenticating in time"),
	STAT("key_rotations_total", "counter", "key_rotations", "chunk keys registered"),
	STAT("sessions", "gauge", "sessions", "sessions now"),
	STAT("chunk_memory_bytes", "gauge", "chunk_bytes", "chunk memory mapped now"),
	STAT("pending_evicted_total", "counter", "pending_evicted",
	     "pending paths closed to make room for newer ones"),
	STAT("raw_closed_total", "counter", "raw_closed",
	     "TCP connections closed before their request"),
	STAT("limit_refusals_total", "counter", "limit_refusals",
	     "sessions refused for max_sessions or max_chunk_mem"),
	{ PATHS("up", "gauge", "1 while the path is connected"), .field = "state",
	  .match = "connected" },
	PATH("inflight_requests", "gauge", "inflight", "requests with the store or answering now"),
	PATH("reads_total", "counter", "reads", "read requests taken on the path"),
	PATH("read_bytes_total", "counter", "read_bytes", "bytes asked for by reads"),
	PATH("writes_total", "counter", "writes", "write requests taken on the path"),
	PATH("write_bytes_total", "counter", "write_bytes", "bytes written by requests"),
	DEV("reads_total", "counter", "reads", "reads the store completed"),
	DEV("read_bytes_total", "counter", "read_bytes", "bytes the store read"),
	DEV("writes_total", "counter", "writes", "writes the store completed"),
	DEV("write_bytes_total", "counter", "write_bytes", "bytes the store wrote"),
	DEV("other_requests_total", "counter", "other",
	    "flush, discard, secure erase and write zeroes completed"),
	DEV("errors_total", "counter", "errors", "requests the store answered with an error"),
	DEV("inflight_requests", "gauge", "inflight", "requests with the store now"),
	DEV("closed", "gauge", "closed", "1 once force-closed, until its client closes it"),
	DEV("qos_delayed_total", "counter", "qos.delayed",
	    "IOs on the device's name that waited for its rate limits"),
	DEV("qos_queued_requests", "gauge", "qos.queued", "IOs waiting for the device's rate limits now"),
	{ .name = "rnbd_server_session_qos_delayed_total", .type = "counter",
	  .help = "IOs of the session that waited for its rate limits", .src = SRC_SESSIONS,
	  .shape = METRICS_ARRAY, .labels = { { "session", "name", false } },
	  .field = "qos.delayed" },
	{ .name = "rnbd_server_session_qos_queued_requests", .type = "gauge",
	  .help = "IOs of the session waiting for its rate limits now", .src = SRC_SESSIONS,
	  .shape = METRICS_ARRAY, .labels = { { "session", "name", false } },
	  .field = "qos.queued" },
	{ .name = "rnbd_server_host_qos_delayed_total", .type = "counter",
	  .help = "IOs of the host's sessions that waited for its rate limits", .src = SRC_HOSTS,
	  .shape = METRICS_ARRAY, .labels = { { "host", "host", false } },
	  .field = "host_qos.delayed" },
	{ .name = "rnbd_server_host_qos_queued_requests", .type = "gauge",
	  .help = "IOs of the host's sessions waiting for its rate limits now", .src = SRC_HOSTS,
	  .shape = METRICS_ARRAY, .labels = { { "host", "host", false } },
	  .field = "host_qos.queued" },
};

static int m_sessions(void *priv, struct json_object *params, struct json_object **result,
		      struct rpc_err *err);
static int m_devices(void *priv, struct json_object *params, struct json_object **result,
		     struct rpc_err *err);
static int m_stats(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err);

/* "10.0.0.2:41234" or "[fe80::1]:41234": the address alone. */
static void host_of(const char *addr, char *buf, size_t len)
{
	const char *colon = strrchr(addr, ':');
	size_t n = colon ? (size_t)(colon - addr) : strlen(addr);

	if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') {
		addr++;
		n -= 2;
	}
	snprintf(buf, len, "%.*s", (int)n, addr);
}

static const char *jfield(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) && json_object_get_string(v) ?
		       json_object_get_string(v) : "";
}

/*
 * server.sessions as the path series want it: sessions not yet named (a
 * handshake under way) out, and each path's "label": CLIENT@SERVER, the
 * addresses without ports. Two paths of one session between the same two
 * addresses (the client allows it) are told apart by the younger's client
 * port: the older keeps the plain label.
 */
static int metrics_paths(struct json_object *sessions)
{
	for (size_t i = json_object_array_length(sessions); i-- > 0;) {
		struct json_object *so = json_object_array_get_idx(sessions, i), *paths, *v;
		size_t n;

		if (!*jfield(so, "name")) {
			json_object_array_del_idx(sessions, i, 1);
			continue;
		}
		if (!json_object_object_get_ex(so, "paths", &paths))
			continue;
		n = json_object_array_length(paths);
		/* Oldest first, so that an older path's label does not change. */
		for (size_t done = 0; done < n; done++) {
			struct json_object *p = NULL;
			uint64_t age = 0;
			char peer[64], local[64], label[160];
			bool taken = false;

			for (size_t k = 0; k < n; k++) {
				struct json_object *q = json_object_array_get_idx(paths, k);
				uint64_t a = json_object_object_get_ex(q, "age_ms", &v) ?
						     json_object_get_uint64(v) : 0;

				if (!json_object_object_get_ex(q, "label", NULL) && (!p || a > age)) {
					p = q;
					age = a;
				}
			}
			host_of(jfield(p, "peer"), peer, sizeof(peer));
			host_of(jfield(p, "local"), local, sizeof(local));
			snprintf(label, sizeof(label), "%s@%s", peer, local);
			for (size_t k = 0; k < n && !taken; k++) {
				struct json_object *q = json_object_array_get_idx(paths, k);

				taken = json_object_object_get_ex(q, "label", &v) &&
					!strcmp(json_object_get_string(v), label);
			}
			if (taken)
				snprintf(label, sizeof(label), "%s@%s", jfield(p, "peer"), local);
			if (!put(p, "label", json_object_new_string(label)))
				return -ENOMEM;
		}
	}
	return 0;
}

/*
 * The hosts with limits, once each, from server.sessions' rows (the same
 * host_qos object in every session of a host): a new array, or NULL.
 */
static struct json_object *metrics_hosts(struct json_object *sessions)
{
	struct json_object *hosts = json_object_new_array(), *seen = json_object_new_object();

	for (size_t i = 0; hosts && seen && i < json_object_array_length(sessions); i++) {
		struct json_object *so = json_object_array_get_idx(sessions, i), *q;
		const char *host = jfield(so, "host");

		if (!host[0] || !json_object_object_get_ex(so, "host_qos", &q) ||
		    json_object_object_get_ex(seen, host, NULL))
			continue;
		if (!put(seen, host, json_object_new_boolean(true)) ||
		    json_object_array_add(hosts, json_object_get(so))) {
			if (json_object_object_get_ex(seen, host, NULL))
				json_object_put(so); /* the add failed: its reference is ours */
			json_object_put(hosts);
			hosts = NULL;
		}
	}
	json_object_put(seen);
	return hosts;
}

/* The exposition, from what server.stats, server.sessions and server.devices answer. */
static char *metrics_text(void *priv)
{
	struct json_object *srcs[SRC_NR] = { NULL };
	struct rpc_err err;
	char *text = NULL;

	if (!m_stats(NULL, NULL, &srcs[SRC_STATS], &err) &&
	    !m_sessions(NULL, NULL, &srcs[SRC_SESSIONS], &err) &&
	    !metrics_paths(srcs[SRC_SESSIONS]) &&
	    !m_devices(NULL, NULL, &srcs[SRC_DEVICES], &err) &&
	    (srcs[SRC_HOSTS] = metrics_hosts(srcs[SRC_SESSIONS])))
		text = metrics_render(metric_defs, sizeof(metric_defs) / sizeof(metric_defs[0]), srcs,
				      SRC_NR);
	for (int i = 0; i < SRC_NR; i++)
		json_object_put(srcs[i]);
	return text;
}

static int m_metrics(void *priv, struct json_object *params, struct json_object **result,
		     struct rpc_err *err)
{
	char *text;
	int rc;

	if ((rc = rpc_params_check(params, no_params, err)))
		return rc;
	if (!live_srv(err))
		return -EAGAIN;
	text = metrics_text(NULL);
	if (!text)
		return -ENOMEM;
	*result = json_object_new_object();
	rc = put(*result, "text", json_object_new_string(text)) ? 0 : -ENOMEM;
	free(text);
	return rc;
}

/*
 * Rate limits of a session, host or device name: without limits, what is set;
 * with some, those set (the others stay), at once.
 */
static int m_qos(void *priv, struct json_object *params, struct json_object **result,
		 struct rpc_err *err)
{
	static const char *const names[] = { "kind", "name", "iops", "read_iops", "write_iops",
					     "bps", "read_bps", "write_bps", NULL };
	struct rnbd_qos_limits l = { .size = sizeof(l) }, given = { .size = sizeof(given) };
	const char *kstr = NULL, *name = NULL;
	struct rnbd_srv *s = live_srv(err);
	enum rnbd_qos_kind kind;
	bool has[6] = { false };
	bool set = false;
	int rc;

	(void)priv;
	if (!s)
		return -EAGAIN;
	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "kind", true, &kstr, err)) ||
	    (rc = rpc_param_str(params, "name", true, &name, err)))
		return rc;
	for (unsigned i = 0; qos_keys[i]; i++) {
		uint64_t max = i < 3 ? 100000000 : 1ull << 50;

		if (!json_object_object_get_ex(params, qos_keys[i], NULL))
			continue;
		if ((rc = rpc_param_u64(params, qos_keys[i], true, 0, max, qos_field(&given, i),
					err)))
			return rc;
		has[i] = set = true;
	}
	if (!strcmp(kstr, "session"))
		kind = RNBD_QOS_SESSION;
	else if (!strcmp(kstr, "host"))
		kind = RNBD_QOS_HOST;
	else if (!strcmp(kstr, "device"))
		kind = RNBD_QOS_DEVICE;
	else
		return rpc_errf(err, RPC_INVALID_PARAMS, "kind %s: not session, host or device",
				kstr);
	rc = rnbd_srv_qos_get(s, kind, name, &l, NULL);
	if (rc == -EINVAL)
		return rpc_errf(err, RPC_INVALID_PARAMS, "name: not a %s name (empty, or longer "
				"than 255 bytes)", kstr);
	if (rc == -ENOENT && !set)
		return rpc_errf(err, rc, "%s %s has no rate limits", kstr, name);
	for (unsigned i = 0; qos_keys[i]; i++)
		if (has[i])
			*qos_field(&l, i) = *qos_field(&given, i);
	if (set) {
		rc = rnbd_srv_qos_set(s, kind, name, &l);
		if (rc == -EOPNOTSUPP)
			return rpc_errf(err, rc, "host %s: a host's limits need authentication (a "
					"key file): without it a session has no host", name);
		if (rc)
			return rpc_errf(err, rc, "%s %s: %s", kstr, name, strerror(-rc));
		dlog(DLOG_INFO, "control: rate limits of %s %s set", kstr, name);
	}
	*result = qos_json(s, kind, name);
	if (!*result)
		return -ENOMEM;
	return put(*result, "kind", json_object_new_string(kstr)) &&
	       put(*result, "name", json_object_new_string(name)) ? 0 : -ENOMEM;
}

/* The key file read again: revoked hosts' paths closed. */
static int m_keys_reload(void *priv, struct json_object *params, struct json_object **result,
			 struct rpc_err *err)
{
	struct rnbd_srv *s = live_srv(err);
	int rc;

	(void)priv;
	if (!s)
		return -EAGAIN;
	if ((rc = rpc_params_check(params, no_params, err)))
		return rc;
	if (!g.auth_keys)
		return rpc_errf(err, -ENOENT, "no key file (--auth-keys)");
	rc = rnbd_srv_reload_keys(s);
	if (rc < 0)
		return rpc_errf(err, rc, "key file %s: %s (the line is in the log); nobody revoked, "
				"authentications fail until it is fixed", g.auth_keys, strerror(-rc));
	dlog(DLOG_INFO, "control: key file %s reloaded; %d paths of hosts it no longer lists "
	     "closed", g.auth_keys, rc);
	*result = json_object_new_object();
	return put(*result, "paths_closed", json_object_new_int(rc)) ? 0 : -ENOMEM;
}

/* The access file read again; its error, file and line, as the answer. */
static int m_access_reload(void *priv, struct json_object *params, struct json_object **result,
			   struct rpc_err *err)
{
	struct rnbd_srv *s = live_srv(err);
	char why[512];
	int rc;

	(void)priv;
	if (!s)
		return -EAGAIN;
	if ((rc = rpc_params_check(params, no_params, err)))
		return rc;
	/* Asked of the daemon: the library's -ENOENT is also a file that went away. */
	if (!g.access)
		return rpc_errf(err, -ENOENT, "no access file (--access)");
	rc = rnbd_srv_reload_access(s, why, sizeof(why));
	if (rc)
		return rpc_errf(err, rc, "access file %s: nothing new is granted until it is fixed",
				why);
	*result = json_object_new_object();
	return *result ? 0 : -ENOMEM;
}

static const struct rpc_method methods[] = {
	{ "server.sessions", m_sessions, "",
	  "every session: its paths (peer, state, counters) and the devices it has open" },
	{ "server.devices", m_devices, "", "every open device: session, mode, counters" },
	{ "server.close", m_close, "session: string, device: string",
	  "close a device a session has open (its later IO fails with ENOTCONN)" },
	{ "server.stats", m_stats, "",
	  "the transport's counters: connection requests, rejects, authentications, keys" },
	{ "server.qos", m_qos,
	  "kind: string (session, host or device), name: string, iops, read_iops, write_iops, bps, "
	  "read_bps, write_bps: integer (optional)",
	  "a session's or device's rate limits: those given set (0: none), all shown" },
	{ "server.keys.reload", m_keys_reload, "",
	  "read the key file again (as SIGHUP does): every path of a host it no longer lists "
	  "is closed, and that host is refused from then on" },
	{ "server.access.reload", m_access_reload, "",
	  "read the access file again (as SIGHUP does): its error, with file and line, if any" },
	{ "metrics", m_metrics, "", "every counter in Prometheus's text format: {\"text\": ...}" },
};

/* ---- SIGHUP: the key file ------------------------------------------------------------- */

/*
 * librtrs reads the key file at every authentication, so a changed file
 * applies from the next one without anything reloaded; SIGHUP checks the
 * whole file now and says whether it is good, instead of the next host
 * finding out.
 */
static void reload_keys(void)
{
	char why[512];
	int rc;

	if (g.access) {
		rc = rnbd_srv_reload_access(srv, why, sizeof(why));
		if (!rc)
			dlog(DLOG_INFO, "SIGHUP: access file %s read again: it applies to every "
			     "session and open from now on", g.access);
	}

	if (!g.auth_keys) {
		dlog(DLOG_INFO, "SIGHUP: no --auth-keys file, nothing to reload");
		return;
	}
	/* Through librtrs's reader thread: a file that hangs holds up no signal. */
	rc = rnbd_srv_reload_keys(srv);
	if (rc >= 0)
		dlog(DLOG_INFO, "SIGHUP: key file %s reloaded: valid; live paths of hosts whose keys "
			"changed authenticate again; %d paths of hosts it no longer lists closed",
		     g.auth_keys, rc);
	else
		dlog(DLOG_ERR, "SIGHUP: key file %s: %s (the line is logged above); "
			"authentications fail until it is fixed", g.auth_keys, strerror(-rc));
}

/*
 * The main thread serves the control socket and the metrics (rpc_serve,
 * no thread of their own) and, beside them, these: signals, and until the
 * server listens, the wait for it.
 */
enum { MAIN_SIGNAL = 1, MAIN_NOT_LISTENING };
struct main_state {
	int sfd;                 /* signalfd: SIGINT, SIGTERM, SIGHUP */
	int sig;                 /* the one that ended it */
	int port;                /* 0 until listening */
	int listen_err;          /* MAIN_NOT_LISTENING: why */
	uint64_t t0, next_note;
};

/* SIGHUP checks the keys; SIGINT and SIGTERM end rpc_serve. */
static int signal_fn(void *priv, bool readable)
{
	struct main_state *m = priv;
	struct signalfd_siginfo si;

	if (!readable)
		return 0;
	while (read(m->sfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			reload_keys();
			continue;
		}
		m->sig = (int)si.ssi_signo;
		return MAIN_SIGNAL;
	}
	return 0;
}

/* Until the server listens: asked every 50 ms. */
static int listen_prepare(void *priv)
{
	return ((struct main_state *)priv)->port ? -1 : 50;
}

/*
 * Listening: the port printed, the server live for the control socket and
 * the metrics. Not after --listen-timeout: MAIN_NOT_LISTENING, with why.
 */
static int listen_fn(void *priv, bool readable)
{
	struct main_state *m = priv;
	int rc;

	(void)readable;
	if (m->port)
		return 0;
	rc = rnbd_srv_port(srv, 0);
	if (rc >= 0) {
		m->port = rc;
		atomic_store(&live, srv);
		if (mhttp)
			printf("rnbd-server metrics on port %u\n", metrics_http_port(mhttp));
		printf("rnbd-server listening on port %d\n", rc);
		fflush(stdout);
		return 0;
	}
	if (g.listen_timeout && now_ms() - m->t0 >= g.listen_timeout * 1000) {
		m->listen_err = rc;
		return MAIN_NOT_LISTENING;
	}
	if (rc != -ETIMEDOUT && now_ms() >= m->next_note) {
		dlog(DLOG_WARN, "still not listening on %s:%" PRIu64 " after %" PRIu64 " s: %s; "
		     "retrying %s", g.addr ? g.addr : "0.0.0.0", g.port,
		     (now_ms() - m->t0) / 1000, strerror(-rc),
		     g.listen_timeout ? "until --listen-timeout" : "for ever (--listen-timeout 0)");
		m->next_note += 60000;
	}
	return 0;
}

/* "a:1,b:2" from the repeated --mem-device values. */
static char *join_mem(void)
{
	size_t len = 1;
	char *s;

	for (unsigned i = 0; i < g.mem.n; i++)
		len += strlen(g.mem.items[i]) + 1;
	s = calloc(1, len);
	for (unsigned i = 0; s && i < g.mem.n; i++) {
		if (i)
			strcat(s, ",");
		strcat(s, g.mem.items[i]);
	}
	return s;
}

/*
 * The options that can be checked alone, before anything starts: a mistake
 * here is a usage error (exit 2), said with the option. What only librnbd
 * can check (memory devices, the key file's lines, queue depth with chunk
 * size) it refuses with -EINVAL (-ENOKEY for a key file without a host),
 * also before anything listens.
 */
/* "FILE:LINE: NAME" for a value from a config file, else "--NAME" (opts_name_of). */
static const char *origin(const char *name, const char *value)
{
	static char buf[4400];

	return opts_name_of(name, value, buf, sizeof(buf));
}

/*
 * A listen address written as numbers must be one: "10.0.0.300" or
 * "fe80::1::2" is a typo that retrying would never cure. A name is left to
 * the listener, which retries while it does not resolve (DNS may come up
 * after the server), and so is an IPv6 address's scope: "fe80::1%eth1"
 * names an interface that may come up later; the address before it is
 * checked. A name must be one that could resolve: labels of letters,
 * digits, '-' and '_' (RFC 1123, with the underscore some sites use), of at
 * most 63 bytes, 253 in all ("10.0.0.1 10.0.0.2", two addresses on one
 * line, never resolves: the listener would retry for ever).
 */
static int host_name_check(const char *name, char *why, size_t len)
{
	size_t n = strlen(name), label = 0;

	if (n > 253) {
		snprintf(why, len, "not an IPv4 or IPv6 address, and too long for a host name");
		return -EINVAL;
	}
	for (size_t i = 0; i <= n; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (ch == '.' || !ch) {
			if (!label && (ch || i == 0)) {
				snprintf(why, len, "not an IPv4 or IPv6 address, and not a host name "
					 "(an empty label)");
				return -EINVAL;
			}
			label = 0;
			continue;
		}
		if (!isalnum(ch) && ch != '-' && ch != '_') {
			snprintf(why, len, "not an IPv4 or IPv6 address, and not a host name (%s at "
				 "byte %zu)", ch == ' ' || ch == '\t' ? "a blank" : "a character a "
				 "host name does not have", i + 1);
			return -EINVAL;
		}
		if (++label > 63) {
			snprintf(why, len, "not an IPv4 or IPv6 address, and not a host name (a "
				 "label over 63 bytes)");
			return -EINVAL;
		}
	}
	return 0;
}

static int listen_addr_check(const char *addr, char *why, size_t len)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICHOST }, *res;
	bool numeric = !*addr || strchr(addr, ':') || strspn(addr, "0123456789.") == strlen(addr);
	const char *scope = strchr(addr, '%');
	char bare[INET6_ADDRSTRLEN + 1];
	int rc;

	if (!numeric)
		return host_name_check(addr, why, len);
	if (scope) {
		if ((size_t)(scope - addr) >= sizeof(bare)) {
			snprintf(why, len, "not an IPv4 or IPv6 address (too long)");
			return -EINVAL;
		}
		snprintf(bare, sizeof(bare), "%.*s", (int)(scope - addr), addr);
		addr = bare;
	}
	rc = getaddrinfo(addr, NULL, &hints, &res);
	if (rc) {
		snprintf(why, len, "not an IPv4 or IPv6 address (%s)", gai_strerror(rc));
		return -EINVAL;
	}
	freeaddrinfo(res);
	return 0;
}

/*
 * The options parsing could not check alone, or only together; each error
 * names the option as the parser does: its config file's line, or --NAME.
 */
static int check_options(void)
{
	struct stat st;
	char why[4200];
	const char *bad;
	int rc;

	if (!opts_provider_valid(g.provider)) {
		fprintf(stderr, "rnbd-server: %s %s: expected tcp, verbs or rdma\n",
			origin("provider", g.provider), g.provider);
		return -EINVAL;
	}
	if (g.metrics && metrics_addr_check(g.metrics, why, sizeof(why))) {
		fprintf(stderr, "rnbd-server: %s %s\n", origin("metrics", g.metrics), why);
		return -EINVAL;
	}
	for (unsigned i = 0; i < g.qos.n; i++) {
		struct rnbd_qos_limits l;
		enum rnbd_qos_kind kind;
		const char *cause = NULL;
		char name[256];

		if (rnbd_qos_parse(g.qos.items[i], &kind, name, sizeof(name), &l, &cause)) {
			fprintf(stderr, "rnbd-server: %s %s: %s\n", origin("qos", g.qos.items[i]),
				g.qos.items[i], cause ? cause : "not a rate limit");
			return -EINVAL;
		}
		if (kind == RNBD_QOS_HOST && !g.auth_keys) {
			fprintf(stderr, "rnbd-server: %s %s: a host's limits need authentication "
				"(--auth-keys): without it a session has no host\n",
				origin("qos", g.qos.items[i]), g.qos.items[i]);
			return -EINVAL;
		}
		/* One line a name: a second would silently replace the first's limits. */
		for (unsigned j = 0; j < i; j++) {
			struct rnbd_qos_limits el;
			enum rnbd_qos_kind ekind;
			char ename[256], first[4400];

			if (rnbd_qos_parse(g.qos.items[j], &ekind, ename, sizeof(ename), &el, &cause) ||
			    ekind != kind || strcmp(ename, name))
				continue;
			snprintf(first, sizeof(first), "%s", origin("qos", g.qos.items[j]));
			fprintf(stderr, "rnbd-server: %s %s: %s %s has its limits already (%s); "
				"give all of its limits in one line\n", origin("qos", g.qos.items[i]),
				g.qos.items[i],
				kind == RNBD_QOS_DEVICE ? "device" :
				kind == RNBD_QOS_HOST ? "host" : "session", name,
				first);
			return -EINVAL;
		}
	}
	if (g.addr && (rc = listen_addr_check(g.addr, why, sizeof(why)))) {
		fprintf(stderr, "rnbd-server: %s %s: %s\n", origin("addr", g.addr), g.addr, why);
		return rc;
	}
	if (g.search && (rc = rnbd_search_path_check(g.search, why, sizeof(why)))) {
		fprintf(stderr, "rnbd-server: %s %s: %s\n", origin("dev-search-path", g.search),
			g.search, why);
		return -EINVAL;
	}
	if (g.auth_name && rtrs_auth_name_check(g.auth_name, &bad)) {
		fprintf(stderr, "rnbd-server: %s %s: %s\n", origin("auth-name", g.auth_name),
			g.auth_name, bad);
		return -EINVAL;
	}
	if (g.auth_keys && stat(g.auth_keys, &st)) {
		fprintf(stderr, "rnbd-server: %s %s: %s\n", origin("auth-keys", g.auth_keys),
			g.auth_keys, strerror(errno));
		return -EINVAL;
	}
	if (g.auth_keys && !S_ISREG(st.st_mode)) {
		fprintf(stderr, "rnbd-server: %s %s: not a regular file\n",
			origin("auth-keys", g.auth_keys), g.auth_keys);
		return -EINVAL;
	}
	if (g.auth_keys && !g.access) {
		fprintf(stderr, "rnbd-server: %s needs --access FILE: which host may use "
			"which session names and open which devices (docs/security.md section 2.6; "
			"the line \"* sessions=* migration=*\" grants every authenticated host "
			"everything)\n", origin("auth-keys", g.auth_keys));
		return -EINVAL;
	}
	if (g.tls && !g.auth_keys) {
		fprintf(stderr, "rnbd-server: --tls %s needs --auth-keys FILE: it holds the PSKs "
			"(docs/security.md section 9)\n", tls_names[g.tls]);
		return -EINVAL;
	}
	if (g.tls && strcmp(g.provider, "tcp")) {
		fprintf(stderr, "rnbd-server: --tls is for the tcp provider, not %s (%s)\n",
			g.provider, origin("provider", g.provider));
		return -EINVAL;
	}
	if (g.access && !g.auth_keys) {
		fprintf(stderr, "rnbd-server: %s %s names hosts by their authentication: it "
			"needs --auth-keys\n", origin("access", g.access), g.access);
		return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct rnbd_srv_opts o;
	struct main_state m = { .sfd = -1 };
	struct rpc_watch w[3];
	size_t nw = 0;
	sigset_t set;
	char *mem = NULL;
	const char **qos_specs = NULL;
	int pos, rc;

	/*
	 * Signals first: blocked here, so that every thread made later blocks
	 * them too, and taken from a signalfd on this thread. SIGINT and SIGTERM
	 * get their default action back, whatever a library's constructor
	 * installed for them.
	 */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	rc = opts_parse(options, "rnbd-server", "[options]", argc, argv, &pos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (pos < argc) {
		fprintf(stderr, "rnbd-server: unexpected argument \"%s\" (see --help)\n", argv[pos]);
		return 2;
	}
	/* --log-level, then --quiet, then RTRS_LOG_LEVEL, then info. */
	log_level = opts_log_level("rnbd-server",
				   g.log_level ? origin("log-level", g.log_level) : "--quiet",
				   g.log_level ? g.log_level : g.quiet ? "error" : NULL,
				   getenv("RTRS_LOG_LEVEL"), DLOG_INFO);
	if (log_level < 0 || check_options())
		return 2;
	dlog_init("rnbd-server", log_level, g.syslog);
	rnbd_set_log_level(log_level);
	rnbd_set_log_fn(dlog_sink, NULL);
	if (g.mem.n && !(mem = join_mem()))
		return 1;
	/* The rate limits as librnbd takes them: NULL-terminated. */
	if (g.qos.n && !(qos_specs = calloc(g.qos.n + 1, sizeof(*qos_specs))))
		return 1;
	for (unsigned i = 0; i < g.qos.n; i++)
		qos_specs[i] = g.qos.items[i];
	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = g.addr;
	o.rtrs.port = (uint16_t)g.port;
	o.rtrs.provider = g.provider;
	o.rtrs.queue_depth = (uint32_t)g.queue_depth;
	o.rtrs.max_chunk_size = (uint32_t)g.chunk_size;
	o.rtrs.always_invalidate = g.invalidate;
	o.rtrs.auth_keys_file = g.auth_keys;
	o.rtrs.auth_name = g.auth_name;
	o.rtrs.tls = (enum rtrs_tls_mode)g.tls;
	o.rtrs.tls_no_ktls = g.no_ktls;
	o.access_file = g.access;
	o.qos = qos_specs;
	o.rtrs.hb_interval_ms = (unsigned)g.hb_ms;
	o.rtrs.busy_poll_us = (unsigned)g.busy_poll_us;
	o.rtrs.srq_depth = (unsigned)g.srq_depth;
	o.rtrs.no_srq = !g.srq_depth;
	o.rtrs.poll_groups = (unsigned)g.poll_groups;
	o.rtrs.max_sessions = (unsigned)g.max_sessions;
	o.rtrs.max_sessions_per_peer = (unsigned)g.max_sessions_per_peer;
	o.rtrs.max_chunk_mem = g.max_chunk_mem;
	o.rtrs.max_pending = (unsigned)g.max_pending;
	o.rtrs.max_pending_per_peer = (unsigned)g.max_pending_per_peer;
	o.rtrs.handshake_timeout_ms = (unsigned)g.handshake_ms;
	o.dev_search_path = g.search;
	o.mem_devices = mem;
	o.engine = engine_names[g.engine];
	o.engine_threads = (unsigned)g.threads;
	o.direct = g.direct;
	o.buffered_bdev = g.buffered_bdev;
	o.inline_writes = g.inline_writes;
	o.max_devs_per_session = (unsigned)g.max_devs;

	/* A control client that leaves early must not kill the server with SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);

	/* The control socket and metrics first: a bad path fails before anyone connects. */
	if (g.control && (rc = rpc_server_start_flags(g.control, "rnbd-server control", methods,
						     sizeof(methods) / sizeof(methods[0]), NULL,
						     RPC_SERVER_CALLER, &ctl))) {
		fprintf(stderr, "rnbd-server: %s %s: %s\n", origin("control", g.control), g.control,
			rc == -EEXIST ? "exists and is not a socket; not replacing it" :
			rc == -EADDRINUSE ? "another server answers on this socket" : strerror(-rc));
		free(mem);
		free(qos_specs);
		return 1;
	}
	if (g.metrics) {
		char why[256];

		/* Scrapes answer 500 until the server runs (live). */
		rc = metrics_http_start_flags(g.metrics, metrics_text, NULL, METRICS_HTTP_CALLER,
					      &mhttp, why, sizeof(why));
		if (rc) {
			fprintf(stderr, "rnbd-server: %s %s\n", origin("metrics", g.metrics), why);
			goto fail;
		}
	}
	rc = rnbd_srv_open(&o, &srv);
	if (rc) {
		/* An option librnbd refused (it said which): a usage error, as above. */
		bool usage = rc == -EINVAL || rc == -ENOKEY;

		fprintf(stderr, "rnbd-server: cannot start: %s\n",
			usage ? "the configuration was refused (the error above says why)" :
			strerror(-rc));
		metrics_http_stop(mhttp);
		rpc_server_stop(ctl);
		free(mem);
		free(qos_specs);
		return usage ? 2 : 1;
	}
	m.t0 = now_ms();
	m.next_note = m.t0 + 60000;
	m.sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (m.sfd < 0) {
		fprintf(stderr, "rnbd-server: signalfd: %s\n", strerror(errno));
		rnbd_srv_close(srv);
		goto fail;
	}
	w[nw++] = (struct rpc_watch){ .fd = m.sfd, .fn = signal_fn, .priv = &m };
	w[nw++] = (struct rpc_watch){ .fd = -1, .prepare = listen_prepare, .fn = listen_fn,
				      .priv = &m };
	if (mhttp)
		metrics_http_watch(mhttp, &w[nw++]);
	rc = rpc_serve(ctl, w, nw);
	close(m.sfd);
	if (rc == MAIN_NOT_LISTENING) {
		fprintf(stderr, "rnbd-server: not listening on %s:%" PRIu64 " after %" PRIu64 " s "
			"(--listen-timeout): %s\n", g.addr ? g.addr : "0.0.0.0", g.port,
			g.listen_timeout, strerror(-m.listen_err));
		rnbd_srv_close(srv);
		goto fail;
	}
	if (rc < 0) {
		fprintf(stderr, "rnbd-server: serving the control socket and signals: %s\n",
			strerror(-rc));
		atomic_store(&live, NULL);
		rnbd_srv_close(srv);
		goto fail;
	}
	dlog(DLOG_INFO, "%s%s, stopping", strsignal(m.sig), m.port ? "" : " before listening");
	metrics_http_stop(mhttp);
	rpc_server_stop(ctl);
	atomic_store(&live, NULL);
	rnbd_srv_close(srv);
	free(mem);
	free(qos_specs);
	return 0;
fail:
	metrics_http_stop(mhttp);
	rpc_server_stop(ctl);
	free(mem);
	free(qos_specs);
	return 1;
}
