/* SPDX-License-Identifier: MIT */
/*
 * rtrs-perf: transport benchmark.
 *
 *   rtrs-perf server [options]            answer every IO at once
 *   rtrs-perf client --server HOST[:PORT]  keep --queue-depth IOs in flight
 *                                         (--server again for more paths,
 *                                         [SRC@]HOST[:PORT] to pick a source)
 *
 * The client prints op/s, GB/s and latency percentiles (or --json).
 * With --verify, writes carry a pattern the server checks and reads return
 * a pattern the client checks, so the numbers are for verified bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clt-opts.h"
#include "hist.h"
#include "jsonout.h"
#include "rtrs.h"
#include "opts.h"
#include "util.h"

static const char *const mode_names[] = { "write", "read", NULL };

#define RTRS_PERF_MAX_PATHS 16

static struct {
	const char *addr, *auth_keys;
	struct opt_list events;
	uint64_t port, queue_depth, chunk_size, io_size, duration, sessions;
	uint64_t max_sessions, max_sessions_per_peer, hold, srq_depth;
	unsigned mode;
	bool json, verify, quiet, no_invalidate, no_ktls;
} g = {
	.port = RTRS_DEFAULT_PORT, .queue_depth = 64, .chunk_size = RTRS_DEFAULT_CHUNK_SIZE,
	.io_size = 4096, .duration = 5, .sessions = 1, .srq_depth = RTRS_DEFAULT_SRQ_DEPTH,
};

/*
 * The session options (lib/front/clt-opts.c), which the server takes its
 * provider, heartbeat interval and authentication name from as well.
 */
static struct clt_cfg cfg;

static const struct clt_opt_pick clt_picks[] = {
	{ CLT_OPT_SERVER, 'd', "client: a path to the server (repeat for more paths); "
	  "SRC@ picks the local address" },
	{ CLT_OPT_POLICY, 'P', "client: multipath policy: round-robin, min-inflight or "
	  "min-latency" },
	{ CLT_OPT_FAST_IO_FAIL, 0, "client: how long IO waits for a path" },
	{ CLT_OPT_BUSY_POLL, 0,
	  "poll an empty completion queue this long before sleeping (RDMA devices)" },
	{ CLT_OPT_POLL_GROUPS, 0, "threads that serve the connections of the process, per fabric (0: one per CPU)" },
	{ CLT_OPT_RECONNECT_DELAY, 0, "client: delay before reconnecting a failed path" },
	{ CLT_OPT_RECONNECT_JITTER, 0, "client: add a random 0..MS to each reconnect delay; "
	  "unless given, half the delay" },
	{ CLT_OPT_LOSS_TIMEOUT, 0, "client: give a path up after failing to reconnect for "
	  "this long (0: never)" },
	{ CLT_OPT_MAX_RECONNECTS, 0, "client: give a path up after N failed reconnects in "
	  "a row (-1: never)" },
	{ .id = CLT_OPT_PROVIDER },
	{ CLT_OPT_IO_CONS, 'n', "client: IO connections (0 = one per CPU)" },
	{ .id = CLT_OPT_HB_INTERVAL },
	{ CLT_OPT_SESSION, 0, "client: session name" },
	{ CLT_OPT_SECRET, 0, "client: this host's DH-HMAC-CHAP secret" },
	{ CLT_OPT_CTRL_SECRET, 0, "client: authenticate the server too, with this secret" },
	{ CLT_OPT_HOST_NAME, 0, "client: host name for authentication (default: "
	  "/etc/nvme/hostnqn)" },
	{ CLT_OPT_SERVER_NAME, 0, "server's name for authentication (default rtrs-server)" },
	{ CLT_OPT_TLS, 0, "TLS 1.3 with a PSK: client off, required or concat; server off, "
	  "offered or required (its PSKs are in --auth-keys)" },
	{ CLT_OPT_TLS_KEY, 0, "client: the TLS PSK (NVMeTLSkey-1:...; default: derived from "
	  "--secret)" },
	{ CLT_OPT_LOG_LEVEL, 0, "error, warn, info or debug (default: RTRS_LOG_LEVEL, "
	  "else warn)" },
};

static const struct opt own_options[] = {
	{ "addr", 'a', OPT_STRING, &g.addr, .arg = "ADDR", .help = "server: listen address" },
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N",
	  .help = "server: listen port (0 = any, printed); client: port of a --server without :PORT" },
	{ "event", 'e', OPT_LIST, &g.events, .arg = "SEC:ACTION:ARG",
	  .help = "client: during the run, at SEC seconds: remove:IDX, add:[SRC@]HOST:PORT, "
		  "or cut:IDX (fail the path; it reconnects)" },
	{ "mode", 'm', OPT_CHOICE, &g.mode, .choices = mode_names, .arg = "MODE",
	  .help = "client: IO direction" },
	{ "io-size", 's', OPT_SIZE, &g.io_size, 1, 128u << 20, .arg = "SIZE",
	  .help = "client: bytes per IO" },
	{ "queue-depth", 'q', OPT_UINT, &g.queue_depth, 1, 65535, .arg = "N",
	  .help = "client: IOs in flight; server: chunks per session" },
	{ "chunk-size", 'c', OPT_SIZE, &g.chunk_size, 8192, 128u << 20, .arg = "SIZE", .pow2 = true,
	  .help = "server: chunk size (power of two)" },
	{ "duration", 't', OPT_UINT, &g.duration, 1, 86400, .arg = "SEC",
	  .help = "client: seconds to run" },
	{ "sessions", 0, OPT_UINT, &g.sessions, 1, 10000, .arg = "N",
	  .help = "client: hold N sessions (NAME-1 .. NAME-N), opened all at once; the "
		  "queue depth is spread over them, each IO moving to the next session" },
	{ "verify", 'V', OPT_FLAG, &g.verify,
	  .help = "client: check every byte moved (the server follows)" },
	{ "no-invalidate", 0, OPT_FLAG, &g.no_invalidate,
	  .help = "server: keep chunk keys (always_invalidate off)" },
	{ "auth-keys", 0, OPT_STRING, &g.auth_keys, .arg = "FILE",
	  .help = "server: require DH-HMAC-CHAP; FILE lists \"HOST SECRET [CTRL-SECRET]\"" },
	{ "json", 'j', OPT_FLAG, &g.json, .help = "client: print one JSON object" },
	{ "no-ktls", 0, OPT_FLAG, &g.no_ktls,
	  .help = "TLS records in user space even where the kernel has TLS (for measurements)" },
	{ "quiet", 0, OPT_FLAG, &g.quiet, .help = "server: no banner" },
	{ "hold", 0, OPT_UINT, &g.hold, 0, 86400, .arg = "SEC",
	  .help = "client: keep the session(s) open and idle this long after the run (as with "
		  "--sessions)" },
	{ "max-sessions", 0, OPT_UINT, &g.max_sessions, 1, 100000, .arg = "N",
	  .help = "server: sessions in all (default: the library's)" },
	{ "srq-depth", 0, OPT_UINT, &g.srq_depth, 0, 1u << 20, .arg = "N",
	  .help = "server, RDMA devices: receives of the queue that a poll group's IO connections "
		  "on a device share (0: each connection posts its own)" },
	{ "max-sessions-per-peer", 0, OPT_UINT, &g.max_sessions_per_peer, 1, 100000, .arg = "N",
	  .help = "server: sessions of one address (default: the library's)" },
	{ 0 },
};

/* The user header of every IO: what the pattern derives from. */
struct perf_hdr {
	uint64_t seq;
	uint32_t len;
	uint16_t magic;
	uint16_t flags;
};
#define PERF_F_VERIFY 1
#define PERF_MAGIC 0x5254u

static uint8_t pattern_byte(uint64_t seq, size_t i)
{
	uint64_t x = seq * 0x9E3779B97F4A7C15ull + i;

	return (uint8_t)(x ^ (x >> 29) ^ (x >> 47));
}

static void pattern_fill(uint8_t *buf, size_t len, uint64_t seq)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern_byte(seq, i);
}

static bool pattern_check(const uint8_t *buf, size_t len, uint64_t seq)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pattern_byte(seq, i))
			return false;
	return true;
}

/* ---- server ---------------------------------------------------------------- */

static atomic_uint_fast64_t srv_bad;

static int srv_rdma_ev(void *priv, struct rtrs_srv_op *id, enum rtrs_dir dir, void *data,
		       size_t datalen, const void *usr, size_t usrlen)
{
	struct perf_hdr h;

	if (usrlen != sizeof(h))
		return -EBADMSG;
	memcpy(&h, usr, sizeof(h));
	if (h.magic != PERF_MAGIC || h.len != datalen)
		return -EBADMSG;
	/* The client asks for verification; the server follows. */
	if (h.flags & PERF_F_VERIFY) {
		if (dir == RTRS_WRITE && !pattern_check(data, datalen, h.seq)) {
			atomic_fetch_add(&srv_bad, 1);
			return -EILSEQ;
		}
		if (dir == RTRS_READ)
			pattern_fill(data, datalen, h.seq);
	}
	rtrs_srv_resp_rdma(id, 0);
	return 0;
}

static int run_server(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_srv_opts o;
	struct rtrs_srv_ctx *ctx;
	sigset_t set;
	int rc, sig;

	rtrs_srv_opts_init(&o, sizeof(o));
	o.addr = g.addr;
	o.port = (uint16_t)g.port;
	o.provider = cfg.opts.provider;
	o.queue_depth = (uint32_t)g.queue_depth;
	o.max_chunk_size = (uint32_t)g.chunk_size;
	o.hb_interval_ms = cfg.opts.hb_interval_ms;
	o.always_invalidate = !g.no_invalidate;
	o.busy_poll_us = cfg.opts.busy_poll_us;
	o.poll_groups = cfg.opts.poll_groups;
	o.srq_depth = (unsigned)g.srq_depth;
	o.no_srq = !g.srq_depth;
	o.auth_keys_file = g.auth_keys;
	o.auth_name = cfg.opts.auth_server_name;
	o.tls = cfg.opts.tls;
	o.tls_no_ktls = g.no_ktls;
	o.max_sessions = (unsigned)g.max_sessions;
	o.max_sessions_per_peer = (unsigned)g.max_sessions_per_peer;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	rc = rtrs_srv_open(&ops, &o, &ctx);
	if (rc) {
		fprintf(stderr, "rtrs-perf: server: %s\n", strerror(-rc));
		return 1;
	}
	rc = rtrs_srv_wait_listening(ctx, 60000);
	if (rc) {
		fprintf(stderr, "rtrs-perf: server: not listening after 60 s\n");
		rtrs_srv_close(ctx);
		return 1;
	}
	printf("rtrs-perf server listening on port %d\n", rtrs_srv_get_port(ctx));
	fflush(stdout);
	sigwait(&set, &sig);
	rtrs_srv_close(ctx);
	if (!g.quiet)
		printf("rtrs-perf server: stopped (%" PRIuFAST64 " bad writes)\n",
		       atomic_load(&srv_bad));
	return atomic_load(&srv_bad) ? 1 : 0;
}

/* ---- client ------------------------------------------------------------------ */

static struct hist hist;

struct perf_io {
	struct rtrs_clt_sess *sess;
	unsigned si;                /* the session's index (--sessions) */
	struct rtrs_permit *permit;
	uint8_t *buf;
	struct perf_hdr hdr;
	uint64_t start_ns;
	struct rtrs_clt_req_ops ops;
};

static atomic_uint_fast64_t ops_done, ops_err, ops_bad, seq_next;
static struct rtrs_clt_sess **sessions; /* g.sessions of them */
static atomic_uint rot_next;
static atomic_uint active;
static atomic_bool stopping;
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static int first_err;

/* start_ns: when it is sent; a completion passes its own clock reading on. */
static int io_submit(struct perf_io *io, uint64_t start_ns)
{
	struct iovec usr = { &io->hdr, sizeof(io->hdr) };
	struct iovec data = { io->buf, g.io_size };
	enum rtrs_dir dir = g.mode == 0 ? RTRS_WRITE : RTRS_READ;

	io->hdr.seq = atomic_fetch_add(&seq_next, 1);
	io->hdr.len = (uint32_t)g.io_size;
	io->hdr.magic = PERF_MAGIC;
	io->hdr.flags = g.verify ? PERF_F_VERIFY : 0;
	if (g.verify) {
		if (dir == RTRS_WRITE)
			pattern_fill(io->buf, g.io_size, io->hdr.seq);
		else
			memset(io->buf, 0, g.io_size);
	}
	io->start_ns = start_ns;
	return rtrs_clt_request(io->sess, dir, &io->ops, io->permit, &usr, 1, &data, 1);
}

static void io_retire(void)
{
	if (atomic_fetch_sub(&active, 1) == 1) {
		pthread_mutex_lock(&done_lock);
		pthread_cond_broadcast(&done_cond);
		pthread_mutex_unlock(&done_lock);
	}
}

static void io_conf(void *priv, int err)
{
	struct perf_io *io = priv;
	uint64_t now;
	int rc;

	if (err) {
		if (atomic_fetch_add(&ops_err, 1) == 0)
			first_err = err;
		atomic_store(&stopping, true);
		io_retire();
		return;
	}
	if (g.verify && g.mode == 1 && !pattern_check(io->buf, g.io_size, io->hdr.seq))
		atomic_fetch_add(&ops_bad, 1);
	now = now_ns(); /* the end of this IO and the start of the next: one reading */
	hist_add(&hist, (now - io->start_ns) / 1000);
	atomic_fetch_add_explicit(&ops_done, 1, memory_order_relaxed);
	if (atomic_load_explicit(&stopping, memory_order_relaxed)) {
		io_retire();
		return;
	}
	if (g.sessions > 1) {
		/* On to the next session, if it has a permit free; else where it was. */
		unsigned si = atomic_fetch_add(&rot_next, 1) % (unsigned)g.sessions;
		struct rtrs_permit *pm = si == io->si ? NULL :
			rtrs_clt_get_permit(sessions[si], RTRS_IO_CON, RTRS_PERMIT_NOWAIT);

		if (pm) {
			rtrs_clt_put_permit(io->sess, io->permit);
			io->permit = pm;
			io->sess = sessions[si];
			io->si = si;
		}
	}
	rc = io_submit(io, now);
	if (rc) {
		if (atomic_fetch_add(&ops_err, 1) == 0)
			first_err = rc;
		atomic_store(&stopping, true);
		io_retire();
	}
}

/* An --event, checked before the run starts. */
struct perf_event {
	uint64_t ms;                /* into the run */
	const char *action;         /* "remove", "cut", "add" */
	const char *arg;            /* as given */
	unsigned idx;               /* remove, cut: the path */
	struct rtrs_addr addr;      /* add */
	bool done;
};

static struct perf_event *events;

/*
 * The --event entries, each "SEC:ACTION:ARG": SEC within the run, ACTION
 * remove or cut with a path index, or add with an address. 0, or -EINVAL
 * after saying which entry and why (before anything starts).
 */
static int events_parse(void)
{
	events = calloc(g.events.n + 1, sizeof(*events));
	if (!events) {
		fprintf(stderr, "rtrs-perf: out of memory\n");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < g.events.n; i++) {
		struct perf_event *e = &events[i];
		const char *spec = g.events.items[i], *c1, *c2;
		char action[16], why[256];
		uint64_t idx;
		double sec;
		char *end;

		c1 = strchr(spec, ':');
		c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2 || c1 == spec || c2 == c1 + 1 || !c2[1]) {
			fprintf(stderr, "rtrs-perf: --event %s: expected SEC:ACTION:ARG\n", spec);
			return -EINVAL;
		}
		errno = 0;
		sec = strtod(spec, &end);
		if (end != c1 || errno || !(sec >= 0) || sec >= (double)g.duration) {
			fprintf(stderr, "rtrs-perf: --event %s: SEC must be a number of seconds, at least "
				"0 and less than the run's --duration %" PRIu64 "\n", spec, g.duration);
			return -EINVAL;
		}
		e->ms = (uint64_t)(sec * 1000);
		e->arg = c2 + 1;
		snprintf(action, sizeof(action), "%.*s", (int)(c2 - c1 - 1), c1 + 1);
		if (!strcmp(action, "remove") || !strcmp(action, "cut")) {
			e->action = action[0] == 'r' ? "remove" : "cut";
			if (parse_u64(e->arg, 0, RTRS_PERF_MAX_PATHS - 1, &idx)) {
				fprintf(stderr, "rtrs-perf: --event %s: %s takes a path index in 0..%d\n",
					spec, e->action, RTRS_PERF_MAX_PATHS - 1);
				return -EINVAL;
			}
			e->idx = (unsigned)idx;
		} else if (!strcmp(action, "add")) {
			e->action = "add";
			e->addr.size = sizeof(e->addr);
			if (rtrs_addr_parse(e->arg, 0, &e->addr, why, sizeof(why))) {
				fprintf(stderr, "rtrs-perf: --event %s: %s\n", spec, why);
				return -EINVAL;
			}
		} else {
			fprintf(stderr, "rtrs-perf: --event %s: unknown action \"%.*s\" (remove, cut or "
				"add)\n", spec, (int)(c2 - c1 - 1), c1 + 1);
			return -EINVAL;
		}
	}
	return 0;
}

/* Applies the --event entries due by ms into the run; marks them done. */
static void run_events(struct rtrs_clt_sess *sess, uint64_t ms)
{
	for (unsigned i = 0; i < g.events.n; i++) {
		struct perf_event *e = &events[i];
		int rc = -EINVAL;

		if (e->done || ms < e->ms)
			continue;
		e->done = true;
		if (e->action[0] == 'r') {
			rc = rtrs_clt_remove_path(sess, e->idx);
		} else if (e->action[0] == 'c') {
			rc = rtrs_clt_reconnect_path(sess, e->idx);
		} else {
			struct rtrs_path_addr pa;
			unsigned idx;

			rtrs_addr_path(&e->addr, &pa);
			rc = rtrs_clt_add_path(sess, &pa, &idx);
		}
		fprintf(stderr, "rtrs-perf: at %.1f s: %s %s: %s\n", (double)ms / 1000, e->action,
			e->arg, rc ? strerror(-rc) : "done");
	}
}

/* --sessions: the openers, all at once (at most OPENERS threads, each taking the next). */
#define OPENERS 256

static atomic_uint open_next, open_failed;
static atomic_int open_first_err;
static const struct rtrs_clt_opts *open_opts;

static void *opener(void *arg)
{
	(void)arg;
	for (;;) {
		unsigned i = atomic_fetch_add(&open_next, 1);
		struct rtrs_clt_opts o;
		char name[256]; /* a session name: 1..255 bytes */
		int rc, none = 0;

		if (i >= g.sessions)
			return NULL;
		o = *open_opts;
		snprintf(name, sizeof(name), "%.200s-%u", o.sessname ? o.sessname : "rtrs-perf",
			 i + 1);
		o.sessname = name;
		rc = rtrs_clt_open(&o, &sessions[i]);
		if (rc) {
			sessions[i] = NULL;
			atomic_fetch_add(&open_failed, 1);
			atomic_compare_exchange_strong(&open_first_err, &none, rc);
		}
	}
}

static int run_io(struct rtrs_clt_sess *const *ss, unsigned n, double open_secs);

static int run_sessions(const struct rtrs_clt_opts *o)
{
	unsigned n = (unsigned)g.sessions;
	uint64_t t0 = now_ns();
	double secs;
	int rc = 0;

	sessions = calloc(n, sizeof(*sessions));
	if (!sessions) {
		fprintf(stderr, "rtrs-perf: out of memory for %u sessions\n", n);
		return 1;
	}
	open_opts = o;
	threads_run(MIN(n, OPENERS), opener, NULL);
	secs = (double)(now_ns() - t0) / 1e9;
	if (atomic_load(&open_failed)) {
		fprintf(stderr, "rtrs-perf: %u of %u sessions did not open, first: %s\n",
			atomic_load(&open_failed), n, strerror(-atomic_load(&open_first_err)));
		rc = 1;
	} else {
		/* At once, for whoever measures what comes next (bench/scale.sh). */
		fprintf(stderr, "rtrs-perf: %u sessions opened in %.3f s\n", n, secs);
		rc = run_io(sessions, n, secs);
		if (g.hold) {
			fflush(stdout);
			fprintf(stderr, "rtrs-perf: holding %u idle sessions for %" PRIu64 " s\n", n,
				g.hold);
			sleep((unsigned)g.hold);
		}
	}
	for (unsigned i = 0; i < n; i++)
		if (sessions[i])
			rtrs_clt_close(sessions[i]);
	free(sessions);
	sessions = NULL;
	return rc;
}

/*
 * IO over n sessions: g.queue_depth IOs in flight in all, IO i starting on
 * session i % n and moving on at each completion (io_conf).
 */
static int run_io(struct rtrs_clt_sess *const *ss, unsigned n, double open_secs)
{
	uint64_t stride = (g.io_size + 4095) & ~4095ull, t0, nops;
	struct perf_io *ios = calloc(g.queue_depth, sizeof(*ios));
	uint8_t *area = aligned_alloc(4096, stride * g.queue_depth);
	double secs;
	int rc = 0;

	if (!ios || !area) {
		fprintf(stderr, "rtrs-perf: out of memory for %" PRIu64 " buffers\n", g.queue_depth);
		free(ios);
		free(area);
		return 1;
	}
	for (uint64_t i = 0; i < g.queue_depth; i++) {
		ios[i].si = (unsigned)(i % n);
		ios[i].sess = ss[ios[i].si];
		ios[i].permit = rtrs_clt_get_permit(ios[i].sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
		ios[i].buf = area + i * stride;
		ios[i].ops = (struct rtrs_clt_req_ops){ .priv = &ios[i], .conf = io_conf };
	}
	atomic_store(&rot_next, (unsigned)(g.queue_depth % n));
	t0 = now_ns();
	for (uint64_t i = 0; i < g.queue_depth; i++) {
		atomic_fetch_add(&active, 1);
		rc = io_submit(&ios[i], now_ns());
		if (rc) {
			fprintf(stderr, "rtrs-perf: submit: %s\n", strerror(-rc));
			atomic_store(&stopping, true);
			io_retire();
			break;
		}
	}
	for (uint64_t ms = 0; ms < g.duration * 1000 && !atomic_load(&stopping); ms += 10)
		usleep(10000);
	atomic_store(&stopping, true);
	pthread_mutex_lock(&done_lock);
	while (atomic_load(&active))
		pthread_cond_wait(&done_cond, &done_lock);
	pthread_mutex_unlock(&done_lock);
	secs = (double)(now_ns() - t0) / 1e9;
	nops = atomic_load(&ops_done);
	if (g.json) {
		struct json_object *jo = json_object_new_object(), *lat = json_object_new_object();
		bool failed = false;

		jput(jo, "sessions", json_object_new_uint64(n), &failed);
		jput(jo, "open_seconds", jfixed(open_secs, 3), &failed);
		jput(jo, "mode", json_object_new_string(mode_names[g.mode]), &failed);
		jput(jo, "io_size", json_object_new_uint64(g.io_size), &failed);
		jput(jo, "queue_depth", json_object_new_uint64(g.queue_depth), &failed);
		jput(jo, "seconds", jfixed(secs, 3), &failed);
		jput(jo, "ops", json_object_new_uint64(nops), &failed);
		jput(jo, "ops_per_sec", jfixed((double)nops / secs, 0), &failed);
		jput(lat, "p50", json_object_new_uint64(hist_percentile(&hist, 50, nops)), &failed);
		jput(lat, "p99", json_object_new_uint64(hist_percentile(&hist, 99, nops)), &failed);
		jput(jo, "lat_us", lat, &failed);
		jput(jo, "errors", json_object_new_uint64(atomic_load(&ops_err)), &failed);
		jput(jo, "bad", json_object_new_uint64(atomic_load(&ops_bad)), &failed);
		rc = jprint(jo, failed);
	} else {
		printf("rtrs-perf: %u sessions opened in %.2f s; %s %" PRIu64 " B, qd %" PRIu64
		       " over them, %.2f s%s\n", n, open_secs, mode_names[g.mode], g.io_size,
		       g.queue_depth, secs, g.verify ? ", verified" : "");
		printf("  %" PRIu64 " ops  %.0f op/s  latency us p50 %" PRIu64 " p99 %" PRIu64
		       "  errors %" PRIuFAST64 "\n", nops, (double)nops / secs,
		       hist_percentile(&hist, 50, nops), hist_percentile(&hist, 99, nops),
		       atomic_load(&ops_err));
	}
	if (atomic_load(&ops_err))
		fprintf(stderr, "rtrs-perf: %" PRIuFAST64 " IOs failed, first: %s\n",
			atomic_load(&ops_err), strerror(-first_err));
	if (atomic_load(&ops_bad))
		fprintf(stderr, "rtrs-perf: %" PRIuFAST64 " reads returned wrong bytes\n",
			atomic_load(&ops_bad));
	for (uint64_t i = 0; i < g.queue_depth; i++)
		rtrs_clt_put_permit(ios[i].sess, ios[i].permit);
	free(ios);
	free(area);
	return rc || atomic_load(&ops_err) || atomic_load(&ops_bad) ? 1 : 0;
}

static int run_client(void)
{
	struct rtrs_attrs attrs = { .size = sizeof(attrs) };
	struct rtrs_clt_opts o = cfg.opts;
	struct rtrs_clt_sess *sess;
	struct perf_io *ios;
	uint8_t *area;
	uint64_t stride;
	uint64_t t0, t1, n;
	double secs;
	int rc, out_rc = 0;

	if (!o.paths_num) {
		fprintf(stderr, "rtrs-perf: client needs 1..%d --server [SRC@]HOST[:PORT]\n",
			RTRS_PERF_MAX_PATHS);
		return 2;
	}
	o.port = (uint16_t)g.port;
	if (g.sessions > 1 || g.hold) {
		if (g.events.n) {
			fprintf(stderr, "rtrs-perf: --event acts on one session, not --sessions %" PRIu64
				"\n", g.sessions);
			return 2;
		}
		return run_sessions(&o);
	}
	rc = rtrs_clt_open(&o, &sess);
	if (rc) {
		fprintf(stderr, "rtrs-perf: cannot open session to %s: %s\n", o.paths[0].dst,
			rtrs_last_error()[0] ? rtrs_last_error() : strerror(-rc));
		return 1;
	}
	rtrs_clt_query(sess, &attrs);
	if (g.io_size > attrs.max_io_size || g.queue_depth > attrs.queue_depth) {
		fprintf(stderr, "rtrs-perf: io size %" PRIu64 " / queue depth %" PRIu64
			" beyond the session's %u / %u\n", g.io_size, g.queue_depth,
			attrs.max_io_size, attrs.queue_depth);
		rtrs_clt_close(sess);
		return 2;
	}
	/*
	 * One area for every IO's buffer, registered with the session once:
	 * writes from it need no registration per IO on RDMA devices.
	 */
	stride = (g.io_size + 4095) & ~4095ull;
	ios = calloc(g.queue_depth, sizeof(*ios));
	area = aligned_alloc(4096, stride * g.queue_depth);
	if (!ios || !area) {
		fprintf(stderr, "rtrs-perf: out of memory for %" PRIu64 " buffers\n", g.queue_depth);
		free(ios);
		free(area);
		rtrs_clt_close(sess);
		return 1;
	}
	rc = rtrs_clt_mem_register(sess, area, stride * g.queue_depth);
	if (rc)
		fprintf(stderr, "rtrs-perf: registering the buffers: %s (each write registers its own)\n",
			strerror(-rc));
	for (uint64_t i = 0; i < g.queue_depth; i++) {
		ios[i].sess = sess;
		ios[i].permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
		ios[i].buf = area + i * stride;
		ios[i].ops = (struct rtrs_clt_req_ops){ .priv = &ios[i], .conf = io_conf };
	}
	t0 = now_ns();
	for (uint64_t i = 0; i < g.queue_depth; i++) {
		atomic_fetch_add(&active, 1);
		rc = io_submit(&ios[i], now_ns());
		if (rc) {
			fprintf(stderr, "rtrs-perf: submit: %s\n", strerror(-rc));
			atomic_store(&stopping, true);
			io_retire();
			break;
		}
	}
	for (uint64_t ms = 0; ms < g.duration * 1000 && !atomic_load(&stopping); ms += 10) {
		usleep(10000);
		run_events(sess, (now_ns() - t0) / 1000000);
	}
	atomic_store(&stopping, true);
	pthread_mutex_lock(&done_lock);
	while (atomic_load(&active))
		pthread_cond_wait(&done_cond, &done_lock);
	pthread_mutex_unlock(&done_lock);
	t1 = now_ns();

	n = atomic_load(&ops_done);
	secs = (double)(t1 - t0) / 1e9;
	rtrs_clt_query(sess, &attrs); /* paths may have been added */
	if (g.json) {
		struct json_object *jo = json_object_new_object(), *arr = json_object_new_array();
		struct json_object *lat = json_object_new_object();
		bool failed = false;

		for (unsigned i = 0; i < attrs.paths_num; i++) {
			struct rtrs_path_stats st = { .size = sizeof(st) };
			struct json_object *po = json_object_new_object();

			rtrs_clt_path_stats(sess, i, &st);
			jput(po, "state", json_object_new_string(st.state), &failed);
			jput(po, "reads", json_object_new_uint64(st.reads), &failed);
			jput(po, "writes", json_object_new_uint64(st.writes), &failed);
			jput(po, "reconnects", json_object_new_uint64(st.reconnects), &failed);
			if (!po || !arr || json_object_array_add(arr, po)) {
				json_object_put(po);
				failed = true;
			}
		}
		jput(jo, "paths", arr, &failed);
		jput(jo, "mode", json_object_new_string(mode_names[g.mode]), &failed);
		jput(jo, "provider", json_object_new_string(o.provider), &failed);
		jput(jo, "io_size", json_object_new_uint64(g.io_size), &failed);
		jput(jo, "queue_depth", json_object_new_uint64(g.queue_depth), &failed);
		jput(jo, "seconds", jfixed(secs, 3), &failed);
		jput(jo, "ops", json_object_new_uint64(n), &failed);
		jput(jo, "ops_per_sec", jfixed((double)n / secs, 0), &failed);
		jput(jo, "gb_per_sec", jfixed((double)n * (double)g.io_size / secs / 1e9, 4), &failed);
		jput(lat, "p50", json_object_new_uint64(hist_percentile(&hist, 50, n)), &failed);
		jput(lat, "p99", json_object_new_uint64(hist_percentile(&hist, 99, n)), &failed);
		jput(lat, "p999", json_object_new_uint64(hist_percentile(&hist, 99.9, n)), &failed);
		jput(lat, "max", json_object_new_uint64(hist_percentile(&hist, 100, n)), &failed);
		jput(jo, "lat_us", lat, &failed);
		jput(jo, "errors", json_object_new_uint64(atomic_load(&ops_err)), &failed);
		jput(jo, "bad", json_object_new_uint64(atomic_load(&ops_bad)), &failed);
		out_rc = jprint(jo, failed);
		if (out_rc)
			fprintf(stderr, "rtrs-perf: printing JSON: %s\n", strerror(-out_rc));
	} else {
		printf("rtrs-perf: %s %" PRIu64 " B, qd %" PRIu64 ", %s, %.2f s%s\n",
		       mode_names[g.mode], g.io_size, g.queue_depth, o.paths[0].dst, secs,
		       g.verify ? ", verified" : "");
		printf("  %" PRIu64 " ops  %.0f op/s  %.3f GB/s  latency us p50 %" PRIu64
		       " p99 %" PRIu64 " p99.9 %" PRIu64 "  errors %" PRIuFAST64 "\n",
		       n, (double)n / secs, (double)n * (double)g.io_size / secs / 1e9,
		       hist_percentile(&hist, 50, n), hist_percentile(&hist, 99, n), hist_percentile(&hist, 99.9, n),
		       atomic_load(&ops_err));
		for (unsigned i = 0; attrs.paths_num > 1 && i < attrs.paths_num; i++) {
			struct rtrs_path_stats st = { .size = sizeof(st) };

			rtrs_clt_path_stats(sess, i, &st);
			printf("  path %u %s: %s, %" PRIu64 " reads, %" PRIu64 " writes, %" PRIu64
			       " reconnects\n", i, st.name, st.state, st.reads, st.writes,
			       st.reconnects);
		}
	}
	if (atomic_load(&ops_err))
		fprintf(stderr, "rtrs-perf: %" PRIuFAST64 " IOs failed, first: %s\n",
			atomic_load(&ops_err), strerror(-first_err));
	if (atomic_load(&ops_bad))
		fprintf(stderr, "rtrs-perf: %" PRIuFAST64 " reads returned wrong bytes\n",
			atomic_load(&ops_bad));
	for (uint64_t i = 0; i < g.queue_depth; i++)
		rtrs_clt_put_permit(sess, ios[i].permit);
	free(ios);
	rtrs_clt_close(sess);
	free(area);
	free(g.events.items);
	return out_rc || atomic_load(&ops_err) || atomic_load(&ops_bad) ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *usage = "server|client [options]";
	struct opt *options;
	int pos, rc;


	clt_cfg_init(&cfg, RTRS_PERF_MAX_PATHS);
	cfg.opts.sessname = "rtrs-perf";
	options = clt_opts_table(&cfg, clt_picks, ARRAY_SIZE(clt_picks), own_options);
	if (!options) {
		fprintf(stderr, "rtrs-perf: out of memory\n");
		return 1;
	}
	if (opts_version_arg(argc, argv, "rtrs-perf"))
		return 0;
	if (argc < 2 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
			opts_help(options, "rtrs-perf", usage);
			free(options);
			return 0;
		}
		fprintf(stderr, "rtrs-perf: first argument must be 'server' or 'client' (see --help)\n");
		free(options);
		return 2;
	}
	rc = clt_opts_renamed("rtrs-perf", argc, argv, false);
	if (!rc)
		rc = opts_parse(options, "rtrs-perf", usage, argc - 1, argv + 1, &pos);
	free(options);
	if (rc)
		return rc > 0 ? 0 : 2;
	clt_cfg_finish(&cfg);
	cfg.opts.tls_no_ktls = g.no_ktls;
	if (pos != argc - 1) {
		fprintf(stderr, "rtrs-perf: unexpected argument '%s'\n", argv[pos + 1]);
		return 2;
	}
	/* --log-level, then RTRS_LOG_LEVEL, then warn (librtrs reads no environment). */
	if (cfg.log_level < 0)
		cfg.log_level = opts_log_level("rtrs-perf", "--log-level", NULL,
					       getenv("RTRS_LOG_LEVEL"), 1);
	if (cfg.log_level < 0)
		return 2;
	rtrs_set_log_level(cfg.log_level);
	if (g.events.n && !strcmp(argv[1], "server")) {
		fprintf(stderr, "rtrs-perf: --event is the client's (see --help)\n");
		return 2;
	}
	if (events_parse())
		return 2;
	rc = strcmp(argv[1], "server") ? run_client() : run_server();
	free(events);
	return rc;
}
