/* SPDX-License-Identifier: MIT */
/*
 * rnbd-client: maps a device of an rnbd-server and works on it, without an
 * NBD hop.
 *
 *   rnbd-client info  --server HOST --device NAME    size, limits, features
 *   rnbd-client read  --server HOST --device NAME --file OUT [--offset] [--length]
 *   rnbd-client write --server HOST --device NAME --file IN  [--offset]
 *   rnbd-client perf  --server HOST --device NAME [--rw randrw] [--bs 4k]
 *                     [--iodepth 32] [--runtime 10] [--verify]
 *
 * --server again for more paths ([SRC@]HOST[:PORT] picks the source
 * address). perf keeps --iodepth IOs in flight through librnbd's
 * asynchronous API and prints IOPS and latency like fio; with --verify every
 * read is checked against what this run last wrote to that block. Its
 * completions run on its own thread (rnbd_clt_poll), as in fio's rnbd
 * engine, or with --completions threads on librnbd's.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clt-opts.h"
#include "hist.h"
#include "jsonout.h"
#include "opts.h"
#include "rnbd.h"
#include "util.h"

#define MAX_PATHS 16

/* "auto": ro for info, read and read-only perf patterns, rw otherwise. */
static const char *const mode_names[] = { "auto", "ro", "rw", "migration", NULL };
static const char *const rw_names[] = { "randread", "randwrite", "randrw", "read", "write", NULL };
enum { RW_RANDREAD, RW_RANDWRITE, RW_RANDRW, RW_READ, RW_WRITE };
static const char *const completion_names[] = { "poll", "threads", NULL };
enum { COMPL_POLL, COMPL_THREADS };

static struct {
	const char *device, *file;
	uint64_t offset, length;
	uint64_t bs, iodepth, runtime, rwmixread, size, sessions, hold;
	unsigned mode, rw, completions;
	bool verify, json, verbose;
} g = {
	.bs = 4096, .iodepth = 32, .runtime = 10, .rwmixread = 50, .rw = RW_RANDRW,
};

/* The session options (lib/front/clt-opts.c). */
static struct clt_cfg cfg;

static const struct clt_opt_pick clt_picks[] = {
	{ .id = CLT_OPT_SERVER, .short_name = 's' },
	{ .id = CLT_OPT_PORT, .short_name = 'p' },
	{ CLT_OPT_SESSION, 'S', "session name, the server's %SESSNAME% (default: "
	  "rnbd-client-HOST-PID-RANDOM, new for every run)" },
	{ .id = CLT_OPT_PROVIDER },
	{ .id = CLT_OPT_IO_CONS },
	{ .id = CLT_OPT_POLICY },
	{ .id = CLT_OPT_HB_INTERVAL },
	{ .id = CLT_OPT_FAST_IO_FAIL },
	{ .id = CLT_OPT_BUSY_POLL },
	{ .id = CLT_OPT_POLL_GROUPS },
	{ .id = CLT_OPT_RECONNECT_DELAY },
	{ .id = CLT_OPT_RECONNECT_JITTER },
	{ .id = CLT_OPT_LOSS_TIMEOUT },
	{ .id = CLT_OPT_MAX_RECONNECTS },
	{ .id = CLT_OPT_SECRET },
	{ .id = CLT_OPT_CTRL_SECRET },
	{ .id = CLT_OPT_HOST_NAME },
	{ .id = CLT_OPT_SERVER_NAME },
	{ .id = CLT_OPT_TLS },
	{ .id = CLT_OPT_TLS_KEY },
	{ CLT_OPT_LOG_LEVEL, 0, "error, warn, info or debug (default: RTRS_LOG_LEVEL, else "
	  "warn)" },
};

static const struct opt own_options[] = {
	{ "device", 'd', OPT_STRING, &g.device, .arg = "NAME",
	  .help = "device path below the server's search path" },
	{ "mode", 'm', OPT_CHOICE, &g.mode, .choices = mode_names, .arg = "MODE",
	  .help = "access mode (auto: ro for info, read and read-only perf, else rw)" },
	{ "file", 'f', OPT_STRING, &g.file, .arg = "PATH",
	  .help = "read: where the bytes go ('-' stdout); write: where they come from" },
	{ "offset", 'o', OPT_SIZE, &g.offset, 0, UINT64_MAX, .arg = "BYTES",
	  .help = "read/write: device offset (whole blocks)" },
	{ "length", 'l', OPT_SIZE, &g.length, 0, UINT64_MAX, .arg = "BYTES",
	  .help = "read: bytes to read; write: at most this many (default: to the end)" },
	{ "rw", 0, OPT_CHOICE, &g.rw, .choices = rw_names, .arg = "PATTERN",
	  .help = "perf: randread, randwrite, randrw, read or write" },
	{ "rwmixread", 0, OPT_UINT, &g.rwmixread, 0, 100, .arg = "PCT",
	  .help = "perf: percentage of reads for randrw" },
	{ "bs", 'b', OPT_SIZE, &g.bs, 512, 128u << 20, .arg = "SIZE", .help = "perf: bytes per IO" },
	{ "iodepth", 'q', OPT_UINT, &g.iodepth, 1, 65535, .arg = "N", .help = "perf: IO in flight" },
	{ "runtime", 't', OPT_UINT, &g.runtime, 1, 86400, .arg = "SEC", .help = "perf: seconds" },
	{ "size", 0, OPT_SIZE, &g.size, 0, UINT64_MAX, .arg = "BYTES",
	  .help = "perf: bytes of the device used, from 0 (default: all)" },
	{ "completions", 0, OPT_CHOICE, &g.completions, .choices = completion_names,
	  .arg = "WHERE", .help = "perf: where IO completions run: poll (this thread, "
	  "rnbd_clt_poll; threads where the fabric cannot be polled) or threads (librnbd's)" },
	{ "sessions", 0, OPT_UINT, &g.sessions, 1, 10000, .arg = "N",
	  .help = "perf: N sessions opened at once (SESSION-1 .. SESSION-N), session i mapping "
	  "device NAME-i; --iodepth is spread over them, each IO moving on to the next session; "
	  "completions on librnbd's threads" },
	{ "hold", 0, OPT_UINT, &g.hold, 0, 86400, .arg = "SEC",
	  .help = "perf: keep the sessions open and idle this long after the run (bench/scale.sh "
	  "measures them)" },
	{ "verify", 'V', OPT_FLAG, &g.verify,
	  .help = "perf: reads check what this run wrote (unwritten blocks are not checked)" },
	{ "json", 'j', OPT_FLAG, &g.json, .help = "perf, info: print one JSON object" },
	{ "verbose", 'v', OPT_FLAG, &g.verbose,
	  .help = "the library's info lines too (--log-level info)" },
	{ 0 },
};

static struct rnbd_clt_sess *sess;
static struct rnbd_clt_dev *dev;
/* perf --sessions: every session and its device (sess and dev are the first). */
static struct rnbd_clt_sess **sesss;
static struct rnbd_clt_dev **devs;
static unsigned nsess = 1;
static double open_secs;
static struct rnbd_clt_dev_info info = { .size = sizeof(info) };

static void log_line(void *priv, int level, const char *line)
{
	(void)priv;
	(void)level;
	fprintf(stderr, "%s\n", line);
}

/*
 * The default session name: rnbd-client-HOST-PID-RANDOM, so that runs at
 * the same time (the server refuses a second session of one name) and runs
 * from different hosts never share one. Characters a session name cannot
 * hold ('/', blanks, anything not printable) become '-'.
 */
static const char *default_session(void)
{
	static char name[128];
	char host[65] = "";
	uint32_t r = 0;
	int n;

	gethostname(host, sizeof(host) - 1);
	if (rand_bytes(&r, sizeof(r)))
		r = (uint32_t)now_ns();
	n = snprintf(name, sizeof(name), "rnbd-client-%s-%ld-%08x", host[0] ? host : "host",
		     (long)getpid(), r);
	for (int i = 0; i < n && name[i]; i++)
		if (name[i] <= ' ' || name[i] >= 0x7f || name[i] == '/')
			name[i] = '-';
	return name;
}

/* Opens the session and maps the device; 0, or prints why and returns 1. */
static int connect_map(unsigned mode, int log_level)
{
	const char *sessname = cfg.opts.sessname, *dst;
	int rc;

	if (!cfg.opts.paths_num || !g.device) {
		fprintf(stderr, "rnbd-client: needs --device and 1..%d --server\n", MAX_PATHS);
		return 1;
	}
	dst = cfg.opts.paths[0].dst;
	rnbd_set_log_fn(log_line, NULL);
	rnbd_set_log_level(log_level);
	rc = rnbd_clt_sess_open(&cfg.opts, &sess);
	if (rc == -EPERM) {
		/* What librtrs answers when the server has a session of that name. */
		fprintf(stderr, "rnbd-client: session %s to %s: the name is in use (the server has "
			"a session of this name open); choose another --session\n", sessname, dst);
		return 1;
	}
	if (rc) {
		fprintf(stderr, "rnbd-client: session %s to %s: %s\n", sessname, dst,
			rtrs_last_error()[0] ? rtrs_last_error() : strerror(-rc));
		return 1;
	}
	rc = rnbd_clt_map(sess, g.device, (enum rnbd_clt_mode)mode, &dev);
	if (!rc)
		rc = rnbd_clt_dev_info(dev, &info);
	if (rc) {
		fprintf(stderr, "rnbd-client: session %s: device %s (%s): %s\n", sessname, g.device,
			mode_names[mode + 1], strerror(-rc));
		rnbd_clt_sess_close(sess);
		return 1;
	}
	return 0;
}

/* --sessions: the openers, all at once (at most OPENERS threads, each taking the next). */
#define OPENERS 256

static struct {
	atomic_uint next, failed;
	atomic_int first_err;
	atomic_uint first_failed;   /* the index + 1 of the first that failed */
	unsigned mode;
} op_;

static void *opener(void *arg)
{
	(void)arg;
	for (;;) {
		unsigned i = atomic_fetch_add(&op_.next, 1), none = 0;
		struct rtrs_clt_opts o = cfg.opts;
		char name[256], dname[512]; /* a session name: 1..255 bytes */
		int rc, zero = 0;

		if (i >= nsess)
			return NULL;
		snprintf(name, sizeof(name), "%.200s-%u", cfg.opts.sessname, i + 1);
		snprintf(dname, sizeof(dname), "%s-%u", g.device, i + 1);
		o.sessname = name;
		rc = rnbd_clt_sess_open(&o, &sesss[i]);
		if (!rc) {
			rc = rnbd_clt_map(sesss[i], dname, (enum rnbd_clt_mode)op_.mode, &devs[i]);
			if (rc) {
				rnbd_clt_sess_close(sesss[i]);
				sesss[i] = NULL;
			}
		} else {
			sesss[i] = NULL;
		}
		if (rc) {
			devs[i] = NULL;
			atomic_fetch_add(&op_.failed, 1);
			if (atomic_compare_exchange_strong(&op_.first_err, &zero, rc))
				atomic_compare_exchange_strong(&op_.first_failed, &none, i + 1);
		}
	}
}

/* Unmaps and closes what connect_many opened. */
static void disconnect_many(void)
{
	for (unsigned i = 0; i < nsess; i++) {
		if (!sesss[i])
			continue;
		if (devs[i])
			rnbd_clt_unmap(devs[i], false);
		rnbd_clt_sess_close(sesss[i]);
	}
	free(sesss);
	free(devs);
	sesss = NULL;
	devs = NULL;
}

/*
 * perf --sessions N: N sessions opened at once, each mapping its device;
 * info is the first's, and every device must be as large. 0, or prints
 * why and returns 1.
 */
static int connect_many(unsigned mode, int log_level)
{
	unsigned nt;
	uint64_t t0 = now_ns();

	if (!cfg.opts.paths_num || !g.device) {
		fprintf(stderr, "rnbd-client: needs --device and 1..%d --server\n", MAX_PATHS);
		return 1;
	}
	nsess = (unsigned)g.sessions;
	nt = MIN(nsess, OPENERS);
	rnbd_set_log_fn(log_line, NULL);
	rnbd_set_log_level(log_level);
	sesss = calloc(nsess, sizeof(*sesss));
	devs = calloc(nsess, sizeof(*devs));
	if (!sesss || !devs) {
		fprintf(stderr, "rnbd-client: out of memory for %u sessions\n", nsess);
		return 1;
	}
	op_.mode = mode;
	threads_run(nt, opener, NULL);
	open_secs = (double)(now_ns() - t0) / 1e9;
	if (atomic_load(&op_.failed)) {
		unsigned i = atomic_load(&op_.first_failed) - 1;

		fprintf(stderr, "rnbd-client: %u of %u sessions did not open and map their device, "
			"first: session %s-%u, device %s-%u (%s): %s\n", atomic_load(&op_.failed),
			nsess, cfg.opts.sessname, i + 1, g.device, i + 1, mode_names[mode + 1],
			strerror(-atomic_load(&op_.first_err)));
		disconnect_many();
		return 1;
	}
	sess = sesss[0];
	dev = devs[0];
	for (unsigned i = 0; i < nsess; i++) {
		struct rnbd_clt_dev_info di = { .size = sizeof(di) };
		int rc = rnbd_clt_dev_info(devs[i], &di);

		if (!rc && !i)
			info = di;
		if (rc || di.bytes < info.bytes || di.logical_block_size != info.logical_block_size ||
		    di.max_io < info.max_io || di.queue_depth < info.queue_depth) {
			fprintf(stderr, "rnbd-client: device %s-%u: %s\n", g.device, i + 1,
				rc ? strerror(-rc) : "smaller than the first device, or its block size, "
				"largest IO or queue depth differ");
			disconnect_many();
			return 1;
		}
	}
	/* At once, for whoever measures what comes next (bench/scale.sh). */
	fprintf(stderr, "rnbd-client: %u sessions opened and mapped in %.3f s\n", nsess, open_secs);
	return 0;
}

static void disconnect(void)
{
	int rc;

	if (sesss) {
		disconnect_many();
		return;
	}
	rc = rnbd_clt_unmap(dev, false);
	if (rc)
		fprintf(stderr, "rnbd-client: unmapping %s: %s\n", g.device, strerror(-rc));
	rnbd_clt_sess_close(sess);
}

/* ---- info ------------------------------------------------------------------------ */

/* Prints the JSON document; 0, or says why it could not and returns 1. */
static int json_out(struct json_object *o, bool failed)
{
	int rc = jprint(o, failed);

	if (rc)
		fprintf(stderr, "rnbd-client: printing JSON: %s\n", strerror(-rc));
	return rc ? 1 : 0;
}

/*
 * What the device offers and how this run mapped it. "mapped ro" is the
 * mapping (info maps read-only unless --mode says otherwise), not whether
 * the device could be written.
 */
static int run_info(unsigned mode)
{
	if (g.json) {
		struct json_object *o = json_object_new_object();
		bool failed = false;

		jput(o, "device", json_object_new_string(g.device), &failed);
		jput(o, "sessions", json_object_new_uint64(nsess), &failed);
		if (g.sessions)
			jput(o, "open_seconds", jfixed(open_secs, 3), &failed);
		jput(o, "bytes", json_object_new_uint64(info.bytes), &failed);
		jput(o, "logical_block_size", json_object_new_uint64(info.logical_block_size),
		     &failed);
		jput(o, "physical_block_size", json_object_new_uint64(info.physical_block_size),
		     &failed);
		jput(o, "max_io", json_object_new_uint64(info.max_io), &failed);
		jput(o, "queue_depth", json_object_new_uint64(info.queue_depth), &failed);
		jput(o, "mode", json_object_new_string(mode_names[mode + 1]), &failed);
		jput(o, "discard", json_object_new_boolean(info.discard), &failed);
		jput(o, "write_zeroes", json_object_new_boolean(info.write_zeroes), &failed);
		jput(o, "secure_erase", json_object_new_boolean(info.secure_erase), &failed);
		jput(o, "write_cache", json_object_new_boolean(info.write_cache), &failed);
		jput(o, "fua", json_object_new_boolean(info.fua), &failed);
		return json_out(o, failed);
	} else {
		printf("%s: %zu bytes, block %u/%u, max IO %u, queue depth %u, mapped %s%s%s%s%s%s\n",
		       g.device, info.bytes, info.logical_block_size, info.physical_block_size,
		       info.max_io, info.queue_depth, mode_names[mode + 1],
		       info.discard ? ", discard" : "", info.write_zeroes ? ", write-zeroes" : "",
		       info.secure_erase ? ", secure-erase" : "",
		       info.write_cache ? ", write cache" : "", info.fua ? ", fua" : "");
	}
	return 0;
}

static int write_all(int fd, const uint8_t *buf, size_t n)
{
	while (n) {
		ssize_t k = write(fd, buf, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		buf += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Reads up to n bytes (a pipe gives what it has): how many, 0 at the end, or -errno. */
static ssize_t read_full(int fd, uint8_t *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = read(fd, buf + got, n - got);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		got += (size_t)k;
	}
	return (ssize_t)got;
}

/* ---- read and write ----------------------------------------------------------------- */

/*
 * --offset and --length against the device: whole blocks, within it. Sets
 * *end (the first byte not to touch); 0, or prints why and returns 1.
 */
static int copy_range(uint64_t *end)
{
	uint32_t lbs = info.logical_block_size;

	if (!g.file) {
		fprintf(stderr, "rnbd-client: needs --file\n");
		return 1;
	}
	if (g.offset % lbs || g.length % lbs || g.offset > info.bytes ||
	    (g.length && g.length > info.bytes - g.offset)) {
		fprintf(stderr, "rnbd-client: %s: offset and length must be whole %u-byte blocks "
			"within %zu bytes\n", g.device, lbs, info.bytes);
		return 1;
	}
	*end = g.length ? g.offset + g.length : info.bytes;
	return 0;
}

/* Copies the device from --offset to --file, in max_io pieces. */
static int run_read(void)
{
	uint32_t piece = info.max_io;
	uint64_t end, off;
	uint8_t *buf;
	int fd, rc = 0;

	if (copy_range(&end))
		return 1;
	fd = strcmp(g.file, "-") ? open(g.file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
				 : STDOUT_FILENO;
	if (fd < 0) {
		fprintf(stderr, "rnbd-client: %s: %s\n", g.file, strerror(errno));
		return 1;
	}
	buf = aligned_alloc(4096, piece);
	if (!buf) {
		fprintf(stderr, "rnbd-client: out of memory\n");
		rc = 1;
	}
	for (off = g.offset; buf && off < end && !rc;) {
		uint32_t n = (uint32_t)MIN((uint64_t)piece, end - off);
		int r = rnbd_clt_io(dev, RNBD_CLT_READ, 0, off, buf, n);

		if (r) {
			fprintf(stderr, "rnbd-client: %s: read at %" PRIu64 "+%u: %s\n", g.device, off,
				n, strerror(-r));
			rc = 1;
		} else if (write_all(fd, buf, n)) {
			fprintf(stderr, "rnbd-client: %s: %s\n", g.file, strerror(errno));
			rc = 1;
		}
		off += n;
	}
	free(buf);
	if (fd > STDERR_FILENO && close(fd) && !rc) {
		fprintf(stderr, "rnbd-client: %s: %s\n", g.file, strerror(errno));
		rc = 1;
	}
	if (!rc)
		fprintf(stderr, "rnbd-client: read %" PRIu64 " bytes from %s\n", end - g.offset,
			g.device);
	return rc;
}

/*
 * The input ends inside a block: the block is read from the device and
 * the input's bytes laid over its start, so the rest of it stays as it was.
 * buf holds head whole blocks and tail more bytes, with room for a block
 * after head. 0, or prints why and returns 1.
 */
static int merge_last_block(uint8_t *buf, uint64_t off, size_t head, size_t tail)
{
	uint32_t lbs = info.logical_block_size;
	uint8_t *blk = aligned_alloc(4096, (lbs + 4095) & ~4095u);
	int r;

	if (!blk) {
		fprintf(stderr, "rnbd-client: out of memory\n");
		return 1;
	}
	r = rnbd_clt_io(dev, RNBD_CLT_READ, 0, off + head, blk, lbs);
	if (r) {
		fprintf(stderr, "rnbd-client: %s: reading the last block at %" PRIu64 " to keep its "
			"bytes after the input: %s\n", g.device, off + head, strerror(-r));
		free(blk);
		return 1;
	}
	memcpy(blk, buf + head, tail);
	memcpy(buf + head, blk, lbs);
	free(blk);
	return 0;
}

/*
 * Copies --file onto the device from --offset, in max_io pieces. Input
 * longer than the room there (to the end, or --length) is an error: a
 * regular file is measured before anything is written; from a pipe, the
 * pieces before the one that reaches the end are written, and that one is
 * not when more input follows it. A last block the input covers only in
 * part is read first, so its other bytes stay.
 */
static int run_write(void)
{
	uint32_t lbs = info.logical_block_size, piece = info.max_io;
	uint64_t end, off, done = 0;
	uint8_t *buf = NULL;
	struct stat st;
	int fd, rc = 0;

	if (copy_range(&end))
		return 1;
	fd = strcmp(g.file, "-") ? open(g.file, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
	if (fd < 0) {
		fprintf(stderr, "rnbd-client: %s: %s\n", g.file, strerror(errno));
		return 1;
	}
	if (!fstat(fd, &st) && S_ISREG(st.st_mode)) {
		off_t pos = lseek(fd, 0, SEEK_CUR);
		uint64_t have = (uint64_t)st.st_size - (uint64_t)(pos > 0 ? pos : 0);

		if (have > end - g.offset) {
			fprintf(stderr, "rnbd-client: %s: %" PRIu64 " bytes do not fit in the %" PRIu64
				" bytes of %s from offset %" PRIu64 "%s; nothing written\n", g.file, have,
				end - g.offset, g.device, g.offset, g.length ? " (--length)" : "");
			rc = 1;
			goto out;
		}
	}
	buf = aligned_alloc(4096, piece);
	if (!buf) {
		fprintf(stderr, "rnbd-client: out of memory\n");
		rc = 1;
		goto out;
	}
	for (off = g.offset; off < end;) {
		uint32_t n = (uint32_t)MIN((uint64_t)piece, end - off);
		ssize_t got = read_full(fd, buf, n), more;
		size_t tail;
		int r;

		if (got < 0) {
			fprintf(stderr, "rnbd-client: %s: %s\n", g.file, strerror((int)-got));
			rc = 1;
			break;
		}
		if (!got)
			break;
		/* This piece reaches the end: more input means it does not fit. */
		if ((uint64_t)got == end - off) {
			uint8_t extra;

			more = read_full(fd, &extra, 1);
			if (more) {
				if (more < 0)
					fprintf(stderr, "rnbd-client: %s: %s\n", g.file,
						strerror((int)-more));
				else
					fprintf(stderr, "rnbd-client: %s: input longer than the %" PRIu64
						" bytes of %s from offset %" PRIu64 "%s; the last %zd bytes "
						"that fit were not written, %" PRIu64 " bytes before them "
						"were\n", g.file, end - g.offset, g.device, g.offset,
						g.length ? " (--length)" : "", got, done);
				rc = 1;
				break;
			}
		}
		tail = (size_t)got % lbs;
		if (tail && merge_last_block(buf, off, (size_t)got - tail, tail)) {
			rc = 1;
			break;
		}
		n = (uint32_t)((size_t)got - tail + (tail ? lbs : 0));
		r = rnbd_clt_io(dev, RNBD_CLT_WRITE, 0, off, buf, n);
		if (r) {
			fprintf(stderr, "rnbd-client: %s: write at %" PRIu64 "+%u: %s\n", g.device, off,
				n, strerror(-r));
			rc = 1;
			break;
		}
		off += n;
		done += (uint64_t)got;
		if (tail)
			break; /* the input ended inside this block */
	}
	if (!rc) {
		int r = rnbd_clt_io(dev, RNBD_CLT_FLUSH, 0, 0, NULL, 0);

		if (r && r != -EOPNOTSUPP) {
			fprintf(stderr, "rnbd-client: %s: flush: %s\n", g.device, strerror(-r));
			rc = 1;
		}
	}
	if (!rc)
		fprintf(stderr, "rnbd-client: wrote %" PRIu64 " bytes to %s\n", done, g.device);
out:
	free(buf);
	if (fd > STDERR_FILENO)
		close(fd);
	return rc;
}

/* ---- perf ------------------------------------------------------------------------- */

struct slot {
	unsigned idx;
	unsigned d;             /* the device (--sessions) of the IO in flight */
	uint64_t rng;
	uint64_t seq;           /* sequential patterns: the next block of this slot */
	uint64_t start_ns;
	uint64_t block;
	bool write;
	uint8_t *buf;
};

static struct {
	struct slot *slots;
	uint64_t blocks;                /* of bs in the region */
	uint32_t *gens;                 /* --verify: per device and block, what was last written
					   (0: none) */
	struct hist hist;
	atomic_uint next_dev;           /* --sessions: the device of the next IO */
	atomic_uint_fast64_t reads, writes, errors, bad;
	atomic_uint active;
	atomic_bool stopping;
	int first_err;
	pthread_mutex_t lock;
	pthread_cond_t cond;
} p = { .lock = PTHREAD_MUTEX_INITIALIZER }; /* cond: cond_init_mono in run_perf */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* The bytes of block b at generation gen, 8 at a time. */
static void pattern_fill(uint64_t *w, size_t n, uint64_t b, uint32_t gen)
{
	uint64_t x = (b << 20 ^ gen) * 0x9E3779B97F4A7C15ull;

	for (size_t i = 0; i < n; i++) {
		x ^= x >> 31;
		x *= 0xBF58476D1CE4E5B9ull;
		w[i] = x ^ i;
	}
}

static bool pattern_check(const uint64_t *w, size_t n, uint64_t b, uint32_t gen)
{
	uint64_t x = (b << 20 ^ gen) * 0x9E3779B97F4A7C15ull;

	for (size_t i = 0; i < n; i++) {
		x ^= x >> 31;
		x *= 0xBF58476D1CE4E5B9ull;
		if (w[i] != (x ^ i))
			return false;
	}
	return true;
}

static void perf_retire(void)
{
	if (atomic_fetch_sub(&p.active, 1) == 1) {
		pthread_mutex_lock(&p.lock);
		pthread_cond_broadcast(&p.cond);
		pthread_mutex_unlock(&p.lock);
	}
}

static void perf_fail(int err)
{
	if (atomic_fetch_add(&p.errors, 1) == 0)
		p.first_err = err;
	pthread_mutex_lock(&p.lock);
	atomic_store(&p.stopping, true);
	pthread_cond_broadcast(&p.cond);
	pthread_mutex_unlock(&p.lock);
}

static void perf_done(void *priv, int err);

/* --verify: the generation of the block the slot's IO is on. */
static uint32_t *slot_gen(const struct slot *sl)
{
	return &p.gens[(uint64_t)sl->d * p.blocks + sl->block];
}

/*
 * The slot's next IO. With --verify a slot uses only the blocks equal to
 * its index modulo iodepth, so no two IO in flight touch the same block.
 */
static int perf_submit(struct slot *sl)
{
	uint64_t span = g.verify ? (p.blocks - sl->idx + g.iodepth - 1) / g.iodepth : p.blocks;
	uint64_t k;

	switch (g.rw) {
	case RW_READ:
	case RW_WRITE:
		k = sl->seq++ % span;
		sl->write = g.rw == RW_WRITE;
		break;
	default:
		k = rng_next(&sl->rng) % span;
		sl->write = g.rw == RW_RANDWRITE ||
			    (g.rw == RW_RANDRW && rng_next(&sl->rng) % 100 >= g.rwmixread);
	}
	sl->block = g.verify ? k * g.iodepth + sl->idx : k;
	sl->d = nsess > 1 ? atomic_fetch_add_explicit(&p.next_dev, 1, memory_order_relaxed) % nsess
			  : 0;
	if (g.verify && sl->write)
		pattern_fill((uint64_t *)sl->buf, g.bs / 8, sl->block, *slot_gen(sl) + 1);
	sl->start_ns = now_ns();
	return rnbd_clt_submit(nsess > 1 ? devs[sl->d] : dev,
			       sl->write ? RNBD_CLT_WRITE : RNBD_CLT_READ, 0, sl->block * g.bs,
			       sl->buf, (uint32_t)g.bs, perf_done, sl);
}

static void perf_done(void *priv, int err)
{
	struct slot *sl = priv;
	int rc;

	if (err) {
		perf_fail(err);
		perf_retire();
		return;
	}
	hist_add(&p.hist, (now_ns() - sl->start_ns) / 1000);
	if (sl->write) {
		atomic_fetch_add_explicit(&p.writes, 1, memory_order_relaxed);
		if (g.verify)
			(*slot_gen(sl))++;
	} else {
		atomic_fetch_add_explicit(&p.reads, 1, memory_order_relaxed);
		if (g.verify && *slot_gen(sl) &&
		    !pattern_check((uint64_t *)sl->buf, g.bs / 8, sl->block, *slot_gen(sl)))
			atomic_fetch_add(&p.bad, 1);
	}
	if (atomic_load_explicit(&p.stopping, memory_order_relaxed)) {
		perf_retire();
		return;
	}
	rc = perf_submit(sl);
	if (rc) {
		perf_fail(rc);
		perf_retire();
	}
}

/*
 * --completions poll: the done callbacks, and the next submission, run
 * here until the run's end and every IO is in. An IO that ends on a
 * library thread (a failover) is counted there all the same; a fabric that
 * cannot be polled leaves the rest to the wait on p.cond.
 */
static void perf_poll(uint64_t end_ns)
{
	while (atomic_load(&p.active)) {
		int rc;

		if (!atomic_load_explicit(&p.stopping, memory_order_relaxed) && now_ns() >= end_ns)
			atomic_store(&p.stopping, true);
		rc = rnbd_clt_poll(sess, 100);
		if (rc == -EOPNOTSUPP)
			return;
		if (rc < 0) {
			perf_fail(rc);
			return;
		}
	}
}

static int run_perf(void)
{
	uint64_t region = g.size ? g.size : info.bytes, t0, t1, n, r, w;
	struct timespec end;
	double secs;
	int rc = 0, out_rc = 0;

	if (g.bs % info.logical_block_size || g.bs > info.max_io) { /* lbs >= 512: words */
		fprintf(stderr, "rnbd-client: --bs %" PRIu64 " must be whole %u-byte blocks, at "
			"most %u\n", g.bs, info.logical_block_size, info.max_io);
		return 1;
	}
	if (region > info.bytes || region / g.bs < g.iodepth) {
		fprintf(stderr, "rnbd-client: %s: %" PRIu64 " bytes used of %zu: need at least "
			"iodepth x bs\n", g.device, region, info.bytes);
		return 1;
	}
	if (g.iodepth > info.queue_depth) {
		fprintf(stderr, "rnbd-client: --iodepth %" PRIu64 " beyond the session's %u slots\n",
			g.iodepth, info.queue_depth);
		return 1;
	}
	p.blocks = region / g.bs;
	p.slots = calloc(g.iodepth, sizeof(*p.slots));
	if (g.verify)
		p.gens = calloc(p.blocks * nsess, sizeof(*p.gens));
	if (!p.slots || (g.verify && !p.gens)) {
		fprintf(stderr, "rnbd-client: out of memory\n");
		return 1;
	}
	for (unsigned i = 0; i < g.iodepth; i++) {
		p.slots[i] = (struct slot){ .idx = i, .rng = 0x9E3779B97F4A7C15ull * (i + 1) };
		p.slots[i].buf = aligned_alloc(4096, (g.bs + 4095) & ~4095ull);
		if (!p.slots[i].buf) {
			fprintf(stderr, "rnbd-client: out of memory\n");
			return 1;
		}
		memset(p.slots[i].buf, 0, g.bs);
	}
	cond_init_mono(&p.cond);
	t0 = now_ns();
	end = deadline_ms((unsigned)g.runtime * 1000u);
	for (unsigned i = 0; i < g.iodepth; i++) {
		atomic_fetch_add(&p.active, 1);
		rc = perf_submit(&p.slots[i]);
		if (rc) {
			perf_fail(rc);
			perf_retire();
			break;
		}
	}
	if (g.completions == COMPL_POLL && nsess == 1)
		perf_poll(t0 + g.runtime * 1000000000ull);
	pthread_mutex_lock(&p.lock);
	while (atomic_load(&p.active) && !atomic_load(&p.stopping))
		if (pthread_cond_timedwait(&p.cond, &p.lock, &end) == ETIMEDOUT)
			break;
	atomic_store(&p.stopping, true);
	while (atomic_load(&p.active))
		pthread_cond_wait(&p.cond, &p.lock);
	pthread_mutex_unlock(&p.lock);
	t1 = now_ns();

	r = atomic_load(&p.reads);
	w = atomic_load(&p.writes);
	n = r + w;
	secs = (double)(t1 - t0) / 1e9;
	if (g.json) {
		struct json_object *o = json_object_new_object(), *lat = json_object_new_object();
		bool failed = false;

		jput(o, "device", json_object_new_string(g.device), &failed);
		jput(o, "sessions", json_object_new_uint64(nsess), &failed);
		if (g.sessions)
			jput(o, "open_seconds", jfixed(open_secs, 3), &failed);
		jput(o, "rw", json_object_new_string(rw_names[g.rw]), &failed);
		jput(o, "bs", json_object_new_uint64(g.bs), &failed);
		jput(o, "iodepth", json_object_new_uint64(g.iodepth), &failed);
		jput(o, "completions", json_object_new_string(completion_names[
			nsess > 1 ? COMPL_THREADS : g.completions]), &failed);
		jput(o, "seconds", jfixed(secs, 3), &failed);
		jput(o, "reads", json_object_new_uint64(r), &failed);
		jput(o, "writes", json_object_new_uint64(w), &failed);
		jput(o, "iops", jfixed((double)n / secs, 0), &failed);
		jput(o, "mb_per_sec", jfixed((double)n * (double)g.bs / secs / 1e6, 1), &failed);
		jput(lat, "p50", json_object_new_uint64(hist_percentile(&p.hist, 50, n)), &failed);
		jput(lat, "p99", json_object_new_uint64(hist_percentile(&p.hist, 99, n)), &failed);
		jput(lat, "p999", json_object_new_uint64(hist_percentile(&p.hist, 99.9, n)), &failed);
		jput(lat, "max", json_object_new_uint64(hist_percentile(&p.hist, 100, n)), &failed);
		jput(o, "lat_us", lat, &failed);
		jput(o, "errors", json_object_new_uint64(atomic_load(&p.errors)), &failed);
		jput(o, "bad", json_object_new_uint64(atomic_load(&p.bad)), &failed);
		jput(o, "verify", json_object_new_boolean(g.verify), &failed);
		out_rc = json_out(o, failed);
	} else {
		printf("rnbd-client perf: %s%s %s bs %" PRIu64 " iodepth %" PRIu64 ", %.2f s%s\n",
		       g.device, g.sessions ? "-1.." : "", rw_names[g.rw], g.bs, g.iodepth, secs,
		       g.verify ? ", verified" : "");
		if (g.sessions)
			printf("  %u sessions, opened and mapped in %.3f s\n", nsess, open_secs);
		printf("  read: IOPS=%.0f  write: IOPS=%.0f  total: IOPS=%.0f, %.1f MB/s\n",
		       (double)r / secs, (double)w / secs, (double)n / secs,
		       (double)n * (double)g.bs / secs / 1e6);
		printf("  latency us: p50 %" PRIu64 " p99 %" PRIu64 " p99.9 %" PRIu64
		       " max %" PRIu64 "  errors %" PRIuFAST64 "\n",
		       hist_percentile(&p.hist, 50, n), hist_percentile(&p.hist, 99, n),
		       hist_percentile(&p.hist, 99.9, n), hist_percentile(&p.hist, 100, n),
		       atomic_load(&p.errors));
	}
	if (atomic_load(&p.errors))
		fprintf(stderr, "rnbd-client: %" PRIuFAST64 " IOs failed, first: %s\n",
			atomic_load(&p.errors), strerror(-p.first_err));
	if (atomic_load(&p.bad))
		fprintf(stderr, "rnbd-client: %" PRIuFAST64 " reads returned wrong bytes\n",
			atomic_load(&p.bad));
	if (g.hold) {
		fflush(stdout);
		fprintf(stderr, "rnbd-client: holding %u idle sessions for %" PRIu64 " s\n", nsess,
			g.hold);
		sleep((unsigned)g.hold);
	}
	for (unsigned i = 0; i < g.iodepth; i++)
		free(p.slots[i].buf);
	free(p.slots);
	free(p.gens);
	return out_rc || atomic_load(&p.errors) || atomic_load(&p.bad) ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const char *const cmds[] = { "info", "read", "write", "perf", NULL };
	const char *usage = "info|read|write|perf [options]";
	unsigned cmd = 0, mode;
	struct opt *options;
	int pos, rc, level;

	clt_cfg_init(&cfg, MAX_PATHS);
	options = clt_opts_table(&cfg, clt_picks, ARRAY_SIZE(clt_picks), own_options);
	if (!options) {
		fprintf(stderr, "rnbd-client: out of memory\n");
		return 1;
	}
	if (opts_version_arg(argc, argv, "rnbd-client"))
		return 0;
	if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		opts_help(options, "rnbd-client", usage);
		free(options);
		return 0;
	}
	while (argc >= 2 && cmds[cmd] && strcmp(argv[1], cmds[cmd]))
		cmd++;
	if (argc < 2 || !cmds[cmd]) {
		fprintf(stderr, "rnbd-client: first argument must be info, read, write or perf "
			"(see --help)\n");
		free(options);
		return 2;
	}
	rc = clt_opts_renamed("rnbd-client", argc, argv, false);
	if (!rc)
		rc = opts_parse(options, "rnbd-client", usage, argc - 1, argv + 1, &pos);
	free(options);
	if (rc)
		return rc > 0 ? 0 : 2;
	clt_cfg_finish(&cfg);
	if (pos != argc - 1) {
		fprintf(stderr, "rnbd-client: unexpected argument '%s'\n", argv[pos + 1]);
		return 2;
	}
	if (!cfg.opts.sessname)
		cfg.opts.sessname = default_session();
	if (g.mode)
		mode = g.mode - 1;
	else
		mode = cmd == 0 || cmd == 1 || (cmd == 3 && (g.rw == RW_RANDREAD || g.rw == RW_READ))
			       ? RNBD_CLT_RO : RNBD_CLT_RW;
	/* --log-level, then --verbose, then RTRS_LOG_LEVEL, then warn. */
	level = cfg.log_level >= 0 ? cfg.log_level
				   : opts_log_level("rnbd-client", "--verbose",
						    g.verbose ? "info" : NULL,
						    getenv("RTRS_LOG_LEVEL"), 1);
	if (level < 0)
		return 2;
	if ((g.sessions || g.hold) && cmd != 3) {
		fprintf(stderr, "rnbd-client: --sessions and --hold are for perf\n");
		return 2;
	}
	if (g.sessions ? connect_many(mode, level) : connect_map(mode, level))
		return 1;
	switch (cmd) {
	case 0: rc = run_info(mode); break;
	case 1: rc = run_read(); break;
	case 2: rc = run_write(); break;
	default: rc = run_perf(); break;
	}
	disconnect();
	return rc;
}
