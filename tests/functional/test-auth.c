/* SPDX-License-Identifier: MIT */
/*
 * Authenticated sessions and the reconnect decision, against an in-process
 * server (docs/security.md):
 *   - the right key connects, host-only and bidirectional, and IO is
 *     verified byte for byte;
 *   - a wrong host key fails with -EKEYREJECTED after exactly one
 *     connection request reaches the server;
 *   - no key against a server that requires one: -ENOKEY, and a path that
 *     meets this on reconnect stays closed with zero retries;
 *   - a wrong controller secret: the client refuses the server;
 *   - a key rotated on the server while connected, then the link cut: the
 *     reconnect fails once and stops ("key rejected");
 *   - a client that keeps revoked chunk keys, another host claiming a
 *     session, and a host presenting another host's TLS key (on connection
 *     0, or on a later connection of its path), all by fault injection (rtrs-fault.h: builds with
 *     -Dfault_injection=true; elsewhere those parts are skipped and the
 *     test ends with 77);
 *   - no secret ever appears in the logs.
 * The never-authenticating raw client is in test-connect.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rtrs.h"
#include "check.h"
#include "harness.h"
#include "logcap.h"
#ifdef RTRS_FAULT_INJECTION
#include "rtrs-fault.h"
#endif

/* Secrets as `nvme gen-dhchap-key` writes them (made with rtrs-key gen). */
static const char *const KEY_A = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
static const char *const KEY_B =
	"DHHC-1:01:GuJrkvVtT5Q5wN/viBieCAOaPKm2JWx23f/CVxUdQeZRpnco:";
static const char *const KEY_C =
	"DHHC-1:03:+wAoKHlPCToUB2zx0hA1YyrYfklQStdbbO+PkZbqU9Vhd5rk5u3HHpgVY9CzLWj0Wvvx9K7egkUYN4EmiaB3fqA4M68=:";
#define HOST "nqn.2014-08.org.nvmexpress:uuid:7e1d2c9a-0000-4000-8000-00000000a001"
#define SERVER "nqn.2026-11.io.rtrs:test-server"
#define LEN 4096
#define AREA (64 * LEN)

/* ---- the server: a memory device per session ---------------------------- */

struct usr_hdr {
	uint32_t off;
};

static uint8_t area[AREA];
static struct rtrs_srv_ctx *srv;
/* Writes seen from the session named "stale", and where the first one landed. */
static atomic_int stale_writes;
static void *_Atomic stale_chunk;
static char keys_path[256];
static int srv_port;
static char dst_buf[64];

static int srv_rdma_ev(void *priv, struct rtrs_srv_op *op, enum rtrs_dir dir, void *data,
		       size_t len, const void *usr, size_t usrlen)
{
	struct usr_hdr h;

	if (usrlen != sizeof(h))
		return -EINVAL;
	memcpy(&h, usr, sizeof(h));
	if (h.off > AREA || len > AREA - h.off)
		return -EINVAL;
	char name[64] = "";

	rtrs_srv_get_sess_name(rtrs_srv_op_sess(op), name, sizeof(name));
	if (dir == RTRS_WRITE && !strcmp(name, "stale")) {
		atomic_fetch_add(&stale_writes, 1);
		atomic_store(&stale_chunk, data);
	}
	if (dir == RTRS_WRITE)
		memcpy(area + h.off, data, len);
	else
		memcpy(data, area + h.off, len);
	return rtrs_srv_resp_rdma(op, 0);
}

static void write_keys(const char *host_key, const char *ctrl_key)
{
	FILE *f = fopen(keys_path, "w");

	CHECK(f != NULL, "key file");
	if (!f)
		return;
	fprintf(f, "# host  secret  [controller secret]\n");
	fprintf(f, "nqn.2014-08.org.nvmexpress:uuid:other-host %s\n", KEY_C);
	fprintf(f, "%s %s%s%s\n", HOST, host_key, ctrl_key ? " " : "", ctrl_key ? ctrl_key : "");
	fclose(f);
	chmod(keys_path, 0600);
}

/* Starts the server; port 0 picks one, else that port again (a restart). */
/* The server's user refuses new sessions with this errno (0: accepts). */
static atomic_int refuse_err;
/* ... only this many times (refuse_err then goes back to 0); -1: always. */
static atomic_int refuse_times = -1;

static int srv_link_ev(struct rtrs_srv_sess *sess, enum rtrs_srv_link_ev ev, void *priv)
{
	int err = atomic_load(&refuse_err);

	if (ev != RTRS_SRV_LINK_EV_CONNECTED)
		return 0;
	if (err && atomic_load(&refuse_times) > 0 && atomic_fetch_sub(&refuse_times, 1) == 1)
		atomic_store(&refuse_err, 0);
	return err;
}

/* The server's TLS (test_tls_key_of_another_host). */
static enum rtrs_tls_mode srv_tls;

static void srv_start(bool auth, int port)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev, .link_ev = srv_link_ev };
	struct rtrs_srv_opts so;

	rtrs_srv_opts_init(&so, sizeof(so));
	so.addr = test_addr();
	so.provider = test_provider();
	so.port = (uint16_t)port;
	so.queue_depth = 32;
	so.hb_interval_ms = 100;
	so.listen_retry_ms = 50;
	so.auth_name = SERVER;
	so.auth_keys_file = auth ? keys_path : NULL;
	so.tls = srv_tls;
	CHECK_EQ(rtrs_srv_open(&ops, &so, &srv), 0);
	CHECK_EQ(rtrs_srv_wait_listening(srv, 5000), 0);
	srv_port = rtrs_srv_get_port(srv);
}

static void srv_stop(void)
{
	rtrs_srv_close(srv);
	srv = NULL;
}

static struct rtrs_srv_stats srv_stats(void)
{
	struct rtrs_srv_stats st = { .size = sizeof(st) };

	CHECK_EQ(rtrs_srv_get_stats(srv, &st), 0);
	return st;
}

/* ---- the client ------------------------------------------------------------ */

static void clt_opts(struct rtrs_clt_opts *o, struct rtrs_path_addr *pa, char *dst,
		     size_t dstlen)
{
	snprintf(dst, dstlen, "%s:%d", test_addr(), srv_port);
	*pa = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(o, sizeof(*o));
	o->sessname = "auth-test";
	o->paths = pa;
	o->paths_num = 1;
	o->provider = test_provider();
	o->nr_io_cons = 1;
	o->hb_interval_ms = 100;
	o->connect_timeout_ms = 3000;
	o->reconnect_delay_ms = 100;
	o->reconnect_jitter_ms = 50;
	o->fast_io_fail_ms = 0;
	o->auth_host_name = HOST;
	o->auth_server_name = SERVER;
}

static int do_io(struct rtrs_clt_sess *sess, enum rtrs_dir dir, uint32_t off, void *buf)
{
	struct usr_hdr h = { .off = off };

	return test_request(sess, dir, &h, sizeof(h), buf, LEN);
}

/* Writes a pattern at off and reads it back: true when every byte matches. */
static bool io_verified(struct rtrs_clt_sess *sess, uint32_t off, uint8_t seed)
{
	static uint8_t out[LEN], in[LEN];
	int rc;

	for (size_t i = 0; i < LEN; i++)
		out[i] = (uint8_t)(seed + i * 7);
	memset(in, 0, sizeof(in));
	rc = do_io(sess, RTRS_WRITE, off, out);
	CHECK(rc == 0, "write: %s", strerror(-rc));
	rc = do_io(sess, RTRS_READ, off, in);
	CHECK(rc == 0, "read: %s", strerror(-rc));
	return !memcmp(in, out, LEN);
}

/* ---- cases ------------------------------------------------------------------- */

static void test_right_key(void)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	struct rtrs_path_stats st = { .size = sizeof(st) };
	char dst[64];
	int rc;

	write_keys(KEY_A, KEY_B);
	srv_start(true, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "host-only authentication: %s", strerror(-rc));
	if (!rc) {
		CHECK(io_verified(sess, 0, 1), "IO after authenticating");
		CHECK_EQ(rtrs_clt_path_stats(sess, 0, &st), 0);
		CHECK_EQ(st.auth_runs, 1u);
		CHECK_EQ(srv_stats().chunk_bytes, 32u * RTRS_DEFAULT_CHUNK_SIZE);
		rtrs_clt_close(sess);
		for (int i = 0; i < 2000 && srv_stats().sessions; i++)
			usleep(1000);
		CHECK_EQ(srv_stats().sessions, 0u);
		CHECK_EQ(srv_stats().chunk_bytes, 0u); /* the session's chunks went with it */
	}
	CHECK(log_has("authenticated (sha256, ffdhe2048)"), "server chose sha256 / ffdhe2048");

	/* Bidirectional, with secrets from files; SHA-512 and the null group asked for. */
	char hk[300], ck[300];
	FILE *f;

	snprintf(hk, sizeof(hk), "%s.host", keys_path);
	snprintf(ck, sizeof(ck), "%s.ctrl", keys_path);
	f = fopen(hk, "w");
	fprintf(f, "%s\n", KEY_A);
	fclose(f);
	f = fopen(ck, "w");
	fprintf(f, "%s\n", KEY_B);
	fclose(f);
	chmod(hk, 0600);
	chmod(ck, 0600);
	char hk_arg[310], ck_arg[310];

	snprintf(hk_arg, sizeof(hk_arg), "@%s", hk);
	snprintf(ck_arg, sizeof(ck_arg), "@%s", ck);
	o.auth_secret = hk_arg;
	o.auth_ctrl_secret = ck_arg;
	o.auth_hashes = "sha512";
	o.auth_dhgroups = "null";
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "bidirectional authentication: %s", strerror(-rc));
	if (!rc) {
		CHECK(io_verified(sess, LEN, 2), "IO after bidirectional authentication");
		rtrs_clt_close(sess);
	}
	CHECK(log_has("server authenticated too"), "the client checked the server");
	unlink(hk);
	unlink(ck);
	srv_stop();
}

static void test_wrong_key(void)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	struct rtrs_srv_stats st;
	char dst[64];
	int rc;

	write_keys(KEY_A, NULL);
	srv_start(true, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	/* A name the wire cannot carry is refused at open, not by the server. */
	o.auth_secret = KEY_A;
	o.auth_host_name = "host name";
	CHECK_EQ(rtrs_clt_open(&o, &sess), -EINVAL);
	CHECK_EQ(srv_stats().connreqs, 0u);
	o.auth_host_name = HOST;
	o.auth_secret = KEY_B;
	o.max_reconnect_attempts = -1;
	rc = rtrs_clt_open(&o, &sess);
	CHECK_EQ(rc, -EKEYREJECTED);
	usleep(300 * 1000); /* any retry would show up by now */
	st = srv_stats();
	CHECK_EQ(st.connreqs, 1u);   /* exactly one connection attempt reached the server */
	CHECK_EQ(st.auth_failed, 1u);
	CHECK_EQ(st.auth_ok, 0u);
	CHECK(log_has("failed authentication: wrong key"), "server says why");
	srv_stop();
}

static void test_no_key(void)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	struct rtrs_path_stats ps = { .size = sizeof(ps) };
	struct rtrs_srv_stats st;
	char dst[64];
	int rc, port;

	write_keys(KEY_A, NULL);
	srv_start(true, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	rc = rtrs_clt_open(&o, &sess);
	CHECK_EQ(rc, -ENOKEY);
	st = srv_stats();
	CHECK_EQ(st.connreqs, 1u);
	port = srv_port;
	srv_stop();

	/*
	 * On reconnect: connected to a server without authentication, which
	 * comes back requiring it. The path meets -ENOKEY once and stays closed.
	 */
	srv_start(false, port);
	clt_opts(&o, &pa, dst, sizeof(dst));
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open without authentication: %s", strerror(-rc));
	if (rc)
		goto out;
	CHECK(io_verified(sess, 0, 3), "IO without authentication");
	srv_stop();
	srv_start(true, port);
	CHECK(test_wait_path(sess, 0, "closed", 5000), "path closed after -ENOKEY");
	usleep(500 * 1000); /* five reconnect delays: no retry may come */
	st = srv_stats();
	CHECK_EQ(st.connreqs, 1u);
	CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
	CHECK_EQ(ps.last_error, -ENOKEY);
	CHECK(!strcmp(ps.reconnect_verdict, "no key"), "verdict: %s", ps.reconnect_verdict);
	CHECK(!strcmp(ps.state, "closed"), "state: %s", ps.state);
	rtrs_clt_close(sess);
out:
	srv_stop();
}

static void test_wrong_ctrl_key(void)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	char dst[64];
	int rc;

	write_keys(KEY_A, KEY_B);
	srv_start(true, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	o.auth_ctrl_secret = KEY_C; /* not what the server holds */
	rc = rtrs_clt_open(&o, &sess);
	CHECK_EQ(rc, -EKEYREJECTED);
	CHECK(log_has("its response does not match the controller secret"), "client says why");
	CHECK_EQ(srv_stats().connreqs, 1u);
	srv_stop();

	/* Bidirectional asked of a server that does not authenticate at all. */
	srv_start(false, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	o.auth_ctrl_secret = KEY_B;
	CHECK_EQ(rtrs_clt_open(&o, &sess), -ENOKEY);
	srv_stop();
}

/*
 * A path closed on a verdict half a second ago made one failed attempt,
 * the verdict's, and makes none after it: it is looked at again after
 * three more reconnect delays. Over verbs a server's close and start take
 * long enough that an attempt can fall in between and fail too (nothing
 * listens), so there the count before the verdict is not checked.
 */
static void check_no_retry_after_verdict(struct rtrs_clt_sess *sess)
{
	struct rtrs_path_stats ps = { .size = sizeof(ps) };
	uint64_t failures;

	CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
	failures = ps.reconnect_failures;
	if (!strcmp(test_provider(), "tcp"))
		CHECK_EQ(failures, 1u);
	else if (failures != 1)
		fprintf(stderr, "test-auth: %llu failed reconnect attempts, not checked over %s: "
			"the restarted server may not have listened yet\n",
			(unsigned long long)failures, test_provider());
	CHECK(failures >= 1, "failed attempts: %llu", (unsigned long long)failures);
	usleep(300 * 1000);
	CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
	CHECK_EQ(ps.reconnect_failures, failures);
	CHECK(!strcmp(ps.state, "closed"), "state: %s", ps.state);
}

static void test_rotated_key(void)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	struct rtrs_path_stats ps = { .size = sizeof(ps) };
	char dst[64];
	int rc, port;

	write_keys(KEY_A, NULL);
	srv_start(true, 0);
	port = srv_port;
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc) {
		srv_stop();
		return;
	}
	CHECK(io_verified(sess, 0, 4), "IO before the rotation");
	/* Rotated on the server while connected: the live path is not touched. */
	write_keys(KEY_B, NULL);
	CHECK(io_verified(sess, LEN, 5), "IO after the rotation, same connection");
	/* The link goes: the server restarts, keeping the new key. */
	srv_stop();
	srv_start(true, port);
	CHECK(test_wait_path(sess, 0, "closed", 5000), "path closed after the key was rejected");
	usleep(500 * 1000);
	CHECK_EQ(srv_stats().connreqs, 1u); /* one attempt, then it stopped */
	CHECK_EQ(srv_stats().auth_failed, 1u);
	CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
	CHECK_EQ(ps.last_error, -EKEYREJECTED);
	CHECK(!strcmp(ps.reconnect_verdict, "key rejected"), "verdict: %s", ps.reconnect_verdict);
	check_no_retry_after_verdict(sess);
	rtrs_clt_close(sess);
	srv_stop();
}

#ifdef RTRS_FAULT_INJECTION
/* Session B: verified IO in its own region until told to stop. */
static atomic_bool b_stop;
static atomic_int b_rounds, b_errors;

static void *b_worker(void *arg)
{
	struct rtrs_clt_sess *sess = arg;

	for (uint8_t seed = 0; !atomic_load(&b_stop); seed++) {
		if (!io_verified(sess, 32 * LEN + (seed % 8) * LEN, seed))
			atomic_fetch_add(&b_errors, 1);
		atomic_fetch_add(&b_rounds, 1);
	}
	return NULL;
}


/*
 * The same with a client that speaks only the kernel's RTRS: the server's
 * always_invalidate is then the kernel's (a key per chunk and path, a new
 * one in an RKEY_RSP with each response), over fabrics with messages with
 * immediates (RoCE: RTRS_TEST_RDMA_DEV=rxe); elsewhere it refuses.
 */
static bool kernel_inval_fabric(void)
{
	const char *dev = getenv("RTRS_TEST_RDMA_DEV");

	return dev && !strcmp(dev, "rxe");
}

/*
 * always_invalidate: a client that keeps a chunk's old key after the
 * server rotated it never changes the server's buffer; its write is
 * refused and only its path closes, while another session's verified IO
 * goes on undisturbed.
 */
static void stale_key_run(bool kernel)
{
	struct rtrs_fault stale_fault = { .stale_rkey = true, .kernel_client = kernel };
	struct rtrs_fault_stats fst;
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *a = NULL, *b = NULL;
	struct rtrs_path_stats ps = { .size = sizeof(ps) };
	static uint8_t x[LEN], y[LEN];
	pthread_t t;
	char dst[64];
	int rc, rounds;
	uint64_t stale0;

	atomic_store(&b_stop, false);
	atomic_store(&b_rounds, 0);
	atomic_store(&b_errors, 0);
	atomic_store(&stale_writes, 0);
	atomic_store(&stale_chunk, NULL);
	memset(area, 0, 2 * LEN);
	rtrs_fault_get_stats(&fst);
	stale0 = fst.stale_keys;
	srv_start(false, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.sessname = "undisturbed";
	CHECK_EQ(rtrs_clt_open(&o, &b), 0);
	if (!b)
		goto out;
	pthread_create(&t, NULL, b_worker, b);

	/* Two paths: one stays up, so the server keeps the session and its chunks. */
	struct rtrs_path_addr pa2[2];

	clt_opts(&o, &pa, dst, sizeof(dst));
	pa2[0] = pa2[1] = pa;
	o.paths = pa2;
	o.paths_num = 2;
	o.sessname = "stale";
	o.max_reconnect_attempts = 0;
	/*
	 * A kernel-mode session would send the refused write again on the
	 * other path at once (unfenced failover), where it goes stale too:
	 * here it is to fail, and the other path to stay.
	 */
	if (kernel)
		o.fast_io_fail_ms = 0;
	CHECK_EQ(rtrs_fault_set(&stale_fault), 0); /* this session never takes a new key */
	rc = rtrs_clt_open(&o, &a);
	rtrs_fault_set(NULL);
	if (kernel && !kernel_inval_fabric()) {
		/* No messages with immediates (tcp, iWARP): the server refuses a kernel client. */
		CHECK(rc == -EOPNOTSUPP, "a kernel client's open: %s", strerror(-rc));
		goto out_b;
	}
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		goto out_b;
	if (kernel) {
		rtrs_fault_get_stats(&fst);
		CHECK(fst.kernel_reqs >= 4, "requests went out as a kernel client's");
		CHECK_EQ(rtrs_clt_peer_ext(a), 0);
	}
	memset(x, 0x5a, LEN);
	memset(y, 0xa5, LEN);
	CHECK_EQ(do_io(a, RTRS_WRITE, 0, x), 0);  /* with the first key: fine */
	CHECK_EQ(atomic_load(&stale_writes), 1);
	rc = do_io(a, RTRS_WRITE, LEN, y);        /* the same chunk, its revoked key */
	CHECK(rc == -ECONNABORTED, "stale-key write: %s", strerror(-rc));
	rtrs_fault_get_stats(&fst);
	CHECK_EQ(fst.stale_keys - stale0, 1);     /* the fault bit: one write went stale */
	CHECK(test_wait_path(a, 0, "closed", 1500) || test_wait_path(a, 1, "closed", 1500),
	      "the stale write's path closed");
	usleep(200 * 1000);
	CHECK_EQ(atomic_load(&stale_writes), 1);  /* nothing more reached the server's user */
	CHECK(memcmp(area + LEN, y, LEN) != 0, "the device never got the stale write");
	CHECK(atomic_load(&stale_chunk) && memcmp(atomic_load(&stale_chunk), y, 64) != 0,
	      "the chunk buffer never got it either");
	{
		struct rtrs_path_stats p0 = { .size = sizeof(p0) }, p1 = { .size = sizeof(p1) };

		CHECK_EQ(rtrs_clt_path_stats(a, 0, &p0), 0);
		CHECK_EQ(rtrs_clt_path_stats(a, 1, &p1), 0);
		CHECK(!strcmp(p0.state, "connected") != !strcmp(p1.state, "connected"),
		      "exactly one path of the stale session closed (%s, %s)", p0.state, p1.state);
	}
	rtrs_clt_close(a);
	rounds = atomic_load(&b_rounds);
	usleep(300 * 1000);
	CHECK(atomic_load(&b_rounds) > rounds, "the other session kept going");
	CHECK(rtrs_clt_path_stats(b, 0, &ps) == 0 && !strcmp(ps.state, "connected"),
	      "the other session's path stayed up");
	CHECK(srv_stats().key_rotations >= 2 * 32u, "keys were rotated (%llu)",
	      (unsigned long long)srv_stats().key_rotations);
out_b:
	atomic_store(&b_stop, true);
	pthread_join(t, NULL);
	CHECK_EQ(atomic_load(&b_errors), 0);
	CHECK(atomic_load(&b_rounds) > 10, "verified rounds: %d", atomic_load(&b_rounds));
	rtrs_clt_close(b);
out:
	srv_stop();
}

static void test_stale_key(void)
{
	stale_key_run(false);
	stale_key_run(true);
}
#else
static void test_stale_key(void)
{
	SKIP_PART("a client with stale keys: built without -Dfault_injection=true");
}
#endif

/* No secret, nor its base64 part, in anything logged. */
/*
 * The server's verdict after the connections were accepted (its user
 * refuses the session): EACCES is final, the path closes with "do not
 * retry" after one attempt; EBUSY is not, the path keeps trying and comes
 * back when the user accepts again.
 */
static void test_refused_by_user(void)
{
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	struct rtrs_path_stats ps = { .size = sizeof(ps) };
	uint64_t n;
	char dst[64];
	int rc, port;

	srv_start(false, 0);
	port = srv_port;
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.max_reconnect_attempts = -1;

	/* At open: the caller gets the user's errno. */
	atomic_store(&refuse_err, -EACCES);
	CHECK_EQ(rtrs_clt_open(&o, &sess), -EACCES);
	CHECK(log_wait_for("session refused by its user", 2000));

	/* On reconnect, final: one attempt, then the path stays closed. */
	atomic_store(&refuse_err, 0);
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc) {
		srv_stop();
		return;
	}
	CHECK(io_verified(sess, 0, 7), "IO before the refusal");
	srv_stop();
	atomic_store(&refuse_err, -EACCES);
	srv_start(false, port);
	CHECK(test_wait_path(sess, 0, "closed", 5000), "the path closed on the verdict");
	n = srv_stats().connreqs;
	CHECK(n >= 1 && n <= 2, "one attempt (its %llu connections)", (unsigned long long)n);
	usleep(500 * 1000); /* reconnect delay 100 ms: a retry would show by now */
	CHECK_EQ(srv_stats().connreqs, n);
	CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
	CHECK_EQ(ps.last_error, -EACCES);
	CHECK(!strcmp(ps.reconnect_verdict, "do not retry"), "verdict: %s", ps.reconnect_verdict);
	check_no_retry_after_verdict(sess);
	rtrs_clt_close(sess);
	sess = NULL;

	/* Not final: the path retries through EBUSY and comes back. */
	atomic_store(&refuse_err, 0);
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc) {
		srv_stop();
		return;
	}
	srv_stop();
	atomic_store(&refuse_err, -EBUSY);
	srv_start(false, port);
	for (int i = 0; i < 500; i++) {
		CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
		if (ps.reconnect_failures >= 2)
			break;
		usleep(10 * 1000);
	}
	CHECK(ps.reconnect_failures >= 2, "retried after EBUSY: %llu failures",
	      (unsigned long long)ps.reconnect_failures);
	CHECK_EQ(ps.last_error, -EBUSY);
	CHECK(!strcmp(ps.reconnect_verdict, "retry"), "verdict: %s", ps.reconnect_verdict);
	atomic_store(&refuse_err, 0);
	CHECK(test_wait_path(sess, 0, "connected", 5000), "back once the user accepts");
	CHECK(io_verified(sess, LEN, 8), "IO after the refusal ended");
	rtrs_clt_close(sess);
	sess = NULL;

	/* At open, not final: retried a few times, then the open succeeds. */
	atomic_store(&refuse_times, 2);
	atomic_store(&refuse_err, -EBUSY);
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open through two EBUSY refusals: %s", strerror(-rc));
	CHECK_EQ(atomic_load(&refuse_times), 0);
	if (!rc) {
		CHECK(io_verified(sess, 2 * LEN, 9), "IO after the retried open");
		rtrs_clt_close(sess);
	}
	/* ... but bounded: a server that keeps refusing fails the open. */
	atomic_store(&refuse_times, -1);
	atomic_store(&refuse_err, -EBUSY);
	uint64_t t0 = test_now_ms();

	CHECK_EQ(rtrs_clt_open(&o, &sess), -EBUSY);
	CHECK(test_now_ms() - t0 < 5000, "gave up after %llu ms",
	      (unsigned long long)(test_now_ms() - t0));
	atomic_store(&refuse_err, 0);
	srv_stop();
}

/*
 * Authenticated opens with both CPUs busy: the client's IO connection
 * follows SUCCESS1 at once, and must never find the server still
 * unaware that the host proved itself (it was refused with EACCES).
 */
static atomic_bool spin_stop;

static void *spinner(void *arg)
{
	volatile unsigned long n = 0;

	while (!atomic_load_explicit(&spin_stop, memory_order_relaxed))
		n++;
	return arg;
}

static void test_opens_under_load(void)
{
	enum { OPENS = 30, SPINNERS = 2 };
	pthread_t spin[SPINNERS];
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	char dst[64];
	int ok = 0, rc;

	write_keys(KEY_A, KEY_B);
	srv_start(true, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	o.auth_ctrl_secret = KEY_B;
	o.nr_io_cons = 2;
	atomic_store(&spin_stop, false);
	for (int i = 0; i < SPINNERS; i++)
		CHECK_EQ(pthread_create(&spin[i], NULL, spinner, NULL), 0);
	for (int i = 0; i < OPENS; i++) {
		struct rtrs_clt_sess *sess = NULL;

		rc = rtrs_clt_open(&o, &sess);
		if (rc) {
			CHECK(false, "open %d of %d under load: %s", i + 1, OPENS, strerror(-rc));
			continue;
		}
		ok += io_verified(sess, (uint32_t)(i % 8) * LEN, (uint8_t)i);
		/* Once: a retry would hide a refusal the server should not have made. */
		struct rtrs_path_stats st = { .size = sizeof(st) };

		CHECK_EQ(rtrs_clt_path_stats(sess, 0, &st), 0);
		CHECK(st.auth_runs == 1, "open %d authenticated %llu times", i + 1,
		      (unsigned long long)st.auth_runs);
		rtrs_clt_close(sess);
	}
	atomic_store(&spin_stop, true);
	for (int i = 0; i < SPINNERS; i++)
		pthread_join(spin[i], NULL);
	CHECK(ok == OPENS, "%d of %d authenticated opens moved verified data", ok, OPENS);
	srv_stop();
}

/* rtrs_srv_open in a thread of its own: a hang shows as a timeout, not a stuck test. */
struct open_call {
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *ctx;
	int rc;
	atomic_bool done;
};

static void *open_thread(void *arg)
{
	struct open_call *c = arg;
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev, .link_ev = srv_link_ev };

	c->rc = rtrs_srv_open(&ops, &c->so, &c->ctx);
	atomic_store(&c->done, true);
	return NULL;
}

/*
 * A FIFO as the key file (or anything that is not a regular file): the
 * server refuses it at once instead of blocking in open(); swapped in at
 * run time, an authentication fails (no FAILURE1: the host may retry) and
 * the server goes on taking sessions once the file is right again.
 */
static void test_fifo_key_file(void)
{
	struct open_call *c = calloc(1, sizeof(*c));
	char fifo[300], saved[300];
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	pthread_t t;
	uint64_t t0;
	size_t mark;
	int rc;

	snprintf(fifo, sizeof(fifo), "%s.fifo", keys_path);
	snprintf(saved, sizeof(saved), "%s.saved", keys_path);
	CHECK_EQ(mkfifo(fifo, 0600), 0);
	rtrs_srv_opts_init(&c->so, sizeof(c->so));
	c->so.addr = test_addr();
	c->so.provider = test_provider();
	c->so.auth_name = SERVER;
	c->so.auth_keys_file = fifo;
	CHECK_EQ(pthread_create(&t, NULL, open_thread, c), 0);
	for (int i = 0; i < 300 && !atomic_load(&c->done); i++)
		usleep(10 * 1000);
	CHECK(atomic_load(&c->done), "the server's start returned with a FIFO as its key file");
	if (!atomic_load(&c->done)) {
		/* Let the stuck open() go: a writer appears, and leaves. */
		int fd = open(fifo, O_WRONLY | O_NONBLOCK);

		if (fd >= 0)
			close(fd);
	}
	pthread_join(t, NULL);
	CHECK_EQ(c->rc, -EINVAL);
	if (!c->rc)
		rtrs_srv_close(c->ctx);
	CHECK(log_has("not a regular file"), "the server says why");

	/* At run time. */
	write_keys(KEY_A, NULL);
	srv_start(true, 0);
	CHECK_EQ(rename(keys_path, saved), 0);
	CHECK_EQ(rename(fifo, keys_path), 0);
	clt_opts(&o, &pa, dst_buf, sizeof(dst_buf));
	o.auth_secret = KEY_A;
	mark = log_mark();
	t0 = test_now_ms();
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc != 0 && rc != -EKEYREJECTED && rc != -ENOKEY,
	      "authentication with a FIFO as the key file: %s", strerror(-rc));
	CHECK(test_now_ms() - t0 < 3000, "failed after %llu ms",
	      (unsigned long long)(test_now_ms() - t0));
	if (!rc)
		rtrs_clt_close(sess);
	CHECK(log_has_since(mark, "is not a regular file"),
	      "the server says why the authentication failed");
	CHECK_EQ(rename(saved, keys_path), 0);
	unlink(fifo);
	sess = NULL;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "a session once the key file is right again: %s", strerror(-rc));
	if (!rc) {
		CHECK(io_verified(sess, 0, 11), "IO after the key file came back");
		rtrs_clt_close(sess);
	}
	/* Checked on demand (rnbd-server's SIGHUP): a broken line is named. */
	CHECK_EQ(rtrs_srv_check_keys(srv), 0);
	write_keys("DHHC-1:00:broken:", NULL);
	mark = log_mark();
	CHECK_EQ(rtrs_srv_check_keys(srv), -EINVAL);
	CHECK(log_has_since(mark, "line 3"), "the broken line is named");
	write_keys(KEY_A, NULL);
	CHECK_EQ(rtrs_srv_check_keys(srv), 0);
	srv_stop();
	free(c);
}

static void test_no_secret_logged(void)
{
	const char *keys[] = { KEY_A, KEY_B, KEY_C };

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		char b64[128];

		snprintf(b64, sizeof(b64), "%s", keys[i] + 10);
		b64[strlen(b64) - 1] = '\0';
		CHECK(!log_has(keys[i]), "secret %zu logged", i);
		CHECK(!log_has(b64), "base64 of secret %zu logged", i);
		b64[12] = '\0'; /* even a prefix */
		CHECK(!log_has(b64), "part of secret %zu logged", i);
	}
	CHECK(log_len > 1000, "the log did capture the run (%zu bytes)", log_len);
}

/*
 * Another host, with a good key of its own, claims a session: it names the
 * session's uuid (fault injection gives both clients one uuid) and its
 * name. The server refuses that path; the owner's IO goes on.
 */
#ifdef RTRS_FAULT_INJECTION
static void test_session_of_another_host(void)
{
	struct rtrs_fault claim = { .paths_uuid = "claimed-session" };
	struct rtrs_fault_stats fst;
	struct rtrs_clt_opts o, o2;
	struct rtrs_path_addr pa, pa2;
	struct rtrs_clt_sess *a = NULL, *b = NULL;
	char dst[64], dst2[64];
	int rc;

	write_keys(KEY_A, NULL);
	srv_start(true, 0);
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	CHECK_EQ(rtrs_fault_set(&claim), 0);
	rc = rtrs_clt_open(&o, &a);
	CHECK(rc == 0, "the owner's session: %s", strerror(-rc));
	clt_opts(&o2, &pa2, dst2, sizeof(dst2));
	o2.auth_secret = KEY_C;
	o2.auth_host_name = "nqn.2014-08.org.nvmexpress:uuid:other-host";
	o2.max_reconnect_attempts = 0;
	rc = rtrs_clt_open(&o2, &b);
	rtrs_fault_set(NULL);
	CHECK(rc != 0, "another host joins the session: %s", rc ? strerror(-rc) : "accepted");
	rtrs_fault_get_stats(&fst);
	CHECK(fst.uuids >= 2, "connection requests naming the claimed uuid: %llu",
	      (unsigned long long)fst.uuids);
	if (!rc)
		rtrs_clt_close(b);
	CHECK(log_has("authenticated, but session auth-test belongs to host"),
	      "the server says whose session it is");
	if (a) {
		CHECK(io_verified(a, 0, 7), "the owner's IO goes on");
		CHECK_EQ(srv_stats().sessions, 1u);
		rtrs_clt_close(a);
	}
	srv_stop();
}
#else
static void test_session_of_another_host(void)
{
	SKIP_PART("another host claiming a session: built without -Dfault_injection=true");
}
#endif

/*
 * TLS binds the host (docs/security.md section 9.6): a host holding
 * another host's TLS key (fault injection presents it in the handshake)
 * is refused when its DH-HMAC-CHAP names itself inside the other's TLS
 * connection, and when a later connection of its path carries the other's
 * key; each with -EKEYREJECTED at the first attempt, never tried again.
 */
#ifdef RTRS_FAULT_INJECTION
/* Two PSKs of `nvme gen-tls-key --hmac=1`. */
static const char *const TLS_OWN = "NVMeTLSkey-1:01:mUmrQMBgwTrPGOs5PQ+5piOkaXxggNfNqfmoHYrGOmxAV6Yj:";
static const char *const TLS_OTHER = "NVMeTLSkey-1:01:T/5KX6Towu5BfWmah+meNgMyTgzktG65QgF1kPf7xHRpfSqj:";

static void test_tls_key_of_another_host(void)
{
	const char *other = "nqn.2014-08.org.nvmexpress:uuid:other-host";
	struct rtrs_fault f = { 0 };
	struct rtrs_fault_stats fst;
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	struct rtrs_clt_sess *sess = NULL;
	char dst[64];
	FILE *kf;
	size_t mark;
	int rc;

	if (strcmp(test_provider(), "tcp")) {
		/* Nothing to test: RDMA paths have no TLS (not a skip: the suite runs it on tcp). */
		printf("test-auth: TLS binding: no TLS on provider %s\n", test_provider());
		return;
	}
	kf = fopen(keys_path, "w");
	CHECK(kf != NULL);
	if (!kf)
		return;
	fprintf(kf, "%s %s tls=%s\n%s %s tls=%s\n", other, KEY_C, TLS_OTHER, HOST, KEY_A, TLS_OWN);
	fclose(kf);
	chmod(keys_path, 0600);
	srv_tls = RTRS_TLS_REQUIRED;
	srv_start(true, 0);
	f.tls_host = other;
	f.tls_server = SERVER;
	f.tls_key = TLS_OTHER;
	for (int later = 0; later < 2; later++) {
		const char *want = later ? "TLS key is host " : "authenticated inside a TLS connection of host";

		clt_opts(&o, &pa, dst, sizeof(dst));
		o.auth_secret = KEY_A;
		o.tls = RTRS_TLS_REQUIRED;
		o.tls_key = TLS_OWN;
		f.tls_later_only = later;
		mark = log_mark();
		CHECK_EQ(rtrs_fault_set(&f), 0);
		rc = rtrs_clt_open(&o, &sess);
		rtrs_fault_set(NULL);
		CHECK(rc == -EKEYREJECTED, "%s: %s", later ? "a later connection with the other's key"
			: "the other's key on connection 0", rc ? strerror(-rc) : "opened");
		if (!rc)
			rtrs_clt_close(sess);
		sess = NULL;
		CHECK(log_has_since(mark, want), "the server says why (%s)", want);
		/* Refused once: the open did not try again (counted under the log's lock: the
		 * server's loop may still be logging the path's end). */
		CHECK_EQ(log_count_since(mark, want), 1u);
	}
	rtrs_fault_get_stats(&fst);
	CHECK(fst.tls_swaps >= 2, "connections with the other host's key: %llu",
	      (unsigned long long)fst.tls_swaps);
	/* The host's own key alone still opens, and its IO is whole. */
	clt_opts(&o, &pa, dst, sizeof(dst));
	o.auth_secret = KEY_A;
	o.tls = RTRS_TLS_REQUIRED;
	o.tls_key = TLS_OWN;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "its own key: %s", strerror(-rc));
	if (!rc) {
		CHECK(io_verified(sess, 0, 9), "IO on its own TLS key");
		rtrs_clt_close(sess);
	}
	srv_stop();
	srv_tls = RTRS_TLS_OFF;
}
#else
static void test_tls_key_of_another_host(void)
{
	SKIP_PART("TLS binding: built without -Dfault_injection=true");
}
#endif

int main(void)
{
	/* Holds secrets: gone with the process, however it ends. */
	const char *dir = test_tmpdir("/tmp", "rtrs-test-auth");

	if (!dir)
		return 1;
	snprintf(keys_path, sizeof(keys_path), "%s/hosts", dir);
	/* TA_STDERR=1: logs to stderr instead, when debugging (the secret check then fails). */
	if (!getenv("TA_STDERR"))
		rtrs_set_log_fn(log_sink, NULL);
	rtrs_set_log_level(3); /* everything, so the secret check sees all */
	test_right_key();
	test_wrong_key();
	test_no_key();
	test_wrong_ctrl_key();
	test_rotated_key();
	test_stale_key();
	test_refused_by_user();
	test_session_of_another_host();
	test_tls_key_of_another_host();
	test_opens_under_load();
	test_fifo_key_file();
	test_no_secret_logged();
	rtrs_set_log_fn(NULL, NULL);
	if (g_failures)
		fprintf(stderr, "captured log (tail):\n%s\n",
			log_len > 6000 ? log_text() + log_len - 6000 : log_text());
	return test_done("test-auth");
}
