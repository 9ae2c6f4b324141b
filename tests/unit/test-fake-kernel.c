/* SPDX-License-Identifier: MIT */
/*
 * Kernel peers over the fake fabric (docs/protocol.md, "Kernel peers"). A
 * client that speaks only the kernel's RTRS (test hook rtrs_test_kernel_clt:
 * its requests carry no RTRS_CONN_EXT) gets a kernel server's answers byte
 * for byte; a server that answers as the kernel does (rtrs_test_kernel_srv)
 * makes the client fall back: no fence or authentication message, one
 * descriptor per read, empty writes to no memory. And the kernel's rules
 * both sides keep with anyone: first_conn, recon_cnt, a peer that beats
 * every 5 s.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fake-main.h"
#include "rtrs-pri.h"

static uint16_t get16(const uint8_t *p, size_t off)
{
	return (uint16_t)(p[off] | p[off + 1] << 8);
}

static uint32_t get32(const uint8_t *p, size_t off)
{
	return get16(p, off) | (uint32_t)get16(p, off + 2) << 16;
}

static bool zeros(const uint8_t *p, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		if (p[i])
			return false;
	return true;
}

/* What the handshake put on the wire, copied as it went by. */
struct wire {
	uint8_t req[8][RTRS_CM_MSG_LEN];
	size_t req_len[8];
	char req_host[8][64];
	unsigned nr_req;
	uint8_t rsp[8][RTRS_CM_MSG_LEN];
	size_t rsp_len[8];
	unsigned nr_rsp;
	uint8_t info_req[sizeof(struct rtrs_msg_info_req)];
	size_t info_req_len;
	uint8_t info_rsp[4096];
	size_t info_rsp_len;
};

static struct wire w;

static void copy_at_most(uint8_t *dst, size_t cap, size_t *len, const struct fake_ev *ev)
{
	*len = ev->len;
	memcpy(dst, ev->data, MIN(ev->len, cap));
}

static void wire_note(const struct fake_ev *ev)
{
	int type = rtrs_msg_type(ev->data, ev->len);

	if (ev->kind == FAKE_CONNREQ && w.nr_req < ARRAY_SIZE(w.req)) {
		snprintf(w.req_host[w.nr_req], sizeof(w.req_host[0]), "%s", ev->host);
		copy_at_most(w.req[w.nr_req], sizeof(w.req[0]), &w.req_len[w.nr_req], ev);
		w.nr_req++;
	} else if (ev->kind == FAKE_ACCEPT && w.nr_rsp < ARRAY_SIZE(w.rsp)) {
		copy_at_most(w.rsp[w.nr_rsp], sizeof(w.rsp[0]), &w.rsp_len[w.nr_rsp], ev);
		w.nr_rsp++;
	} else if (ev->kind == FAKE_SEND && type == RTRS_MSG_INFO_REQ) {
		copy_at_most(w.info_req, sizeof(w.info_req), &w.info_req_len, ev);
	} else if (ev->kind == FAKE_SEND && type == RTRS_MSG_INFO_RSP) {
		copy_at_most(w.info_rsp, sizeof(w.info_rsp), &w.info_rsp_len, ev);
	}
}

/* For step_until: notes every event, stops at the one match() takes. */
static bool note_until(const struct fake_ev *ev, void *arg)
{
	wire_note(ev);
	return match(ev, arg);
}

/* An empty write with an immediate that names memory (address or key). */
static bool imm_to_memory(const struct fake_ev *ev, void *arg)
{
	return ev->kind == FAKE_WRITE && ev->with_imm && ev->rma_cnt == 1 && !ev->rma[0].len &&
	       (ev->rma[0].addr || ev->rma[0].key);
}

/* ... and one aimed at no memory at all, as the kernel sends them. */
static bool imm_to_nowhere(const struct fake_ev *ev, void *arg)
{
	return ev->kind == FAKE_WRITE && ev->with_imm && ev->rma_cnt == 1 && !ev->rma[0].len &&
	       !ev->rma[0].addr && !ev->rma[0].key;
}

/* Fence, fence ack and authentication messages delivered, either way. */
static unsigned ext_msgs(void)
{
	static const int types[] = { RTRS_MSG_FENCE, RTRS_MSG_FENCE_ACK, RTRS_MSG_AUTH };
	unsigned n = 0;

	for (size_t i = 0; i < ARRAY_SIZE(types); i++) {
		struct m m = { .kind = FAKE_SEND, .msg = MSG(types[i]) };

		n += fake_delivered(match, &m);
	}
	return n;
}

/* A server as the kernel's with always_invalidate=N, or ours without it. */
static bool srv_up(bool kernel, void (*tweak)(struct rtrs_srv_opts *so))
{
	struct rtrs_srv_opts so;
	int rc;

	srv_opts(&so);
	so.always_invalidate = 0;
	if (tweak)
		tweak(&so);
	atomic_store(&rtrs_test_kernel_srv, kernel);
	rc = srv_start(&so);
	CHECK(rc == 0, "server: %s", strerror(-rc));
	return rc == 0;
}

/*
 * Opens c, every event held and stepped, notes the handshake up to the
 * info response to host, and lets the rest go. rtrs_clt_open's result.
 */
static int open_noted(struct clt *c, const char *host)
{
	struct m info_rsp = { .kind = FAKE_SEND, .dir = TO_CLT, .host = host,
			      .msg = MSG(RTRS_MSG_INFO_RSP) };
	struct fake_ev *ev;

	memset(&w, 0, sizeof(w));
	ev = open_step_to(c, note_until, &info_rsp, "the info response");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	fake_hold(NULL, NULL);
	return clt_open_join(c);
}

static int attrs_sessions(struct clt *c)
{
	struct rtrs_attrs at = { .size = sizeof(at) };

	rtrs_clt_query(c->sess, &at);
	return (int)at.server_sessions;
}

/* ---- a kernel client ------------------------------------------------------------------------- */

/*
 * A client without RTRS_CONN_EXT gets the kernel's answers: its requests
 * (56 bytes, the CM bytes 0, first_conn alone in the flags, recon_cnt 1)
 * are accepted with the kernel's 56 bytes (flags 0, bytes 20..55 zero),
 * its info request is the kernel's (bytes 257..271 zero) and so is the
 * answer (8 + 16 x 1 bytes, reserved bytes zero). IO goes, every empty
 * write aimed at no memory, and nothing of ours passes.
 */
static void kernel_client_wire(void)
{
	struct clt c;

	if (!srv_up(false, NULL))
		return;
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "a");
	CHECK_EQ(open_noted(&c, "a"), 0);
	CHECK_EQ(w.nr_req, 2);
	for (unsigned i = 0; i < w.nr_req; i++) {
		const uint8_t *q = w.req[i];

		CHECK_EQ(w.req_len[i], 56);
		CHECK(q[0] == 0 && q[1] == 0, "request %u: the CM bytes", i);
		CHECK_EQ(get16(q, 2), RTRS_MAGIC);
		CHECK_EQ(get16(q, 6), i);
		CHECK_EQ(get16(q, 8), 2);
		CHECK_EQ(get16(q, 10), 1); /* recon_cnt: 1 on the first connect, as the kernel's */
		CHECK_EQ(q[44], RTRS_CONN_FIRST);
		CHECK(zeros(q, 45, 56), "request %u: reserved bytes", i);
	}
	CHECK_EQ(w.nr_rsp, 2);
	for (unsigned i = 0; i < w.nr_rsp; i++) {
		const uint8_t *r = w.rsp[i];

		CHECK_EQ(w.rsp_len[i], 56);
		CHECK_EQ(get16(r, 4), 0);
		CHECK_EQ(get16(r, 6), 16);
		CHECK_EQ(get32(r, 16), 0); /* no AUTH, FENCE, KEY64 or EXT flag */
		CHECK(zeros(r, 20, 56), "answer %u: bytes 20..55", i);
	}
	CHECK_EQ(w.info_req_len, 272);
	CHECK(!memcmp(w.info_req + 2, "k", 2), "the session name");
	CHECK(zeros(w.info_req, 257, 272), "the info request's reserved bytes");
	CHECK_EQ(w.info_rsp_len, 8 + 16);
	CHECK_EQ(get16(w.info_rsp, 2), 1);
	CHECK(zeros(w.info_rsp, 4, 8), "the info response's reserved bytes");
	CHECK_EQ(get32(w.info_rsp, 20), 16 * 16384); /* one descriptor for the 16 chunks */

	CHECK_EQ(rtrs_clt_peer_ext(c.sess), 0);
	CHECK_EQ(atomic_load(&srv.kernel_sessions), 1);
	CHECK_EQ(atomic_load(&srv.ext_sessions), 0);
	CHECK(io_roundtrip(&c, 0, 3), "IO");
	CHECK(fake_delivered(imm_to_nowhere, NULL) >= 1, "the write's response went to no memory");
	CHECK_EQ(fake_delivered(imm_to_memory, NULL), 0);
	CHECK_EQ(ext_msgs(), 0);
	CHECK_EQ(env_teardown(&c), 0);
}

/* The same client of ours, without the hook: the extension both ways. */
static void project_client_wire(void)
{
	struct clt c;

	if (!srv_up(false, NULL))
		return;
	clt_init(&c, "p", "a");
	CHECK_EQ(open_noted(&c, "a"), 0);
	CHECK_EQ(w.nr_req, 2);
	CHECK_EQ(w.req[0][44], RTRS_CONN_FIRST | RTRS_CONN_EXT | RTRS_CONN_FENCE | RTRS_CONN_AUTH);
	CHECK_EQ(w.rsp_len[0], 56);
	CHECK_EQ(get32(w.rsp[0], 16), RTRS_MSG_FENCE_F | RTRS_MSG_EXT_F);
	CHECK_EQ(get32(w.rsp[0], 32), RTRS_IMM_REGION); /* the server's imm target */
	CHECK(!zeros(w.info_req, 257, 272), "the client names its imm target");
	CHECK_EQ(rtrs_clt_peer_ext(c.sess), 1);
	CHECK_EQ(atomic_load(&srv.ext_sessions), 1);
	CHECK(io_roundtrip(&c, 0, 4), "IO");
	CHECK_EQ(fake_delivered(imm_to_nowhere, NULL), 0);
	CHECK_EQ(env_teardown(&c), 0);
}

static void srv_auth(struct rtrs_srv_opts *so)
{
	srv_write_keys(KEY_A);
	so->auth_keys_file = srv.keys_path;
}

static struct {
	uint8_t data[RTRS_CM_MSG_LEN];
	size_t len;
	bool seen;
} rej;

static void rej_posted(struct fake_ev *ev, void *arg)
{
	rej.len = ev->len;
	memcpy(rej.data, ev->data, MIN(ev->len, sizeof(rej.data)));
	rej.seen = true;
	fake_unclaim(ev);
}

/*
 * A server that requires authentication refuses a kernel client with the
 * kernel's reject: 56 bytes, errno -EACCES, no flags, the rest zero; never
 * an accept that carries the errno (a kernel client takes that for a
 * broken answer).
 */
static void kernel_client_auth_required(void)
{
	struct m reject = { .kind = FAKE_REJECT };
	struct fake_stats st0, st;
	struct clt c;

	if (!srv_up(false, srv_auth))
		return;
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "a");
	c.o.reconnect_delay_ms = 0;
	memset(&rej, 0, sizeof(rej));
	fake_get_stats(&st0);
	fake_on_post(match, &reject, rej_posted, NULL);
	CHECK_EQ(clt_open(&c), -EACCES);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(rej.seen, "a reject went out");
	CHECK_EQ(rej.len, 56);
	CHECK_EQ(get16(rej.data, 0), RTRS_MAGIC);
	CHECK_EQ(get16(rej.data, 4), (uint16_t)-EACCES);
	CHECK(zeros(rej.data, 6, 56), "no DNR, nothing else");
	fake_get_stats(&st);
	CHECK_EQ(st.accepts - st0.accepts, 0);
	/* the open's tries: no "do not retry" for a kernel */
	CHECK_EQ(st.rejects - st0.rejects, RTRS_OPEN_TRIES);
	CHECK(env_logged("kernel client"), "the server names what it refused");
	CHECK_EQ(ext_msgs(), 0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/* RKEY_RSP messages seen going to the client: (path host, chunk, key). */
static struct {
	unsigned n;
	char host[256][64];
	uint32_t id[256], key[256];
} rk;

static bool rkey_rsp_note(const struct fake_ev *ev, void *arg)
{
	const uint8_t *d = ev->data;

	(void)arg;
	if (ev->kind == FAKE_SEND && !ev->to_server && ev->with_imm && ev->len == 8 &&
	    get16(d, 0) == RTRS_MSG_RKEY_RSP && rk.n < ARRAY_SIZE(rk.id)) {
		snprintf(rk.host[rk.n], sizeof(rk.host[0]), "%s", ev->host);
		rk.id[rk.n] = get16(d, 2);
		rk.key[rk.n] = get32(d, 4);
		rk.n++;
	}
	return false;
}

/*
 * Our always_invalidate with a kernel client, the kernel's way: the
 * accept carries flag bit 1 alone, the info response a descriptor per
 * chunk with its own key, and every response comes as a message with
 * the immediate, holding the chunk's new key for that path (an RKEY_RSP
 * whose buf_id is the response's id); never a key handed out before. IO
 * goes on both paths of the session, each with its own keys.
 */
/* win: the server's fabric has memory windows, each taking 4 binds (replaced every 2 IOs). */
static void kernel_client_inval_(bool win)
{
	struct m rsp_msg = { .kind = FAKE_SEND, .dir = TO_CLT, .imm = 0,
			     .msg = MSG(RTRS_MSG_RKEY_RSP) };
	struct m rsp_write = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	struct rtrs_srv_opts so;
	struct fake_stats st;
	uint64_t rotations, chains, regs, binds;
	unsigned qd = 16, n;
	struct clt c;

	fake_set_windows(win ? 4 : 0);
	srv_opts(&so); /* always_invalidate on */
	CHECK_EQ(so.queue_depth, qd);
	CHECK_EQ(srv_start(&so), 0);
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "ab");
	c.o.mp_policy = RTRS_MP_POLICY_RR;
	CHECK_EQ(open_noted(&c, "b"), 0);
	CHECK_EQ(rtrs_clt_peer_ext(c.sess), 0);
	CHECK(env_logged("invalidates chunk keys the kernel's way"));
	for (unsigned i = 0; i < w.nr_rsp; i++) {
		CHECK_EQ(w.rsp_len[i], 56);
		CHECK_EQ(get32(w.rsp[i], 16), RTRS_MSG_NEW_RKEY_F);
		CHECK(zeros(w.rsp[i], 20, 56), "accept %u: the kernel's reserved bytes", i);
	}
	CHECK_EQ(w.info_rsp_len, 8 + 16 * qd);
	CHECK_EQ(get16(w.info_rsp, 2), qd);
	CHECK(zeros(w.info_rsp, 4, 8), "the kernel's reserved bytes");
	for (unsigned i = 0; i < qd && w.info_rsp_len == 8 + 16 * qd; i++) {
		const uint8_t *d = w.info_rsp + 8 + 16 * i;

		CHECK(get32(d, 8) != 0, "chunk %u has a key of its own", i);
		CHECK_EQ(get32(d, 12), so.max_chunk_size);
		for (unsigned j = 0; j < i; j++)
			CHECK(get32(d, 8) != get32(w.info_rsp + 8 + 16 * j, 8), "chunks %u, %u", i, j);
	}
	rotations = srv_stats().key_rotations;
	memset(&rk, 0, sizeof(rk));
	fake_get_stats(&st);
	chains = st.chains;
	regs = st.regs;
	binds = st.binds;
	fake_hold(rkey_rsp_note, NULL); /* notes, holds nothing */
	for (unsigned i = 0; i < 8; i++)
		CHECK(io_roundtrip(&c, i * LEN, (uint8_t)(40 + i)), "round trip %u", i);
	/* Each read's response, its data and its RKEY_RSP, went as one post. */
	fake_get_stats(&st);
	CHECK_EQ(st.chains - chains, 8);
	if (win) {
		/* Keys rotate by binds: no chunk is registered again (8: the client's reads). */
		CHECK_EQ(st.regs - regs, 8);
		CHECK(st.binds - binds >= 16, "%llu binds", (unsigned long long)(st.binds - binds));
		CHECK(st.windows > 1, "windows replaced");
	} else {
		CHECK(st.regs - regs >= 8 + 16, "chunks registered again");
		CHECK_EQ(st.binds, 0);
	}
	{
		/* RNBD's session messages go on the admin connection: answered the same way. */
		static struct io io;

		CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_ADMIN_CON, 9 * LEN, LEN, 60), 0);
		CHECK_EQ(io_wait(&io), 0);
		io_put(&io);
		CHECK(area_has(9 * LEN, LEN, 60), "a write on the admin connection");
	}
	fake_hold(NULL, NULL);
	n = fake_delivered(match, &rsp_msg);
	CHECK_EQ(n, 17); /* a write and a read per round trip, each answered so, and one more */
	CHECK_EQ(fake_delivered(match, &rsp_write), 0);
	CHECK_EQ(rk.n, 17);
	CHECK(srv_stats().key_rotations - rotations >= 17, "keys rotated");
	{
		unsigned on_a = 0, on_b = 0;

		for (unsigned i = 0; i < rk.n; i++) {
			on_a += !strcmp(rk.host[i], "a");
			on_b += !strcmp(rk.host[i], "b");
			CHECK(rk.id[i] < qd && rk.key[i] != 0);
			for (unsigned j = 0; j < i; j++)
				CHECK(rk.key[i] != rk.key[j], "keys %u and %u: a key again", i, j);
			for (unsigned j = 0; j < qd && w.info_rsp_len == 8 + 16 * qd; j++)
				CHECK(rk.key[i] != get32(w.info_rsp + 8 + 16 * j, 8),
				      "a key of the info response again");
		}
		CHECK(on_a > 0 && on_b > 0, "responses on both paths (%u, %u)", on_a, on_b);
	}
	CHECK_EQ(ext_msgs(), 0);
	CHECK_EQ(env_teardown(&c), 0);
	fake_set_windows(0);
}

static void kernel_client_inval(void)
{
	kernel_client_inval_(false);
}

static void kernel_client_inval_win(void)
{
	kernel_client_inval_(true);
}

static bool path_down(void *arg)
{
	struct clt *c = arg;

	return clt_path_is(c, 0, "closed") || clt_path_is(c, 0, "reconnecting");
}

/*
 * A kernel client that writes with a chunk's revoked key (one the info
 * response gave, replaced since): the write is refused, nothing of it
 * reaches the server's user or memory, and the path closes.
 */
static void kernel_client_inval_stale_(bool win)
{
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct rtrs_srv_opts so;
	static struct io io;
	bool stale = false;
	unsigned qd = 16;
	struct clt c;

	fake_set_windows(win ? 4 : 0);
	srv_opts(&so);
	CHECK_EQ(srv_start(&so), 0);
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "a");
	c.o.reconnect_delay_ms = 0;
	c.o.max_reconnect_attempts = 0;
	c.o.fast_io_fail_ms = 0; /* the refused write fails at once, not after waiting for a path */
	CHECK_EQ(open_noted(&c, "a"), 0);
	CHECK_EQ(w.info_rsp_len, 8 + 16 * qd);
	/* Until a request goes to a chunk used before: put its first key back. */
	for (unsigned i = 0; i < 2 * qd && !stale; i++) {
		struct fake_ev *ev;
		uint32_t id, first;
		unsigned type;
		uint32_t payload;

		fake_hold(match, &req);
		CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 3 * LEN, LEN, 77), 0);
		ev = fake_wait_ev(match, &req, "a request");
		fake_hold(NULL, NULL);
		if (!ev)
			break;
		rtrs_from_imm(ev->imm, &type, &payload);
		id = rtrs_io_req_chunk(qd, payload);
		first = get32(w.info_rsp + 8 + 16 * (id % qd), 8);
		if (ev->rma_cnt >= 1 && ev->rma[ev->rma_cnt - 1].key != first) {
			ev->rma[ev->rma_cnt - 1].key = first; /* revoked at the chunk's first use */
			stale = true;
		}
		CHECK_EQ(fake_deliver(ev), 0);
		if (stale)
			break;
		CHECK_EQ(io_wait(&io), 0);
		io_put(&io);
		CHECK(area_has(3 * LEN, LEN, 77));
		memset(srv.area + 3 * LEN, 0, LEN);
	}
	CHECK(stale, "a request went to a chunk used before");
	if (stale) {
		CHECK(io_wait(&io) < 0, "the write with the revoked key fails");
		io_put(&io);
		CHECK(!area_has(3 * LEN, LEN, 77), "and never reached the server's memory");
		/* The request completes before the path's state changes: wait for it. */
		CHECK_EQ(fake_wait(path_down, &c, "the path to close"), 0);
	}
	CHECK_EQ(env_teardown(&c), 0);
	fake_set_windows(0);
}

static void kernel_client_inval_stale(void)
{
	kernel_client_inval_stale_(false);
}

/*
 * The same with windows: the info response's key dies with the chunk's
 * region at its first rotation, after which the chunk's keys are a window's.
 */
static void kernel_client_inval_stale_win(void)
{
	kernel_client_inval_stale_(true);
}

/* Without messages with immediates (iWARP) the kernel's scheme cannot be played: refused. */
static void kernel_client_inval_refused(void)
{
	struct rtrs_srv_opts so;
	struct clt c;

	fake_set_send_imm(false);
	srv_opts(&so); /* always_invalidate on */
	CHECK_EQ(srv_start(&so), 0);
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "a");
	c.o.reconnect_delay_ms = 0;
	CHECK_EQ(clt_open(&c), -EOPNOTSUPP);
	CHECK(env_logged("always_invalidate toward it needs messages with immediates"));
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/*
 * A refusal after the connections are up is no verdict for a kernel
 * client (it would read an info response without descriptors): the path
 * closes, as the kernel's server closes it.
 */
static void kernel_client_name_taken(void)
{
	struct m info_rsp = { .kind = FAKE_SEND, .dir = TO_CLT, .msg = MSG(RTRS_MSG_INFO_RSP) };
	struct clt c0, c1;

	if (!srv_up(false, NULL))
		return;
	clt_init(&c0, "k", "a");
	CHECK_EQ(clt_open(&c0), 0);
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c1, "k", "a");
	c1.o.reconnect_delay_ms = 0;
	CHECK(clt_open(&c1) < 0, "the second session of the name is refused");
	CHECK(env_logged("session name k is already in use"));
	CHECK_EQ(fake_delivered(match, &info_rsp), 1); /* c0's: no verdict for c1 */
	CHECK(io_roundtrip(&c0, 0, 21), "the first session goes on");
	CHECK_EQ(env_teardown(&c0), 0);
}

/* A session's paths speak one protocol: a kernel path for a session of ours is refused. */
static void ext_mismatch(void)
{
	struct rtrs_path_addr b = { .dst = NULL };
	char dst[64];
	unsigned idx;
	struct clt c;

	if (!srv_up(false, NULL))
		return;
	clt_init(&c, "s", "a");
	CHECK_EQ(clt_open(&c), 0);
	atomic_store(&rtrs_test_kernel_clt, true);
	snprintf(dst, sizeof(dst), "b:%d", srv.port);
	b.dst = dst;
	CHECK_EQ(rtrs_clt_add_path(c.sess, &b, &idx), -EINVAL);
	CHECK(env_logged("its session's other paths speak another protocol"));
	CHECK(io_roundtrip(&c, 0, 22), "the session goes on");
	CHECK_EQ(env_teardown(&c), 0);
}

/* ---- a kernel server ----------------------------------------------------------------------- */

static bool failed_over(void *arg)
{
	(void)arg;
	return env_logged("1 requests fail over to the other paths unfenced");
}

static bool path_back(void *arg)
{
	return atomic_load(&((struct clt *)arg)->path_up) >= 1; /* path_ev: after the open only */
}

/* Notes every event as it is posted (wire_note), for as long as it is set. */
static void note_post(struct fake_ev *ev, void *arg)
{
	wire_note(ev);
	fake_on_post(fake_any, NULL, note_post, arg);
	fake_unclaim(ev);
}

/*
 * A session name with a '.' (a host name), which a server of ours takes:
 * a kernel server would refuse the info request with EINVAL and say
 * nothing. The client stops after connection 0's answer, final, and says
 * why; the server never sees an info request.
 */
static void kernel_server_dotted_name(void)
{
	struct fake_stats st0, st;
	struct clt c;

	if (!srv_up(true, NULL))
		return;
	fake_get_stats(&st0);
	clt_init(&c, "host1.example.com", "a");
	c.o.reconnect_delay_ms = 0;
	memset(&w, 0, sizeof(w));
	fake_on_post(fake_any, NULL, note_post, NULL);
	CHECK_EQ(clt_open(&c), -EINVAL);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(env_logged("refuses a session name with a '.'"), "the client says why");
	fake_get_stats(&st);
	CHECK_EQ(st.accepts - st0.accepts, 1);
	CHECK_EQ(w.nr_req, 1); /* the events were noted: connection 0's request */
	CHECK_EQ(w.info_req_len, 0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/*
 * A client of ours meets a kernel server: it falls back. Its info
 * request is the kernel's, it sends no fence (a failed path's request
 * goes to another path at once, unfenced) and no authentication message, its
 * heartbeats and the server's answers go to no memory, and a reconnect
 * that carried first_conn counts as a server session that may be new
 * (the kernel's server does not say).
 */
static void kernel_server_fallback(void)
{
	struct m rsp = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_IO_RSP_IMM) };
	struct m hb = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_HB_MSG_IMM) };
	static struct io io;
	bool on_a = false;
	struct clt c;

	if (!srv_up(true, NULL))
		return;
	clt_init(&c, "f", "ab");
	c.o.hb_interval_ms = HB_MS;
	c.o.mp_policy = RTRS_MP_POLICY_RR;
	CHECK_EQ(open_noted(&c, "b"), 0);
	CHECK_EQ(rtrs_clt_peer_ext(c.sess), 0);
	CHECK_EQ(atomic_load(&srv.kernel_sessions), 1);
	CHECK(w.nr_req == 4 && (w.req[0][44] & RTRS_CONN_EXT), "the client offered the extension");
	CHECK_EQ(w.info_req_len, 272);
	CHECK(zeros(w.info_req, 257, 272), "the kernel's info request (path b's)");
	CHECK_EQ(attrs_sessions(&c), 1);
	CHECK(io_roundtrip(&c, 0, 5) && io_roundtrip(&c, LEN, 6), "IO on both paths");
	CHECK_EQ(fake_advance(HB_MS), 0);
	CHECK(fake_delivered(match, &hb) >= 2, "heartbeats on both paths");
	CHECK(clt_path_is(&c, 0, "connected") && clt_path_is(&c, 1, "connected"));

	/*
	 * Path a fails with a request on it: no fence; the request goes to
	 * path b at once, as the kernel's client sends it again.
	 */
	fake_hold(match, &rsp);
	for (int i = 0; i < 4 && !on_a; i++) {
		struct fake_ev *ev;

		CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 2 * LEN, LEN, 7), 0);
		ev = fake_wait_ev(match, &rsp, "a response");
		if (!ev)
			break;
		on_a = !strcmp(ev->host, "a");
		if (on_a) {
			fake_unclaim(ev); /* held: lost with the connection */
		} else {
			CHECK_EQ(fake_deliver(ev), 0);
			CHECK_EQ(io_wait(&io), 0);
			io_put(&io);
		}
	}
	CHECK(on_a, "a request went on path a");
	CHECK(fake_fail("f", "a", -1, -ECONNRESET, -ECONNRESET) >= 1);
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_wait(failed_over, NULL, "the request to fail over"), 0);
	CHECK_EQ(fake_advance(50), 0); /* the session's wait timer */
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK(area_has(2 * LEN, LEN, 7));
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(path_back, &c, "path a to come back"), 0);
	/* Path b stayed up, yet the server may have set the session up anew. */
	CHECK_EQ(attrs_sessions(&c), 2);
	CHECK(io_roundtrip(&c, 3 * LEN, 8), "IO after the reconnect");
	CHECK_EQ(ext_msgs(), 0);
	CHECK_EQ(fake_delivered(imm_to_memory, NULL), 0);
	CHECK(fake_delivered(imm_to_nowhere, NULL) >= 4, "heartbeats, acks, responses to no memory");
	CHECK_EQ(env_teardown(&c), 0);
}

/*
 * A client with a secret facing a kernel server: refused at once with
 * -EPROTONOSUPPORT and the path named, one connection request, not one
 * authentication message; the open does not hang or retry.
 */
static void kernel_server_secret_refused(void)
{
	struct clt c;

	if (!srv_up(true, NULL))
		return;
	clt_init(&c, "f", "a");
	c.o.auth_secret = KEY_A;
	CHECK_EQ(clt_open(&c), -EPROTONOSUPPORT);
	CHECK(env_logged("f/a:"), "the path is named");
	CHECK(env_logged("the server does not offer authentication"));
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(ext_msgs(), 0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/* A read request on its way to the server: the user header (4 bytes), then the read header. */
struct read_hdr {
	uint16_t flags, sg_cnt;
	uint32_t len0;
	bool seen;
};

static void read_hdr_of(const struct fake_ev *ev, struct read_hdr *h)
{
	const uint8_t *d = ev->data;

	h->seen = ev->len >= 4 + 8 + 16 && get16(d, 4) == RTRS_MSG_READ;
	if (!h->seen)
		return;
	h->flags = get16(d, 4 + 4);
	h->sg_cnt = get16(d, 4 + 6);
	h->len0 = get32(d, 4 + 8 + 12);
}

/* Reads 3 vectors (1000, 1500, 1596 bytes) at 5 x LEN; the header the request carried. */
static struct read_hdr read_three(struct clt *c)
{
	static uint8_t v0[1000], v1[1500], v2[1596];
	struct m req = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_IO_REQ_IMM) };
	struct iovec d[3] = { { v0, sizeof(v0) }, { v1, sizeof(v1) }, { v2, sizeof(v2) } };
	static struct io io;
	struct read_hdr h = { 0 };
	uint8_t want[LEN];
	struct fake_ev *ev;

	CHECK_EQ(io_sync(c, RTRS_WRITE, 5 * LEN, LEN, 77), 0);
	pattern(want, LEN, 77);
	memset(v0, 0, sizeof(v0));
	memset(v1, 0, sizeof(v1));
	memset(v2, 0, sizeof(v2));
	fake_hold(match, &req);
	CHECK_EQ(io_startv(&io, c, RTRS_READ, RTRS_IO_CON, 5 * LEN, d, 3), 0);
	ev = fake_wait_ev(match, &req, "the read request");
	if (ev) {
		read_hdr_of(ev, &h);
		CHECK_EQ(fake_deliver(ev), 0);
	}
	fake_hold(NULL, NULL);
	CHECK_EQ(io_wait(&io), 0);
	CHECK_EQ(atomic_load(&io.calls), 1);
	io_put(&io);
	CHECK(!memcmp(v0, want, sizeof(v0)) && !memcmp(v1, want + 1000, sizeof(v1)) &&
	      !memcmp(v2, want + 2500, sizeof(v2)), "the three vectors hold what was written");
	return h;
}

/* Reads three vectors twice (the same permit's bounce buffer again) from a kernel server or ours. */
static void read_three_twice(bool kernel, unsigned sg_cnt, uint32_t len0)
{
	struct read_hdr h;
	struct clt c;

	if (!srv_up(kernel, NULL))
		return;
	clt_init(&c, "f", "a");
	CHECK_EQ(clt_open(&c), 0);
	for (int i = 0; i < 2; i++) {
		h = read_three(&c);
		CHECK(h.seen, "the read header was seen");
		CHECK_EQ(h.sg_cnt, sg_cnt);
		CHECK_EQ(h.flags, 0);
		CHECK_EQ(h.len0, len0);
	}
	CHECK_EQ(env_teardown(&c), 0);
}

/*
 * A kernel server takes one descriptor per read (it fails the IO and
 * closes the path otherwise) and no NEED_INVAL: the three vectors go
 * through the permit's bounce buffer and come out equal.
 */
static void kernel_server_read_one_desc(void)
{
	read_three_twice(true, 1, LEN);
}

/* Between peers of ours a read keeps one descriptor per vector. */
static void project_read_descs(void)
{
	read_three_twice(false, 3, 1000);
}

/* ---- a kernel client's failover: the request again, on another path ------------------------- */

static bool reqs_on_b(void *arg)
{
	struct m req_b = { .kind = FAKE_WRITE, .dir = TO_SRV, .host = "b",
			   .imm = IMM(RTRS_IO_REQ_IMM) };

	return fake_delivered(match, &req_b) > *(unsigned *)arg;
}

static bool deferred_at_least(void *arg)
{
	return srv_held() >= (int)(intptr_t)arg;
}

/* The write completed, or its unbind on path a is held (and claimed: here). */
struct unbind_wait {
	struct io *io;
	struct fake_ev *ev;
};

static bool io_called_or_unbind_a(void *arg)
{
	struct m done_a = { .kind = FAKE_DONE, .dir = TO_SRV, .host = "a" };
	struct unbind_wait *uw = arg;

	if (!uw->ev)
		uw->ev = fake_find(match, &done_a);
	return uw->ev || atomic_load(&uw->io->calls) > 0;
}

static bool logged_waits(void *arg)
{
	(void)arg;
	return env_logged("waits for it");
}

static bool srv_heard_a_down(void *arg)
{
	struct m down_a = { .kind = FAKE_DOWN, .dir = TO_SRV, .host = "a" };

	(void)arg;
	return fake_delivered(match, &down_a) > 0;
}

/* qd writes at once: every chunk of the session carries one. */
static void all_chunks(struct clt *c, unsigned qd)
{
	static struct io io[32];
	unsigned started = 0;

	for (unsigned i = 0; i < qd && i < ARRAY_SIZE(io); i++) {
		int rc = io_start(&io[i], c, RTRS_WRITE, RTRS_IO_CON, (10 + i % 6) * LEN, LEN,
				  (uint8_t)(90 + i % 6));

		CHECK(rc == 0, "request %u: %s", i, strerror(-rc));
		if (rc)
			break;
		started++;
	}
	CHECK_EQ(started, qd);
	for (unsigned i = 0; i < started; i++) {
		CHECK_EQ(io_wait(&io[i]), 0);
		io_put(&io[i]);
	}
	for (unsigned i = 0; i < 6 && i < qd; i++)
		CHECK(area_has((10 + i) * LEN, LEN, (uint8_t)(90 + i)));
}

/*
 * A kernel client's session k over paths a and b (round robin) with a write
 * on path a that the server's user holds: that op in *op, how many the user
 * was given in *held. false (and a check failed) if none went on a.
 */
static bool kernel_write_held_on_a(struct clt *c, struct io *io, struct rtrs_srv_op **op,
				   int *held)
{
	struct m req_a = { .kind = FAKE_WRITE, .dir = TO_SRV, .host = "a",
			   .imm = IMM(RTRS_IO_REQ_IMM) };
	bool on_a = false;

	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(c, "k", "ab");
	c->o.mp_policy = RTRS_MP_POLICY_RR;
	CHECK_EQ(clt_open(c), 0);
	CHECK_EQ(rtrs_clt_peer_ext(c->sess), 0);
	atomic_store(&srv.defer, true);
	for (int i = 0; i < 4 && !on_a; i++) {
		unsigned na = fake_delivered(match, &req_a);

		CHECK_EQ(io_start(io, c, RTRS_WRITE, RTRS_IO_CON, 2 * LEN, LEN, 7), 0);
		CHECK_EQ(fake_wait(deferred_at_least, (void *)(intptr_t)(i + 1), "the user to hold it"),
			 0);
		*op = atomic_load(&srv.deferred[i]);
		*held = i + 1;
		on_a = fake_delivered(match, &req_a) > na;
		if (!on_a) {
			CHECK_EQ(rtrs_srv_resp_rdma(*op, 0), 0);
			CHECK_EQ(io_wait(io), 0);
			io_put(io);
		}
	}
	CHECK(on_a, "a request went on path a");
	return on_a;
}

/*
 * A kernel client's path fails while the server's user still holds one
 * of its requests, and before the server hears of it: the client sends the
 * request again on path b, for the same chunk. The kernel's server keeps
 * an op per path and takes it; ours lets it wait for the chunk (instead
 * of failing path b for a chunk in use), then serves it. Path b stays up
 * and every chunk is usable after.
 */
static void kernel_client_failover_busy(void)
{
	struct m down_a = { .kind = FAKE_DOWN, .dir = TO_SRV, .host = "a" };
	struct rtrs_srv_op *op = NULL;
	static struct io io;
	unsigned qd = 16, nb;
	int held = 0;
	struct clt c;
	int rc;

	if (!srv_up(false, NULL))
		return;
	/* A request on path a that the server's user holds. */
	if (!kernel_write_held_on_a(&c, &io, &op, &held))
		goto out;
	memset(srv.area + 2 * LEN, 0, LEN);
	/* Path a ends; the server will hear of it only later. */
	fake_hold(match, &down_a);
	nb = fake_delivered(match, &(struct m){ .kind = FAKE_WRITE, .dir = TO_SRV, .host = "b",
						 .imm = IMM(RTRS_IO_REQ_IMM) });
	CHECK(fake_fail("k", "a", -1, -ECONNRESET, -ECONNRESET) >= 1);
	CHECK_EQ(fake_wait(failed_over, NULL, "the request to fail over"), 0);
	CHECK_EQ(fake_advance(50), 0); /* the session's wait timer */
	CHECK_EQ(fake_wait(reqs_on_b, &nb, "the request again on path b"), 0);
	CHECK_EQ(fake_wait(logged_waits, NULL, "the request to wait for its chunk"), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 1, "connected"), "path b is up");
	CHECK_EQ(atomic_load(&srv.nr_deferred), held); /* the user has not seen it again */
	CHECK_EQ(atomic_load(&io.calls), 0);
	/* The user answers the first try: its response goes nowhere; the second try goes on. */
	atomic_store(&srv.defer, false);
	rc = rtrs_srv_resp_rdma(op, 0);
	CHECK(rc == 0 || rc == -ENOTCONN, "late answer: %s", strerror(-rc));
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK(area_has(2 * LEN, LEN, 7), "the write landed");
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 1, "connected"), "path b is still up");
	all_chunks(&c, qd);
	CHECK(!env_logged("still in use"), "no chunk in use twice");
out:
	CHECK_EQ(env_teardown(&c), 0);
}

/*
 * A kernel client's request that waits for its chunk (op_defer) while the
 * path it came on closes: op_defer has found the path connected and not yet
 * recorded the request when the path's stop forgets the requests waiting
 * on it (srv_defers_cancel). The stop must not miss it: a request recorded
 * after the stop looked would be handed to the connection the stop is
 * destroying once the chunk's op ends (a NULL fabric connection, or a
 * freed one). The hooks hold op_defer at that point until the stop is done
 * with its waiting requests, or 300 ms; the stop takes the session's
 * defer_lock for every op, so it waits for op_defer instead.
 */
static pthread_mutex_t race_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t race_cond; /* on CLOCK_MONOTONIC: race_cond_init */
static bool race_in_window, race_cancelled;

static void race_cond_init(void)
{
	cond_init_mono(&race_cond);
}

static void race_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, race_cond_init);
}

static void race_wait(bool *flag, unsigned ms)
{
	struct timespec dl;

	race_init();
	dl = deadline_ms(ms);
	pthread_mutex_lock(&race_lock);
	while (!*flag && pthread_cond_timedwait(&race_cond, &race_lock, &dl) == 0)
		;
	pthread_mutex_unlock(&race_lock);
}

static void race_set(bool *flag)
{
	race_init();
	pthread_mutex_lock(&race_lock);
	*flag = true;
	pthread_cond_broadcast(&race_cond);
	pthread_mutex_unlock(&race_lock);
}

/* op_defer, defer_lock held: in the window until the stop has looked (or 300 ms). */
static void race_defer_checked(void)
{
	race_set(&race_in_window);
	race_wait(&race_cancelled, 300);
}

static void race_defers_cancelled(void)
{
	race_set(&race_cancelled);
}

/* What the scenario below holds: path a's downs, and path b's connection 0 going down. */
static bool down_a_or_b0(const struct fake_ev *ev, void *arg)
{
	struct m down_a = { .kind = FAKE_DOWN, .dir = TO_SRV, .host = "a" };
	struct m down_b0 = { .kind = FAKE_DOWN, .dir = TO_SRV, .host = "b", .cid = CID(0) };

	(void)arg;
	return match(ev, &down_a) || match(ev, &down_b0);
}

static void *advance_50(void *arg)
{
	(void)arg;
	CHECK_EQ(fake_advance(50), 0);
	return NULL;
}

static void kernel_client_defer_races_close(void)
{
	struct m down_b0 = { .kind = FAKE_DOWN, .dir = TO_SRV, .host = "b", .cid = CID(0) };
	struct rtrs_srv_op *op = NULL;
	struct fake_ev *ev;
	static struct io io;
	int held = 0, rc;
	struct clt c;

	if (!srv_up(false, NULL))
		return;
	if (!kernel_write_held_on_a(&c, &io, &op, &held))
		goto out;
	race_in_window = race_cancelled = false;
	atomic_store(&rtrs_test_srv_defer_checked, race_defer_checked);
	atomic_store(&rtrs_test_srv_defers_cancelled, race_defers_cancelled);
	/* Path a ends, unknown to the server: the request goes again on path b. */
	fake_hold(down_a_or_b0, NULL);
	CHECK(fake_fail("k", "a", -1, -ECONNRESET, -ECONNRESET) >= 1);
	CHECK_EQ(fake_wait(failed_over, NULL, "the request to fail over"), 0);
	/*
	 * The session's wait timer sends the request on b. fake_advance
	 * settles, which waits for op_defer's callback: on a thread of its own.
	 */
	pthread_t adv;
	bool adv_started = !pthread_create(&adv, NULL, advance_50, NULL);

	CHECK(adv_started);
	race_wait(&race_in_window, 5000);
	CHECK(race_in_window, "the request on path b reached op_defer");
	/*
	 * Inside the window (op_defer holds on the pump's thread): path b's
	 * connection 0 goes down at the server's end, delivered from here, and
	 * the server stops path b.
	 */
	CHECK(fake_fail("k", "b", 0, 0, -ECONNRESET) >= 1);
	ev = fake_wait_ev(match, &down_b0, "path b's connection 0 going down");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	race_wait(&race_cancelled, 5000);
	CHECK(race_cancelled, "path b's stop forgot its waiting requests");
	atomic_store(&rtrs_test_srv_defer_checked, NULL);
	atomic_store(&rtrs_test_srv_defers_cancelled, NULL);
	if (adv_started)
		pthread_join(adv, NULL);
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_settle(), 0);
	/* The first try ends: nothing waits for its chunk any more. */
	atomic_store(&srv.defer, false);
	rc = rtrs_srv_resp_rdma(op, 0);
	CHECK(rc == 0 || rc == -ENOTCONN, "late answer: %s", strerror(-rc));
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(atomic_load(&srv.nr_deferred), held); /* the user never saw the second try */
	for (int i = 0; i < 4 && !atomic_load(&io.calls); i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(atomic_load(&io.calls), 1);
	io_put(&io);
	all_chunks(&c, 16);
out:
	atomic_store(&rtrs_test_srv_defer_checked, NULL);
	atomic_store(&rtrs_test_srv_defers_cancelled, NULL);
	CHECK_EQ(env_teardown(&c), 0);
}

/*
 * The same with always_invalidate and windows, the request's unbind on
 * path a still on its way when path a closes: the server drops that
 * request without handing it to its user (srv_ops_abandon), and its second
 * try, on path b, waits for the chunk and is served once.
 */
static void kernel_client_inval_cut_unbinding(void)
{
	struct m done_a = { .kind = FAKE_DONE, .dir = TO_SRV, .host = "a" };
	struct rtrs_srv_opts so;
	struct unbind_wait uw = { .io = NULL };
	struct fake_ev *ev = NULL;
	static struct io io;
	unsigned qd = 16;
	int evs = 0;
	struct clt c;

	fake_set_windows(4);
	srv_opts(&so); /* always_invalidate on */
	CHECK_EQ(srv_start(&so), 0);
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(&c, "k", "ab");
	c.o.mp_policy = RTRS_MP_POLICY_RR;
	CHECK_EQ(clt_open(&c), 0);
	/* Every chunk once on each path: their keys are windows now. */
	for (unsigned i = 0; i < 4; i++)
		all_chunks(&c, qd);
	/* A write whose unbind on path a is held. */
	for (int i = 0; i < 4 && !ev; i++) {
		fake_hold(match, &done_a);
		evs = atomic_load(&srv.rdma_evs);
		CHECK_EQ(io_start(&io, &c, RTRS_WRITE, RTRS_IO_CON, 2 * LEN, LEN, 8), 0);
		uw = (struct unbind_wait){ .io = &io };
		CHECK_EQ(fake_wait(io_called_or_unbind_a, &uw, "the write or its unbind on a"), 0);
		ev = uw.ev;
		if (!ev) {
			fake_hold(NULL, NULL);
			CHECK_EQ(io_wait(&io), 0);
			io_put(&io);
		}
	}
	CHECK(ev != NULL, "an unbind on path a held");
	if (!ev)
		goto out;
	CHECK_EQ(atomic_load(&srv.rdma_evs), evs); /* the user waits for the unbind */
	memset(srv.area + 2 * LEN, 0, LEN);
	CHECK(fake_fail("k", "a", -1, -ECONNRESET, -ECONNRESET) >= 1);
	CHECK_EQ(fake_wait(srv_heard_a_down, NULL, "the server to hear of path a's end"), 0);
	CHECK_EQ(fake_settle(), 0); /* ... and close it */
	CHECK_EQ(fake_deliver(ev), -ENOTCONN); /* the unbind's completion never comes */
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_wait(failed_over, NULL, "the request to fail over"), 0);
	CHECK_EQ(fake_advance(50), 0);
	CHECK_EQ(io_wait(&io), 0);
	io_put(&io);
	CHECK(area_has(2 * LEN, LEN, 8), "the write landed");
	CHECK_EQ(atomic_load(&srv.rdma_evs), evs + 1); /* once: the first try was dropped */
	CHECK(clt_path_is(&c, 1, "connected"), "path b is still up");
	all_chunks(&c, qd);
	CHECK(!env_logged("still in use"), "no chunk in use twice");
out:
	fake_hold(NULL, NULL);
	CHECK_EQ(env_teardown(&c), 0);
	fake_set_windows(0);
}

/* ---- rules for everyone ---------------------------------------------------------------------- */

static bool connreq(const struct fake_ev *ev, void *arg)
{
	return ev->kind == FAKE_CONNREQ;
}

/* Delivers n held connection requests, noting them. */
static void pass_connreqs(unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct fake_ev *ev = fake_wait_ev(connreq, NULL, "a connection request");

		if (!ev)
			return;
		wire_note(ev);
		CHECK_EQ(fake_deliver(ev), 0);
	}
}

/*
 * As the kernel: recon_cnt is counted before every connect (1 on the
 * first), and first_conn goes with the session's first path and with a
 * path that got through once, not with a path new to a known session.
 */
static void first_conn_recon_cnt(void)
{
	struct clt c;

	if (!srv_up(false, NULL))
		return;
	clt_init(&c, "s", "ab");
	memset(&w, 0, sizeof(w));
	fake_hold(connreq, NULL);
	clt_open_async(&c);
	pass_connreqs(4);
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), 0);
	CHECK_EQ(w.nr_req, 4);
	for (unsigned i = 0; i < 4; i++) {
		bool a = !strcmp(w.req_host[i], "a");

		CHECK_EQ(get16(w.req[i], 10), 1);
		CHECK_EQ(!!(w.req[i][44] & RTRS_CONN_FIRST), a);
	}
	/* Path b reconnects: it got through once, so it may set the session up again. */
	fake_hold(connreq, NULL);
	CHECK(fake_fail("s", "b", -1, -ECONNRESET, -ECONNRESET) >= 1);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	pass_connreqs(2);
	fake_hold(NULL, NULL);
	CHECK_EQ(fake_wait(path_back, &c, "path b to come back"), 0);
	CHECK_EQ(w.nr_req, 6);
	for (unsigned i = 4; i < 6; i++) {
		CHECK(!strcmp(w.req_host[i], "b"));
		CHECK_EQ(get16(w.req[i], 10), 2);
		CHECK(w.req[i][44] & RTRS_CONN_FIRST, "request %u carries first_conn", i);
	}
	/* Our server names its session: the same one, no news. */
	CHECK_EQ(attrs_sessions(&c), 1);
	CHECK(io_roundtrip(&c, 0, 9), "IO");
	CHECK_EQ(env_teardown(&c), 0);
}

static bool srv_session_gone(void *arg)
{
	return srv_stats().sessions == 0;
}

/*
 * A path added after every other was removed carries first_conn, as the
 * kernel's (paths_num == 0): the server dropped the session with its last
 * path, and the new path sets it up again.
 */
static void first_conn_after_removal(void)
{
	struct rtrs_path_addr b = { .dst = NULL };
	char dst[64];
	unsigned idx = 99;
	struct clt c;

	if (!srv_up(false, NULL))
		return;
	clt_init(&c, "s", "a");
	CHECK_EQ(clt_open(&c), 0);
	CHECK_EQ(rtrs_clt_remove_path(c.sess, 0), 0);
	CHECK_EQ(fake_wait(srv_session_gone, NULL, "the server to drop the session"), 0);
	snprintf(dst, sizeof(dst), "b:%d", srv.port);
	b.dst = dst;
	/* Without first_conn the server, which knows no such session, refuses it (-ENXIO). */
	CHECK_EQ(rtrs_clt_add_path(c.sess, &b, &idx), 0);
	CHECK_EQ(idx, 1);
	CHECK(io_roundtrip(&c, 0, 10), "IO on the new path");
	CHECK(env_logged("session s closed"), "the old session was gone");
	CHECK_EQ(env_teardown(&c), 0);
}

/* The kernel's heartbeat: every 5 s, failing after 5 missed. */
static void kernel_beats(struct rtrs_srv_opts *so)
{
	so->hb_interval_ms = 5000;
	so->hb_missed_max = 5;
}

/*
 * A kernel server beats every 5 s (and answers each of ours): a client
 * with our defaults (1 s, 3 missed) keeps the path for 30 s, and so does
 * the server. Our side polices its own beats' answers, not the peer's pace.
 */
static void hb_kernel_server_pace(void)
{
	struct m hb_srv = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_HB_MSG_IMM) };
	struct m ack_srv = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_HB_ACK_IMM) };
	struct clt c;

	if (!srv_up(true, kernel_beats))
		return;
	clt_init(&c, "f", "a");
	c.o.hb_interval_ms = RTRS_DEFAULT_HB_INTERVAL_MS;
	c.o.hb_missed_max = RTRS_DEFAULT_HB_MISSED_MAX;
	CHECK_EQ(clt_open(&c), 0);
	for (int i = 0; i < 30; i++)
		CHECK_EQ(fake_advance(1000), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(atomic_load(&srv.link_down), 0);
	CHECK(fake_delivered(match, &hb_srv) >= 5, "the server beat every 5 s");
	CHECK(fake_delivered(match, &ack_srv) >= 25, "and answered ours");
	CHECK(!env_logged("no heartbeat"), "nobody declared dead");
	CHECK_EQ(env_teardown(&c), 0);
}

static void our_beats(struct rtrs_srv_opts *so)
{
	so->hb_interval_ms = RTRS_DEFAULT_HB_INTERVAL_MS;
	so->hb_missed_max = RTRS_DEFAULT_HB_MISSED_MAX;
}

/* Our server (1 s, 3 missed) and an open kernel client beating as the kernel does (5 s, 5). */
static bool kernel_beats_up(struct clt *c)
{
	if (!srv_up(false, our_beats))
		return false;
	atomic_store(&rtrs_test_kernel_clt, true);
	clt_init(c, "k", "a");
	c->o.hb_interval_ms = 5000;
	c->o.hb_missed_max = 5;
	CHECK_EQ(clt_open(c), 0);
	return true;
}

/* The other way: a kernel client beats every 5 s; our server (1 s, 3 missed) keeps it. */
static void hb_kernel_client_pace(void)
{
	struct m hb_clt = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_HB_MSG_IMM) };
	struct clt c;

	if (!kernel_beats_up(&c))
		return;
	for (int i = 0; i < 30; i++)
		CHECK_EQ(fake_advance(1000), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(atomic_load(&srv.link_down), 0);
	CHECK(fake_delivered(match, &hb_clt) >= 5, "the client beat every 5 s");
	CHECK(!env_logged("no heartbeat"), "nobody declared dead");
	CHECK_EQ(fake_delivered(imm_to_memory, NULL), 0);
	CHECK_EQ(env_teardown(&c), 0);
}

static bool srv_heard_down(void *arg)
{
	return atomic_load(&srv.link_down) > 0;
}

/*
 * A kernel client whose host stalls (a busy VM): nothing of it reaches the
 * server, its answers to our beats included. Our server (1 s, 3 missed)
 * allows it the silence a kernel server would (5 x 5 s): the path stays
 * through 20 s of it, and goes once the silence passes 25 s (with our own
 * budget, 3 s, it went at once).
 */
static void hb_kernel_client_stalled(void)
{
	struct m to_srv = { .dir = TO_SRV };
	struct clt c;

	if (!kernel_beats_up(&c))
		return;
	fake_hold(match, &to_srv);
	for (int i = 0; i < 20; i++)
		CHECK_EQ(fake_advance(1000), 0);
	CHECK_EQ(atomic_load(&srv.link_down), 0);
	CHECK(!env_logged("no heartbeat"), "a stalled kernel client is kept for 20 s");
	for (int i = 0; i < 10 && !atomic_load(&srv.link_down); i++)
		CHECK_EQ(fake_advance(1000), 0);
	CHECK_EQ(fake_wait(srv_heard_down, NULL, "the server to give the path up"), 0);
	CHECK(env_logged("no heartbeat from the client for 25000 ms"), "given up after 25 s");
	fake_hold(NULL, NULL);
	CHECK_EQ(env_teardown(&c), 0);
}

/*
 * A kernel client posts its receive buffers when it reads the info
 * response: the server sends it no beat until it has spoken since (an
 * early beat met an RNR NAK on a loaded machine, and soft-RoCE lost the
 * response queued behind it). Here the client first beats at 5 s: no beat
 * to it before, ours every second after.
 */
static void hb_after_client_speaks(void)
{
	struct m hb_srv = { .kind = FAKE_WRITE, .dir = TO_CLT, .imm = IMM(RTRS_HB_MSG_IMM) };
	struct m hb_clt = { .kind = FAKE_WRITE, .dir = TO_SRV, .imm = IMM(RTRS_HB_MSG_IMM) };
	struct clt c;

	if (!kernel_beats_up(&c))
		return;
	fake_delivered_reset();
	for (int i = 0; i < 4; i++)
		CHECK_EQ(fake_advance(1000), 0);
	CHECK_EQ(fake_delivered(match, &hb_clt), 0);
	CHECK_EQ(fake_delivered(match, &hb_srv), 0); /* silent since the info response */
	for (int i = 0; i < 4; i++)
		CHECK_EQ(fake_advance(1000), 0);
	CHECK(fake_delivered(match, &hb_clt) >= 1, "the client beat at 5 s");
	CHECK(fake_delivered(match, &hb_srv) >= 2, "then the server beat every second: %u",
	      fake_delivered(match, &hb_srv));
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(atomic_load(&srv.link_down), 0);
	CHECK_EQ(env_teardown(&c), 0);
}

static const struct scenario scenarios[] = {
	{ "kernel_client_wire", kernel_client_wire },
	{ "project_client_wire", project_client_wire },
	{ "kernel_client_auth_required", kernel_client_auth_required },
	{ "kernel_client_inval", kernel_client_inval },
	{ "kernel_client_inval_stale", kernel_client_inval_stale },
	{ "kernel_client_inval_win", kernel_client_inval_win },
	{ "kernel_client_inval_stale_win", kernel_client_inval_stale_win },
	{ "kernel_client_inval_refused", kernel_client_inval_refused },
	{ "kernel_client_failover_busy", kernel_client_failover_busy },
	{ "kernel_client_defer_races_close", kernel_client_defer_races_close },
	{ "kernel_client_inval_cut_unbinding", kernel_client_inval_cut_unbinding },
	{ "kernel_client_name_taken", kernel_client_name_taken },
	{ "ext_mismatch", ext_mismatch },
	{ "kernel_server_fallback", kernel_server_fallback },
	{ "kernel_server_dotted_name", kernel_server_dotted_name },
	{ "kernel_server_secret_refused", kernel_server_secret_refused },
	{ "kernel_server_read_one_desc", kernel_server_read_one_desc },
	{ "project_read_descs", project_read_descs },
	{ "first_conn_recon_cnt", first_conn_recon_cnt },
	{ "first_conn_after_removal", first_conn_after_removal },
	{ "hb_kernel_server_pace", hb_kernel_server_pace },
	{ "hb_kernel_client_pace", hb_kernel_client_pace },
	{ "hb_kernel_client_stalled", hb_kernel_client_stalled },
	{ "hb_after_client_speaks", hb_after_client_speaks },
};

int main(int argc, char **argv)
{
	return fake_main(argc, argv, scenarios, ARRAY_SIZE(scenarios), "fake-kernel");
}
