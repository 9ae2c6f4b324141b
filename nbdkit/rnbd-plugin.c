/* SPDX-License-Identifier: MIT */
/*
 * nbdkit-rnbd-plugin: serves RNBD devices as NBD exports, so that qemu-img,
 * nbdcopy, nbdinfo, nbdfuse and fio's nbd engine use them unchanged.
 *
 *   nbdkit rnbd server=[SRC@]HOST[:PORT] [server=...] session=NAME [device=NAME]
 *
 * The export name is the device name (a path below the RNBD server's
 * search path); device= names the default export. One RNBD session serves
 * every NBD connection; connections to the same export share one mapping,
 * so writes, flushes and reads agree across them (multi-conn). More
 * server= keys add paths to the session.
 *
 * Other keys (rnbd-params.c, which checks each; the session's come from
 * the client front ends' table, lib/front/clt-opts.c, with its names and
 * defaults): port (1234), provider (tcp), mode (rw | ro | migration),
 * io_connections, policy, hb_interval_ms, fast_io_fail_ms (how long IO
 * waits for a path), reconnect_delay_ms, reconnect_jitter_ms,
 * reconnect_loss_timeout_ms, max_reconnect_attempts, busy_poll_us, secret,
 * ctrl_secret, host_name, server_name (DH-HMAC-CHAP, see rtrs.h; secrets as
 * "@FILE" keep them off the command line), log_level.
 *
 * Before nbdkit forks into the background (get_ready) the plugin connects
 * once and maps device= read-only, so a wrong server, key or device makes
 * nbdkit exit non-zero with the reason instead of dying unseen.
 */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clt-ctl.h"
#include "metrics.h"
#include "opts.h"
#include "rnbd-params.h"
#include "rnbd-path.h"
#include "rnbd.h"
#include "util.h"

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct rnbd_plugin_cfg cfg;
static struct rnbd_clt_sess *sess;
static struct clt_ctl ctl;          /* control=: the session and the exports, managed */
static struct rpc_server *ctl_srv;
static struct metrics_http *mhttp;  /* metrics= */

/*
 * A mapped device and the connections using it. Its map, a remap and its
 * unmap make round trips to the server (a map may wait for a reconnecting
 * session): they run without exports_lock, the export listed as busy
 * meanwhile; another open of the same name waits on exports_cond for it,
 * opens of other names and client.devices go on.
 */
enum export_state {
	EX_OPENING,   /* the map: dev not set yet */
	EX_LIVE,
	EX_REOPENING, /* the server had closed it: opened again for a new connection */
	EX_CLOSING,   /* the last connection closed: the unmap */
};

struct export {
	struct export *next;
	char *name;
	struct rnbd_clt_dev *dev;
	enum rnbd_clt_mode mode;
	struct rnbd_clt_dev_info info;
	unsigned refs;
	enum export_state state;
};

static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t exports_cond = PTHREAD_COND_INITIALIZER;
static struct export *exports;

struct handle {
	struct export *e;
	int readonly;
};

static void log_to_nbdkit(void *priv, int level, const char *line)
{
	if (level <= 1)
		nbdkit_error("%s", line);
	else
		nbdkit_debug("%s", line);
}

static void rnbd_load(void)
{
	rnbd_plugin_cfg_init(&cfg);
}

/* Every key through the table in rnbd-params.c, which names the key in its errors. */
static int rnbd_config(const char *key, const char *value)
{
	char err[512];

	if (rnbd_plugin_cfg_set(&cfg, key, value, err, sizeof(err))) {
		nbdkit_error("%s", err);
		return -1;
	}
	return 0;
}

static int rnbd_config_complete(void)
{
	char err[256];

	if (rnbd_plugin_cfg_complete(&cfg, err, sizeof(err))) {
		nbdkit_error("%s", err);
		return -1;
	}
	/*
	 * log_level=, else RTRS_LOG_LEVEL, else info (info lines are nbdkit
	 * debug lines: shown with -v).
	 */
	if (cfg.clt.log_level < 0) {
		const char *env = getenv("RTRS_LOG_LEVEL");

		cfg.clt.log_level = env ? opts_log_level_parse(env) : 2;
		if (cfg.clt.log_level < 0) {
			nbdkit_error("RTRS_LOG_LEVEL=%s: expected error, warn, info or debug", env);
			return -1;
		}
	}
	return 0;
}

/* The session of cfg; 0, or nbdkit_error said why. */
/* Why a call of the libraries failed: their reason, else the errno's. */
static const char *why_failed(int rc)
{
	return rtrs_last_error()[0] ? rtrs_last_error() : strerror(-rc);
}

static int session_open(struct rnbd_clt_sess **out)
{
	struct rtrs_clt_opts o = cfg.clt.opts;
	int rc;

	rnbd_set_log_fn(log_to_nbdkit, NULL);
	rnbd_set_log_level(cfg.clt.log_level);
	rc = rnbd_clt_sess_open(&o, out);
	if (rc == -EPERM)
		nbdkit_error("session %s to %s: the server has a session of this name open "
			     "(another client uses it; choose another session=)", o.sessname,
			     o.paths[0].dst);
	else if (rc)
		nbdkit_error("session %s to %s: %s", o.sessname, o.paths[0].dst, why_failed(rc));
	return rc;
}

/* client.devices: the exports mapped now. */
static int ctl_devices(void *priv, struct json_object *arr)
{
	int rc = 0;

	pthread_mutex_lock(&exports_lock);
	for (struct export *e = exports; e && !rc; e = e->next) {
		struct rnbd_clt_dev_info in = { .size = sizeof(in) };
		struct json_object *o;
		static const char *const modes[] = { "ro", "rw", "migration" };

		/* Mapped, and not going: its device is not freed under this. */
		if (e->state != EX_LIVE && e->state != EX_REOPENING)
			continue;
		o = json_object_new_object();
		rnbd_clt_dev_info(e->dev, &in);
		if (!o || json_object_object_add(o, "session",
						 json_object_new_string(cfg.clt.opts.sessname)) ||
		    json_object_object_add(o, "device", json_object_new_string(e->name)) ||
		    json_object_object_add(o, "mode", json_object_new_string(modes[e->mode % 3])) ||
		    json_object_object_add(o, "bytes", json_object_new_uint64(in.bytes)) ||
		    json_object_object_add(o, "state", json_object_new_string(in.state ? in.state :
									      "")) ||
		    json_object_object_add(o, "connections", json_object_new_uint64(e->refs)) ||
		    json_object_array_add(arr, o)) {
			json_object_put(o);
			rc = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&exports_lock);
	return rc;
}

static int metrics_start(void)
{
	char why[256];
	int rc = metrics_http_start(cfg.metrics, clt_ctl_metrics, &ctl, &mhttp, why, sizeof(why));

	if (rc)
		nbdkit_error("metrics=%s", why);
	return rc;
}

static int ctl_start(void)
{
	int rc = rpc_server_start(cfg.control, "nbdkit-rnbd control", clt_ctl_methods,
				  clt_ctl_nr_methods, &ctl, &ctl_srv);

	if (rc)
		nbdkit_error("control=%s: %s", cfg.control,
			     rc == -EEXIST ? "exists and is not a socket; not replacing it" :
			     rc == -EADDRINUSE ? "another program answers on this socket" :
			     strerror(-rc));
	return rc;
}

/*
 * Before nbdkit forks into the background, while its errors still reach
 * the user and make it exit non-zero: connect (and authenticate) once, and
 * map the default device read-only, so a wrong server, key or device stops
 * nbdkit here instead of in a background process nobody watches. The
 * session is closed again (its threads end: nbdkit forks after this) and
 * opened for good in after_fork.
 */
static int rnbd_get_ready(void)
{
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	int rc;

	if (session_open(&s))
		return -1;
	if (cfg.device) {
		rc = rnbd_clt_map(s, cfg.device, RNBD_CLT_RO, &d);
		if (rc) {
			nbdkit_error("device=%s: %s", cfg.device, why_failed(rc));
			rnbd_clt_sess_close(s);
			return -1;
		}
		rnbd_clt_unmap(d, true);
	}
	rnbd_clt_sess_close(s);
	/* The control socket's path is checked here too (made and removed again). */
	if (cfg.control) {
		if (ctl_start())
			return -1;
		rpc_server_stop(ctl_srv);
		ctl_srv = NULL;
	}
	/* And the metrics' address (bound and let go again). */
	if (cfg.metrics) {
		clt_ctl_init(&ctl, ctl_devices, NULL);
		if (metrics_start())
			return -1;
		metrics_http_stop(mhttp);
		mhttp = NULL;
	}
	return 0;
}

/*
 * After nbdkit forked into the background: the session's threads live
 * here. The check session of get_ready had the same name and may still be
 * closing on the server (-EPERM meanwhile): retry for a few seconds.
 */
static int rnbd_after_fork(void)
{
	uint64_t end = now_ms() + 5000;

	for (;;) {
		int rc = session_open(&sess);

		if (rc == -EPERM && now_ms() <= end) {
			usleep(50000);
			continue;
		}
		if (rc)
			return -1;
		break;
	}
	if (!cfg.control && !cfg.metrics)
		return 0;
	clt_ctl_init(&ctl, ctl_devices, NULL);
	if (clt_ctl_add(&ctl, cfg.clt.opts.sessname, sess) ||
	    (cfg.control && ctl_start()) || (cfg.metrics && metrics_start()))
		return -1;
	return 0;
}

static void rnbd_cleanup(void)
{
	metrics_http_stop(mhttp);
	mhttp = NULL;
	rpc_server_stop(ctl_srv); /* no method runs after this */
	ctl_srv = NULL;
	rnbd_clt_sess_close(sess); /* unmaps what is left */
	sess = NULL;
}

static const char *rnbd_default_export(int readonly, int is_tls)
{
	return cfg.device ? cfg.device : "";
}

static int rnbd_list_exports(int readonly, int is_tls, struct nbdkit_exports *exps)
{
	return cfg.device ? nbdkit_add_export(exps, cfg.device, NULL) : 0;
}

/*
 * rnbd_clt_dev_info, or a failure when RNBD_PLUGIN_FAULT_DEV_INFO is set
 * (tests: the error path after a successful map must unmap).
 */
static int dev_info(struct rnbd_clt_dev *d, struct rnbd_clt_dev_info *in)
{
	if (getenv("RNBD_PLUGIN_FAULT_DEV_INFO")) {
		nbdkit_debug("fault injection: device info fails");
		return -EIO;
	}
	return rnbd_clt_dev_info(d, in);
}

/* Whether the server closed e's device (force-closed by its admin); exports_lock held. */
static bool export_closed(struct export *e)
{
	struct rnbd_clt_dev_info info = { .size = sizeof(info) };

	return !rnbd_clt_dev_info(e->dev, &info) && !strcmp(info.state, "closed");
}

/*
 * Whether e's device is still what its connections were told when it was
 * mapped: size, mode and logical block size. A remap (after the server
 * closed it, or librnbd's after a new server session: a server restarted
 * with --direct has 4096-byte blocks where it had 512) may have changed
 * them; the connections that share it keep what they were told, and a new
 * one is not served under them. 0, -ESTALE, or dev_info's error.
 */
static int export_unchanged(struct export *e)
{
	struct rnbd_clt_dev_info info = { .size = sizeof(info) };
	int rc = rnbd_clt_dev_info(e->dev, &info);

	if (!rc && (info.bytes != e->info.bytes || info.read_only != e->info.read_only ||
		    info.logical_block_size != e->info.logical_block_size))
		rc = -ESTALE;
	return rc;
}

/*
 * A device the server closed is opened again for a new connection, as a
 * new map would (e busy, exports_lock not held): the connections sharing
 * it would otherwise keep failing with -ENOTCONN until the last of them
 * closed. 0, or the remap's error.
 */
static int export_reopen_closed(struct export *e)
{
	int rc;

	rc = rnbd_clt_remap(e->dev);
	if (rc == -EALREADY)
		return 0;
	if (rc)
		return rc;
	nbdkit_debug("%s: the server had closed it; opened again", e->name);
	return 0;
}

static void export_put(struct export *e);

/* e off the list; exports_lock held. */
static void export_unlist(struct export *e)
{
	for (struct export **pp = &exports; *pp; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	}
}

/*
 * e's device mapped (exports_lock not held: round trips), with its info;
 * 0, or nbdkit_error said why and nothing is left mapped.
 */
static int export_map(struct export *e)
{
	int rc = rnbd_clt_map(sess, e->name, e->mode, &e->dev);

	if (rc) {
		nbdkit_error("mapping %s: %s", e->name, why_failed(rc));
		return rc;
	}
	e->info.size = sizeof(e->info);
	rc = dev_info(e->dev, &e->info);
	if (rc) {
		/* Mapped, but unusable without its limits: give it back. */
		int urc = rnbd_clt_unmap(e->dev, true);

		nbdkit_error("mapping %s: device info: %s%s%s", e->name, strerror(-rc),
			     urc ? "; unmapping it: " : "", urc ? strerror(-urc) : "");
	}
	return rc;
}

static void *rnbd_open(int readonly)
{
	const char *asked = nbdkit_export_name();
	enum rnbd_clt_mode want = readonly ? RNBD_CLT_RO : (enum rnbd_clt_mode)cfg.mode;
	struct handle *h;
	struct export *e;
	char *name;
	int rc;

	if (!asked || !*asked)
		asked = cfg.device;
	if (!asked) {
		nbdkit_error("no export name and no device= default");
		return NULL;
	}
	/* As librnbd names devices: "/vol1", "vol1/" and "vol1" share one mapping. */
	name = strdup(asked);
	h = calloc(1, sizeof(*h));
	if (!h || !name) {
		nbdkit_error("out of memory");
		free(h);
		free(name);
		return NULL;
	}
	rnbd_dev_name_normalize(name);
	pthread_mutex_lock(&exports_lock);
	for (;;) {
		for (e = exports; e && strcmp(e->name, name); e = e->next)
			;
		if (!e || e->state == EX_LIVE)
			break;
		/* Its map, remap or unmap is under way: looked up again after it. */
		pthread_cond_wait(&exports_cond, &exports_lock);
	}
	if (e && e->mode == RNBD_CLT_RO && want != RNBD_CLT_RO) {
		pthread_mutex_unlock(&exports_lock);
		nbdkit_error("%s is mapped read-only by another connection", name);
		free(name);
		free(h);
		return NULL;
	}
	if (e) {
		free(name);
		name = NULL;
		e->refs++;
		bool closed = export_closed(e);

		rc = 0;
		if (closed) {
			e->state = EX_REOPENING;
			pthread_mutex_unlock(&exports_lock);
			rc = export_reopen_closed(e);
			pthread_mutex_lock(&exports_lock);
			e->state = EX_LIVE;
			pthread_cond_broadcast(&exports_cond);
		}
		if (!rc)
			rc = export_unchanged(e);
		pthread_mutex_unlock(&exports_lock);
		if (rc) {
			if (rc == -ESTALE)
				nbdkit_error("%s: it changed (size, mode or block size) since the "
					     "connections that share it were told%s: they must close "
					     "first", e->name,
					     closed ? " (the server closed it)" : "");
			else
				nbdkit_error("%s: %s%s", e->name, closed ? "the server closed it, "
					     "and " : "", why_failed(rc));
			export_put(e); /* the last reference if they closed meanwhile */
			free(h);
			return NULL;
		}
	} else {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&exports_lock);
			nbdkit_error("out of memory");
			free(name);
			free(h);
			return NULL;
		}
		e->name = name;
		e->mode = want;
		e->refs = 1;
		e->state = EX_OPENING;
		e->next = exports;
		exports = e;
		pthread_mutex_unlock(&exports_lock);
		rc = export_map(e);
		pthread_mutex_lock(&exports_lock);
		if (rc)
			export_unlist(e);
		else
			e->state = EX_LIVE;
		pthread_cond_broadcast(&exports_cond);
		pthread_mutex_unlock(&exports_lock);
		if (rc) {
			free(e->name);
			free(e);
			free(h);
			return NULL;
		}
	}
	h->e = e;
	h->readonly = readonly || e->info.read_only;
	return h;
}

static void rnbd_close(void *handle)
{
	struct handle *h = handle;

	export_put(h->e);
	free(h);
}

/* A connection's reference to e dropped; the last one unmaps it. */
static void export_put(struct export *e)
{
	bool last;

	pthread_mutex_lock(&exports_lock);
	last = --e->refs == 0;
	if (last)
		e->state = EX_CLOSING; /* an open of its name waits for the unmap */
	pthread_mutex_unlock(&exports_lock);
	if (last) {
		rnbd_clt_unmap(e->dev, true);
		pthread_mutex_lock(&exports_lock);
		export_unlist(e);
		pthread_cond_broadcast(&exports_cond);
		pthread_mutex_unlock(&exports_lock);
		free(e->name);
		free(e);
	}
}

static int64_t rnbd_get_size(void *handle)
{
	return (int64_t)((struct handle *)handle)->e->info.bytes;
}

static int rnbd_block_size(void *handle, uint32_t *minimum, uint32_t *preferred,
			   uint32_t *maximum)
{
	const struct rnbd_clt_dev_info *in = &((struct handle *)handle)->e->info;

	*minimum = in->logical_block_size;
	*preferred = in->physical_block_size > 4096 ? in->physical_block_size : 4096;
	*maximum = 32u << 20; /* larger requests are split below anyway */
	return 0;
}

static int rnbd_can_write(void *handle)
{
	return !((struct handle *)handle)->readonly;
}

static int rnbd_can_flush(void *handle)
{
	return 1;
}

static int rnbd_can_fua(void *handle)
{
	return ((struct handle *)handle)->e->info.fua ? NBDKIT_FUA_NATIVE : NBDKIT_FUA_EMULATE;
}

static int rnbd_can_trim(void *handle)
{
	return ((struct handle *)handle)->e->info.discard;
}

static int rnbd_can_zero(void *handle)
{
	return ((struct handle *)handle)->e->info.write_zeroes;
}

/*
 * Whether zeroing is fast depends on the server's file system or device
 * (fallocate or BLKZEROOUT may write zeros); not known here, so no.
 */
static int rnbd_can_fast_zero(void *handle)
{
	return 0;
}

/* Every connection shares the mapping, and flush is whole-device on the server. */
static int rnbd_can_multi_conn(void *handle)
{
	return 1;
}

/*
 * The errno an NBD client gets for ours: NBD has a few codes (EPERM, EIO,
 * ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN) and nbdkit sends
 * EINVAL for any other, which would tell the client that its request was
 * wrong; a device the server closed (ENOTCONN), one unmapped (ENODEV), no
 * path (ETIMEDOUT, ECONNABORTED) are the device's failure: EIO, as a block
 * device's would be. nbdkit's log keeps ours.
 */
static int nbd_errno(int err)
{
	switch (err) {
	case EPERM:
	case EROFS:
	case EIO:
	case ENOMEM:
	case EINVAL:
	case ENOSPC:
	case EDQUOT:
	case EFBIG:
	case EOVERFLOW:
	case EOPNOTSUPP:
	case ESHUTDOWN:
		return err;
	default:
		return EIO;
	}
}

/* One IO; nbdkit's error from ours. */
static int do_io(void *handle, enum rnbd_clt_op op, uint32_t flags, uint64_t offset, void *buf,
		 uint32_t count)
{
	struct handle *h = handle;
	uint32_t lbs = h->e->info.logical_block_size;
	int rc;

	if (op != RNBD_CLT_FLUSH && (offset % lbs || count % lbs)) {
		nbdkit_error("%s: request %llu+%u is not aligned to %u-byte blocks", h->e->name,
			     (unsigned long long)offset, count, lbs);
		nbdkit_set_error(EINVAL);
		return -1;
	}
	rc = rnbd_clt_io(h->e->dev, op, flags, offset, buf, count);
	if (rc) {
		nbdkit_error("%s: IO at %llu+%u: %s%s", h->e->name, (unsigned long long)offset,
			     count, strerror(-rc), rc == -ENOTCONN ? " (the server closed the device)"
			     : "");
		nbdkit_set_error(nbd_errno(-rc));
		return -1;
	}
	return 0;
}

static uint32_t fua(uint32_t flags)
{
	return flags & NBDKIT_FLAG_FUA ? RNBD_CLT_F_FUA : 0;
}

static int rnbd_pread(void *handle, void *buf, uint32_t count, uint64_t offset, uint32_t flags)
{
	return do_io(handle, RNBD_CLT_READ, 0, offset, buf, count);
}

static int rnbd_pwrite(void *handle, const void *buf, uint32_t count, uint64_t offset,
		       uint32_t flags)
{
	return do_io(handle, RNBD_CLT_WRITE, fua(flags), offset, (void *)buf, count);
}

static int rnbd_flush(void *handle, uint32_t flags)
{
	return do_io(handle, RNBD_CLT_FLUSH, 0, 0, NULL, 0);
}

static int rnbd_trim(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
	return do_io(handle, RNBD_CLT_DISCARD, fua(flags), offset, NULL, count);
}

static int rnbd_zero(void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
	uint32_t f = fua(flags) | (flags & NBDKIT_FLAG_MAY_TRIM ? 0 : RNBD_CLT_F_NOUNMAP);

	return do_io(handle, RNBD_CLT_WRITE_ZEROES, f, offset, NULL, count);
}

static struct nbdkit_plugin plugin = {
	.name = "rnbd",
	.longname = "RNBD devices over RTRS (librnbd)",
	.version = RTRS_PROJECT_VERSION,
	.description = "Serves remote RNBD devices as NBD exports; the export name is the device.",
	.load = rnbd_load,
	.config = rnbd_config,
	.config_complete = rnbd_config_complete,
	.magic_config_key = "server",
	.get_ready = rnbd_get_ready,
	.after_fork = rnbd_after_fork,
	.cleanup = rnbd_cleanup,
	.default_export = rnbd_default_export,
	.list_exports = rnbd_list_exports,
	.open = rnbd_open,
	.close = rnbd_close,
	.get_size = rnbd_get_size,
	.block_size = rnbd_block_size,
	.can_write = rnbd_can_write,
	.can_flush = rnbd_can_flush,
	.can_fua = rnbd_can_fua,
	.can_trim = rnbd_can_trim,
	.can_zero = rnbd_can_zero,
	.can_fast_zero = rnbd_can_fast_zero,
	.can_multi_conn = rnbd_can_multi_conn,
	.pread = rnbd_pread,
	.pwrite = rnbd_pwrite,
	.flush = rnbd_flush,
	.trim = rnbd_trim,
	.zero = rnbd_zero,
	.errno_is_preserved = 0,
};

/* The help text comes from the parameter table; set when the plugin is loaded. */
__attribute__((constructor)) static void set_config_help(void)
{
	plugin.config_help = rnbd_plugin_cfg_help();
}

/* Declared first: NBDKIT_REGISTER_PLUGIN defines it without a prototype. */
struct nbdkit_plugin *plugin_init(void);
NBDKIT_REGISTER_PLUGIN(plugin)
