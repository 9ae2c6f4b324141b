/* SPDX-License-Identifier: MIT */
/*
 * ublk: an RNBD device as /dev/ublkbN (ublk.h). One hardware queue; its
 * thread owns the queue's io_uring and issues every command of the queue
 * (the kernel takes a queue's commands from one task only):
 *
 *   FETCH_REQ for every tag, with the tag's buffer
 *   -> a request arrives (cqe, res OK): its descriptor is read, the IO sent
 *      to the RNBD device (rnbd_clt_submit)
 *   -> done: polled, on the queue thread itself (rnbd_clt_poll between
 *      its io_uring waits; the session's poll fd sits in the ring as a
 *      poll request while it sleeps); else, or on a fabric without polled
 *      completions, on a library thread: the tag goes on the done list,
 *      and the first on an empty list from another thread wakes the queue
 *      thread through an eventfd
 *   -> COMMIT_AND_FETCH_REQ with the result (bytes, or a negative errno),
 *      which also waits for the tag's next request
 *   -> STOP_DEV: the kernel answers the waiting commands with ABORT; when
 *      every tag is aborted the thread ends.
 *
 * Commands are the ioctl-encoded ones (_IOWR('u', ...)), which every
 * kernel with ublk takes; the legacy numbers may be configured out.
 *
 * Devices are made with user recovery and reissue: when the process ends
 * (its queue thread's commands cancelled as the thread exits), the kernel
 * quiesces the device, puts back the requests the daemon had taken and
 * not committed, and holds every request until a process recovers it
 * (START_USER_RECOVERY, every tag fetched again, END_USER_RECOVERY:
 * ublk_dev_recover). A handover (ublk_dev_handover) stops serving new
 * requests, commits those already sent, and ends the queue thread without
 * STOP_DEV, leaving the device for the next daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/ublk_cmd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dlog.h"
#include "ublk.h"

#ifndef UBLK_F_CMD_IOCTL_ENCODE
#define UBLK_F_CMD_IOCTL_ENCODE (1ULL << 6)
#endif

#ifndef UBLK_F_UPDATE_SIZE
#define UBLK_F_UPDATE_SIZE (1ULL << 10)  /* Linux 6.16: UPDATE_SIZE on a live device */
#endif

#define CTRL_OP(nr) _IOWR('u', (nr), struct ublksrv_ctrl_cmd)
#define CTRL_GET_FEATURES _IOR('u', 0x13, struct ublksrv_ctrl_cmd)
#define CTRL_DEL_DEV_ASYNC _IOR('u', 0x14, struct ublksrv_ctrl_cmd)
#define CTRL_UPDATE_SIZE _IOWR('u', 0x15, struct ublksrv_ctrl_cmd)
#define IO_OP(nr) _IOWR('u', (nr), struct ublksrv_io_cmd)

#define QD_MAX 64                  /* tags of the queue */
#define BUF_BYTES (256u << 10)     /* the largest request ublk hands us */
#define TAG_EFD UINT64_MAX         /* user_data of the eventfd read */
#define TAG_POLL (UINT64_MAX - 1)  /* user_data of the poll on the session's poll fd */

struct uio {
	struct ublk_dev *u;
	uint16_t tag;
	int result;
	struct uio *next;             /* on the done list */
};

/*
 * Who polls a session: one queue thread of the devices on it, so that a
 * completion wakes one thread, not every device's (the others' done
 * lists fill from the poller's thread, and their eventfds wake them).
 * When the poller's device goes, the next of the others to look takes it.
 */
struct poll_claim {
	struct poll_claim *next;
	struct rnbd_clt_sess *sess;
	unsigned refs;                 /* devices on sess (claims_lock) */
	_Atomic(struct ublk_dev *) owner;
	/*
	 * The session's IO slots, shared fairly: the devices with requests
	 * that found no slot free, in the order they found none (wait_lock).
	 * Only the head takes slots for waiting requests, and a device not
	 * listed takes none while any is (it lists itself behind them). Each
	 * completion on the session wakes the head (its eventfd), once until
	 * it looks (kicked).
	 */
	pthread_mutex_t wait_lock;
	struct ublk_dev *wait_head, *wait_tail;
	atomic_uint nwaiting;          /* devices listed */
	atomic_bool kicked;
};

static pthread_mutex_t claims_lock = PTHREAD_MUTEX_INITIALIZER;
static struct poll_claim *claims;

static struct poll_claim *claim_get(struct rnbd_clt_sess *sess)
{
	struct poll_claim *c;

	pthread_mutex_lock(&claims_lock);
	for (c = claims; c && c->sess != sess; c = c->next)
		;
	if (!c && (c = calloc(1, sizeof(*c)))) {
		c->sess = sess;
		atomic_init(&c->owner, NULL);
		pthread_mutex_init(&c->wait_lock, NULL);
		c->next = claims;
		claims = c;
	}
	if (c)
		c->refs++;
	pthread_mutex_unlock(&claims_lock);
	return c;
}

static void claim_put(struct poll_claim *c)
{
	pthread_mutex_lock(&claims_lock);
	if (--c->refs == 0) {
		struct poll_claim **pp = &claims;

		while (*pp != c)
			pp = &(*pp)->next;
		*pp = c->next;
		pthread_mutex_destroy(&c->wait_lock);
		free(c);
	}
	pthread_mutex_unlock(&claims_lock);
}

struct ublk_dev {
	char name[300];
	struct rnbd_clt_dev *d;
	struct rnbd_clt_sess *sess;    /* d's, polled by the queue thread */
	struct poll_claim *claim;      /* sess's poller, NULL: none (no memory) */
	struct rnbd_clt_dev_info info;
	int ctrl_fd, cdev_fd;
	int dev_id;
	struct io_uring ctrl;          /* SQE128: control commands carry 32 bytes */
	struct io_uring ring;          /* the queue's */
	unsigned qd;
	bool can_resize;               /* made with UBLK_F_UPDATE_SIZE */
	struct ublksrv_io_desc *descs;
	size_t descs_len;
	char *bufs;
	struct uio *ios;
	int efd;
	uint64_t efd_val;              /* the eventfd read's buffer */
	pthread_mutex_t lock;
	struct uio *done;              /* done list (lock) */
	pthread_t thread;
	bool thread_up;
	/*
	 * A handover (ublk_dev_handover): requests that come are left
	 * unanswered for the kernel to give the next daemon; sent counts
	 * those sent to the RNBD device and not yet committed.
	 */
	atomic_bool draining;
	atomic_uint sent;
	atomic_bool leaving;           /* the queue thread submits what it has and ends */
	/* The queue thread's start: 1 when every FETCH went in, or a negative errno. */
	pthread_cond_t cond;
	int ready;
	/*
	 * The queue thread's: requests that found every IO slot of the
	 * session taken (RNBD_CLT_F_NOWAIT), in order; sent again as slots
	 * free. The thread never sleeps in the library's slot wait, where a
	 * handover could not reach it while a server does not answer.
	 */
	uint16_t waitq[QD_MAX];
	unsigned wait_head, nwait;
	unsigned handed_waiting;       /* dropped from it by a handover: the kernel's again */
	struct ublk_dev *wait_next;    /* on claim's list (claim->wait_lock) */
	bool wait_listed;              /* on it (the queue thread's) */
};

int ublk_probe(char *why, size_t len)
{
	int fd = open("/dev/ublk-control", O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		int rc = -errno;

		snprintf(why, len, "no block device can be made here: /dev/ublk-control: %s "
			 "(this kernel has no ublk: Linux 6.0 or later with ublk_drv loaded)",
			 strerror(-rc));
		return rc;
	}
	close(fd);
	return 0;
}

static int ctrl_cmd_op(struct ublk_dev *u, unsigned op, void *addr, uint16_t len,
		       uint64_t data0);

static int ctrl_cmd(struct ublk_dev *u, unsigned nr, void *addr, uint16_t len, uint64_t data0)
{
	return ctrl_cmd_op(u, CTRL_OP(nr), addr, len, data0);
}

/*
 * Deletes the device. DEL_DEV waits until the device is freed, which is
 * when the last opener of /dev/ublkbN closes it: a forced unmap of a
 * mounted device, or of one qemu holds, would wait for the unmount or
 * the close (its request, and a daemon's stop behind it, for good).
 * DEL_DEV_ASYNC (Linux 6.5) deletes it the same and does not wait: the
 * device's number stays taken until that close. Older kernels wait.
 */
static int ctrl_del_dev(struct ublk_dev *u)
{
	int rc = ctrl_cmd_op(u, CTRL_DEL_DEV_ASYNC, NULL, 0, 0);

	if (rc == -EOPNOTSUPP || rc == -EINVAL || rc == -ENOTTY)
		rc = ctrl_cmd(u, UBLK_CMD_DEL_DEV, NULL, 0, 0);
	return rc;
}

/* The kernel's ublk features (GET_FEATURES, Linux 6.5); 0 where it cannot say. */
static uint64_t features(struct ublk_dev *u)
{
	uint64_t f = 0;

	return ctrl_cmd_op(u, CTRL_GET_FEATURES, &f, sizeof(f), 0) ? 0 : f;
}

static int ctrl_cmd_op(struct ublk_dev *u, unsigned op, void *addr, uint16_t len,
		       uint64_t data0)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ctrl);
	struct ublksrv_ctrl_cmd *c;
	struct io_uring_cqe *cqe;
	int rc;

	if (!sqe)
		return -EBUSY;
	memset(sqe, 0, 2 * sizeof(*sqe)); /* SQE128: the command fills the second half */
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = u->ctrl_fd;
	sqe->cmd_op = op;
	c = (struct ublksrv_ctrl_cmd *)sqe->cmd;
	c->dev_id = u->dev_id < 0 ? UINT32_MAX : (uint32_t)u->dev_id;
	c->queue_id = (uint16_t)-1;
	c->addr = (uintptr_t)addr;
	c->len = len;
	c->data[0] = data0;
	rc = io_uring_submit(&u->ctrl);
	if (rc < 0)
		return rc;
	do
		rc = io_uring_wait_cqe(&u->ctrl, &cqe);
	while (rc == -EINTR);
	if (rc)
		return rc;
	rc = cqe->res;
	io_uring_cqe_seen(&u->ctrl, cqe);
	return rc;
}

/* ---- the queue thread ---- */

/*
 * Only the completion that finds the done list empty wakes the queue
 * thread: the ones after it join the list that wake-up will take whole
 * (commit_done), so a burst of completions costs one eventfd write and one
 * wake-up, not one each. A wake-up that finds the list already taken
 * commits nothing.
 */
static _Thread_local struct ublk_dev *queue_of_thread; /* on a queue thread, its device */

/*
 * The head of the devices waiting for a slot woken (its eventfd), unless
 * it was since it last looked. Under wait_lock: a device leaves the list
 * before its eventfd is closed.
 */
static void claim_kick(struct poll_claim *c)
{
	uint64_t one = 1;

	if (atomic_exchange(&c->kicked, true))
		return;
	pthread_mutex_lock(&c->wait_lock);
	if (c->wait_head && c->wait_head != queue_of_thread &&
	    write(c->wait_head->efd, &one, sizeof(one)) != sizeof(one))
		abort(); /* an eventfd write cannot fail but by overflow */
	pthread_mutex_unlock(&c->wait_lock);
}

/* u behind the devices waiting for a slot (the queue thread, u not listed). */
static void wait_list(struct ublk_dev *u)
{
	struct poll_claim *c = u->claim;

	u->wait_listed = true;
	if (!c)
		return;
	pthread_mutex_lock(&c->wait_lock);
	u->wait_next = NULL;
	if (c->wait_tail)
		c->wait_tail->wait_next = u;
	else
		c->wait_head = u;
	c->wait_tail = u;
	atomic_fetch_add(&c->nwaiting, 1);
	pthread_mutex_unlock(&c->wait_lock);
}

/* u off the list (the queue thread: nothing of it waits, or it ends); the next head woken. */
static void wait_unlist(struct ublk_dev *u)
{
	struct poll_claim *c = u->claim;

	if (!u->wait_listed)
		return;
	u->wait_listed = false;
	if (!c)
		return;
	pthread_mutex_lock(&c->wait_lock);
	for (struct ublk_dev **pp = &c->wait_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->wait_next) {
		if (*pp == u) {
			*pp = u->wait_next;
			if (c->wait_tail == u)
				c->wait_tail = prev;
			break;
		}
	}
	atomic_fetch_sub(&c->nwaiting, 1);
	pthread_mutex_unlock(&c->wait_lock);
	atomic_store(&c->kicked, false);
	claim_kick(c);
}

/*
 * u, the head, found no slot for its next waiting request after taking
 * some: if others wait, it goes behind them. A device whose queue is
 * deeper than the session's slots (one taken over from a daemon whose
 * session had more) would otherwise never run out of waiting requests and
 * keep every slot that frees.
 */
static void wait_rotate(struct ublk_dev *u)
{
	struct poll_claim *c = u->claim;

	if (!c)
		return;
	pthread_mutex_lock(&c->wait_lock);
	if (c->wait_head == u && u->wait_next) {
		c->wait_head = u->wait_next;
		u->wait_next = NULL;
		c->wait_tail->wait_next = u;
		c->wait_tail = u;
	}
	pthread_mutex_unlock(&c->wait_lock);
}

/* Whether u may take slots for its waiting requests: the head, or no list (no memory). */
static bool wait_turn(struct ublk_dev *u)
{
	struct poll_claim *c = u->claim;
	bool head;

	if (!c)
		return true;
	atomic_store(&c->kicked, false);
	pthread_mutex_lock(&c->wait_lock);
	head = c->wait_head == u;
	pthread_mutex_unlock(&c->wait_lock);
	return head;
}

static void io_done(void *priv, int result)
{
	/*
	 * On the queue thread (a poll's completion, or a request that failed
	 * at once in serve) no eventfd is written: the thread commits the
	 * list after the poll and after each lap (queue_thread).
	 */
	struct uio *io = priv;
	struct ublk_dev *u = io->u;
	uint64_t one = 1;
	bool first;

	io->result = result;
	pthread_mutex_lock(&u->lock);
	first = !u->done;
	io->next = u->done;
	u->done = io;
	/*
	 * Under the lock: once it is dropped the queue thread may commit this
	 * IO, the device's last, and a stop then frees u (its eventfd closed,
	 * the number perhaps reused) while this thread is still here.
	 */
	if (first && queue_of_thread != u && write(u->efd, &one, sizeof(one)) != sizeof(one))
		abort(); /* an eventfd write cannot fail but by overflow */
	/*
	 * Its slot is free (librnbd puts it back before done): the head of
	 * those waiting takes it. Were it later, the head would find it at
	 * its next look (10 ms). Still under u->lock, for the reason above: u
	 * (and its claim) may be gone once it is dropped. Nothing takes
	 * u->lock under wait_lock.
	 */
	if (u->claim && atomic_load_explicit(&u->claim->nwaiting, memory_order_relaxed))
		claim_kick(u->claim);
	pthread_mutex_unlock(&u->lock);
}

static int prep_io_cmd(struct ublk_dev *u, unsigned nr, uint16_t tag, int result)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	struct ublksrv_io_cmd *c;

	if (!sqe)
		return -EBUSY;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = u->cdev_fd;
	sqe->cmd_op = IO_OP(nr);
	sqe->user_data = tag;
	c = (struct ublksrv_io_cmd *)sqe->cmd;
	c->q_id = 0;
	c->tag = tag;
	c->result = result;
	c->addr = (uintptr_t)(u->bufs + (size_t)tag * BUF_BYTES);
	return 0;
}

static int prep_efd_read(struct ublk_dev *u)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_read(sqe, u->efd, &u->efd_val, sizeof(u->efd_val), 0);
	sqe->user_data = TAG_EFD;
	return 0;
}

/* While the queue thread sleeps: wakes it when the session has completions to poll. */
static int prep_poll(struct ublk_dev *u, int fd)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	sqe->user_data = TAG_POLL;
	return 0;
}

/*
 * A request in tag's descriptor: sent to the RNBD device, or answered at
 * once; 1 when no IO slot of the session is free (nothing done), else 0
 * or a negative errno (the ring is full: the thread cannot go on).
 */
static int serve(struct ublk_dev *u, uint16_t tag)
{
	const struct ublksrv_io_desc *iod = &u->descs[tag];
	uint32_t flags = ublksrv_get_flags(iod), rflags = 0;
	uint64_t off = iod->start_sector << 9;
	uint32_t len = iod->nr_sectors << 9;
	struct uio *io = &u->ios[tag];
	enum rnbd_clt_op op;
	void *buf = NULL;
	int rc;

	switch (ublksrv_get_op(iod)) {
	case UBLK_IO_OP_READ:
		op = RNBD_CLT_READ;
		buf = u->bufs + (size_t)tag * BUF_BYTES;
		break;
	case UBLK_IO_OP_WRITE:
		op = RNBD_CLT_WRITE;
		buf = u->bufs + (size_t)tag * BUF_BYTES;
		if (flags & (UBLK_IO_F_FUA >> 8))
			rflags |= RNBD_CLT_F_FUA;
		break;
	case UBLK_IO_OP_FLUSH:
		op = RNBD_CLT_FLUSH;
		off = 0;
		len = 0;
		break;
	case UBLK_IO_OP_DISCARD:
		op = RNBD_CLT_DISCARD;
		break;
	case UBLK_IO_OP_WRITE_ZEROES:
		op = RNBD_CLT_WRITE_ZEROES;
		if (flags & (UBLK_IO_F_NOUNMAP >> 8))
			rflags |= RNBD_CLT_F_NOUNMAP;
		break;
	default:
		return prep_io_cmd(u, UBLK_IO_COMMIT_AND_FETCH_REQ, tag, -EOPNOTSUPP);
	}
	if ((op == RNBD_CLT_READ || op == RNBD_CLT_WRITE) && len > BUF_BYTES)
		return prep_io_cmd(u, UBLK_IO_COMMIT_AND_FETCH_REQ, tag, -EIO);
	io->result = 0;
	atomic_fetch_add(&u->sent, 1);
	rc = rnbd_clt_submit(u->d, op, rflags | RNBD_CLT_F_NOWAIT, off, buf, len, io_done, io);
	if (rc) {
		atomic_fetch_sub(&u->sent, 1);
		if (rc == -EAGAIN)
			return 1;
		return prep_io_cmd(u, UBLK_IO_COMMIT_AND_FETCH_REQ, tag, rc);
	}
	return 0;
}

/*
 * A new request: behind those waiting for a slot (this device's, or any
 * device's of the session), else served. 0 or a negative errno.
 */
static int serve_new(struct ublk_dev *u, uint16_t tag)
{
	bool others = u->claim && atomic_load(&u->claim->nwaiting);
	int rc = u->nwait || others ? 1 : serve(u, tag);

	if (rc == 1) {
		u->waitq[(u->wait_head + u->nwait++) % QD_MAX] = tag;
		if (!u->wait_listed)
			wait_list(u);
		rc = 0;
	}
	return rc;
}

/*
 * Those waiting for a slot, in order, while slots are free and it is
 * this device's turn; off the list once none waits. 0 or a negative errno.
 */
static int serve_waiting(struct ublk_dev *u)
{
	unsigned served = 0;
	int rc = 0;

	if (!wait_turn(u))
		return 0;
	while (u->nwait) {
		rc = serve(u, u->waitq[u->wait_head]);
		if (rc == 1) {
			if (served)
				wait_rotate(u); /* the others' turn: one round of slots each */
			return 0;
		}
		served++;
		u->wait_head = (u->wait_head + 1) % QD_MAX;
		u->nwait--;
		if (rc)
			break;
	}
	if (!u->nwait)
		wait_unlist(u);
	return rc;
}

/* The done list: each tag's result committed, its next request fetched. */
static int commit_done(struct ublk_dev *u)
{
	struct uio *list;
	int rc = 0;

	pthread_mutex_lock(&u->lock);
	list = u->done;
	u->done = NULL;
	pthread_mutex_unlock(&u->lock);
	for (struct uio *io = list; io && !rc; io = io->next) {
		const struct ublksrv_io_desc *iod = &u->descs[io->tag];
		uint8_t op = ublksrv_get_op(iod);
		int res = io->result;

		/* Reads and writes answer the bytes done; the rest 0. */
		if (!res && (op == UBLK_IO_OP_READ || op == UBLK_IO_OP_WRITE))
			res = (int)(iod->nr_sectors << 9);
		rc = prep_io_cmd(u, UBLK_IO_COMMIT_AND_FETCH_REQ, io->tag, res);
		atomic_fetch_sub(&u->sent, 1);
	}
	return rc;
}

static void set_ready(struct ublk_dev *u, int v)
{
	pthread_mutex_lock(&u->lock);
	u->ready = v;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
}

/*
 * The polled part of a lap: the session's completions run here, what
 * they finished is committed, and the session is made ready for the
 * sleeps to come. Returns how long the next sleep may be: 1 (until a
 * cqe; *armed: the session stays armed, over as many laps as need not
 * poll, until rnbd_clt_poll_wait_end), or 0 (poll again first).
 * On a fabric without polled completions, or after a poll error,
 * *poll_fd goes to -1 and the library's threads complete from then on.
 */
static unsigned queue_poll(struct ublk_dev *u, int *poll_fd, bool *poll_queued, bool *armed,
			   bool *stuck)
{
	int rc = rnbd_clt_poll(u->sess, 0);

	*armed = false;
	if (rc < 0) {
		/* -EOPNOTSUPP: the fabric has no polled mode; else the library's threads take over. */
		if (rc == -EOPNOTSUPP)
			dlog(DLOG_INFO, "ublk: /dev/ublkb%d (%s): the fabric has no polled "
			     "completions: they come on the library's threads", u->dev_id, u->name);
		else
			dlog(DLOG_WARN, "ublk: /dev/ublkb%d (%s): polling the session: %s; "
			     "completions on the library's threads from now on", u->dev_id, u->name,
			     strerror(-rc));
		*poll_fd = -1;
		return 1;
	}
	if (commit_done(u)) {
		*stuck = true;
		return 1;
	}
	rc = rnbd_clt_poll_wait_begin(u->sess);
	if (rc == -EAGAIN)
		return 0;
	if (rc < 0) {
		dlog(DLOG_WARN, "ublk: /dev/ublkb%d (%s): arming the session's poll: %s; "
		     "completions on the library's threads from now on", u->dev_id, u->name,
		     strerror(-rc));
		*poll_fd = -1;
		return 1;
	}
	if (!*poll_queued) {
		if (prep_poll(u, *poll_fd)) {
			rnbd_clt_poll_wait_end(u->sess);
			*stuck = true;
			return 1;
		}
		*poll_queued = true;
	}
	*armed = true;
	return 1;
}

/*
 * The session's poller, if none is: its poll fd; -EBUSY while another
 * device's thread polls; another negative errno when the session cannot
 * be polled (a fabric without polled completions).
 */
static int poll_take(struct ublk_dev *u)
{
	struct ublk_dev *none = NULL;
	int fd;

	if (!u->claim)
		return -ENOMEM;
	if (atomic_load_explicit(&u->claim->owner, memory_order_relaxed) ||
	    !atomic_compare_exchange_strong(&u->claim->owner, &none, u))
		return -EBUSY;
	fd = rnbd_clt_poll_fd(u->sess);
	if (fd < 0) {
		atomic_store(&u->claim->owner, NULL);
		dlog(DLOG_INFO, "ublk: /dev/ublkb%d (%s): completions on the library's threads "
		     "(no polled mode: %s)", u->dev_id, u->name, strerror(-fd));
		return fd;
	}
	dlog(DLOG_INFO, "ublk: /dev/ublkb%d (%s): its queue thread polls the session's "
	     "completions", u->dev_id, u->name);
	return fd;
}

static void poll_give_back(struct ublk_dev *u)
{
	struct ublk_dev *me = u;

	if (u->claim)
		atomic_compare_exchange_strong(&u->claim->owner, &me, NULL);
}

static void *queue_thread(void *arg)
{
	struct ublk_dev *u = arg;
	unsigned aborted = 0;
	int poll_fd = -1;
	/*
	 * armed: between rnbd_clt_poll_wait_begin and _end, across laps: a
	 * lap woken only by the kernel's requests leaves the session armed
	 * (what they send cannot be missed: its completion, or a send the
	 * provider must progress, makes the poll fd readable). poll_due: the
	 * poll fired, so the next lap polls.
	 */
	bool poll_queued = false, may_poll = true, armed = false, poll_due = false;
	char tname[16];
	int rc;

	/* Its own name, not its creator's (a kernel report names the thread). */
	snprintf(tname, sizeof(tname), "ublkq%d", u->dev_id);
	pthread_setname_np(pthread_self(), tname);
	queue_of_thread = u;

	for (uint16_t t = 0; t < u->qd; t++) {
		rc = prep_io_cmd(u, UBLK_IO_FETCH_REQ, t, 0);
		if (rc)
			break;
	}
	rc = prep_efd_read(u);
	if (!rc)
		rc = io_uring_submit(&u->ring);
	set_ready(u, rc < 0 ? rc : 1);
	if (rc < 0)
		return NULL;
	while (aborted < u->qd) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0, wait = 1;
		bool stuck = false;

		if (atomic_load(&u->leaving)) {
			/* A handover: the last commits go in; the fetches stay for the kernel to cancel. */
			io_uring_submit(&u->ring);
			break;
		}
		if (poll_fd < 0 && may_poll) {
			poll_fd = poll_take(u);
			if (poll_fd < 0 && poll_fd != -EBUSY)
				may_poll = false;
		}
		if (poll_fd >= 0 && (!armed || poll_due)) {
			if (armed)
				rnbd_clt_poll_wait_end(u->sess);
			poll_due = false;
			wait = queue_poll(u, &poll_fd, &poll_queued, &armed, &stuck);
			if (poll_fd < 0) {
				/* No polled mode (or it failed): library threads, from now on. */
				may_poll = false;
				poll_give_back(u);
			}
		}
		if (stuck)
			break; /* no room in the ring: cannot go on */
		/* A handover leaves those waiting for a slot to the kernel, for the next daemon. */
		if (u->nwait && atomic_load(&u->draining)) {
			u->handed_waiting += u->nwait;
			u->nwait = 0;
			wait_unlist(u);
		}
		/*
		 * A request sent from the waiting ones may fail at once, on this
		 * thread (no path, the session closing): no eventfd is written
		 * for it, and with none left waiting the wait below has no
		 * timeout. Committed now, or the tag would wait for an
		 * unrelated request.
		 */
		if (u->wait_listed && (serve_waiting(u) || commit_done(u)))
			break;
		if (u->nwait && wait) {
			/*
			 * A completion on the session wakes the head (claim_kick);
			 * a slot freed otherwise (a fence releasing those it held)
			 * is seen within 10 ms.
			 */
			struct __kernel_timespec ts = { .tv_nsec = 10000000 };
			struct io_uring_cqe *first;

			rc = io_uring_submit_and_wait_timeout(&u->ring, &first, wait, &ts, NULL);
			if (rc == -ETIME)
				rc = 0;
		} else {
			rc = io_uring_submit_and_wait(&u->ring, wait);
		}
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
			break;
		io_uring_for_each_cqe(&u->ring, head, cqe) {
			seen++;
			if (cqe->user_data == TAG_POLL) {
				poll_queued = false; /* fired: the next lap polls and queues another */
				poll_due = true;
				continue;
			}
			if (cqe->user_data == TAG_EFD) {
				if (prep_efd_read(u) || commit_done(u))
					aborted = u->qd; /* no room: cannot go on */
				continue;
			}
			if (cqe->res == UBLK_IO_RES_OK) {
				/* Handing over: the kernel gives it to the next daemon. */
				if (atomic_load(&u->draining))
					continue;
				if (serve_new(u, (uint16_t)cqe->user_data))
					aborted = u->qd;
			} else {
				/* ABORT (stopping), or a command refused: the tag is done. */
				aborted++;
			}
		}
		io_uring_cq_advance(&u->ring, seen);
		/*
		 * A request that failed at once in serve (no path, the session
		 * closing) completed on this thread outside a poll, and
		 * io_done wrote no eventfd for it: committed here, or the tag
		 * (and every completion after it, which finds the list
		 * non-empty) would wait for ever.
		 */
		if (aborted < u->qd && commit_done(u))
			aborted = u->qd;
	}
	if (armed)
		rnbd_clt_poll_wait_end(u->sess);
	wait_unlist(u); /* before the eventfd closes: others' completions kick the head */
	poll_give_back(u);
	return NULL;
}

/* ---- add and remove ---- */

static void dev_free(struct ublk_dev *u)
{
	if (u->claim)
		claim_put(u->claim);
	if (u->descs && u->descs != MAP_FAILED)
		munmap(u->descs, u->descs_len);
	if (u->cdev_fd >= 0)
		close(u->cdev_fd);
	if (u->ring.ring_fd > 0)
		io_uring_queue_exit(&u->ring);
	if (u->dev_id >= 0)
		ctrl_del_dev(u);
	if (u->ctrl.ring_fd > 0)
		io_uring_queue_exit(&u->ctrl);
	if (u->ctrl_fd >= 0)
		close(u->ctrl_fd);
	if (u->efd >= 0)
		close(u->efd);
	free(u->bufs);
	free(u->ios);
	pthread_mutex_destroy(&u->lock);
	pthread_cond_destroy(&u->cond);
	free(u);
}

static unsigned shift_of(uint32_t v)
{
	unsigned s = 0;

	while (v > 1) {
		v >>= 1;
		s++;
	}
	return s;
}

/* The device of d, its control ring open; dev_id -1 (none yet). 0 or a negative errno with why. */
static int dev_new(struct rnbd_clt_sess *sess, struct rnbd_clt_dev *d, const char *name,
		   struct ublk_dev **out, char *why, size_t len)
{
	struct ublk_dev *u = calloc(1, sizeof(*u));
	long page = sysconf(_SC_PAGESIZE);
	int rc;

	*out = u;
	if (!u)
		return -ENOMEM;
	u->ctrl_fd = u->cdev_fd = u->efd = -1;
	u->dev_id = -1;
	u->d = d;
	u->sess = sess;
	u->claim = claim_get(sess); /* NULL (no memory): not polled, done on library threads */
	pthread_mutex_init(&u->lock, NULL);
	pthread_cond_init(&u->cond, NULL);
	snprintf(u->name, sizeof(u->name), "%s", name);
	u->info.size = sizeof(u->info);
	rc = rnbd_clt_dev_info(d, &u->info);
	if (rc) {
		snprintf(why, len, "the device's limits: %s", strerror(-rc));
		return rc;
	}
	u->qd = u->info.queue_depth < QD_MAX ? u->info.queue_depth : QD_MAX;
	if (!u->qd || u->info.logical_block_size < 512 || u->info.logical_block_size > (uint32_t)page) {
		snprintf(why, len, "limits ublk cannot take (queue depth %u, block size %u)",
			 u->info.queue_depth, u->info.logical_block_size);
		return -EINVAL;
	}
	u->ctrl_fd = open("/dev/ublk-control", O_RDWR | O_CLOEXEC);
	if (u->ctrl_fd < 0) {
		rc = -errno;
		snprintf(why, len, "/dev/ublk-control: %s", strerror(-rc));
		return rc;
	}
	rc = io_uring_queue_init(4, &u->ctrl, IORING_SETUP_SQE128);
	if (rc)
		snprintf(why, len, "an io_uring with 128-byte entries: %s", strerror(-rc));
	return rc;
}

/*
 * The queue of u->dev_id (u->qd tags): its descriptors (read-only mapping),
 * buffers, ring, eventfd and thread, every tag fetched. 0 or a negative
 * errno with why; on failure the thread, if it started, is u->thread_up.
 */
static int queue_start(struct ublk_dev *u, char *why, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	char path[64];
	int rc;

	snprintf(path, sizeof(path), "/dev/ublkc%d", u->dev_id);
	for (int i = 0; i < 100 && (u->cdev_fd = open(path, O_RDWR | O_CLOEXEC)) < 0 &&
			errno == ENOENT; i++)
		usleep(10000); /* udev (or devtmpfs) makes the node */
	if (u->cdev_fd < 0) {
		rc = -errno;
		snprintf(why, len, "%s: %s", path, strerror(-rc));
		return rc;
	}
	u->descs_len = ((size_t)u->qd * sizeof(*u->descs) + (size_t)page - 1) & ~((size_t)page - 1);
	u->descs = mmap(NULL, u->descs_len, PROT_READ, MAP_SHARED | MAP_POPULATE, u->cdev_fd,
			UBLKSRV_CMD_BUF_OFFSET);
	if (u->descs == MAP_FAILED) {
		rc = -errno;
		snprintf(why, len, "mapping %s's descriptors: %s", path, strerror(-rc));
		return rc;
	}
	if (posix_memalign((void **)&u->bufs, (size_t)page, (size_t)u->qd * BUF_BYTES) ||
	    !(u->ios = calloc(u->qd, sizeof(*u->ios)))) {
		snprintf(why, len, "out of memory for %u buffers", u->qd);
		return -ENOMEM;
	}
	for (unsigned t = 0; t < u->qd; t++) {
		u->ios[t].u = u;
		u->ios[t].tag = (uint16_t)t;
	}
	u->efd = eventfd(0, EFD_CLOEXEC);
	rc = u->efd < 0 ? -errno : io_uring_queue_init(2 * u->qd + 3, &u->ring, 0);
	if (rc) {
		snprintf(why, len, "the queue's io_uring: %s", strerror(-rc));
		return rc;
	}
	rc = -pthread_create(&u->thread, NULL, queue_thread, u);
	if (rc) {
		snprintf(why, len, "the queue thread: %s", strerror(-rc));
		return rc;
	}
	u->thread_up = true;
	pthread_mutex_lock(&u->lock);
	while (!u->ready)
		pthread_cond_wait(&u->cond, &u->lock);
	rc = u->ready < 0 ? u->ready : 0;
	pthread_mutex_unlock(&u->lock);
	if (rc)
		snprintf(why, len, "fetching the first requests: %s", strerror(-rc));
	return rc;
}

static pthread_once_t mark_once = PTHREAD_ONCE_INIT;
static uint64_t mark;

static void mark_init(void)
{
	struct stat sb;

	if (!stat("/proc/self/ns/pid", &sb) && (uint32_t)sb.st_ino)
		mark = UBLK_MARK_MAGIC | (uint32_t)sb.st_ino;
}

uint64_t ublk_mark(void)
{
	pthread_once(&mark_once, mark_init);
	return mark;
}

#ifdef RTRS_FAULT_INJECTION
/* Tests (the ublk suite): RNBD_CLIENTD_FAULT is what. */
static bool fault_is(const char *what)
{
	const char *f = getenv("RNBD_CLIENTD_FAULT");

	return f && !strcmp(f, what);
}
#endif

static pthread_mutex_t add_lock_mu = PTHREAD_MUTEX_INITIALIZER;
static int add_lock_fd = -1;      /* the flock's descriptor while add_lock_users > 0 */
static unsigned add_lock_users;

int ublk_add_lock(unsigned wait_ms)
{
	int fd, rc = 0;

	pthread_mutex_lock(&add_lock_mu);
	if (add_lock_users) {
		add_lock_users++;
		goto out;
	}
	fd = open("/dev/ublk-control", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	for (unsigned waited = 0;; waited += 20) {
		if (!flock(fd, LOCK_EX | LOCK_NB)) {
			add_lock_fd = fd;
			add_lock_users = 1;
			goto out;
		}
		if (errno != EWOULDBLOCK && errno != EINTR) {
			rc = -errno;
			break;
		}
		if (waited >= wait_ms) {
			rc = -EWOULDBLOCK;
			break;
		}
		usleep(20000);
	}
	close(fd);
out:
	pthread_mutex_unlock(&add_lock_mu);
	return rc;
}

void ublk_add_unlock(int taken)
{
	if (taken < 0)
		return;
	pthread_mutex_lock(&add_lock_mu);
	if (add_lock_users && !--add_lock_users) {
		close(add_lock_fd); /* the lock goes with the last descriptor of its open file */
		add_lock_fd = -1;
	}
	pthread_mutex_unlock(&add_lock_mu);
}

uint64_t ublk_dev_ident(int dev_id)
{
	char path[64];
	struct stat sb;

	snprintf(path, sizeof(path), "/sys/class/ublk-char/ublkc%d", dev_id);
	return dev_id >= 0 && !stat(path, &sb) ? (uint64_t)sb.st_ino : 0;
}

/*
 * How long an add waits for the add lock: others hold it for an add's
 * few steps or a start's scan. One that is stopped (SIGSTOP) or stuck
 * holds it for good; the add then goes on without it, which costs it
 * only the scan's protection (a daemon starting meanwhile may delete the
 * device before it starts, and the map fails).
 */
#define ADD_LOCK_WAIT_MS 10000

int ublk_dev_add(struct rnbd_clt_sess *sess, struct rnbd_clt_dev *d, const char *name,
		 ublk_before_start_fn *before_start, void *priv, struct ublk_dev **out,
		 int *dev_id, char *why, size_t len)
{
	struct ublksrv_ctrl_dev_info di = { 0 };
	struct ublk_params p = { 0 };
	struct ublk_dev *u;
	uint32_t max_io;
	int rc, lk;

	lk = ublk_add_lock(ADD_LOCK_WAIT_MS);
	if (lk < 0)
		dlog(DLOG_WARN, "ublk: adding %s without the add lock: %s", name,
		     lk == -EWOULDBLOCK ? "another process held it for 10 s" : strerror(-lk));
	rc = dev_new(sess, d, name, &u, why, len);
	if (rc)
		goto fail;
	/*
	 * ADD_DEV: one queue, our depth and buffer size; the kernel picks the
	 * number. With user recovery the device outlives this daemon: when it
	 * dies the kernel holds the device's IO, and gives what this daemon
	 * had taken and not answered to the next one (REISSUE), which
	 * ublk_dev_recover attaches.
	 */
	di.nr_hw_queues = 1;
	di.queue_depth = (uint16_t)u->qd;
	di.max_io_buf_bytes = BUF_BYTES;
	di.dev_id = UINT32_MAX;
	/*
	 * Ours until START_DEV sets the serving pid: a device whose daemon
	 * died before starting it is known by this (rnbd-clientd's
	 * recover_scan, and where it died before its record, orphan_scan by
	 * the mark, which the kernel keeps and GET_DEV_INFO returns).
	 */
	di.ublksrv_pid = getpid();
	di.ublksrv_flags = ublk_mark();
#ifdef RTRS_FAULT_INJECTION
	/* Tests (the ublk suite): a device as another program adds it, unmarked. */
	if (fault_is("kill-after-add-foreign"))
		di.ublksrv_flags = 0;
#endif
	di.flags = UBLK_F_CMD_IOCTL_ENCODE | UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE;
	/* Where the kernel can change a live device's size, client.resize reaches it. */
	if (features(u) & UBLK_F_UPDATE_SIZE)
		di.flags |= UBLK_F_UPDATE_SIZE;
	rc = ctrl_cmd(u, UBLK_CMD_ADD_DEV, &di, sizeof(di), 0);
	if (rc) {
		snprintf(why, len, "ublk ADD_DEV: %s", strerror(-rc));
		goto fail;
	}
	u->dev_id = (int)di.dev_id;
	u->can_resize = di.flags & UBLK_F_UPDATE_SIZE;
#ifdef RTRS_FAULT_INJECTION
	/*
	 * Tests (the ublk suite): the daemon killed (or stopped, as a live
	 * one in the middle of an add) between ADD_DEV and its record.
	 */
	if (fault_is("kill-after-add") || fault_is("kill-after-add-foreign"))
		raise(SIGKILL);
	if (fault_is("stop-after-add"))
		raise(SIGSTOP);
#endif
	/* SET_PARAMS: the device's size, blocks, largest IO and what it offers. */
	max_io = u->info.max_io < di.max_io_buf_bytes ? u->info.max_io : di.max_io_buf_bytes;
	p.len = sizeof(p);
	p.types = UBLK_PARAM_TYPE_BASIC;
	p.basic.logical_bs_shift = (uint8_t)shift_of(u->info.logical_block_size);
	p.basic.physical_bs_shift = (uint8_t)shift_of(u->info.physical_block_size >
						     u->info.logical_block_size ?
						     u->info.physical_block_size :
						     u->info.logical_block_size);
	p.basic.io_min_shift = p.basic.logical_bs_shift;
	p.basic.io_opt_shift = p.basic.physical_bs_shift;
	p.basic.max_sectors = max_io >> 9;
	p.basic.dev_sectors = u->info.bytes >> 9;
	if (u->info.read_only)
		p.basic.attrs |= UBLK_ATTR_READ_ONLY;
	if (u->info.write_cache) {
		p.basic.attrs |= UBLK_ATTR_VOLATILE_CACHE;
		if (u->info.fua)
			p.basic.attrs |= UBLK_ATTR_FUA;
	}
	if (u->info.discard || u->info.write_zeroes) {
		p.types |= UBLK_PARAM_TYPE_DISCARD;
		p.discard.discard_granularity = u->info.logical_block_size;
		p.discard.max_discard_sectors = u->info.discard ? 1u << 21 : 0;
		p.discard.max_discard_segments = 1;
		p.discard.max_write_zeroes_sectors = u->info.write_zeroes ? 1u << 21 : 0;
	}
	rc = ctrl_cmd(u, UBLK_CMD_SET_PARAMS, &p, sizeof(p), 0);
	if (rc) {
		snprintf(why, len, "ublk SET_PARAMS: %s", strerror(-rc));
		goto fail;
	}
	rc = queue_start(u, why, len);
	if (rc)
		goto fail;
	if (before_start)
		before_start(priv, u->dev_id);
#ifdef RTRS_FAULT_INJECTION
	/* Tests (the ublk suite): the daemon killed between its record and START_DEV. */
	if (fault_is("kill-before-start"))
		raise(SIGKILL);
#endif
	/* START_DEV waits until every tag is fetched, then adds /dev/ublkbN. */
	rc = ctrl_cmd(u, UBLK_CMD_START_DEV, NULL, 0, (uint64_t)getpid());
	if (rc) {
		snprintf(why, len, "ublk START_DEV: %s", strerror(-rc));
		goto fail;
	}
#ifdef RTRS_FAULT_INJECTION
	/* Tests (the ublk suite): the daemon killed the instant its device started. */
	if (fault_is("kill-after-start"))
		raise(SIGKILL);
#endif
	ublk_add_unlock(lk);
	*out = u;
	*dev_id = u->dev_id;
	return 0;
fail:
	if (u && u->thread_up) {
		/* STOP_DEV aborts the fetched tags; the thread ends with them. */
		ctrl_cmd(u, UBLK_CMD_STOP_DEV, NULL, 0, 0);
		pthread_join(u->thread, NULL);
	}
	if (u)
		dev_free(u);
	ublk_add_unlock(lk);
	return rc;
}

int ublk_dev_state(int dev_id, struct ublk_state *st)
{
	struct ublksrv_ctrl_dev_info di = { 0 };
	struct ublk_dev u = { .ctrl_fd = -1, .dev_id = dev_id };
	int rc;

	if (dev_id < 0)
		return -ENODEV;
	u.ctrl_fd = open("/dev/ublk-control", O_RDWR | O_CLOEXEC);
	if (u.ctrl_fd < 0)
		return -errno;
	rc = io_uring_queue_init(4, &u.ctrl, IORING_SETUP_SQE128);
	if (!rc) {
		rc = ctrl_cmd(&u, UBLK_CMD_GET_DEV_INFO, &di, sizeof(di), 0);
		io_uring_queue_exit(&u.ctrl);
	}
	close(u.ctrl_fd);
	if (rc)
		return rc;
	st->state = di.state;
	st->recoverable = di.flags & UBLK_F_USER_RECOVERY;
	st->pid = di.ublksrv_pid;
	st->queue_depth = di.queue_depth;
	st->marked = ublk_mark() && di.ublksrv_flags == ublk_mark();
	st->ident = ublk_dev_ident(dev_id);
	return 0;
}

int ublk_dev_abandon(int dev_id)
{
	struct ublk_dev u = { .ctrl_fd = -1, .dev_id = dev_id };
	int rc;

	u.ctrl_fd = open("/dev/ublk-control", O_RDWR | O_CLOEXEC);
	if (u.ctrl_fd < 0)
		return -errno;
	rc = io_uring_queue_init(4, &u.ctrl, IORING_SETUP_SQE128);
	if (!rc) {
		rc = ctrl_cmd(&u, UBLK_CMD_STOP_DEV, NULL, 0, 0);
		if (!rc)
			rc = ctrl_del_dev(&u);
		io_uring_queue_exit(&u.ctrl);
	}
	close(u.ctrl_fd);
	return rc;
}

int ublk_dev_recover(struct rnbd_clt_sess *sess, struct rnbd_clt_dev *d, const char *name,
		     int dev_id, unsigned wait_ms, bool (*stop)(void), bool *touched,
		     struct ublk_dev **out, char *why, size_t len)
{
	struct ublksrv_ctrl_dev_info di = { 0 };
	struct ublk_params p = { .len = sizeof(p) };
	struct ublk_dev *u;
	unsigned waited = 0;
	int rc;

	*touched = false;
	rc = dev_new(sess, d, name, &u, why, len);
	if (rc)
		goto fail_nodev;
	u->dev_id = dev_id;
	rc = ctrl_cmd(u, UBLK_CMD_GET_DEV_INFO, &di, sizeof(di), 0);
	if (rc) {
		snprintf(why, len, "ublk GET_DEV_INFO of /dev/ublkb%d: %s", dev_id, strerror(-rc));
		goto fail_nodev;
	}
	if (!(di.flags & UBLK_F_USER_RECOVERY) || di.nr_hw_queues != 1 || !di.queue_depth ||
	    di.queue_depth > QD_MAX || di.max_io_buf_bytes > BUF_BYTES) {
		rc = -EINVAL;
		snprintf(why, len, "/dev/ublkb%d was not made by rnbd-clientd with user recovery "
			 "(flags %#llx, %u queues of %u)", dev_id, (unsigned long long)di.flags,
			 di.nr_hw_queues, di.queue_depth);
		goto fail_nodev;
	}
	u->qd = di.queue_depth;
	u->can_resize = di.flags & UBLK_F_UPDATE_SIZE;
	/* What the device offers now against what the block device says. */
	if (!ctrl_cmd(u, UBLK_CMD_GET_PARAMS, &p, sizeof(p), 0) &&
	    (uint64_t)p.basic.dev_sectors << 9 > u->info.bytes)
		dlog(DLOG_WARN, "ublk: /dev/ublkb%d (%s): the device has %llu bytes now, the block "
		     "device %llu: IO beyond the device's end fails", dev_id, name,
		     (unsigned long long)u->info.bytes,
		     (unsigned long long)p.basic.dev_sectors << 9);
	/*
	 * START_USER_RECOVERY: once the old daemon has exited (its /dev/ublkcN
	 * released) and the kernel has quiesced the device; -EBUSY until then.
	 */
	for (;;) {
		if (stop && stop()) {
			rc = -ESHUTDOWN;
			snprintf(why, len, "the daemon is stopping: /dev/ublkb%d is left for the next",
				 dev_id);
			goto fail_nodev;
		}
		rc = ctrl_cmd(u, UBLK_CMD_START_USER_RECOVERY, NULL, 0, 0);
		if (rc != -EBUSY || waited >= wait_ms)
			break;
		usleep(20000);
		waited += 20;
	}
	if (!rc)
		*touched = true;
	if (rc) {
		snprintf(why, len, "ublk START_USER_RECOVERY of /dev/ublkb%d: %s%s", dev_id,
			 strerror(-rc), rc == -EBUSY ? " (another daemon still serves it, or the "
			 "kernel has not quiesced it)" : "");
		goto fail_nodev;
	}
	rc = queue_start(u, why, len);
	if (rc)
		goto fail;
	/* END_USER_RECOVERY waits for every tag's fetch, then lets the held IO through. */
	rc = ctrl_cmd(u, UBLK_CMD_END_USER_RECOVERY, NULL, 0, (uint64_t)getpid());
	if (rc) {
		snprintf(why, len, "ublk END_USER_RECOVERY of /dev/ublkb%d: %s", dev_id,
			 strerror(-rc));
		goto fail;
	}
	*out = u;
	return 0;
fail:
	/*
	 * Recovery started: the device cannot be given back half attached.
	 * STOP_DEV ends it (its held IO fails); the caller forgets it.
	 */
	if (u && u->dev_id >= 0) {
		ctrl_cmd(u, UBLK_CMD_STOP_DEV, NULL, 0, 0);
		if (u->thread_up)
			pthread_join(u->thread, NULL);
	}
	if (u)
		dev_free(u);
	return rc;
fail_nodev:
	/* Nothing done to the device: another try (or daemon) may still recover it. */
	if (u) {
		u->dev_id = -1;
		dev_free(u);
	}
	return rc;
}

int ublk_dev_resize(struct ublk_dev *u, uint64_t bytes)
{
	if (!u->can_resize)
		return -EOPNOTSUPP;
	return ctrl_cmd_op(u, CTRL_UPDATE_SIZE, NULL, 0, bytes >> 9);
}

bool ublk_dev_can_resize(const struct ublk_dev *u)
{
	return u->can_resize;
}

unsigned ublk_dev_handover(struct ublk_dev *u, unsigned wait_ms)
{
	uint64_t one = 1;
	unsigned left, waited = 0;

	if (!u)
		return 0;
	atomic_store(&u->draining, true);
	while ((left = atomic_load(&u->sent)) && waited < wait_ms) {
		usleep(5000);
		waited += 5;
	}
	atomic_store(&u->leaving, true);
	if (write(u->efd, &one, sizeof(one)) != sizeof(one))
		abort(); /* an eventfd write cannot fail but by overflow */
	pthread_join(u->thread, NULL);
	u->thread_up = false;
	return atomic_load(&u->sent) + u->handed_waiting;
}

void ublk_dev_remove(struct ublk_dev *u)
{
	if (!u)
		return;
	/*
	 * STOP_DEV removes the disk, which waits for the requests the queue
	 * thread still serves (it goes on committing them); then the kernel
	 * aborts every waiting fetch and the thread ends.
	 */
	ctrl_cmd(u, UBLK_CMD_STOP_DEV, NULL, 0, 0);
	pthread_join(u->thread, NULL);
	dev_free(u);
}
