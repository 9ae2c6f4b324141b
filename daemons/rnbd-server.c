/* SPDX-License-Identifier: MIT */
/*
 * rnbd-server: exports files and block devices found below a search path
 * (and memory devices, for benchmarks) to RNBD clients.
 *
 *   rnbd-server [--config FILE] [options]
 *
 * Options come from one table, read from the config file first and then
 * from the command line (which wins). SIGINT or SIGTERM stops the server
 * after every IO in flight was answered. With --control PATH the server
 * listens on a Unix socket for one-line commands:
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "opts.h"
#include "rnbd.h"
#include "util.h"

static const char *const engine_names[] = { "auto", "io_uring", "threads", NULL };

static struct {
	const char *config, *addr, *provider, *search, *auth_keys, *auth_name, *control;
	struct opt_list mem;
	uint64_t port, queue_depth, chunk_size, threads, hb_ms;
	unsigned engine;
	bool direct, invalidate, quiet;
} g = {
	.provider = "tcp", .search = "/", .port = RNBD_DEFAULT_PORT_NR, .queue_depth = 512,
	.chunk_size = 128 << 10, .threads = 4, .hb_ms = 1000, .invalidate = true,
};

static const struct opt options[] = {
	{ "config", 'c', OPT_CONFIG, &g.config, .arg = "FILE",
	  .help = "read options from FILE first (\"name value\" per line, see below)" },
	{ "addr", 'a', OPT_STRING, &g.addr, .arg = "ADDR", .help = "listen address (default all)" },
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N",
	  .help = "listen port (0: any, printed)" },
	{ "provider", 0, OPT_STRING, &g.provider, .arg = "NAME",
	  .help = "libfabric provider (tcp, verbs)" },
	{ "dev-search-path", 's', OPT_STRING, &g.search, .arg = "DIR",
	  .help = "export what is below DIR; %SESSNAME% is the session's name" },
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
	{ "control", 0, OPT_STRING, &g.control, .arg = "PATH",
	  .help = "Unix socket for commands (list, force-close SESSION DEVICE)" },
	{ "quiet", 0, OPT_FLAG, &g.quiet, .help = "log errors only" },
	{ 0 },
};

static struct rnbd_srv *srv;
static int ctl_fd = -1;

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

static void ctl_command(int fd)
{
	char line[1024], cmd[32], sess[300], dev[300];
	ssize_t n = read(fd, line, sizeof(line) - 1);
	int rc, k;

	if (n <= 0)
		return;
	line[n] = '\0';
	k = sscanf(line, "%31s %299s %299s", cmd, sess, dev);
	if (k == 1 && !strcmp(cmd, "list")) {
		int out = fd;

		rc = rnbd_srv_list(srv, ctl_list_one, &out);
		if (out >= 0)
			dprintf(fd, "ok %d device%s\n", rc, rc == 1 ? "" : "s");
	} else if (k == 3 && !strcmp(cmd, "force-close")) {
		rc = rnbd_srv_force_close(srv, sess, dev);
		if (rc)
			dprintf(fd, "error: %s\n", strerror(-rc));
		else
			dprintf(fd, "ok\n");
	} else {
		dprintf(fd, "error: unknown command (list, force-close SESSION DEVICE)\n");
	}
}

static void *ctl_thread(void *arg)
{
	for (;;) {
		struct timeval tv = { .tv_sec = 2 };
		int c = accept(ctl_fd, NULL, NULL);

		if (c < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		/*
		 * A client that says nothing, or reads nothing back, does not
		 * hold the socket (or a stop, or the server's locks a list
		 * writes under).
		 */
		setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		ctl_command(c);
		close(c);
	}
	return NULL;
}

static int ctl_open(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	if (strlen(path) >= sizeof(a.sun_path)) {
		fprintf(stderr, "rnbd-server: --control %s: path too long\n", path);
		return -ENAMETOOLONG;
	}
	strcpy(a.sun_path, path);
	unlink(path);
	ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ctl_fd < 0 || bind(ctl_fd, (struct sockaddr *)&a, sizeof(a)) || listen(ctl_fd, 4)) {
		int rc = -errno;

		fprintf(stderr, "rnbd-server: --control %s: %s\n", path, strerror(-rc));
		return rc;
	}
	return 0;
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
	rnbd_set_log_level(g.quiet ? 0 : 2);
	if (g.mem.n && !(mem = join_mem()))
		return 1;
	rnbd_srv_opts_init(&o, sizeof(o));
	o.addr = g.addr;
	o.port = (uint16_t)g.port;
	o.provider = g.provider;
	o.dev_search_path = g.search;
	o.mem_devices = mem;
	o.engine = engine_names[g.engine];
	o.engine_threads = (unsigned)g.threads;
	o.direct = g.direct;
	o.queue_depth = (uint32_t)g.queue_depth;
	o.max_chunk_size = (uint32_t)g.chunk_size;
	o.always_invalidate = g.invalidate;
	o.auth_keys_file = g.auth_keys;
	o.auth_name = g.auth_name;
	o.hb_interval_ms = (unsigned)g.hb_ms;

	/* Signals go to sigwait below, not to library threads. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	rc = rnbd_srv_open(&o, &srv);
	if (rc) {
		fprintf(stderr, "rnbd-server: cannot start: %s\n", strerror(-rc));
		free(mem);
		return 1;
	}
	port = rnbd_srv_port(srv, 30000);
	if (port < 0) {
		fprintf(stderr, "rnbd-server: not listening: %s\n", strerror(-port));
		rnbd_srv_close(srv);
		free(mem);
		return 1;
	}
	if (g.control && (ctl_open(g.control) ||
			  pthread_create(&th, NULL, ctl_thread, NULL))) {
		rnbd_srv_close(srv);
		free(mem);
		return 1;
	}
	printf("rnbd-server listening on port %d\n", port);
	fflush(stdout);
	sigwait(&set, &sig);
	fprintf(stderr, "rnbd-server: %s, stopping\n", strsignal(sig));
	if (g.control) {
		shutdown(ctl_fd, SHUT_RDWR); /* wakes accept() */
		pthread_join(th, NULL);
		close(ctl_fd);
		unlink(g.control);
	}
	rnbd_srv_close(srv);
	free(mem);
	return 0;
}
