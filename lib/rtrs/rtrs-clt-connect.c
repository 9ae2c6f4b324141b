/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: establishing a path, as a state machine on the session's
 * service loop (clt_cst_table): connection 0, authentication, the other
 * connections, the information exchange. The connection callbacks of the
 * handshake (connected, down, two-sided messages) record what came under
 * clt_path.lock and queue the path's conn_work; the loop takes the next
 * step. No thread waits for a path: rtrs_clt_open and rtrs_clt_add_path
 * start an attempt and wait for its verdict (clt_path.conn_done), a
 * reconnect is an attempt the reconnect timer starts.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rtrs-clt-pri.h"
#include "rtrs-tls.h"

/* The server refused this attempt with err; the first refusal is kept. */
static void clt_path_refused(struct clt_path *p, int err)
{
	int zero = 0;

	atomic_compare_exchange_strong(&p->refused_err, &zero, err);
}

/* The server's refusal of a connection, and what it means. */
static void clt_log_refusal(const struct clt_con *con, const struct rtrs_conn_rsp *rsp)
{
	const struct clt_path *p = con->path;
	bool tls = p->sess->tls || p->sess->tls_concat;

	/* Busy or mid-change: what an open or a reconnect tries again (info). */
	log_at(!rsp->dnr && (rsp->err == -EBUSY || rsp->err == -EAGAIN) ? LOG_INFO : LOG_ERR,
	       "%s: server rejected connection %u: %s%s%s", p->name, con->c.cid,
	       strerror(-rsp->err), rsp->dnr ? " (do not retry)" : "",
	       rsp->err != -EPROTONOSUPPORT ? "" : tls ? ": the server has no TLS" :
	       ": the server requires TLS");
}

static void clt_con_connected(void *priv, const void *data, size_t len)
{
	struct clt_con *con = container_of(priv, struct clt_con, c);
	struct clt_path *p = con->path;
	const char *why = NULL;
	int rc;

	pthread_mutex_lock(&p->lock);
	rc = rtrs_conn_rsp_decode(data, len, &con->rsp, &why);
	if (!rc)
		atomic_store(&p->reached, true);
	if (rc) {
		log_err("%s: invalid connect response on connection %u: %s", p->name, con->c.cid, why);
		con->err = rc;
	} else if (con->rsp.err) {
		/* A verdict: a refusal held open until we read it. */
		clt_log_refusal(con, &con->rsp);
		con->err = con->rsp.err;
		clt_path_refused(p, con->rsp.err);
		if (con->rsp.dnr)
			atomic_store(&p->fail_dnr, true);
	} else {
		con->connected = true;
	}
	pthread_mutex_unlock(&p->lock);
	clt_path_kick(p);
}

static void clt_con_down(void *priv, int err, const void *data, size_t len)
{
	struct clt_con *con = container_of(priv, struct clt_con, c);
	struct clt_path *p = con->path;
	struct rtrs_conn_rsp rsp;
	const char *why = NULL;

	if (err == -ECONNREFUSED && len) {
		/* A reject from the server carries its reason. */
		if (rtrs_conn_rsp_decode(data, len, &rsp, &why) == 0 && rsp.err) {
			atomic_store(&p->reached, true);
			clt_log_refusal(con, &rsp);
			err = rsp.err;
			clt_path_refused(p, rsp.err);
			if (rsp.dnr)
				atomic_store(&p->fail_dnr, true);
		} else {
			log_err("%s: connection %u refused with unreadable reason: %s", p->name,
				con->c.cid, why ? why : "?");
		}
	}
	pthread_mutex_lock(&p->lock);
	if (con->concat) {
		/* The concatenation's connection: the step waiting on it sees the end. */
		con->err = err ? err : -ECONNRESET;
		con->connected = false;
		pthread_mutex_unlock(&p->lock);
		clt_path_kick(p);
		return;
	}
	bool was_connected = atomic_load(&p->base.state) == RTRS_PATH_CONNECTED;

	con->err = err ? err : -ECONNRESET;
	con->connected = false;
	pthread_mutex_unlock(&p->lock);
	clt_path_kick(p);
	/*
	 * Connected: tear the path down. Connecting: the attempt's next step
	 * sees the failure (clt_fail_path only records it).
	 */
	if (was_connected)
		log_warn("%s: connection %u went down: %s", p->name, con->c.cid, strerror(-err));
	if (atomic_load(&p->base.state) != RTRS_PATH_CLOSING && atomic_load(&p->base.state) != RTRS_PATH_CLOSED)
		clt_fail_path(p, err ? err : -ECONNRESET);
}

static void clt_con_recv(void *priv, void *buf, size_t len)
{
	struct clt_con *con = container_of(priv, struct clt_con, c);
	struct clt_path *p = con->path;
	struct rtrs_limits lim = {
		.queue_depth = p->sess->queue_depth, .chunk_size = p->sess->chunk_size,
		.max_hdr_size = p->sess->max_hdr_size,
	};
	const char *why = NULL;
	int rc;

	rtrs_hb_heard(&p->base.hb);
	if (p->sess->kinval && (con->c.cid != 0 || rtrs_msg_type(buf, len) == RTRS_MSG_RKEY_RSP)) {
		/*
		 * A chunk's new key (IO answered on the admin connection too);
		 * the response's immediate follows at once.
		 */
		uint32_t id, key;

		rc = rtrs_rkey_rsp_decode(buf, len, p->sess->queue_depth, &id, &key, &why);
		if (rc) {
			log_err_rl("%s: invalid key message on connection %u: %s", p->name, con->c.cid,
				   why);
			clt_fail_path(p, rc);
			return;
		}
		con->rkey_buf_id = id;
		con->rkey = key;
		return;
	}
	if (con->c.cid == 0 && rtrs_msg_type(buf, len) == RTRS_MSG_AUTH) {
		bool connected;

		/*
		 * For the attempt's next step, which runs the transaction; on a
		 * connected path, a re-authentication's (the server asks for
		 * one, or answers it). The state is read under the lock that
		 * stores the message: path_attempt_done makes the path
		 * CONNECTED and then looks for a stored message under it, so one
		 * of the two sees the other (read before, a message that came
		 * as the path connected was kicked to an attempt that was over).
		 */
		pthread_mutex_lock(&p->lock);
		connected = atomic_load(&p->base.state) == RTRS_PATH_CONNECTED;
		if (p->auth_rx_n == (connected ? 2u : 1u) || len > sizeof(p->auth_rx[0])) {
			pthread_mutex_unlock(&p->lock);
			log_err_rl("%s: unexpected authentication message", p->name);
			clt_fail_path(p, -EPROTO);
			return;
		}
		memcpy(p->auth_rx[p->auth_rx_n], buf, len);
		p->auth_rx_len[p->auth_rx_n++] = len;
		pthread_mutex_unlock(&p->lock);
		if (connected)
			loop_queue(p->sess->loop, &p->reauth_work);
		else
			clt_path_kick(p);
		return;
	}
	if (con->c.cid == 0 && atomic_load(&p->base.state) == RTRS_PATH_CONNECTED) {
		/* Once connected, the only other message is a fence's answer. */
		rc = clt_fence_answered(p, buf, len);
		if (rc)
			clt_fail_path(p, rc);
		return;
	}
	pthread_mutex_lock(&p->lock);
	if (con->c.cid != 0 || p->info_done) {
		pthread_mutex_unlock(&p->lock);
		log_err_rl("%s: unexpected message on connection %u", p->name, con->c.cid);
		clt_fail_path(p, -EPROTO);
		return;
	}
	int verdict;
	bool dnr;

	lim.ext = p->sess->srv_ext;
	lim.key64 = p->sess->inval;
	rc = rtrs_info_rsp_decode(buf, len, &lim, p->rbufs, p->info_gens, &verdict, &dnr, &why);
	if (rc) {
		log_err("%s: invalid info response: %s", p->name, why);
	} else if (verdict) {
		log_err("%s: server refused the path: %s%s", p->name, strerror(-verdict),
			dnr ? " (do not retry)" : "");
		atomic_store(&p->fail_dnr, dnr);
		clt_path_refused(p, verdict);
		rc = verdict;
	} else if (p->sess->inval) {
		for (uint32_t i = 0; i < p->sess->queue_depth; i++)
			clt_sess_key_update(p->sess, i, p->info_gens[i], p->rbufs[i].key);
	}
	p->info_err = rc;
	p->info_done = true;
	pthread_mutex_unlock(&p->lock);
	clt_path_kick(p);
}

static const struct fab_con_ops clt_con_ops = {
	.connected = clt_con_connected,
	.down = clt_con_down,
	.imm = rtrs_con_imm,
	.recv = clt_con_recv,
	.done = clt_con_done,
	.kick = rtrs_con_kick,
};

static int path_auth_begin(struct clt_path *p);

/* Allocates what depends on the queue depth, once per session. */
static int sess_set_limits(struct rtrs_clt_sess *s, const struct rtrs_conn_rsp *rsp)
{
	uint32_t qd = rsp->queue_depth;

	if (s->queue_depth) {
		if (qd != s->queue_depth || rsp->chunk_size != s->chunk_size)
			return -ECONNRESET;
		return 0;
	}
	s->reqs = calloc(qd, sizeof(*s->reqs));
	s->permits = calloc(qd, sizeof(*s->permits));
	s->free_ids = calloc(qd, sizeof(*s->free_ids));
	s->quar_ids = calloc(qd, sizeof(*s->quar_ids));
	/* aligned_alloc wants a multiple of the alignment. */
	s->hdr_area = aligned_alloc(4096, ((size_t)qd * rsp->max_hdr_size + 4095) & ~(size_t)4095);
	s->rkeys = calloc(qd, sizeof(*s->rkeys));
	s->rkey_gens = calloc(qd, sizeof(*s->rkey_gens));
	s->bounce = calloc(qd, sizeof(*s->bounce));
	if (!s->reqs || !s->permits || !s->free_ids || !s->quar_ids || !s->hdr_area || !s->rkeys ||
	    !s->rkey_gens || !s->bounce) {
		/* All or none: a later attempt allocates them again. */
		clt_sess_tables_free(s);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < qd; i++) {
		s->reqs[i].sess = s;
		s->reqs[i].id = i;
		atomic_init(&s->reqs[i].state, REQ_IDLE);
		s->permits[i].id = i;
		s->free_ids[i] = qd - 1 - i;
	}
	s->nr_free = qd;
	s->max_io_size = rsp->max_io_size;
	s->max_hdr_size = rsp->max_hdr_size;
	s->chunk_size = rsp->chunk_size;
	s->queue_depth = qd;
	return 0;
}

/* Asks for connection cid; the answer comes as its connected or down callback. */
static int path_connect_con(struct clt_path *p, unsigned cid)
{
	struct rtrs_clt_sess *s = p->sess;
	struct clt_con *con = &p->cons[cid];
	const struct fab_attr *a = fab_attr(p->fab);
	struct rtrs_conn_req req = {
		.cid = (uint16_t)cid, .cid_num = (uint16_t)p->base.nr_cons,
		.recon_cnt = p->recon_cnt, .first_conn = p->first_sent,
		.ext = !atomic_load(&rtrs_test_kernel_clt), .fence = true, .auth = true,
	};
	struct rtrs_msg_conn_req msg;
	char name[RTRS_NAME_MAX + 16];
	struct fab_con_cfg cfg = {
		.ops = &clt_con_ops, .priv = &con->c, .name = name,
		.tx_depth = cid ? s->queue_depth + 16 : 128,
		/* verbs: one receive per incoming immediate (responses), as many as the kernel's */
		.rx_depth = cid && (a->rx_cq_data || s->kinval) ?
			    rtrs_clt_io_rx_depth(s->queue_depth) : 0,
		/* kinval: each response comes in a message, its chunk's new key */
		.rx_size = cid && s->kinval ? sizeof(struct rtrs_msg_rkey_rsp) : 0,
		.rx_queue = cid ? 0 : RTRS_CLT_ADMIN_RX_QUEUE,
		.poll_us = cid ? s->busy_poll_us : 0,
		.live_ms = rtrs_live_ms(s->hb_interval_ms, s->hb_missed_max),
	};

	snprintf(name, sizeof(name), "%s#%u", s->name, cid);
	memcpy(req.sess_uuid, p->uuid, RTRS_UUID_LEN);
	memcpy(req.paths_uuid, s->paths_uuid, RTRS_UUID_LEN);
	con->concat = p->concat_phase && !cid;
	if (con->concat) {
		/*
		 * A session and path of its own at the server, named after the
		 * path's (every byte ^ 0x5c): never the real ones, and the same
		 * at each try, so that a server busy with a storm of opens
		 * knows the retry as one that waits (rtrs_admit_waits).
		 */
		for (unsigned i = 0; i < RTRS_UUID_LEN; i++) {
			req.sess_uuid[i] ^= 0x5c;
			req.paths_uuid[i] ^= 0x5c;
		}
		req.concat = true;
		req.cid_num = 1;
		req.first_conn = true;
		snprintf(name, sizeof(name), "%s#concat", s->name);
	}
	rtrs_conn_req_encode(&msg, &req);
	con->path = p;
	con->c.cid = cid;
	con->rkey_buf_id = UINT32_MAX;
	pthread_mutex_lock(&p->lock);
	con->err = 0;
	con->connected = false;
	pthread_mutex_unlock(&p->lock);
	return fab_con_connect(p->fab, &cfg, &msg, sizeof(msg), &con->c.fc);
}

/*
 * What kind of server the path reached: one of this project, or a kernel
 * server, which the session then speaks the kernel's protocol to. Fixed
 * by the first path; a path that finds the other kind (a server replaced
 * under the session) needs a decision, not retries.
 */
static int path_server_kind(struct clt_path *p, const struct rtrs_conn_rsp *rsp)
{
	struct rtrs_clt_sess *s = p->sess;

	if (!rsp->ext && strchr(s->name, '.')) {
		/* It would refuse the info request with EINVAL, naming nothing. */
		log_err("%s: the server speaks the kernel's RTRS only, which refuses a session name "
			"with a '.'; choose another session name", p->name);
		err_detail("the server speaks the kernel's RTRS only, which refuses a session name "
			   "with a '.' (%s)", s->name);
		atomic_store(&p->fail_dnr, true);
		return -EINVAL;
	}
	if (!s->srv_ext_known) {
		s->srv_ext = rsp->ext;
		s->srv_ext_known = true;
		if (!rsp->ext)
			log_info("%s: the server speaks the kernel's RTRS only: no fencing, no "
				 "authentication, one descriptor per read", p->name);
	} else if (rsp->ext != s->srv_ext) {
		log_err("%s: the server %s this project's extensions, unlike the session's first "
			"one; reconnect by hand", p->name, rsp->ext ? "now speaks" : "no longer speaks");
		atomic_store(&p->fail_dnr, true);
		return -ECONNRESET;
	}
	return 0;
}

/*
 * Whether the path reached a server session other than the one the keys
 * (and the user's state, RNBD's open devices) came from. A server of ours
 * names its incarnation; a kernel server does not, and any connect that
 * could have set the session up anew (one carrying RTRS_CONN_FIRST) may
 * have reached a new one: the user is told, and opens its devices again
 * (a kernel rnbd-server answers an OPEN of a device already open with its
 * id, as its own client reopens after every reconnect).
 */
static bool path_new_server_session(struct clt_path *p, const struct rtrs_conn_rsp *rsp)
{
	struct rtrs_clt_sess *s = p->sess;

	return s->srv_ext ? rsp->sess_id != s->srv_sess_id : p->first_sent;
}

static int path_after_first_con(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	const struct rtrs_conn_rsp *rsp = &p->cons[0].rsp;
	size_t rx_size;
	int rc;

	rc = sess_set_limits(s, rsp);
	if (rc == -ECONNRESET) {
		/* As the kernel: a changed server needs a decision, not retries. */
		log_err("%s: server queue depth %u / chunk %u differs from the session's %u / %u; "
			"no automatic reconnect, reconnect by hand", p->name, rsp->queue_depth,
			rsp->chunk_size, s->queue_depth, s->chunk_size);
		atomic_store(&p->fail_dnr, true);
	}
	if (rc)
		return rc;
	/* As the kernel's for_new_clt: this path may set the session up again from now on. */
	p->connected_once = true;
	atomic_store(&s->ever_accepted, true);
	rc = path_server_kind(p, rsp);
	if (rc)
		return rc;
	bool inval = rsp->flags & RTRS_MSG_KEY64_F;
	/* The kernel's always_invalidate (rtrs-clt-io.c: clt_handle_rsp). */
	bool kinval = !s->srv_ext && rsp->kernel_inval;

	if (!s->inval_known) {
		s->inval = inval;
		s->kinval = kinval;
		s->inval_known = true;
		if (kinval)
			log_info("%s: the server invalidates chunk keys the kernel's way: a new key "
				 "with each response", p->name);
	} else if (inval != s->inval || kinval != s->kinval) {
		inval = inval || kinval;
		log_err("%s: the server switched always_invalidate %s; reconnect by hand", p->name,
			inval ? "on" : "off");
		atomic_store(&p->fail_dnr, true);
		return -ECONNRESET;
	}
	/* Compared and changed under the lock: paths connecting at once count it once. */
	pthread_mutex_lock(&s->rkey_lock);
	if (path_new_server_session(p, rsp)) {
		/* A new server session (it restarted): keys of the old one mean nothing. */
		memset(s->rkeys, 0, (size_t)s->queue_depth * sizeof(*s->rkeys));
		memset(s->rkey_gens, 0, (size_t)s->queue_depth * sizeof(*s->rkey_gens));
		s->srv_sess_id = rsp->sess_id;
		atomic_fetch_add(&s->srv_sessions, 1);
		/*
		 * The user hears of it here, under the lock and before this
		 * path is up: a path connecting to the same new session at
		 * once waits for the lock, so no path to it carries a request
		 * before the callback has returned. The first one, at open, is
		 * not news.
		 */
		if (s->link_ev && atomic_load(&s->opened))
			s->link_ev(s->priv, RTRS_CLT_LINK_EV_SERVER_SESSION);
	}
	pthread_mutex_unlock(&s->rkey_lock);
	/* A kernel server names no imm target: empty writes go to no address, key 0. */
	p->base.peer_imm = rsp->imm_desc;
	p->srv_fence = rsp->flags & RTRS_MSG_FENCE_F;
	free(p->rbufs);
	free(p->info_gens);
	p->rbufs = calloc(s->queue_depth, sizeof(*p->rbufs));
	p->info_gens = calloc(s->queue_depth, sizeof(*p->info_gens));
	if (!p->rbufs || !p->info_gens)
		return -ENOMEM;
	/* Empty writes land here; with always_invalidate: key slots, then the fence table. */
	if (!p->imm_area) {
		p->imm_len = MAX((size_t)RTRS_IMM_REGION,
				 2 * (size_t)s->queue_depth * RTRS_RKEY_SLOT);
		p->imm_area = calloc(1, p->imm_len);
		if (!p->imm_area)
			return -ENOMEM;
	}
	rc = fab_mr_reg(p->fab, p->imm_area, p->imm_len, FAB_MR_REMOTE_WRITE, &p->imm_mr);
	if (rc)
		return rc;
	rc = fab_mr_reg(p->fab, s->hdr_area, (size_t)s->queue_depth * s->max_hdr_size,
			FAB_MR_LOCAL, &p->hdr_mr);
	if (rc) {
		log_err("%s: registering the header area failed: %s", p->name, strerror(-rc));
		return rc;
	}
	rc = clt_path_mem_setup(p);
	if (rc)
		return rc;
	/*
	 * The info response holds up to one descriptor per chunk. On verbs
	 * every incoming immediate (admin IO responses too) takes a receive.
	 */
	rx_size = MAX(rtrs_info_rsp_size(s->queue_depth, s->inval ? s->queue_depth : 0),
		      RTRS_ADMIN_MSG_SIZE);
	rc = fab_con_rx_setup(p->cons[0].c.fc,
			      fab_attr(p->fab)->rx_cq_data ?
			      MIN(s->queue_depth + 16, RTRS_CLT_ADMIN_RX_QUEUE) : 2, rx_size);
	if (rc) {
		log_err("%s: posting receives on the admin connection failed: %s", p->name,
			strerror(-rc));
		return rc;
	}
	if (rsp->flags & RTRS_MSG_AUTH_F)
		return path_auth_begin(p);
	if (!s->srv_ext && s->auth.hkey.len) {
		/* Never AUTH messages to a kernel server: it would take them for garbage. */
		log_err("%s: the server does not offer authentication (it speaks only the kernel's "
			"RTRS), and this client has a secret to authenticate with: refused", p->name);
		atomic_store(&p->fail_dnr, true);
		return -EPROTONOSUPPORT;
	}
	if (s->auth.ckey.len) {
		log_err("%s: the server offers no authentication, and this client must "
			"authenticate it (controller secret set)", p->name);
		return -ENOKEY;
	}
	return 0;
}

void clt_path_release_mrs(struct clt_path *p)
{
	clt_path_mem_release(p);
	fab_mr_dereg(&p->auth_tx_mr);
	fab_mr_dereg(&p->fence_mr);
	fab_mr_dereg(&p->hdr_mr);
	fab_mr_dereg(&p->info_req_mr);
	fab_mr_dereg(&p->imm_mr);
}

/*
 * After the connections are gone: the path's registrations. Its fabric
 * stays for the next attempt (opening one resolves, which may block):
 * path_fini closes it, or an attempt that lost the device (-ENODEV).
 */
void clt_path_release(struct clt_path *p)
{
	clt_path_release_mrs(p);
}


/* ---- authentication ------------------------------------------------------------ */

/*
 * The secrets for an authentication of p, into p->auth_cfg: read again from
 * their files (a rotated key is taken at the path's next authentication,
 * a re-authentication or a reconnect), else the ones in use.
 */
static void path_auth_keys(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	struct rtrs_auth_key hk = { 0 }, ck = { 0 };
	const char *why = NULL;
	int rc = 0;

	if (s->auth_secret_file)
		rc = rtrs_auth_key_load(s->auth_secret_file, &hk, &why);
	if (!rc && s->auth_ctrl_file)
		rc = rtrs_auth_key_load(s->auth_ctrl_file, &ck, &why);
	pthread_mutex_lock(&s->auth_lock);
	if (rc)
		log_warn("%s: cannot read the secret again (%s: %s): the one "
			 "in use stays", p->name, why ? why : "", strerror(-rc));
	else {
		bool changed = s->auth_secret_file && memcmp(&s->auth.hkey, &hk, sizeof(hk));

		if (s->auth_secret_file)
			s->auth.hkey = hk;
		if (s->auth_ctrl_file)
			s->auth.ckey = ck;
		/* A TLS PSK derived from the secret: the next handshakes take the new one's. */
		if (changed && s->tls && s->tls_derived) {
			struct rtrs_auth_key none = { 0 };
			struct rtrs_tls_ctx *t = NULL;

			if (!rtrs_tls_ctx_client(s->auth.name, s->auth.server, &none, &s->auth.hkey,
						 s->tls_no_ktls, &t)) {
				rtrs_tls_ctx_put(s->tls);
				s->tls = t;
			}
		}
	}
	p->auth_cfg = s->auth;
	if (s->tls && p->fab)
		fab_set_tls(p->fab, FAB_TLS_REQUIRED, s->tls);
	pthread_mutex_unlock(&s->auth_lock);
	rtrs_auth_wipe(&hk, sizeof(hk));
	rtrs_auth_wipe(&ck, sizeof(ck));
}

/*
 * DH-HMAC-CHAP on connection 0: the first message out. The server's
 * answers come through clt_con_recv (auth_rx), and CST_AUTH answers them.
 */

/* The first message waiting in auth_rx to auth_msg; false when none waits. */
static bool auth_rx_take(struct clt_path *p)
{
	bool got;

	pthread_mutex_lock(&p->lock);
	got = p->auth_rx_n != 0;
	if (got) {
		p->auth_msg_len = p->auth_rx_len[0];
		memcpy(p->auth_msg, p->auth_rx[0], p->auth_rx_len[0]);
		if (--p->auth_rx_n) {
			p->auth_rx_len[0] = p->auth_rx_len[1];
			memcpy(p->auth_rx[0], p->auth_rx[1], p->auth_rx_len[1]);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return got;
}

/* The next authentication's transaction id: never 0, which marks a path that never authenticated. */
static uint16_t auth_tid_next(struct clt_path *p)
{
	if (!++p->auth_tid)
		p->auth_tid = 1;
	return p->auth_tid;
}
static int path_auth_begin(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	size_t out_len = 0;
	int rc;

	if (!s->auth.hkey.len) {
		log_err("%s: the server requires authentication and this client has no secret",
			p->name);
		return -ENOKEY;
	}
	rc = fab_mr_reg(p->fab, p->auth_tx, sizeof(p->auth_tx), FAB_MR_LOCAL, &p->auth_tx_mr);
	if (rc)
		return rc;
	p->auth_active = true;
	path_auth_keys(p);
	p->auth_cfg.scc = p->concat_phase ? RTRS_AUTH_SCC_NEWTLSPSK : RTRS_AUTH_SCC_NONE;
	rc = rtrs_auth_clt_begin(&p->auth, &p->auth_cfg, p->name, auth_tid_next(p), p->auth_tx,
				 sizeof(p->auth_tx), &out_len);
	if (!rc && out_len)
		rc = fab_send(p->cons[0].c.fc, p->auth_tx, out_len, p->auth_tx_mr.desc, NULL);
	return rc;
}

/* The transaction is over (rc: how); its secrets are wiped. */
static void path_auth_end(struct clt_path *p, int rc)
{
	struct rtrs_clt_sess *s = p->sess;

	if (!p->auth_active)
		return;
	/* The worker lets go of auth first (a step under way is waited for). */
	offload_cancel(&p->auth_job);
	p->auth_active = false;
	if (!rc) {
		atomic_fetch_add(&p->stat_auth_runs, 1);
		log_info("%s: authenticated as %s (%s, %s%s)", p->name, s->auth.name,
			 rtrs_auth_hash_name(p->auth.hash), rtrs_auth_dhgroup_name(p->auth.group),
			 p->auth.bidir ? ", server authenticated too" : "");
	} else {
		log_err("%s: authentication failed: %s", p->name, strerror(-rc));
	}
	rtrs_auth_txn_end(&p->auth);
}

/* ---- re-authentication of a connected path ---------------------------------------- */

/*
 * The server's key file changed and it asks this path to authenticate
 * again (RTRS_AUTH_REAUTH, docs/security.md section 3.8): the secrets are
 * read again from their files (a client whose key was rotated has its new
 * one there), and a new transaction runs on connection 0 while IO goes on.
 * A refusal fails the path with the transaction's verdict (-EKEYREJECTED:
 * it does not retry).
 */
static void path_reauth_job(struct offload_job *j)
{
	struct clt_path *p = container_of(j, struct clt_path, reauth_job);

	p->auth_out_len = 0;
	p->auth_step = rtrs_auth_clt_step(&p->auth, p->auth_msg, p->auth_msg_len, p->auth_tx,
					  sizeof(p->auth_tx), &p->auth_out_len);
}

static void path_reauth_job_done(struct offload_job *j)
{
	struct clt_path *p = container_of(j, struct clt_path, reauth_job);

	loop_queue(p->sess->loop, &p->reauth_work);
}

static void path_reauth_end(struct clt_path *p, int rc)
{
	p->reauth = false;
	rtrs_auth_txn_end(&p->auth);
	if (!rc) {
		atomic_fetch_add(&p->stat_auth_runs, 1);
		log_info("%s: authenticated again as %s (%s, %s)", p->name, p->auth_cfg.name,
			 rtrs_auth_hash_name(p->auth.hash), rtrs_auth_dhgroup_name(p->auth.group));
		return;
	}
	log_err("%s: re-authentication failed: %s", p->name, strerror(-rc));
	if (rc == -EKEYREJECTED || rc == -ENOKEY)
		atomic_store(&p->fail_dnr, true);
	clt_fail_path(p, rc);
}

/* Loop thread: the job's answer out, then the next message of the server in. */
static void path_reauth_work(struct loop_work *w)
{
	struct clt_path *p = container_of(w, struct clt_path, reauth_work);
	struct rtrs_auth_msg m;
	const char *why = NULL;
	size_t out_len = 0;
	int st, rc;

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED) {
		/* The path went down: the next attempt authenticates from scratch. */
		if (p->reauth) {
			offload_cancel(&p->reauth_job);
			p->reauth = false;
			rtrs_auth_txn_end(&p->auth);
		}
		return;
	}
	st = atomic_load(&p->reauth_job.state);
	if (p->reauth && st == OFFLOAD_DONE && offload_take(&p->reauth_job)) {
		enum rtrs_auth_step step = (enum rtrs_auth_step)p->auth_step;

		rc = p->auth_out_len ? fab_send(p->cons[0].c.fc, p->auth_tx, p->auth_out_len,
						p->auth_tx_mr.desc, NULL) : 0;
		if (step == RTRS_AUTH_FAILED) {
			path_reauth_end(p, p->auth.err ? p->auth.err : -EKEYREJECTED);
			return;
		}
		if (rc) {
			path_reauth_end(p, rc);
			return;
		}
		if (step == RTRS_AUTH_DONE)
			path_reauth_end(p, 0);
	} else if (st == OFFLOAD_QUEUED || st == OFFLOAD_RUNNING) {
		return; /* its end queues this again */
	}
	if (!auth_rx_take(p))
		return;
	rc = rtrs_auth_decode(p->auth_msg, p->auth_msg_len, &m, &why);
	if (!rc && m.id == RTRS_AUTH_REAUTH) {
		if (p->reauth) {
			log_err("%s: a second re-authentication request during one", p->name);
			clt_fail_path(p, -EPROTO);
			return;
		}
		if (!p->auth_tid) {
			log_err("%s: re-authentication asked of a path that never authenticated",
				p->name);
			clt_fail_path(p, -EPROTO);
			return;
		}
		log_info("%s: the server asks to authenticate again", p->name);
		path_auth_keys(p);
		rc = rtrs_auth_clt_begin(&p->auth, &p->auth_cfg, p->name, auth_tid_next(p), p->auth_tx,
					 sizeof(p->auth_tx), &out_len);
		p->reauth = true;
		if (!rc && out_len)
			rc = fab_send(p->cons[0].c.fc, p->auth_tx, out_len, p->auth_tx_mr.desc, NULL);
		if (rc)
			path_reauth_end(p, rc);
		return;
	}
	if (!p->reauth) {
		log_err("%s: authentication message on a connected path%s%s", p->name,
			rc ? ": " : "", rc ? why : "");
		clt_fail_path(p, -EPROTO);
		return;
	}
	/* The transaction's next step (a DH exchange, maybe) on a worker. */
	if (offload_submit(&p->reauth_job) == -EAGAIN) {
		p->reauth_job.fn(&p->reauth_job);
		atomic_store(&p->reauth_job.state, OFFLOAD_DONE);
		loop_queue(p->sess->loop, &p->reauth_work);
	}
}

/* ---- the attempt as a state machine ---------------------------------------------- */

/*
 * The steps of an attempt (clt_path.cst), each waiting for one thing. On
 * the loop: path_step runs when a callback queued conn_work or the step's
 * timer (connect_timeout_ms) fired. A step's ready() (p->lock held) says
 * whether what it waits for came; its leave() acts on it and names the
 * next step, whose enter() sends what that one waits an answer to.
 */
enum clt_cst {
	CST_IDLE,  /* no attempt */
	CST_OPEN,  /* the fabric opened again (its device went) on an offload worker: waits for it */
	CST_CON,   /* connection cst_cid asked for: waits for the server's answer */
	CST_AUTH,  /* authenticating on connection 0: waits for the server's next message */
	CST_AUTH_CALC, /* ... which an offload worker answers (auth_job): waits for it */
	CST_INFO,  /* the info request sent: waits for the response */
	CST_DONE,  /* leave(): the path is established */
	CST_NR,
};

struct clt_cst_def {
	const char *name;
	int (*enter)(struct clt_path *p);  /* 0: under way; or the attempt fails */
	int (*ready)(struct clt_path *p);  /* 1: came; 0: not yet; < 0: the attempt fails */
	int (*leave)(struct clt_path *p);  /* the next step, or < 0: the attempt fails */
};

static int path_fab_open_plain(struct clt_path *p, struct fab **out);
static int path_gave_up(struct clt_path *p);

/* j to an offload worker; with none to be had, run here (its result is the loop's next step). */
static int path_offload(struct clt_path *p, struct offload_job *j)
{
	int rc = offload_submit(j);

	if (rc == -EAGAIN) {
		j->fn(j);
		atomic_store(&j->state, OFFLOAD_DONE);
		clt_path_kick(p);
		rc = 0;
	}
	return rc;
}

/*
 * A path's fabric opened again on an offload worker (CST_OPEN). Resolving
 * a name or an RDMA address may take seconds, and a device that is gone
 * longer, so nothing on the loop waits for the job: it works on copies of
 * what it opens with, and the path and the worker each hold it (refs). An
 * attempt ended by force lets go (wanted false): the worker closes the
 * fabric it opens then. The path keeps the job while it runs, so that its
 * next attempt waits for this one instead of starting another
 * (open_job_want); a path freed meanwhile lets go of it whole (p NULL).
 */
struct clt_open_job {
	struct offload_job job;
	pthread_mutex_t lock;       /* what follows; the path's lock before it */
	struct clt_path *p;         /* kicked when done; NULL: the path let go */
	unsigned refs;              /* the path's and the worker's */
	bool wanted;                /* an attempt waits for the fabric; else it is closed */
	bool done;                  /* fn returned: fab or rc */
	struct fab *fab;            /* opened for an attempt, until it takes it */
	int rc;
	struct rtrs_tls_ctx *tls;   /* the session's when submitted (referenced), or NULL */
	char prov[32], src[256], host[256], port[8], name[528];
};

static void open_job_unref(struct clt_open_job *oj)
{
	bool last;

	pthread_mutex_lock(&oj->lock);
	last = --oj->refs == 0;
	pthread_mutex_unlock(&oj->lock);
	if (!last)
		return;
	if (oj->tls)
		rtrs_tls_ctx_put(oj->tls);
	pthread_mutex_destroy(&oj->lock);
	free(oj);
}

/* Offload worker. */
static void open_job_fn(struct offload_job *j)
{
	struct clt_open_job *oj = container_of(j, struct clt_open_job, job);
	struct fab *f = NULL;
	bool keep;
	int rc;

	rc = fab_open(oj->prov, oj->src[0] ? oj->src : NULL, oj->host, oj->port, false,
		      RTRS_CLT_QUEUE_HINT, &f);
	if (!rc && oj->tls) {
		rc = fab_set_tls(f, FAB_TLS_REQUIRED, oj->tls);
		if (rc) {
			fab_close(f);
			f = NULL;
		}
	}
	if (rc)
		f = NULL;
	pthread_mutex_lock(&oj->lock);
	oj->done = true;
	keep = oj->wanted;
	if (keep) {
		oj->fab = f;
		oj->rc = rc;
	}
	pthread_mutex_unlock(&oj->lock);
	if (!keep && f) {
		log_info("%s: the fabric opened after its attempt ended is closed", oj->name);
		fab_close(f);
	}
}

/* On the worker, under the pool's lock (or on the loop, cst_open_enter): the attempt takes it. */
static void open_job_notify(struct offload_job *j)
{
	struct clt_open_job *oj = container_of(j, struct clt_open_job, job);

	pthread_mutex_lock(&oj->lock);
	if (oj->p && oj->wanted)
		clt_path_kick(oj->p);
	pthread_mutex_unlock(&oj->lock);
	open_job_unref(oj);
}

/*
 * The path's job, if one is under way (an attempt ended by force left it
 * running), is wanted again: true, and this attempt waits for it. A job
 * that is done opened nothing for the path (nobody wanted it) and goes.
 */
static bool open_job_want(struct clt_path *p)
{
	struct clt_open_job *oj = p->open_job;
	bool running;

	if (!oj)
		return false;
	pthread_mutex_lock(&oj->lock);
	running = !oj->done;
	if (running)
		oj->wanted = true;
	pthread_mutex_unlock(&oj->lock);
	if (!running)
		clt_path_open_job_end(p, true);
	return running;
}

static int cst_open_enter(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	struct clt_open_job *oj;
	int rc;

	if (open_job_want(p)) {
		log_info("%s: waits for the fabric an earlier attempt is opening", p->name);
		return 0;
	}
	oj = calloc(1, sizeof(*oj));
	if (!oj)
		return -ENOMEM;
	pthread_mutex_init(&oj->lock, NULL);
	offload_job_init(&oj->job, open_job_fn, open_job_notify);
	oj->p = p;
	oj->refs = 2;
	oj->wanted = true;
	snprintf(oj->prov, sizeof(oj->prov), "%s", s->provider);
	snprintf(oj->src, sizeof(oj->src), "%s", p->src);
	snprintf(oj->host, sizeof(oj->host), "%s", p->host);
	snprintf(oj->port, sizeof(oj->port), "%s", p->port);
	snprintf(oj->name, sizeof(oj->name), "%s", p->name);
	pthread_mutex_lock(&s->auth_lock);
	oj->tls = s->tls;
	if (oj->tls)
		rtrs_tls_ctx_get(oj->tls);
	pthread_mutex_unlock(&s->auth_lock);
	p->open_job = oj;
	rc = offload_submit(&oj->job);
	if (rc == -EAGAIN) {
		/* No worker to be had: here (its result is the loop's next step). */
		open_job_fn(&oj->job);
		open_job_notify(&oj->job);
		rc = 0;
	}
	if (rc) {
		oj->done = true; /* it never runs: not waited for again */
		open_job_unref(oj); /* the worker's */
	}
	return rc;
}

/* Waited for whatever else happens, but for a forced end (path_step). */
static int cst_open_ready(struct clt_path *p)
{
	struct clt_open_job *oj = p->open_job;
	bool done;

	if (!oj)
		return -EIO;
	pthread_mutex_lock(&oj->lock);
	done = oj->done;
	pthread_mutex_unlock(&oj->lock);
	return done;
}

/* The fence message's registration, then connection 0. */
static int path_fab_ready(struct clt_path *p)
{
	int rc = fab_mr_reg(p->fab, &p->fence_msg, sizeof(p->fence_msg), FAB_MR_LOCAL,
			    &p->fence_mr);

	/* Concatenation: every attempt begins in the clear and makes its own PSK. */
	p->concat_phase = p->sess->tls_concat;
	if (!rc && p->concat_phase)
		rc = fab_set_tls(p->fab, FAB_TLS_OFF, NULL);
	return rc ? rc : CST_CON;
}

static int cst_open_leave(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	struct clt_open_job *oj = p->open_job;
	struct fab *f;
	int rc;

	pthread_mutex_lock(&oj->lock);
	f = oj->fab;
	rc = oj->rc;
	oj->fab = NULL;
	pthread_mutex_unlock(&oj->lock);
	clt_path_open_job_end(p, true);
	if (rc) {
		log_err("%s: cannot resolve %s:%s with provider %s: %s", p->name, p->host, p->port,
			s->provider, strerror(-rc));
		return rc;
	}
	p->fab = f;
	rc = path_gave_up(p);
	return rc ? rc : path_fab_ready(p);
}

/* ---- secure channel concatenation (docs/security.md section 9.3) -------------------- */

/* The concatenation's connection is up: its exchange, with SC_C NEWTLSPSK. */
static int path_concat_begin(struct clt_path *p)
{
	int rc;

	if (!p->cons[0].rsp.ext || !(p->cons[0].rsp.flags & RTRS_MSG_AUTH_F)) {
		log_err("%s: the server took a secure channel concatenation without asking for "
			"authentication", p->name);
		atomic_store(&p->fail_dnr, true);
		return -EPROTO;
	}
	rc = fab_con_rx_setup(p->cons[0].c.fc, 2, RTRS_ADMIN_MSG_SIZE);
	if (rc)
		return rc;
	rc = path_auth_begin(p);
	return rc ? rc : CST_AUTH;
}

/*
 * The exchange is done: its PSK makes the path's TLS context, the
 * connection in the clear goes, and the attempt connects again from
 * connection 0, with TLS, as for RTRS_TLS_REQUIRED.
 */
static int path_concat_switch(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	char digest[RTRS_TLS_DIGEST_LEN + 1];
	struct rtrs_tls_ctx *t = NULL;
	struct rtrs_auth_key k;
	int rc;

	rc = rtrs_auth_txn_tls_psk(&p->auth, p->auth_cfg.name, p->auth_cfg.server, &k, digest);
	if (!rc)
		rc = rtrs_tls_ctx_client_generated(p->auth_cfg.name, p->auth_cfg.server, &k, digest,
						   s->tls_no_ktls, &t);
	rtrs_auth_wipe(&k, sizeof(k));
	path_auth_end(p, rc);
	if (rc)
		return rc;
	fab_con_destroy(p->cons[0].c.fc);
	p->cons[0].c.fc = NULL;
	p->cons[0].concat = false;
	fab_mr_dereg(&p->auth_tx_mr);
	rc = fab_set_tls(p->fab, FAB_TLS_REQUIRED, t);
	rtrs_tls_ctx_put(t);
	if (rc)
		return rc;
	p->concat_phase = false;
	log_info("%s: TLS PSK %s generated by the exchange (secure channel concatenation)",
		 p->name, digest);
	return CST_CON;
}

static int cst_con_enter(struct clt_path *p)
{
	return path_connect_con(p, p->cst_cid);
}

static int cst_con_ready(struct clt_path *p)
{
	const struct clt_con *con = &p->cons[p->cst_cid];

	return con->connected ? 1 : con->err;
}

/* After connection 0 and its authentication: the next connection, or the info exchange. */
static int cst_after_con(struct clt_path *p)
{
	if (++p->cst_cid < p->base.nr_cons)
		return CST_CON;
	return CST_INFO;
}

static int cst_con_leave(struct clt_path *p)
{
	int rc;

	if (p->cst_cid != 0)
		return cst_after_con(p);
	if (p->concat_phase)
		return path_concat_begin(p);
	rc = path_after_first_con(p);
	if (rc)
		return rc;
	return p->auth_active ? CST_AUTH : cst_after_con(p);
}

static int cst_auth_ready(struct clt_path *p)
{
	return p->auth_rx_n ? 1 : p->cons[0].err;
}

/* The server's message goes to the worker (CST_AUTH_CALC). */
static int cst_auth_leave(struct clt_path *p)
{
	auth_rx_take(p);
	return CST_AUTH_CALC;
}

/* Offload worker: the answer to the server's message (a DH exchange, maybe). */
static void path_auth_job(struct offload_job *j)
{
	struct clt_path *p = container_of(j, struct clt_path, auth_job);

	p->auth_out_len = 0;
	err_detail_clear();
	p->auth_step = rtrs_auth_clt_step(&p->auth, p->auth_msg, p->auth_msg_len, p->auth_tx,
					  sizeof(p->auth_tx), &p->auth_out_len);
	/* The why of a refusal is this thread's: the loop takes it with the verdict. */
	snprintf(p->auth_detail, sizeof(p->auth_detail), "%s", err_detail_get());
}

/* Offload worker, the pool's lock held: the loop takes the answer. */
static void path_auth_job_done(struct offload_job *j)
{
	clt_path_kick(container_of(j, struct clt_path, auth_job));
}

static int cst_auth_calc_enter(struct clt_path *p)
{
	return path_offload(p, &p->auth_job);
}

/*
 * The answer is waited for even when connection 0 went down meanwhile: a
 * FAILURE1 being read tells more than the close after it (the step's timer
 * still bounds the wait).
 */
static int cst_auth_calc_ready(struct clt_path *p)
{
	return atomic_load(&p->auth_job.state) == OFFLOAD_DONE;
}

static int cst_auth_calc_leave(struct clt_path *p)
{
	enum rtrs_auth_step step;
	int rc = 0;

	if (!offload_take(&p->auth_job))
		return -EIO; /* ready said done */
	step = (enum rtrs_auth_step)p->auth_step;
	if (p->auth_detail[0])
		err_detail("%s", p->auth_detail);
	if (p->auth_out_len)
		rc = fab_send(p->cons[0].c.fc, p->auth_tx, p->auth_out_len, p->auth_tx_mr.desc,
			      NULL);
	/* The verdict before a send that failed: the server may have closed already. */
	if (step == RTRS_AUTH_FAILED)
		return p->auth.err ? p->auth.err : -EACCES;
	if (rc)
		return rc;
	if (step != RTRS_AUTH_DONE)
		return CST_AUTH;
	if (p->concat_phase)
		return path_concat_switch(p);
	path_auth_end(p, 0);
	return cst_after_con(p);
}

static int cst_info_enter(struct clt_path *p)
{
	struct rtrs_info_req r = { 0 };
	int rc;

	snprintf(r.pathname, sizeof(r.pathname), "%s", p->sess->name);
	if (p->sess->srv_ext) {
		/* A kernel server gets its reserved bytes as zeros. */
		r.imm_addr = p->imm_mr.base;
		r.imm_key = (uint32_t)p->imm_mr.key;
	}
	rtrs_info_req_encode(&p->info_req, &r);
	rc = fab_mr_reg(p->fab, &p->info_req, sizeof(p->info_req), FAB_MR_LOCAL, &p->info_req_mr);
	if (rc)
		return rc;
	return fab_send(p->cons[0].c.fc, &p->info_req, sizeof(p->info_req), p->info_req_mr.desc,
			NULL);
}

static int cst_info_ready(struct clt_path *p)
{
	return p->info_done ? 1 : p->cons[0].err;
}

static int cst_info_leave(struct clt_path *p)
{
	return p->info_err ? p->info_err : CST_DONE;
}

static const struct clt_cst_def clt_cst_table[CST_NR] = {
	[CST_IDLE] = { "idle", NULL, NULL, NULL },
	[CST_OPEN] = { "open", cst_open_enter, cst_open_ready, cst_open_leave },
	[CST_CON] = { "connect", cst_con_enter, cst_con_ready, cst_con_leave },
	[CST_AUTH] = { "authenticate", NULL, cst_auth_ready, cst_auth_leave },
	[CST_AUTH_CALC] = { "authenticate (computing)", cst_auth_calc_enter, cst_auth_calc_ready,
			    cst_auth_calc_leave },
	[CST_INFO] = { "info", cst_info_enter, cst_info_ready, cst_info_leave },
	[CST_DONE] = { "done", NULL, NULL, NULL },
};

/*
 * Whether an open whose attempt failed with rc may try again: the server
 * refused it without "do not retry", or a peer that had taken the
 * connection dropped it (a storm of clients: the server closes a stalled
 * handshake, a silent socket over its limits, or a connection of a path
 * it just closed). Nothing listening, a silent peer, a timeout, an
 * unreachable host and a final verdict fail the open at once, as in the
 * kernel; so does a refusal at connect of a later connection unless the
 * server had answered this attempt (reached).
 */
static bool path_open_retryable(struct clt_path *p, int rc)
{
	if (atomic_load(&p->refused_err) == rc)
		return true;
	switch (rc) {
	case -ECONNRESET:
	case -ECONNABORTED:
	case -EIO:
	case -EPIPE:
	case -ENOTCONN:
	case -EAGAIN:
	case -EBUSY:
	case -EADDRNOTAVAIL: /* iWARP: the port the CM picked is in TIME_WAIT */
		return true;
	case -ECONNREFUSED:
		return atomic_load(&p->reached);
	default:
		return false;
	}
}

/* The open (or add) waiting on p has its verdict. Loop thread. */
static void path_open_finish(struct clt_path *p, int rc)
{
	p->opening = false;
	pthread_mutex_lock(&p->lock);
	/* The why, for rtrs_last_error() on the opener's thread. */
	snprintf(p->conn_detail, sizeof(p->conn_detail), "%s", rc ? err_detail_get() : "");
	p->conn_rc = rc;
	p->conn_done = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/*
 * The open job's fabric, if it is done and the attempt did not take it, is
 * closed; one still queued is taken off the queue (it never runs); one
 * running is not waited for: it closes what it opens (wanted false). The path keeps a running job for its next attempt
 * (open_job_want) unless last (path_fini: the path goes). Loop thread, or
 * the path's last user.
 */
void clt_path_open_job_end(struct clt_path *p, bool last)
{
	struct clt_open_job *oj = p->open_job;
	struct fab *f;
	bool done;

	if (!oj)
		return;
	/* Not started yet: it never runs, and its worker's reference is ours. */
	if (offload_dequeue(&oj->job)) {
		pthread_mutex_lock(&oj->lock);
		oj->done = true;
		pthread_mutex_unlock(&oj->lock);
		open_job_unref(oj);
	}
	pthread_mutex_lock(&oj->lock);
	oj->wanted = false;
	f = oj->fab;
	oj->fab = NULL;
	done = oj->done;
	if (done || last)
		oj->p = NULL; /* never kicked again: the path may go */
	pthread_mutex_unlock(&oj->lock);
	fab_close(f);
	if (done || last) {
		p->open_job = NULL;
		open_job_unref(oj);
	}
}

/* The attempt is over, either way: no step, no step timer, out of the count. */
static void path_attempt_over(struct clt_path *p)
{
	p->cst = CST_IDLE;
	loop_timer_arm(&p->conn_timer, 0, 0);
	if (p->attempt_counted) {
		p->attempt_counted = false;
		atomic_fetch_sub(&clt_reconnects_running, 1);
	}
}

/* The attempt got through: the path is up. */
static void path_attempt_done(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;

	if (atomic_load(&s->closing)) {
		/*
		 * Closed or shut down (rtrs_clt_shutdown_all) as the info response
		 * came: an open or an add fails with -ESHUTDOWN, as the header
		 * says, instead of returning a path the close then takes away.
		 */
		clt_path_attempt_failed(p, -ESHUTDOWN);
		return;
	}
	path_attempt_over(p);
	clt_path_poll_enroll(p); /* before a request can go out on it */
	atomic_store(&p->live_recon, p->recon_cnt); /* the incarnation requests go out on */
	rtrs_path_wrlock(&p->base);
	if (!clt_path_change_state(p, RTRS_PATH_CONNECTED)) {
		rtrs_path_wrunlock(&p->base);
		clt_path_attempt_failed(p, -EIO);
		return;
	}
	rtrs_path_wrunlock(&p->base);
	rtrs_path_hb_arm(&p->base);
	/*
	 * A re-authentication the server asked for during the info exchange
	 * (a key reload then): its message waits in auth_rx, kept for the
	 * connected path's work, which runs it now.
	 */
	pthread_mutex_lock(&p->lock);
	bool reauth_waits = p->auth_rx_n != 0;
	pthread_mutex_unlock(&p->lock);
	if (reauth_waits)
		loop_queue(s->loop, &p->reauth_work);
	if (atomic_fetch_add(&s->paths_up, 1) == 0 && s->link_ev && atomic_load(&s->opened))
		s->link_ev(s->priv, RTRS_CLT_LINK_EV_RECONNECTED);
	if (s->path_ev && atomic_load(&s->opened))
		s->path_ev(s->priv, p->idx, 1);
	/* A failure reported while we were finishing: handle it now. */
	if (atomic_load(&p->base.fail_err))
		loop_queue(s->loop, &p->base.fail_work);
	/*
	 * Requests that failed over from this path go too: the server took
	 * this reconnect only after the old path was drained and freed.
	 */
	clt_fence_implied(p);
	/* Requests waiting for a path go now. */
	loop_queue(s->loop, &s->wait_work);
	log_info("%s: connected, %u connections, queue depth %u, max io %u", p->name,
		 p->base.nr_cons, s->queue_depth, s->max_io_size);
	if (p->opening) {
		path_open_finish(p, 0);
	} else {
		atomic_store(&p->attempts, 0);
		atomic_store(&p->by_hand, false);
		atomic_fetch_add(&p->stat_reconnects, 1);
		log_info("%s: reconnected", p->name);
	}
}

/*
 * The attempt failed with rc: its connections and registrations go; then
 * an open tries again (path_open_retryable, RTRS_OPEN_TRIES in all) or
 * has its verdict, and a reconnect asks the reconnect decision.
 */
void clt_path_attempt_failed(struct clt_path *p, int rc)
{
	struct rtrs_clt_sess *s = p->sess;
	enum clt_cst st = p->cst;
	bool again, lost;

	path_attempt_over(p);
	if (st == CST_CON)
		/* A session closing or shut down is no failure of the connection. */
		log_at(rc == -ESHUTDOWN || ((rc == -EBUSY || rc == -EAGAIN) &&
					    !atomic_load(&p->fail_dnr)) ? LOG_INFO : LOG_ERR,
		       "%s: connection %u of %u failed: %s", p->name, p->cst_cid, p->base.nr_cons,
		       strerror(-rc));
	else if (st == CST_INFO)
		log_err("%s: info exchange failed: %s", p->name, strerror(-rc));
	path_auth_end(p, rc);
	clt_path_open_job_end(p, false);
	clt_path_destroy_cons(p);
	clt_path_release(p);
	lost = atomic_exchange(&p->fab_lost, false);
	if (rc == -ENODEV || lost) {
		/* The device went: the next attempt opens the fabric anew. */
		fab_close(p->fab);
		p->fab = NULL;
	}
	if (p->opening) {
		struct rtrs_reconnect_in in = {
			.attempts = p->open_attempt, .max_attempts = p->open_tries, .err = rc,
			.dnr = atomic_load(&p->fail_dnr), .stopping = atomic_load(&s->closing),
		};
		bool refused = atomic_load(&p->refused_err) == rc;

		atomic_store(&p->last_err, rc);
		if (rc == -ESHUTDOWN || !path_open_retryable(p, rc) ||
		    rtrs_should_reconnect(&in) != RTRS_RECONNECT_RETRY) {
			/* Out of tries (a final verdict was logged as such). */
			if (path_open_retryable(p, rc) && rc != -ESHUTDOWN && !in.stopping &&
			    !in.dnr && p->open_tries > 1)
				log_err("%s: the server %s the path (%s) %d times; giving up",
					p->name, refused ? "refused" : "dropped", strerror(-rc),
					p->open_attempt);
			rtrs_path_wrlock(&p->base);
			clt_path_change_state(p, RTRS_PATH_CLOSED);
			rtrs_path_wrunlock(&p->base);
			path_open_finish(p, rc);
			return;
		}
		unsigned ms = rtrs_reconnect_wait_ms(s->reconnect_delay_ms, s->reconnect_jitter_ms,
						     0);

		/* MIN: a delay set for reconnects must not hold an open for minutes. */
		ms = MIN(ms, 10000u);
		log_info("%s: the server %s the path (%s); trying again in %u ms (%d of %d)",
			 p->name, refused ? "refused" : "dropped", strerror(-rc), ms,
			 p->open_attempt + 1, p->open_tries);
		p->open_attempt++;
		loop_timer_arm(&p->reconnect_timer, MAX(ms, 1u), 0); /* state stays CONNECTING */
		return;
	}
	/* A reconnect: this attempt counts. */
	again = clt_path_should_reconnect(p, rc, atomic_load(&p->attempts) + 1);
	atomic_fetch_add(&p->attempts, 1);
	atomic_fetch_add(&p->stat_reconnect_failures, 1);
	rtrs_path_wrlock(&p->base);
	clt_path_change_state(p, again ? RTRS_PATH_RECONNECTING : RTRS_PATH_CLOSED);
	rtrs_path_wrunlock(&p->base);
	if (again)
		clt_path_schedule_reconnect(p, 0);
	else
		log_warn("%s: reconnect failed (%s); path closed after %d attempts", p->name,
			 strerror(-rc), atomic_load(&p->attempts));
}

static bool cst_is_auth(unsigned st)
{
	return st == CST_AUTH || st == CST_AUTH_CALC;
}

/* Arms the step's timer and sends what the step waits an answer to. */
static int path_enter(struct clt_path *p, enum clt_cst st)
{
	bool fresh = p->cst != st || st == CST_CON;
	/* The whole authentication shares one deadline, the computing included. */
	bool auth_on = cst_is_auth(p->cst) && cst_is_auth(st);

	p->cst = st;
	if (!fresh)
		return 0; /* the same step goes on: its timer too */
	if (!auth_on)
		loop_timer_arm(&p->conn_timer, p->sess->connect_timeout_ms, 0);
	return clt_cst_table[st].enter ? clt_cst_table[st].enter(p) : 0;
}

/*
 * Why an attempt in progress gives up, if it does: the path's failure, or
 * the session closing or shut down (rtrs_clt_shutdown_all), which a
 * failure reported before the attempt reset fail_err would miss.
 */
static int path_gave_up(struct clt_path *p)
{
	int err = atomic_load(&p->base.fail_err);

	return err ? err : atomic_load(&p->sess->closing) ? -ESHUTDOWN : 0;
}

/*
 * Takes the attempt as far as what has come allows; timeout: the step's
 * timer fired. Loop thread.
 */
static void path_step(struct clt_path *p, bool timeout, bool force)
{
	for (;;) {
		const struct clt_cst_def *d = &clt_cst_table[p->cst];
		int rc;

		if (p->cst == CST_IDLE) {
			/* An open between two tries, and the session closing: it ends now. */
			if (p->opening && atomic_load(&p->sess->closing)) {
				loop_timer_arm(&p->reconnect_timer, 0, 0);
				rtrs_path_wrlock(&p->base);
				clt_path_change_state(p, RTRS_PATH_CLOSED);
				rtrs_path_wrunlock(&p->base);
				path_open_finish(p, -ESHUTDOWN);
			}
			return;
		}
		/*
		 * What came is taken first (a server's FAILURE1 tells more than
		 * the close after it); a failure of the path or the session
		 * closing before a connection's own error.
		 */
		/*
		 * An offload job under way is waited for, unless the attempt
		 * is ended by force (a close, a disconnect: clt_path_attempt_poke):
		 * what an authentication answer makes of a FAILURE1 tells more
		 * than the failure that followed it, and a fabric being opened
		 * is the job's until it is done (its own resolution bounds it).
		 * A forced end waits for neither: the open job is let go of
		 * (clt_path_open_job_end) and closes the fabric it opens.
		 */
		bool wait_job = !force && (p->cst == CST_OPEN ||
					   (p->cst == CST_AUTH_CALC && !timeout));

		pthread_mutex_lock(&p->lock);
		rc = d->ready(p);
		if (rc <= 0 && !wait_job && path_gave_up(p))
			rc = path_gave_up(p);
		pthread_mutex_unlock(&p->lock);
		if (rc == 0) {
			if (!timeout || wait_job)
				return;
			rc = -ETIMEDOUT;
		}
		if (rc > 0)
			rc = d->leave(p);
		if (rc == CST_DONE) {
			path_attempt_done(p);
			return;
		}
		if (rc >= 0)
			rc = path_enter(p, (enum clt_cst)rc);
		if (rc < 0) {
			clt_path_attempt_failed(p, rc);
			return;
		}
		/*
		 * force stays for the whole poke: a step it entered (a job
		 * submitted for CST_AUTH_CALC) is not waited for either, or a
		 * disconnect returned with the attempt still going.
		 */
		timeout = false;
	}
}

static void path_conn_work(struct loop_work *w)
{
	path_step(container_of(w, struct clt_path, conn_work), false, false);
}

static void path_conn_timer(struct loop_timer *t)
{
	path_step(container_of(t, struct clt_path, conn_timer), true, false);
}

/* Any thread: something an attempt of p may wait for happened. */
void clt_path_kick(struct clt_path *p)
{
	struct loop *l = p->sess->loop;

	if (l)
		loop_queue(l, &p->conn_work);
}

/* Loop thread: an attempt in progress, or an open between two tries, takes note of a failure or close now. */
void clt_path_attempt_poke(struct clt_path *p)
{
	path_step(p, false, true);
}

int clt_path_conn_init(struct clt_path *p)
{
	loop_work_init(&p->conn_work, path_conn_work);
	offload_job_init(&p->auth_job, path_auth_job, path_auth_job_done);
	offload_job_init(&p->reauth_job, path_reauth_job, path_reauth_job_done);
	loop_work_init(&p->reauth_work, path_reauth_work);
	return loop_timer_init(p->sess->loop, &p->conn_timer, path_conn_timer);
}

/*
 * Starts an attempt: the fabric (kept from the last attempt), the fence
 * message's registration, connection 0 asked for. On failure the attempt
 * ends as any other (clt_path_attempt_failed). Loop thread.
 */
void clt_path_attempt_start(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	int rc;

	/* A re-authentication of the path's last life ends here, before auth is used again. */
	if (p->reauth) {
		offload_cancel(&p->reauth_job);
		p->reauth = false;
		rtrs_auth_txn_end(&p->auth);
	}
	pthread_mutex_lock(&p->lock);
	p->info_done = false;
	p->info_err = 0;
	p->auth_rx_n = 0;
	for (unsigned i = 0; i < p->base.nr_cons; i++) {
		p->cons[i].err = 0;
		p->cons[i].connected = false;
	}
	pthread_mutex_unlock(&p->lock);
	p->cst_cid = 0;
	atomic_store(&p->base.fail_err, 0);
	atomic_store(&p->fail_dnr, false);
	atomic_store(&p->refused_err, 0);
	atomic_store(&p->reached, false);
	rtrs_hb_reset(&p->base.hb);
	/* As the kernel: counted before every connect, so 1 on the first. */
	p->recon_cnt++;
	/*
	 * As the kernel (for_new_clt): the session's first path, a path
	 * added when every other was removed, and a path that got through
	 * once may create the session at the server; a path added to a
	 * session the server knows may not. (A path being added is not in
	 * paths_num yet.)
	 */
	p->first_sent = p->connected_once || !atomic_load(&s->ever_accepted) ||
			atomic_load(&s->paths_removed) == atomic_load(&s->paths_num);
	if (p->opening)
		err_detail_clear(); /* the loop's: what this attempt says (path_open_finish) */
	p->cst = CST_CON; /* an attempt from here on: a failure ends it */
	if (!p->fab && p->fab_open_rc) {
		/* The opener's thread tried (clt_path_open) and failed. */
		rc = p->fab_open_rc;
		p->fab_open_rc = 0;
		log_err("%s: cannot resolve %s:%s with provider %s: %s", p->name, p->host,
			p->port, s->provider, strerror(-rc));
		p->cst = CST_IDLE; /* nothing to say about a connection */
		clt_path_attempt_failed(p, rc);
		return;
	}
	/*
	 * A fabric closed after its device went is opened again on an offload
	 * worker (CST_OPEN): resolving may take seconds, which on the loop
	 * would hold every session's heartbeats.
	 */
	p->cst = CST_IDLE;
	if (p->fab && atomic_exchange(&p->fab_lost, false)) {
		/* Its device went while the path was up (clt_path_stop): another fabric. */
		fab_close(p->fab);
		p->fab = NULL;
	}
	rc = p->fab ? path_fab_ready(p) : CST_OPEN;
	if (rc < 0 && p->fab)
		/* A fabric that cannot register a message: the next attempt opens another. */
		atomic_store(&p->fab_lost, true);
	if (rc >= 0)
		rc = path_enter(p, (enum clt_cst)rc);
	if (rc) {
		clt_path_attempt_failed(p, rc);
		return;
	}
	/* What came before the step was entered (a callback's kick is queued anyway). */
}

/* The server's queue depth is not known yet: asks for room for a large one. */
static int path_fab_open(struct clt_path *p, struct fab **out)
{
	struct rtrs_clt_sess *s = p->sess;
	int rc = path_fab_open_plain(p, out);

	if (rc || !s->tls)
		return rc;
	pthread_mutex_lock(&s->auth_lock);
	rc = fab_set_tls(*out, FAB_TLS_REQUIRED, s->tls);
	pthread_mutex_unlock(&s->auth_lock);
	if (rc) {
		fab_close(*out);
		*out = NULL;
	}
	return rc;
}

static int path_fab_open_plain(struct clt_path *p, struct fab **out)
{
	return fab_open(p->sess->provider, p->src[0] ? p->src : NULL, p->host, p->port, false,
			RTRS_CLT_QUEUE_HINT, out);
}

static void path_open_call(void *arg)
{
	struct clt_path *p = arg;

	p->opening = true;
	p->open_attempt = 1;
	clt_path_attempt_start(p);
}

/*
 * The first connect of a path, for rtrs_clt_open (tries RTRS_OPEN_TRIES)
 * and rtrs_clt_add_path (1), begun on the caller's thread, which then
 * waits for the verdict (clt_path_open_wait) while the loop runs the
 * attempts; rtrs_clt_open begins its paths after the first together and
 * waits for them all. A server that refuses without saying "do not retry",
 * or drops a handshake it had answered, is busy (a storm of clients
 * opening at once) or mid-change (a path it still closes, a host whose
 * proof it is recording): tried again, up to tries times in all, after
 * the reconnect delay and jitter, as a reconnect does. Anything else (no
 * answer, a rejected or missing key, "do not retry") fails the open at
 * once. A session shut down meanwhile ends it with -ESHUTDOWN.
 */
int clt_path_open_begin(struct clt_path *p, int tries)
{
	struct rtrs_clt_sess *s = p->sess;
	int rc;

	if (loop_in_thread(s->loop)) {
		log_err("%s: a path cannot be opened from the client's service loop (a callback)",
			p->name);
		return -EDEADLK;
	}
	p->conn_done = false;
	p->open_tries = tries;
	/*
	 * The fabric is opened here, on the opener's thread, which waits
	 * anyway: resolving a name or an RDMA address may take seconds, which
	 * on the loop would hold every session's heartbeats. The loop takes
	 * the fabric (or the error) with the call.
	 */
	p->fab_open_rc = 0;
	if (!p->fab) {
		rc = path_fab_open(p, &p->fab);
		if (rc) {
			p->fab = NULL;
			p->fab_open_rc = rc;
		}
	}
	loop_call(s->loop, path_open_call, p);
	return 0;
}

/* The verdict on an open begun by clt_path_open_begin (its why in err_detail). */
int clt_path_open_wait(struct clt_path *p)
{
	int rc;

	pthread_mutex_lock(&p->lock);
	while (!p->conn_done)
		pthread_cond_wait(&p->cond, &p->lock);
	rc = p->conn_rc;
	if (p->conn_detail[0])
		err_detail("%s", p->conn_detail);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

int clt_path_open(struct clt_path *p, int tries)
{
	int rc = clt_path_open_begin(p, tries);

	return rc ? rc : clt_path_open_wait(p);
}
