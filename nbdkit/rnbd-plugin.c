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
 * Other keys: port (1234), provider (tcp), mode (rw | ro | migration),
 * io_connections, fast_io_fail_ms (how long IO waits for a path),
 * reconnect_delay_ms, secret, ctrl_secret, host_name, server_name
 * (DH-HMAC-CHAP, see rtrs.h; secrets as "@FILE" keep them off the command
 * line).
 */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rnbd.h"

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#define MAX_PATHS 8

static struct rtrs_path_addr paths[MAX_PATHS];
static unsigned npaths;
static const char *session = "nbdkit-rnbd";
static const char *device;
static const char *provider = "tcp";
static enum rnbd_clt_mode mode = RNBD_CLT_RW;
static unsigned port = RNBD_DEFAULT_PORT_NR, io_cons, fast_io_fail_ms = 30000;
static unsigned reconnect_delay_ms = 500;
static const char *secret, *ctrl_secret, *host_name, *server_name;

static struct rnbd_clt_sess *sess;

/* A mapped device and the connections using it. */
struct export {
	struct export *next;
	char *name;
	struct rnbd_clt_dev *dev;
	enum rnbd_clt_mode mode;
	struct rnbd_clt_dev_info info;
	unsigned refs;
};

static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;
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

static int parse_uint(const char *key, const char *value, unsigned *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(value, &end, 10);
	if (errno || !*value || *end || v > 0xffffffffUL) {
		nbdkit_error("%s=%s: expected a number", key, value);
		return -1;
	}
	*out = (unsigned)v;
	return 0;
}

static int rnbd_config(const char *key, const char *value)
{
	if (!strcmp(key, "server")) {
		if (npaths == MAX_PATHS) {
			nbdkit_error("at most %d server= paths", MAX_PATHS);
			return -1;
		}
		/* [SRC@]HOST[:PORT]: a source address picks the link. */
		const char *at = strchr(value, '@');

		if (at) {
			char *src = strndup(value, (size_t)(at - value));

			if (!src) {
				nbdkit_error("out of memory");
				return -1;
			}
			paths[npaths].src = src;
			value = at + 1;
		}
		paths[npaths++].dst = value;
	} else if (!strcmp(key, "session")) {
		session = value;
	} else if (!strcmp(key, "device")) {
		device = value;
	} else if (!strcmp(key, "provider")) {
		provider = value;
	} else if (!strcmp(key, "mode")) {
		if (!strcmp(value, "rw"))
			mode = RNBD_CLT_RW;
		else if (!strcmp(value, "ro"))
			mode = RNBD_CLT_RO;
		else if (!strcmp(value, "migration"))
			mode = RNBD_CLT_MIGRATION;
		else {
			nbdkit_error("mode=%s: expected rw, ro or migration", value);
			return -1;
		}
	} else if (!strcmp(key, "port")) {
		if (parse_uint(key, value, &port) || port > 65535)
			return -1;
	} else if (!strcmp(key, "io_connections")) {
		return parse_uint(key, value, &io_cons);
	} else if (!strcmp(key, "fast_io_fail_ms")) {
		return parse_uint(key, value, &fast_io_fail_ms);
	} else if (!strcmp(key, "reconnect_delay_ms")) {
		return parse_uint(key, value, &reconnect_delay_ms);
	} else if (!strcmp(key, "secret")) {
		secret = value;
	} else if (!strcmp(key, "ctrl_secret")) {
		ctrl_secret = value;
	} else if (!strcmp(key, "host_name")) {
		host_name = value;
	} else if (!strcmp(key, "server_name")) {
		server_name = value;
	} else {
		nbdkit_error("unknown parameter %s", key);
		return -1;
	}
	return 0;
}

static int rnbd_config_complete(void)
{
	if (!npaths) {
		nbdkit_error("server=HOST[:PORT] is required");
		return -1;
	}
	return 0;
}

/* After nbdkit forked into the background: the session's threads live here. */
static int rnbd_after_fork(void)
{
	struct rtrs_clt_opts o;
	int rc;

	rnbd_set_log_fn(log_to_nbdkit, NULL);
	rnbd_set_log_level(2); /* info lines are nbdkit debug lines: shown with -v */
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = session;
	o.paths = paths;
	o.paths_num = npaths;
	o.port = (uint16_t)port;
	o.provider = provider;
	o.nr_io_cons = io_cons;
	o.fast_io_fail_ms = fast_io_fail_ms;
	o.reconnect_delay_ms = reconnect_delay_ms;
	o.reconnect_jitter_ms = reconnect_delay_ms / 2;
	o.auth_secret = secret;
	o.auth_ctrl_secret = ctrl_secret;
	o.auth_host_name = host_name;
	o.auth_server_name = server_name;
	rc = rnbd_clt_sess_open(&o, &sess);
	if (rc) {
		nbdkit_error("session %s to %s: %s", session, paths[0].dst, strerror(-rc));
		return -1;
	}
	return 0;
}

static void rnbd_cleanup(void)
{
	rnbd_clt_sess_close(sess); /* unmaps what is left */
	sess = NULL;
}

static void rnbd_unload(void)
{
	for (unsigned i = 0; i < npaths; i++)
		free((char *)paths[i].src);
}

static const char *rnbd_default_export(int readonly, int is_tls)
{
	return device ? device : "";
}

static int rnbd_list_exports(int readonly, int is_tls, struct nbdkit_exports *exps)
{
	return device ? nbdkit_add_export(exps, device, NULL) : 0;
}

static void *rnbd_open(int readonly)
{
	const char *name = nbdkit_export_name();
	enum rnbd_clt_mode want = readonly ? RNBD_CLT_RO : mode;
	struct handle *h;
	struct export *e;
	int rc;

	if (!name || !*name)
		name = device;
	if (!name) {
		nbdkit_error("no export name and no device= default");
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		nbdkit_error("out of memory");
		return NULL;
	}
	pthread_mutex_lock(&exports_lock);
	for (e = exports; e && strcmp(e->name, name); e = e->next)
		;
	if (e && e->mode == RNBD_CLT_RO && want != RNBD_CLT_RO) {
		pthread_mutex_unlock(&exports_lock);
		nbdkit_error("%s is mapped read-only by another connection", name);
		free(h);
		return NULL;
	}
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (e)
			e->name = strdup(name);
		if (!e || !e->name) {
			pthread_mutex_unlock(&exports_lock);
			nbdkit_error("out of memory");
			if (e)
				free(e);
			free(h);
			return NULL;
		}
		rc = rnbd_clt_map(sess, name, want, &e->dev);
		e->info.size = sizeof(e->info);
		if (!rc)
			rc = rnbd_clt_dev_info(e->dev, &e->info);
		if (rc) {
			pthread_mutex_unlock(&exports_lock);
			nbdkit_error("mapping %s: %s", name, strerror(-rc));
			free(e->name);
			free(e);
			free(h);
			return NULL;
		}
		e->mode = want;
		e->next = exports;
		exports = e;
	}
	e->refs++;
	pthread_mutex_unlock(&exports_lock);
	h->e = e;
	h->readonly = readonly || e->info.read_only;
	return h;
}

static void rnbd_close(void *handle)
{
	struct handle *h = handle;
	struct export *e = h->e;

	pthread_mutex_lock(&exports_lock);
	if (--e->refs == 0) {
		for (struct export **pp = &exports; *pp; pp = &(*pp)->next) {
			if (*pp == e) {
				*pp = e->next;
				break;
			}
		}
		rnbd_clt_unmap(e->dev, true);
		free(e->name);
		free(e);
	}
	pthread_mutex_unlock(&exports_lock);
	free(h);
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
		nbdkit_error("%s: IO at %llu+%u: %s", h->e->name, (unsigned long long)offset,
			     count, strerror(-rc));
		nbdkit_set_error(-rc);
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
	.version = "0.1",
	.description = "Serves remote RNBD devices as NBD exports; the export name is the device.",
	.unload = rnbd_unload,
	.config = rnbd_config,
	.config_complete = rnbd_config_complete,
	.config_help = "server=[SRC@]HOST[:PORT] (repeat for paths), session=NAME, device=NAME, "
		       "port, provider, mode=rw|ro|migration, io_connections, fast_io_fail_ms, "
		       "reconnect_delay_ms, secret, ctrl_secret, host_name, server_name",
	.magic_config_key = "server",
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

/* Declared first: NBDKIT_REGISTER_PLUGIN defines it without a prototype. */
struct nbdkit_plugin *plugin_init(void);
NBDKIT_REGISTER_PLUGIN(plugin)
