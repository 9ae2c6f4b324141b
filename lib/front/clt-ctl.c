/* SPDX-License-Identifier: MIT */
/* The client.* management methods (clt-ctl.h, docs/management.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clt-ctl.h"
#include "metrics.h"

static const char *const policy_names[] = {
	[RTRS_MP_POLICY_RR] = "round-robin",
	[RTRS_MP_POLICY_MIN_INFLIGHT] = "min-inflight",
	[RTRS_MP_POLICY_MIN_LATENCY] = "min-latency",
};

const char *clt_ctl_policy_name(unsigned policy)
{
	return policy < sizeof(policy_names) / sizeof(policy_names[0]) ? policy_names[policy] :
									   NULL;
}

int clt_ctl_policy_of(const char *name)
{
	for (unsigned i = 0; i < sizeof(policy_names) / sizeof(policy_names[0]); i++)
		if (!strcmp(name, policy_names[i]))
			return (int)i;
	return -1;
}

void clt_ctl_init(struct clt_ctl *c, int (*devices)(void *priv, struct json_object *arr),
		  void *priv)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->tune_lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->devices = devices;
	c->priv = priv;
}

int clt_ctl_add(struct clt_ctl *c, const char *name, struct rnbd_clt_sess *sess)
{
	int rc = 0;

	if (strlen(name) >= sizeof(c->sess[0].name))
		return -ENAMETOOLONG;
	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < c->nr_sess && !rc; i++)
		if (!strcmp(c->sess[i].name, name))
			rc = -EEXIST;
	if (!rc && c->nr_sess == CLT_CTL_SESS_MAX)
		rc = -ENOSPC;
	if (!rc) {
		snprintf(c->sess[c->nr_sess].name, sizeof(c->sess[0].name), "%s", name);
		c->sess[c->nr_sess].sess = sess;
		c->sess[c->nr_sess].refs = 0;
		c->sess[c->nr_sess].adding = 0;
		c->sess[c->nr_sess++].leaving = false;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* The entry of sess (c->lock held), or NULL. */
static __typeof__(((struct clt_ctl *)0)->sess[0]) *entry_of(struct clt_ctl *c,
							     struct rnbd_clt_sess *sess)
{
	for (unsigned i = 0; i < c->nr_sess; i++)
		if (c->sess[i].sess == sess)
			return &c->sess[i];
	return NULL;
}

void clt_ctl_del(struct clt_ctl *c, struct rnbd_clt_sess *sess)
{
	__typeof__(c->sess[0]) *e;

	pthread_mutex_lock(&c->lock);
	e = entry_of(c, sess);
	if (e) {
		e->leaving = true; /* found no more */
		while ((e = entry_of(c, sess)) && e->refs)
			pthread_cond_wait(&c->cond, &c->lock);
		if (e)
			*e = c->sess[--c->nr_sess];
	}
	pthread_mutex_unlock(&c->lock);
}

struct rnbd_clt_sess *clt_ctl_get(struct clt_ctl *c, const char *name)
{
	struct rnbd_clt_sess *s = NULL;

	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < c->nr_sess && !s; i++) {
		if (!c->sess[i].leaving && !strcmp(c->sess[i].name, name)) {
			s = c->sess[i].sess;
			c->sess[i].refs++;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return s;
}

void clt_ctl_put(struct clt_ctl *c, struct rnbd_clt_sess *sess)
{
	__typeof__(c->sess[0]) *e;

	if (!sess)
		return;
	pthread_mutex_lock(&c->lock);
	e = entry_of(c, sess);
	if (e && --e->refs == 0 && e->leaving)
		pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/* ---- helpers ---- */

static bool put(struct json_object *o, const char *key, struct json_object *v)
{
	if (!o || !v || json_object_object_add(o, key, v)) {
		json_object_put(v);
		return false;
	}
	return true;
}

/*
 * The session named by params' "session", held (*held, for clt_ctl_put),
 * or an error in err. Methods check every parameter's type first and look
 * objects up last, so that a malformed request is told so whatever it
 * names.
 */
static struct rtrs_clt_sess *sess_param(struct clt_ctl *c, struct json_object *params,
					const char **name, struct rnbd_clt_sess **held,
					struct rpc_err *err)
{
	struct rnbd_clt_sess *s;

	*held = NULL;
	if (rpc_param_str(params, "session", true, name, err))
		return NULL;
	s = clt_ctl_get(c, *name);
	if (!s)
		rpc_errf(err, -ENOENT, "no session %s", *name);
	*held = s;
	return s ? rnbd_clt_rtrs(s) : NULL;
}

/* params' "path": a path index, by type and range (path_exists checks it against a session). */
static int path_param(struct json_object *params, bool required, unsigned *idx,
		      struct rpc_err *err)
{
	uint64_t v = *idx;
	int rc = rpc_param_u64(params, "path", required, 0, 1023, &v, err);

	*idx = (unsigned)v;
	return rc;
}

/* Whether r has a path idx; an error naming both if not. */
static int path_exists(struct rtrs_clt_sess *r, const char *name, unsigned idx,
		       struct rpc_err *err)
{
	struct rtrs_attrs a = { .size = sizeof(a) };

	rtrs_clt_query(r, &a); /* paths_num is filled without a path up too */
	if (idx >= a.paths_num)
		return rpc_errf(err, -ENOENT, "session %s has no path %u (it has %u)", name, idx,
				a.paths_num);
	return 0;
}

/* The reconnect parameters as JSON: client.reconnect's answer, client.sessions' "reconnect". */
static struct json_object *reconnect_json(const struct rtrs_reconnect_params *rp)
{
	struct json_object *o = json_object_new_object();

	if (put(o, "delay_ms", json_object_new_uint64(rp->delay_ms)) &&
	    put(o, "jitter_ms", json_object_new_uint64(rp->jitter_ms)) &&
	    put(o, "max_attempts", json_object_new_int(rp->max_attempts)) &&
	    put(o, "loss_timeout_ms", json_object_new_uint64(rp->loss_timeout_ms)) &&
	    put(o, "fast_io_fail_ms", json_object_new_uint64(rp->fast_io_fail_ms)))
		return o;
	json_object_put(o);
	return NULL;
}

static struct json_object *path_json(unsigned idx, const struct rtrs_path_stats *st)
{
	struct json_object *o = json_object_new_object();
	bool ok;

	ok = put(o, "index", json_object_new_uint64(idx)) &&
	     put(o, "name", json_object_new_string(st->name)) &&
	     put(o, "src", json_object_new_string(st->src)) &&
	     put(o, "state", json_object_new_string(st->state)) &&
	     put(o, "removed", json_object_new_boolean(st->removed)) &&
	     put(o, "inflight", json_object_new_uint64(st->inflight)) &&
	     put(o, "reads", json_object_new_uint64(st->reads)) &&
	     put(o, "read_bytes", json_object_new_uint64(st->read_bytes)) &&
	     put(o, "writes", json_object_new_uint64(st->writes)) &&
	     put(o, "write_bytes", json_object_new_uint64(st->write_bytes)) &&
	     put(o, "hb_latency_ns", json_object_new_uint64(st->hb_latency_ns)) &&
	     put(o, "reconnects", json_object_new_uint64(st->reconnects)) &&
	     put(o, "reconnect_failures", json_object_new_uint64(st->reconnect_failures)) &&
	     put(o, "failovers", json_object_new_uint64(st->failovers)) &&
	     put(o, "auth_runs", json_object_new_uint64(st->auth_runs)) &&
	     put(o, "reconnect_verdict", json_object_new_string(st->reconnect_verdict ?
								st->reconnect_verdict : "")) &&
	     (!st->last_error ||
	      put(o, "last_error", json_object_new_string(strerrorname_np(-st->last_error) ?
							  strerrorname_np(-st->last_error) :
							  "unknown")));
	if (!ok) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

static struct json_object *sess_json(const char *name, struct rnbd_clt_sess *s)
{
	struct rtrs_clt_sess *r = rnbd_clt_rtrs(s);
	struct rtrs_attrs a = { .size = sizeof(a) };
	struct rtrs_reconnect_params rp = { .size = sizeof(rp) };
	const char *pol = clt_ctl_policy_name((unsigned)rtrs_clt_get_mp_policy(r));
	struct json_object *o = json_object_new_object(), *paths = json_object_new_array();
	int ext = rtrs_clt_peer_ext(r);
	bool ok = o && paths;

	rtrs_clt_query(r, &a);
	ok = ok && !rtrs_clt_get_reconnect(r, &rp);
	for (unsigned i = 0; ok && i < a.paths_num; i++) {
		struct rtrs_path_stats st = { .size = sizeof(st) };
		struct json_object *p;

		if (rtrs_clt_path_stats(r, i, &st))
			continue; /* removed meanwhile */
		p = path_json(i, &st);
		ok = p && !json_object_array_add(paths, p);
		if (!ok)
			json_object_put(p);
	}
	ok = ok && put(o, "name", json_object_new_string(name)) &&
	     put(o, "server", json_object_new_string(ext > 0 ? "rnbd" : "kernel")) &&
	     put(o, "queue_depth", json_object_new_uint64(a.queue_depth)) &&
	     put(o, "max_io_size", json_object_new_uint64(a.max_io_size)) &&
	     put(o, "paths_up", json_object_new_uint64(a.paths_up)) &&
	     put(o, "server_sessions", json_object_new_uint64(a.server_sessions)) &&
	     put(o, "policy", json_object_new_string(pol ? pol : "")) &&
	     put(o, "reconnect", reconnect_json(&rp));
	/* put takes paths or drops it, whatever came before. */
	ok = put(ok ? o : NULL, "paths", paths) && ok;
	if (!ok) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

/* ---- methods ---- */

static const char *const no_params[] = { NULL };
static const char *const sess_path[] = { "session", "path", NULL };

static int m_sessions(void *priv, struct json_object *params, struct json_object **result,
		      struct rpc_err *err)
{
	struct clt_ctl *c = priv;
	struct json_object *arr;
	unsigned n;
	int rc = rpc_params_check(params, no_params, err);
	__typeof__(c->sess[0]) *snap;

	if (rc)
		return rc;
	snap = malloc(sizeof(c->sess));
	arr = json_object_new_array();
	if (!snap || !arr) {
		free(snap);
		json_object_put(arr);
		return -ENOMEM;
	}
	/* Held while they are read: a session's close waits for that (clt_ctl_del). */
	pthread_mutex_lock(&c->lock);
	n = 0;
	for (unsigned i = 0; i < c->nr_sess; i++) {
		if (!c->sess[i].leaving) {
			c->sess[i].refs++;
			snap[n++] = c->sess[i];
		}
	}
	pthread_mutex_unlock(&c->lock);
	for (unsigned i = 0; i < n && arr; i++) {
		struct json_object *o = sess_json(snap[i].name, snap[i].sess);

		if (!o || json_object_array_add(arr, o)) {
			json_object_put(o);
			json_object_put(arr);
			arr = NULL;
		}
	}
	for (unsigned i = 0; i < n; i++)
		clt_ctl_put(c, snap[i].sess);
	free(snap);
	if (!arr)
		return -ENOMEM;
	*result = arr;
	return 0;
}

static int m_devices(void *priv, struct json_object *params, struct json_object **result,
		     struct rpc_err *err)
{
	struct clt_ctl *c = priv;
	struct json_object *arr;
	int rc = rpc_params_check(params, no_params, err);

	if (rc)
		return rc;
	arr = json_object_new_array();
	if (!arr)
		return -ENOMEM;
	rc = c->devices ? c->devices(c->priv, arr) : 0;
	if (rc) {
		json_object_put(arr);
		return rc;
	}
	*result = arr;
	return 0;
}

/*
 * A path add may go on (c->max_paths): the session's paths not removed,
 * and those other adds are connecting, below the limit; counted in until
 * path_unreserve. 0, or -E2BIG with err set.
 */
static int path_reserve(struct clt_ctl *c, struct rnbd_clt_sess *sess, struct rtrs_clt_sess *r,
			const char *name, struct rpc_err *err)
{
	struct rtrs_attrs a = { .size = sizeof(a) };
	__typeof__(c->sess[0]) *e;
	unsigned live = 0;
	int rc = 0;

	if (!c->max_paths)
		return 0;
	pthread_mutex_lock(&c->lock);
	rtrs_clt_query(r, &a); /* paths_num, connected or not (-ECOMM: none is) */
	for (unsigned i = 0; i < a.paths_num; i++) {
		struct rtrs_path_stats st = { .size = sizeof(st) };

		live += !rtrs_clt_path_stats(r, i, &st) && !st.removed;
	}
	e = entry_of(c, sess);
	if (e && live + e->adding >= c->max_paths)
		rc = rpc_errf(err, -E2BIG, "session %s: at most %u paths (not removed) per "
			      "session: client.path.remove one first", name, c->max_paths);
	else if (e)
		e->adding++;
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static void path_unreserve(struct clt_ctl *c, struct rnbd_clt_sess *sess)
{
	__typeof__(c->sess[0]) *e;

	if (!c->max_paths)
		return;
	pthread_mutex_lock(&c->lock);
	e = entry_of(c, sess);
	if (e)
		e->adding--;
	pthread_mutex_unlock(&c->lock);
}

static int m_path_add_held(void *priv, struct json_object *params, struct json_object **result,
			   struct rpc_err *err, struct rnbd_clt_sess **held)
{
	static const char *const names[] = { "session", "server", NULL };
	struct rtrs_addr a = { .size = sizeof(a) };
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *r;
	const char *name, *server;
	char why[256];
	unsigned idx;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "session", true, &name, err)) ||
	    (rc = rpc_param_str(params, "server", true, &server, err)))
		return rc;
	if (rtrs_addr_parse(server, RNBD_DEFAULT_PORT_NR, &a, why, sizeof(why)))
		return rpc_errf(err, RPC_INVALID_PARAMS, "server %s: %s", server, why);
	if (!(r = sess_param(priv, params, &name, held, err)))
		return err->code;
	if ((rc = path_reserve(priv, *held, r, name, err)))
		return rc;
	rtrs_addr_path(&a, &pa);
	rc = rtrs_clt_add_path(r, &pa, &idx);
	path_unreserve(priv, *held);
	if (rc)
		return rpc_errf(err, rc, "session %s: adding a path to %s: %s", name, server,
				strerror(-rc));
	*result = json_object_new_object();
	return put(*result, "index", json_object_new_uint64(idx)) ? 0 : -ENOMEM;
}

static int m_path_add(void *priv, struct json_object *params, struct json_object **result,
		      struct rpc_err *err)
{
	struct rnbd_clt_sess *held = NULL;
	int rc = m_path_add_held(priv, params, result, err, &held);

	clt_ctl_put(priv, held);
	return rc;
}

/* remove, reconnect, disconnect: the same shape. */
static int path_op_held(void *priv, struct json_object *params, struct json_object **result,
			struct rpc_err *err, int (*op)(struct rtrs_clt_sess *, unsigned),
			const char *what, struct rnbd_clt_sess **held)
{
	struct rtrs_clt_sess *r;
	const char *name;
	unsigned idx = 0;
	int rc;

	if ((rc = rpc_params_check(params, sess_path, err)) ||
	    (rc = rpc_param_str(params, "session", true, &name, err)) ||
	    (rc = path_param(params, true, &idx, err)))
		return rc;
	if (!(r = sess_param(priv, params, &name, held, err)))
		return err->code;
	if ((rc = path_exists(r, name, idx, err)))
		return rc;
	rc = op(r, idx);
	if (rc)
		return rpc_errf(err, rc, "session %s: %s path %u: %s", name, what, idx,
				strerror(-rc));
	*result = json_object_new_object();
	return put(*result, "index", json_object_new_uint64(idx)) ? 0 : -ENOMEM;
}

static int path_op(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err, int (*op)(struct rtrs_clt_sess *, unsigned), const char *what)
{
	struct rnbd_clt_sess *held = NULL;
	int rc = path_op_held(priv, params, result, err, op, what, &held);

	clt_ctl_put(priv, held);
	return rc;
}

static int m_path_remove(void *priv, struct json_object *params, struct json_object **result,
			 struct rpc_err *err)
{
	return path_op(priv, params, result, err, rtrs_clt_remove_path, "removing");
}

static int m_path_reconnect(void *priv, struct json_object *params,
			    struct json_object **result, struct rpc_err *err)
{
	return path_op(priv, params, result, err, rtrs_clt_reconnect_path, "reconnecting");
}

static int m_path_disconnect(void *priv, struct json_object *params,
			     struct json_object **result, struct rpc_err *err)
{
	return path_op(priv, params, result, err, rtrs_clt_disconnect_path, "disconnecting");
}

static int m_policy_held(void *priv, struct json_object *params, struct json_object **result,
			 struct rpc_err *err, struct rnbd_clt_sess **held)
{
	static const char *const names[] = { "session", "policy", NULL };
	struct rtrs_clt_sess *r;
	const char *name, *pol;
	int rc, p;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "session", true, &name, err)) ||
	    (rc = rpc_param_str(params, "policy", true, &pol, err)))
		return rc;
	p = clt_ctl_policy_of(pol);
	if (p < 0)
		return rpc_errf(err, RPC_INVALID_PARAMS,
				"policy %s: not round-robin, min-inflight or min-latency", pol);
	if (!(r = sess_param(priv, params, &name, held, err)))
		return err->code;
	rc = rtrs_clt_set_mp_policy(r, (enum rtrs_mp_policy)p);
	if (rc)
		return rpc_errf(err, rc, "session %s: policy %s: %s", name, pol, strerror(-rc));
	*result = json_object_new_object();
	return put(*result, "policy", json_object_new_string(pol)) ? 0 : -ENOMEM;
}

static int m_policy(void *priv, struct json_object *params, struct json_object **result,
		    struct rpc_err *err)
{
	struct rnbd_clt_sess *held = NULL;
	int rc = m_policy_held(priv, params, result, err, &held);

	clt_ctl_put(priv, held);
	return rc;
}

/*
 * client.reconnect: each parameter given replaces its value, the others
 * stay as they are; the answer is every value in force. With only the
 * session it changes nothing and says what is in force.
 */
static int m_reconnect_held(void *priv, struct json_object *params, struct json_object **result,
			    struct rpc_err *err, struct rnbd_clt_sess **held)
{
	static const char *const names[] = { "session", "delay_ms", "jitter_ms", "max_attempts",
					     "loss_timeout_ms", "fast_io_fail_ms", NULL };
	static const struct {
		const char *name;
		uint64_t max;
		size_t off;
	} ms[] = {
		{ "delay_ms", 3600000, offsetof(struct rtrs_reconnect_params, delay_ms) },
		{ "jitter_ms", 3600000, offsetof(struct rtrs_reconnect_params, jitter_ms) },
		{ "loss_timeout_ms", 86400000,
		  offsetof(struct rtrs_reconnect_params, loss_timeout_ms) },
		{ "fast_io_fail_ms", 3600000,
		  offsetof(struct rtrs_reconnect_params, fast_io_fail_ms) },
	};
	struct rtrs_reconnect_params rp = { .size = sizeof(rp) };
	uint64_t val[sizeof(ms) / sizeof(ms[0])];
	bool has[sizeof(ms) / sizeof(ms[0])], has_max, change = false;
	struct rtrs_clt_sess *r;
	struct json_object *v;
	const char *name;
	int rc, max = 0;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "session", true, &name, err)))
		return rc;
	for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
		has[i] = json_object_object_get_ex(params, ms[i].name, NULL);
		if (has[i] && (rc = rpc_param_u64(params, ms[i].name, true, 0, ms[i].max, &val[i],
						  err)))
			return rc;
	}
	/* max_attempts: a count, or -1 for no limit. */
	has_max = json_object_object_get_ex(params, "max_attempts", &v);
	if (has_max) {
		uint64_t attempts;

		if (json_object_is_type(v, json_type_int) && json_object_get_int64(v) == -1) {
			max = -1;
		} else if ((rc = rpc_param_u64(params, "max_attempts", true, 0, 1000000, &attempts,
					       err))) {
			char msg[sizeof(err->msg)];

			memcpy(msg, err->msg, sizeof(msg));
			return rpc_errf(err, rc, "%.*s (or -1: no limit)", rpc_utf8_prefix(msg, 400),
					msg);
		} else {
			max = (int)attempts;
		}
	}
	if (!(r = sess_param(priv, params, &name, held, err)))
		return err->code;
	/* Two changes of different fields at once: both kept, neither undone by the other. */
	pthread_mutex_lock(&((struct clt_ctl *)priv)->tune_lock);
	rc = rtrs_clt_get_reconnect(r, &rp);
	for (size_t i = 0; !rc && i < sizeof(ms) / sizeof(ms[0]); i++) {
		if (has[i])
			*(unsigned *)((char *)&rp + ms[i].off) = (unsigned)val[i];
		change |= has[i];
	}
	if (!rc && has_max)
		rp.max_attempts = max;
	change |= has_max;
	if (!rc && change)
		rc = rtrs_clt_set_reconnect(r, &rp);
	pthread_mutex_unlock(&((struct clt_ctl *)priv)->tune_lock);
	if (rc)
		return rpc_errf(err, rc, "session %s: reconnect parameters: %s", name,
				strerror(-rc));
	*result = reconnect_json(&rp);
	return *result ? 0 : -ENOMEM;
}

static int m_reconnect(void *priv, struct json_object *params, struct json_object **result,
		       struct rpc_err *err)
{
	struct rnbd_clt_sess *held = NULL;
	int rc = m_reconnect_held(priv, params, result, err, &held);

	clt_ctl_put(priv, held);
	return rc;
}

static int m_stats_reset_held(void *priv, struct json_object *params, struct json_object **result,
			      struct rpc_err *err, struct rnbd_clt_sess **held)
{
	struct rtrs_attrs a = { .size = sizeof(a) };
	struct rtrs_clt_sess *r;
	const char *name;
	bool one = json_object_object_get_ex(params, "path", NULL);
	unsigned idx = 0, n = 0;
	int rc;

	if ((rc = rpc_params_check(params, sess_path, err)) ||
	    (rc = rpc_param_str(params, "session", true, &name, err)) ||
	    (one && (rc = path_param(params, true, &idx, err))))
		return rc;
	if (!(r = sess_param(priv, params, &name, held, err)))
		return err->code;
	if (one) {
		if ((rc = path_exists(r, name, idx, err)))
			return rc;
		rc = rtrs_clt_reset_path_stats(r, idx);
		n = !rc;
	} else {
		rtrs_clt_query(r, &a);
		for (unsigned i = 0; i < a.paths_num; i++)
			n += !rtrs_clt_reset_path_stats(r, i);
		rc = 0;
	}
	if (rc)
		return rpc_errf(err, rc, "session %s: %s", name, strerror(-rc));
	*result = json_object_new_object();
	return put(*result, "paths_reset", json_object_new_uint64(n)) ? 0 : -ENOMEM;
}

static int m_stats_reset(void *priv, struct json_object *params, struct json_object **result,
			 struct rpc_err *err)
{
	struct rnbd_clt_sess *held = NULL;
	int rc = m_stats_reset_held(priv, params, result, err, &held);

	clt_ctl_put(priv, held);
	return rc;
}

/* ---- metrics (Prometheus) ---- */

enum { SRC_SESSIONS, SRC_DEVICES, SRC_NR };

/*
 * A path's series are told apart by session and index (a path keeps its
 * index for life, reconnects included, and indexes are not reused); src
 * and dst say where it goes. A removed path has no series: a path added
 * again in its place is a new one, with an index of its own.
 */
#define PATHS(n, t, h) .name = "rnbd_client_path_" n, .type = t, .help = h, \
		       .src = SRC_SESSIONS, .shape = METRICS_NESTED, .nested = "paths", \
		       .labels = { { "session", "name", false }, { "path", "index", true }, \
				   { "src", "src", true }, { "dst", "dst", true } }
#define PATH(n, t, f, h) { PATHS(n, t, h), .field = f }
#define SESS_LABELS .labels = { { "session", "name", false } }
#define DEV_LABELS .labels = { { "session", "session", false }, { "device", "device", false } }

static const struct metrics_def metric_defs[] = {
	{ .name = "rnbd_client_session_paths_up", .type = "gauge",
	  .help = "paths of the session connected now", .src = SRC_SESSIONS,
	  .shape = METRICS_ARRAY, SESS_LABELS, .field = "paths_up" },
	{ .name = "rnbd_client_session_server_sessions", .type = "gauge",
	  .help = "server sessions the session has met (grows when a server restarted)",
	  .src = SRC_SESSIONS, .shape = METRICS_ARRAY, SESS_LABELS, .field = "server_sessions" },
	{ PATHS("up", "gauge", "1 while the path is connected"), .field = "state",
	  .match = "connected" },
	PATH("inflight_requests", "gauge", "inflight", "requests in flight on the path now"),
	PATH("reads_total", "counter", "reads", "reads sent on the path"),
	PATH("read_bytes_total", "counter", "read_bytes", "bytes read on the path"),
	PATH("writes_total", "counter", "writes", "writes sent on the path"),
	PATH("write_bytes_total", "counter", "write_bytes", "bytes written on the path"),
	PATH("reconnects_total", "counter", "reconnects", "successful reconnects"),
	PATH("reconnect_failures_total", "counter", "reconnect_failures", "failed reconnects"),
	PATH("failovers_total", "counter", "failovers",
	     "requests moved off the path when it failed"),
	PATH("auth_runs_total", "counter", "auth_runs", "authentications the path completed"),
	{ PATHS("heartbeat_latency_seconds", "gauge", "the last heartbeat's round trip"),
	  .field = "hb_latency_ns", .scale = 1e-9 },
	{ .name = "rnbd_client_device_size_bytes", .type = "gauge", .help = "the device's size",
	  .src = SRC_DEVICES, .shape = METRICS_ARRAY, DEV_LABELS, .field = "bytes" },
	{ .name = "rnbd_client_device_mapped", .type = "gauge",
	  .help = "1 while the device is mapped and open", .src = SRC_DEVICES,
	  .shape = METRICS_ARRAY, DEV_LABELS, .field = "state", .match = "mapped" },
};

/* client.sessions as the path series want it: removed paths out, "dst" (HOST:PORT) in. */
static int metrics_paths(struct json_object *sessions)
{
	for (size_t i = 0; i < json_object_array_length(sessions); i++) {
		struct json_object *paths, *v;

		if (!json_object_object_get_ex(json_object_array_get_idx(sessions, i), "paths",
					       &paths))
			continue;
		for (size_t k = json_object_array_length(paths); k-- > 0;) {
			struct json_object *p = json_object_array_get_idx(paths, k);
			const char *name, *slash;

			if (json_object_object_get_ex(p, "removed", &v) && json_object_get_boolean(v)) {
				json_object_array_del_idx(paths, k, 1);
				continue;
			}
			name = json_object_object_get_ex(p, "name", &v) ? json_object_get_string(v) : "";
			slash = strchr(name, '/'); /* "session/host:port"; a session name has no '/' */
			if (!put(p, "dst", json_object_new_string(slash ? slash + 1 : name)))
				return -ENOMEM;
		}
	}
	return 0;
}

char *clt_ctl_metrics(void *priv)
{
	struct json_object *srcs[SRC_NR] = { NULL };
	struct rpc_err err;
	char *text = NULL;

	if (!m_sessions(priv, NULL, &srcs[SRC_SESSIONS], &err) &&
	    !metrics_paths(srcs[SRC_SESSIONS]) &&
	    !m_devices(priv, NULL, &srcs[SRC_DEVICES], &err))
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
	text = clt_ctl_metrics(priv);
	if (!text)
		return -ENOMEM;
	*result = json_object_new_object();
	rc = put(*result, "text", json_object_new_string(text)) ? 0 : -ENOMEM;
	free(text);
	return rc;
}

const struct rpc_method clt_ctl_methods[] = {
	{ "client.sessions", m_sessions, "",
	  "every session: its server's kind, limits and paths (state, counters, reconnects)" },
	{ "client.devices", m_devices, "", "every mapped device: session, name, size, state" },
	{ "client.path.add", m_path_add, "session: string, server: string ([SRC@]HOST[:PORT])",
	  "add a path to a session and connect it" },
	{ "client.path.remove", m_path_remove, "session: string, path: integer",
	  "remove a path for good (its IO fails over)" },
	{ "client.path.reconnect", m_path_reconnect, "session: string, path: integer",
	  "reconnect a path now, with a fresh count of attempts" },
	{ "client.path.disconnect", m_path_disconnect, "session: string, path: integer",
	  "close a path and keep it closed until reconnected" },
	{ "client.policy", m_policy, "session: string, policy: string",
	  "the multipath policy: round-robin, min-inflight or min-latency" },
	{ "client.reconnect", m_reconnect,
	  "session: string; each optional: delay_ms, jitter_ms, max_attempts (-1: no limit), "
	  "loss_timeout_ms (0: none), fast_io_fail_ms: integers",
	  "the reconnect parameters: those given change (from the next attempt on), all are "
	  "answered" },
	{ "client.stats.reset", m_stats_reset, "session: string, path: integer (optional)",
	  "zero the counters of a path, or of every path of the session" },
	{ "metrics", m_metrics, "", "every counter in Prometheus's text format: {\"text\": ...}" },
};

const size_t clt_ctl_nr_methods = sizeof(clt_ctl_methods) / sizeof(clt_ctl_methods[0]);
