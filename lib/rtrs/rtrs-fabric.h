/* SPDX-License-Identifier: MIT */
/*
 * The fabric layer: the internal interface between RTRS and the network.
 * rtrs-fabric-ofi.c implements it over libfabric and is the only file that
 * calls fi_*. A later native verbs implementation provides the same ops.
 *
 * Objects:
 *   fab      a fabric + domain, and the memory-key counter of that domain.
 *            Client: one per path. Server: one per listening address.
 *   fab_lst  a passive endpoint; its connection requests are delivered by
 *            fab_lst_process() from the owner's service loop.
 *   fab_con  one connected endpoint with its own CQ, EQ and completion
 *            thread. The thread blocks (fd + fi_trywait + epoll), reads the
 *            CQ and drives the EQ, and calls the owner's fab_con_ops.
 *
 * Errors: 0 or a negative errno; libfabric codes never leak out of here.
 */
#ifndef RTRS_FABRIC_H
#define RTRS_FABRIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct fab;
struct fab_lst;
struct fab_con;
struct fab_connreq;

/* What the provider gave us; the upper layers size things from it. */
struct fab_attr {
	char prov_name[32];
	bool mr_local;       /* local buffers need registration (verbs) */
	bool virt_addr;      /* remote addresses are virtual, not offsets */
	bool rx_cq_data;     /* each incoming write-with-imm consumes a receive */
	size_t iov_limit;    /* local iovecs per operation */
	size_t rma_iov_limit; /* remote iovecs per operation */
};

enum fab_mr_access {
	FAB_MR_LOCAL = 1 << 0,        /* source/sink of local transfers only */
	FAB_MR_REMOTE_WRITE = 1 << 1, /* peer may write into it */
};

struct fab_mr {
	void *buf;
	size_t len;
	void *desc;     /* pass with local iovecs; NULL when not needed */
	uint64_t base;  /* what the peer adds offsets to: VA (verbs) or 0 (tcp) */
	uint32_t key;   /* remote key, always fits 32 bits on the wire */
	void *priv;     /* provider object */
};

/* Callbacks from a connection's completion thread. */
struct fab_con_ops {
	/* Connected; data = the accept private data on the client. */
	void (*connected)(void *priv, const void *data, size_t len);
	/*
	 * The connection is gone or failed: peer shutdown, reject (data =
	 * reject private data, err = -ECONNREFUSED), CQ error, timeout.
	 * Called at most once; nothing else is called afterwards.
	 */
	void (*down)(void *priv, int err, const void *data, size_t len);
	/* An incoming write with immediate data. */
	void (*imm)(void *priv, uint32_t imm);
	/* A two-sided message; buf is reposted when this returns. */
	void (*recv)(void *priv, void *buf, size_t len);
	/* A completion that was asked for (ctx != NULL when posting). */
	void (*done)(void *priv, void *ctx);
	/* fab_con_kick() was called: retry work that met -EAGAIN. */
	void (*kick)(void *priv);
};

struct fab_rma {
	uint64_t addr;  /* peer base + offset */
	uint64_t len;
	uint32_t key;
};

/* ---- fabric and domain ----------------------------------------------------- */

/*
 * Opens a fabric and domain for provider prov. Client: node/service name the
 * destination (kept for fab_con_connect) and src, if not NULL, the local
 * address to connect from. Server: node is the local address to listen on.
 */
int fab_open(const char *prov, const char *src, const char *node, const char *service,
	     bool server, struct fab **out);
void fab_close(struct fab *f);
const struct fab_attr *fab_attr(const struct fab *f);

int fab_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr);
void fab_mr_dereg(struct fab_mr *mr);

/* ---- listening --------------------------------------------------------------- */

/* Listens; the EQ fd to watch is fab_lst_fd(). */
int fab_listen(struct fab *f, struct fab_lst **out);
void fab_lst_close(struct fab_lst *l);
int fab_lst_fd(const struct fab_lst *l);
/* The bound port. */
int fab_lst_port(const struct fab_lst *l);

/*
 * Reads pending listener events and calls cb for each connection request.
 * The callback must answer the request with fab_con_accept() or
 * fab_reject() before returning.
 */
int fab_lst_process(struct fab_lst *l,
		    void (*cb)(void *priv, struct fab_connreq *req, const void *data, size_t len),
		    void *priv);
int fab_reject(struct fab_lst *l, struct fab_connreq *req, const void *data, size_t len);
/* Peer address of a request, as "host:port". */
void fab_connreq_peer(const struct fab_connreq *req, char *buf, size_t len);

/* ---- connections ------------------------------------------------------------- */

struct fab_con_cfg {
	const struct fab_con_ops *ops;
	void *priv;
	const char *name;  /* for logs and the thread name: "sess/path#cid" */
	size_t tx_depth;   /* outstanding sends/writes */
	size_t rx_depth;   /* posted receives (messages + imm on rx_cq_data) */
	size_t rx_size;    /* bytes per receive buffer (0: imm only) */
};

/* Client: creates an endpoint to the fab's destination and connects it. */
int fab_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
		    size_t len, struct fab_con **out);
/* Server: creates an endpoint for req and accepts it with data. */
int fab_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
		   const void *data, size_t len, struct fab_con **out);
/*
 * Shuts the endpoint down; queued operations are flushed and the peer sees
 * a disconnect. down() follows on the completion thread. Any thread.
 */
void fab_con_shutdown(struct fab_con *c);
/*
 * Sets up the receive pool later than creation (count buffers of size
 * bytes), before the peer can send anything. Once per connection.
 */
int fab_con_rx_setup(struct fab_con *c, size_t count, size_t size);
/* Asks the completion thread to call ops->kick soon. Any thread. */
void fab_con_kick(struct fab_con *c);
/*
 * From ops->kick after -EAGAIN: call kick again after the next completion
 * or 1 ms, rather than spin while the send queue is full.
 */
void fab_con_retry_later(struct fab_con *c);
/* Stops the completion thread and frees everything. Not from its thread. */
void fab_con_destroy(struct fab_con *c);
/* Local address of the connection as "host:port". */
void fab_con_local(const struct fab_con *c, char *buf, size_t len);

/*
 * RMA write from local iovecs (with their descs) to remote ranges; with_imm
 * attaches imm as remote CQ data. ctx != NULL asks for a completion (done).
 * -EAGAIN when the send queue is full.
 */
int fab_write(struct fab_con *c, const struct iovec *iov, void *const *desc, size_t iov_cnt,
	      const struct fab_rma *rma, size_t rma_cnt, bool with_imm, uint32_t imm,
	      void *ctx);
/* Empty write with immediate data to (addr, key): responses, heartbeats. */
int fab_write_imm(struct fab_con *c, uint64_t addr, uint32_t key, uint32_t imm);
/* Two-sided message from a registered (or mr_local-free) buffer. */
int fab_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx);

#endif
