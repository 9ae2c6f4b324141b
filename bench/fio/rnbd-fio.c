/* SPDX-License-Identifier: MIT */
/*
 * fio's external engine for RNBD: librnbd's asynchronous API, so that
 * every block benchmark runs one fio job against every contender
 * (`ioengine=external:rnbd-fio.so`; bench/fio-rnbd.sh, bench/README).
 *
 * Built against the fio it is loaded into: the source of the fio Debian
 * ships, configured and built in a scratch folder (an engine sees fio's
 * structures, so headers and binary must be one build). meson
 * -Dfio_src=DIR builds it; nothing of fio is in this repository.
 *
 *   [job]
 *   ioengine=external:/path/to/rnbd-fio.so
 *   rnbd_server=127.0.0.1:1234[,127.0.0.2:1234]   paths of the session
 *   filename=DEVICE                               the export
 *   rnbd_opts=policy=round-robin,provider=verbs   session options (the plugin's keys)
 *   rnbd_session=NAME                             default fio-PID-JOB
 *   rnbd_poll=0                                   completions on librnbd's threads
 *
 * Each job process (or thread) opens its own session and maps the device
 * in its init; setup, which fio runs before it forks the jobs, only asks
 * the size. Completions run on fio's thread, in getevents
 * (rnbd_clt_poll); with rnbd_poll=0, or on a fabric that cannot be
 * polled, they arrive on librnbd's threads and are handed to fio's thread
 * under one lock, and getevents sleeps only until as many as it asked for
 * are there.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fio.h"
#include "optgroup.h"

#include "clt-opts.h"
#include "rnbd.h"

struct rnbd_fio_opts {
	void *pad; /* fio: an option's offset must not be 0 */
	char *server, *session, *opts, *mode;
	unsigned int poll;
};

static struct fio_option options[] = {
	{
		.name = "rnbd_server",
		.lname = "RNBD server paths",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rnbd_fio_opts, server),
		.help = "the session's paths, [SRC@]HOST[:PORT] separated by commas",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "rnbd_session",
		.lname = "RNBD session name",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rnbd_fio_opts, session),
		.help = "the session's name (the server's %SESSNAME%); default fio-PID-JOB",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "rnbd_opts",
		.lname = "RNBD session options",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rnbd_fio_opts, opts),
		.help = "session options as the nbdkit plugin takes them, KEY=VALUE separated by "
			"commas (policy=round-robin,provider=verbs,...)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "rnbd_mode",
		.lname = "RNBD access mode",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct rnbd_fio_opts, mode),
		.help = "rw (default), ro or migration",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "rnbd_poll",
		.lname = "RNBD polled completions",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct rnbd_fio_opts, poll),
		.def = "1",
		.help = "completions run on fio's thread (rnbd_clt_poll); 0: on librnbd's threads",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

struct rnbd_fio {
	struct clt_cfg cfg;
	char *strs;                 /* the copy of rnbd_server and rnbd_opts cfg points into */
	char sessname[64];
	struct rnbd_clt_sess *sess;
	struct rnbd_clt_dev *dev;
	/* Completed, not yet reaped: filled by librnbd's threads. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct io_u **done;
	unsigned nr_done, want;     /* want: getevents sleeps until nr_done reaches it */
	bool polled;                /* completions come from rnbd_clt_poll in getevents */
	/* Reaped by getevents, handed out by event. */
	struct io_u **events;
	unsigned nr_events;
};

static int mode_of(const char *m)
{
	if (!m || !strcmp(m, "rw"))
		return RNBD_CLT_RW;
	if (!strcmp(m, "ro"))
		return RNBD_CLT_RO;
	if (!strcmp(m, "migration"))
		return RNBD_CLT_MIGRATION;
	return -1;
}

/* The session options from the job's rnbd_server and rnbd_opts into r->cfg. */
static int cfg_from_job(struct thread_data *td, struct rnbd_fio *r)
{
	struct rnbd_fio_opts *o = td->eo;
	char err[256], *save = NULL, *tok, *p;
	size_t n1, n2;

	if (!o->server || !*o->server) {
		log_err("fio: rnbd: rnbd_server= is required\n");
		return -EINVAL;
	}
	clt_cfg_init(&r->cfg, CLT_MAX_PATHS);
	n1 = strlen(o->server) + 1;
	n2 = o->opts ? strlen(o->opts) + 1 : 1;
	r->strs = malloc(n1 + n2 + sizeof(r->sessname));
	if (!r->strs)
		return -ENOMEM;
	memcpy(r->strs, o->server, n1);
	memcpy(r->strs + n1, o->opts ? o->opts : "", n2);
	for (tok = strtok_r(r->strs, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (clt_opt_set(&r->cfg, CLT_OPT_SERVER, tok, err, sizeof(err))) {
			log_err("fio: rnbd: rnbd_server %s: %s\n", tok, err);
			return -EINVAL;
		}
	}
	for (tok = strtok_r(r->strs + n1, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int id;

		p = strchr(tok, '=');
		if (!p) {
			log_err("fio: rnbd: rnbd_opts %s: expected KEY=VALUE\n", tok);
			return -EINVAL;
		}
		*p++ = 0;
		id = clt_opt_by_key(tok);
		if (id < 0 || id == CLT_OPT_SERVER) {
			log_err("fio: rnbd: rnbd_opts: unknown option %s\n", tok);
			return -EINVAL;
		}
		if (clt_opt_set(&r->cfg, (enum clt_opt_id)id, p, err, sizeof(err))) {
			log_err("fio: rnbd: rnbd_opts %s=%s: %s\n", tok, p, err);
			return -EINVAL;
		}
	}
	if (o->session)
		snprintf(r->sessname, sizeof(r->sessname), "%s", o->session);
	else
		snprintf(r->sessname, sizeof(r->sessname), "fio-%d-%d", (int)getpid(),
			 td->thread_number);
	r->cfg.opts.sessname = r->sessname;
	clt_cfg_finish(&r->cfg); /* the front ends' rule: jitter half the delay unless given */
	if (mode_of(o->mode) < 0) {
		log_err("fio: rnbd: rnbd_mode %s: expected rw, ro or migration\n", o->mode);
		return -EINVAL;
	}
	return 0;
}

static void rnbd_fio_free(struct rnbd_fio *r)
{
	if (!r)
		return;
	if (r->dev)
		rnbd_clt_unmap(r->dev, true);
	if (r->sess)
		rnbd_clt_sess_close(r->sess);
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r->done);
	free(r->events);
	free(r->strs);
	free(r);
}

/* Opens the session and maps the job's file: 0 or a negative errno, said. */
static int rnbd_fio_connect(struct thread_data *td, struct rnbd_fio *r, const char *dev)
{
	struct rnbd_fio_opts *o = td->eo;
	int rc = rnbd_clt_sess_open(&r->cfg.opts, &r->sess);

	if (rc) {
		log_err("fio: rnbd: session %s to %s: %s\n", r->sessname, r->cfg.opts.paths[0].dst,
			strerror(-rc));
		return rc;
	}
	rc = rnbd_clt_map(r->sess, dev, (enum rnbd_clt_mode)mode_of(o->mode), &r->dev);
	if (rc)
		log_err("fio: rnbd: mapping %s: %s\n", dev, strerror(-rc));
	return rc;
}

static struct rnbd_fio *rnbd_fio_new(struct thread_data *td)
{
	struct rnbd_fio *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	if (cfg_from_job(td, r)) {
		rnbd_fio_free(r);
		return NULL;
	}
	return r;
}

/* Before fio forks its jobs: the size of the device, from a session opened for that alone. */
static int rnbd_fio_setup(struct thread_data *td)
{
	struct rnbd_clt_dev_info info = { .size = sizeof(info) };
	struct rnbd_fio *r;
	struct fio_file *f;
	int rc;

	if (!td->files_index) {
		log_err("fio: rnbd: filename= names the device\n");
		return 1;
	}
	f = td->files[0];
	r = rnbd_fio_new(td);
	if (!r)
		return 1;
	/* A name of its own: the server may still be letting it go when the jobs open theirs. */
	{
		char base[sizeof(r->sessname)];

		memcpy(base, r->sessname, sizeof(base));
		snprintf(r->sessname, sizeof(r->sessname), "%.50s-size", base);
	}
	rc = rnbd_fio_connect(td, r, f->file_name);
	if (!rc)
		rc = rnbd_clt_dev_info(r->dev, &info);
	if (!rc) {
		f->real_file_size = info.bytes;
		fio_file_set_size_known(f);
	}
	rnbd_fio_free(r);
	return rc ? 1 : 0;
}

/* In the job: its own session and mapping. */
static int rnbd_fio_init(struct thread_data *td)
{
	struct rnbd_fio *r = rnbd_fio_new(td);
	unsigned depth = td->o.iodepth;

	if (!r)
		return 1;
	r->done = calloc(depth, sizeof(*r->done));
	r->events = calloc(depth, sizeof(*r->events));
	if (!r->done || !r->events || rnbd_fio_connect(td, r, td->files[0]->file_name)) {
		rnbd_fio_free(r);
		return 1;
	}
	r->polled = ((struct rnbd_fio_opts *)td->eo)->poll;
	td->io_ops_data = r;
	return 0;
}

static void rnbd_fio_cleanup(struct thread_data *td)
{
	rnbd_fio_free(td->io_ops_data);
	td->io_ops_data = NULL;
}

/* librnbd's thread: the IO is done. */
static void rnbd_fio_done(void *priv, int result)
{
	struct io_u *io_u = priv;
	struct rnbd_fio *r = io_u->engine_data;

	io_u->error = -result;
	if (!result)
		io_u->resid = 0;
	pthread_mutex_lock(&r->lock);
	r->done[r->nr_done++] = io_u;
	if (r->want && r->nr_done >= r->want)
		pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

static enum fio_q_status rnbd_fio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct rnbd_fio *r = td->io_ops_data;
	enum rnbd_clt_op op;
	int rc;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		op = RNBD_CLT_READ;
		break;
	case DDIR_WRITE:
		op = RNBD_CLT_WRITE;
		break;
	case DDIR_TRIM:
		op = RNBD_CLT_DISCARD;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		op = RNBD_CLT_FLUSH;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	io_u->engine_data = r;
	rc = rnbd_clt_submit(r->dev, op, 0, op == RNBD_CLT_FLUSH ? 0 : io_u->offset,
			     op == RNBD_CLT_READ || op == RNBD_CLT_WRITE ? io_u->xfer_buf : NULL,
			     op == RNBD_CLT_FLUSH ? 0 : (uint32_t)io_u->xfer_buflen, rnbd_fio_done,
			     io_u);
	if (rc) {
		io_u->error = -rc;
		return FIO_Q_COMPLETED;
	}
	return FIO_Q_QUEUED;
}

/* Milliseconds from now until the absolute CLOCK_REALTIME time t, at least 0. */
static int ms_until(const struct timespec *t)
{
	struct timespec now;
	int64_t ms;

	clock_gettime(CLOCK_REALTIME, &now);
	ms = (t->tv_sec - now.tv_sec) * 1000 + (t->tv_nsec - now.tv_nsec) / 1000000;
	return ms < 0 ? 0 : ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/*
 * Waits for min completions: polled, the completions run here on fio's
 * thread (rnbd_clt_poll); on a fabric without polling, they come from
 * librnbd's threads and wake this one.
 */
static int rnbd_fio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			      const struct timespec *t)
{
	struct rnbd_fio *r = td->io_ops_data;
	struct timespec until;
	unsigned n;

	if (t) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += t->tv_sec;
		until.tv_nsec += t->tv_nsec;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
	}
	if (r->polled) {
		/*
		 * Polls until min are in. With none in, also for min 0: what
		 * has come in is reaped now. With enough in already, not at all
		 * (each round reads every connection's CQ, a system call each).
		 */
		for (bool first = true;; first = false) {
			unsigned have;
			int rc;

			pthread_mutex_lock(&r->lock);
			have = r->nr_done;
			pthread_mutex_unlock(&r->lock);
			if (have >= min && (!first || have))
				break;
			rc = rnbd_clt_poll(r->sess, have >= min ? 0 : t ? ms_until(&until) : -1);
			if (rc == -EOPNOTSUPP) {
				r->polled = false;
				break;
			}
			if (rc < 0) {
				log_err("fio: rnbd: poll: %s\n", strerror(-rc));
				return -rc > 0 ? rc : -EIO;
			}
			if (rc == 0 && t && ms_until(&until) == 0)
				break;
		}
	}
	pthread_mutex_lock(&r->lock);
	while (!r->polled && r->nr_done < min) {
		r->want = min;
		if (!t)
			pthread_cond_wait(&r->cond, &r->lock);
		else if (pthread_cond_timedwait(&r->cond, &r->lock, &until) == ETIMEDOUT)
			break;
	}
	r->want = 0;
	n = r->nr_done < max ? r->nr_done : max;
	memcpy(r->events, r->done + r->nr_done - n, n * sizeof(*r->events));
	r->nr_done -= n;
	pthread_mutex_unlock(&r->lock);
	r->nr_events = n;
	return (int)n;
}

static struct io_u *rnbd_fio_event(struct thread_data *td, int event)
{
	struct rnbd_fio *r = td->io_ops_data;

	return event >= 0 && (unsigned)event < r->nr_events ? r->events[event] : NULL;
}

static int rnbd_fio_open_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int rnbd_fio_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int rnbd_fio_invalidate(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

/* fio finds the engine by this name (dlsym "ioengine"). */
struct ioengine_ops ioengine = {
	.name = "rnbd",
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
	.setup = rnbd_fio_setup,
	.init = rnbd_fio_init,
	.cleanup = rnbd_fio_cleanup,
	.queue = rnbd_fio_queue,
	.getevents = rnbd_fio_getevents,
	.event = rnbd_fio_event,
	.open_file = rnbd_fio_open_file,
	.close_file = rnbd_fio_close_file,
	.invalidate = rnbd_fio_invalidate,
	.options = options,
	.option_struct_size = sizeof(struct rnbd_fio_opts),
};
