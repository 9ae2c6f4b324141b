/* SPDX-License-Identifier: MIT */
/*
 * rtrs-test-server: a memory store behind an RTRS server, for functional
 * tests. Writes land in the store at the offset named in the user header;
 * reads return the store's bytes. TEST_OP_FAIL answers with the errno the
 * client asks for. --async answers from a separate thread, so IO is held by
 * the "user" while the transport runs on.
 *
 * --hold-first-us US (with --async --apply-late) holds the first write the
 * server receives that long on a thread of its own, then stores and
 * answers it; the writes after it go on meanwhile: a slow device that
 * finishes an old write after newer ones (test-takeover).
 *
 * --fault-eagain-every N refuses every Nth write on each connection with
 * -EAGAIN (rtrs-fault.h: builds with -Dfault_injection=true; elsewhere it
 * exits 77 saying so). RTRS_LOG_LEVEL sets the library's level.
 *
 * Prints "rtrs-test-server listening on port N" once it listens.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rtrs.h"
#include "opts.h"
#ifdef RTRS_FAULT_INJECTION
#include "rtrs-fault.h"
#endif
#include "test-proto-hdr.h"

static struct {
	uint64_t port, queue_depth, chunk_size, store_size, hb_ms, hb_missed, delay_us;
	uint64_t exit_after, fault_eagain_every, hold_first_us;
	uint64_t max_pending, max_pending_per_peer, handshake_ms, max_sessions, max_chunk_mem;
	uint64_t max_sessions_per_peer;
	bool async, apply_late;
	const char *addr, *provider, *auth_keys;
	unsigned tls;
} g = {
	.provider = "tcp",
	.queue_depth = RTRS_DEFAULT_QUEUE_DEPTH, .chunk_size = RTRS_DEFAULT_CHUNK_SIZE,
	.store_size = 64u << 20, .hb_ms = RTRS_DEFAULT_HB_INTERVAL_MS,
	.hb_missed = RTRS_DEFAULT_HB_MISSED_MAX, .addr = "127.0.0.1",
};

static const char *const tls_modes[] = { "off", "offered", "required", NULL };

static const struct opt options[] = {
	{ "tls", 0, OPT_CHOICE, &g.tls, .choices = tls_modes, .arg = "MODE",
	  .help = "TLS: off, offered or required (the PSKs are in --auth-keys)" },
	{ "addr", 'a', OPT_STRING, &g.addr, .arg = "ADDR", .help = "listen address" },
	{ "provider", 0, OPT_STRING, &g.provider, .arg = "NAME", .help = "fabric: tcp (native, io_uring) or verbs (RDMA devices, rdma-core)" },
	{ "exit-after", 0, OPT_UINT, &g.exit_after, 0, 1000000, .arg = "N",
	  .help = "exit after N sessions have ended (0: run until a signal)" },
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N", .help = "port (0 = any)" },
	{ "queue-depth", 'q', OPT_UINT, &g.queue_depth, 1, 65535, .arg = "N", .help = "chunks" },
	{ "chunk-size", 'c', OPT_SIZE, &g.chunk_size, 8192, 128u << 20, .arg = "SIZE",
	  .help = "chunk size" },
	{ "store-size", 's', OPT_SIZE, &g.store_size, 4096, 4ull << 30, .arg = "SIZE",
	  .help = "bytes of memory store" },
	{ "hb-interval", 0, OPT_UINT, &g.hb_ms, 10, 600000, .arg = "MS", .help = "heartbeat" },
	{ "hb-missed", 0, OPT_UINT, &g.hb_missed, 1, 1000, .arg = "N", .help = "missed beats" },
	{ "async", 0, OPT_FLAG, &g.async, .help = "answer from a separate thread" },
	{ "apply-late", 0, OPT_FLAG, &g.apply_late,
	  .help = "async: store a write only when answering it (a slow device)" },
	{ "delay-us", 0, OPT_UINT, &g.delay_us, 0, 10000000, .arg = "US",
	  .help = "async: hold each IO this long" },
	{ "hold-first-us", 0, OPT_UINT, &g.hold_first_us, 0, 60000000, .arg = "US",
	  .help = "hold the first write this long, apart from the others (with --async --apply-late)" },
	{ "auth-keys", 0, OPT_STRING, &g.auth_keys, .arg = "FILE",
	  .help = "require DH-HMAC-CHAP; FILE lists HOST SECRET [CTRL-SECRET]" },
	{ "max-pending", 0, OPT_UINT, &g.max_pending, 0, 100000, .arg = "N",
	  .help = "pending connections in all (0: default)" },
	{ "max-pending-per-peer", 0, OPT_UINT, &g.max_pending_per_peer, 0, 100000, .arg = "N",
	  .help = "pending connections per peer address (0: default)" },
	{ "handshake-timeout", 0, OPT_UINT, &g.handshake_ms, 0, 600000, .arg = "MS",
	  .help = "close a connection that sends no request in MS (0: default)" },
	{ "max-sessions", 0, OPT_UINT, &g.max_sessions, 0, 100000, .arg = "N",
	  .help = "connected sessions (0: default)" },
	{ "max-chunk-mem", 0, OPT_SIZE, &g.max_chunk_mem, 0, 1ull << 40, .arg = "SIZE",
	  .help = "chunk memory of all sessions (0: default)" },
	{ "max-sessions-per-peer", 0, OPT_UINT, &g.max_sessions_per_peer, 0, 100000, .arg = "N",
	  .help = "sessions per peer address or authenticated host (0: default)" },
	{ "fault-eagain-every", 0, OPT_UINT, &g.fault_eagain_every, 2, 1000000, .arg = "N",
	  .help = "fault injection: every Nth write on a connection meets a full send queue" },
	{ 0 },
};

static uint8_t *store;
static atomic_uint sessions_ended;

static int link_ev(struct rtrs_srv_sess *sess, enum rtrs_srv_link_ev ev, void *priv)
{
	if (ev == RTRS_SRV_LINK_EV_DISCONNECTED &&
	    atomic_fetch_add(&sessions_ended, 1) + 1 == g.exit_after)
		kill(getpid(), SIGTERM); /* main waits for it in sigwait */
	return 0;
}

struct pending {
	struct rtrs_srv_op *id;
	int err;
	void *src;        /* apply-late: the write's data, still in its chunk */
	uint64_t off;
	size_t len;
	uint64_t due_us;  /* arrival + delay: IOs are held in parallel */
};

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct pending *ring;
	size_t head, tail, cap;
	bool stop;
} q = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void *responder(void *arg)
{
	for (;;) {
		struct pending p;

		pthread_mutex_lock(&q.lock);
		while (q.head == q.tail && !q.stop)
			pthread_cond_wait(&q.cond, &q.lock);
		if (q.head == q.tail) {
			pthread_mutex_unlock(&q.lock);
			return NULL;
		}
		p = q.ring[q.head++ % q.cap];
		pthread_mutex_unlock(&q.lock);
		uint64_t now = mono_us();

		if (p.due_us > now)
			usleep((useconds_t)(p.due_us - now));
		if (p.src) /* the chunk stays ours until the answer */
			memcpy(store + p.off, p.src, p.len);
		rtrs_srv_resp_rdma(p.id, p.err);
	}
}

static struct pending held;
static atomic_bool held_taken;

static void *hold_first(void *arg)
{
	(void)arg;
	usleep((useconds_t)g.hold_first_us);
	memcpy(store + held.off, held.src, held.len);
	rtrs_srv_resp_rdma(held.id, held.err);
	return NULL;
}

static void answer_write(struct rtrs_srv_op *id, int err, void *src, uint64_t off, size_t len)
{
	if (src && g.hold_first_us && !atomic_exchange(&held_taken, true)) {
		pthread_t t;

		held = (struct pending){ id, err, src, off, len, 0 };
		if (!pthread_create(&t, NULL, hold_first, NULL)) {
			pthread_detach(t);
			return;
		}
	}
	if (!g.async) {
		rtrs_srv_resp_rdma(id, err);
		return;
	}
	pthread_mutex_lock(&q.lock);
	q.ring[q.tail++ % q.cap] = (struct pending){ id, err, src, off, len,
						     mono_us() + g.delay_us };
	pthread_cond_signal(&q.cond);
	pthread_mutex_unlock(&q.lock);
}

static void answer(struct rtrs_srv_op *id, int err)
{
	answer_write(id, err, NULL, 0, 0);
}

static int rdma_ev(void *priv, struct rtrs_srv_op *id, enum rtrs_dir dir, void *data,
		   size_t datalen, const void *usr, size_t usrlen)
{
	struct test_hdr h;

	if (usrlen != sizeof(h))
		return -EBADMSG;
	memcpy(&h, usr, sizeof(h));
	if (h.magic != TEST_MAGIC)
		return -EBADMSG;
	if (h.op == TEST_OP_FAIL) {
		answer(id, -h.errno_);
		return 0;
	}
	if (h.op != TEST_OP_IO || h.len != datalen || h.offset > g.store_size ||
	    datalen > g.store_size - h.offset)
		return -ERANGE;
	if (dir == RTRS_WRITE && g.async && g.apply_late) {
		answer_write(id, 0, data, h.offset, datalen);
		return 0;
	}
	if (dir == RTRS_WRITE)
		memcpy(store + h.offset, data, datalen);
	else
		memcpy(data, store + h.offset, datalen);
	answer(id, 0);
	return 0;
}

int main(int argc, char **argv)
{
	struct rtrs_srv_ops ops = { .rdma_ev = rdma_ev, .link_ev = link_ev };
	struct rtrs_srv_opts o;
	struct rtrs_srv_ctx *ctx;
	pthread_t thr;
	sigset_t set;
	int pos, rc, sig;

	rc = opts_parse(options, "rtrs-test-server", "[options]", argc, argv, &pos);
	if (rc)
		return rc > 0 ? 0 : 2;
	rc = opts_log_level("rtrs-test-server", NULL, NULL, getenv("RTRS_LOG_LEVEL"), 1);
	if (rc < 0)
		return 2;
	rtrs_set_log_level(rc);
	if (g.fault_eagain_every) {
#ifdef RTRS_FAULT_INJECTION
		struct rtrs_fault f = { .eagain_every = (unsigned)g.fault_eagain_every };

		rc = rtrs_fault_set(&f);
		if (rc) {
			fprintf(stderr, "rtrs-test-server: --fault-eagain-every: %s\n", strerror(-rc));
			return 2;
		}
#else
		fprintf(stderr, "rtrs-test-server: --fault-eagain-every: built without -Dfault_injection=true\n");
		return 77;
#endif
	}
	store = calloc(1, g.store_size);
	q.cap = g.queue_depth + 1;
	q.ring = calloc(q.cap, sizeof(*q.ring));
	if (!store || !q.ring)
		return 1;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (g.async)
		pthread_create(&thr, NULL, responder, NULL);
	rtrs_srv_opts_init(&o, sizeof(o));
	o.addr = g.addr;
	o.provider = g.provider;
	o.port = (uint16_t)g.port;
	o.queue_depth = (uint32_t)g.queue_depth;
	o.max_chunk_size = (uint32_t)g.chunk_size;
	o.hb_interval_ms = (unsigned)g.hb_ms;
	o.hb_missed_max = (unsigned)g.hb_missed;
	o.auth_keys_file = g.auth_keys;
	o.tls = (enum rtrs_tls_mode)g.tls;
	o.auth_name = "nqn.2026-11.io.rtrs:test-server";
	o.max_pending = (unsigned)g.max_pending;
	o.max_pending_per_peer = (unsigned)g.max_pending_per_peer;
	o.handshake_timeout_ms = (unsigned)g.handshake_ms;
	o.max_sessions = (unsigned)g.max_sessions;
	o.max_chunk_mem = g.max_chunk_mem;
	o.max_sessions_per_peer = (unsigned)g.max_sessions_per_peer;
	rc = rtrs_srv_open(&ops, &o, &ctx);
	if (rc) {
		fprintf(stderr, "rtrs-test-server: %s\n", strerror(-rc));
		return 1;
	}
	if (rtrs_srv_wait_listening(ctx, 10000)) {
		fprintf(stderr, "rtrs-test-server: not listening\n");
		return 1;
	}
	printf("rtrs-test-server listening on port %d\n", rtrs_srv_get_port(ctx));
	fflush(stdout);
	sigwait(&set, &sig);
	/* Close waits for every answer: the responder runs until it returns. */
	rtrs_srv_close(ctx);
	if (g.async) {
		pthread_mutex_lock(&q.lock);
		q.stop = true;
		pthread_cond_signal(&q.cond);
		pthread_mutex_unlock(&q.lock);
		pthread_join(thr, NULL);
	}
	free(store);
	free(q.ring);
	return 0;
}
