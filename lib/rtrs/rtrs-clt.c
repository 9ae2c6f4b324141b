/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: sessions and the public API (include/rtrs.h): open and
 * close, paths added and removed at run time, statistics and settings.
 *
 * Threads: the caller of rtrs_clt_open() establishes the paths
 * (rtrs-clt-connect.c); each connection's completion thread handles
 * responses, heartbeats and info messages; the session's service loop
 * runs heartbeat timers, path teardown and reconnects
 * (rtrs-clt-recovery.c). Requests: rtrs-clt-io.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "rtrs-clt-pri.h"
#include "rtrs-tls.h"

static void path_fini(struct clt_path *p);

/* Whether the reconnect parameters are within their documented ranges. */
static bool reconnect_params_ok(unsigned delay_ms, unsigned jitter_ms, int max_attempts,
				unsigned loss_timeout_ms, unsigned fast_io_fail_ms)
{
	return delay_ms <= 3600000 && jitter_ms <= 3600000 && max_attempts >= -1 &&
	       max_attempts <= 1000000 && loss_timeout_ms <= 86400000 &&
	       fast_io_fail_ms <= 3600000;
}

static int opts_validate(const struct rtrs_clt_opts *o)
{
	if (!o || o->size < sizeof(*o))
		return -EINVAL;
	if (!o->sessname || !rtrs_name_valid(o->sessname)) {
		log_err("session name %s is invalid: 1..255 printable characters without blanks or '/', not '.' or '..'",
			o->sessname ? o->sessname : "(null)");
		return -EINVAL;
	}
	if (!o->paths || o->paths_num == 0 || o->paths_num > RTRS_MAX_PATHS) {
		log_err("%s: %zu paths given, need 1..%d", o->sessname, o->paths_num,
			RTRS_MAX_PATHS);
		return -EINVAL;
	}
	for (size_t i = 0; i < o->paths_num; i++) {
		if (!o->paths[i].dst || !*o->paths[i].dst) {
			log_err("%s: path %zu has no destination", o->sessname, i);
			return -EINVAL;
		}
	}
	if (!reconnect_params_ok(o->reconnect_delay_ms, o->reconnect_jitter_ms,
				 o->max_reconnect_attempts, o->reconnect_loss_timeout_ms,
				 o->fast_io_fail_ms)) {
		log_err("%s: reconnect parameters out of range (attempts -1..1000000, delay, "
			"jitter and fast IO fail up to an hour, loss timeout up to a day)",
			o->sessname);
		return -EINVAL;
	}
	if ((unsigned)o->mp_policy > RTRS_MP_POLICY_MIN_LATENCY) {
		log_err("%s: unknown multipath policy %d", o->sessname, (int)o->mp_policy);
		return -EINVAL;
	}
	if (o->nr_io_cons > RTRS_MAX_CONNS - 1 || !o->hb_interval_ms || !o->hb_missed_max ||
	    !o->connect_timeout_ms) {
		log_err("%s: connection count, heartbeat or timeout out of range", o->sessname);
		return -EINVAL;
	}
	if (!fab_known(o->provider)) {
		log_err("%s: unknown provider %s (tcp, verbs or rdma)", o->sessname, o->provider);
		err_detail("unknown provider %s: the fabrics are tcp, and verbs or rdma for RDMA "
			   "devices", o->provider);
		return -EPROTONOSUPPORT;
	}
	if (o->poll_groups > RTRS_MAX_POLL_GROUPS) {
		log_err("%s: %u poll groups, at most %d", o->sessname, o->poll_groups,
			RTRS_MAX_POLL_GROUPS);
		return -EINVAL;
	}
	if (o->tls != RTRS_TLS_OFF && o->tls != RTRS_TLS_REQUIRED && o->tls != RTRS_TLS_CONCAT) {
		log_err("%s: a client's TLS is off, required or concat", o->sessname);
		return -EINVAL;
	}
	if (o->tls == RTRS_TLS_CONCAT && o->tls_key) {
		log_err("%s: TLS with secure channel concatenation generates its PSK: no TLS key",
			o->sessname);
		err_detail("TLS concat generates its PSK from the authentication: give no TLS key");
		return -EINVAL;
	}
	if (o->tls != RTRS_TLS_OFF && strcmp(o->provider ? o->provider : "tcp", "tcp")) {
		log_err("%s: TLS is on tcp paths only, not %s", o->sessname, o->provider);
		err_detail("TLS needs the tcp provider, not %s", o->provider);
		return -EPROTONOSUPPORT;
	}
	return 0;
}

/* The tables of queue_depth entries (sess_set_limits), freed and cleared. */
void clt_sess_tables_free(struct rtrs_clt_sess *s)
{
	for (uint32_t i = 0; s->bounce && i < s->queue_depth; i++)
		free(s->bounce[i]);
	free(s->bounce);
	free(s->reqs);
	free(s->permits);
	free(s->free_ids);
	free(s->quar_ids);
	free(s->hdr_area);
	free(s->rkeys);
	free(s->rkey_gens);
	s->bounce = NULL;
	s->reqs = NULL;
	s->permits = NULL;
	s->free_ids = s->quar_ids = NULL;
	s->hdr_area = NULL;
	s->rkeys = NULL;
	s->rkey_gens = NULL;
}

static void sess_free(struct rtrs_clt_sess *s)
{
	for (size_t i = 0; s->paths && i < s->paths_num; i++) {
		path_fini(&s->paths[i]);
	}
	free(s->paths);
	clt_sess_tables_free(s);
	rtrs_auth_wipe(&s->auth, sizeof(s->auth));
	free(s->auth_secret_file);
	free(s->auth_ctrl_file);
	pthread_mutex_destroy(&s->auth_lock);
	if (s->tls)
		rtrs_tls_ctx_put(s->tls);
	pthread_mutex_destroy(&s->rkey_lock);
	pthread_rwlock_destroy(&s->mem_lock);
	pthread_mutex_destroy(&s->permit_lock);
	pthread_cond_destroy(&s->permit_cond);
	pthread_mutex_destroy(&s->wait_lock);
	pthread_mutex_destroy(&s->admin_lock);
	pthread_mutex_destroy(&s->poll_lock);
	if (s->poll_epfd >= 0)
		close(s->poll_epfd);
	if (s->poll_wake_fd >= 0)
		close(s->poll_wake_fd);
	free(s);
}

static void sess_close_waiting(void *arg)
{
	struct rtrs_clt_sess *s = arg;

	clt_sess_retry_waiting(s); /* closing: nothing may come, all fail */
	loop_timer_fini(&s->wait_timer);
}

static void path_close_call(void *arg)
{
	struct clt_path *p = arg;

	/* No more attempts (closing is set), and one in progress ends here. */
	loop_timer_arm(&p->reconnect_timer, 0, 0);
	clt_path_attempt_poke(p);
	clt_path_stop(p, -ESHUTDOWN, RTRS_PATH_CLOSED);
	/*
	 * A re-authentication's job ends now: its end queues reauth_work on
	 * this loop, which the close waits for (sess_work_queued) while the
	 * loop is still the session's; left to run, it would queue it on a
	 * loop the session let go of.
	 */
	if (p->reauth) {
		offload_cancel(&p->reauth_job);
		p->reauth = false;
		rtrs_auth_txn_end(&p->auth);
	}
	loop_timer_fini(&p->reconnect_timer);
	loop_timer_fini(&p->conn_timer);
	loop_timer_fini(&p->base.hb.timer);
}

/*
 * The process's sessions, for rtrs_clt_shutdown_all: listed once every
 * path of rtrs_clt_open is set up, unlisted as rtrs_clt_close begins, so
 * that a listed session and its paths are whole while the lock is held.
 */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rtrs_clt_sess *all_sess;
static bool all_shutdown;

/*
 * s stops waiting for its server (all_lock held): closing, as in
 * rtrs_clt_close, without the teardown. Its paths fail (their requests
 * complete with -ECONNABORTED on the service loop, clt_path_stop), the
 * attempts connecting them give up, permit waiters and the requests waiting
 * for a path are answered.
 */
static void sess_shutdown(struct rtrs_clt_sess *s)
{
	size_t n = atomic_load(&s->paths_num);

	pthread_mutex_lock(&s->permit_lock);
	atomic_store(&s->closing, true);
	pthread_cond_broadcast(&s->permit_cond);
	pthread_mutex_unlock(&s->permit_lock);
	for (size_t i = 0; i < n; i++) {
		clt_fail_path(&s->paths[i], -ESHUTDOWN);
		clt_path_kick(&s->paths[i]);
	}
	if (s->adding)
		clt_path_kick(s->adding);
	loop_queue(s->loop, &s->wait_work);
}

/* Lists s (its paths set up); false when the process is shut down already. */
static bool sess_list(struct rtrs_clt_sess *s)
{
	bool ok;

	pthread_mutex_lock(&all_lock);
	ok = !all_shutdown;
	if (ok) {
		s->all_next = all_sess;
		if (all_sess)
			all_sess->all_prev = &s->all_next;
		s->all_prev = &all_sess;
		all_sess = s;
	}
	pthread_mutex_unlock(&all_lock);
	return ok;
}

static void sess_unlist(struct rtrs_clt_sess *s)
{
	pthread_mutex_lock(&all_lock);
	if (s->all_prev) {
		*s->all_prev = s->all_next;
		if (s->all_next)
			s->all_next->all_prev = s->all_prev;
		s->all_prev = NULL;
	}
	pthread_mutex_unlock(&all_lock);
}

RTRS_EXPORT
void rtrs_clt_shutdown_all(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&all_lock);
	all_shutdown = true;
	for (struct rtrs_clt_sess *s = all_sess; s; s = s->all_next, n++)
		sess_shutdown(s);
	pthread_mutex_unlock(&all_lock);
	log_info("client shut down: %u session%s no longer wait for their servers", n,
		 n == 1 ? "" : "s");
}

static void loop_call_nothing(void *arg)
{
	(void)arg;
}

/* Whether a work item of s is queued on its loop (closing: paths stopped). */
static bool sess_work_queued(struct rtrs_clt_sess *s)
{
	if (atomic_load(&s->wait_work.queued))
		return true;
	for (size_t i = 0; s->paths && i < RTRS_MAX_PATHS; i++)
		if (s->paths[i].sess && (atomic_load(&s->paths[i].base.fail_work.queued) ||
					  atomic_load(&s->paths[i].conn_work.queued) ||
					  atomic_load(&s->paths[i].reauth_work.queued)))
			return true;
	return false;
}

RTRS_EXPORT
void rtrs_clt_close(struct rtrs_clt_sess *s)
{
	if (!s)
		return;
	sess_unlist(s);
	pthread_mutex_lock(&s->permit_lock);
	atomic_store(&s->closing, true);
	pthread_cond_broadcast(&s->permit_cond);
	/* Threads waking from a permit wait still touch the session. */
	while (s->permit_waiters)
		pthread_cond_wait(&s->permit_cond, &s->permit_lock);
	pthread_mutex_unlock(&s->permit_lock);
	/* Wake attempts in progress: they give up (fail_err) and see closing. */
	for (size_t i = 0; i < s->paths_num; i++)
		if (s->paths[i].sess)
			clt_fail_path(&s->paths[i], -ESHUTDOWN);
	for (size_t i = 0; s->loop && i < s->paths_num; i++)
		if (s->paths[i].sess)
			loop_call(s->loop, path_close_call, &s->paths[i]);
	/* Closing: every request still waiting for a path fails now. */
	if (s->loop && s->wait_timer_ready)
		loop_call(s->loop, sess_close_waiting, s);
	/* The loop is shared: none of this session's work may stay queued on it. */
	while (s->loop && sess_work_queued(s))
		loop_call(s->loop, loop_call_nothing, NULL);
	loop_shared_put(s->loop);
	s->loop = NULL;
	sess_free(s);
}

/*
 * Sets up slot p for path idx of s; on failure path_fini undoes what was
 * done. p->sess is set once the base is set up.
 */
static int path_init(struct rtrs_clt_sess *s, struct clt_path *p, unsigned idx,
		     const struct rtrs_path_addr *addr)
{
	int rc;

	p->idx = idx;
	p->base.hb.timer.loop = NULL;
	p->reconnect_timer.loop = NULL;
	p->conn_timer.loop = NULL;
	rc = rtrs_split_hostport(addr->dst, s->port, p->host, sizeof(p->host), p->port,
				 sizeof(p->port));
	if (rc) {
		log_err("%s: path %u: cannot parse destination '%s'", s->name, idx, addr->dst);
		return rc;
	}
	if (addr->src)
		snprintf(p->src, sizeof(p->src), "%s", addr->src);
	snprintf(p->name, sizeof(p->name), "%s/%s:%s", s->name, p->host, p->port);
	rc = rand_bytes(p->uuid, sizeof(p->uuid));
	if (rc)
		return rc;
	rc = rtrs_path_init(&p->base, &clt_path_ops, s->loop, p->name, RTRS_PATH_CONNECTING,
			    clt_path_hb_timer);
	if (rc)
		return rc;
	p->sess = s;
	pthread_mutex_init(&p->lock, NULL);
	cond_init_mono(&p->cond);
	/* Its work items before anything can fail: a close of a half-made path kicks them. */
	rc = clt_path_conn_init(p);
	if (rc)
		return rc;
	p->base.nr_cons = 1 + s->nr_io_cons;
	p->cons = calloc(p->base.nr_cons, sizeof(*p->cons));
	p->base.cons = calloc(p->base.nr_cons, sizeof(*p->base.cons));
	if (!p->cons || !p->base.cons)
		return -ENOMEM;
	for (unsigned i = 0; i < p->base.nr_cons; i++) {
		rtrs_con_init(&p->cons[i].c, &p->base, i);
		p->cons[i].path = p;
		p->base.cons[i] = &p->cons[i].c;
	}
	p->base.hb.interval_ms = s->hb_interval_ms;
	p->base.hb.missed_max = s->hb_missed_max;
	atomic_init(&p->keep_closed, false);
	atomic_init(&p->verdict, -1);
	atomic_init(&p->live_recon, -1);
	atomic_init(&p->fence_recon, -1);
	return loop_timer_init(s->loop, &p->reconnect_timer, clt_path_reconnect_timer);
}

/* Undoes path_init, whole or in part, and what connecting left (closed path). */
static void path_fini(struct clt_path *p)
{
	loop_timer_fini(&p->reconnect_timer);
	loop_timer_fini(&p->conn_timer);
	if (!p->sess)
		return;
	/* No offload job may still hold the path. */
	offload_cancel(&p->auth_job);
	offload_cancel(&p->reauth_job);
	rtrs_auth_wipe(&p->auth_cfg, sizeof(p->auth_cfg));
	clt_path_open_job_end(p, true); /* a job still opening closes its fabric itself */
	rtrs_path_fini(&p->base);
	clt_path_release_mrs(p);
	fab_close(p->fab);
	p->fab = NULL;
	for (unsigned i = 0; p->cons && i < p->base.nr_cons; i++)
		rtrs_con_fini(&p->cons[i].c);
	free(p->cons);
	free(p->base.cons);
	free(p->rbufs);
	free(p->info_gens);
	free(p->imm_area);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
}

/* This host's default name: /etc/nvme/hostnqn as nvme-cli does, else from the machine id. */
static void default_host_name(char *buf, size_t len)
{
	char line[256] = "";
	FILE *f = fopen("/etc/nvme/hostnqn", "r");

	if (f) {
		if (fgets(line, sizeof(line), f))
			line[strcspn(line, " \t\r\n")] = '\0';
		fclose(f);
		if (line[0]) {
			snprintf(buf, len, "%s", line);
			return;
		}
	}
	f = fopen("/etc/machine-id", "r");
	if (f) {
		if (fgets(line, sizeof(line), f))
			line[strcspn(line, " \t\r\n")] = '\0';
		fclose(f);
	}
	if (strlen(line) == 32) {
		snprintf(buf, len, "nqn.2014-08.org.nvmexpress:uuid:%.8s-%.4s-%.4s-%.4s-%.12s", line,
			 line + 8, line + 12, line + 16, line + 20);
		return;
	}
	gethostname(line, sizeof(line) - 1);
	snprintf(buf, len, "nqn.2014-08.org.nvmexpress:host:%s", line[0] ? line : "localhost");
}

/* Authentication settings of a session; secrets are loaded now and kept in memory. */
/*
 * A secret that cannot be had: logged and told to the caller
 * (rtrs_last_error) with the file it was to come from. The secret itself
 * is never repeated: only an argument naming a file ("@FILE", "file:FILE")
 * is.
 */
static void secret_failed(const char *sess, const char *what, const char *arg, const char *why,
			  int rc)
{
	const char *path = arg[0] == '@' ? arg + 1 : !strncmp(arg, "file:", 5) ? arg + 5 : NULL;

	if (path) {
		log_err("%s: %s file %s: %s: %s", sess, what, path, why ? why : "cannot be used",
			strerror(-rc));
		err_detail("%s file %s: %s: %s", what, path, why ? why : "cannot be used",
			   strerror(-rc));
	} else {
		log_err("%s: %s: %s", sess, what, why ? why : strerror(-rc));
		err_detail("%s: %s", what, why ? why : strerror(-rc));
	}
}

static int sess_auth_setup(struct rtrs_clt_sess *s, const struct rtrs_clt_opts *o)
{
	struct rtrs_auth_cfg *cfg = &s->auth;
	const char *why = NULL;
	int rc;

	if (o->auth_host_name)
		snprintf(cfg->name, sizeof(cfg->name), "%s", o->auth_host_name);
	else
		default_host_name(cfg->name, sizeof(cfg->name));
	snprintf(cfg->server, sizeof(cfg->server), "%s",
		 o->auth_server_name ? o->auth_server_name : "rtrs-server");
	/* Checked whole: the copies above may have cut a long name short. */
	if (!rtrs_auth_name_valid(o->auth_host_name ? o->auth_host_name : cfg->name) ||
	    !rtrs_auth_name_valid(o->auth_server_name ? o->auth_server_name : cfg->server)) {
		log_err("%s: host and server names must be 1..%d printable characters without "
			"blanks", s->name, RTRS_AUTH_WIRE_NAME_MAX);
		return -EINVAL;
	}
	rc = rtrs_auth_cfg_lists(cfg, o->auth_hashes, o->auth_dhgroups, false, s->name);
	if (rc)
		return rc;
	/* Files are read again when the server asks for a re-authentication. */
	if (o->auth_secret && (o->auth_secret[0] == '@' || !strncmp(o->auth_secret, "file:", 5)) &&
	    !(s->auth_secret_file = strdup(o->auth_secret)))
		return -ENOMEM;
	if (o->auth_ctrl_secret &&
	    (o->auth_ctrl_secret[0] == '@' || !strncmp(o->auth_ctrl_secret, "file:", 5)) &&
	    !(s->auth_ctrl_file = strdup(o->auth_ctrl_secret)))
		return -ENOMEM;
	if (o->auth_secret) {
		rc = rtrs_auth_key_load(o->auth_secret, &cfg->hkey, &why);
		if (rc) {
			secret_failed(s->name, "host secret", o->auth_secret, why, rc);
			return rc;
		}
	}
	if (o->auth_ctrl_secret) {
		if (!o->auth_secret) {
			log_err("%s: a controller secret needs a host secret too", s->name);
			return -EINVAL;
		}
		rc = rtrs_auth_key_load(o->auth_ctrl_secret, &cfg->ckey, &why);
		if (rc) {
			secret_failed(s->name, "controller secret", o->auth_ctrl_secret, why, rc);
			return rc;
		}
	}
	if (o->tls == RTRS_TLS_REQUIRED) {
		struct rtrs_auth_key tk = { 0 };

		if (o->tls_key) {
			rc = rtrs_tls_key_load(o->tls_key, &tk, &why);
			if (rc) {
				secret_failed(s->name, "TLS key", o->tls_key, why, rc);
				return rc;
			}
		}
		s->tls_derived = !tk.len;
		s->tls_no_ktls = o->tls_no_ktls;
		rc = rtrs_tls_ctx_client(cfg->name, cfg->server, &tk, &cfg->hkey, o->tls_no_ktls,
					 &s->tls);
		rtrs_auth_wipe(&tk, sizeof(tk));
		if (rc == -ENOKEY) {
			log_err("%s: TLS needs a key: a TLS key or a host secret to derive it from",
				s->name);
			err_detail("TLS needs a key (tls_key, or auth_secret to derive it from)");
		} else if (rc) {
			log_err("%s: TLS: %s", s->name, strerror(-rc));
		}
		if (rc)
			return rc;
	}
	if (o->tls == RTRS_TLS_CONCAT) {
		/* Each path's PSK comes from its own exchange (rtrs-clt-connect.c). */
		if (!cfg->hkey.len) {
			log_err("%s: TLS concat needs a host secret to authenticate with", s->name);
			err_detail("TLS concat needs a host secret (auth_secret)");
			return -ENOKEY;
		}
		/*
		 * Without a controller secret nothing authenticates the server:
		 * one that took its address makes the same generated PSK (the
		 * exchange proves only the host). With required, a PSK derived
		 * from the host secret does; said once per session.
		 */
		if (!cfg->ckey.len)
			log_warn("%s: TLS concat without a controller secret (auth_ctrl_secret): the "
				 "server is not authenticated, and whoever answers at its address "
				 "gets this session's IO; give one, or use TLS required", s->name);
		s->tls_concat = true;
		s->tls_no_ktls = o->tls_no_ktls;
	}
	return 0;
}

RTRS_EXPORT
int rtrs_clt_open(const struct rtrs_clt_opts *o, struct rtrs_clt_sess **out)
{
	struct rtrs_clt_sess *s;
	long ncpu;
	int rc;

	err_detail_clear();
	rc = opts_validate(o);
	if (rc)
		return rc;
	if (o->poll_groups) { /* for when the groups start */
		fab_tcp_groups(o->poll_groups);
		fab_rdma_groups(o->poll_groups);
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->poll_lock, NULL);
	pthread_mutex_init(&s->auth_lock, NULL);
	s->poll_epfd = epoll_create1(EPOLL_CLOEXEC);
	s->poll_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->poll_epfd < 0 || s->poll_wake_fd < 0 ||
	    epoll_ctl(s->poll_epfd, EPOLL_CTL_ADD, s->poll_wake_fd,
		      &(struct epoll_event){ .events = EPOLLIN, .data.ptr = NULL })) {
		rc = -errno;
		log_err("%s: poll set: %s", o->sessname, strerror(-rc));
		goto out_free;
	}
	snprintf(s->name, sizeof(s->name), "%s", o->sessname);
	snprintf(s->provider, sizeof(s->provider), "%s", o->provider ? o->provider : "tcp");
	s->port = o->port;
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	/* One per CPU, at most 128: what a server accepts by default (129 in all). */
	s->nr_io_cons = o->nr_io_cons ? o->nr_io_cons : (unsigned)MIN(MAX(ncpu, 1), 128);
	s->hb_interval_ms = o->hb_interval_ms;
	s->hb_missed_max = o->hb_missed_max;
	s->connect_timeout_ms = o->connect_timeout_ms;
	s->reconnect_delay_ms = o->reconnect_delay_ms;
	s->reconnect_jitter_ms = o->reconnect_jitter_ms;
	s->max_reconnect_attempts = o->max_reconnect_attempts;
	s->reconnect_loss_timeout_ms = o->reconnect_loss_timeout_ms;
	s->link_ev = o->link_ev;
	s->path_ev = o->path_ev;
	s->priv = o->priv;
	atomic_init(&s->mp_policy, o->mp_policy);
	pthread_mutex_init(&s->permit_lock, NULL);
	cond_init_mono(&s->permit_cond); /* slot waits without a path are timed */
	pthread_mutex_init(&s->wait_lock, NULL);
	STAILQ_INIT(&s->waiting);
	STAILQ_INIT(&s->fencing);
	pthread_mutex_init(&s->admin_lock, NULL);
	pthread_mutex_init(&s->rkey_lock, NULL);
	pthread_rwlock_init(&s->mem_lock, NULL);
	atomic_init(&s->paths_up, 0);
	atomic_init(&s->no_path_ms, now_ms());
	s->fast_io_fail_ms = o->fast_io_fail_ms;
	s->busy_poll_us = o->busy_poll_us;
	s->wait_timer.loop = NULL;
	loop_work_init(&s->wait_work, clt_sess_wait_work);
	rc = rand_bytes(s->paths_uuid, sizeof(s->paths_uuid));
	if (rc)
		goto out_free;
	rc = sess_auth_setup(s, o);
	if (rc)
		goto out_free;
	rc = loop_shared_get("rtrs-clt", &s->loop);
	if (rc)
		goto out_free;
	rc = loop_timer_init(s->loop, &s->wait_timer, clt_sess_wait_timer);
	if (rc)
		goto out_free;
	s->wait_timer_ready = true;
	/* Every slot up front: paths added later never move the table. */
	s->paths = calloc(RTRS_MAX_PATHS, sizeof(*s->paths));
	if (!s->paths) {
		rc = -ENOMEM;
		goto out_free;
	}
	s->paths_num = o->paths_num;
	for (size_t i = 0; i < o->paths_num; i++) {
		rc = path_init(s, &s->paths[i], (unsigned)i, &o->paths[i]);
		if (rc) {
			/* Half made: undone here, so that the close sees no path in it. */
			path_fini(&s->paths[i]);
			memset(&s->paths[i], 0, sizeof(s->paths[i]));
			goto out_free;
		}
	}
	if (!sess_list(s)) {
		log_err("%s: not opened: the client is shut down", s->name);
		rc = -ESHUTDOWN;
		goto out_free;
	}
	/*
	 * The first path makes the session at the server (a kernel server
	 * takes a path that is not first only into a session it has): it
	 * opens alone. The others open together, each with its own tries;
	 * every one begun is waited for, and the first failure (in path
	 * order) is the open's.
	 */
	rc = clt_path_open(&s->paths[0], RTRS_OPEN_TRIES);
	if (rc)
		goto out_free;
	{
		size_t begun = 1;
		int prc;

		for (; begun < s->paths_num; begun++) {
			prc = clt_path_open_begin(&s->paths[begun], RTRS_OPEN_TRIES);
			if (prc) {
				rc = prc;
				break;
			}
		}
		for (size_t i = 1; i < begun; i++) {
			prc = clt_path_open_wait(&s->paths[i]);
			if (prc && !rc)
				rc = prc;
		}
		if (rc)
			goto out_free;
	}
	atomic_store(&s->opened, true);
	*out = s;
	return 0;

out_free:
	rtrs_clt_close(s);
	return rc;
}

RTRS_EXPORT
int rtrs_clt_query(struct rtrs_clt_sess *s, struct rtrs_attrs *attrs)
{
	if (!s || !attrs || attrs->size < sizeof(*attrs))
		return -EINVAL;
	attrs->paths_up = atomic_load(&s->paths_up);
	attrs->paths_num = (uint32_t)atomic_load(&s->paths_num);
	attrs->server_sessions = atomic_load(&s->srv_sessions);
	if (!attrs->paths_up)
		return -ECOMM;
	attrs->queue_depth = s->queue_depth;
	attrs->max_io_size = s->max_io_size;
	attrs->max_hdr_size = s->max_hdr_size;
	attrs->max_segments = RTRS_MAX_SEGMENTS;
	attrs->paths_num = (uint32_t)s->paths_num;
	return 0;
}

RTRS_EXPORT
int rtrs_clt_peer_ext(struct rtrs_clt_sess *s)
{
	if (!s)
		return -EINVAL;
	return s->srv_ext;
}

RTRS_EXPORT
int rtrs_clt_set_mp_policy(struct rtrs_clt_sess *s, enum rtrs_mp_policy policy)
{
	if (!s || (unsigned)policy > RTRS_MP_POLICY_MIN_LATENCY)
		return -EINVAL;
	atomic_store(&s->mp_policy, policy);
	log_info("%s: multipath policy %d", s->name, (int)policy);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_get_mp_policy(struct rtrs_clt_sess *s)
{
	return s ? (int)atomic_load(&s->mp_policy) : -EINVAL;
}

RTRS_EXPORT
int rtrs_clt_path_stats(struct rtrs_clt_sess *s, unsigned idx, struct rtrs_path_stats *st)
{
	struct clt_path *p;

	if (!s || !st || st->size < sizeof(*st))
		return -EINVAL;
	if (idx >= s->paths_num)
		return -ENOENT;
	p = &s->paths[idx];
	snprintf(st->name, sizeof(st->name), "%s", p->name);
	st->state = rtrs_path_state_str(atomic_load(&p->base.state));
	st->reads = atomic_load(&p->stat_reads);
	st->read_bytes = atomic_load(&p->stat_read_bytes);
	st->writes = atomic_load(&p->stat_writes);
	st->write_bytes = atomic_load(&p->stat_write_bytes);
	st->inflight = atomic_load(&p->base.inflight);
	st->hb_latency_ns = atomic_load(&p->base.hb.latency_ns);
	st->reconnects = atomic_load(&p->stat_reconnects);
	st->reconnect_failures = atomic_load(&p->stat_reconnect_failures);
	st->failovers = atomic_load(&p->stat_failovers);
	st->last_error = atomic_load(&p->last_err);
	st->reconnect_verdict = atomic_load(&p->verdict) < 0 ? "" :
				rtrs_reconnect_verdict_str(atomic_load(&p->verdict));
	st->auth_runs = atomic_load(&p->stat_auth_runs);
	snprintf(st->src, sizeof(st->src), "%s", p->src);
	st->removed = atomic_load(&p->removed);
	return 0;
}

static void path_disconnect_call(void *arg)
{
	struct clt_path *p = arg;

	atomic_store(&p->keep_closed, true);
	loop_timer_arm(&p->reconnect_timer, 0, 0);
	if (p->cst) {
		/* An attempt in progress gives up (fail_err) and stays closed (keep_closed). */
		clt_fail_path(p, -ESHUTDOWN);
		clt_path_attempt_poke(p);
	}
	/* Not a session close: its requests fail over after a fence. */
	clt_path_stop(p, -ENOTCONN, RTRS_PATH_CLOSED);
}

RTRS_EXPORT
int rtrs_clt_disconnect_path(struct rtrs_clt_sess *s, unsigned idx)
{
	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num)
		return -ENOENT;
	loop_call(s->loop, path_disconnect_call, &s->paths[idx]);
	return 0;
}

static void path_reconnect_call(void *arg)
{
	struct clt_path *p = arg;

	if (atomic_load(&p->removed))
		return; /* removed after the caller looked: it stays down */
	atomic_store(&p->keep_closed, false);
	atomic_store(&p->fail_dnr, false);
	atomic_store(&p->last_err, 0);
	atomic_store(&p->verdict, -1);
	atomic_store(&p->attempts, 0);
	atomic_store(&p->by_hand, true);
	atomic_store(&p->down_since_ms, now_ms()); /* a fresh loss timeout too */
	switch (atomic_load(&p->base.state)) {
	case RTRS_PATH_CONNECTED:
		/* Closed first; clt_path_stop schedules the attempt itself. */
		clt_path_stop(p, -ECONNRESET, RTRS_PATH_RECONNECTING);
		return;
	case RTRS_PATH_CLOSED:
		rtrs_path_wrlock(&p->base);
		clt_path_change_state(p, RTRS_PATH_RECONNECTING);
		rtrs_path_wrunlock(&p->base);
		/* fall through */
	case RTRS_PATH_RECONNECTING:
		loop_timer_arm(&p->reconnect_timer, 1, 0);
		return;
	default:
		return; /* connecting or closing: an attempt is under way */
	}
}

/* An unpublished path slot emptied, under mem_lock: region (un)registrations look at every slot. */
static void path_slot_clear(struct rtrs_clt_sess *s, struct clt_path *p)
{
	pthread_rwlock_wrlock(&s->mem_lock);
	memset(p, 0, sizeof(*p));
	pthread_rwlock_unlock(&s->mem_lock);
}

RTRS_EXPORT
int rtrs_clt_add_path(struct rtrs_clt_sess *s, const struct rtrs_path_addr *addr,
		      unsigned *idx_out)
{
	struct clt_path *p;
	size_t n;
	int rc;

	err_detail_clear();
	if (!s || !addr || !addr->dst || !*addr->dst)
		return -EINVAL;
	if (atomic_load(&s->closing))
		return -ESHUTDOWN;
	pthread_mutex_lock(&s->admin_lock);
	n = atomic_load(&s->paths_num);
	if (n >= RTRS_MAX_PATHS) {
		pthread_mutex_unlock(&s->admin_lock);
		log_err("%s: already %d paths", s->name, RTRS_MAX_PATHS);
		return -ENOSPC;
	}
	p = &s->paths[n];
	path_slot_clear(s, p);
	rc = path_init(s, p, (unsigned)n, addr);
	if (!rc) {
		/* Seen by a shutdown from here on, or closing is seen by the connect. */
		pthread_mutex_lock(&all_lock);
		s->adding = p;
		pthread_mutex_unlock(&all_lock);
		atomic_store(&s->add_pending, true);
		rc = clt_path_open(p, 1);
		pthread_mutex_lock(&all_lock);
		s->adding = NULL;
		pthread_mutex_unlock(&all_lock);
	}
	if (rc) {
		/*
		 * Never published: tear the slot down again, once no news for
		 * the attempt (a callback's kick before its connection went)
		 * is queued on the loop.
		 */
		while (p->sess && atomic_load(&p->conn_work.queued))
			loop_call(s->loop, loop_call_nothing, NULL);
		path_fini(p);
		path_slot_clear(s, p);
		atomic_store(&s->add_pending, false);
		pthread_mutex_unlock(&s->admin_lock);
		return rc;
	}
	atomic_store(&s->paths_num, n + 1);
	atomic_store(&s->add_pending, false);
	pthread_mutex_unlock(&s->admin_lock);
	log_info("%s: path %zu added", s->name, n);
	if (idx_out)
		*idx_out = (unsigned)n;
	return 0;
}

RTRS_EXPORT
int rtrs_clt_remove_path(struct rtrs_clt_sess *s, unsigned idx)
{
	int rc;

	if (!s)
		return -EINVAL;
	bool no = false;

	if (idx >= s->paths_num)
		return -ENOENT;
	/* Marked first: a reconnect meanwhile sees it, and a second remove is refused. */
	if (!atomic_compare_exchange_strong(&s->paths[idx].removed, &no, true))
		return -ENOENT;
	rc = rtrs_clt_disconnect_path(s, idx);
	if (rc)
		atomic_store(&s->paths[idx].removed, false);
	else
		atomic_fetch_add(&s->paths_removed, 1);
	return rc;
}

RTRS_EXPORT
int rtrs_clt_get_reconnect(struct rtrs_clt_sess *s, struct rtrs_reconnect_params *p)
{
	if (!s || !p || p->size < sizeof(*p))
		return -EINVAL;
	p->delay_ms = atomic_load(&s->reconnect_delay_ms);
	p->jitter_ms = atomic_load(&s->reconnect_jitter_ms);
	p->max_attempts = atomic_load(&s->max_reconnect_attempts);
	p->loss_timeout_ms = atomic_load(&s->reconnect_loss_timeout_ms);
	p->fast_io_fail_ms = atomic_load(&s->fast_io_fail_ms);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_set_reconnect(struct rtrs_clt_sess *s, const struct rtrs_reconnect_params *p)
{
	if (!s || !p || p->size < sizeof(*p) ||
	    !reconnect_params_ok(p->delay_ms, p->jitter_ms, p->max_attempts, p->loss_timeout_ms,
				 p->fast_io_fail_ms))
		return -EINVAL;
	/* Read by the loop at the next attempt. */
	atomic_store(&s->reconnect_delay_ms, p->delay_ms);
	atomic_store(&s->reconnect_jitter_ms, p->jitter_ms);
	atomic_store(&s->max_reconnect_attempts, p->max_attempts);
	atomic_store(&s->reconnect_loss_timeout_ms, p->loss_timeout_ms);
	atomic_store(&s->fast_io_fail_ms, p->fast_io_fail_ms);
	log_info("%s: reconnect delay %u ms, jitter %u ms, attempts %d, loss timeout %u ms, "
		 "fast IO fail %u ms", s->name, p->delay_ms, p->jitter_ms, p->max_attempts,
		 p->loss_timeout_ms, p->fast_io_fail_ms);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_reconnect_path(struct rtrs_clt_sess *s, unsigned idx)
{
	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num || atomic_load(&s->paths[idx].removed))
		return -ENOENT;
	if (atomic_load(&s->closing))
		return -ESHUTDOWN;
	loop_call(s->loop, path_reconnect_call, &s->paths[idx]);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_reset_path_stats(struct rtrs_clt_sess *s, unsigned idx)
{
	struct clt_path *p;

	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num)
		return -ENOENT;
	p = &s->paths[idx];
	atomic_store(&p->stat_reads, 0);
	atomic_store(&p->stat_read_bytes, 0);
	atomic_store(&p->stat_writes, 0);
	atomic_store(&p->stat_write_bytes, 0);
	atomic_store(&p->stat_reconnects, 0);
	atomic_store(&p->stat_reconnect_failures, 0);
	atomic_store(&p->stat_failovers, 0);
	atomic_store(&p->stat_auth_runs, 0);
	return 0;
}
