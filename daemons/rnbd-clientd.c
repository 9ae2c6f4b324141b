/* SPDX-License-Identifier: MIT */
/*
 * rnbd-clientd: the long-lived RNBD client. It holds sessions and the
 * devices mapped through them for as long as it runs, managed over its
 * control socket (JSON-RPC, docs/management.md) by the rnbd command:
 * client.map, client.unmap, client.remap, client.resize, client.save, and
 * the client.* methods every client process has (lib/front/clt-ctl.c:
 * sessions, paths, policy, reconnects, statistics).
 *
 *   rnbd-clientd [--control PATH] [--mappings FILE] [--metrics HOST:PORT]
 *
 * A mapped device becomes a Linux block device, /dev/ublkbN, through ublk
 * (ublk.c; the userspace counterpart of /dev/rnbdX). Where the kernel has
 * no ublk (no /dev/ublk-control) the mapping still works, and the device
 * says that no block device can be made here (client.devices:
 * "block_device": null and the reason). A mounted or open block device is
 * unmapped only by force; stopping the daemon removes every block device.
 *
 * --mappings FILE: a JSON array of mappings, each as client.map takes
 * them; read at start (a file that cannot be read or parsed stops the
 * daemon with the file and the reason; a mapping that fails is logged and
 * kept), written by client.save (whole, through a temporary file renamed
 * into place).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clt-ctl.h"
#include "clt-opts.h"
#include "dlog.h"
#include "metrics.h"
#include "opts.h"
#include "rnbd.h"
#include "rpc.h"
#include "ublk.h"

#define DEVS_MAX 256


static struct {
	const char *config, *control, *mappings, *metrics, *log_level;
	bool quiet, syslog;
} g = { .control = "/run/rnbd/client.sock" };

static const struct opt options[] = {
	{ "config", 'c', OPT_CONFIG, &g.config, .arg = "FILE",
	  .help = "read options from FILE first (\"name value\" per line)" },
	{ "control", 'S', OPT_STRING, &g.control, .arg = "PATH",
	  .help = "the control socket (JSON-RPC, the rnbd command)" },
	{ "mappings", 'm', OPT_STRING, &g.mappings, .arg = "FILE",
	  .help = "restore the mappings in FILE at start; client.save writes them there" },
	{ "metrics", 0, OPT_STRING, &g.metrics, .arg = "HOST:PORT",
	  .help = "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any, printed)" },
	{ "syslog", 0, OPT_FLAG, &g.syslog, .help = "log to syslog (the journal) instead of stderr" },
	{ "quiet", 0, OPT_FLAG, &g.quiet, .help = "log errors only (--log-level error)" },
	{ "log-level", 0, OPT_STRING, &g.log_level, .arg = "LEVEL",
	  .help = "error, warn, info or debug (default: RTRS_LOG_LEVEL, else info)" },
	{ 0 },
};

/* A session: its options (strings owned here) and librnbd's handle. */
struct sess {
	char name[256];
	struct clt_cfg cfg;
	char *strs[64];               /* the option values cfg points at */
	unsigned nr_strs;
	struct json_object *spec;     /* servers and options, as mapped (for client.save) */
	struct rnbd_clt_sess *rnbd;
	unsigned devs;
};

struct dev {
	struct sess *s;
	char name[256];
	enum rnbd_clt_mode mode;
	struct rnbd_clt_dev *d;
	struct ublk_dev *ub;          /* its block device, where ublk is */
	char bdev[32];                /* "/dev/ublkbN", or "" */
	char note[200];               /* why there is none */
};

static struct sess *sessions[CLT_CTL_SESS_MAX];
static struct dev *devs[DEVS_MAX];
static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER; /* devs[] for readers */
static struct clt_ctl ctl;
static int log_level = DLOG_INFO;
static char ublk_note[160];


/* ---- block devices: ublk ---- */

static bool have_ublk;

/* Whether this kernel can make block devices from userspace (ublk). */
static void probe_ublk(void)
{
	have_ublk = !ublk_probe(ublk_note, sizeof(ublk_note));
	if (have_ublk)
		snprintf(ublk_note, sizeof(ublk_note), "ublk: mapped devices become /dev/ublkbN");
}

/* ---- sessions and devices ---- */

static struct sess *sess_find(const char *name)
{
	for (unsigned i = 0; i < CLT_CTL_SESS_MAX; i++)
		if (sessions[i] && !strcmp(sessions[i]->name, name))
			return sessions[i];
	return NULL;
}

static void sess_free(struct sess *s)
{
	if (!s)
		return;
	for (unsigned i = 0; i < CLT_CTL_SESS_MAX; i++)
		if (sessions[i] == s)
			sessions[i] = NULL;
	if (s->rnbd) {
		clt_ctl_del(&ctl, s->rnbd);
		rnbd_clt_sess_close(s->rnbd);
	}
	for (unsigned i = 0; i < s->nr_strs; i++)
		free(s->strs[i]);
	json_object_put(s->spec);
	free(s);
}

/* An option value for cfg: kept as long as the session. */
static const char *keep(struct sess *s, const char *v)
{
	char *c;

	if (s->nr_strs == sizeof(s->strs) / sizeof(s->strs[0]) || !(c = strdup(v)))
		return NULL;
	s->strs[s->nr_strs++] = c;
	return c;
}

/* One option from a JSON value (a string, an integer or a boolean). */
static int sess_opt(struct sess *s, enum clt_opt_id id, const char *key, struct json_object *v,
		    struct rpc_err *err)
{
	char num[32], why[300];
	const char *text, *kept;
	int rc;

	if (json_object_is_type(v, json_type_string)) {
		text = json_object_get_string(v);
	} else if (json_object_is_type(v, json_type_int)) {
		snprintf(num, sizeof(num), "%lld", (long long)json_object_get_int64(v));
		text = num;
	} else {
		return rpc_errf(err, RPC_INVALID_PARAMS, "option %s must be a string or an integer",
				key);
	}
	if (!*text)
		return rpc_errf(err, RPC_INVALID_PARAMS, "option %s must not be empty", key);
	if (!(kept = keep(s, text)))
		return -ENOMEM;
	rc = clt_opt_set(&s->cfg, id, kept, why, sizeof(why));
	if (rc) {
		if (clt_opt_secret(id))
			return rpc_errf(err, RPC_INVALID_PARAMS, "option %s: %s", key, why);
		return rpc_errf(err, RPC_INVALID_PARAMS, "option %s=%s: %s", key, text, why);
	}
	return 0;
}

/*
 * A new session named name from params' "server" (an array) and "options"
 * (an object of the client front ends' keys, as the nbdkit plugin takes
 * them): opened, registered. The new session, or NULL with err set.
 */
static struct sess *sess_open(const char *name, struct json_object *params, struct rpc_err *err)
{
	struct json_object *servers = NULL, *opts = NULL;
	struct sess *s = calloc(1, sizeof(*s));
	unsigned slot;
	int rc;

	if (!s) {
		rpc_errf(err, -ENOMEM, "out of memory");
		return NULL;
	}
	snprintf(s->name, sizeof(s->name), "%s", name);
	clt_cfg_init(&s->cfg, CLT_MAX_PATHS);
	s->cfg.opts.fast_io_fail_ms = 30000;
	s->cfg.opts.reconnect_delay_ms = 1000;
	rc = rpc_param_strs(params, "server", true, &servers, err);
	if (!rc && !json_object_array_length(servers))
		rc = rpc_errf(err, RPC_INVALID_PARAMS, "server: at least one path is needed");
	if (!rc && json_object_object_get_ex(params, "options", &opts) &&
	    !json_object_is_type(opts, json_type_object))
		rc = rpc_errf(err, RPC_INVALID_PARAMS, "options must be an object");
	if (!rc)
		rc = sess_opt(s, CLT_OPT_SESSION, "session", json_object_object_get(params, "session"),
			      err);
	for (size_t i = 0; !rc && i < json_object_array_length(servers); i++)
		rc = sess_opt(s, CLT_OPT_SERVER, "server", json_object_array_get_idx(servers, i), err);
	if (!rc && opts) {
		json_object_object_foreach(opts, key, val) {
			int id = clt_opt_by_key(key);

			if (id < 0 || id == CLT_OPT_SERVER || id == CLT_OPT_SESSION ||
			    id == CLT_OPT_LOG_LEVEL) {
				rc = rpc_errf(err, RPC_INVALID_PARAMS, "unknown option %.64s", key);
				break;
			}
			rc = sess_opt(s, (enum clt_opt_id)id, key, val, err);
			if (rc)
				break;
		}
	}
	for (slot = 0; !rc && slot < CLT_CTL_SESS_MAX && sessions[slot]; slot++)
		;
	if (!rc && slot == CLT_CTL_SESS_MAX)
		rc = rpc_errf(err, -ENOSPC, "no room for another session (at most %u)",
			      CLT_CTL_SESS_MAX);
	if (!rc) {
		/* As the plugin does: the jitter is half the delay unless given. */
		if (!opts || !json_object_object_get_ex(opts, "reconnect_jitter_ms", NULL))
			s->cfg.opts.reconnect_jitter_ms = s->cfg.opts.reconnect_delay_ms / 2;
		rc = rnbd_clt_sess_open(&s->cfg.opts, &s->rnbd);
		if (rc)
			rpc_errf(err, rc, "session %s: %s", name, rc == -EPERM ?
				 "the server has a session of this name open (another client)" :
				 strerror(-rc));
	}
	if (!rc && (rc = clt_ctl_add(&ctl, name, s->rnbd)))
		rpc_errf(err, rc, "session %s: %s", name, strerror(-rc));
	if (rc) {
		sess_free(s);
		return NULL;
	}
	s->spec = json_object_new_object();
	json_object_object_add(s->spec, "server", json_object_get(servers));
	if (opts)
		json_object_object_add(s->spec, "options", json_object_get(opts));
	sessions[slot] = s;
	dlog(DLOG_INFO, "session %s: open, %zu path%s", name, json_object_array_length(servers),
	     json_object_array_length(servers) == 1 ? "" : "s");
	return s;
}

/* The device named by params ("session" optional when the name is unique). */
static struct dev *dev_param(struct json_object *params, struct rpc_err *err)
{
	const char *name = NULL, *sname = NULL;
	struct dev *found = NULL;
	unsigned n = 0;

	if (rpc_param_str(params, "device", true, &name, err) ||
	    rpc_param_str(params, "session", false, &sname, err))
		return NULL;
	for (unsigned i = 0; i < DEVS_MAX; i++) {
		struct dev *d = devs[i];

		if (d && !strcmp(d->name, name) && (!sname || !strcmp(d->s->name, sname))) {
			found = d;
			n++;
		}
	}
	if (!n)
		rpc_errf(err, -ENOENT, "device %s%s%s is not mapped", name, sname ? " of session " : "",
			 sname ? sname : "");
	else if (n > 1)
		rpc_errf(err, RPC_INVALID_PARAMS,
			 "device %s is mapped through %u sessions: name the session", name, n);
	return n == 1 ? found : NULL;
}

static const char *const mode_names[] = { "ro", "rw", "migration" };

static int mode_of(const char *s)
{
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, mode_names[i]))
			return i;
	return -1;
}

/* ---- methods ---- */

static bool put(struct json_object *o, const char *key, struct json_object *v)
{
	if (!o || !v || json_object_object_add(o, key, v)) {
		json_object_put(v);
		return false;
	}
	return true;
}

static struct json_object *dev_json(struct dev *d)
{
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };
	struct json_object *o = json_object_new_object();

	rnbd_clt_dev_info(d->d, &in);
	if (put(o, "session", json_object_new_string(d->s->name)) &&
	    put(o, "device", json_object_new_string(d->name)) &&
	    put(o, "mode", json_object_new_string(mode_names[d->mode])) &&
	    put(o, "bytes", json_object_new_uint64(in.bytes)) &&
	    put(o, "state", json_object_new_string(in.state ? in.state : "")) &&
	    put(o, "logical_block_size", json_object_new_uint64(in.logical_block_size)) &&
	    put(o, "max_io", json_object_new_uint64(in.max_io)) &&
	    put(o, "read_only", json_object_new_boolean(in.read_only)) &&
	    !json_object_object_add(o, "block_device",
				    d->bdev[0] ? json_object_new_string(d->bdev) : NULL) &&
	    (d->bdev[0] || put(o, "note", json_object_new_string(d->note))))
		return o;
	json_object_put(o);
	return NULL;
}

static int devices_fn(void *priv, struct json_object *arr)
{
	int rc = 0;

	pthread_mutex_lock(&devs_lock);
	for (unsigned i = 0; i < DEVS_MAX && !rc; i++) {
		struct json_object *o;

		if (!devs[i])
			continue;
		o = dev_json(devs[i]);
		if (!o || json_object_array_add(arr, o)) {
			json_object_put(o);
			rc = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&devs_lock);
	return rc;
}

/* params' server and options, where given, are the session's (a saved mapping's are). */
static bool spec_same(struct sess *s, struct json_object *params)
{
	static const char *const keys[] = { "server", "options" };

	for (unsigned i = 0; i < 2; i++) {
		struct json_object *given, *had = NULL;

		if (!json_object_object_get_ex(params, keys[i], &given))
			continue;
		json_object_object_get_ex(s->spec, keys[i], &had);
		if (!json_object_equal(given, had))
			return false;
	}
	return true;
}

static int m_map(void *priv, struct json_object *params, struct json_object **result,
		 struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", "server", "mode", "options",
					     NULL };
	const char *name, *sname, *mname = "rw";
	struct sess *s;
	struct dev *d;
	unsigned slot;
	bool fresh = false;
	int rc, mode;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "device", true, &name, err)) ||
	    (rc = rpc_param_str(params, "session", true, &sname, err)) ||
	    (rc = rpc_param_str(params, "mode", false, &mname, err)))
		return rc;
	mode = mode_of(mname);
	if (mode < 0)
		return rpc_errf(err, RPC_INVALID_PARAMS, "mode %s: expected rw, ro or migration",
				mname);
	for (slot = 0; slot < DEVS_MAX && devs[slot]; slot++)
		;
	if (slot == DEVS_MAX)
		return rpc_errf(err, -ENOSPC, "no room for another device (at most %u)", DEVS_MAX);
	s = sess_find(sname);
	if (s && !spec_same(s, params))
		return rpc_errf(err, -EEXIST, "session %s is open already with other servers or "
				"options: map through it without them (client.path.add adds paths)",
				sname);
	if (!s) {
		s = sess_open(sname, params, err);
		if (!s)
			return err->code;
		fresh = true;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		rc = -ENOMEM;
		goto fail;
	}
	d->s = s;
	d->mode = (enum rnbd_clt_mode)mode;
	snprintf(d->name, sizeof(d->name), "%s", name);
	rc = rnbd_clt_map(s->rnbd, name, d->mode, &d->d);
	if (rc) {
		rpc_errf(err, rc, "device %s of session %s: %s", name, sname,
			 rc == -EPERM ? "the server refused the mode (another client writes it)" :
			 rc == -EEXIST ? "mapped already" : strerror(-rc));
		free(d);
		goto fail;
	}
	snprintf(d->note, sizeof(d->note), "%s", ublk_note);
	if (have_ublk) {
		char why[200];
		int id;

		rc = ublk_dev_add(s->rnbd, d->d, name, &d->ub, &id, why, sizeof(why));
		if (rc) {
			rpc_errf(err, rc, "device %s of session %s: mapped, but no block device: %s",
				 name, sname, why);
			rnbd_clt_unmap(d->d, true);
			free(d);
			goto fail;
		}
		snprintf(d->bdev, sizeof(d->bdev), "/dev/ublkb%d", id);
	}
	s->devs++;
	pthread_mutex_lock(&devs_lock);
	devs[slot] = d;
	pthread_mutex_unlock(&devs_lock);
	dlog(DLOG_INFO, "device %s of session %s: mapped %s; %s", name, sname, mname,
	     d->bdev[0] ? d->bdev : d->note);
	*result = dev_json(d);
	return *result ? 0 : -ENOMEM;
fail:
	if (fresh)
		sess_free(s);
	return err->code ? err->code : rc;
}

static void dev_drop(struct dev *d)
{
	struct sess *s = d->s;

	pthread_mutex_lock(&devs_lock);
	for (unsigned i = 0; i < DEVS_MAX; i++)
		if (devs[i] == d)
			devs[i] = NULL;
	pthread_mutex_unlock(&devs_lock);
	free(d);
	if (--s->devs == 0) {
		dlog(DLOG_INFO, "session %s: its last device is unmapped; closing it", s->name);
		sess_free(s);
	}
}

static int m_unmap(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", "force", NULL };
	bool force = false, had_ub;
	unsigned slot;
	struct dev *d;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_bool(params, "force", false, &force, err)))
		return rc;
	if (!(d = dev_param(params, err)))
		return err->code;
	/*
	 * Off the list first: nobody lists a device being unmapped. Only this
	 * thread adds devices, so its slot is still free if it must go back.
	 */
	/* A block device in use (mounted, or open by someone) goes only by force. */
	if (d->ub && !force) {
		int fd = open(d->bdev, O_RDONLY | O_EXCL | O_CLOEXEC);

		if (fd < 0 && errno == EBUSY)
			return rpc_errf(err, -EBUSY, "device %s of session %s: %s is in use "
					"(mounted or open; force unmaps anyway)", d->name,
					d->s->name, d->bdev);
		if (fd >= 0)
			close(fd);
	}
	for (slot = 0; devs[slot] != d; slot++)
		;
	pthread_mutex_lock(&devs_lock);
	devs[slot] = NULL;
	pthread_mutex_unlock(&devs_lock);
	had_ub = d->ub != NULL;
	if (d->ub) {
		ublk_dev_remove(d->ub); /* the block device first: its IO goes to d */
		d->ub = NULL;
		d->bdev[0] = 0;
		snprintf(d->note, sizeof(d->note), "its block device was removed by an unmap "
			 "that failed");
	}
	/* With the block device gone, nothing sends IO any more: what remains is answered. */
	rc = rnbd_clt_unmap(d->d, force || had_ub);
	if (rc) {
		pthread_mutex_lock(&devs_lock);
		devs[slot] = d;
		pthread_mutex_unlock(&devs_lock);
		return rpc_errf(err, rc, "device %s of session %s: %s", d->name, d->s->name,
				rc == -EBUSY ? "IO in flight (force unmaps anyway)" : strerror(-rc));
	}
	dlog(DLOG_INFO, "device %s of session %s: unmapped%s", d->name, d->s->name,
	     force ? " (force)" : "");
	*result = json_object_new_object();
	rc = put(*result, "device", json_object_new_string(d->name)) ? 0 : -ENOMEM;
	dev_drop(d);
	return rc;
}

static int m_remap(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", NULL };
	struct dev *d;
	int rc;

	if ((rc = rpc_params_check(params, names, err)))
		return rc;
	if (!(d = dev_param(params, err)))
		return err->code;
	rc = rnbd_clt_remap(d->d);
	if (rc)
		return rpc_errf(err, rc, "device %s of session %s: %s", d->name, d->s->name,
				rc == -EALREADY ? "it is mapped and open: nothing to remap" :
				strerror(-rc));
	*result = dev_json(d);
	return *result ? 0 : -ENOMEM;
}

static int m_resize(void *priv, struct json_object *params, struct json_object **result,
		    struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", "bytes", NULL };
	uint64_t bytes;
	struct dev *d;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_u64(params, "bytes", true, 1, UINT64_MAX, &bytes, err)))
		return rc;
	if (!(d = dev_param(params, err)))
		return err->code;
	if (d->ub)
		return rpc_errf(err, -EOPNOTSUPP, "device %s of session %s: %s keeps its size while "
				"it is up (unmap and map it again)", d->name, d->s->name, d->bdev);
	rc = rnbd_clt_resize(d->d, bytes);
	if (rc)
		return rpc_errf(err, rc, "device %s of session %s: %s", d->name, d->s->name,
				rc == -EINVAL ? "the size must be whole blocks, at least one, at most "
				"the server's" : strerror(-rc));
	*result = dev_json(d);
	return *result ? 0 : -ENOMEM;
}

/* addr in brackets when it is IPv6 (holds a ':'), as rtrs_addr_parse reads it. */
static const char *bracketed(const char *addr, size_t n, char *buf, size_t len)
{
	snprintf(buf, len, memchr(addr, ':', n) ? "[%.*s]" : "%.*s", (int)n, addr);
	return buf;
}

/*
 * A path's server as client.map takes it, "[SRC@]HOST:PORT", from its
 * name ("session/host:port") and source; false if the name has no port.
 */
static bool path_server(const struct rtrs_path_stats *st, char *buf, size_t len)
{
	const char *slash = strchr(st->name, '/'), *colon = strrchr(st->name, ':');
	char src[300], host[600];

	if (!slash || !colon || colon <= slash + 1)
		return false;
	snprintf(buf, len, "%s%s%s%s",
		 st->src[0] ? bracketed(st->src, strlen(st->src), src, sizeof(src)) : "",
		 st->src[0] ? "@" : "",
		 bracketed(slash + 1, (size_t)(colon - slash - 1), host, sizeof(host)), colon);
	return true;
}

/*
 * The session as it is now, as client.map takes it: its paths (those not
 * removed, added ones too) and its options, with the policy and the
 * reconnect parameters in force (changed at run time or not), so that a
 * saved mapping restores what the admin has set up.
 */
static struct json_object *sess_spec_now(struct sess *s)
{
	struct rtrs_clt_sess *r = rnbd_clt_rtrs(s->rnbd);
	struct rtrs_reconnect_params rp = { .size = sizeof(rp) };
	struct rtrs_attrs a = { .size = sizeof(a) };
	struct json_object *spec = json_object_new_object(), *servers = json_object_new_array();
	struct json_object *opts = json_object_new_object(), *had;
	const char *pol = clt_ctl_policy_name((unsigned)rtrs_clt_get_mp_policy(r));
	bool ok = spec && servers && opts && pol && !rtrs_clt_get_reconnect(r, &rp);
	const struct {
		const char *key;
		long long v;
	} live[] = {
		{ "reconnect_delay_ms", rp.delay_ms },
		{ "reconnect_jitter_ms", rp.jitter_ms },
		{ "max_reconnect_attempts", rp.max_attempts },
		{ "reconnect_loss_timeout_ms", rp.loss_timeout_ms },
		{ "fast_io_fail_ms", rp.fast_io_fail_ms },
	};

	rtrs_clt_query(r, &a);
	for (unsigned i = 0; ok && i < a.paths_num; i++) {
		struct rtrs_path_stats st = { .size = sizeof(st) };
		char server[1200];

		if (rtrs_clt_path_stats(r, i, &st) || st.removed ||
		    !path_server(&st, server, sizeof(server)))
			continue;
		ok = !json_object_array_add(servers, json_object_new_string(server));
	}
	/* The options given at map (secrets, provider, ...), then what is in force. */
	if (ok && json_object_object_get_ex(s->spec, "options", &had)) {
		json_object_object_foreach(had, key, val)
			ok = ok && !json_object_object_add(opts, key, json_object_get(val));
	}
	for (size_t i = 0; ok && i < sizeof(live) / sizeof(live[0]); i++) {
		char num[32];

		snprintf(num, sizeof(num), "%lld", live[i].v);
		ok = !json_object_object_add(opts, live[i].key, json_object_new_string(num));
	}
	ok = ok && !json_object_object_add(opts, "policy", json_object_new_string(pol));
	/* Every path removed: the servers it was mapped with, for the next start. */
	if (ok && !json_object_array_length(servers) &&
	    json_object_object_get_ex(s->spec, "server", &had)) {
		json_object_put(servers);
		servers = json_object_get(had);
	}
	if (ok && !json_object_object_add(spec, "server", servers)) {
		servers = NULL;
		if (!json_object_object_add(spec, "options", opts))
			return spec;
		opts = NULL;
	}
	json_object_put(servers);
	json_object_put(opts);
	json_object_put(spec);
	return NULL;
}

/* The mappings now, as client.map takes them. */
static struct json_object *mappings_json(void)
{
	struct json_object *arr = json_object_new_array();

	for (unsigned i = 0; arr && i < DEVS_MAX; i++) {
		struct dev *d = devs[i];
		struct json_object *o, *v, *spec;

		if (!d)
			continue;
		o = json_object_new_object();
		spec = sess_spec_now(d->s);
		if (!spec || !put(o, "device", json_object_new_string(d->name)) ||
		    !put(o, "session", json_object_new_string(d->s->name)) ||
		    !put(o, "mode", json_object_new_string(mode_names[d->mode])) ||
		    (json_object_object_get_ex(spec, "server", &v) &&
		     !put(o, "server", json_object_get(v))) ||
		    (json_object_object_get_ex(spec, "options", &v) &&
		     !put(o, "options", json_object_get(v))) ||
		    json_object_array_add(arr, o)) {
			json_object_put(spec);
			json_object_put(o);
			json_object_put(arr);
			return NULL;
		}
		json_object_put(spec);
	}
	return arr;
}

static int m_save(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	static const char *const none[] = { NULL };
	struct json_object *arr;
	char tmp[4200];
	int rc, fd;

	if ((rc = rpc_params_check(params, none, err)))
		return rc;
	if (!g.mappings)
		return rpc_errf(err, -ENOENT, "rnbd-clientd runs without --mappings: nowhere to save");
	arr = mappings_json();
	if (!arr)
		return -ENOMEM;
	snprintf(tmp, sizeof(tmp), "%s.new", g.mappings);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	rc = fd < 0 ? -errno : 0;
	if (!rc && json_object_to_fd(fd, arr, JSON_C_TO_STRING_PRETTY |
				     JSON_C_TO_STRING_NOSLASHESCAPE))
		rc = -EIO;
	if (fd >= 0 && !rc && fsync(fd))
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (!rc && rename(tmp, g.mappings))
		rc = -errno;
	if (rc) {
		unlink(tmp);
		json_object_put(arr);
		return rpc_errf(err, rc, "saving the mappings to %s: %s", g.mappings,
				strerror(-rc));
	}
	*result = json_object_new_object();
	rc = put(*result, "mappings", json_object_new_uint64(json_object_array_length(arr))) &&
	     put(*result, "file", json_object_new_string(g.mappings)) ? 0 : -ENOMEM;
	json_object_put(arr);
	return rc;
}

static struct rpc_method methods[64];
static size_t nr_methods;

static const struct rpc_method own_methods[] = {
	{ "client.map", m_map,
	  "device: string, session: string, server: [string] (a new session), mode: rw|ro|"
	  "migration (default rw), options: object (a new session)",
	  "map a device, opening its session when it is new" },
	{ "client.unmap", m_unmap, "device: string, session: string (optional), force: bool",
	  "unmap a device (force: even with IO in flight); the last one closes its session" },
	{ "client.remap", m_remap, "device: string, session: string (optional)",
	  "open a device again on its server" },
	{ "client.resize", m_resize, "device: string, session: string (optional), bytes: integer",
	  "the size this client uses (whole blocks, at most the server's)" },
	{ "client.save", m_save, "", "write the mappings to the --mappings file" },
};

/* ---- the mappings file ---- */

static int mappings_restore(void)
{
	struct json_object *arr = json_object_from_file(g.mappings);

	if (!arr) {
		if (access(g.mappings, F_OK) && errno == ENOENT) {
			dlog(DLOG_INFO, "mappings file %s: none yet (client.save makes it)", g.mappings);
			return 0;
		}
		fprintf(stderr, "rnbd-clientd: --mappings %s: %s\n", g.mappings,
			json_util_get_last_err() ? json_util_get_last_err() : "cannot be read");
		return -EINVAL;
	}
	if (!json_object_is_type(arr, json_type_array)) {
		fprintf(stderr, "rnbd-clientd: --mappings %s: not a JSON array of mappings\n",
			g.mappings);
		json_object_put(arr);
		return -EINVAL;
	}
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *m = json_object_array_get_idx(arr, i), *r = NULL;
		struct rpc_err e = { 0 };
		int rc = m_map(NULL, m, &r, &e);

		if (rc)
			dlog(DLOG_ERR, "mappings file %s: mapping %zu: %s", g.mappings, i + 1,
			     e.msg[0] ? e.msg : strerror(-rc));
		json_object_put(r);
	}
	json_object_put(arr);
	return 0;
}

int main(int argc, char **argv)
{
	struct rpc_server *srv = NULL;
	struct metrics_http *mh = NULL;
	sigset_t set;
	int pos, rc, sig;

	rc = opts_parse(options, "rnbd-clientd", "[options]", argc, argv, &pos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (pos < argc) {
		fprintf(stderr, "rnbd-clientd: unexpected argument \"%s\" (see --help)\n", argv[pos]);
		return 2;
	}
	log_level = opts_log_level("rnbd-clientd", g.log_level ? "--log-level" : "--quiet",
				   g.log_level ? g.log_level : g.quiet ? "error" : NULL,
				   getenv("RTRS_LOG_LEVEL"), DLOG_INFO);
	if (log_level < 0)
		return 2;
	dlog_init("rnbd-clientd", log_level, g.syslog);
	rnbd_set_log_level(log_level);
	rnbd_set_log_fn(dlog_sink, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	probe_ublk();
	clt_ctl_init(&ctl, devices_fn, NULL);
	memcpy(methods, own_methods, sizeof(own_methods));
	nr_methods = sizeof(own_methods) / sizeof(own_methods[0]);
	memcpy(methods + nr_methods, clt_ctl_methods, clt_ctl_nr_methods * sizeof(methods[0]));
	nr_methods += clt_ctl_nr_methods;
	/* Restored before the socket: a file that cannot be read stops the daemon first. */
	if (g.mappings && mappings_restore())
		return 1;
	rc = rpc_server_start(g.control, "rnbd-clientd control", methods, nr_methods, &ctl, &srv);
	if (rc) {
		fprintf(stderr, "rnbd-clientd: --control %s: %s\n", g.control,
			rc == -EEXIST ? "exists and is not a socket; not replacing it" :
			rc == -EADDRINUSE ? "another program answers on this socket" : strerror(-rc));
		goto out;
	}
	if (g.metrics) {
		char why[256];

		rc = metrics_http_start(g.metrics, clt_ctl_metrics, &ctl, &mh, why, sizeof(why));
		if (rc) {
			fprintf(stderr, "rnbd-clientd: --metrics %s\n", why);
			goto out;
		}
		printf("rnbd-clientd metrics on port %u\n", metrics_http_port(mh));
	}
	printf("rnbd-clientd ready on %s\n", g.control);
	fflush(stdout);
	dlog(DLOG_INFO, "%s", ublk_note);
	while (sigwait(&set, &sig))
		;
	dlog(DLOG_INFO, "%s, stopping: every device is unmapped", strsignal(sig));
	rc = 0;
out:
	metrics_http_stop(mh);
	rpc_server_stop(srv);
	for (unsigned i = 0; i < DEVS_MAX; i++) {
		if (devs[i]) {
			ublk_dev_remove(devs[i]->ub);
			rnbd_clt_unmap(devs[i]->d, true);
			dev_drop(devs[i]);
		}
	}
	return rc ? 1 : 0;
}
