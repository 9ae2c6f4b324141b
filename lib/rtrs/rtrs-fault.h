/* SPDX-License-Identifier: MIT */
/*
 * Fault injection for tests. It exists only in builds made with
 * meson -Dfault_injection=true: there RTRS_FAULT_INJECTION is defined for
 * the library and for the programs that use rtrs_fault_dep, and librtrs
 * exports the calls below. A build to ship has none of it, and this is not
 * part of the library's interface (include/rtrs.h).
 *
 * The faults are injected by a wrapper around the fabric the build would
 * open (fab_impl: tcp or rdma-core; rtrs-fabric-fault.c, described
 * in docs/architecture.md section 6). They apply to every fabric
 * opened after rtrs_fault_set() until the next call: a client opens one per
 * path at each connect attempt, a server one per listening address. A
 * fabric keeps the faults it was opened with for the life of its
 * connections. A fabric opened while no fault applies to it is the inner
 * one itself, unwrapped.
 */
#ifndef RTRS_FAULT_H
#define RTRS_FAULT_H

#include <stdbool.h>
#include <stdint.h>

struct rtrs_fault {
	/*
	 * Every Nth fab_write or fab_write_imm on each connection fails with
	 * -EAGAIN as if the send queue were full: drives the pending lists
	 * and kicks (the tcp provider's queue grows on demand and never says
	 * so itself). 0: off. 1 is refused: nothing would ever go out.
	 * fab_send is not affected.
	 */
	unsigned eagain_every;
	/*
	 * A slow path: the connections of fabrics opened from local address
	 * delay_src (a client path's source as given, e.g. "127.0.0.2")
	 * handle each immediate they receive (responses, heartbeats)
	 * delay_us late. delay_src NULL: every fabric.
	 */
	const char *delay_src;
	unsigned delay_us;
	/*
	 * Client: requests keep the first key each chunk was written with and
	 * never take the newer ones an always_invalidate server hands out, so
	 * the second use of a chunk writes with a revoked key. The fabrics
	 * opened under one rtrs_fault_set() share the record of first keys:
	 * open one session under it. A request that needs several writes
	 * cannot be faulted: it fails with -EOPNOTSUPP.
	 */
	bool stale_rkey;
	/*
	 * Client: every connection request names this session uuid (at most
	 * 16 bytes, the rest zero) instead of the session's random one: a
	 * client that claims another's session. NULL: off.
	 */
	const char *paths_uuid;
	/*
	 * Client: connection requests go out as a kernel client's, without
	 * this project's flags (RTRS_CONN_EXT, FENCE, AUTH), so the server
	 * answers as to the kernel's rtrs-client (with always_invalidate:
	 * its way) and the client falls back as with a kernel server. Keep
	 * it set while the session may reconnect.
	 */
	bool kernel_client;
	/*
	 * Client: fab_open takes this many milliseconds longer (a name or an
	 * RDMA address slow to resolve), on whatever thread calls it. 0: off;
	 * at most 10000. The fabrics opened so are counted, and their closes
	 * (late_opens, late_closes): a test proves none was left open.
	 */
	unsigned open_delay_ms;
	/*
	 * Client: a connection of a fabric opened under it that goes down
	 * (refused, reset, timed out) reports -ENODEV instead, as rdma-core
	 * does when its device is removed: an attempt failing so closes the
	 * path's fabric, and the next attempt opens it again.
	 */
	bool down_nodev;
	/*
	 * Client, with down_nodev: a fabric that had a connection go down so is
	 * dead from then on, as an RDMA device's context is once the device is
	 * removed: its registrations fail with -EIO (not -ENODEV) and so do its
	 * connects. Only a fabric opened anew works.
	 */
	bool nodev_dead;
	/*
	 * Client: TLS handshakes present another host's configured PSK:
	 * tls_key (an NVMeTLSkey-1 string) under the identity of tls_host at
	 * server tls_server, in place of the session's own; on every
	 * connection, or with tls_later_only on connections other than 0
	 * only. A host that holds another's TLS key. All three or none.
	 */
	const char *tls_host;
	const char *tls_server;
	const char *tls_key;
	bool tls_later_only;
	/*
	 * Process-wide, not per fabric: the rdma fabric's iWARP connect
	 * threads (rtrs-fabric-rdma.c, RDMA_CONNECT_THREADS_MAX, 64) are at
	 * most this many while it is set (1..64; 0: 64), so that a test fills
	 * the pool with a few connects that hang. Threads beyond it that run
	 * go on; none is made past it.
	 */
	unsigned rdma_connect_threads;
	/*
	 * Process-wide, rdma fabric only: the Nth post of send work requests
	 * from now on (1..; 0: off) queues them and then reports -ENOMEM with
	 * no failed request named, as rxe's provider does when its doorbell
	 * (a write to the device's file) fails after the requests went into
	 * the queue. Once per rtrs_fault_set.
	 */
	unsigned rdma_post_fail_at;
};

/*
 * Sets the faults for fabrics opened from now on (a copy is kept; NULL or
 * all zero: none), and rdma_connect_threads at once. 0, or -EINVAL for
 * eagain_every 1, a delay over 10 s, a delay_src over 255 bytes, a
 * paths_uuid over 16 bytes or rdma_connect_threads over 64.
 */
int rtrs_fault_set(const struct rtrs_fault *f);

/* Faults injected in this process so far: a test proves its fault bit. */
struct rtrs_fault_stats {
	uint64_t eagain;      /* writes refused with -EAGAIN */
	uint64_t delayed;     /* immediates handled late */
	uint64_t stale_keys;  /* writes sent with an older key than the client gave */
	uint64_t uuids;       /* connection requests sent with paths_uuid */
	uint64_t kernel_reqs; /* connection requests sent as a kernel client's */
	uint64_t nodev;       /* connections reported down with -ENODEV (down_nodev) */
	uint64_t tls_swaps;   /* connections made with the tls_host's PSK */
	uint64_t late_opens;  /* fabrics opened open_delay_ms late */
	uint64_t late_closes; /* ... and closed */
	uint64_t posts_failed; /* rdma posts reported failed after queuing (rdma_post_fail_at) */
};

void rtrs_fault_get_stats(struct rtrs_fault_stats *st);

#endif
