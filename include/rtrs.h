/* SPDX-License-Identifier: MIT */
/*
 * librtrs: a reliable multipath transport for IO blocks, modelled on the
 * Linux kernel's RTRS, running over TCP (a native fabric on io_uring) and
 * RDMA devices (rdma-core).
 *
 * Conventions: every function returns 0 or a negative errno (or a handle and
 * writes the errno through an out parameter). Handles are opaque. Option
 * structs start with their size: initialise them with the *_opts_init()
 * function, which fills the documented defaults, then change what you need.
 * Callbacks run on library threads and must not block.
 */
#ifndef RTRS_H
#define RTRS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rtrs_clt_sess;
struct rtrs_permit;
struct rtrs_srv_ctx;
struct rtrs_srv_sess;
struct rtrs_srv_op;

enum rtrs_dir { RTRS_READ = 0, RTRS_WRITE = 1 };

/* Defaults (documented in docs/architecture.md). */
#define RTRS_DEFAULT_PORT 1234
/* Poll groups a process may run (rtrs_clt_opts and rtrs_srv_opts, poll_groups). */
#define RTRS_MAX_POLL_GROUPS 256
#define RTRS_DEFAULT_PROVIDER "tcp"
#define RTRS_DEFAULT_QUEUE_DEPTH 512
#define RTRS_DEFAULT_CHUNK_SIZE (128u << 10)
#define RTRS_DEFAULT_HB_INTERVAL_MS 1000
#define RTRS_DEFAULT_HB_MISSED_MAX 3
#define RTRS_DEFAULT_CONNECT_TIMEOUT_MS 10000
#define RTRS_DEFAULT_FAST_IO_FAIL_MS 5000
#define RTRS_DEFAULT_MAX_PENDING 32
/* Receives of a server's shared receive queue per poll group and RDMA device. */
#define RTRS_DEFAULT_SRQ_DEPTH 4096
#define RTRS_DEFAULT_MAX_PENDING_PER_PEER 8
#define RTRS_DEFAULT_HANDSHAKE_TIMEOUT_MS 5000
#define RTRS_DEFAULT_MAX_SESSIONS 256
#define RTRS_DEFAULT_MAX_SESSIONS_PER_PEER 64

/* One path: an optional source address and a destination "host[:port]". */
struct rtrs_path_addr {
	const char *src;  /* local address to connect from; NULL: any */
	const char *dst;  /* host name or address; a ":port" suffix overrides opts.port */
};

/* ---- addresses --------------------------------------------------------------- */

/* The longest host name or address (without brackets) an address may hold. */
#define RTRS_ADDR_HOST_MAX 255

/* A path's address as a user writes it, taken apart by rtrs_addr_parse(). */
struct rtrs_addr {
	size_t size;                         /* sizeof(struct rtrs_addr), set by the caller */
	char src[RTRS_ADDR_HOST_MAX + 1];    /* source address, no brackets; "": any */
	char host[RTRS_ADDR_HOST_MAX + 1];   /* host name or address, no brackets */
	uint16_t port;                       /* the port given, else default_port */
	int has_port;                        /* 1: the text gave the port */
	char dst[RTRS_ADDR_HOST_MAX + 9];    /* HOST[:PORT] for rtrs_path_addr.dst, an
						IPv6 address in brackets */
};

/*
 * Parses a path's address, "[SRC@]HOST[:PORT]", the syntax every front end
 * of this project takes (rtrs-perf and rnbd-client --server, the nbdkit
 * plugin's server=):
 *
 *   - HOST is a name or an address; an IPv6 address goes in brackets
 *     ("[fe80::1%eth0]:1234"), or bare without a port: with more than one
 *     colon and no brackets the whole text is the host ("fe80::1");
 *   - PORT is 1..65535; without it, port is default_port and has_port 0
 *     (0 leaves it to rtrs_clt_opts.port, as dst without ":PORT" does);
 *   - SRC@, optional, is the local address to connect from: a name or an
 *     address, IPv6 in brackets or bare, without a port;
 *   - printable ASCII without blanks; host and source at most
 *     RTRS_ADDR_HOST_MAX bytes; at most one '@'.
 *
 * Fills *a (a->size set by the caller). Returns 0, or -EINVAL with the
 * reason in why (whylen bytes, always terminated; may be NULL), without
 * the text itself: the caller names what it parsed, e.g.
 * "--server h:0: port '0' is not a number in 1..65535". Names are not
 * resolved here.
 */
int rtrs_addr_parse(const char *text, uint16_t default_port, struct rtrs_addr *a, char *why,
		    size_t whylen);

/* The path a parsed address stands for; p points into a while it is used. */
void rtrs_addr_path(const struct rtrs_addr *a, struct rtrs_path_addr *p);

/* How a request picks its path among the connected ones. */
enum rtrs_mp_policy {
	RTRS_MP_POLICY_RR = 0,           /* round-robin */
	RTRS_MP_POLICY_MIN_INFLIGHT = 1, /* fewest requests in flight (default) */
	RTRS_MP_POLICY_MIN_LATENCY = 2,  /* lowest heartbeat round trip */
};

enum rtrs_clt_link_ev {
	/*
	 * Events are delivered only after rtrs_clt_open has returned, on the
	 * client's service loop, which many sessions share: a callback must
	 * not block (wait for a request's answer, open a session). A callback
	 * ignores values it does not know: later versions may add events.
	 */
	RTRS_CLT_LINK_EV_RECONNECTED, /* a path came up while none was up */
	RTRS_CLT_LINK_EV_DISCONNECTED, /* no path is up any more */
	/*
	 * A path reached a new server session: the server restarted, or it
	 * dropped this session (its last path went) and made a new one, so
	 * whatever the user set up in the old one (RNBD's open devices) is
	 * gone. Delivered once per new server session (however many paths
	 * reach it), while the path connects, before that path or
	 * any other path to the new session carries a request and before
	 * RECONNECTED; rtrs_attrs.server_sessions has counted it already. A
	 * request the library held across the reconnect (waiting for a path,
	 * or failed over) may reach the new session after this event, and so
	 * may one submitted meanwhile. A kernel server names no session: with
	 * one (rtrs_clt_peer_ext() 0) the event comes with every reconnect
	 * that may have set the session up anew, new or not.
	 */
	RTRS_CLT_LINK_EV_SERVER_SESSION,
};

/*
 * TLS 1.3 with pre-shared keys on tcp paths (docs/security.md section 9).
 * A client requires it or not; a server has it off, offers it or requires
 * it. A mismatch is refused with -EPROTONOSUPPORT and "do not retry".
 * RDMA paths have no TLS: only RTRS_TLS_OFF opens them.
 */
enum rtrs_tls_mode {
	RTRS_TLS_OFF = 0,
	RTRS_TLS_OFFERED = 1,   /* server only: a client may use TLS or not */
	RTRS_TLS_REQUIRED = 2,
	/*
	 * Client only: TLS with a PSK that a DH-HMAC-CHAP exchange generates
	 * for each path (NVMe 2.1's secure channel concatenation): the path
	 * first authenticates on a connection in the clear, then every
	 * connection runs TLS with the generated PSK. Needs auth_secret, a DH
	 * group and a server that offers or requires TLS.
	 */
	RTRS_TLS_CONCAT = 3,
};

struct rtrs_clt_opts {
	size_t size;                /* sizeof(struct rtrs_clt_opts) */
	const char *sessname;       /* 1..255 printable, no blank or '/', not "."/".." */
	const struct rtrs_path_addr *paths;
	size_t paths_num;           /* 1 .. 128 */
	uint16_t port;              /* default RTRS_DEFAULT_PORT */
	const char *provider;       /* "tcp" (the default) or "verbs" (RDMA devices) */
	unsigned nr_io_cons;        /* IO connections per path; 0 = one per CPU, <= 128 */
	unsigned hb_interval_ms;    /* heartbeat period (default 1000) */
	unsigned hb_missed_max;     /* missed heartbeats before a path fails (default 3) */
	unsigned connect_timeout_ms; /* per connection (default 10000) */
	enum rtrs_mp_policy mp_policy; /* default RTRS_MP_POLICY_MIN_INFLIGHT */
	/*
	 * A failed path reconnects after reconnect_delay_ms plus a random
	 * 0..reconnect_jitter_ms (defaults 1000 and 1000), at most
	 * max_reconnect_attempts times in a row (-1: forever, the default;
	 * 0: never); then it stays closed until rtrs_clt_reconnect_path().
	 */
	unsigned reconnect_delay_ms;
	unsigned reconnect_jitter_ms;
	int max_reconnect_attempts;
	/* A path down longer than this stops reconnecting (0: no limit, the default). */
	unsigned reconnect_loss_timeout_ms;
	/*
	 * With no path up but one on its way (connecting or reconnecting), a
	 * request waits up to fast_io_fail_ms for it, then fails with
	 * -ETIMEDOUT (default 5000; 0: fail at once with -ECONNABORTED, as the
	 * kernel does). With every path closed it fails at once.
	 */
	unsigned fast_io_fail_ms;
	void (*link_ev)(void *priv, enum rtrs_clt_link_ev ev);
	/* Optional: a path came up (up = 1) or went down (0); idx as in stats; as link_ev. */
	void (*path_ev)(void *priv, unsigned idx, int up);
	void *priv;
	/*
	 * DH-HMAC-CHAP (docs/security.md). Secrets are DHHC-1 strings as
	 * `nvme gen-dhchap-key` writes them, or "@PATH" naming a file that
	 * holds one; they never appear in logs or statistics.
	 * auth_secret: this host's secret, needed when the server requires
	 * authentication (without it a path fails with -ENOKEY and never
	 * retries). auth_ctrl_secret: also authenticate the server
	 * (bidirectional); a server that cannot is refused (-EKEYREJECTED) and
	 * so is one that does not offer authentication (-ENOKEY).
	 * auth_host_name: this host's name (NQN-like; default the contents of
	 * /etc/nvme/hostnqn, else "nqn.2014-08.org.nvmexpress:uuid:" and the
	 * machine id). auth_server_name: the server's name (default
	 * "rtrs-server"). auth_hashes / auth_dhgroups: what the client offers,
	 * comma-separated ("sha256,sha384,sha512"; "null,ffdhe2048,...").
	 */
	const char *auth_secret;
	const char *auth_ctrl_secret;
	const char *auth_host_name;
	const char *auth_server_name;
	const char *auth_hashes;
	const char *auth_dhgroups;
	/*
	 * Completion threads keep polling their queue this long (microseconds)
	 * once it is empty before they sleep (default 0: sleep at once). Spends
	 * CPU to save the wake-up of a sleeping thread per completion, which
	 * can bound throughput where wake-ups are slow (virtual machines). On
	 * the rdma fabric (RDMA devices); other fabrics ignore it.
	 */
	unsigned busy_poll_us;
	/*
	 * The process's poll groups: how many threads serve every connection
	 * of the process, per fabric (tcp, RDMA devices; 0: one per CPU, the
	 * default). A fabric's groups start with its first session or server
	 * and stop with its last; the open that starts them sets their
	 * number, later ones do not change it.
	 */
	unsigned poll_groups;
	/*
	 * TLS (RTRS_TLS_REQUIRED, RTRS_TLS_CONCAT): every connection of every path runs a TLS
	 * 1.3 handshake with a PSK before its first byte of RTRS, and its
	 * records carry everything after. tls_key: the PSK, an NVMe
	 * interchange string as `nvme gen-tls-key` writes it
	 * ("NVMeTLSkey-1:01:...:") or "@PATH"; without it the PSK is derived
	 * from auth_secret (-ENOKEY when there is neither). A wrong or unknown
	 * key fails the path with -EKEYREJECTED, never retried. tls_no_ktls:
	 * keep the records in user space where the kernel could take them.
	 */
	enum rtrs_tls_mode tls;
	const char *tls_key;
	bool tls_no_ktls;
};

/* Fills defaults; returns -EINVAL if size is not one this library knows. */
int rtrs_clt_opts_init(struct rtrs_clt_opts *opts, size_t size);

/*
 * Opens a session and connects every path: the first alone (it makes the
 * session at the server), then the others together. Fails as a whole, with
 * the first failing path's error.
 */
int rtrs_clt_open(const struct rtrs_clt_opts *opts, struct rtrs_clt_sess **out);

/*
 * Closes the session. Every request not yet completed is completed exactly
 * once, with -ECONNABORTED; permit waiters return NULL. Must not be called
 * from a library callback.
 */
void rtrs_clt_close(struct rtrs_clt_sess *sess);

/*
 * For a program that is stopping (a daemon's SIGTERM): every client
 * session of the process stops waiting for its servers, at once and for
 * good. Opens in progress (rtrs_clt_open, rtrs_clt_add_path), and every
 * one after this, fail with -ESHUTDOWN; requests in flight or waiting for a
 * path complete with -ECONNABORTED, new ones are refused with -ESHUTDOWN;
 * permit waiters get NULL; no path reconnects. Returns without waiting:
 * what is failed completes on the library's threads, and rtrs_clt_close,
 * still needed for each session, then takes no longer than the local
 * teardown, whatever the servers do. Any thread, not from a library
 * callback.
 */
void rtrs_clt_shutdown_all(void);

enum rtrs_clt_con_type { RTRS_ADMIN_CON, RTRS_IO_CON };
enum rtrs_wait { RTRS_PERMIT_NOWAIT, RTRS_PERMIT_WAIT };

/*
 * Takes a permit (one of queue_depth request slots). NOWAIT returns NULL when
 * none is free; WAIT sleeps until one is free or the session closes (NULL).
 * While no path is up, a slot is waited for no longer than a request waits
 * for a path (the slots of requests that failed with a path may stay taken
 * until it is fenced or back): with none free, NULL at once when
 * fast_io_fail_ms is 0 or no path can come, and once fast_io_fail_ms has
 * passed since the last path went. With NULL, errno says which: EAGAIN
 * (none free), ECONNABORTED (the session closes; or no path and none to
 * wait for), ETIMEDOUT (no path for fast_io_fail_ms), EINVAL (no session).
 */
struct rtrs_permit *rtrs_clt_get_permit(struct rtrs_clt_sess *sess,
					enum rtrs_clt_con_type con_type, enum rtrs_wait wait);
void rtrs_clt_put_permit(struct rtrs_clt_sess *sess, struct rtrs_permit *permit);
/* The permit's slot number, 0 .. queue_depth - 1. */
unsigned rtrs_permit_id(const struct rtrs_permit *permit);

struct rtrs_clt_req_ops {
	void *priv;
	/* Called exactly once per accepted request, with 0 or a negative errno. */
	void (*conf)(void *priv, int err);
};

/*
 * Sends a request. usr (usr_cnt vectors, total <= max_hdr_size minus the
 * rtrs header) is delivered to the server with the request; data (data_cnt
 * vectors, total <= max_io_size) is written to the server (RTRS_WRITE) or
 * filled from it (RTRS_READ). Buffers must stay valid until conf runs.
 * Returns 0 (conf will be called) or a negative errno (it will not):
 * -EMSGSIZE (too large), -EINVAL (bad arguments or a permit not taken),
 * -EBUSY (the permit's previous request has not completed),
 * -ECONNABORTED (no path up and none coming, or fast_io_fail_ms is 0),
 * -ESHUTDOWN (closing), or an error from
 * registering or posting (e.g. -ENOMEM).
 */
int rtrs_clt_request(struct rtrs_clt_sess *sess, enum rtrs_dir dir,
		     const struct rtrs_clt_req_ops *ops, struct rtrs_permit *permit,
		     const struct iovec *usr, size_t usr_cnt,
		     const struct iovec *data, size_t data_cnt);

/*
 * Polled completions: runs the completions of the session's IO
 * connections on the calling thread, with no hand-off from a library
 * thread. Returns how many requests it completed (conf callbacks it ran);
 * 0 when timeout_ms passed without any, or at once when a request ended
 * on a library thread since its last return (below). timeout_ms 0 looks
 * once, a negative one waits without bound.
 *
 * While a thread polls (inside this call, or within the last 10 ms), the
 * library's completion threads leave those connections' completions to
 * it; afterwards they take them back, so a caller that stops polling only
 * delays them. Requests that end elsewhere (a failed path's, completed by
 * the library, or any while no thread polls) still run conf on a library
 * thread, and make the next or a waiting rtrs_clt_poll return: a caller
 * waits for its own completions by looking at what its callbacks
 * recorded, then polling, until they are all in. Any number of threads
 * may poll one session; one at a time reads.
 *
 * -EOPNOTSUPP where the session's fabric has no polled mode (the native
 * RDMA fabric), at once from its first connected path on: its
 * completions keep coming on library threads. Not from
 * a library callback, nor during or after rtrs_clt_close.
 */
int rtrs_clt_poll(struct rtrs_clt_sess *sess, int timeout_ms);
/*
 * Makes a waiting rtrs_clt_poll return, or the next one at once: for
 * what its caller waits for that ends outside the transport. Any thread.
 */
void rtrs_clt_poll_wake(struct rtrs_clt_sess *sess);
/*
 * For a caller that sleeps in its own loop (an io_uring, an epoll set)
 * instead of in rtrs_clt_poll: rtrs_clt_poll_fd is a file descriptor that
 * turns readable when rtrs_clt_poll has something to do (-EOPNOTSUPP as
 * rtrs_clt_poll). Before sleeping on it, rtrs_clt_poll_wait_begin: 0 when
 * the fd will wake the sleeper for anything that comes, and then
 * rtrs_clt_poll_wait_end must follow the sleep, on any wake-up, before
 * the next rtrs_clt_poll; -EAGAIN when something is there already (it may
 * have run completions on this thread): poll, do not sleep. While between
 * the two, the session counts as polled, as inside rtrs_clt_poll.
 */
int rtrs_clt_poll_fd(struct rtrs_clt_sess *sess);
int rtrs_clt_poll_wait_begin(struct rtrs_clt_sess *sess);
void rtrs_clt_poll_wait_end(struct rtrs_clt_sess *sess);

struct rtrs_attrs {
	size_t size;            /* sizeof(struct rtrs_attrs), set by the caller */
	uint32_t queue_depth;
	uint32_t max_io_size;   /* largest data length of one request */
	uint32_t max_hdr_size;  /* user header + rtrs header limit */
	uint32_t max_segments;  /* data vectors per request */
	uint32_t paths_up;
	uint32_t paths_num;     /* paths of the session, up or not */
	/*
	 * Server sessions this session has met (1 after open): grows when a
	 * path reaches a server that does not know this session any more (it
	 * restarted, or dropped the session), before any request uses that
	 * path, and link_ev(RTRS_CLT_LINK_EV_SERVER_SESSION) tells it. Filled
	 * even when no path is up.
	 */
	uint64_t server_sessions;
};

/* -ECOMM if no path is connected. */
int rtrs_clt_query(struct rtrs_clt_sess *sess, struct rtrs_attrs *attrs);

/*
 * What the server speaks (docs/protocol.md, "Kernel peers"): 1, a server
 * of this project, which answered the client's extension bit; 0, a server
 * that speaks only the Linux kernel's RTRS. With a kernel server there is
 * no fencing (a failed path's requests go to another path at once, as the
 * kernel's client fails them over: docs/protocol.md section 14 says what
 * that does not guarantee), no authentication (a session with auth_secret is refused
 * with -EPROTONOSUPPORT), no refusal reasons after the connections are
 * up, reads of several vectors go through a bounce buffer, and
 * RTRS_CLT_LINK_EV_SERVER_SESSION comes with every reconnect that may have
 * reached a new server session (the kernel's server does not say). Users
 * of the layer above ask it too (librnbd sends no PREFLUSH or NOUNMAP to a
 * kernel rnbd-server). Fixed by the first path, so known once
 * rtrs_clt_open has returned; -EINVAL without a session.
 */
int rtrs_clt_peer_ext(struct rtrs_clt_sess *sess);

/* Switches the multipath policy at run time; -EINVAL for an unknown one. */
int rtrs_clt_set_mp_policy(struct rtrs_clt_sess *sess, enum rtrs_mp_policy policy);
/* The multipath policy in force (an enum rtrs_mp_policy), or -EINVAL. */
int rtrs_clt_get_mp_policy(struct rtrs_clt_sess *sess);

struct rtrs_path_stats {
	size_t size;               /* sizeof(struct rtrs_path_stats), set by the caller */
	char name[528];            /* "sess/host:port" */
	const char *state;         /* "connecting", "connected", "closing", "closed" */
	uint64_t reads, read_bytes, writes, write_bytes;
	uint32_t inflight;         /* requests in flight on the path now */
	uint64_t hb_latency_ns;    /* last heartbeat round trip; 0 before the first */
	uint64_t reconnects;       /* successful reconnects */
	uint64_t reconnect_failures;
	uint64_t failovers;        /* requests moved off this path when it failed */
	int last_error;            /* why it last failed: 0 or a negative errno */
	/*
	 * The reconnect decision for that failure: "retry", "key rejected",
	 * "no key", "do not retry" (the server said so, or it changed its
	 * queue depth or always_invalidate), "loss timeout", "out of
	 * attempts", "stopped"; "" while nothing has failed.
	 */
	const char *reconnect_verdict;
	uint64_t auth_runs;        /* authentications this path completed */
	char src[256];             /* the local address it connects from; "": any */
	bool removed;              /* rtrs_clt_remove_path: closed for good, the index kept */
};

/* Statistics of path idx (0 .. paths_num - 1); -ENOENT past the last. */
int rtrs_clt_path_stats(struct rtrs_clt_sess *sess, unsigned idx, struct rtrs_path_stats *st);
/*
 * Zeroes the counters of path idx: reads, writes and their bytes,
 * reconnects, reconnect failures, failovers and authentication runs (not
 * inflight, the heartbeat latency, the last error or verdict: states).
 */
int rtrs_clt_reset_path_stats(struct rtrs_clt_sess *sess, unsigned idx);

/*
 * Closes path idx and keeps it closed (no automatic reconnect); its
 * requests in flight fail over to the other paths after a fence (or fail,
 * with no path to go to). Waits until it is closed. -ENOENT: no such path.
 */
int rtrs_clt_disconnect_path(struct rtrs_clt_sess *sess, unsigned idx);
/*
 * Adds a path to an open session and connects it (blocks until it is up or
 * has failed); its index goes to *idx. -ENOSPC past 128 paths.
 */
int rtrs_clt_add_path(struct rtrs_clt_sess *sess, const struct rtrs_path_addr *addr,
		      unsigned *idx);
/*
 * Disconnects path idx for good: its requests in flight fail over (after a
 * fence) to the other paths; the index is not reused. -ENOENT if unknown.
 */
int rtrs_clt_remove_path(struct rtrs_clt_sess *sess, unsigned idx);
/*
 * A session's reconnect parameters, as rtrs_clt_opts sets them at open
 * (the meaning of each is there). Set the size before a get or a set.
 */
struct rtrs_reconnect_params {
	size_t size;                /* sizeof(struct rtrs_reconnect_params) */
	unsigned delay_ms;          /* 0..3600000 */
	unsigned jitter_ms;         /* 0..3600000 */
	int max_attempts;           /* -1 (no limit) .. 1000000 */
	unsigned loss_timeout_ms;   /* 0 (no limit) .. 86400000 */
	unsigned fast_io_fail_ms;   /* 0..3600000 */
};
/* The reconnect parameters in force. */
int rtrs_clt_get_reconnect(struct rtrs_clt_sess *sess, struct rtrs_reconnect_params *p);
/*
 * Changes them all at once: delay, jitter, attempts and the loss timeout
 * from a path's next attempt on, fast_io_fail_ms for requests that begin
 * to wait from now on. -EINVAL (nothing changed) when one is out of range.
 */
int rtrs_clt_set_reconnect(struct rtrs_clt_sess *sess, const struct rtrs_reconnect_params *p);
/*
 * Reconnects path idx now, whatever its state (a connected path is closed
 * first), with a fresh count of attempts: max_reconnect_attempts of them,
 * and one where that is 0 (never by itself). Returns at once; watch the
 * state in rtrs_clt_path_stats().
 */
int rtrs_clt_reconnect_path(struct rtrs_clt_sess *sess, unsigned idx);

/*
 * Registered memory for writes. RDMA devices (the rdma fabric) need every
 * local buffer registered: without this, each write registers its vectors
 * and deregisters them when it completes, two system calls that pin and
 * unpin pages, per IO. A write whose vectors all lie in memory registered
 * here is posted from it as it is. Reads still register their buffers per
 * IO: the server writes into them, and a registration that outlived the IO
 * would let it write there afterwards. On fabrics that need no local
 * registration (tcp) this only records the region.
 *
 * Up to RTRS_CLT_MEM_MAX regions per session, not overlapping; the memory
 * must stay mapped until rtrs_clt_mem_unregister(), which must not be
 * called while a request uses it. Paths that connect later register the
 * regions too. 0; -EINVAL (NULL, empty), -EEXIST (overlaps a region),
 * -ENOSPC (all in use), or a path's registration error (then nothing is
 * registered); unregister: -ENOENT if buf starts no region.
 */
#define RTRS_CLT_MEM_MAX 16
int rtrs_clt_mem_register(struct rtrs_clt_sess *sess, void *buf, size_t len);
int rtrs_clt_mem_unregister(struct rtrs_clt_sess *sess, void *buf);

/* ---- server ---------------------------------------------------------------- */

enum rtrs_srv_link_ev {
	RTRS_SRV_LINK_EV_CONNECTED,    /* first path of a session is up */
	RTRS_SRV_LINK_EV_DISCONNECTED, /* last path of a session went away */
};

struct rtrs_srv_ops {
	/*
	 * An IO arrived in chunk memory. For RTRS_WRITE, data holds what the
	 * client wrote; for RTRS_READ, fill data (datalen bytes) before
	 * answering. Answer later with rtrs_srv_resp_rdma(), from any thread,
	 * exactly once; or return a negative errno and the library answers
	 * with it at once (not if the request was answered already: a slip
	 * that is logged, never a second answer).
	 */
	int (*rdma_ev)(void *priv, struct rtrs_srv_op *id, enum rtrs_dir dir,
		       void *data, size_t datalen, const void *usr, size_t usrlen);
	/*
	 * Session up/down. A non-zero return on CONNECTED refuses the session:
	 * the client's path gets it as its errno (-EACCES and -EPERM: do not
	 * retry; a positive errno counts as its negative); a value whose size
	 * is beyond 4095 goes as -ECONNRESET.
	 */
	int (*link_ev)(struct rtrs_srv_sess *sess, enum rtrs_srv_link_ev ev, void *priv);
	void *priv;
};

struct rtrs_srv_opts {
	size_t size;               /* sizeof(struct rtrs_srv_opts) */
	const char *addr;          /* listen address; NULL = 0.0.0.0 */
	uint16_t port;             /* 0 = any free port, see rtrs_srv_get_port() */
	const char *provider;      /* default "tcp" */
	uint32_t queue_depth;      /* chunks per session (default 512) */
	uint32_t max_chunk_size;   /* power of two >= 8192 (default 128 KiB) */
	unsigned hb_interval_ms;
	unsigned hb_missed_max;
	unsigned listen_retry_ms;  /* retry period while the address is missing (1000) */
	unsigned max_cons_per_path; /* connections a client may open per path (129) */
	unsigned connect_timeout_ms; /* a path still connecting after this is closed (30000) */
	/*
	 * always_invalidate (default 1): a chunk's remote key is revoked
	 * before its IO reaches rdma_ev and a new, never reused key goes back
	 * with the response, so no client can write a buffer the server is
	 * working on. Costs a re-registration per IO (bench/RESULTS.md). Only
	 * clients of this project speak it: a client that speaks only the
	 * Linux kernel's RTRS is refused (-EOPNOTSUPP) while it is on
	 * (docs/protocol.md, "Kernel peers").
	 */
	int always_invalidate;
	/*
	 * Authentication (docs/security.md). With auth_keys_file set every
	 * client must authenticate with DH-HMAC-CHAP on each path before it
	 * learns any chunk address or key. The file lists
	 * "<host name> <host secret> [<ctrl secret>]" per line and is read
	 * at every authentication, so a changed key applies to the next
	 * connect. It must be a regular file, and list a host when the server
	 * opens (-ENOKEY: it would refuse every one); it is read on a thread of its
	 * own, and an authentication that waits more than 1 s for it fails
	 * (the host may retry). A client that speaks only the Linux kernel's
	 * RTRS cannot authenticate and is refused (-EACCES).
	 * auth_name is this server's name (default "rtrs-server").
	 * auth_hashes / auth_dhgroups: what the server accepts, in order of
	 * preference (defaults "sha256,sha384,sha512" and
	 * "ffdhe2048,ffdhe3072,ffdhe4096,ffdhe6144,ffdhe8192,null").
	 * A path that has not authenticated after auth_timeout_ms (10000) is
	 * closed.
	 */
	const char *auth_keys_file;
	const char *auth_name;
	const char *auth_hashes;
	const char *auth_dhgroups;
	unsigned auth_timeout_ms;
	/*
	 * Limits (docs/security.md); 0 takes the default. A connection that
	 * has not finished its handshake (a TCP connection that sent no
	 * connection request yet, or a path not yet connected: with
	 * authentication, one whose host has not proven itself) is pending:
	 * at most max_pending (32) in all and max_pending_per_peer (8) from
	 * one address. A new one beyond a limit closes the oldest pending
	 * one of the same scope that has stalled (no step of its handshake
	 * for a quarter of handshake_timeout_ms); when all of them are
	 * progressing, the new one is refused (EBUSY, the client tries
	 * again). A TCP connection that sends no request within
	 * handshake_timeout_ms (5000) is closed. With authentication, a path
	 * whose host has proven itself but that is not connected yet is held
	 * for that host name: at most max_sessions_per_peer of one host, from
	 * whatever addresses (the host's oldest stalled one closes for a new
	 * one, else EBUSY). max_sessions (256) connected sessions, at most
	 * max_sessions_per_peer (64) of them from one address (with
	 * authentication: of one host name, those still in their handshake
	 * counted, ENOSPC when the host proves itself), and max_chunk_mem
	 * bytes of chunk memory for all of them (default a quarter of the
	 * machine's memory): a session beyond any is refused (ENOSPC, the
	 * client may retry).
	 */
	unsigned max_pending;
	unsigned max_pending_per_peer;
	unsigned handshake_timeout_ms;
	unsigned max_sessions;
	uint64_t max_chunk_mem;
	/*
	 * Completion threads keep polling their queue this long (microseconds)
	 * once it is empty before they sleep (default 0: sleep at once). Spends
	 * CPU to save the wake-up of a sleeping thread per completion, which
	 * can bound throughput where wake-ups are slow (virtual machines). On
	 * the rdma fabric (RDMA devices); other fabrics ignore it.
	 */
	unsigned busy_poll_us;
	unsigned max_sessions_per_peer; /* see max_pending above; 0: the default */
	/*
	 * The process's poll groups: how many threads serve every connection
	 * of the process, per fabric (tcp, RDMA devices; 0: one per CPU, the
	 * default). A fabric's groups start with its first session or server
	 * and stop with its last; the open that starts them sets their
	 * number, later ones do not change it.
	 */
	unsigned poll_groups;
	/*
	 * RDMA devices: the IO connections of a poll group on one device take
	 * their receives (one per incoming immediate) from one shared receive
	 * queue of srq_depth receives (0: RTRS_DEFAULT_SRQ_DEPTH, at most
	 * what the device allows), so that receive memory does not grow with
	 * the connections; a peer that finds it empty retries (RNR), as the
	 * kernel's and our client ask for without limit. no_srq: each
	 * connection posts its own, queue_depth + 16 of them. Set by the
	 * server that opens first in a process; the tcp fabric ignores both.
	 */
	unsigned srq_depth;
	bool no_srq;
	/*
	 * TLS on the tcp provider: RTRS_TLS_OFF (a TLS client is refused),
	 * RTRS_TLS_OFFERED or RTRS_TLS_REQUIRED (a plain client is refused).
	 * Needs auth_keys_file, whose lines hold the PSKs: a host's "tls="
	 * key, or its DH-HMAC-CHAP secret for derived ones; they are read at
	 * open and at rtrs_srv_reload_keys. tls_no_ktls as for the client.
	 */
	enum rtrs_tls_mode tls;
	bool tls_no_ktls;
};

/* Counters of a server, for tests and monitoring. */
struct rtrs_srv_stats {
	size_t size;               /* sizeof(struct rtrs_srv_stats), set by the caller */
	uint64_t connreqs;         /* connection requests that arrived */
	uint64_t rejects;          /* ... refused at once */
	uint64_t auth_ok;          /* paths that authenticated */
	uint64_t auth_failed;      /* authentications refused */
	uint64_t auth_timeouts;    /* paths closed for not authenticating in time */
	uint64_t key_rotations;    /* chunk keys registered (each session's first ones too) */
	uint64_t sessions;         /* sessions now, established or not */
	uint64_t chunk_bytes;      /* chunk memory now mapped: only sessions whose path
				      asked for its chunks (after authentication) have any */
	uint64_t pending_evicted;  /* pending (or a host's held) paths closed for newer ones */
	uint64_t raw_closed;       /* TCP connections closed before their request */
	/* sessions refused for max_sessions(_per_peer) or max_chunk_mem, paths for their host's */
	uint64_t limit_refusals;
};

int rtrs_srv_get_stats(struct rtrs_srv_ctx *ctx, struct rtrs_srv_stats *st);

/* A path of a server session, as rtrs_srv_sessions() reports it. */
struct rtrs_srv_path_info {
	char peer[64];             /* the client's address and port */
	const char *state;         /* "connecting", "connected", "closing", "closed" */
	uint64_t age_ms;           /* since its first connection request */
	uint32_t cons;             /* connections accepted (admin + IO) */
	uint32_t inflight;         /* requests with the user or answering now */
	uint64_t reads, read_bytes, writes, write_bytes;
	char auth_host[256];       /* the host it authenticated as; "" when none */
	char local[64];            /* this server's address and port it came in on; "" before */
};

/* A session of the server, with its paths. */
struct rtrs_srv_sess_info {
	char name[256];            /* "" until its first path's info request named it */
	bool kernel_client;        /* speaks only the Linux kernel's RTRS */
	bool always_invalidate;
	uint32_t queue_depth;
	uint32_t chunk_size;
	uint32_t paths_up;
	uint32_t paths_num;
	const struct rtrs_srv_path_info *paths; /* paths_num of them */
	void *priv;                /* rtrs_srv_set_sess_priv()'s */
};

/*
 * Calls fn once for each session the server has now, with a snapshot
 * (valid during the call) taken on the service thread, outside any of the
 * server's locks: fn may take its own. Returns the number of sessions, or
 * a negative errno (-ENOMEM).
 */
int rtrs_srv_sessions(struct rtrs_srv_ctx *ctx,
		      void (*fn)(void *priv, const struct rtrs_srv_sess_info *info), void *priv);

int rtrs_srv_opts_init(struct rtrs_srv_opts *opts, size_t size);
/* The default of rtrs_srv_opts.max_chunk_mem on this machine. */
uint64_t rtrs_default_max_chunk_mem(void);

/*
 * Starts a server. It returns without touching the network: listening starts
 * on a service thread and is retried until the address exists.
 */
int rtrs_srv_open(const struct rtrs_srv_ops *ops, const struct rtrs_srv_opts *opts,
		  struct rtrs_srv_ctx **out);

/*
 * Reads the authentication key file again and checks every line (on
 * SIGHUP, say): 0, or the error, logged with file and line (-ENOKEY: it
 * lists no host). Keys are read at every authentication anyway; this tells
 * at once that a change parses. -ENOENT when the server has no key file.
 */
int rtrs_srv_check_keys(struct rtrs_srv_ctx *ctx);
/*
 * rtrs_srv_check_keys, then revocation: every live path of a host the
 * file no longer lists is closed (its client's reconnect is then refused,
 * and it does not retry). A host still listed keeps its paths, whatever
 * its key now is: a changed key applies from its next authentication.
 * The number of paths closed, or the error (nobody is revoked on a file
 * that does not parse or cannot be read).
 */
int rtrs_srv_reload_keys(struct rtrs_srv_ctx *ctx);

/*
 * Waits until the server listens: 0. Not listening after timeout_ms (0:
 * look only), the error its last attempt to listen met (-EADDRINUSE,
 * -EADDRNOTAVAIL, ...; it keeps retrying every listen_retry_ms), or
 * -ETIMEDOUT while no attempt has failed yet.
 */
int rtrs_srv_wait_listening(struct rtrs_srv_ctx *ctx, unsigned timeout_ms);
/* The port the server listens on (after rtrs_srv_wait_listening). */
int rtrs_srv_get_port(struct rtrs_srv_ctx *ctx);

/*
 * Closes every session and stops listening. Waits until every IO handed to
 * rdma_ev has been answered, so it must not be called from a callback.
 */
void rtrs_srv_close(struct rtrs_srv_ctx *ctx);

/* Answers an IO with 0 or a negative errno (|errno| <= 511). */
int rtrs_srv_resp_rdma(struct rtrs_srv_op *id, int err);

/*
 * What the session's client speaks: 1, a client of this project (it set
 * the extension bit); 0, a client that speaks only the Linux kernel's RTRS
 * (docs/protocol.md, "Kernel peers"), which gets a kernel server's answers.
 * -EINVAL without a session.
 */
int rtrs_srv_sess_peer_ext(struct rtrs_srv_sess *sess);
void rtrs_srv_set_sess_priv(struct rtrs_srv_sess *sess, void *priv);
void *rtrs_srv_get_sess_priv(struct rtrs_srv_sess *sess);
int rtrs_srv_get_sess_name(struct rtrs_srv_sess *sess, char *buf, size_t len);
/*
 * The host the session's paths authenticated as (docs/security.md): set
 * before link_ev's CONNECTED; "" on a server without authentication.
 * -ENOBUFS when it does not fit in len.
 */
int rtrs_srv_get_sess_host(struct rtrs_srv_sess *sess, char *buf, size_t len);
int rtrs_srv_get_queue_depth(struct rtrs_srv_sess *sess);
/* The session an op belongs to. */
struct rtrs_srv_sess *rtrs_srv_op_sess(struct rtrs_srv_op *id);
/*
 * The op's slot number, 0 .. rtrs_srv_get_queue_depth() - 1 (its chunk).
 * No two ops of a session that are waiting for their answer have the same
 * one, so a user can keep its per-request state in an array of queue depth
 * entries per session; a slot is free again once rtrs_srv_resp_rdma() was
 * called for its op (do not touch it after that call).
 */
unsigned rtrs_srv_op_id(const struct rtrs_srv_op *id);

/* ---- misc -------------------------------------------------------------------- */

/*
 * Log level: 0 error, 1 warn (the default), 2 info, 3 debug. The library
 * reads no environment: the tools take RTRS_LOG_LEVEL and call this.
 */
void rtrs_set_log_level(int level);
/*
 * Sends log lines to fn instead of stderr (NULL restores stderr). fn runs on
 * library threads, must not block and must not call back into the library.
 * Set it before opening sessions or servers, not while they run.
 */
void rtrs_set_log_fn(void (*fn)(void *priv, int level, const char *line), void *priv);
/*
 * Why the last call of librtrs (or librnbd) that failed on this thread
 * failed, where its errno alone does not say: "cannot resolve host.example:
 * Name or service not known", "host secret @/etc/key: cannot open the key
 * file: No such file or directory". "" when there is nothing to add. The
 * string is the thread's own, valid until its next call into the library.
 */
const char *rtrs_last_error(void);
/*
 * Whether name can be an authentication name (a server's auth_name, a
 * client's host name): 1..223 printable ASCII characters, no blank. 0, or
 * -EINVAL with the reason in *why (a static string; why may be NULL). A
 * program checks its option with it before it opens anything, so that its
 * error can name where the value came from.
 */
int rtrs_auth_name_check(const char *name, const char **why);

#ifdef __cplusplus
}
#endif

#endif
