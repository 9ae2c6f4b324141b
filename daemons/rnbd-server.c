/* SPDX-License-Identifier: MIT */
/*
 * rnbd-server: exports files and block devices found below a search path
 * (and memory devices, for benchmarks) to RNBD clients.
 *
 *   rnbd-server [--config FILE] [options]
 *
 * Options come from one table, read from the config file first and then
 * from the command line (which wins). SIGINT or SIGTERM stops the server
 * after every IO in flight was answered, and removes its control socket;
 * SIGHUP checks the authentication key file again and logs the outcome.
 * With --control PATH the server listens on a Unix socket (replacing only
 * a stale socket there) for one-line commands (rnbd-ctl.h):
 *
 *   list                           every open device: session, name, counters
 *   force-close SESSION DEVICE     close a device a session has open
 *
 * and answers "ok" or "error: why".
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "opts.h"
#include "rnbd-ctl.h"
#include "rnbd.h"
#include "util.h"

static const char *const engine_names[] = { "auto", "io_uring", "threads", NULL };

static struct {
	const char *config, *addr, *provider, *search, *auth_keys, *auth_name, *control;
	const char *log_level;
	struct opt_list mem;
	uint64_t port, queue_depth, chunk_size, threads, hb_ms, busy_poll_us;
	unsigned engine;
	bool direct, invalidate, quiet;
} g = {
	.provider = "tcp", .port = RNBD_DEFAULT_PORT_NR, .queue_depth = 512,
	.chunk_size = 128 << 10, .threads = 4, .hb_ms = 1000, .invalidate = true,
};

static const struct opt options[] = {
	{ "config", 'c', OPT_CONFIG, &g.config, .arg = "FILE",
	  .help = "read options from FILE first (\"name value\" per line, see below)" },
	{ "addr", 'a', OPT_STRING, &g.addr, .arg = "ADDR", .help = "listen address (default all)" },
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N",
	  .help = "listen port (0: any, printed)" },
	{ "provider", 0, OPT_STRING, &g.provider, .arg = "NAME",
	  .help = "fabric: tcp (libfabric) or verbs (RDMA devices, rdma-core)" },
	{ "dev-search-path", 's', OPT_STRING, &g.search, .arg = "DIR",
	  .help = "export the files and block devices below DIR (none without it); "
		  "%SESSNAME% is the session's name" },
	{ "mem-device", 'm', OPT_LIST, &g.mem, .arg = "NAME:SIZE",
	  .help = "also export SIZE bytes of memory as NAME (repeatable)" },
	{ "engine", 'e', OPT_CHOICE, &g.engine, .choices = engine_names, .arg = "NAME",
	  .help = "IO engine" },
	{ "threads", 't', OPT_UINT, &g.threads, 1, 256, .arg = "N", .help = "IO pool threads" },
	{ "direct", 0, OPT_FLAG, &g.direct, .help = "open files and devices with O_DIRECT" },
	{ "queue-depth", 'q', OPT_UINT, &g.queue_depth, 1, 65535, .arg = "N",
	  .help = "requests in flight per session" },
	{ "chunk-size", 0, OPT_SIZE, &g.chunk_size, 8192, 128 << 20, .arg = "BYTES",
	  .help = "largest request plus its header" },
	{ "invalidate", 0, OPT_FLAG, &g.invalidate,
	  .help = "revoke a chunk's key while its IO is served (always_invalidate)" },
	{ "auth-keys", 0, OPT_STRING, &g.auth_keys, .arg = "FILE",
	  .help = "require DH-HMAC-CHAP; FILE maps host names to secrets" },
	{ "auth-name", 0, OPT_STRING, &g.auth_name, .arg = "NAME", .help = "this server's name" },
	{ "hb-interval", 0, OPT_UINT, &g.hb_ms, 10, 600000, .arg = "MS",
	  .help = "heartbeat period" },
	{ "busy-poll", 0, OPT_UINT, &g.busy_poll_us, 0, 1000000, .arg = "US",
	  .help = "poll an empty completion queue this long before sleeping (RDMA devices)" },
	{ "control", 0, OPT_STRING, &g.control, .arg = "PATH",
	  .help = "Unix socket for commands (list, force-close SESSION DEVICE)" },
	{ "quiet", 0, OPT_FLAG, &g.quiet, .help = "log errors only (--log-level error)" },
	{ "log-level", 0, OPT_STRING, &g.log_level, .arg = "LEVEL",
	  .help = "error, warn, info or debug (default: RTRS_LOG_LEVEL, else info)" },
	{ 0 },
};

static struct rnbd_srv *srv;
static int ctl_fd = -1;
static struct stat ctl_st; /* the socket file we made: only that one is removed */
static int log_level = LOG_INFO;

/* ---- logging: every line with its time ------------------------------------------ */

static void log_line(void *priv, int level, const char *line)
{
	struct timespec ts;
	struct tm tm;
	char when[32];

	(void)priv;
	(void)level;
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	/* One write per line, so lines from several threads do not interleave. */
	fprintf(stderr, "%s.%03ld %s\n", when, ts.tv_nsec / 1000000, line);
}

__attribute__((format(printf, 2, 3)))
static void srv_log(int level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	char line[1024];
	va_list ap;
	int n;

	if (level > log_level)
		return;
	n = snprintf(line, sizeof(line), "rnbd-server %s: ", names[level]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	log_line(NULL, level, line);
}

/* ---- control socket --------------------------------------------------------------- */

/* fd, or -1 once a write failed (timed out): the rest of the list is skipped. */
static void ctl_list_one(void *priv, const struct rnbd_srv_dev_stats *st)
{
	int *fd = priv;

	if (*fd < 0)
		return;
	if (dprintf(*fd, "%s %s id=%u mode=%s reads=%" PRIu64 " read_bytes=%" PRIu64
		    " writes=%" PRIu64 " write_bytes=%" PRIu64 " other=%" PRIu64 " errors=%" PRIu64
		    " inflight=%u%s\n", st->session, st->device, st->device_id, st->mode, st->reads,
		    st->read_bytes, st->writes, st->write_bytes, st->other, st->errors, st->inflight,
		    st->closed ? " closed" : "") < 0)
		*fd = -1;
}

/*
 * One request: up to its newline, or until the client shuts its side
 * down. Its length, or -1 after answering why there is none.
 */
static ssize_t ctl_read(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	while (n < cap && !memchr(buf, '\n', n)) {
		ssize_t k = read(fd, buf + n, cap - n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			dprintf(fd, "error: no complete line within 2 s\n");
			return -1;
		}
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	if (n == cap && !memchr(buf, '\n', n)) {
		dprintf(fd, "error: request longer than %d bytes\n", RNBD_CTL_LINE_MAX);
		return -1;
	}
	return (ssize_t)n;
}

static void ctl_command(int fd)
{
	char line[RNBD_CTL_LINE_MAX + 1];
	struct rnbd_ctl_req req;
	const char *why;
	ssize_t n = ctl_read(fd, line, sizeof(line));
	int rc;

	if (n <= 0)
		return;
	if (rnbd_ctl_parse(line, (size_t)n, &req, &why)) {
		dprintf(fd, "error: %s\n", why);
		return;
	}
	if (req.cmd == RNBD_CTL_LIST) {
		int out = fd;

		rc = rnbd_srv_list(srv, ctl_list_one, &out);
		if (out >= 0)
			dprintf(fd, "ok %d device%s\n", rc, rc == 1 ? "" : "s");
		return;
	}
	rc = rnbd_srv_force_close(srv, req.sess, req.dev);
	srv_log(rc ? LOG_WARN : LOG_INFO, "control: force-close %s %s: %s", req.sess, req.dev,
		rc ? strerror(-rc) : "done");
	if (rc)
		dprintf(fd, "error: %s\n", strerror(-rc));
	else
		dprintf(fd, "ok\n");
}

static void *ctl_thread(void *arg)
{
	for (;;) {
		struct timeval tv = { .tv_sec = 2 };
		int c = accept4(ctl_fd, NULL, NULL, SOCK_CLOEXEC);

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break;
		}
		/*
		 * A client that says nothing, or reads nothing back, does not
		 * hold the socket (or a stop, or the server's locks a list
		 * writes under). One that goes away early gets EPIPE, not the
		 * server killed by SIGPIPE (ignored in main).
		 */
		setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		ctl_command(c);
		close(c);
	}
	return NULL;
}

/*
 * Whether a server answers on the Unix socket at path: 1 yes, 0 no (a
 * stale socket file), or a negative errno when that cannot be told.
 */
static int socket_alive(const struct sockaddr_un *a)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;

	if (fd < 0)
		return -errno;
	rc = connect(fd, (const struct sockaddr *)a, sizeof(*a)) ? -errno : 1;
	close(fd);
	return rc == -ECONNREFUSED ? 0 : rc;
}

/*
 * The control socket at path. Something already there is replaced only
 * when it is a socket nobody answers on (left by a server that died): a
 * file of any other kind, or a live server's socket, is refused, so a
 * mistyped path never deletes a disk image.
 */
static int ctl_open(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int rc;

	if (strlen(path) >= sizeof(a.sun_path)) {
		fprintf(stderr, "rnbd-server: --control %s: path too long (at most %zu bytes)\n",
			path, sizeof(a.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(a.sun_path, path);
	ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ctl_fd < 0) {
		rc = -errno;
		fprintf(stderr, "rnbd-server: --control %s: %s\n", path, strerror(-rc));
		return rc;
	}
	rc = bind(ctl_fd, (struct sockaddr *)&a, sizeof(a)) ? -errno : 0;
	if (rc == -EADDRINUSE) {
		if (lstat(path, &st)) {
			rc = -errno;
			fprintf(stderr, "rnbd-server: --control %s: %s\n", path, strerror(-rc));
			goto fail;
		}
		if (!S_ISSOCK(st.st_mode)) {
			rc = -EEXIST;
			fprintf(stderr, "rnbd-server: --control %s: exists and is not a socket; not "
				"replacing it\n", path);
			goto fail;
		}
		rc = socket_alive(&a);
		if (rc) {
			rc = rc > 0 ? -EADDRINUSE : rc;
			fprintf(stderr, "rnbd-server: --control %s: %s\n", path, rc == -EADDRINUSE ?
				"another server answers on this socket" : strerror(-rc));
			goto fail;
		}
		/* A stale socket: nobody listens on it. */
		if (unlink(path) && errno != ENOENT) {
			rc = -errno;
			fprintf(stderr, "rnbd-server: --control %s: removing the stale socket: %s\n",
				path, strerror(-rc));
			goto fail;
		}
		rc = bind(ctl_fd, (struct sockaddr *)&a, sizeof(a)) ? -errno : 0;
	}
	if (!rc && listen(ctl_fd, 4))
		rc = -errno;
	if (!rc && stat(path, &ctl_st))
		rc = -errno;
	if (rc) {
		fprintf(stderr, "rnbd-server: --control %s: %s\n", path, strerror(-rc));
		goto fail;
	}
	return 0;
fail:
	close(ctl_fd);
	ctl_fd = -1;
	return rc;
}

/* Removes the control socket, if the file at its path is still ours. */
static void ctl_remove(const char *path)
{
	struct stat st;

	if (!stat(path, &st) && st.st_dev == ctl_st.st_dev && st.st_ino == ctl_st.st_ino)
		unlink(path);
}

/* ---- SIGHUP: the key file ------------------------------------------------------------- */

/*
 * librtrs reads the key file at every authentication, so a changed file
 * applies from the next one without anything reloaded; SIGHUP checks the
 * whole file now and says whether it is good, instead of the next host
 * finding out.
 */
static void reload_keys(void)
{
	int rc;

	if (!g.auth_keys) {
		srv_log(LOG_INFO, "SIGHUP: no --auth-keys file, nothing to reload");
		return;
	}
	/* Through librtrs's reader thread: a file that hangs holds up no signal. */
	rc = rnbd_srv_check_keys(srv);
	if (!rc)
		srv_log(LOG_INFO, "SIGHUP: key file %s reloaded: valid; it applies from the next "
			"authentication", g.auth_keys);
	else
		srv_log(LOG_ERR, "SIGHUP: key file %s: %s (the line is logged above); "
			"authentications fail until it is fixed", g.auth_keys, strerror(-rc));
}

/* "a:1,b:2" from the repeated --mem-device values. */
static char *join_mem(void)
{
	size_t len = 1;
	char *s;

	for (unsigned i = 0; i < g.mem.n; i++)
		len += strlen(g.mem.items[i]) + 1;
	s = calloc(1, len);
	for (unsigned i = 0; s && i < g.mem.n; i++) {
		if (i)
			strcat(s, ",");
		strcat(s, g.mem.items[i]);
	}
	return s;
}

int main(int argc, char **argv)
{
	struct rnbd_srv_opts o;
	pthread_t th;
	sigset_t set;
	char *mem = NULL;
	int pos, rc, sig, port;

	rc = opts_parse(options, "rnbd-server", "[options]", argc, argv, &pos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (pos < argc) {
		fprintf(stderr, "rnbd-server: unexpected argument \"%s\" (see --help)\n", argv[pos]);
		return 2;
	}
	/* --log-level, then --quiet, then RTRS_LOG_LEVEL, then info. */
	log_level = opts_log_level("rnbd-server", g.log_level ? "--log-level" : "--quiet",
				   g.log_level ? g.log_level : g.quiet ? "error" : NULL,
				   getenv("RTRS_LOG_LEVEL"), LOG_INFO);
	if (log_level < 0)
		return 2;
	rnbd_set_log_level(log_level);
	rnbd_set_log_fn(log_line, NULL);
	if (g.mem.n && !(mem = join_mem()))
		return 1;
	rnbd_srv_opts_init(&o, sizeof(o));
	o.rtrs.addr = g.addr;
	o.rtrs.port = (uint16_t)g.port;
	o.rtrs.provider = g.provider;
	o.rtrs.queue_depth = (uint32_t)g.queue_depth;
	o.rtrs.max_chunk_size = (uint32_t)g.chunk_size;
	o.rtrs.always_invalidate = g.invalidate;
	o.rtrs.auth_keys_file = g.auth_keys;
	o.rtrs.auth_name = g.auth_name;
	o.rtrs.hb_interval_ms = (unsigned)g.hb_ms;
	o.rtrs.busy_poll_us = (unsigned)g.busy_poll_us;
	o.dev_search_path = g.search;
	o.mem_devices = mem;
	o.engine = engine_names[g.engine];
	o.engine_threads = (unsigned)g.threads;
	o.direct = g.direct;

	/*
	 * Signals go to sigwait below, not to library threads. A control
	 * client that leaves early must not kill the server with SIGPIPE.
	 */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	/* The control socket first: a bad path fails before anyone connects. */
	if (g.control && ctl_open(g.control)) {
		free(mem);
		return 1;
	}
	rc = rnbd_srv_open(&o, &srv);
	if (rc) {
		fprintf(stderr, "rnbd-server: cannot start: %s\n", strerror(-rc));
		goto fail;
	}
	port = rnbd_srv_port(srv, 30000);
	if (port < 0) {
		fprintf(stderr, "rnbd-server: not listening: %s\n", strerror(-port));
		rnbd_srv_close(srv);
		goto fail;
	}
	if (g.control && (rc = pthread_create(&th, NULL, ctl_thread, NULL))) {
		fprintf(stderr, "rnbd-server: control thread: %s\n", strerror(rc));
		rnbd_srv_close(srv);
		goto fail;
	}
	printf("rnbd-server listening on port %d\n", port);
	fflush(stdout);
	for (;;) {
		if (sigwait(&set, &sig))
			continue;
		if (sig != SIGHUP)
			break;
		reload_keys();
	}
	srv_log(LOG_INFO, "%s, stopping", strsignal(sig));
	if (g.control) {
		shutdown(ctl_fd, SHUT_RDWR); /* wakes accept() */
		pthread_join(th, NULL);
		close(ctl_fd);
		ctl_remove(g.control);
	}
	rnbd_srv_close(srv);
	free(mem);
	return 0;
fail:
	if (g.control) {
		close(ctl_fd);
		ctl_remove(g.control);
	}
	free(mem);
	return 1;
}
