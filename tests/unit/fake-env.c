/* SPDX-License-Identifier: MIT */
/*
 * The frame of the fake-fabric scenarios (fake-env.h). Nothing here checks
 * outcomes: helpers return what happened and the scenarios check it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "fake-env.h"
#include "logcap.h"
#include "rtrs-pri.h"

/* Secrets as `nvme gen-dhchap-key` writes them (the functional test-auth's). */
const char *const KEY_A = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
const char *const KEY_B = "DHHC-1:01:GuJrkvVtT5Q5wN/viBieCAOaPKm2JWx23f/CVxUdQeZRpnco:";

struct srv_env srv;

/* ---- log ----------------------------------------------------------------------------------- */

void env_log_sink(void *priv, int level, const char *line)
{
	static struct timespec t0;
	struct timespec t;
	char buf[1024];

	clock_gettime(CLOCK_MONOTONIC, &t);
	if (!t0.tv_sec)
		t0 = t;
	/* Milliseconds since the first line: where a slow scenario spends its time. */
	snprintf(buf, sizeof(buf), "%9.3f %s",
		 (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6, line);
	log_sink(priv, level, buf);
	/* A library thread changed something (every state change logs): waits look again. */
	fake_notify();
}

static size_t scenario_mark; /* the log from this scenario on */

bool env_logged(const char *s)
{
	return log_has_since(scenario_mark, s);
}

unsigned env_log_count(const char *s)
{
	unsigned n = 0;

	pthread_mutex_lock(&log_lock);
	for (const char *p = log_buf && scenario_mark <= log_len ? log_buf + scenario_mark : "";
	     (p = strstr(p, s)); p++)
		n++;
	pthread_mutex_unlock(&log_lock);
	return n;
}

void env_log_dump(void)
{
	log_dump_to(stderr);
}

void env_reset(void)
{
	char keys[sizeof(srv.keys_path)];

	memcpy(keys, srv.keys_path, sizeof(keys));
	memset(&srv, 0, sizeof(srv));
	memcpy(srv.keys_path, keys, sizeof(keys));
	fake_delivered_reset();
	atomic_store(&rtrs_test_kernel_clt, false);
	atomic_store(&rtrs_test_kernel_srv, false);
	scenario_mark = log_mark();
	fake_hold(NULL, NULL);
	fake_set_limits(4, 4);
	fake_set_send_imm(true);
	fake_set_mr_local(false);
	fake_set_late_ack(false);
}

/* ---- the server ------------------------------------------------------------------------------- */

struct usr_hdr {
	uint32_t off;
};

static int srv_rdma_ev(void *priv, struct rtrs_srv_op *op, enum rtrs_dir dir, void *data,
		       size_t len, const void *usr, size_t usrlen)
{
	struct usr_hdr h;

	atomic_fetch_add(&srv.rdma_evs, 1);
	if (usrlen != sizeof(h))
		return -EINVAL;
	memcpy(&h, usr, sizeof(h));
	if (h.off > AREA || len > AREA - h.off)
		return -EINVAL;
	if (dir == RTRS_WRITE)
		memcpy(srv.area + h.off, data, len);
	else
		memcpy(data, srv.area + h.off, len);
	if (atomic_load(&srv.defer)) {
		int n = atomic_fetch_add(&srv.nr_deferred, 1);

		if (n < (int)ARRAY_SIZE(srv.deferred)) {
			atomic_store(&srv.deferred[n], op);
			fake_notify();
			return 0;
		}
	}
	if (atomic_load(&srv.answer_then_fail)) {
		rtrs_srv_resp_rdma(op, 0);
		return atomic_load(&srv.answer_then_fail);
	}
	return rtrs_srv_resp_rdma(op, 0);
}

int srv_held(void)
{
	int n = 0;

	while (n < (int)ARRAY_SIZE(srv.deferred) && atomic_load(&srv.deferred[n]))
		n++;
	return n;
}

static int srv_link_ev(struct rtrs_srv_sess *sess, enum rtrs_srv_link_ev ev, void *priv)
{
	if (ev == RTRS_SRV_LINK_EV_DISCONNECTED) {
		atomic_fetch_add(&srv.link_down, 1);
		return 0;
	}
	atomic_fetch_add(&srv.link_up, 1);
	atomic_fetch_add(rtrs_srv_sess_peer_ext(sess) ? &srv.ext_sessions : &srv.kernel_sessions, 1);
	return atomic_load(&srv.refuse);
}

void srv_opts(struct rtrs_srv_opts *so)
{
	rtrs_srv_opts_init(so, sizeof(*so));
	so->provider = "fake";
	so->queue_depth = 16;
	so->max_chunk_size = 16384;
	so->hb_interval_ms = HB_NEVER;
	so->auth_name = SERVER_NQN;
}

void srv_write_keys(const char *key)
{
	FILE *f;

	if (!srv.keys_path[0]) {
		const char *dir = test_tmpdir(NULL, "rtrs-fake");

		snprintf(srv.keys_path, sizeof(srv.keys_path), "%s/keys", dir ? dir : "/nonexistent");
	}
	f = fopen(srv.keys_path, "w");
	if (!f)
		return;
	fprintf(f, "%s %s\n", HOST_NQN, key);
	fclose(f);
	chmod(srv.keys_path, 0600);
}

void srv_opts_auth(struct rtrs_srv_opts *so, const char *key)
{
	srv_opts(so);
	srv_write_keys(key);
	so->auth_keys_file = srv.keys_path;
}

int srv_start(const struct rtrs_srv_opts *so)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev, .link_ev = srv_link_ev };
	int rc = rtrs_srv_open(&ops, so, &srv.ctx);

	if (rc)
		return rc;
	/* Listening starts on the server's loop, 1 ms after the open. */
	rc = fake_advance(1);
	if (!rc)
		rc = rtrs_srv_wait_listening(srv.ctx, 1000);
	if (!rc)
		srv.port = rtrs_srv_get_port(srv.ctx);
	return rc;
}

void srv_stop(void)
{
	rtrs_srv_close(srv.ctx);
	srv.ctx = NULL;
}

struct rtrs_srv_stats srv_stats(void)
{
	struct rtrs_srv_stats st = { .size = sizeof(st) };

	rtrs_srv_get_stats(srv.ctx, &st);
	return st;
}

/* ---- clients --------------------------------------------------------------------------------- */

static void clt_path_ev(void *priv, unsigned idx, int up)
{
	struct clt *c = priv;

	atomic_fetch_add(up ? &c->path_up : &c->path_down, 1);
	fake_notify();
}

void clt_init(struct clt *c, const char *name, const char *hosts)
{
	size_t n = strlen(hosts);

	memset(c, 0, sizeof(*c));
	rtrs_clt_opts_init(&c->o, sizeof(c->o));
	for (size_t i = 0; i < n && i < ARRAY_SIZE(c->pa); i++) {
		snprintf(c->dst[i], sizeof(c->dst[i]), "%c:%d", hosts[i], srv.port);
		c->pa[i].dst = c->dst[i];
	}
	c->o.sessname = name;
	c->o.paths = c->pa;
	c->o.paths_num = MIN(n, ARRAY_SIZE(c->pa));
	c->o.provider = "fake";
	c->o.nr_io_cons = 1;
	c->o.hb_interval_ms = HB_NEVER;
	c->o.reconnect_delay_ms = RECONNECT_MS;
	c->o.reconnect_jitter_ms = 0;
	c->o.path_ev = clt_path_ev;
	c->o.priv = c;
	c->o.auth_host_name = HOST_NQN;
	c->o.auth_server_name = SERVER_NQN;
	/* DH costs milliseconds a step; what a scenario looks at is the order of messages. */
	c->o.auth_dhgroups = "null";
}

void clt_src(struct clt *c, unsigned i, const char *src)
{
	snprintf(c->src[i], sizeof(c->src[i]), "%s", src);
	c->pa[i].src = c->src[i];
}

static void *clt_open_thread(void *arg)
{
	struct clt *c = arg;
	int rc = rtrs_clt_open(&c->o, &c->sess);

	atomic_store(&c->rc, rc);
	atomic_store(&c->opened, true);
	fake_notify();
	return NULL;
}

int clt_open(struct clt *c)
{
	clt_open_async(c);
	return clt_open_join(c);
}

void clt_open_async(struct clt *c)
{
	c->open_mark = log_mark();
	atomic_store(&c->opened, false);
	c->thr_started = pthread_create(&c->thr, NULL, clt_open_thread, c) == 0;
	if (!c->thr_started)
		atomic_store(&c->rc, -EAGAIN);
}

/* Paths of c's session that logged "connected" since its open began. */
static unsigned paths_connected(const struct clt *c)
{
	char pre[300];
	unsigned n = 0;

	snprintf(pre, sizeof(pre), "%s/", c->o.sessname);
	pthread_mutex_lock(&log_lock);
	for (const char *p = log_buf && c->open_mark <= log_len ? log_buf + c->open_mark : "";
	     (p = strstr(p, ": connected, ")); p++) {
		const char *line = p;

		while (line > log_buf && line[-1] != '\n')
			line--;
		n += strstr(line, pre) != NULL && strstr(line, pre) < p;
	}
	pthread_mutex_unlock(&log_lock);
	return n;
}

/*
 * Waits for the open. The attempts run on the service loop, whose timers
 * follow the test clock: an open that is still waiting once everything
 * has settled waits for a timer (its next try after a refusal, a step's
 * timeout), and the clock is moved on for it, 10 ms at a time. Once every
 * path logged that it is connected the verdict is in, and only the
 * opener's thread has still to return: the clock stays (moved on, a
 * heartbeat armed at the connect would tick before the scenario starts).
 */
int clt_open_join(struct clt *c)
{
	for (unsigned ms = 0; c->thr_started && !atomic_load(&c->opened) && ms < 120000;
	     ms += 10) {
		if (fake_settle() || atomic_load(&c->opened))
			break;
		if (paths_connected(c) >= c->o.paths_num) {
			usleep(1000);
			continue;
		}
		loop_test_advance(10);
	}
	if (c->thr_started)
		pthread_join(c->thr, NULL);
	c->thr_started = false;
	return atomic_load(&c->rc);
}

void clt_close(struct clt *c)
{
	if (c->sess)
		rtrs_clt_close(c->sess);
	c->sess = NULL;
}

int env_teardown(struct clt *c)
{
	int rc;

	fake_hold(NULL, NULL);
	clt_close(c);
	rc = fake_settle();
	srv_stop();
	return rc;
}

struct rtrs_path_stats clt_path(struct clt *c, unsigned idx)
{
	struct rtrs_path_stats st = { .size = sizeof(st) };

	if (rtrs_clt_path_stats(c->sess, idx, &st))
		st.state = "(none)";
	return st;
}

bool clt_path_is(struct clt *c, unsigned idx, const char *state)
{
	return !strcmp(clt_path(c, idx).state, state);
}

/* ---- requests ------------------------------------------------------------------------------- */

void pattern(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

bool area_has(uint32_t off, size_t len, uint8_t seed)
{
	uint8_t want[LEN];

	pattern(want, len, seed);
	return !memcmp(srv.area + off, want, len);
}

static void io_conf(void *priv, int err)
{
	struct io *io = priv;

	atomic_store(&io->err, err);
	atomic_fetch_add(&io->calls, 1);
	fake_notify();
}

int io_startv(struct io *io, struct clt *c, enum rtrs_dir dir, enum rtrs_clt_con_type type,
	      uint32_t off, const struct iovec *d, size_t cnt)
{
	struct rtrs_clt_req_ops ops = { .priv = io, .conf = io_conf };
	struct usr_hdr h = { .off = off };
	struct iovec u = { &h, sizeof(h) };
	int rc;

	io->c = c;
	io->dir = dir;
	io->off = off;
	atomic_store(&io->calls, 0);
	atomic_store(&io->err, 0);
	io->permit = rtrs_clt_get_permit(c->sess, type, RTRS_PERMIT_NOWAIT);
	if (!io->permit)
		return -ENOBUFS;
	rc = rtrs_clt_request(c->sess, dir, &ops, io->permit, &u, 1, d, cnt);
	if (rc)
		io_put(io);
	return rc;
}

int io_start(struct io *io, struct clt *c, enum rtrs_dir dir, enum rtrs_clt_con_type type,
	     uint32_t off, size_t len, uint8_t seed)
{
	struct iovec d = { io->buf, len };

	memset(io, 0, sizeof(*io));
	io->len = len;
	if (dir == RTRS_WRITE)
		pattern(io->buf, len, seed);
	return io_startv(io, c, dir, type, off, &d, 1);
}

static bool io_called(void *arg)
{
	return atomic_load(&((struct io *)arg)->calls) > 0;
}

int io_wait(struct io *io)
{
	if (fake_wait(io_called, io, "a request's completion"))
		return -ETIMEDOUT;
	return atomic_load(&io->err);
}

void io_put(struct io *io)
{
	if (io->permit)
		rtrs_clt_put_permit(io->c->sess, io->permit);
	io->permit = NULL;
}

int io_sync(struct clt *c, enum rtrs_dir dir, uint32_t off, size_t len, uint8_t seed)
{
	static struct io io; /* one at a time; too big for a stack that ASan pads */
	int rc = io_start(&io, c, dir, RTRS_IO_CON, off, len, seed);

	if (!rc)
		rc = io_wait(&io);
	io_put(&io);
	return rc;
}

bool io_roundtrip(struct clt *c, uint32_t off, uint8_t seed)
{
	static struct io w, r;
	uint8_t want[LEN];
	int rc;

	pattern(want, LEN, seed);
	rc = io_start(&w, c, RTRS_WRITE, RTRS_IO_CON, off, LEN, seed);
	if (!rc)
		rc = io_wait(&w);
	io_put(&w);
	if (rc || atomic_load(&w.calls) != 1)
		return false;
	rc = io_start(&r, c, RTRS_READ, RTRS_IO_CON, off, LEN, 0);
	if (!rc)
		rc = io_wait(&r);
	io_put(&r);
	return !rc && atomic_load(&r.calls) == 1 && !memcmp(r.buf, want, LEN) &&
	       area_has(off, LEN, seed);
}

/* ---- events -------------------------------------------------------------------------------------- */

int ev_imm_type(const struct fake_ev *ev)
{
	unsigned type;
	uint32_t payload;

	if (ev->kind != FAKE_WRITE || !ev->with_imm)
		return -1;
	rtrs_from_imm(ev->imm, &type, &payload);
	return (int)type;
}

bool match(const struct fake_ev *ev, void *arg)
{
	const struct m *m = arg;
	const uint8_t *d = ev->data;

	if ((m->kind && (int)ev->kind != m->kind) ||
	    (m->dir && ev->to_server != (m->dir == TO_SRV)) ||
	    (m->host && strcmp(ev->host, m->host)) || (m->sess && strcmp(ev->sess, m->sess)) ||
	    (m->cid && ev->cid != m->cid - 1) || (m->imm && ev_imm_type(ev) != m->imm - 1))
		return false;
	if ((m->msg || m->auth) &&
	    (ev->kind != FAKE_SEND || rtrs_msg_type(ev->data, ev->len) != (m->msg ? m->msg - 1 :
									    RTRS_MSG_AUTH)))
		return false;
	/* struct rtrs_msg_auth (8 bytes), then the NVMe message: auth_type, auth_id. */
	if (m->auth && (ev->len < 10 || d[9] != m->auth - 1))
		return false;
	return true;
}

struct fake_ev *step_until(fake_pred pred, void *arg, const char *what)
{
	for (;;) {
		struct fake_ev *ev = fake_wait_ev(NULL, NULL, what);

		if (!ev || pred(ev, arg))
			return ev;
		if (fake_deliver(ev) == -ENOBUFS) {
			fprintf(stderr, "step_until(%s): a message nobody can receive yet\n", what);
			fake_unclaim(ev);
			return NULL;
		}
	}
}

struct fake_ev *open_step_to(struct clt *c, fake_pred pred, void *arg, const char *what)
{
	fake_hold(fake_any, NULL);
	clt_open_async(c);
	return step_until(pred, arg, what);
}

struct fake_ev *open_cut_at(struct clt *c, fake_pred pred, void *arg, const char *what, int cid,
			    bool drop)
{
	struct fake_ev *ev = open_step_to(c, pred, arg, what);
	int cut;

	if (ev && drop)
		fake_drop(ev);
	cut = fake_fail(c->o.sessname, NULL, cid, -ECONNRESET, -ECONNRESET);
	if (ev && !drop)
		fake_unclaim(ev);
	if (cut != 1)
		fprintf(stderr, "open_cut_at(%s): %d connections cut, not 1\n", what, cut);
	return hold_open_retry();
}

struct fake_ev *hold_open_retry(void)
{
	/* Static: the hold stays after this returns, and the pump reads it then. */
	static struct m retry = { .kind = FAKE_CONNREQ, .cid = CID(0) };
	struct fake_ev *ev;

	fake_hold(match, &retry);
	/* The open tries again after its delay, on the loop's (test) clock. */
	for (unsigned ms = 0;; ms += 50) {
		CHECK_EQ(fake_settle(), 0);
		ev = fake_find(match, &retry);
		if (ev || ms >= 20000)
			break;
		loop_test_advance(50);
	}
	if (!ev)
		fprintf(stderr, "the open's next attempt did not come within 20 s of its clock\n");
	else
		CHECK_EQ(fake_settle(), 0);
	return ev;
}

int open_resume(struct clt *c, struct fake_ev *retry)
{
	if (retry)
		fake_unclaim(retry);
	fake_hold(NULL, NULL);
	return clt_open_join(c);
}

bool ev_appears(fake_pred pred, void *arg, const char *what)
{
	struct fake_ev *ev = fake_wait_ev(pred, arg, what);

	if (ev)
		fake_unclaim(ev);
	return ev != NULL;
}
