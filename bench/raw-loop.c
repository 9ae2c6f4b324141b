/* SPDX-License-Identifier: MIT */
/*
 * raw-loop: the least a request/response loop over libfabric can do, as a
 * floor for rtrs-perf (bench/raw-vs-rtrs.sh; issue 17). One connection
 * (FI_EP_MSG, the tcp provider unless --provider), each side one thread
 * that sleeps on its completion queue's fd as librtrs's do (fi_trywait,
 * then poll), and per IO:
 *   write: the client writes SIZE bytes with 32-bit remote data (the slot)
 *          into the server's slot; the server answers with an empty write
 *          with remote data into the client's;
 *   read:  the client sends an empty write with remote data (slot and the
 *          read flag); the server writes SIZE bytes with remote data into
 *          the client's slot.
 * No headers, no permits, no keys rotated, no heartbeats: RTRS does all of
 * those on top. Regions and keys cross in the connection's private data.
 *
 *   raw-loop server [--port N] [--provider NAME]
 *   raw-loop client --dst HOST:PORT [--mode write|read] [--size BYTES]
 *                   [--queue-depth N] [--duration S] [--json]
 *
 * The client prints ops and ops/s (--json: {"ops", "ops_per_sec",
 * "errors"}); the server runs until it is killed.
 */
#include <errno.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "opts.h"

#define READ_FLAG 0x80000000u
#define SLOTS_MAX 4096

/* What each side tells the other of its region, in the connection's private data. */
struct region_msg {
	uint64_t addr, key;
	uint32_t slot_size, slots;
};

static struct {
	const char *provider, *dst;
	uint64_t port, size, qd, duration;
	unsigned mode;
	bool json;
} g = { .provider = "tcp", .port = 0, .size = 4096, .qd = 64, .duration = 5 };

static const char *const mode_names[] = { "write", "read", NULL };

static const struct opt options[] = {
	{ "provider", 0, OPT_STRING, &g.provider, .arg = "NAME", .help = "libfabric provider" },
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N", .help = "server: port (0: any)" },
	{ "dst", 'd', OPT_STRING, &g.dst, .arg = "HOST:PORT", .help = "client: the server" },
	{ "mode", 'm', OPT_CHOICE, &g.mode, .choices = mode_names, .arg = "MODE",
	  .help = "client: write or read" },
	{ "size", 's', OPT_SIZE, &g.size, 1, 1u << 20, .arg = "BYTES", .help = "client: IO size" },
	{ "queue-depth", 'q', OPT_UINT, &g.qd, 1, SLOTS_MAX, .arg = "N",
	  .help = "client: IOs in flight" },
	{ "duration", 't', OPT_UINT, &g.duration, 1, 3600, .arg = "S", .help = "client: seconds" },
	{ "json", 0, OPT_FLAG, &g.json, .help = "client: the result as JSON" },
	{ 0 },
};

struct side {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_eq *eq;
	struct fid_pep *pep;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_mr *mr;
	char *buf;                  /* slots x slot_size, ours */
	size_t slots, slot_size;
	struct region_msg peer;
	int cq_fd;
};

static int die(const char *what, int rc)
{
	fprintf(stderr, "raw-loop: %s: %s\n", what, fi_strerror(rc < 0 ? -rc : rc));
	exit(1);
}

static void check(const char *what, int rc)
{
	if (rc)
		die(what, rc);
}

static void open_fabric(struct side *s, const char *node, const char *service, bool server)
{
	struct fi_info *hints = fi_allocinfo();
	struct fi_eq_attr eq_attr = { .wait_obj = FI_WAIT_UNSPEC };

	if (!hints)
		die("fi_allocinfo", -FI_ENOMEM);
	hints->ep_attr->type = FI_EP_MSG;
	hints->caps = FI_MSG | FI_RMA | FI_REMOTE_WRITE | FI_WRITE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	hints->domain_attr->cq_data_size = 4;
	hints->fabric_attr->prov_name = strdup(g.provider);
	check("fi_getinfo", fi_getinfo(FI_VERSION(1, 9), node, service, server ? FI_SOURCE : 0,
				       hints, &s->info));
	fi_freeinfo(hints);
	if ((s->info->mode | s->info->rx_attr->mode) & FI_RX_CQ_DATA)
		die("this provider wants receives for remote data (not the tcp case)", -FI_ENOSYS);
	check("fi_fabric", fi_fabric(s->info->fabric_attr, &s->fabric, NULL));
	check("fi_eq_open", fi_eq_open(s->fabric, &eq_attr, &s->eq, NULL));
}

/* How the peer names our region: its address, or offsets from 0 without FI_MR_VIRT_ADDR. */
static uint64_t region_base(const struct side *s)
{
	return (s->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uintptr_t)s->buf : 0;
}

/* The region of slots, registered for the peer's writes. */
static void open_region(struct side *s, size_t slots, size_t slot_size)
{
	s->slots = slots;
	s->slot_size = slot_size;
	if (posix_memalign((void **)&s->buf, 4096, slots * slot_size))
		die("posix_memalign", -FI_ENOMEM);
	memset(s->buf, 0x5a, slots * slot_size);
	check("fi_mr_reg", fi_mr_reg(s->domain, s->buf, slots * slot_size,
				     FI_REMOTE_WRITE | FI_WRITE, 0, 0, 0, &s->mr, NULL));
}

/* An endpoint on info with its CQ (fd to sleep on) and the side's EQ. */
static void open_ep(struct side *s, struct fi_info *info, size_t depth)
{
	struct fi_cq_attr cq_attr = { .size = depth * 2 + 16, .format = FI_CQ_FORMAT_DATA,
				      .wait_obj = FI_WAIT_FD };

	info->tx_attr->size = depth + 16;
	check("fi_endpoint", fi_endpoint(s->domain, info, &s->ep, NULL));
	check("fi_cq_open", fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
	check("FI_GETWAIT", fi_control(&s->cq->fid, FI_GETWAIT, &s->cq_fd));
	check("fi_ep_bind eq", fi_ep_bind(s->ep, &s->eq->fid, 0));
	check("fi_ep_bind cq", fi_ep_bind(s->ep, &s->cq->fid,
					  FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION));
	check("fi_enable", fi_enable(s->ep));
}

/* The next CM event of type want, with its private data in *pd. */
static void cm_wait(struct side *s, uint32_t want, struct region_msg *pd)
{
	uint64_t raw[(sizeof(struct fi_eq_cm_entry) + sizeof(*pd)) / 8 + 1];
	struct fi_eq_cm_entry *ev = (struct fi_eq_cm_entry *)raw;
	uint32_t type;
	ssize_t n = fi_eq_sread(s->eq, &type, ev, sizeof(raw), -1, 0);

	if (n < 0)
		die("fi_eq_sread", (int)n);
	if (type != want)
		die("unexpected connection event", -FI_EOTHER);
	if (want == FI_CONNREQ)
		s->info = ev->info;
	if (pd) {
		if ((size_t)n < sizeof(*ev) + sizeof(*pd))
			die("the peer's region is missing from its private data", -FI_EOTHER);
		memcpy(pd, ev->data, sizeof(*pd));
	}
}

/* Waits until the CQ has something: fi_trywait, then poll on its fd, as librtrs sleeps. */
static void cq_sleep(struct side *s)
{
	struct fid *fids[1] = { &s->cq->fid };
	struct pollfd pfd = { .fd = s->cq_fd, .events = POLLIN };

	if (fi_trywait(s->fabric, fids, 1) == FI_SUCCESS)
		poll(&pfd, 1, 100);
}

/*
 * Remote data read off the CQ while a post waited for room: handled by the
 * main loop before it reads the CQ again. At most one per slot is ever in
 * flight towards us, so SLOTS_MAX holds them all.
 */
static struct {
	uint32_t data[SLOTS_MAX];
	size_t n;
} backlog;

/* Reads the CQ into the backlog: 0, or the CQ's error. */
static ssize_t cq_to_backlog(struct side *s)
{
	struct fi_cq_data_entry e[64];
	ssize_t n = fi_cq_read(s->cq, e, 64);

	if (n == -FI_EAGAIN)
		return 0;
	for (ssize_t i = 0; i < n; i++) {
		if ((e[i].flags & FI_REMOTE_CQ_DATA) && backlog.n < SLOTS_MAX)
			backlog.data[backlog.n++] = (uint32_t)e[i].data;
	}
	return n < 0 ? n : 0;
}

/* Posts a write with remote data; while the queue is full, progresses the CQ. */
static void post_write(struct side *s, size_t slot, size_t len, uint32_t data)
{
	void *desc = fi_mr_desc(s->mr);
	ssize_t rc;

	for (;;) {
		rc = fi_writedata(s->ep, s->buf + slot * s->slot_size, len, desc, data, 0,
				  s->peer.addr + slot * s->peer.slot_size, s->peer.key, NULL);
		if (rc != -FI_EAGAIN)
			break;
		if ((rc = cq_to_backlog(s)))
			break;
	}
	if (rc)
		die("fi_writedata", (int)rc);
}

/* The next remote data: from the backlog, else the CQ; false if there is none now. */
static ssize_t next_data(struct side *s, uint32_t *data)
{
	ssize_t rc;

	if (!backlog.n && (rc = cq_to_backlog(s)))
		return rc;
	if (!backlog.n)
		return -FI_EAGAIN;
	*data = backlog.data[--backlog.n];
	return 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int server(void)
{
	struct side s = { 0 };
	struct fi_info *conn;
	struct region_msg mine;
	char service[8];
	size_t addrlen;
	struct sockaddr_storage sa;

	snprintf(service, sizeof(service), "%u", (unsigned)g.port);
	open_fabric(&s, NULL, service, true);
	check("fi_passive_ep", fi_passive_ep(s.fabric, s.info, &s.pep, NULL));
	check("fi_pep_bind", fi_pep_bind(s.pep, &s.eq->fid, 0));
	check("fi_listen", fi_listen(s.pep));
	addrlen = sizeof(sa);
	check("fi_getname", fi_getname(&s.pep->fid, &sa, &addrlen));
	printf("raw-loop listening on port %u\n",
	       ntohs(((struct sockaddr_in *)&sa)->sin_port));
	fflush(stdout);
	for (;;) {
		cm_wait(&s, FI_CONNREQ, &s.peer);
		conn = s.info;
		if (s.peer.slots == 0 || s.peer.slots > SLOTS_MAX || s.peer.slot_size == 0 ||
		    s.peer.slot_size > (1u << 20))
			die("the client's region", -FI_EINVAL);
		check("fi_domain", fi_domain(s.fabric, conn, &s.domain, NULL));
		open_region(&s, s.peer.slots, s.peer.slot_size);
		open_ep(&s, conn, s.peer.slots);
		mine = (struct region_msg){ .addr = region_base(&s), .key = fi_mr_key(s.mr),
					    .slot_size = (uint32_t)s.slot_size,
					    .slots = (uint32_t)s.slots };
		check("fi_accept", fi_accept(s.ep, &mine, sizeof(mine)));
		cm_wait(&s, FI_CONNECTED, NULL);
		/* Answer every request until the client goes. */
		for (;;) {
			uint32_t data = 0, slot;
			ssize_t n = next_data(&s, &data);

			if (n == -FI_EAGAIN) {
				uint32_t type;
				struct fi_eq_cm_entry ev;

				if (fi_eq_read(s.eq, &type, &ev, sizeof(ev), 0) > 0 &&
				    type == FI_SHUTDOWN)
					break;
				cq_sleep(&s);
				continue;
			}
			if (n < 0) {
				struct fi_cq_err_entry err = { 0 };

				if (n == -FI_EAVAIL && fi_cq_readerr(s.cq, &err, 0) > 0 &&
				    err.err != FI_ECONNRESET && err.err != FI_ENOTCONN)
					fprintf(stderr, "raw-loop: server: %s\n", fi_strerror(err.err));
				break; /* the client went */
			}
			slot = data & ~READ_FLAG;
			if (slot >= s.slots)
				continue;
			/* A read: the slot's bytes, with the answer; a write: the answer alone. */
			post_write(&s, slot, (data & READ_FLAG) ? s.slot_size : 0, slot);
		}
		backlog.n = 0;
		fi_close(&s.ep->fid);
		fi_close(&s.cq->fid);
		fi_close(&s.mr->fid);
		fi_close(&s.domain->fid);
		free(s.buf);
		fi_freeinfo(conn);
	}
	return 0;
}

static int client(void)
{
	struct side s = { 0 };
	struct region_msg mine;
	char host[256], *colon;
	uint64_t ops = 0, end, start, inflight = g.qd;
	uint32_t flag = g.mode == 1 ? READ_FLAG : 0;

	if (!g.dst || strlen(g.dst) >= sizeof(host) || !(colon = strrchr(g.dst, ':'))) {
		fprintf(stderr, "raw-loop: client needs --dst HOST:PORT\n");
		return 2;
	}
	memcpy(host, g.dst, (size_t)(colon - g.dst));
	host[colon - g.dst] = 0;
	open_fabric(&s, host, colon + 1, false);
	check("fi_domain", fi_domain(s.fabric, s.info, &s.domain, NULL));
	open_region(&s, g.qd, g.size);
	open_ep(&s, s.info, g.qd);
	mine = (struct region_msg){ .addr = region_base(&s), .key = fi_mr_key(s.mr),
				    .slot_size = (uint32_t)g.size, .slots = (uint32_t)g.qd };
	check("fi_connect", fi_connect(s.ep, s.info->dest_addr, &mine, sizeof(mine)));
	cm_wait(&s, FI_CONNECTED, &s.peer);
	if (s.peer.slots < g.qd || s.peer.slot_size < g.size)
		die("the server's region is too small", -FI_EINVAL);

	start = now_ns();
	end = start + g.duration * 1000000000u;
	for (uint32_t i = 0; i < g.qd; i++)
		post_write(&s, i, flag ? 0 : g.size, i | flag);
	for (;;) {
		uint32_t slot = 0;
		ssize_t n = next_data(&s, &slot);

		if (n == -FI_EAGAIN) {
			cq_sleep(&s);
			continue;
		}
		if (n < 0)
			die("fi_cq_read", (int)n);
		if (slot >= g.qd)
			continue;
		ops++;
		if (now_ns() < end)
			post_write(&s, slot, flag ? 0 : g.size, slot | flag);
		else if (--inflight == 0)
			goto done;
	}
done:;
	double secs = (double)(now_ns() - start) / 1e9;

	if (g.json)
		printf("{\"ops\": %" PRIu64 ", \"ops_per_sec\": %.0f, \"errors\": 0}\n", ops,
		       (double)ops / secs);
	else
		printf("%s %" PRIu64 " B: %" PRIu64 " ops in %.2f s, %.0f ops/s\n",
		       mode_names[g.mode], g.size, ops, secs, (double)ops / secs);
	fi_shutdown(s.ep, 0);
	return 0;
}

int main(int argc, char **argv)
{
	int pos, rc = opts_parse(options, "raw-loop", "server|client [options]", argc, argv, &pos);

	if (rc)
		return rc > 0 ? 0 : 2;
	if (pos < argc && !strcmp(argv[pos], "server")) {
		rc = opts_parse(options, "raw-loop", "server [options]", argc - pos, argv + pos,
				&pos);
		return rc ? (rc > 0 ? 0 : 2) : server();
	}
	if (pos < argc && !strcmp(argv[pos], "client")) {
		rc = opts_parse(options, "raw-loop", "client [options]", argc - pos, argv + pos,
				&pos);
		return rc ? (rc > 0 ? 0 : 2) : client();
	}
	fprintf(stderr, "raw-loop: server or client (see --help)\n");
	return 2;
}
