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
 *                [--runtime-dir DIR] [--on-stop handover|remove]
 *
 * A mapped device becomes a Linux block device, /dev/ublkbN, through ublk
 * (ublk.c; the userspace counterpart of /dev/rnbdX). A map that asks for
 * none ("block_device": false) maps the device without one; one that asks
 * for one (the default) where the kernel has no ublk fails, naming why. A
 * mounted or open block device is unmapped only by force. Block devices
 * outlive the daemon: each is recorded in --runtime-dir, and the next
 * daemon takes over what the last one left, however it ended (rec_write,
 * recover_scan, recover_one); a stop hands them over (handover_all) unless
 * --on-stop remove.
 *
 * --mappings FILE: a JSON array of mappings, each as client.map takes
 * them; read at start as strictly as a request (a file that cannot be
 * read or parsed stops the daemon with the file, the line and the
 * reason), mapped once the control socket is up, several at once (a
 * mapping that fails is logged and kept), written by client.save (whole,
 * through a temporary file renamed into place).
 *
 * Threads: the control socket's methods run on a thread per connection
 * (RPC_SERVER_THREADED), so a map waiting for a server that does not
 * answer holds only its own request; the mappings are restored by a few
 * threads of their own; main waits for signals. state_lock guards the
 * lists of sessions and devices and what the threads share of each; the
 * network (opening a session, a map, an unmap) and ublk are used without
 * it, the object marked meanwhile (a session opening, a device busy).
 *
 * Stopping (SIGTERM, SIGINT, SIGQUIT): new maps are refused; the block
 * devices are handed over (their sent requests answered, then left to the
 * kernel for the next daemon), or with --on-stop remove removed; every
 * other device is unmapped (each session on a thread of its own) for up to
 * STOP_GRACE_MS; then librtrs stops waiting for any server
 * (rtrs_clt_shutdown_all): what is left fails at once (IO in flight,
 * opens, maps), and is undone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <systemd/sd-daemon.h>
#include <sys/stat.h>
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
#include "util.h"

#define DEVS_MAX 256
#define STOP_GRACE_MS 2000   /* a stop waits this long for servers to answer */
#define STOP_ABORT_MS 2500   /* ... then this long for what is left to fail and end */
#define RESTORE_THREADS 16   /* the mappings file's mappings restored at once */
#define RECOVER_WAIT_MS 10000 /* for the kernel to let a dead daemon's block device go */
#define LOCK_WAIT_MS 30000   /* for the previous daemon of --runtime-dir to end */


enum on_stop { ON_STOP_HANDOVER, ON_STOP_REMOVE };
static const char *const on_stop_names[] = { "handover", "remove", NULL };

static struct {
	const char *config, *control, *mappings, *metrics, *log_level, *runtime_dir, *dev_links;
	uint64_t poll_groups, recover_timeout;
	unsigned on_stop;
	bool quiet, syslog;
} g = { .control = "/run/rnbd/client.sock", .runtime_dir = "/run/rnbd/clientd",
	.dev_links = "/dev/rnbd", .recover_timeout = 60 };

static const struct opt options[] = {
	{ "config", 'c', OPT_CONFIG, &g.config, .arg = "FILE",
	  .help = "read options from FILE first (\"name value\" per line)" },
	{ "control", 'S', OPT_STRING, &g.control, .arg = "PATH",
	  .help = "the control socket (JSON-RPC, the rnbd command)" },
	{ "mappings", 'm', OPT_STRING, &g.mappings, .arg = "FILE",
	  .help = "restore the mappings in FILE at start; client.save writes them there" },
	{ "metrics", 0, OPT_STRING, &g.metrics, .arg = "HOST:PORT",
	  .help = "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any, printed)" },
	{ "runtime-dir", 0, OPT_STRING, &g.runtime_dir, .arg = "DIR",
	  .help = "where each block device's mapping is kept while it exists, for the next "
		  "rnbd-clientd to take it over (default /run/rnbd/clientd)" },
	{ "dev-links", 0, OPT_STRING, &g.dev_links, .arg = "DIR",
	  .help = "stable names of the block devices: DIR/SESSION/DEVICE, a link to /dev/ublkbN "
		  "(default /dev/rnbd)" },
	{ "on-stop", 0, OPT_CHOICE, &g.on_stop, .choices = on_stop_names, .arg = "WHAT",
	  .help = "what a stop does with the block devices: handover (they stay, their IO "
		  "waits for the next rnbd-clientd; the default) or remove" },
	{ "recover-timeout", 0, OPT_UINT, &g.recover_timeout, 1, 86400, .arg = "SECONDS",
	  .help = "how long a block device left by a previous rnbd-clientd waits for its "
		  "session to open again before it is removed and its IO fails (default 60)" },
	{ "poll-groups", 0, OPT_UINT, &g.poll_groups, 0, RTRS_MAX_POLL_GROUPS, .arg = "N",
	  .help = "threads that serve the connections of the process, per fabric (0: one per CPU)" },
	{ "syslog", 0, OPT_FLAG, &g.syslog, .help = "log to syslog (the journal) instead of stderr" },
	{ "quiet", 0, OPT_FLAG, &g.quiet, .help = "log errors only (--log-level error)" },
	{ "log-level", 0, OPT_STRING, &g.log_level, .arg = "LEVEL",
	  .help = "error, warn, info or debug (default: RTRS_LOG_LEVEL, else info)" },
	{ 0 },
};

/* "FILE:LINE: NAME" for a value from a config file, else "--NAME" (opts_name_of). */
static const char *origin(const char *name, const char *value)
{
	static char buf[4400];

	return opts_name_of(name, value, buf, sizeof(buf));
}

/*
 * A session: its options (strings owned here) and librnbd's handle. Listed
 * (sessions[]) from the first map that names it: while that map opens it
 * (opening), other maps through it wait for the outcome. It is closed when
 * it has no device and nobody uses it (users: maps in progress, a stop).
 */
struct sess {
	char name[256];
	struct clt_cfg cfg;
	char *strs[64];               /* the option values cfg points at */
	unsigned nr_strs;
	struct json_object *spec;     /* servers and options, as mapped (for client.save) */
	struct rnbd_clt_sess *rnbd;
	/* state_lock */
	unsigned devs;
	unsigned users;
	bool listed;                  /* in sessions[] */
	bool opening;                 /* its first map opens it */
	int failed;                   /* the open failed: the error, for those who waited */
	char fail_msg[512];
};

struct dev {
	struct sess *s;
	char name[256];
	enum rnbd_clt_mode mode;
	bool want_bdev;               /* the map asked for a block device */
	struct rnbd_clt_dev *d;       /* written under state_lock; NULL while an unmap runs */
	/* state_lock */
	struct ublk_dev *ub;          /* its block device, where ublk is */
	int ub_id;                    /* N of /dev/ublkbN (its record in --runtime-dir) */
	char bdev[32];                /* "/dev/ublkbN", or "" */
	char note[200];               /* why there is none */
	bool busy;                    /* a map's last steps, an unmap or a remap run on it */
	bool unmapping;               /* busy with an unmap (listed as "unmapping") */
	bool handed;                  /* its block device is handed over: a stop leaves it */
	bool handing;                 /* stop_sess_thread's handover of it runs (state_lock) */
	uint64_t serial;              /* this mapping's own number: ub_id comes round again */
};

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t state_cond = PTHREAD_COND_INITIALIZER; /* any change below */
static struct sess *sessions[CLT_CTL_SESS_MAX];
static struct dev *devs[DEVS_MAX];
static unsigned ndevs;               /* devices in devs[] */
static unsigned maps_pending;        /* maps in progress: devices that may come */
static unsigned workers;             /* restore and stop threads running */
static bool stopping;
static pthread_mutex_t save_lock = PTHREAD_MUTEX_INITIALIZER; /* one client.save at a time */
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

/* ---- stable names: --dev-links DIR/SESSION/DEVICE -> /dev/ublkbN ---- */

/*
 * The link of device dname of session sname, in buf: false when a name
 * cannot be a path below DIR (empty, ".", "..", a "/" in the session's).
 * Device names may hold "/" (a path below the server's search path):
 * their folders are made below the session's.
 */
static bool link_path(const char *sname, const char *dname, char *buf, size_t len)
{
	char norm[256];
	int n;

	if (!sname[0] || strchr(sname, '/') || !strcmp(sname, ".") || !strcmp(sname, "..") ||
	    rnbd_dev_name_check(dname, NULL))
		return false;
	snprintf(norm, sizeof(norm), "%s", dname);
	rnbd_dev_name_normalize(norm);
	n = snprintf(buf, len, "%s/%s/%s", g.dev_links, sname, norm);
	return n > 0 && (size_t)n < len;
}

/* DIR/SESSION/DEVICE -> /dev/ublkbN, made or replaced at once (a new link renamed over it). */
static void link_make(const char *sname, const char *dname, int id)
{
	char path[4096], tmp[4200], target[32];

	if (!link_path(sname, dname, path, sizeof(path))) {
		dlog(DLOG_WARN, "device %s of session %s: no link below %s for these names",
		     dname, sname, g.dev_links);
		return;
	}
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(path, 0755) && errno != EEXIST) {
			dlog(DLOG_WARN, "device %s of session %s: making %s: %s", dname, sname, path,
			     strerror(errno));
			return;
		}
		*p = '/';
	}
	snprintf(target, sizeof(target), "/dev/ublkb%d", id);
	snprintf(tmp, sizeof(tmp), "%s.%d.new", path, (int)getpid());
	unlink(tmp);
	if (symlink(target, tmp) || rename(tmp, path)) {
		dlog(DLOG_WARN, "device %s of session %s: the link %s -> %s: %s", dname, sname,
		     path, target, strerror(errno));
		unlink(tmp);
	}
}

/* The link, if it still leads to /dev/ublkbN; then its folders while empty, up to DIR. */
static void link_drop(const char *sname, const char *dname, int id)
{
	char path[4096], target[64], want[32];
	ssize_t n;

	if (!link_path(sname, dname, path, sizeof(path)))
		return;
	snprintf(want, sizeof(want), "/dev/ublkb%d", id);
	n = readlink(path, target, sizeof(target) - 1);
	if (n < 0)
		return;
	target[n] = 0;
	if (strcmp(target, want) || unlink(path))
		return;
	for (char *slash; (slash = strrchr(path, '/')) && (size_t)(slash - path) >
	     strlen(g.dev_links);) {
		*slash = 0;
		if (rmdir(path))
			break;
	}
}

/* ---- sessions and devices ---- */

/*
 * A deep copy of v, or NULL. json-c counts references without atomics:
 * what threads share (a session's spec, read under state_lock) must share
 * no object with what one of them frees unlocked (a request's params, an
 * answer).
 */
static struct json_object *copy(struct json_object *v)
{
	struct json_object *c = NULL;

	return v && !json_object_deep_copy(v, &c, NULL) ? c : NULL;
}

/* An array's length; 0 for none. */
static size_t arr_len(struct json_object *a)
{
	return json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
}

/*
 * Whether device names a and b name one device: "/a//b" and "a/b" do, as
 * for a server and rnbd_clt_map (rnbd_dev_name_normalize).
 */
static bool dev_name_same(const char *a, const char *b)
{
	char na[256], nb[256];

	snprintf(na, sizeof(na), "%s", a ? a : "");
	snprintf(nb, sizeof(nb), "%s", b ? b : "");
	rnbd_dev_name_normalize(na);
	rnbd_dev_name_normalize(nb);
	return !strcmp(na, nb);
}

/* Whether mapping m (client.map's parameters, a record's or the file's) names device name of session sname. */
static bool mapping_names(struct json_object *m, const char *sname, const char *name)
{
	struct json_object *d, *s;

	return json_object_object_get_ex(m, "device", &d) &&
	       json_object_object_get_ex(m, "session", &s) &&
	       !strcmp(json_object_get_string(s) ? json_object_get_string(s) : "", sname) &&
	       dev_name_same(json_object_get_string(d), name);
}

/* Adds v to o as key (v's reference is o's, or dropped): false on failure. */
static bool put(struct json_object *o, const char *key, struct json_object *v)
{
	if (!o || !v || json_object_object_add(o, key, v)) {
		json_object_put(v);
		return false;
	}
	return true;
}

/* The listed session named name (state_lock held). */
static struct sess *sess_find(const char *name)
{
	for (unsigned i = 0; i < CLT_CTL_SESS_MAX; i++)
		if (sessions[i] && !strcmp(sessions[i]->name, name))
			return sessions[i];
	return NULL;
}

/* Lists s (state_lock held): false when there is no room. */
static bool sess_list(struct sess *s)
{
	for (unsigned i = 0; i < CLT_CTL_SESS_MAX; i++) {
		if (!sessions[i]) {
			sessions[i] = s;
			s->listed = true;
			return true;
		}
	}
	return false;
}

static void sess_unlist(struct sess *s)
{
	for (unsigned i = 0; i < CLT_CTL_SESS_MAX; i++)
		if (sessions[i] == s)
			sessions[i] = NULL;
	s->listed = false;
}

/* Closes s (no lock held; unlisted, nobody uses it): off the control plane, then closed. */
static void sess_destroy(struct sess *s)
{
	if (!s)
		return;
	if (s->rnbd) {
		clt_ctl_del(&ctl, s->rnbd);
		rnbd_clt_sess_close(s->rnbd);
	}
	for (unsigned i = 0; i < s->nr_strs; i++)
		free(s->strs[i]);
	json_object_put(s->spec);
	free(s);
}

/*
 * A user of s is done (state_lock held). True when s has no device and
 * no user left: it is unlisted, and the caller closes it (sess_destroy)
 * once the lock is dropped.
 */
static bool sess_release(struct sess *s)
{
	if (--s->users || s->devs)
		return false;
	if (s->listed)
		sess_unlist(s);
	pthread_cond_broadcast(&state_cond);
	return true;
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
 * them), checked, not opened yet (sess_connect). NULL with err set.
 * need_server false: "server" may be left out (what a map through an open
 * session gives, parsed to compare: spec_same).
 */
static struct sess *sess_new(const char *name, struct json_object *params, bool need_server,
			     struct rpc_err *err)
{
	struct json_object *servers = NULL, *opts = NULL;
	struct sess *s = calloc(1, sizeof(*s));
	int rc;

	if (!s) {
		rpc_errf(err, -ENOMEM, "out of memory");
		return NULL;
	}
	snprintf(s->name, sizeof(s->name), "%s", name);
	clt_cfg_init(&s->cfg, CLT_MAX_PATHS);
	rc = rpc_param_strs(params, "server", need_server, &servers, err);
	if (!rc && servers && !json_object_array_length(servers))
		rc = rpc_errf(err, RPC_INVALID_PARAMS, "server: at least one path is needed");
	if (!rc && json_object_object_get_ex(params, "options", &opts) &&
	    !json_object_is_type(opts, json_type_object))
		rc = rpc_errf(err, RPC_INVALID_PARAMS, "options must be an object");
	if (!rc)
		rc = sess_opt(s, CLT_OPT_SESSION, "session", json_object_object_get(params, "session"),
			      err);
	for (size_t i = 0; !rc && i < arr_len(servers); i++)
		rc = sess_opt(s, CLT_OPT_SERVER, "server", json_object_array_get_idx(servers, i), err);
	if (!rc && opts) {
		json_object_object_foreach(opts, key, val) {
			int id = clt_opt_by_key(key);

			if (id < 0 || id == CLT_OPT_SERVER || id == CLT_OPT_SESSION ||
			    id == CLT_OPT_LOG_LEVEL) {
				rc = rpc_errf(err, RPC_INVALID_PARAMS, "unknown option %.*s",
					      rpc_utf8_prefix(key, 64), key);
				break;
			}
			rc = sess_opt(s, (enum clt_opt_id)id, key, val, err);
			if (rc)
				break;
		}
	}
	if (!rc) {
		clt_cfg_finish(&s->cfg); /* the front ends' defaults, as everywhere */
		s->cfg.opts.poll_groups = (unsigned)g.poll_groups; /* the daemon's, for every session */
		s->spec = json_object_new_object();
		if (!s->spec ||
		    (servers && !put(s->spec, "server", copy(servers))) ||
		    (opts && !put(s->spec, "options", copy(opts))))
			rc = rpc_errf(err, -ENOMEM, "session %s: out of memory", name);
	}
	if (rc) {
		sess_destroy(s);
		return NULL;
	}
	return s;
}

/* Opens s (no lock held) and puts it on the control plane: 0, or err set. */
static int sess_connect(struct sess *s, struct rpc_err *err)
{
	struct json_object *servers = NULL;
	size_t n;
	int rc = rnbd_clt_sess_open(&s->cfg.opts, &s->rnbd);

	if (rc)
		return rpc_errf(err, rc, "session %s: %s", s->name, rc == -EPERM ?
				"the server has a session of this name open (another client)" :
				rc == -ESHUTDOWN ? "rnbd-clientd is stopping" :
				rtrs_last_error()[0] ? rtrs_last_error() : strerror(-rc));
	rc = clt_ctl_add(&ctl, s->name, s->rnbd);
	if (rc) {
		rnbd_clt_sess_close(s->rnbd);
		s->rnbd = NULL;
		return rpc_errf(err, rc, "session %s: %s", s->name, strerror(-rc));
	}
	json_object_object_get_ex(s->spec, "server", &servers);
	n = json_object_array_length(servers);
	dlog(DLOG_INFO, "session %s: open, %zu path%s", s->name, n, n == 1 ? "" : "s");
	return 0;
}

/* The device named by params ("session" optional when the name is unique); state_lock held. */
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

		if (d && dev_name_same(d->name, name) && (!sname || !strcmp(d->s->name, sname))) {
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


/* d as client.devices lists it (state_lock held). */
static struct json_object *dev_json(struct dev *d)
{
	struct rnbd_clt_dev_info in = { .size = sizeof(in) };
	struct json_object *o = json_object_new_object();

	/* An unmap under way holds the handle (dev_unmap): the device is going. */
	if (d->d)
		rnbd_clt_dev_info(d->d, &in);
	else
		in.state = "unmapping";
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
	    (d->bdev[0] || put(o, "note", json_object_new_string(d->note)))) {
		char link[4096];

		if (!d->bdev[0] || !link_path(d->s->name, d->name, link, sizeof(link)) ||
		    put(o, "link", json_object_new_string(link)))
			return o;
	}
	json_object_put(o);
	return NULL;
}

static int devices_fn(void *priv, struct json_object *arr)
{
	int rc = 0;

	pthread_mutex_lock(&state_lock);
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
	pthread_mutex_unlock(&state_lock);
	return rc;
}

/*
 * params' server and options, where given, are the session's (state_lock
 * held): compared as parsed (req: params through sess_new; NULL when they
 * give neither), each side with the front ends' defaults, so that a port
 * or a default written out or left out, 7 or "7", makes no difference. A
 * restored session was parsed from its saved mapping, which writes them
 * all out: the map that made it matches it as it did before the restart.
 */
static bool spec_same(struct sess *s, struct json_object *params, struct sess *req)
{
	if (!req)
		return true;
	if (json_object_object_get_ex(params, "server", NULL) &&
	    !clt_cfg_same_paths(&s->cfg, &req->cfg))
		return false;
	return !json_object_object_get_ex(params, "options", NULL) ||
	       clt_cfg_same_opts(&s->cfg, &req->cfg);
}

static struct json_object *mapping_of(struct dev *d);
static void rec_write(int id, uint64_t serial);
static void rec_write_locked(int id, struct json_object *mapping, int prev_pid);
static void rec_drop(int id);
static pthread_mutex_t rec_lock;

/*
 * client.map, and a restore: recover_id >= 0 takes over /dev/ublkb<recover_id>,
 * left by a daemon that ended, as the device's block device instead of
 * making one (*recovered: its recovery started, ublk_dev_recover's
 * *touched: the device is this daemon's, or stopped).
 */
/*
 * What a mapping (client.map's parameters, an entry of the mappings file)
 * says, checked without the network: the device, session and mode it
 * names; 0 or err set.
 */
static int map_check(struct json_object *params, const char **name, const char **sname,
		     int *mode, bool *want_bdev, struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", "server", "mode", "options",
					     "block_device", NULL };
	const char *mname = "rw", *why = NULL;
	int rc;

	*want_bdev = true;
	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "device", true, name, err)) ||
	    (rc = rpc_param_str(params, "session", true, sname, err)) ||
	    (rc = rpc_param_str(params, "mode", false, &mname, err)) ||
	    (rc = rpc_param_bool(params, "block_device", false, want_bdev, err)))
		return rc;
	*mode = mode_of(mname);
	if (*mode < 0)
		return rpc_errf(err, RPC_INVALID_PARAMS, "mode %s: expected rw, ro or migration",
				mname);
	/* Before any session is opened for it. */
	if (rnbd_dev_name_check(*name, &why))
		return rpc_errf(err, -EINVAL, "device %s: %s", *name, why);
	return 0;
}

/* Whether a stop has begun (ublk_dev_recover stops waiting then). */
static bool clientd_stopping(void)
{
	bool st;

	pthread_mutex_lock(&state_lock);
	st = stopping;
	pthread_mutex_unlock(&state_lock);
	return st;
}

/*
 * ublk_dev_add's before_start: a new block device's record, written before
 * the kernel starts it (a daemon killed between START_DEV and the record
 * would leave a device no record names, its IO held for ever). The map
 * writes it again once the device is listed.
 */
struct rec_early {
	struct dev *d;
	int id; /* the device's number once recorded, else -1 */
};

/*
 * The numbers of devices recorded and not listed yet (rec_lock): rec_drop
 * leaves their records, as it does a listed device's (an unmap of an
 * earlier device of the same number is not theirs to remove).
 */
static int early_ids[DEVS_MAX];
static unsigned n_early;

static bool early_has(int id)
{
	for (unsigned i = 0; i < n_early; i++)
		if (early_ids[i] == id)
			return true;
	return false;
}

/* id listed now, or deleted: off the early set. */
static void early_done(int id)
{
	pthread_mutex_lock(&rec_lock);
	for (unsigned i = 0; i < n_early; i++) {
		if (early_ids[i] == id) {
			early_ids[i] = early_ids[--n_early];
			break;
		}
	}
	pthread_mutex_unlock(&rec_lock);
}

static void rec_before_start(void *priv, int id)
{
	struct rec_early *e = priv;
	struct json_object *mapping;

	pthread_mutex_lock(&rec_lock);
	pthread_mutex_lock(&state_lock);
	mapping = mapping_of(e->d);
	pthread_mutex_unlock(&state_lock);
	rec_write_locked(id, mapping, 0); /* NULL (no memory): said there */
	if (n_early < DEVS_MAX) /* a map each: maps_pending keeps them below */
		early_ids[n_early++] = id;
	pthread_mutex_unlock(&rec_lock);
	e->id = id;
}

static bool taking_over(const char *sname, const char *name, int *id);
static void unrestored_forget(const char *sname, const char *name);

static int map_do(struct json_object *params, int recover_id, int prev_pid, bool *recovered,
		  struct json_object **result, struct rpc_err *err)
{
	const char *name, *sname;
	char nname[256];
	struct sess *s, *fresh = NULL, *req = NULL;
	struct dev *d = NULL;
	struct json_object *rec = NULL;
	bool want_bdev, undo = false, inserted = false, close_s, hold;
	int rc, mode, early_id = -1, taken_id = -1;

	if ((rc = map_check(params, &name, &sname, &mode, &want_bdev, err)))
		return rc;
	/* Kept as the server and rnbd_clt_map take it: one device, one name here too. */
	snprintf(nname, sizeof(nname), "%s", name);
	rnbd_dev_name_normalize(nname);
	name = nname;
	if (want_bdev && !have_ublk)
		return rpc_errf(err, -ENODEV, "device %s of session %s: %s; block_device false "
				"maps it without one", name, sname, ublk_note);
	/* The servers and options it gives, parsed unlocked (no network), for spec_same. */
	if (json_object_object_get_ex(params, "server", NULL) ||
	    json_object_object_get_ex(params, "options", NULL)) {
		req = sess_new(sname, params, false, err);
		if (!req)
			return err->code;
	}
	pthread_mutex_lock(&state_lock);
	s = sess_find(sname);
	if (!s && !stopping && ndevs + maps_pending < DEVS_MAX) {
		/* A new one: checked unlocked (no network), then listed unless another came. */
		pthread_mutex_unlock(&state_lock);
		fresh = sess_new(sname, params, true, err);
		if (!fresh) {
			sess_destroy(req);
			return err->code;
		}
		pthread_mutex_lock(&state_lock);
		s = sess_find(sname);
	}
	if (stopping)
		rc = rpc_errf(err, -ESHUTDOWN, "device %s of session %s: rnbd-clientd is stopping",
			      name, sname);
	else if (recover_id < 0 && taking_over(sname, name, &taken_id))
		/*
		 * Its block device outlived the last daemon and is being taken
		 * over, its IO held: a second one for the same device would
		 * make the takeover fail (mapped already) and its IO with it.
		 */
		rc = rpc_errf(err, -EBUSY, "device %s of session %s: /dev/ublkb%d, left by the "
			      "previous rnbd-clientd, is being taken over; it is mapped when that "
			      "is done", name, sname, taken_id);
	else if (s && recover_id >= 0 && req && json_object_object_get_ex(params, "server", NULL) &&
		 !clt_cfg_share_path(&s->cfg, &req->cfg))
		/*
		 * Its record names servers the session, opened meanwhile for
		 * another mapping, has none of: the device's data is elsewhere.
		 */
		rc = rpc_errf(err, -EEXIST, "device %s of session %s: its record names servers "
			      "the session, open already, has none of: not taken over through it",
			      name, sname);
	else if (ndevs + maps_pending >= DEVS_MAX)
		rc = rpc_errf(err, -ENOSPC, "no room for another device (at most %u)", DEVS_MAX);
	else if (s && recover_id < 0 && !spec_same(s, params, req))
		rc = rpc_errf(err, -EEXIST, "session %s is open already with other servers or "
			      "options: map through it without them (client.path.add adds paths)",
			      sname);
	else if (!s && !sess_list(fresh))
		rc = rpc_errf(err, -ENOSPC, "no room for another session (at most %u)",
			      CLT_CTL_SESS_MAX);
	if (rc) {
		pthread_mutex_unlock(&state_lock);
		sess_destroy(fresh);
		sess_destroy(req);
		return rc;
	}
	if (s && recover_id >= 0 && !spec_same(s, params, req))
		/*
		 * A block device taken over joins its session, which shares a
		 * server address with its record (above): a record written
		 * before a path was added or a parameter changed says what the
		 * session was then.
		 */
		dlog(DLOG_INFO, "device %s of session %s: its record names other paths or "
		     "options than the session has now; it is taken over through the session",
		     name, sname);
	/* Destroyed under state_lock: never opened, so no network and no clt_ctl. */
	sess_destroy(req);
	if (s) {
		sess_destroy(fresh); /* another request listed it meanwhile (not opened: no network) */
		fresh = NULL;
	} else {
		s = fresh;
		s->opening = true;
	}
	s->users++;
	maps_pending++;
	if (fresh) {
		pthread_mutex_unlock(&state_lock);
		rc = sess_connect(s, err);
		pthread_mutex_lock(&state_lock);
		s->opening = false;
		if (rc) {
			/* Those waiting get this error; later maps open it again. */
			s->failed = rc;
			snprintf(s->fail_msg, sizeof(s->fail_msg), "%s", err->msg);
			sess_unlist(s);
		}
		pthread_cond_broadcast(&state_cond);
	} else {
		while (s->opening)
			pthread_cond_wait(&state_cond, &state_lock);
		if (s->failed)
			rc = rpc_errf(err, s->failed, "%s", s->fail_msg);
	}
	pthread_mutex_unlock(&state_lock);

	if (!rc) {
		static atomic_uint_fast64_t serials;

		d = calloc(1, sizeof(*d));
		if (d)
			d->serial = atomic_fetch_add(&serials, 1) + 1;
		rc = d ? 0 : rpc_errf(err, -ENOMEM, "out of memory");
	}
	if (!rc) {
		d->s = s;
		d->mode = (enum rnbd_clt_mode)mode;
		d->want_bdev = want_bdev;
		snprintf(d->name, sizeof(d->name), "%s", name);
		rc = rnbd_clt_map(s->rnbd, name, d->mode, &d->d);
		if (rc) {
			rpc_errf(err, rc, "device %s of session %s: %s", name, sname,
				 rc == -EPERM ? "the server refused the mode (another client writes it)" :
				 rc == -EEXIST ? "mapped already" :
				 rc == -ESHUTDOWN || rc == -ECONNABORTED ?
				 "rnbd-clientd is stopping" :
				 rc == -EINVAL ? "the server refused the name (Invalid argument: below "
				 "its search path there is no such regular file or block device, or the "
				 "name leads out of it)" : strerror(-rc));
			/*
			 * A takeover's -EBUSY means the kernel's: another daemon
			 * serves the device (recover_one leaves it be). The
			 * server's (its last writer still closing) is a retry.
			 */
			if (recover_id >= 0 && rc == -EBUSY)
				rc = err->code = -EAGAIN;
			free(d);
			d = NULL;
		}
	}
	if (!rc && want_bdev) {
		char why[300];
		int id = recover_id;

		if (recover_id >= 0) {
			/* Before the kernel names this daemon (END_USER_RECOVERY): either pid goes. */
			pthread_mutex_lock(&rec_lock);
			rec_write_locked(recover_id, json_object_get(params), prev_pid);
			pthread_mutex_unlock(&rec_lock);
			rc = ublk_dev_recover(s->rnbd, d->d, name, recover_id, RECOVER_WAIT_MS,
					      clientd_stopping, recovered, &d->ub, why, sizeof(why));
		} else {
			struct rec_early early = { .d = d, .id = -1 };

			rc = ublk_dev_add(s->rnbd, d->d, name, rec_before_start, &early, &d->ub,
					  &id, why, sizeof(why));
			early_id = early.id;
			if (rc && early_id >= 0) {
				early_done(early_id);
				rec_drop(early_id); /* the device was deleted */
				early_id = -1;
			}
		}
		if (rc) {
			rpc_errf(err, rc, "device %s of session %s: mapped, but no block device: %s",
				 name, sname, why);
			rnbd_clt_unmap(d->d, true);
			free(d);
			d = NULL;
		} else {
			d->ub_id = id;
			snprintf(d->bdev, sizeof(d->bdev), "/dev/ublkb%d", id);
		}
	} else if (!rc) {
		snprintf(d->note, sizeof(d->note), "no block device: none was asked for "
			 "(block_device false)");
	}

	pthread_mutex_lock(&state_lock);
	if (!rc && stopping) {
		/* Mapped while the stop unmaps everything: undone here. */
		rc = rpc_errf(err, -ESHUTDOWN, "device %s of session %s: rnbd-clientd is stopping",
			      name, sname);
		undo = true;
	}
	/*
	 * A block device handed over below is a map in progress until it is:
	 * the stop waits for it (idle_within) before the sessions' requests
	 * fail, which would fail the IO the kernel held for the next daemon.
	 */
	hold = undo && d && d->ub && g.on_stop == ON_STOP_HANDOVER;
	if (!hold)
		maps_pending--;
	if (!rc) {
		/*
		 * Busy until its record and link are made below, unlocked: an
		 * unmap meanwhile would free it under us, and leave a record
		 * and a link behind for a device gone.
		 */
		d->busy = true;
		inserted = true;
		for (unsigned i = 0; i < DEVS_MAX; i++) {
			if (!devs[i]) {
				devs[i] = d;
				break;
			}
		}
		ndevs++;
		s->devs++;
		*result = dev_json(d);
		/* Mapped all the same (the list shows it); a takeover wants no answer. */
		if (!*result && recover_id < 0)
			rc = -ENOMEM;
	}
	if (undo && d && d->ub)
		rec = mapping_of(d); /* for the handover below; else rec_write takes it */
	close_s = sess_release(s);
	pthread_cond_broadcast(&state_cond);
	pthread_mutex_unlock(&state_lock);
	if (early_id >= 0)
		early_done(early_id); /* listed (rec_drop sees it), or undone below */
	if (undo && d->ub && g.on_stop == ON_STOP_HANDOVER) {
		/* Made or taken over as the daemon stops: it stays, like the others. */
		ublk_dev_handover(d->ub, STOP_GRACE_MS);
		pthread_mutex_lock(&rec_lock);
		rec_write_locked(d->ub_id, rec, 0);
		pthread_mutex_unlock(&rec_lock);
		rec = NULL;
		close_s = false; /* its session ends with the process */
		pthread_mutex_lock(&state_lock);
		maps_pending--;
		pthread_cond_broadcast(&state_cond);
		pthread_mutex_unlock(&state_lock);
	} else if (undo) {
		/* The device first: a kill during its stop leaves it with its record. */
		ublk_dev_remove(d->ub);
		if (d->ub)
			rec_drop(d->ub_id);
		rnbd_clt_unmap(d->d, true);
		free(d);
	} else if (d && d->ub) {
		/* The next rnbd-clientd takes the block device over from this. */
		rec_write(d->ub_id, d->serial);
		link_make(sname, name, d->ub_id);
	}
	json_object_put(rec);
	if (!undo && d && (!rc || rc == -ENOMEM)) {
		dlog(DLOG_INFO, "device %s of session %s: %s %s; %s", name, sname,
		     recover_id >= 0 ? "mapped again" : "mapped", mode_names[mode],
		     d->bdev[0] ? d->bdev : d->note);
		if (recover_id >= 0)
			dlog(DLOG_INFO, "ublk: %s taken over: its IO goes on", d->bdev);
	}
	if (inserted) {
		pthread_mutex_lock(&state_lock);
		d->busy = false;
		pthread_cond_broadcast(&state_cond);
		pthread_mutex_unlock(&state_lock);
	}
	if (close_s) {
		if (s->rnbd)
			dlog(DLOG_INFO, "session %s: no device mapped through it: closing it", sname);
		sess_destroy(s);
	}
	return rc;
}

static int m_map(void *priv, struct json_object *params, struct json_object **result,
		 struct rpc_err *err)
{
	bool recovered = false;

	(void)priv;
	return map_do(params, -1, 0, &recovered, result, err);
}

/*
 * Unmaps d, marked busy by the caller (no lock held): its block device
 * first (its IO goes to d), then the mapping. 0, or rnbd_clt_unmap's
 * error with d as it was (less its block device).
 */
static int dev_unmap(struct dev *d, bool force)
{
	struct rnbd_clt_dev *h;
	struct ublk_dev *ub;
	int rc;

	pthread_mutex_lock(&state_lock);
	ub = d->ub;
	pthread_mutex_unlock(&state_lock);
	if (ub) {
		ublk_dev_remove(ub);
		pthread_mutex_lock(&state_lock);
		d->ub = NULL;
		d->bdev[0] = 0;
		snprintf(d->note, sizeof(d->note), "its block device was removed by an unmap "
			 "that failed");
		pthread_mutex_unlock(&state_lock);
		rec_drop(d->ub_id); /* after it left the list: no rec_write brings it back */
		link_drop(d->s->name, d->name, d->ub_id);
		force = true; /* with the block device gone, nothing sends IO any more */
	}
	/*
	 * The handle leaves the list's reach first: client.devices and the
	 * metrics read it under state_lock, and a successful unmap frees it.
	 */
	pthread_mutex_lock(&state_lock);
	h = d->d;
	d->d = NULL;
	pthread_mutex_unlock(&state_lock);
	rc = rnbd_clt_unmap(h, force);
	if (rc) {
		pthread_mutex_lock(&state_lock);
		d->d = h; /* still mapped */
		pthread_mutex_unlock(&state_lock);
	}
	return rc;
}

/*
 * d is unmapped (state_lock held): off the list. True when its session
 * has nothing left: unlisted, and the caller closes it once the lock is
 * dropped (sess_destroy). d is the caller's to free.
 */
static bool dev_drop(struct dev *d)
{
	struct sess *s = d->s;

	for (unsigned i = 0; i < DEVS_MAX; i++)
		if (devs[i] == d)
			devs[i] = NULL;
	ndevs--;
	pthread_cond_broadcast(&state_cond);
	if (--s->devs || s->users)
		return false;
	sess_unlist(s);
	return true;
}

/*
 * A process other than this one with the block device bdev open: its pid,
 * or 0. An exclusive open (a mount, md, LVM) is seen by O_EXCL; an
 * ordinary one (qemu, dd, a database) only here, among /proc's open files.
 */
static pid_t bdev_opener(const char *bdev)
{
	struct stat want;
	DIR *proc;
	struct dirent *pe;
	pid_t found = 0, self = getpid();

	if (stat(bdev, &want) || !S_ISBLK(want.st_mode) || !(proc = opendir("/proc")))
		return 0;
	while (!found && (pe = readdir(proc))) {
		char path[64];
		char *end;
		long pid = strtol(pe->d_name, &end, 10);
		DIR *fds;
		struct dirent *fe;

		if (*end || pid <= 0 || pid == self)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/fd", pid);
		fds = opendir(path);
		if (!fds)
			continue; /* gone, or not ours to see */
		while (!found && (fe = readdir(fds))) {
			struct stat st;

			if (fe->d_name[0] == '.')
				continue;
			if (!fstatat(dirfd(fds), fe->d_name, &st, 0) && S_ISBLK(st.st_mode) &&
			    st.st_rdev == want.st_rdev)
				found = (pid_t)pid;
		}
		closedir(fds);
	}
	closedir(proc);
	return found;
}

static int m_unmap(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", "force", NULL };
	char dname[256], sname[256], bdev[32];
	bool force = false, close_s;
	struct dev *d;
	struct sess *s;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_bool(params, "force", false, &force, err)))
		return rc;
	pthread_mutex_lock(&state_lock);
	d = dev_param(params, err);
	if (d && stopping)
		rc = rpc_errf(err, -ESHUTDOWN, "device %s of session %s: rnbd-clientd is stopping "
			      "(it unmaps every device)", d->name, d->s->name);
	else if (d && d->busy)
		rc = rpc_errf(err, -EBUSY, "device %s of session %s: another request unmaps or "
			      "remaps it now", d->name, d->s->name);
	else if (!d)
		rc = err->code;
	if (!rc) {
		d->busy = true;
		d->unmapping = true;
		snprintf(dname, sizeof(dname), "%s", d->name);
		snprintf(sname, sizeof(sname), "%s", d->s->name);
		snprintf(bdev, sizeof(bdev), "%s", d->ub ? d->bdev : "");
	}
	pthread_mutex_unlock(&state_lock);
	if (rc)
		return rc;
	/* A block device in use (mounted, or open by someone) goes only by force. */
	if (bdev[0] && !force) {
		int fd = open(bdev, O_RDONLY | O_EXCL | O_CLOEXEC);

		pid_t pid = 0;

		if (fd < 0 && errno == EBUSY)
			rc = rpc_errf(err, -EBUSY, "device %s of session %s: %s is in use "
				      "(mounted, or held exclusively; force unmaps anyway)", dname,
				      sname, bdev);
		if (fd >= 0)
			close(fd);
		/* A probe's open (udev's blkid after a map) ends soon: looked at a few times. */
		for (int t = 0; !rc && (pid = bdev_opener(bdev)) && t < 5; t++)
			usleep(200 * 1000);
		if (!rc && pid)
			rc = rpc_errf(err, -EBUSY, "device %s of session %s: %s is open in process "
				      "%ld (force unmaps anyway)", dname, sname, bdev, (long)pid);
	}
	if (!rc) {
		rc = dev_unmap(d, force);
		if (rc)
			rpc_errf(err, rc, "device %s of session %s: %s", dname, sname,
				 rc == -EBUSY ? "IO in flight (force unmaps anyway)" : strerror(-rc));
	}
	pthread_mutex_lock(&state_lock);
	d->busy = false;
	d->unmapping = false;
	s = d->s;
	if (!rc)
		unrestored_forget(sname, dname);
	close_s = !rc && dev_drop(d);
	pthread_cond_broadcast(&state_cond);
	pthread_mutex_unlock(&state_lock);
	if (rc)
		return rc;
	free(d);
	dlog(DLOG_INFO, "device %s of session %s: unmapped%s", dname, sname,
	     force ? " (force)" : "");
	if (close_s) {
		dlog(DLOG_INFO, "session %s: its last device is unmapped; closing it", sname);
		sess_destroy(s);
	}
	*result = json_object_new_object();
	return put(*result, "device", json_object_new_string(dname)) ? 0 : -ENOMEM;
}

static int m_remap(void *priv, struct json_object *params, struct json_object **result,
		   struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", NULL };
	struct dev *d;
	int rc;

	if ((rc = rpc_params_check(params, names, err)))
		return rc;
	pthread_mutex_lock(&state_lock);
	d = dev_param(params, err);
	if (!d)
		rc = err->code;
	else if (stopping)
		rc = rpc_errf(err, -ESHUTDOWN, "device %s of session %s: rnbd-clientd is stopping",
			      d->name, d->s->name);
	else if (d->busy)
		rc = rpc_errf(err, -EBUSY, "device %s of session %s: another request unmaps or "
			      "remaps it now", d->name, d->s->name);
	else
		d->busy = true;
	pthread_mutex_unlock(&state_lock);
	if (rc)
		return rc;
	rc = rnbd_clt_remap(d->d);
	pthread_mutex_lock(&state_lock);
	d->busy = false;
	pthread_cond_broadcast(&state_cond);
	if (rc)
		rpc_errf(err, rc, "device %s of session %s: %s", d->name, d->s->name,
			 rc == -EALREADY ? "it is mapped and open: nothing to remap" :
			 strerror(-rc));
	else if (!(*result = dev_json(d)))
		rc = -ENOMEM;
	pthread_mutex_unlock(&state_lock);
	return rc;
}

static int m_resize(void *priv, struct json_object *params, struct json_object **result,
		    struct rpc_err *err)
{
	static const char *const names[] = { "device", "session", "bytes", NULL };
	struct rnbd_clt_dev_info old = { .size = sizeof(old) };
	uint64_t bytes;
	struct dev *d;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_u64(params, "bytes", true, 1, UINT64_MAX, &bytes, err)))
		return rc;
	/* No server call: done under the lock. */
	pthread_mutex_lock(&state_lock);
	d = dev_param(params, err);
	if (!d)
		rc = err->code;
	else if (d->busy)
		rc = rpc_errf(err, -EBUSY, "device %s of session %s: another request unmaps or "
			      "remaps it now", d->name, d->s->name);
	else if (d->ub && !ublk_dev_can_resize(d->ub))
		rc = rpc_errf(err, -EOPNOTSUPP, "device %s of session %s: %s keeps its size: this "
			      "kernel's ublk cannot change a live device's size (UBLK_F_UPDATE_SIZE, "
			      "Linux 6.16); unmap and map it again", d->name, d->s->name, d->bdev);
	else if ((rc = rnbd_clt_dev_info(d->d, &old)))
		rpc_errf(err, rc, "device %s of session %s: %s", d->name, d->s->name, strerror(-rc));
	else if (!bytes || (old.logical_block_size && bytes % old.logical_block_size))
		rc = rpc_errf(err, -EINVAL, "device %s of session %s: the size must be whole "
			      "blocks, at least one, at most the server's", d->name, d->s->name);
	else if (bytes < old.bytes && d->ub && (rc = ublk_dev_resize(d->ub, bytes)))
		/*
		 * Shrinking: the block device first, so that no IO the kernel
		 * sends meanwhile falls between the two sizes and fails.
		 */
		rpc_errf(err, rc, "device %s of session %s: %s: ublk UPDATE_SIZE: %s", d->name,
			 d->s->name, d->bdev, strerror(-rc));
	else if ((rc = rnbd_clt_resize(d->d, bytes))) {
		rpc_errf(err, rc, "device %s of session %s: %s", d->name, d->s->name,
			 rc == -EINVAL ? "the size must be whole blocks, at least one, at most "
			 "the server's" : strerror(-rc));
		if (bytes < old.bytes && d->ub)
			ublk_dev_resize(d->ub, old.bytes); /* back as it was */
	} else if (bytes > old.bytes && d->ub && (rc = ublk_dev_resize(d->ub, bytes))) {
		/* Growing: the mapping first, then the block device. */
		rpc_errf(err, rc, "device %s of session %s: %s: ublk UPDATE_SIZE: %s", d->name,
			 d->s->name, d->bdev, strerror(-rc));
		/* The block device keeps its size; so does the mapping. */
		rnbd_clt_resize(d->d, old.bytes);
	} else if (!(*result = dev_json(d)))
		rc = -ENOMEM;
	pthread_mutex_unlock(&state_lock);
	return rc;
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
			ok = ok && put(opts, key, copy(val));
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
		servers = copy(had);
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

/* d's mapping now, as client.map takes it (state_lock held), or NULL. */
static struct json_object *mapping_of(struct dev *d)
{
	struct json_object *o = json_object_new_object(), *v, *spec = sess_spec_now(d->s);

	if (!spec || !put(o, "device", json_object_new_string(d->name)) ||
	    !put(o, "session", json_object_new_string(d->s->name)) ||
	    !put(o, "mode", json_object_new_string(mode_names[d->mode])) ||
	    (!d->want_bdev && !put(o, "block_device", json_object_new_boolean(false))) ||
	    (json_object_object_get_ex(spec, "server", &v) && !put(o, "server", copy(v))) ||
	    (json_object_object_get_ex(spec, "options", &v) && !put(o, "options", copy(v)))) {
		json_object_put(spec);
		json_object_put(o);
		return NULL;
	}
	json_object_put(spec);
	return o;
}

/* The mappings now, as client.map takes them (state_lock held). */
/*
 * The mappings file's entries as read at start, state_lock: a save keeps
 * those not mapped now (a server down at start, a device not there yet, a
 * mapping or takeover still in progress), so that a mapping is never lost
 * from the file because it failed once or was not done yet. An unmap
 * forgets the device's (unrestored_forget): the admin took it away.
 */
static struct json_object *unrestored;

/* An unmap of device name of session sname (state_lock held). */
static void unrestored_forget(const char *sname, const char *name)
{
	for (size_t i = arr_len(unrestored); i-- > 0;)
		if (mapping_names(json_object_array_get_idx(unrestored, i), sname, name))
			json_object_array_del_idx(unrestored, i, 1);
}

/* Whether session sname has device name mapped now (state_lock held). */
static bool mapped_now(const char *sname, const char *name)
{
	for (unsigned i = 0; i < DEVS_MAX; i++)
		if (devs[i] && !strcmp(devs[i]->s->name, sname) && dev_name_same(devs[i]->name, name))
			return true;
	return false;
}

static struct json_object *mappings_json(void)
{
	struct json_object *arr = json_object_new_array();

	for (unsigned i = 0; arr && i < DEVS_MAX; i++) {
		struct json_object *o;

		if (!devs[i])
			continue;
		o = mapping_of(devs[i]);
		if (!o || json_object_array_add(arr, o)) {
			json_object_put(o);
			json_object_put(arr);
			return NULL;
		}
	}
	for (size_t i = 0; arr && i < arr_len(unrestored); i++) {
		struct json_object *m = json_object_array_get_idx(unrestored, i), *v;
		const char *sname = json_object_object_get_ex(m, "session", &v) ?
				    json_object_get_string(v) : "";
		const char *name = json_object_object_get_ex(m, "device", &v) ?
				   json_object_get_string(v) : "";

		if (mapped_now(sname ? sname : "", name ? name : ""))
			continue; /* mapped since: it is above, as it is now */
		/*
		 * A copy: the caller drops arr unlocked, and a reference on m
		 * would be counted down there while another save counts it up
		 * here (json-c's counts are not atomic).
		 */
		m = copy(m);
		if (!m || json_object_array_add(arr, m)) {
			json_object_put(m);
			json_object_put(arr);
			return NULL;
		}
	}
	return arr;
}

/*
 * Every block device's record, written again with its mapping now
 * (client.save, and a change to a session's paths, policy or reconnect
 * parameters).
 */
static void rec_refresh(void)
{
	uint64_t serials[DEVS_MAX];
	int ids[DEVS_MAX];
	unsigned n = 0;

	pthread_mutex_lock(&state_lock);
	for (unsigned i = 0; i < DEVS_MAX; i++) {
		if (devs[i] && devs[i]->ub) {
			ids[n] = devs[i]->ub_id;
			serials[n++] = devs[i]->serial;
		}
	}
	pthread_mutex_unlock(&state_lock);
	for (unsigned i = 0; i < n; i++)
		rec_write(ids[i], serials[i]);
}

/*
 * o's text written to fd: 0, or a negative errno (-ENOSPC for a full
 * disk). Not json_object_to_fd, which answers -1 for any failure, its
 * errno not kept past its own message.
 */
/*
 * A temporary file made anew for a write that a rename then puts in place:
 * whatever is at path (a file a crash left, or a link planted there) is
 * removed, never followed or written through. The fd, or a negative errno.
 */
static int tmp_create(const char *path)
{
	int fd;

	if (unlink(path) && errno != ENOENT)
		return -errno;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	return fd < 0 ? -errno : fd;
}

static int json_write(int fd, struct json_object *o, int flags)
{
	size_t len = 0, done = 0;
	const char *text = json_object_to_json_string_length(o, flags, &len);

	if (!text)
		return -ENOMEM;
	while (done < len) {
		ssize_t n = write(fd, text + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		done += (size_t)n;
	}
	return 0;
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
	pthread_mutex_lock(&save_lock);
	pthread_mutex_lock(&state_lock);
	/* Not while the stop unmaps everything: the file would lose them. */
	arr = stopping ? NULL : mappings_json();
	rc = stopping ? rpc_errf(err, -ESHUTDOWN, "rnbd-clientd is stopping: the mappings file "
				 "is left as it is") : arr ? 0 : -ENOMEM;
	pthread_mutex_unlock(&state_lock);
	if (rc) {
		pthread_mutex_unlock(&save_lock);
		return rc;
	}
	rec_refresh();
	snprintf(tmp, sizeof(tmp), "%s.new", g.mappings);
	fd = tmp_create(tmp);
	rc = fd < 0 ? fd : 0;
	if (!rc)
		rc = json_write(fd, arr, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
	if (fd >= 0 && !rc && fsync(fd))
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (!rc && rename(tmp, g.mappings))
		rc = -errno;
	if (rc)
		unlink(tmp);
	if (!rc) {
		/* The rename is durable only once its directory is: a power cut would undo it. */
		char dir[4200];
		char *slash;
		int dfd;

		snprintf(dir, sizeof(dir), "%s", g.mappings);
		slash = strrchr(dir, '/');
		if (slash == dir)
			dir[1] = '\0';
		else if (slash)
			*slash = '\0';
		else
			snprintf(dir, sizeof(dir), ".");
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 || fsync(dfd))
			rc = -errno;
		if (dfd >= 0)
			close(dfd);
	}
	pthread_mutex_unlock(&save_lock);
	if (rc) {
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

/* ---- block devices that outlive the daemon: --runtime-dir ---- */

/*
 * Each block device has a record, DIR/ublkbN.json: {"ublk": N, "mapping":
 * its mapping as client.map takes it}, written when the device is made
 * (and again at client.save), removed when it is removed. A daemon that
 * ends without removing its devices (a crash, a kill, a stop with
 * --on-stop handover) leaves them to the kernel, which holds their IO;
 * the next daemon of the same DIR (one at a time: DIR/lock) maps each
 * recorded device again and takes its block device over
 * (ublk_dev_recover), before the mappings file.
 */
static int rt_lock_fd = -1;
/* Orders the writes and removals of records: none comes back after its device went. */
static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;

static void rec_path(int id, char *buf, size_t len)
{
	snprintf(buf, len, "%s/ublkb%d.json", g.runtime_dir, id);
}

/*
 * id's record, mapping in it (taken, may be NULL: out of memory), through
 * a temporary file; rec_lock held.
 */
static void rec_write_locked(int id, struct json_object *mapping, int prev_pid)
{
	struct json_object *o = json_object_new_object();
	char path[4096], tmp[4200];
	int fd = -1, rc = 0;
	uint64_t ident;

	rec_path(id, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.new", path);
	/*
	 * The pid: the kernel's record of who serves the device, so that no
	 * other's is taken. prev_pid during a takeover: the kernel names the
	 * old daemon until END_USER_RECOVERY, this one after it, and a
	 * daemon killed in between leaves a record that either matches.
	 * ident: this instance of the device, for a kernel that names no
	 * pid once its daemon is gone (recover_scan).
	 */
	ident = ublk_dev_ident(id);
	if (!mapping || !put(o, "ublk", json_object_new_int(id)) ||
	    !put(o, "pid", json_object_new_int(getpid())) ||
	    (ident && !put(o, "ident", json_object_new_int64((int64_t)ident))) ||
	    (prev_pid > 0 && !put(o, "prev_pid", json_object_new_int(prev_pid)))) {
		rc = -ENOMEM; /* mapping still ours: dropped below */
	} else {
		if (!put(o, "mapping", mapping))
			rc = -ENOMEM;
		mapping = NULL; /* o's, or dropped by put */
	}
	if (!rc) {
		fd = tmp_create(tmp);
		rc = fd < 0 ? fd : 0;
	}
	if (!rc)
		rc = json_write(fd, o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
	if (fd >= 0 && !rc && fsync(fd))
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc) {
		unlink(tmp);
		dlog(DLOG_ERR, "ublk: /dev/ublkb%d: its record %s cannot be written: %s; the next "
		     "rnbd-clientd cannot take it over", id, path, strerror(-rc));
	}
	json_object_put(o);
	json_object_put(mapping);
}

/*
 * id's record, while the mapping numbered serial is listed with block
 * device id (else nothing): an id another mapping got since, the first
 * one unmapped meanwhile, keeps that one's record. The mapping is taken
 * as it is at the write, under rec_lock: of two writes (a map's, a path
 * added meanwhile), the later one holds the later state.
 */
static void rec_write(int id, uint64_t serial)
{
	struct json_object *mapping = NULL;
	bool live = false;

	/* Under rec_lock: an unmap drops the record after its block device left the list. */
	pthread_mutex_lock(&rec_lock);
	pthread_mutex_lock(&state_lock);
	for (unsigned j = 0; j < DEVS_MAX && !live; j++) {
		live = devs[j] && devs[j]->ub && devs[j]->ub_id == id && devs[j]->serial == serial;
		if (live)
			mapping = mapping_of(devs[j]);
	}
	pthread_mutex_unlock(&state_lock);
	if (live)
		rec_write_locked(id, mapping, 0); /* NULL (no memory): said there */
	pthread_mutex_unlock(&rec_lock);
}

/*
 * id's record removed, unless a listed mapping has block device id, or a
 * map recorded it and has not listed it yet (early_ids): the kernel may
 * give a number to a new device as soon as the old one is deleted, and
 * the new one's record is not the old one's to remove.
 */
static void rec_drop(int id)
{
	char path[4096];
	bool taken = false;
	int rc = 0;

	rec_path(id, path, sizeof(path));
	pthread_mutex_lock(&rec_lock);
	pthread_mutex_lock(&state_lock);
	for (unsigned j = 0; j < DEVS_MAX && !taken; j++)
		taken = devs[j] && devs[j]->ub && devs[j]->ub_id == id;
	pthread_mutex_unlock(&state_lock);
	taken = taken || early_has(id);
	if (!taken)
		rc = unlink(path) && errno != ENOENT ? errno : 0;
	pthread_mutex_unlock(&rec_lock);
	if (rc)
		dlog(DLOG_WARN, "ublk: /dev/ublkb%d: removing its record %s: %s", id, path,
		     strerror(rc));
}

/*
 * DIR made (its parents too) and locked: one daemon per runtime
 * directory; a new one waits up to LOCK_WAIT_MS for the last to end. 0,
 * or -1 after saying why.
 */
static int runtime_open(void)
{
	char buf[4096], path[4200];

	snprintf(buf, sizeof(buf), "%s", g.runtime_dir);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0755) && errno != EEXIST) {
			fprintf(stderr, "rnbd-clientd: %s %s: making %s: %s\n",
				origin("runtime-dir", g.runtime_dir), g.runtime_dir, buf, strerror(errno));
			return -1;
		}
		*p = '/';
	}
	if (mkdir(buf, 0700) && errno != EEXIST) {
		fprintf(stderr, "rnbd-clientd: %s %s: %s\n",
			origin("runtime-dir", g.runtime_dir), g.runtime_dir,
			strerror(errno));
		return -1;
	}
	snprintf(path, sizeof(path), "%s/lock", g.runtime_dir);
	rt_lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (rt_lock_fd < 0) {
		fprintf(stderr, "rnbd-clientd: %s %s: %s: %s\n",
			origin("runtime-dir", g.runtime_dir), g.runtime_dir, path,
			strerror(errno));
		return -1;
	}
	for (unsigned ms = 0; flock(rt_lock_fd, LOCK_EX | LOCK_NB); ms += 20) {
		if (errno != EWOULDBLOCK && errno != EINTR) {
			fprintf(stderr, "rnbd-clientd: %s %s: locking %s: %s\n",
				origin("runtime-dir", g.runtime_dir), g.runtime_dir, path,
				strerror(errno));
			return -1;
		}
		if (!ms)
			dlog(DLOG_INFO, "--runtime-dir %s: another rnbd-clientd holds it; waiting up "
			     "to %u s for it to end", g.runtime_dir, LOCK_WAIT_MS / 1000);
		if (ms >= LOCK_WAIT_MS) {
			fprintf(stderr, "rnbd-clientd: %s %s: another rnbd-clientd still runs "
				"with it after %u s\n", origin("runtime-dir", g.runtime_dir),
				g.runtime_dir, LOCK_WAIT_MS / 1000);
			return -1;
		}
		usleep(20000);
	}
	return 0;
}

/*
 * Devices an rnbd-clientd added and died before recording (between ADD_DEV
 * and its record: SET_PARAMS, the queue's start), which no record names:
 * left, each kept its number and its character device for good. At start,
 * before this daemon adds anything: a device is deleted when it is dead
 * (never started: no block device), marked as an rnbd-clientd's of this
 * pid namespace (ublk_mark; any other program's device is not), has no
 * record here (one with a record is recover_scan's), and the pid its
 * ADD_DEV carried is gone (ESRCH; this daemon's own pid counts as gone, it
 * added nothing yet). A device whose adder runs, an rnbd-clientd of another
 * --runtime-dir in the middle of its add, is left; so is one whose pid was
 * given to another process since (left, never deleted wrongly). One whose
 * pid the kernel gives as -1 is deleted while the scan holds the add lock
 * (ublk_add_lock: no add is in progress): stopped and not deleted, or (a
 * kernel that names only live processes, which names none before
 * START_DEV) its adder is gone; without the lock it is left.
 */
/* How long the scan waits for the add lock (ublk_add_lock) of a daemon in the middle of an add. */
#define ORPHAN_LOCK_WAIT_MS 2000

static void orphan_scan(void)
{
	DIR *dir = opendir("/sys/class/ublk-char");
	struct dirent *e;
	int lk;

	if (!dir)
		return; /* no devices (ublk_drv makes the class with the first) */
	lk = ublk_add_lock(ORPHAN_LOCK_WAIT_MS);
	while ((e = readdir(dir))) {
		struct ublk_state st;
		char path[4200], tail[2];
		int id, drc;

		if (sscanf(e->d_name, "ublkc%d%1s", &id, tail) != 1 || id < 0)
			continue;
		snprintf(path, sizeof(path), "%s/ublkb%d.json", g.runtime_dir, id);
		if (!access(path, F_OK) || errno != ENOENT)
			continue;
		if (ublk_dev_state(id, &st) || st.state != UBLK_S_DEV_DEAD || !st.marked ||
		    (st.pid <= 0 && st.pid != -1))
			continue;
		if (st.pid == -1 && lk < 0) {
			dlog(DLOG_INFO, "ublk: /dev/ublkb%d: not started, not recorded here, and the "
			     "kernel names no pid for its adder; the add lock is not ours (%s): "
			     "left", id, lk == -EWOULDBLOCK ? "another process holds it: an add in "
			     "progress" : strerror(-lk));
			continue;
		}
		if (st.pid == -1) {
			/*
			 * The kernel names no pid: a kernel that names only live
			 * processes (newer ones; as it does for an adder that
			 * still runs, before START_DEV) for an adder that is
			 * gone, or one stopped (STOP_DEV) and not deleted. With
			 * the add lock held no add is in progress: dead either way.
			 */
			drc = ublk_dev_abandon(id);
			dlog(drc ? DLOG_ERR : DLOG_INFO, "ublk: /dev/ublkb%d: added by a process the "
			     "kernel no longer names (gone), which died before recording and "
			     "starting it: %s%s", id, drc ? "not deleted: " : "deleted",
			     drc ? strerror(-drc) : "");
			continue;
		}
		if (st.pid != getpid() && (!kill(st.pid, 0) || errno != ESRCH)) {
			dlog(DLOG_INFO, "ublk: /dev/ublkb%d: added by pid %d and not started, not "
			     "recorded here; pid %d runs (another rnbd-clientd adding it, or the "
			     "pid was reused): left", id, st.pid, st.pid);
			continue;
		}
		drc = ublk_dev_abandon(id);
		dlog(drc ? DLOG_ERR : DLOG_INFO, "ublk: /dev/ublkb%d: added by pid %d, which died "
		     "before recording and starting it: %s%s", id, st.pid,
		     drc ? "not deleted: " : "deleted", drc ? strerror(-drc) : "");
	}
	closedir(dir);
	ublk_add_unlock(lk);
}

/*
 * The block devices a previous daemon left: a JSON array of its records
 * whose devices wait for a daemon ({"ublk": N, "mapping": {...}}). A record
 * whose device is gone is removed; one that cannot be read is logged and
 * left as it is.
 */
static struct json_object *recover_scan(void)
{
	struct json_object *jobs = json_object_new_array();
	DIR *dir = opendir(g.runtime_dir);
	struct dirent *e;

	if (!dir || !jobs) {
		if (dir)
			closedir(dir);
		return jobs;
	}
	while ((e = readdir(dir))) {
		struct json_object *rec, *v, *m;
		const char *mname, *msname;
		struct rpc_err merr = { 0 };
		struct ublk_state st;
		char path[4200], tail[8] = "";
		int id = -1, rc, mmode, rec_pid;
		uint64_t rec_ident;
		bool mbdev, pid_ours, ident_ours;

		if (sscanf(e->d_name, "ublkb%d%7s", &id, tail) != 2 || strcmp(tail, ".json") ||
		    id < 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", g.runtime_dir, e->d_name);
		rec = json_object_from_file(path);
		if (!rec || !json_object_object_get_ex(rec, "ublk", &v) ||
		    !json_object_is_type(v, json_type_int) || json_object_get_int(v) != id ||
		    !json_object_object_get_ex(rec, "mapping", &m) ||
		    !json_object_is_type(m, json_type_object)) {
			dlog(DLOG_ERR, "--runtime-dir %s: %s is no record of /dev/ublkb%d (%s); "
			     "its device is not taken over", g.runtime_dir, e->d_name, id,
			     rec ? "not {\"ublk\": N, \"mapping\": {...}}" : json_util_get_last_err());
			json_object_put(rec);
			continue;
		}
		if (map_check(m, &mname, &msname, &mmode, &mbdev, &merr)) {
			/* Edited or damaged: left as it is for the admin (nothing of it is used). */
			dlog(DLOG_ERR, "--runtime-dir %s: %s: its mapping is not one client.map "
			     "takes (%s); /dev/ublkb%d is not taken over", g.runtime_dir,
			     e->d_name, merr.msg, id);
			json_object_put(rec);
			continue;
		}
		rc = ublk_dev_state(id, &st);
		rec_pid = json_object_object_get_ex(rec, "pid", &v) ? json_object_get_int(v) : 0;
		rec_ident = json_object_object_get_ex(rec, "ident", &v) ?
			    (uint64_t)json_object_get_int64(v) : 0;
		/*
		 * Whether the kernel's pid is the recording daemon's (or, in
		 * the middle of a takeover, the one it took over from). A
		 * kernel that names only live processes (newer ones, Debian's
		 * 7.3 among them: the pid as seen from the caller's namespace,
		 * -1 once that process is gone) says -1 for a device whose
		 * daemon died: then the device is this record's when it
		 * carries the mark of an rnbd-clientd of this pid namespace
		 * and is the instance the record names (ident: a number
		 * reused since, by an rnbd-clientd of another --runtime-dir,
		 * is another instance). A record without it (an older
		 * daemon's) proves nothing at -1.
		 */
		ident_ours = st.pid == -1 && st.marked && rec_ident && rec_ident == st.ident;
		pid_ours = (st.pid > 0 && st.pid == rec_pid) ||
			   (st.pid > 0 && json_object_object_get_ex(rec, "prev_pid", &v) &&
			    json_object_get_int(v) == st.pid) || ident_ours;
		/* Dead (stopped, or never started: its daemon died before START_DEV): not served. */
		if (!rc && st.state != UBLK_S_DEV_DEAD && !pid_ours) {
			/* The number was given to a device of another program since. */
			dlog(DLOG_INFO, "ublk: /dev/ublkb%d: served by pid %d, not by the daemon "
			     "that recorded it; its record goes", id, st.pid);
			rc = -ENODEV;
		}
		/*
		 * Dead with the recording daemon's pid: that daemon added it
		 * (ADD_DEV carries the adder's pid, START_DEV replaces it and a
		 * stop makes it -1) and died before it started, so it never
		 * was a block device and nobody else can hold it: deleted, or
		 * it kept its number and its character device for good. Dead
		 * at -1, this record's instance (a kernel that names only
		 * live processes, or one stopped and not deleted): never to
		 * be served again, deleted too.
		 */
		if (!rc && st.state == UBLK_S_DEV_DEAD && rec_pid > 0 &&
		    (st.pid == rec_pid || ident_ours)) {
			int drc = ublk_dev_abandon(id);

			dlog(drc ? DLOG_ERR : DLOG_INFO, "ublk: /dev/ublkb%d: added by pid %d, which "
			     "died before starting it: %s%s; its record goes", id, rec_pid,
			     drc ? "not deleted: " : "deleted", drc ? strerror(-drc) : "");
			unlink(path);
			json_object_put(rec);
			continue;
		}
		if (rc == -ENODEV || (!rc && (!st.recoverable || st.state == UBLK_S_DEV_DEAD))) {
			dlog(DLOG_INFO, "ublk: /dev/ublkb%d: %s; its record goes", id,
			     rc ? "not ours" : "not to be taken over");
			unlink(path);
			json_object_put(rec);
			continue;
		}
		if (rc) {
			dlog(DLOG_ERR, "ublk: /dev/ublkb%d: its state: %s; not taken over", id,
			     strerror(-rc));
			json_object_put(rec);
			continue;
		}
		if (json_object_array_add(jobs, rec))
			json_object_put(rec);
	}
	closedir(dir);
	return jobs;
}

/* Whether the mapping m (of the mappings file) is one of the devices taken over. */
static bool recovering_has(struct json_object *jobs, struct json_object *m)
{
	struct json_object *d, *s;

	if (!json_object_object_get_ex(m, "device", &d) || !json_object_object_get_ex(m, "session", &s))
		return false;
	for (size_t i = 0; i < arr_len(jobs); i++) {
		struct json_object *jm;

		json_object_object_get_ex(json_object_array_get_idx(jobs, i), "mapping", &jm);
		if (mapping_names(jm, json_object_get_string(s), json_object_get_string(d)))
			return true;
	}
	return false;
}

/* Sleeps ms, or less when a stop begins: whether it did not. */
static bool nap(unsigned ms)
{
	for (unsigned t = 0; t < ms; t += 50) {
		bool stop;

		pthread_mutex_lock(&state_lock);
		stop = stopping;
		pthread_mutex_unlock(&state_lock);
		if (stop)
			return false;
		usleep(50000);
	}
	return true;
}

/*
 * A device a previous daemon left: mapped again, tried for --recover-timeout
 * while its session cannot be opened (its IO waits in the kernel
 * meanwhile); then given up: the block device is removed and its IO fails.
 */
static void recover_job(struct json_object *job)
{
	struct json_object *v, *m;
	uint64_t t0 = now_ms();
	bool recovered = false;
	unsigned tries = 0;
	int id, rc;

	struct ublk_state st;
	int prev_pid;

	json_object_object_get_ex(job, "ublk", &v);
	json_object_object_get_ex(job, "mapping", &m);
	id = json_object_get_int(v);
	/* The daemon the kernel names now: the record keeps it until the takeover is done. */
	prev_pid = !ublk_dev_state(id, &st) ? st.pid : 0;
	dlog(DLOG_INFO, "ublk: /dev/ublkb%d outlived the previous rnbd-clientd: mapping it again",
	     id);
	for (;;) {
		struct json_object *r = NULL;
		struct rpc_err e = { 0 };

		rc = map_do(m, id, prev_pid, &recovered, &r, &e);
		json_object_put(r);
		if (!rc)
			return;
		tries++;
		/* Not started (no memory, the kernel not ready): tried again until the timeout. */
		if (recovered || rc == -ESHUTDOWN || now_ms() - t0 >= g.recover_timeout * 1000) {
			dlog(rc == -ESHUTDOWN ? DLOG_INFO : DLOG_ERR, "ublk: /dev/ublkb%d: %s",
			     id, e.msg[0] ? e.msg : strerror(-rc));
			break;
		}
		if (tries == 1 || tries % 10 == 0)
			dlog(DLOG_WARN, "ublk: /dev/ublkb%d: mapping it again (try %u): %s; its IO "
			     "waits, trying again for up to %u s", id, tries,
			     e.msg[0] ? e.msg : strerror(-rc), (unsigned)g.recover_timeout);
		if (!nap(1000)) {
			rc = -ESHUTDOWN;
			break;
		}
	}
	/* -EBUSY until the end: another daemon still serves it. */
	if (rc == -ESHUTDOWN || (!recovered && rc == -EBUSY))
		return; /* left as it is, for the next daemon */
	if (!recovered) {
		dlog(DLOG_ERR, "ublk: /dev/ublkb%d: not mapped again after %u tries: removing it "
		     "(its IO fails)", id, tries);
		ublk_dev_abandon(id);
	}
	rec_drop(id);
	{
		struct json_object *dn, *sn;

		if (json_object_object_get_ex(m, "device", &dn) &&
		    json_object_object_get_ex(m, "session", &sn))
			link_drop(json_object_get_string(sn), json_object_get_string(dn), id);
	}
}

static struct json_object *recovering; /* the block devices a previous daemon left */
static bool *recover_busy;             /* recovering[i] is being taken over (state_lock) */

/*
 * Whether device name of session sname is a block device being taken over
 * (state_lock held); *id its /dev/ublkb number.
 */
static bool taking_over(const char *sname, const char *name, int *id)
{
	for (size_t i = 0; recover_busy && i < arr_len(recovering); i++) {
		struct json_object *job = json_object_array_get_idx(recovering, i), *m, *v;

		if (!recover_busy[i] || !json_object_object_get_ex(job, "mapping", &m) ||
		    !mapping_names(m, sname, name))
			continue;
		*id = json_object_object_get_ex(job, "ublk", &v) ? json_object_get_int(v) : -1;
		return true;
	}
	return false;
}

/* recovering[i] taken over, or given up. */
static void recover_one(size_t i)
{
	recover_job(json_object_array_get_idx(recovering, i));
	pthread_mutex_lock(&state_lock);
	if (recover_busy)
		recover_busy[i] = false;
	pthread_mutex_unlock(&state_lock);
}

static struct rpc_method methods[64];

static size_t nr_methods;

static const struct rpc_method own_methods[] = {
	{ "client.map", m_map,
	  "device: string, session: string, server: [string] (a new session), mode: rw|ro|"
	  "migration (default rw), options: object (a new session), block_device: bool "
	  "(default true)",
	  "map a device, opening its session when it is new; as a block device unless "
	  "block_device is false" },
	{ "client.unmap", m_unmap, "device: string, session: string (optional), force: bool",
	  "unmap a device (force: even with IO in flight); the last one closes its session" },
	{ "client.remap", m_remap, "device: string, session: string (optional)",
	  "open a device again on its server" },
	{ "client.resize", m_resize, "device: string, session: string (optional), bytes: integer",
	  "the size this client uses (whole blocks, at most the server's)" },
	{ "client.save", m_save, "", "write the mappings to the --mappings file" },
};

/*
 * clt_ctl's methods that change what a session is: its paths, its policy,
 * its reconnect parameters. Done, the records of the block devices follow,
 * so that the next daemon takes them over with the session as it is now
 * (not as it was mapped).
 */
static const char *const spec_methods[] = { "client.path.add", "client.path.remove",
					    "client.policy", "client.reconnect" };
static rpc_fn spec_fns[sizeof(spec_methods) / sizeof(spec_methods[0])];

static int spec_call(unsigned i, void *priv, struct json_object *params,
		     struct json_object **result, struct rpc_err *err)
{
	int rc = spec_fns[i](priv, params, result, err);

	/* client.reconnect with the session alone only answers: nothing to write. */
	if (!rc && json_object_is_type(params, json_type_object) &&
	    json_object_object_length(params) > 1)
		rec_refresh();
	return rc;
}

#define SPEC_WRAP(i)                                                                         \
	static int spec_call##i(void *priv, struct json_object *params,                      \
				struct json_object **result, struct rpc_err *err)            \
	{                                                                                    \
		return spec_call(i, priv, params, result, err);                              \
	}
SPEC_WRAP(0)
SPEC_WRAP(1)
SPEC_WRAP(2)
SPEC_WRAP(3)
static const rpc_fn spec_wraps[] = { spec_call0, spec_call1, spec_call2, spec_call3 };
_Static_assert(sizeof(spec_wraps) / sizeof(spec_wraps[0]) == sizeof(spec_fns) / sizeof(spec_fns[0]),
	       "a wrapper per method that changes a session");

/* methods[]: ours, then clt_ctl's, those that change a session wrapped. */
static size_t methods_make(void)
{
	size_t n = sizeof(own_methods) / sizeof(own_methods[0]);

	memcpy(methods, own_methods, sizeof(own_methods));
	memcpy(methods + n, clt_ctl_methods, clt_ctl_nr_methods * sizeof(methods[0]));
	for (size_t i = n; i < n + clt_ctl_nr_methods; i++) {
		for (unsigned k = 0; k < sizeof(spec_methods) / sizeof(spec_methods[0]); k++) {
			if (!strcmp(methods[i].name, spec_methods[k])) {
				spec_fns[k] = methods[i].fn;
				methods[i].fn = spec_wraps[k];
			}
		}
	}
	for (unsigned k = 0; k < sizeof(spec_methods) / sizeof(spec_methods[0]); k++)
		if (!spec_fns[k])
			abort(); /* clt_ctl renamed one: this table must follow */
	return n + clt_ctl_nr_methods;
}

/* ---- the mappings file ---- */

/*
 * The mappings file, read and checked (before the control socket: a file
 * that cannot be read stops the daemon): 0 with *out (NULL: no file yet),
 * or -EINVAL after saying why.
 */
static int mappings_load(struct json_object **out)
{
	struct json_object *arr = NULL;
	char *text = NULL, why[160] = "";
	unsigned *lines = NULL;
	size_t *starts = NULL, nlines = 0;
	struct stat st;
	size_t len = 0;
	int fd;

	*out = NULL;
	/* Only a regular file is opened: a FIFO named by mistake is not (open_regular). */
	fd = open_regular(g.mappings, &st);
	if (fd == -ENOENT) {
		dlog(DLOG_INFO, "mappings file %s: none yet (client.save makes it)", g.mappings);
		return 0;
	}
	if (fd == -EISDIR)
		snprintf(why, sizeof(why), "is a directory, not a file");
	else if (fd == -EINVAL)
		snprintf(why, sizeof(why), "is not a regular file (%s)", file_type_name(st.st_mode));
	else if (fd < 0)
		snprintf(why, sizeof(why), "cannot be read: %s", strerror(-fd));
	else if (st.st_size > (64 << 20))
		snprintf(why, sizeof(why), "is larger than 64 MiB");
	else if (!(text = malloc((size_t)st.st_size + 1)))
		snprintf(why, sizeof(why), "out of memory");
	while (!why[0] && len < (size_t)st.st_size) {
		ssize_t n = read(fd, text + len, (size_t)st.st_size - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			snprintf(why, sizeof(why), "cannot be read: %s",
				 n < 0 ? strerror(errno) : "it shrank while read");
			break;
		}
		len += (size_t)n;
	}
	if (fd >= 0)
		close(fd);
	if (!why[0] && !len)
		snprintf(why, sizeof(why), "is empty: a mappings file is a JSON array of mappings "
			 "(\"[]\" for none)");
	if (!why[0]) {
		struct json_tokener *tok = json_tokener_new();
		enum json_tokener_error te = json_tokener_error_size;
		size_t end = 0;

		if (!tok) {
			snprintf(why, sizeof(why), "out of memory");
		} else {
			/* As a request: no comments, trailing commas, single quotes, 01. */
			json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
			arr = json_tokener_parse_ex(tok, text, (int)len);
			te = json_tokener_get_error(tok);
			end = json_tokener_get_parse_end(tok);
			json_tokener_free(tok);
		}
		if (arr && te == json_tokener_success) {
			/* Only blanks may follow the array. */
			while (end < len && strchr(" \t\r\n", text[end]))
				end++;
			if (end < len) {
				te = json_tokener_error_parse_unexpected;
				json_object_put(arr);
				arr = NULL;
			}
		} else if (arr) {
			json_object_put(arr);
			arr = NULL;
		}
		if (!arr && !why[0] && te != json_tokener_success) {
			unsigned line = 1;

			for (size_t i = 0; i < end && i < len; i++)
				line += text[i] == '\n';
			snprintf(why, sizeof(why), "line %u: not JSON: %s", line,
				 te == json_tokener_continue ? "it ends too early" :
				 json_tokener_error_desc(te));
		}
		/* Before any array call: json-c asserts the type (an object here aborted). */
		if (!why[0] && !json_object_is_type(arr, json_type_array)) {
			snprintf(why, sizeof(why), "not a JSON array of mappings");
			json_object_put(arr);
			arr = NULL;
		}
	}
	/* The line and offset each top-level entry starts at, for the checks below. */
	if (!why[0] && arr) {
		unsigned line = 1, depth = 0;
		bool in_str = false, esc = false, want = true;

		lines = calloc(json_object_array_length(arr) + 1, sizeof(*lines));
		starts = calloc(json_object_array_length(arr) + 1, sizeof(*starts));
		if (!lines || !starts)
			snprintf(why, sizeof(why), "out of memory");
		for (size_t i = 0; !why[0] && i < len; i++) {
			char c = text[i];

			line += c == '\n';
			if (in_str) {
				esc = !esc && c == '\\';
				in_str = esc || c != '"';
				if (!in_str && depth == 1)
					want = false;
				continue;
			}
			if (depth == 1 && want && !strchr(" \t\r\n,", c) && nlines <
			    json_object_array_length(arr)) {
				starts[nlines] = i;
				lines[nlines++] = line;
				want = false;
			}
			if (c == '"')
				in_str = true;
			else if (c == '[' || c == '{')
				depth++;
			else if (c == ']' || c == '}')
				depth--;
			else if (c == ',' && depth == 1)
				want = true;
		}
	}
	if (why[0]) {
		fprintf(stderr, "rnbd-clientd: %s %s: %s\n", origin("mappings", g.mappings),
			g.mappings, why);
		json_object_put(arr);
		free(text);
		free(lines);
		free(starts);
		return -EINVAL;
	}
	/*
	 * Every entry as client.map would take it, before anything is mapped:
	 * one that is not is a mistake in the file, said with its line, and
	 * the daemon does not start (it would map the others and leave it).
	 */
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *m = json_object_array_get_idx(arr, i);
		/* Its text: to the next entry's, the last's to the end. */
		size_t from = i < nlines ? starts[i] : len, to = i + 1 < nlines ? starts[i + 1] : len;
		const char *name, *sname, *bad = rpc_text_check(text + from, to - from, m);
		struct rpc_err e = { 0 };
		bool want_bdev;
		struct sess *sp;
		int mode, rc;

		if (bad)
			rc = rpc_errf(&e, RPC_INVALID_PARAMS, "%s", bad);
		else if (!json_object_is_type(m, json_type_object))
			rc = rpc_errf(&e, RPC_INVALID_PARAMS, "not an object (a mapping is "
				      "{\"device\": ..., \"session\": ..., \"server\": [...]})");
		else if (!(rc = map_check(m, &name, &sname, &mode, &want_bdev, &e)) &&
			 (sp = sess_new(sname, m, true, &e)))
			sess_destroy(sp);
		else if (!rc)
			rc = e.code ? e.code : -EINVAL;
		if (rc) {
			fprintf(stderr, "rnbd-clientd: %s %s: line %u: mapping %zu: %s\n",
				origin("mappings", g.mappings), g.mappings,
				i < nlines ? lines[i] : 0, i + 1, e.msg[0] ? e.msg : strerror(-rc));
			json_object_put(arr);
			free(text);
			free(lines);
			free(starts);
			return -EINVAL;
		}
	}
	free(text);
	free(lines);
	free(starts);
	*out = arr;
	return 0;
}

static struct json_object *restoring;  /* the file's mappings */
static size_t restore_next;            /* the next one to map (state_lock) */
static unsigned restorers;             /* restore threads still running (state_lock) */

/*
 * Ready: the control socket is up and what the last daemon left and the
 * mappings file held is mapped (or failed). Under systemd (Type=notify)
 * READY=1 goes out now, so that units ordered after this one (the
 * mounts of remote-fs.target) find the block devices there.
 */
static void ready(void)
{
	size_t n;

	pthread_mutex_lock(&state_lock);
	n = ndevs;
	pthread_mutex_unlock(&state_lock);
	dlog(DLOG_INFO, "ready: %zu device%s mapped", n, n == 1 ? "" : "s");
	sd_notifyf(0, "READY=1\nSTATUS=%zu device%s mapped", n, n == 1 ? "" : "s");
}

/* A restore thread ends (state_lock held): the last one says the daemon is ready. */
static bool restorer_done(unsigned n)
{
	restorers -= n;
	return !restorers;
}

/*
 * A restore thread: takes the devices to take over, then the file's
 * mappings (but those), one after the other, with the other threads.
 */
static void *restore_thread(void *arg)
{
	size_t nr = arr_len(recovering), n = nr + arr_len(restoring);
	bool last;

	(void)arg;
	pthread_setname_np(pthread_self(), "restore");
	for (;;) {
		struct json_object *r = NULL, *m;
		struct rpc_err e = { 0 };
		size_t i;
		int rc;

		pthread_mutex_lock(&state_lock);
		i = restore_next < n && !stopping ? restore_next++ : n;
		pthread_mutex_unlock(&state_lock);
		if (i == n)
			break;
		if (i < nr) {
			recover_one(i);
			continue;
		}
		m = json_object_array_get_idx(restoring, i - nr);
		if (recovering_has(recovering, m)) {
			dlog(DLOG_INFO, "mappings file %s: mapping %zu: taken over from the previous "
			     "rnbd-clientd", g.mappings, i - nr + 1);
			continue;
		}
		/* Failed, it stays in unrestored: a save keeps it. */
		rc = m_map(NULL, m, &r, &e);
		if (rc)
			dlog(rc == -ESHUTDOWN ? DLOG_INFO : DLOG_ERR, "mappings file %s: mapping %zu: %s%s",
			     g.mappings, i - nr + 1, e.msg[0] ? e.msg : strerror(-rc),
			     rc == -ESHUTDOWN ? "" : "; client.save keeps it in the file");
		json_object_put(r);
	}
	pthread_mutex_lock(&state_lock);
	last = restorer_done(1);
	workers--;
	pthread_cond_broadcast(&state_cond);
	pthread_mutex_unlock(&state_lock);
	if (last)
		ready();
	return NULL;
}

/* Threads (detached, counted in workers) running fn(arg); how many started. */
static unsigned spawn(void *(*fn)(void *), void *arg, unsigned n)
{
	pthread_attr_t attr;
	unsigned started = 0;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (unsigned i = 0; i < n; i++) {
		pthread_t t;

		pthread_mutex_lock(&state_lock);
		workers++;
		pthread_mutex_unlock(&state_lock);
		if (pthread_create(&t, &attr, fn, arg)) {
			pthread_mutex_lock(&state_lock);
			workers--;
			pthread_mutex_unlock(&state_lock);
			break;
		}
		started++;
	}
	pthread_attr_destroy(&attr);
	return started;
}

/* ---- stopping ---- */

/*
 * A stop thread: the devices of one session unmapped (each by force), then
 * the session closed; in a handover, a block device that a request kept
 * from handover_all is handed over instead, and its session stays.
 */
static void *stop_sess_thread(void *arg)
{
	struct sess *s = arg;
	bool close_s;

	pthread_mutex_lock(&state_lock);
	for (;;) {
		struct dev *d = NULL;
		bool busy = false;

		for (unsigned i = 0; i < DEVS_MAX && !d; i++) {
			if (devs[i] && devs[i]->s == s && !devs[i]->handed) {
				if (devs[i]->busy)
					busy = true; /* a request unmaps or remaps it: wait for it */
				else
					d = devs[i];
			}
		}
		if (!d && !busy)
			break;
		if (!d) {
			pthread_cond_wait(&state_cond, &state_lock);
			continue;
		}
		if (d->ub && g.on_stop == ON_STOP_HANDOVER) {
			/*
			 * A block device handover_all could not wait for (a
			 * request held it past the grace, and refused its
			 * unmap since): handed over too, never removed by a
			 * stop that promises to keep it.
			 */
			d->handed = true;
			d->handing = true;
			pthread_mutex_unlock(&state_lock);
			ublk_dev_handover(d->ub, STOP_GRACE_MS);
			dlog(DLOG_INFO, "device %s of session %s: handed over after its request",
			     d->name, s->name);
			pthread_mutex_lock(&state_lock);
			d->handing = false;
			pthread_cond_broadcast(&state_cond); /* stop_all waits for it */
			continue;
		}
		d->busy = true;
		pthread_mutex_unlock(&state_lock);
		dev_unmap(d, true);
		dlog(DLOG_INFO, "device %s of session %s: unmapped", d->name, s->name);
		pthread_mutex_lock(&state_lock);
		dev_drop(d); /* the session is ours: not closed there */
		free(d);
	}
	close_s = sess_release(s);
	pthread_mutex_unlock(&state_lock);
	if (close_s)
		sess_destroy(s);
	pthread_mutex_lock(&state_lock);
	workers--;
	pthread_cond_broadcast(&state_cond);
	pthread_mutex_unlock(&state_lock);
	return NULL;
}

/* ms from now, for state_cond (CLOCK_REALTIME). */
static struct timespec state_deadline(uint64_t ms)
{
	struct timespec dl;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += (time_t)(ms / 1000);
	dl.tv_nsec += (long)(ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	return dl;
}

/* Waits (state_lock held) until no thread and no map is left, or ms pass: whether none is. */
static bool idle_within(unsigned ms)
{
	struct timespec dl = state_deadline(ms);

	while ((workers || maps_pending) &&
	       pthread_cond_timedwait(&state_cond, &state_lock, &dl) != ETIMEDOUT)
		;
	return !workers && !maps_pending;
}

/*
 * Unmaps everything and closes every session, within STOP_GRACE_MS +
 * STOP_ABORT_MS whatever the servers do: each session's devices on a
 * thread of its own, for up to STOP_GRACE_MS; then librtrs stops waiting
 * for the servers (rtrs_clt_shutdown_all), and what is left (a server
 * that does not answer, an open or a map in progress) fails and ends.
 * False if something was still left then.
 */
static bool stop_all(void)
{
	struct sess *open[CLT_CTL_SESS_MAX];
	unsigned n = 0, unhanded;
	bool idle;

	pthread_mutex_lock(&state_lock);
	stopping = true;
	for (unsigned i = 0; i < CLT_CTL_SESS_MAX; i++) {
		struct sess *s = sessions[i];

		/* Sessions being opened are their map's: it undoes itself. */
		if (s && !s->opening) {
			s->users++;
			open[n++] = s;
		}
	}
	pthread_mutex_unlock(&state_lock);
	for (unsigned i = 0; i < n; i++)
		if (!spawn(stop_sess_thread, open[i], 1))
			stop_sess_thread(open[i]); /* no thread: here, one after the other */
	pthread_mutex_lock(&state_lock);
	idle = idle_within(STOP_GRACE_MS);
	pthread_mutex_unlock(&state_lock);
	if (!idle)
		dlog(DLOG_WARN, "a server does not answer within %u ms (or a map is in progress): "
		     "not waiting for it any more", STOP_GRACE_MS);
	/*
	 * A handover stop never fails a block device's IO: one still busy
	 * (a remap past the grace) has not been handed over, and failing
	 * the sessions' requests would commit errors to the kernel for it.
	 * It is waited for (stop_sess_thread hands it over once its
	 * request ends), at most STOP_ABORT_MS, then left to the process's
	 * end, which the next daemon takes over as after a crash (the kernel
	 * holds its requests).
	 */
	pthread_mutex_lock(&state_lock);
	for (uint64_t end = now_ms() + STOP_ABORT_MS;;) {
		struct timespec dl;

		unhanded = 0;
		for (unsigned i = 0; g.on_stop == ON_STOP_HANDOVER && i < DEVS_MAX; i++)
			unhanded += devs[i] && devs[i]->ub && (!devs[i]->handed || devs[i]->handing);
		if (!unhanded || now_ms() >= end)
			break;
		dl = state_deadline(end - now_ms());
		pthread_cond_timedwait(&state_cond, &state_lock, &dl);
	}
	pthread_mutex_unlock(&state_lock);
	if (unhanded) {
		dlog(DLOG_WARN, "%u block device%s not handed over yet (a request holds %s): "
		     "left to the process's end, for the next daemon", unhanded,
		     unhanded == 1 ? "" : "s", unhanded == 1 ? "it" : "them");
		return false;
	}
	/* Whatever is left, or comes (a method still running), fails at once from here on. */
	rtrs_clt_shutdown_all();
	pthread_mutex_lock(&state_lock);
	idle = idle_within(STOP_ABORT_MS);
	pthread_mutex_unlock(&state_lock);
	return idle;
}

/*
 * A stop that hands the block devices over to the next daemon
 * (--on-stop handover): new maps are refused; each block device stops
 * taking requests (the kernel holds them for the next daemon) and answers
 * those it sent, waiting up to STOP_GRACE_MS in all. The devices and
 * their records stay, and so do their sessions: the process is to exit
 * without closing them (its end closes them; the server frees them once
 * their requests are answered). Then the rest stops as stop_all stops
 * it: the devices without a block device are unmapped and their sessions
 * closed. Returns how many block devices were handed over; *left, their
 * requests still unanswered (given again to the next daemon, and fenced
 * by the server); *ended, stop_all's.
 */
static unsigned handover_all(unsigned *left, bool *ended)
{
	struct dev *ds[DEVS_MAX];
	uint64_t end = now_ms() + STOP_GRACE_MS;
	unsigned n = 0;

	*left = 0;
	pthread_mutex_lock(&state_lock);
	stopping = true;
	/*
	 * A remap, an unmap (or a map's last steps) ends first: a device it
	 * leaves is handed over like the others (an unmap refused because the
	 * device is in use leaves it; the stop would have removed it).
	 */
	for (;;) {
		bool wait = false;

		for (unsigned i = 0; i < DEVS_MAX; i++)
			wait |= devs[i] && devs[i]->ub && devs[i]->busy;
		if (!wait || now_ms() >= end)
			break;
		struct timespec dl = state_deadline(end - now_ms());

		pthread_cond_timedwait(&state_cond, &state_lock, &dl);
	}
	for (unsigned i = 0; i < DEVS_MAX; i++) {
		if (devs[i] && devs[i]->ub && !devs[i]->busy) {
			devs[i]->handed = true;
			ds[n++] = devs[i];
		}
	}
	pthread_mutex_unlock(&state_lock);
	for (unsigned i = 0; i < n; i++) {
		uint64_t now = now_ms();

		*left += ublk_dev_handover(ds[i]->ub, now < end ? (unsigned)(end - now) : 0);
	}
	*ended = stop_all();
	return n;
}

/*
 * Signals, taken by sigwait in main (blocked everywhere else): these stop
 * the daemon; the others in the set would end it by default, and a
 * packaged daemon meets them (a reload's SIGHUP, a stray SIGUSR1): each is
 * logged and changes nothing.
 */
static const int stop_sigs[] = { SIGINT, SIGTERM, SIGQUIT };
static const int noted_sigs[] = { SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO,
				  SIGPWR, SIGXCPU, SIGXFSZ,
#ifdef SIGSTKFLT
				  SIGSTKFLT,
#endif
};

static bool stop_sig(int sig)
{
	for (size_t i = 0; i < sizeof(stop_sigs) / sizeof(stop_sigs[0]); i++)
		if (sig == stop_sigs[i])
			return true;
	return false;
}

static void sigs_block(sigset_t *set)
{
	sigemptyset(set);
	for (size_t i = 0; i < sizeof(stop_sigs) / sizeof(stop_sigs[0]); i++)
		sigaddset(set, stop_sigs[i]);
	for (size_t i = 0; i < sizeof(noted_sigs) / sizeof(noted_sigs[0]); i++)
		sigaddset(set, noted_sigs[i]);
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		sigaddset(set, sig);
	pthread_sigmask(SIG_BLOCK, set, NULL); /* before any thread: they all inherit it */
	signal(SIGPIPE, SIG_IGN);
}

/* "SIGHUP", or "SIGRTMIN+3". */
static const char *sig_name(int sig, char *buf, size_t len)
{
	const char *abbrev = sigabbrev_np(sig);

	if (abbrev)
		snprintf(buf, len, "SIG%s", abbrev);
	else if (sig >= SIGRTMIN && sig <= SIGRTMAX)
		snprintf(buf, len, "SIGRTMIN+%d", sig - SIGRTMIN);
	else
		snprintf(buf, len, "signal %d", sig);
	return buf;
}

int main(int argc, char **argv)
{
	struct rpc_server *srv = NULL;
	struct metrics_http *mh = NULL;
	char name[32];
	sigset_t set;
	int pos, rc, sig;
	bool ended;

	/*
	 * Signals first, and the terminating ones at their default action,
	 * whatever a library's constructor installed for them.
	 */
	for (size_t i = 0; i < sizeof(stop_sigs) / sizeof(stop_sigs[0]); i++)
		signal(stop_sigs[i], SIG_DFL);
	sigs_block(&set);
	rc = opts_parse(options, "rnbd-clientd", "[options]", argc, argv, &pos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (pos < argc) {
		fprintf(stderr, "rnbd-clientd: unexpected argument \"%s\" (see --help)\n", argv[pos]);
		return 2;
	}
	log_level = opts_log_level("rnbd-clientd",
				   g.log_level ? origin("log-level", g.log_level) : "--quiet",
				   g.log_level ? g.log_level : g.quiet ? "error" : NULL,
				   getenv("RTRS_LOG_LEVEL"), DLOG_INFO);
	if (log_level < 0)
		return 2;
	dlog_init("rnbd-clientd", log_level, g.syslog);
	rnbd_set_log_level(log_level);
	rnbd_set_log_fn(dlog_sink, NULL);
	probe_ublk();
	clt_ctl_init(&ctl, devices_fn, NULL);
	/* A session's paths are saved (client.save, the records) and opened again by sess_new. */
	ctl.max_paths = CLT_MAX_PATHS;
	nr_methods = methods_make();
	/* Read before the socket (a file that cannot be read stops the daemon), mapped after it. */
	if (g.mappings && mappings_load(&restoring))
		return 1;
	/* A copy: unrestored shares nothing with restoring, which main drops. */
	if (restoring && !(unrestored = copy(restoring))) {
		fprintf(stderr, "rnbd-clientd: mappings file %s: out of memory\n", g.mappings);
		return 1;
	}
	/* Block devices only: where ublk is not, there is nothing to hand over. */
	if (have_ublk && runtime_open())
		return 1;
	if (have_ublk)
		orphan_scan();
	recovering = have_ublk ? recover_scan() : NULL;
	if (arr_len(recovering)) {
		recover_busy = malloc(arr_len(recovering) * sizeof(*recover_busy));
		if (!recover_busy) {
			fprintf(stderr, "rnbd-clientd: out of memory\n");
			return 1;
		}
		for (size_t i = 0; i < arr_len(recovering); i++)
			recover_busy[i] = true;
	}
	rc = rpc_server_start_flags(g.control, "rnbd-clientd control", methods, nr_methods, &ctl,
				    RPC_SERVER_THREADED, &srv);
	if (rc) {
		fprintf(stderr, "rnbd-clientd: %s %s: %s\n", origin("control", g.control),
			g.control,
			rc == -EEXIST ? "exists and is not a socket; not replacing it" :
			rc == -EADDRINUSE ? "another program answers on this socket" : strerror(-rc));
		goto out;
	}
	if (g.metrics) {
		char why[256];

		rc = metrics_http_start(g.metrics, clt_ctl_metrics, &ctl, &mh, why, sizeof(why));
		if (rc) {
			fprintf(stderr, "rnbd-clientd: %s %s\n", origin("metrics", g.metrics), why);
			goto out;
		}
		printf("rnbd-clientd metrics on port %u\n", metrics_http_port(mh));
	}
	printf("rnbd-clientd ready on %s\n", g.control);
	fflush(stdout);
	dlog(DLOG_INFO, "%s", ublk_note);
	{
		size_t nr = arr_len(recovering), n = nr + arr_len(restoring);

		if (nr)
			dlog(DLOG_INFO, "taking over %zu block device%s the previous rnbd-clientd left",
			     nr, nr == 1 ? "" : "s");
		if (n - nr)
			dlog(DLOG_INFO, "mappings file %s: restoring %zu mapping%s", g.mappings, n - nr,
			     n - nr == 1 ? "" : "s");
		/*
		 * A block device to take over has a thread of its own: one whose
		 * server stays away retries for up to --recover-timeout with its
		 * IO held, and none may wait behind another's retries (16 such
		 * legs of mirrors on a dead server held every other takeover,
		 * and the file's mappings, for the whole timeout). The file's
		 * mappings share RESTORE_THREADS.
		 */
		unsigned want = (unsigned)(MIN(nr, (size_t)DEVS_MAX) +
					   MIN(n - nr, (size_t)RESTORE_THREADS)), got;
		bool last;

		pthread_mutex_lock(&state_lock);
		restorers = want;
		pthread_mutex_unlock(&state_lock);
		got = want ? spawn(restore_thread, NULL, want) : 0;
		if (want && !got)
			dlog(DLOG_ERR, "no thread to restore the mappings: %s", strerror(errno));
		pthread_mutex_lock(&state_lock);
		last = restorer_done(want - got);
		pthread_mutex_unlock(&state_lock);
		if (last && (!want || got < want))
			ready(); /* nothing to restore, or the threads that never started were the last */
	}
	for (;;) {
		if (sigwait(&set, &sig))
			continue;
		if (stop_sig(sig)) {
			sd_notify(0, "STOPPING=1");
			break;
		}
		dlog(DLOG_INFO, "%s (%s): ignored; rnbd-clientd has nothing to reload (client.map "
		     "and client.unmap change the mappings)", sig_name(sig, name, sizeof(name)),
		     strsignal(sig));
	}
	if (g.on_stop == ON_STOP_HANDOVER) {
		unsigned left, n;

		dlog(DLOG_INFO, "%s (%s), stopping: the block devices stay for the next "
		     "rnbd-clientd (--on-stop handover)", sig_name(sig, name, sizeof(name)),
		     strsignal(sig));
		n = handover_all(&left, &ended);
		metrics_http_stop(mh);
		rpc_server_stop(srv);
		if (!ended)
			dlog(DLOG_ERR, "stopping: %u threads and %u maps did not end", workers,
			     maps_pending);
		dlog(DLOG_INFO, "stopped: %u block device%s handed over to the next rnbd-clientd "
		     "(%u request%s unanswered, given to it again)", n, n == 1 ? "" : "s", left,
		     left == 1 ? "" : "s");
		fflush(NULL);
		_exit(0); /* the sessions end with the process; the devices stay */
	}
	dlog(DLOG_INFO, "%s (%s), stopping: every device is unmapped",
	     sig_name(sig, name, sizeof(name)), strsignal(sig));
	rc = 0;
out:
	ended = stop_all();
	metrics_http_stop(mh);
	rpc_server_stop(srv); /* after the methods in progress, which fail at once by now */
	if (!ended) {
		pthread_mutex_lock(&state_lock);
		ended = idle_within(1000);
		pthread_mutex_unlock(&state_lock);
	}
	if (!ended) {
		/* Never seen: a thread stuck outside librtrs. Exit without running the libraries' ends. */
		dlog(DLOG_ERR, "stopping: %u threads and %u maps did not end; exiting without them",
		     workers, maps_pending);
		fflush(NULL);
		_exit(1);
	}
	json_object_put(restoring);
	dlog(DLOG_INFO, "stopped");
	return rc ? 1 : 0;
}
