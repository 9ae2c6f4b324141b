/* SPDX-License-Identifier: MIT */
/*
 * Internal definitions shared by the client and the server of librtrs.
 */
#ifndef RTRS_PRI_H
#define RTRS_PRI_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "rtrs.h"
#include "log.h"
#include "loop.h"
#include "rtrs-fabric.h"
#include "rtrs-proto.h"
#include "util.h"

#define RTRS_EXPORT __attribute__((visibility("default")))

/*
 * Data vectors per request the client accepts. The kernel maps up to 128
 * pages per request into one MR; we pass vectors as they are.
 */
#define RTRS_MAX_SEGMENTS 16
/* Receives posted on the admin connection: info and control messages. */
#define RTRS_ADMIN_RX_DEPTH 8
#define RTRS_ADMIN_MSG_SIZE 4096
/*
 * Client admin connection: its receive queue is sized before the server's
 * queue depth is known; on verbs the pool (one receive per incoming
 * immediate) is capped at this. More admin IO in flight only meets receiver-
 * not-ready retries.
 */
#define RTRS_CLT_ADMIN_RX_QUEUE 1040
/* Queue entries a client asks its fabric for before it knows the server's. */
#define RTRS_CLT_QUEUE_HINT 8192
/*
 * rtrs_clt_open: connects of a path that reached the server and was
 * refused without "do not retry", or dropped (clt_path_open).
 */
#define RTRS_OPEN_TRIES 10
/*
 * Reconnect attempts in progress at once in a process (state machines on
 * the service loop, no thread each): a thousand paths that lost their
 * server all at once take turns, the others' timers firing again
 * RTRS_RECONNECT_DEFER_MS later, so that the server meets a stream of
 * handshakes rather than a wall of them.
 */
#define RTRS_RECONNECT_ATTEMPTS_MAX 16
#define RTRS_RECONNECT_DEFER_MS 50
/* always_invalidate: a new chunk key must differ from this many before it. */
#define RTRS_KEY_HISTORY 4
/* Size of the region each side lets the peer aim empty writes at. */
#define RTRS_IMM_REGION 64

/*
 * Receives a client posts on each IO connection where every incoming
 * immediate takes one (verbs): the kernel's client posts 2 x queue depth
 * (a read it sends with NEED_INVAL is answered by a send with invalidate
 * and then the response), and a server may count on that.
 */
static inline size_t rtrs_clt_io_rx_depth(uint32_t queue_depth)
{
	return MAX(2 * (size_t)queue_depth, (size_t)queue_depth + 16);
}

/*
 * Test hooks for the unit tests' scenarios, which link the internal
 * archive (the shipped library exports neither): a client that speaks only
 * the kernel's protocol (its requests carry no RTRS_CONN_EXT, and it falls
 * back as it would with a kernel server), and a server that answers every
 * client as a kernel server would. Set before opening; read at each
 * connection request.
 */
extern atomic_bool rtrs_test_kernel_clt;
extern atomic_bool rtrs_test_kernel_srv;
/*
 * Server: op_defer calls the first, with the session's defer_lock held,
 * after it found the request's path connected and before it records the
 * request; srv_defers_cancel calls the second when it is done with a
 * closing path. NULL: none (a scenario sets them, then clears them).
 */
extern void (*_Atomic rtrs_test_srv_defer_checked)(void);
extern void (*_Atomic rtrs_test_srv_defers_cancelled)(void);
/*
 * Server: srv_auth_answer calls it on the offload worker before each step
 * of a transaction (the key file read, the DH exchange), as a slow key
 * file or DH exchange would hold the job there. NULL: none.
 */
extern void (*_Atomic rtrs_test_srv_auth_step)(void);

/*
 * Path states. The transitions allowed are a table in rtrs.c
 * (rtrs_path_state_allowed) and in docs/protocol.md.
 */
enum rtrs_path_state {
	RTRS_PATH_CONNECTING,
	RTRS_PATH_CONNECTED,
	RTRS_PATH_CLOSING,
	RTRS_PATH_CLOSED,
	RTRS_PATH_RECONNECTING, /* client: failed, waiting for the next attempt */
	RTRS_PATH_NUM_STATES,
};

const char *rtrs_path_state_str(enum rtrs_path_state s);
bool rtrs_path_state_allowed(enum rtrs_path_state from, enum rtrs_path_state to);
/*
 * The one place a path (client or server) changes state: refuses and logs
 * a transition the table does not allow; name is the path's, for the log.
 */
bool rtrs_path_change_state(_Atomic enum rtrs_path_state *state, const char *name,
			    enum rtrs_path_state to);

/* What path selection looks at: a snapshot of one path. */
struct rtrs_mp_path {
	bool connected;
	bool tried;        /* already tried for this request */
	uint32_t inflight;
	uint64_t latency_ns; /* 0: not measured yet */
};

/*
 * Picks a path for one request under policy: a connected path not yet
 * tried; round-robin advances *rr. Returns its index, or -1 if none.
 * Ties go to the lowest index (min-inflight) or the next in turn.
 */
int rtrs_mp_select(enum rtrs_mp_policy policy, const struct rtrs_mp_path *paths, size_t n,
		   unsigned *rr);

/*
 * The wait before a reconnect attempt: delay_ms plus a uniform random
 * 0..jitter_ms (milliseconds meant, unlike the kernel's), at least min_ms
 * and at least 1.
 */
unsigned rtrs_reconnect_wait_ms(unsigned delay_ms, unsigned jitter_ms, unsigned min_ms);

/*
 * The reconnect decision, modelled on the kernel's nvmf_should_reconnect():
 * every failure of a path (an attempt, or the path while connected) asks
 * it, and nothing else decides whether the path tries again.
 */
struct rtrs_reconnect_in {
	int err;                 /* why it failed: negative errno */
	bool dnr;                /* the server's verdict said: do not retry */
	bool stopping;           /* session closing, or the user disconnected the path */
	int attempts;            /* failed reconnect attempts in a row so far */
	int max_attempts;        /* -1: forever; 0: never */
	uint64_t down_ms;        /* how long the path has been down */
	unsigned loss_timeout_ms; /* 0: no limit */
};

enum rtrs_reconnect_verdict {
	RTRS_RECONNECT_RETRY,
	RTRS_RECONNECT_STOPPED,       /* closing or disconnected by the user */
	RTRS_RECONNECT_KEY_REJECTED,  /* -EKEYREJECTED: authentication failed */
	RTRS_RECONNECT_NO_KEY,        /* -ENOKEY: a key is needed and not there */
	/* retrying cannot help: the server said so, or it changed (queue depth, keys) */
	RTRS_RECONNECT_SERVER_DNR,
	RTRS_RECONNECT_LOSS_TIMEOUT,  /* down longer than reconnect_loss_timeout_ms */
	RTRS_RECONNECT_OUT_OF_ATTEMPTS,
	RTRS_RECONNECT_NR_VERDICTS,
};

enum rtrs_reconnect_verdict rtrs_should_reconnect(const struct rtrs_reconnect_in *in);
/* "retry", "key rejected", ...: what a path shows for the verdict. */
const char *rtrs_reconnect_verdict_str(enum rtrs_reconnect_verdict v);

/*
 * Admission of a path that has not proven itself yet (the server, at each
 * connection request for a new path): pending[] are those already
 * pending, each with its peer's host, the order it came in and whether it
 * has stalled (made no step of its handshake for a while). With max_total
 * (all) or max_per_peer (from host) reached, the oldest stalled one in
 * that scope goes to make room: a peer that holds half-open paths loses
 * them, while handshakes that are progressing are never cut short; when
 * none in the scope has stalled, the newcomer is refused (-EBUSY, the
 * client tries again later). Returns how many must go (0 to 2, named in
 * evict[], the one in all first), or -EBUSY. Pure: rtrs-srv-admit.c.
 */
struct rtrs_admit_entry {
	const char *host;
	uint64_t serial;   /* order of creation: the lower, the older */
	bool stalled;      /* no step of its handshake for a while */
};

struct rtrs_admit_limits {
	unsigned max_total;
	unsigned max_per_peer;
};

struct rtrs_admit_evict {
	size_t idx;      /* into pending[] */
	bool per_peer;   /* the limit reached was max_per_peer */
	unsigned count;  /* pending in that scope, the new one not counted */
};

int rtrs_admit_decide(const struct rtrs_admit_entry *pending, size_t n, const char *host,
		      const struct rtrs_admit_limits *lim, struct rtrs_admit_evict evict[2]);

/*
 * Admission of a path whose host has just proven itself (with
 * authentication), by the host's name: held[] are the paths the server
 * holds proven but not connected yet (their host names, order, stall),
 * of any host; those of host count against max_held, from whatever
 * addresses they came. Below it the path is in (0); at it the oldest
 * stalled one of host goes to make room (1, named in *evict: a host that
 * left half-open paths behind, a client that restarted, gets in at once);
 * when all of them are progressing the newcomer is refused (-EBUSY, the
 * client tries again): a host's progressing handshakes are never cut
 * short, and another host's paths never count. A limit of 0 refuses
 * every one. Pure: rtrs-srv-admit.c.
 */
int rtrs_admit_held_decide(const struct rtrs_admit_entry *held, size_t n, const char *host,
			   unsigned max_held, struct rtrs_admit_evict *evict);

/*
 * Who waited goes first. A path refused -EBUSY is remembered by its
 * peer's host and its uuid (which a client keeps across the attempts of
 * one open and its reconnects) with how many times it was refused. While
 * a host has a live waiter (refused within RTRS_ADMIT_WAITER_LIVE_MS), a
 * newcomer of that host that was never refused takes neither a free place
 * nor a stalled path's: it is refused once and waits its turn like the
 * others; one that comes back is taken as the limits allow. A flood of
 * new half-open paths from a client's own address, which never come back,
 * then stops winning the places from a client that tries again, and a
 * storm of clients (all of whom come back) loses no place. The table holds
 * RTRS_ADMIT_WAITERS; a full one gives the place of the entry refused
 * least and seen longest ago, of the noting host's own once it holds half
 * the table (a flood from one address cannot push the others' waiters
 * out). Pure: rtrs-srv-admit.c.
 */
#define RTRS_ADMIT_WAITERS 1024
#define RTRS_ADMIT_WAITER_LIVE_MS 5000

struct rtrs_admit_waiter {
	char host[64];
	uint8_t uuid[16];
	unsigned refusals;  /* 0: a free entry */
	uint64_t last_ms;
};

/* How many times (host, uuid) was refused busy, and the most any other live waiter of host was. */
void rtrs_admit_waits(const struct rtrs_admit_waiter *w, size_t n, const char *host,
		      const uint8_t uuid[16], uint64_t now_ms, unsigned *waits, unsigned *most);
/* decided (rtrs_admit_decide's return) for a newcomer refused waits times; most, as above. */
int rtrs_admit_queue(int decided, unsigned waits, unsigned most);
/* (host, uuid) was refused busy at now_ms: counted. */
void rtrs_admit_waiter_note(struct rtrs_admit_waiter *w, size_t n, const char *host,
			    const uint8_t uuid[16], uint64_t now_ms);
/* (host, uuid) got in: forgotten. */
void rtrs_admit_waiter_forget(struct rtrs_admit_waiter *w, size_t n, const char *host,
			      const uint8_t uuid[16]);

/*
 * A new session names a session the server still holds (its holder): the
 * successor of a client that died or restarted, or a second client with
 * the same name. Only the holder's own host (the authenticated host, else
 * the address) may take the name over, and only once the holder is gone
 * with all it dispatched: the successor's path waits (checked again every
 * RTRS_TAKEOVER_POLL_MS) until the server frees the holder, whose ops the
 * user has all answered by then, so nothing the dead client sent can reach
 * the device after the successor's first IO (the fence of a restart;
 * docs/protocol.md section 10). Verdicts: RTRS_TAKEOVER_WAIT; _PROCEED,
 * no holder; _TAKEN, another host's name, or a holder that still has a
 * connected path after live_ms that answers heartbeats (a client that is
 * alive: refused, do not retry, -EPERM); _RETRY, a holder still draining
 * after drain_ms, or still connected after live_ms but silent (a kernel
 * client's path is cut only after RTRS_KERNEL_HB_BUDGET_MS of silence):
 * refused, -EAGAIN, the client's open tries again. Pure:
 * rtrs-srv-admit.c.
 */
#define RTRS_TAKEOVER_POLL_MS 5
/* A draining holder is waited for this long per attempt (within a client's info timeout, 10 s). */
#define RTRS_TAKEOVER_DRAIN_MS 5000

enum rtrs_takeover_verdict {
	RTRS_TAKEOVER_PROCEED,
	RTRS_TAKEOVER_WAIT,
	RTRS_TAKEOVER_TAKEN,
	RTRS_TAKEOVER_RETRY,
};

struct rtrs_takeover_in {
	bool held;           /* a session of that name exists */
	bool same_host;      /* ... of the newcomer's host */
	unsigned paths_up;   /* its connected paths */
	uint64_t waited_ms;  /* since the newcomer's path first asked */
	uint64_t live_ms;    /* a holder connected this long after is alive... */
	bool silent;         /* ... unless no path of it answered the last two heartbeats */
	uint64_t drain_ms;   /* the wait for a draining holder, per attempt */
};

enum rtrs_takeover_verdict rtrs_takeover_decide(const struct rtrs_takeover_in *in);

/*
 * A fence the server received (docs/protocol.md section 10): acked at once
 * (the incarnation it names is gone), refused (a path cannot fence itself)
 * or the path stopped and drained before the ack.
 */
enum rtrs_fence_verdict {
	RTRS_FENCE_ACK,
	RTRS_FENCE_SELF,
	RTRS_FENCE_STOP,
};

struct rtrs_fence_in {
	bool found;          /* the session holds a path of that uuid */
	bool self;           /* ... and it is the path the fence came on */
	int32_t recon;       /* the incarnation the fence names, -1: any */
	uint16_t path_recon; /* the held path's: its connection request's recon_cnt */
};

enum rtrs_fence_verdict rtrs_fence_decide(const struct rtrs_fence_in *in);

/* Splits "host:port", "[v6]:port" or "host" as rtrs_addr_parse does; 0 or -EINVAL. */
int rtrs_split_hostport(const char *in, uint16_t default_port, char *host, size_t hostlen,
			char *port, size_t portlen);

/* Heartbeat bookkeeping, the same on both sides. */
struct rtrs_hb {
	struct loop_timer timer;
	atomic_uint missed;
	atomic_uint_fast64_t last_sent_ns;
	atomic_uint_fast64_t latency_ns;
	unsigned interval_ms;
	unsigned missed_max;
	/*
	 * One ack on its way at a time: a peer that floods heartbeats gets no
	 * more than that queued (the one on its way answers for the rest).
	 * Its address is the completion context. The ack is posted and its
	 * completion read on the same thread, the admin connection's, so a
	 * heartbeat that arrives finds the previous ack's completion read.
	 * Our own heartbeats, one per interval from the service loop, are
	 * not held back by a completion that thread has not read yet (a
	 * busy machine would then starve the peer of them); the send queue's
	 * bound keeps them from piling up behind a peer that stops reading.
	 */
	atomic_bool ack_out;
	/*
	 * Beats go out once the peer has spoken since its path came up: a
	 * kernel client posts its receive buffers when it reads the info
	 * response, so a beat sent at once can meet an RNR NAK (seen under
	 * load; soft-RoCE in 6.1 then lost the response queued behind it,
	 * and the path died). Silence is still counted meanwhile. True
	 * unless the server has just answered the info request.
	 */
	atomic_bool peer_ready;
};

/* Posts a heartbeat, or (ack) its answer unless one is on its way. */
static inline int rtrs_hb_post(struct rtrs_hb *hb, struct fab_con *fc, uint64_t addr,
			       uint64_t key, bool ack)
{
	int rc;

	if (!ack)
		return fab_write_imm(fc, addr, key, rtrs_to_imm(RTRS_HB_MSG_IMM, 0));
	if (atomic_exchange(&hb->ack_out, true))
		return 0;
	rc = fab_write_imm_ctx(fc, addr, key, rtrs_to_imm(RTRS_HB_ACK_IMM, 0), &hb->ack_out);
	if (rc)
		atomic_store(&hb->ack_out, false);
	return rc;
}

/* From a connection's done(): true when ctx was hb's. */
static inline bool rtrs_hb_done(struct rtrs_hb *hb, void *ctx)
{
	if (ctx != &hb->ack_out)
		return false;
	atomic_store(&hb->ack_out, false);
	return true;
}

/*
 * The kernel's heartbeat budget (RTRS_HB_INTERVAL_MS 5000 x RTRS_HB_MISSED_MAX
 * 5): how long a kernel peer may be silent before the kernel itself would
 * give up. Our server allows a kernel client at least this long (a kernel
 * server would); docs/protocol.md section 8.
 */
#define RTRS_KERNEL_HB_BUDGET_MS 25000u

/*
 * How long a connection's sent bytes may go unacknowledged before it fails
 * (fab_con_cfg.live_ms): twice the path's heartbeat budget, so that the
 * heartbeats still decide for connection 0 and the path, at least
 * RTRS_LIVE_MIN_MS (a few retransmissions: one lost segment is never
 * fatal), at most RTRS_LIVE_MAX_MS; 0 without heartbeats.
 */
#define RTRS_LIVE_MIN_MS 2000u
#define RTRS_LIVE_MAX_MS 600000u
static inline unsigned rtrs_live_ms(unsigned hb_interval_ms, unsigned hb_missed_max)
{
	uint64_t ms = 2ull * hb_interval_ms * hb_missed_max;

	if (!ms)
		return 0;
	return ms < RTRS_LIVE_MIN_MS ? RTRS_LIVE_MIN_MS : ms > RTRS_LIVE_MAX_MS ? RTRS_LIVE_MAX_MS :
	       (unsigned)ms;
}

/*
 * Heartbeats received on a connection (its completion thread only). A peer
 * beats at most every 10 ms, and answers ours: more than
 * RTRS_HB_RX_BURST in any 100 ms is a flood, and fails the path (a
 * provider may queue every immediate it reads, without bound, before we
 * see any of them).
 */
#define RTRS_HB_RX_BURST 50

struct rtrs_hb_rx {
	uint64_t win_ms;
	unsigned n;
	const void *reported;       /* the connection whose breach was logged */
};

static inline bool rtrs_hb_rx_flood(struct rtrs_hb_rx *r)
{
	uint64_t now = now_ms();

	if (now - r->win_ms >= 100) {
		r->win_ms = now;
		r->n = 0;
	}
	return ++r->n > RTRS_HB_RX_BURST;
}

/* A connection starts anew: nothing of an old one is on its way. */
static inline void rtrs_hb_reset(struct rtrs_hb *hb)
{
	atomic_store(&hb->missed, 0);
	atomic_store(&hb->ack_out, false);
}

/*
 * One heartbeat tick: returns true when the peer has been silent for too
 * long; otherwise counts the tick and tells the caller to send a heartbeat.
 */
static inline bool rtrs_hb_tick_expired(struct rtrs_hb *hb)
{
	if (atomic_load(&hb->missed) >= hb->missed_max)
		return true;
	atomic_fetch_add(&hb->missed, 1);
	atomic_store(&hb->last_sent_ns, now_ns());
	return false;
}

static inline void rtrs_hb_heard(struct rtrs_hb *hb)
{
	atomic_store_explicit(&hb->peer_ready, true, memory_order_relaxed);
	atomic_store_explicit(&hb->missed, 0, memory_order_relaxed);
}

static inline void rtrs_hb_acked(struct rtrs_hb *hb)
{
	atomic_store(&hb->latency_ns, now_ns() - atomic_load(&hb->last_sent_ns));
}

/*
 * A heartbeat (ack: its answer) arrived on connection cid (conn, the
 * fabric's connection), on that connection's completion thread: true when
 * it keeps to the rules (the admin connection, a heartbeat's pace); else
 * it is logged, once per connection (the beats queued behind the first
 * that broke them say nothing new, and would crowd other paths' lines out
 * of the rate limit), and the caller shuts the connection down and fails
 * the path with -EPROTO.
 */
static inline bool rtrs_hb_received(struct rtrs_hb *hb, struct rtrs_hb_rx *rx, unsigned cid,
				    bool ack, const char *name, const void *conn)
{
	if (cid != 0 || rtrs_hb_rx_flood(rx)) {
		if (rx->reported != conn)
			log_err_rl("%s: %s on connection %u; failing the path", name,
				   cid ? "heartbeat" : "heartbeat flood", cid);
		rx->reported = conn;
		return false;
	}
	rx->reported = NULL;
	if (ack)
		rtrs_hb_acked(hb);
	return true;
}

#endif
