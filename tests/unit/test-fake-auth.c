/* SPDX-License-Identifier: MIT */
/*
 * Deterministic scenarios of authentication and admission over the fake
 * fabric (lib/rtrs/rtrs-fabric-fake.h): DH-HMAC-CHAP with its messages
 * duplicated, forged, cut off or answered at the worst moment (among them
 * the ordering race of srv_auth_recv: the host's proof must be recorded
 * before SUCCESS1 leaves, or the client's next connection, requested the
 * moment SUCCESS1 arrives, is refused), wrong and missing keys, a key
 * rotated under a connected path, a key file reloaded while a path's
 * handshake or re-authentication is under way, and the server's admission
 * decisions: pending paths per peer and in all, proven hosts, handshakes
 * that wait on the server, a full session, the session limit, connections
 * per path, a refusing user and a taken session name.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fake-main.h"
#include "loop.h"
#include "rtrs-pri.h"

#define OTHER_NQN "nqn.2014-08.org.nvmexpress:uuid:7e1d2c9a-0000-4000-8000-00000000f002"

static bool srv_up(const struct rtrs_srv_opts *so)
{
	int rc = srv_start(so);

	CHECK(rc == 0, "server: %s", strerror(-rc));
	return rc == 0;
}

/* A server that wants KEY_A from HOST_NQN, and a client "s" to host a with key. */
static bool auth_setup(struct clt *c, const char *key)
{
	struct rtrs_srv_opts so;

	srv_opts_auth(&so, KEY_A);
	if (!srv_up(&so))
		return false;
	clt_init(c, "s", "a");
	c->o.auth_secret = key;
	return true;
}

static void teardown(struct clt *c)
{
	CHECK_EQ(env_teardown(c), 0);
}

static struct m to_srv_reply = { .dir = TO_SRV, .auth = AUTH(RTRS_AUTH_REPLY) };
static struct m to_srv_negotiate = { .dir = TO_SRV, .auth = AUTH(RTRS_AUTH_NEGOTIATE) };
static struct m to_clt_challenge = { .dir = TO_CLT, .auth = AUTH(RTRS_AUTH_CHALLENGE) };
static struct m to_clt_success1 = { .dir = TO_CLT, .auth = AUTH(RTRS_AUTH_SUCCESS1) };
static struct m to_clt_failure1 = { .dir = TO_CLT, .auth = AUTH(RTRS_AUTH_FAILURE1) };

/* ---- authentication ---------------------------------------------------------------------------- */

/* The right key: one authentication, then IO byte for byte. */
static void auth_ok(void)
{
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	CHECK_EQ(clt_open(&c), 0);
	if (c.sess) {
		CHECK(io_roundtrip(&c, 0, 3), "IO after authentication");
		CHECK_EQ(clt_path(&c, 0).auth_runs, 1);
	}
	CHECK_EQ(srv_stats().auth_ok, 1);
	CHECK_EQ(srv_stats().auth_failed, 0);
	CHECK_EQ(srv_stats().connreqs, 2);
	CHECK_EQ(srv_stats().rejects, 0);
	teardown(&c);
}

struct race {
	bool ran;
	int answer;      /* FAKE_ACCEPT or FAKE_REJECT: the server's answer to connection 1 */
};

static bool answer_to_con1(const struct fake_ev *ev, void *arg)
{
	return !ev->to_server && ev->cid == 1 &&
	       (ev->kind == FAKE_ACCEPT || ev->kind == FAKE_REJECT);
}

/*
 * Runs inside srv_auth_answer, on the offload worker answering the client's
 * REPLY, the moment the server posts SUCCESS1: SUCCESS1 arrives at once,
 * the client requests connection 1, and the server's loop answers that
 * request, all before srv_auth_answer goes on past its fab_send.
 */
static void success1_posted(struct fake_ev *ev, void *arg)
{
	struct m connreq1 = { .kind = FAKE_CONNREQ, .cid = CID(1) };
	struct race *r = arg;
	struct fake_ev *cr, *ans;

	r->ran = true;
	if (fake_deliver(ev))
		return;
	cr = fake_wait_ev(match, &connreq1, "connection 1's request");
	if (!cr || fake_deliver(cr))
		return;
	ans = fake_wait_ev(answer_to_con1, NULL, "the server's answer to connection 1");
	if (!ans)
		return;
	r->answer = ans->kind;
	fake_unclaim(ans);
}

/*
 * The ordering race found in srv_auth_recv (commit a8951cb restored the
 * order; srv_auth_answer now): the server must record that the host proved itself
 * (auth_host_ok) before SUCCESS1 leaves. Here the client's connection 1
 * reaches the server between the send and the rest of srv_auth_recv; with
 * the order wrong the server refuses it (-EACCES) and the open needs a
 * second authentication. With it right: accepted, one authentication.
 */
static void auth_success1_race(void)
{
	struct race r = { 0 };
	struct fake_ev *rep;
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	rep = open_step_to(&c, match, &to_srv_reply, "the client's REPLY");
	fake_on_post(match, &to_clt_success1, success1_posted, &r);
	CHECK(rep != NULL);
	if (rep)
		CHECK_EQ(fake_deliver(rep), 0);
	/* The REPLY is answered on an offload worker: the hook runs there. */
	CHECK_EQ(fake_settle(), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK(r.ran, "SUCCESS1 was posted");
	CHECK(r.answer == FAKE_ACCEPT, "connection 1, requested as SUCCESS1 arrived, was %s",
	      r.answer == FAKE_REJECT ? "refused" : "not answered");
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), 0);
	CHECK_EQ(srv_stats().rejects, 0);
	CHECK_EQ(srv_stats().auth_ok, 1);
	if (c.sess) {
		CHECK_EQ(clt_path(&c, 0).auth_runs, 1);
		CHECK(io_roundtrip(&c, 0, 5), "IO after authentication");
	}
	teardown(&c);
}

/*
 * The client's NEGOTIATE arrives twice: the second, unexpected once the
 * challenge is out, fails the server's transaction (FAILURE1). The client,
 * which answered the challenge meanwhile, reads the FAILURE1 and gives up
 * for good (-EKEYREJECTED); its REPLY, arriving after the failure, closes
 * the server's path. Nobody authenticated, no chunk was mapped, and the
 * client does not try again.
 */
static void auth_dup_negotiate(void)
{
	struct fake_ev *neg, *dup, *ev, *rep;
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	neg = open_step_to(&c, match, &to_srv_negotiate, "the client's NEGOTIATE");
	dup = neg ? fake_dup(neg) : NULL;
	CHECK(dup != NULL);
	if (dup) {
		CHECK_EQ(fake_deliver(neg), 0);
		CHECK_EQ(fake_deliver(dup), 0);
	}
	ev = fake_wait_ev(match, &to_clt_challenge, "the CHALLENGE");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	rep = fake_wait_ev(match, &to_srv_reply, "the client's REPLY");
	ev = fake_wait_ev(match, &to_clt_failure1, "the FAILURE1");
	if (ev)
		CHECK_EQ(fake_deliver(ev), 0);
	if (rep)
		CHECK_EQ(fake_deliver(rep), 0);
	/* Answered (an offload worker) before the client's close can drop it. */
	CHECK_EQ(fake_settle(), 0);
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), -EKEYREJECTED);
	CHECK_EQ(fake_settle(), 0);
	CHECK(env_logged("authentication message not expected"), "the late REPLY is refused");
	CHECK_EQ(srv_stats().auth_ok, 0);
	CHECK_EQ(srv_stats().auth_failed, 1);
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(srv_stats().chunk_bytes, 0);
	CHECK_EQ(srv_stats().sessions, 0);
	teardown(&c);
}

/*
 * The server's CHALLENGE arrives twice, the copy after the client has
 * answered the first: where the client waits for SUCCESS1 it is out of
 * order, and the client refuses the server (-EKEYREJECTED, final, with a
 * FAILURE2). The server, which authenticated the host meanwhile, closes
 * the path when that FAILURE2 comes after its SUCCESS1.
 */
static void auth_dup_challenge(void)
{
	struct fake_ev *chal, *dup, *rep;
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	chal = open_step_to(&c, match, &to_clt_challenge, "the CHALLENGE");
	dup = chal ? fake_dup(chal) : NULL;
	CHECK(dup != NULL);
	if (dup) {
		CHECK_EQ(fake_deliver(chal), 0);
		/* Answered: the client has taken the first one. */
		rep = fake_wait_ev(match, &to_srv_reply, "the client's REPLY");
		/*
		 * The server answers it (an offload worker does) before the
		 * copy reaches the client: its SUCCESS1 waits, held.
		 */
		if (rep)
			CHECK_EQ(fake_deliver(rep), 0);
		CHECK(ev_appears(match, &to_clt_success1, "the server's SUCCESS1"));
		CHECK_EQ(fake_deliver(dup), 0);
	}
	CHECK(ev_appears(match, &(struct m){ .dir = TO_SRV, .auth = AUTH(RTRS_AUTH_FAILURE2) },
			 "the client's FAILURE2"));
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), -EKEYREJECTED);
	CHECK_EQ(fake_settle(), 0);
	CHECK(env_logged("unexpected in state"), "the copy is named");
	CHECK_EQ(srv_stats().auth_ok, 1);
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(srv_stats().chunk_bytes, 0);
	teardown(&c);
}

/*
 * A forged information request arrives on connection 0 before the
 * NEGOTIATE: the server closes the path (-EACCES) without mapping a byte
 * of chunk memory; the client's open, dropped, tries again and opens.
 */
static void auth_info_before_auth(void)
{
	struct rtrs_info_req info = { .imm_addr = 0, .imm_key = 1 };
	struct rtrs_msg_info_req msg;
	struct fake_ev *neg, *forged, *retry;
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	neg = open_step_to(&c, match, &to_srv_negotiate, "the client's NEGOTIATE");
	forged = neg ? fake_dup(neg) : NULL;
	CHECK(forged != NULL);
	if (forged) {
		snprintf(info.pathname, sizeof(info.pathname), "s");
		rtrs_info_req_encode(&msg, &info);
		CHECK_EQ(fake_rewrite(forged, &msg, sizeof(msg)), 0);
		CHECK_EQ(fake_deliver(forged), 0);
		fake_drop(neg);
	}
	retry = hold_open_retry();
	CHECK(retry != NULL);
	CHECK(env_logged("message before authentication; closing the path"), "logged");
	CHECK_EQ(srv_stats().auth_ok, 0);
	CHECK_EQ(srv_stats().chunk_bytes, 0);
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(atomic_load(&srv.link_up), 0);
	CHECK_EQ(open_resume(&c, retry), 0);
	CHECK_EQ(srv_stats().auth_ok, 1);
	teardown(&c);
}

/*
 * Connection 0 is cut after the CHALLENGE: no authentication either way,
 * nothing left; the open's next attempt authenticates.
 */
static void auth_cut_mid(void)
{
	struct fake_ev *retry;
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	retry = open_cut_at(&c, match, &to_clt_challenge, "the CHALLENGE", 0, false);
	CHECK(retry != NULL);
	CHECK_EQ(srv_stats().auth_ok, 0);
	CHECK_EQ(srv_stats().auth_failed, 0);
	CHECK_EQ(srv_stats().sessions, 0);
	CHECK_EQ(open_resume(&c, retry), 0);
	CHECK_EQ(srv_stats().auth_ok, 1);
	CHECK_EQ(srv_stats().auth_failed, 0);
	teardown(&c);
}

/* A wrong key: -EKEYREJECTED after one connection request, never tried again. */
static void auth_wrong_key(void)
{
	struct clt c;

	if (!auth_setup(&c, KEY_B))
		return;
	CHECK_EQ(clt_open(&c), -EKEYREJECTED);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(srv_stats().auth_failed, 1);
	CHECK_EQ(srv_stats().auth_ok, 0);
	CHECK_EQ(srv_stats().sessions, 0);
	teardown(&c);
}

/* No key at all: -ENOKEY before any message, after one connection request. */
static void auth_no_key(void)
{
	struct clt c;

	if (!auth_setup(&c, NULL))
		return;
	CHECK_EQ(clt_open(&c), -ENOKEY);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(srv_stats().auth_failed, 0);
	CHECK_EQ(fake_delivered(match, &(struct m){ .dir = TO_SRV, .msg = MSG(RTRS_MSG_AUTH) }), 0);
	teardown(&c);
}

static bool path_closed(void *arg)
{
	return clt_path_is(arg, 0, "closed");
}

/*
 * The host's key changes in the server's file while the path is up; the
 * link is cut. The reconnect fails authentication, and the path stays
 * closed ("key rejected") however long the clock runs.
 */
static void auth_key_rotated(void)
{
	struct clt c;
	uint64_t reqs;

	if (!auth_setup(&c, KEY_A))
		return;
	CHECK_EQ(clt_open(&c), 0);
	if (!c.sess) {
		teardown(&c);
		return;
	}
	srv_write_keys(KEY_B);
	CHECK_EQ(fake_fail("s", "a", -1, -ECONNRESET, -ECONNRESET), 2);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(path_closed, &c, "the reconnect to fail"), 0);
	CHECK(!strcmp(clt_path(&c, 0).reconnect_verdict, "key rejected"), "verdict %s",
	      clt_path(&c, 0).reconnect_verdict);
	CHECK_EQ(clt_path(&c, 0).last_error, -EKEYREJECTED);
	CHECK_EQ(fake_settle(), 0);
	reqs = srv_stats().connreqs;
	for (int i = 0; i < 10; i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(srv_stats().connreqs, reqs);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(srv_stats().auth_ok, 1);
	CHECK_EQ(srv_stats().auth_failed, 1);
	teardown(&c);
}

static bool info_rsp_to_clt(const struct fake_ev *ev, void *arg)
{
	(void)arg;
	return match(ev, &(struct m){ .dir = TO_CLT, .msg = MSG(RTRS_MSG_INFO_RSP) });
}

static struct m to_clt_reauth = { .dir = TO_CLT, .auth = AUTH(RTRS_AUTH_REAUTH) };

static bool reauth_delivered(void *arg)
{
	(void)arg;
	return fake_delivered(match, &to_clt_reauth) > 0;
}

static bool two_auths(void *arg)
{
	(void)arg;
	return srv_stats().auth_ok >= 2;
}

/*
 * The key file changes while a path's information exchange runs (the
 * server has it connected; its information response is held): the
 * server's request to authenticate again reaches the client before the
 * path is up. Once it is, the client runs that re-authentication (it used
 * to keep the request unread, and the server closed the path when its
 * auth timeout ran out).
 */
static void auth_reauth_during_info(void)
{
	struct clt c;
	FILE *f;

	if (!auth_setup(&c, KEY_A))
		return;
	fake_hold(info_rsp_to_clt, NULL);
	clt_open_async(&c);
	CHECK(ev_appears(info_rsp_to_clt, NULL, "the information response"));
	/* The host's key as it was, a controller secret added: a change of its keys. */
	f = fopen(srv.keys_path, "w");
	CHECK(f != NULL);
	if (f) {
		fprintf(f, "%s %s %s\n", HOST_NQN, KEY_A, KEY_B);
		fclose(f);
	}
	CHECK_EQ(rtrs_srv_reload_keys(srv.ctx), 0);
	CHECK_EQ(fake_wait(reauth_delivered, NULL, "the request to authenticate again"), 0);
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), 0);
	CHECK_EQ(fake_wait(two_auths, NULL, "the re-authentication"), 0);
	CHECK_EQ(fake_advance(10000 + 1000), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 0, "connected"), "state %s", clt_path(&c, 0).state);
	CHECK_EQ(srv_stats().auth_ok, 2);
	CHECK(io_roundtrip(&c, 0, 77), "IO after the re-authentication");
	teardown(&c);
}

/* The server's key file: one line, host with key (and ctrl, a controller secret, if not NULL). */
static void keys_line(const char *host, const char *key, const char *ctrl)
{
	FILE *f = fopen(srv.keys_path, "w");

	CHECK(f != NULL);
	if (!f)
		return;
	fprintf(f, "%s %s %s\n", host, key, ctrl ? ctrl : "");
	fclose(f);
}

/* The server's key file: HOST_NQN with KEY_A and OTHER_NQN with KEY_B. */
static void keys_two_hosts(void)
{
	FILE *f = fopen(srv.keys_path, "w");

	CHECK(f != NULL);
	if (!f)
		return;
	fprintf(f, "%s %s\n%s %s\n", HOST_NQN, KEY_A, OTHER_NQN, KEY_B);
	fclose(f);
}

static bool info_req_to_srv(const struct fake_ev *ev, void *arg)
{
	(void)arg;
	return match(ev, &(struct m){ .dir = TO_SRV, .msg = MSG(RTRS_MSG_INFO_REQ) });
}

/*
 * The key file is reloaded while the host's first path is still in its
 * handshake, its keys already read: with revoke, the host is gone from
 * the file, else its key changed (the client keeps the old one). hold
 * says where the path waits: its information request (authenticated, its
 * session without a host yet), or its REPLY (the NEGOTIATE read the old
 * key, the proof is still to come). The reload's passes see only
 * connected paths; the path is refused at its information request
 * (-EAGAIN), and the open's next attempt, authenticated on the file of
 * now, fails for good. Without the key epoch the path connected on the
 * keys of before.
 */
static void reloaded_in_handshake(bool revoke, fake_pred hold, void *arg, const char *what)
{
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	fake_hold(hold, arg);
	clt_open_async(&c);
	CHECK(ev_appears(hold, arg, what));
	if (revoke)
		keys_line(OTHER_NQN, KEY_A, NULL);
	else
		keys_line(HOST_NQN, KEY_B, NULL);
	CHECK_EQ(rtrs_srv_reload_keys(srv.ctx), 0);
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c), -EKEYREJECTED);
	CHECK_EQ(fake_settle(), 0);
	CHECK(env_logged("authenticated with the key file as it was before a reload; refused"),
	      "the path that authenticated before the reload is refused");
	CHECK(env_logged(revoke ? "is not in" : "failed"), "the next attempt is refused");
	CHECK_EQ(srv_stats().auth_ok, 1);
	CHECK_EQ(srv_stats().auth_failed, 1);
	CHECK_EQ(atomic_load(&srv.link_up), 0);
	CHECK_EQ(srv_stats().sessions, 0);
	teardown(&c);
}

static void auth_revoked_in_handshake(void)
{
	reloaded_in_handshake(true, info_req_to_srv, NULL, "the information request");
}

static void auth_rotated_in_handshake(void)
{
	reloaded_in_handshake(false, match, &to_srv_reply, "the client's REPLY");
}

static struct m to_clt_reauth_req = { .dir = TO_CLT, .auth = AUTH(RTRS_AUTH_REAUTH) };

/* The server's SUCCESS1 and REAUTH to the client. */
static bool success_or_reauth(const struct fake_ev *ev, void *arg)
{
	(void)arg;
	return match(ev, &to_clt_success1) || match(ev, &to_clt_reauth_req);
}

/*
 * On the client's loop, as it sends the REPLY of the re-authentication
 * the first reload asked for (the NEGOTIATE was answered on the keys of
 * that reload): the key changes again and the file is reloaded; the REPLY
 * reaches the server, which answers SUCCESS1 and, as the transaction read
 * its keys before this reload, asks for another right behind it. Both
 * reach the client before its loop, held here, has taken the first.
 */
static void reply_posted(struct fake_ev *rep, void *arg)
{
	struct fake_ev *ok, *again;

	fake_hold(success_or_reauth, NULL);
	keys_line(HOST_NQN, KEY_B, NULL);
	CHECK_EQ(rtrs_srv_reload_keys(srv.ctx), 0);
	CHECK_EQ(fake_deliver(rep), 0);
	ok = fake_wait_ev(match, &to_clt_success1, "the SUCCESS1");
	again = fake_wait_ev(match, &to_clt_reauth_req, "the request to authenticate once more");
	if (ok)
		CHECK_EQ(fake_deliver(ok), 0);
	if (again)
		CHECK_EQ(fake_deliver(again), 0);
	atomic_store((atomic_bool *)arg, true);
	fake_notify();
}

static bool flag_set(void *arg)
{
	return atomic_load((atomic_bool *)arg);
}

/*
 * A key rotated twice on a connected path: the second reload comes while
 * the re-authentication the first asked for runs (reply_posted). The
 * second reload's request finds that transaction running and lets it be;
 * once it has completed, on the keys of before, the server asks again,
 * and the client takes SUCCESS1 and that request in turn (one message
 * waiting used to be all it allowed: it closed the path, -EPROTO, as
 * unexpected). Having only the old key, it is refused: the path closes
 * with "key rejected". Without the server's second request the path
 * stayed up on a key the file no longer has.
 */
static void auth_rotated_during_reauth(void)
{
	atomic_bool ran = false;
	struct clt c;

	if (!auth_setup(&c, KEY_A))
		return;
	CHECK_EQ(clt_open(&c), 0);
	if (!c.sess) {
		teardown(&c);
		return;
	}
	fake_on_post(match, &to_srv_reply, reply_posted, &ran);
	/* A controller secret added: the keys change, the client's proof stays good. */
	keys_line(HOST_NQN, KEY_A, KEY_B);
	CHECK_EQ(rtrs_srv_reload_keys(srv.ctx), 0);
	CHECK_EQ(fake_wait(flag_set, &ran, "the re-authentication on the first keys"), 0);
	fake_hold(NULL, NULL);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK_EQ(fake_settle(), 0);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	CHECK(!strcmp(clt_path(&c, 0).reconnect_verdict, "key rejected"), "verdict %s",
	      clt_path(&c, 0).reconnect_verdict);
	CHECK_EQ(srv_stats().auth_ok, 2);
	CHECK_EQ(srv_stats().auth_failed, 1);
	CHECK_EQ(env_log_count("key file changed: host"), 2);
	CHECK(!env_logged("unexpected authentication message"), "the client took both");
	teardown(&c);
}

/* Holds the server's first authentication step on its offload worker (rtrs_test_srv_auth_step). */
static struct {
	atomic_int steps;
	atomic_bool in;
	bool out;
	pthread_mutex_t lock;
	pthread_cond_t cond;
} step_hold = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void first_step_held(void)
{
	if (atomic_fetch_add(&step_hold.steps, 1))
		return;
	atomic_store(&step_hold.in, true);
	fake_notify();
	pthread_mutex_lock(&step_hold.lock);
	while (!step_hold.out)
		pthread_cond_wait(&step_hold.cond, &step_hold.lock);
	pthread_mutex_unlock(&step_hold.lock);
}

static bool first_step_in(void *arg)
{
	(void)arg;
	return atomic_load(&step_hold.in);
}

static void first_step_release(void)
{
	pthread_mutex_lock(&step_hold.lock);
	step_hold.out = true;
	pthread_cond_broadcast(&step_hold.cond);
	pthread_mutex_unlock(&step_hold.lock);
}

static bool srv_path_closed(void *arg)
{
	(void)arg;
	return env_logged(": path closed: ");
}

static bool clt_opened(void *arg)
{
	return atomic_load(&((struct clt *)arg)->opened);
}

static void flag_posted(struct fake_ev *ev, void *arg)
{
	atomic_store((atomic_bool *)arg, true);
	fake_unclaim(ev);
}

/*
 * The path's connection 0 is cut while the server answers its NEGOTIATE
 * (the job held before the step, as by a slow key file or DH exchange).
 * The stop does not wait for the job: the path closes while it is held,
 * and the loop goes on serving (a key reload, another session's whole
 * open). The job, released, sends nothing on the stopped path (no
 * CHALLENGE), and only then is the path freed, with its session; the
 * client's next attempt opens. Before, srv_path_stop waited for the job
 * (offload_cancel) on the loop, every session's stalled behind it.
 */
static void auth_stop_while_answering(void)
{
	struct m challenge_s = { .dir = TO_CLT, .sess = "s", .auth = AUTH(RTRS_AUTH_CHALLENGE) };
	atomic_bool challenged = false;
	struct fake_ev *neg;
	struct clt c, t;
	bool closed;

	if (!auth_setup(&c, KEY_A))
		return;
	clt_init(&t, "t", "a");
	t.o.auth_secret = KEY_A;
	atomic_store(&step_hold.steps, 0);
	atomic_store(&step_hold.in, false);
	step_hold.out = false;
	atomic_store(&rtrs_test_srv_auth_step, first_step_held);
	neg = open_step_to(&c, match, &to_srv_negotiate, "the client's NEGOTIATE");
	fake_on_post(match, &challenge_s, flag_posted, &challenged);
	if (neg)
		CHECK_EQ(fake_deliver(neg), 0);
	CHECK_EQ(fake_wait(first_step_in, NULL, "the NEGOTIATE being answered"), 0);
	CHECK_EQ(fake_fail("s", NULL, 0, -ECONNRESET, -ECONNRESET), 1);
	/* Not fake_settle: nothing settles while the job is held. */
	fake_hold(NULL, NULL);
	closed = !fake_wait(srv_path_closed, NULL, "the server's path to close");
	CHECK(closed, "the path closed while its authentication job runs");
	if (closed) {
		CHECK_EQ(rtrs_srv_reload_keys(srv.ctx), 0);
		clt_open_async(&t);
		CHECK_EQ(fake_wait(clt_opened, &t, "another session's open"), 0);
		CHECK_EQ(env_log_count("path freed"), 0);
		CHECK_EQ(srv_stats().sessions, 2);
	}
	first_step_release();
	CHECK_EQ(fake_settle(), 0);
	CHECK(!atomic_load(&challenged), "nothing sent on the stopped path");
	fake_on_post(NULL, NULL, NULL, NULL);
	atomic_store(&rtrs_test_srv_auth_step, NULL);
	CHECK_EQ(env_log_count("path freed"), 1);
	CHECK_EQ(srv_stats().sessions, 1);
	CHECK_EQ(clt_open_join(&t), 0);
	CHECK_EQ(clt_open_join(&c), 0);
	CHECK(c.sess && io_roundtrip(&c, 0, 88), "IO of the next attempt");
	CHECK(t.sess && io_roundtrip(&t, LEN, 89), "IO of the other session");
	clt_close(&t);
	teardown(&c);
}

/* ---- admission ---------------------------------------------------------------------------------- */

static bool accept_of(const struct fake_ev *ev, void *arg)
{
	return ev->kind == FAKE_ACCEPT && !strcmp(ev->sess, arg);
}

/* The answers to sessions p0 and p1 (pending_three). */
static bool to_p0_p1(const struct fake_ev *ev, void *arg)
{
	return !ev->to_server && (!strcmp(ev->sess, "p0") || !strcmp(ev->sess, "p1"));
}

static bool refused_busy(void *arg)
{
	return env_logged("too many connections still to prove themselves (Device or resource busy)");
}

/* How far the test clock must move for a pending path to count as stalled. */
#define STALL_MS (RTRS_DEFAULT_HANDSHAKE_TIMEOUT_MS / 4 + 1)

/*
 * Three sessions from hosts srcs[i], with limits that allow two pending
 * paths in their scope. p0 and p1 get their connection 0 accepted and
 * wait (the server's answers to them are held). p2 finds both
 * progressing: it is refused (EBUSY), nothing of theirs is cut, and its
 * open tries again. Once both have made no step for a quarter of the
 * handshake timeout (the test clock moves), p2's next attempt closes the
 * older, p0, and opens. p0's open, dropped after the server had answered
 * it, tries again too: all three open and move data.
 */
static void pending_three(const char *const srcs[3], unsigned max_pending, unsigned per_peer)
{
	static const char *const names[3] = { "p0", "p1", "p2" };
	struct rtrs_srv_opts so;
	struct clt c[3];

	srv_opts(&so);
	so.max_pending = max_pending;
	so.max_pending_per_peer = per_peer;
	if (!srv_up(&so))
		return;
	fake_hold(to_p0_p1, NULL);
	for (int i = 0; i < 3; i++) {
		clt_init(&c[i], names[i], "a");
		clt_src(&c[i], 0, srcs[i]);
	}
	for (int i = 0; i < 2; i++) {
		clt_open_async(&c[i]);
		CHECK(ev_appears(accept_of, (void *)names[i], "the accept"));
	}
	clt_open_async(&c[2]);
	CHECK_EQ(fake_wait(refused_busy, NULL, "p2 refused while p0 and p1 progress"), 0);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK_EQ(fake_advance(STALL_MS), 0);
	CHECK_EQ(clt_open_join(&c[2]), 0);
	CHECK_EQ(srv_stats().pending_evicted, 1);
	CHECK(env_logged("closed to make room for a new connection from"), "the eviction is logged");
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c[1]), 0);
	CHECK_EQ(clt_open_join(&c[0]), 0);
	CHECK(env_logged("p0/a:1234: the server dropped the path"), "p0 tried again");
	for (int i = 0; i < 3; i++)
		CHECK(io_roundtrip(&c[i], (uint32_t)i * LEN, (uint8_t)(70 + i)), "IO of %s", names[i]);
	for (int i = 0; i < 3; i++)
		clt_close(&c[i]);
	CHECK_EQ(srv_stats().pending_evicted, 1);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

static void pending_per_peer(void)
{
	static const char *const srcs[3] = { "h1", "h1", "h1" };

	pending_three(srcs, 32, 2);
}

static void pending_total(void)
{
	static const char *const srcs[3] = { "h1", "h2", "h3" };

	pending_three(srcs, 2, 8);
}

static bool proven_hold(const struct fake_ev *ev, void *arg)
{
	return (!strcmp(ev->sess, "v0") && match(ev, &(struct m){ .dir = TO_SRV,
								    .msg = MSG(RTRS_MSG_INFO_REQ) })) ||
	       (!strcmp(ev->sess, "v1") && match(ev, &to_srv_negotiate));
}

static bool info_req_of_v0(const struct fake_ev *ev, void *arg)
{
	return proven_hold(ev, arg) && !strcmp(ev->sess, "v0");
}

static bool negotiate_of_v1(const struct fake_ev *ev, void *arg)
{
	return proven_hold(ev, arg) && !strcmp(ev->sess, "v1");
}

/*
 * One pending path per peer, with authentication. v0's host (another
 * host than v1's and v2's: one of their own proven paths would count
 * against their host's limit, also max_pending_per_peer, and go once
 * stalled for v2, pending_held_per_host) has proven itself and v0 waits
 * before its information request: not pending any more, so v1 from the
 * same peer is let in without closing it. v1 waits
 * before authenticating: pending and progressing, so v2 is refused and
 * tries again; once v1 has stalled, v2 closes it, never v0, and opens.
 * v0 finishes; v1, dropped, tries again and opens too.
 */
static void pending_proven_host(void)
{
	static const char *const names[3] = { "v0", "v1", "v2" };
	struct rtrs_srv_opts so;
	struct clt c[3];

	srv_opts_auth(&so, KEY_A);
	so.max_pending_per_peer = 1;
	if (!srv_up(&so))
		return;
	keys_two_hosts();
	fake_hold(proven_hold, NULL);
	for (int i = 0; i < 3; i++) {
		clt_init(&c[i], names[i], "a");
		clt_src(&c[i], 0, "h1");
		c[i].o.auth_secret = KEY_A;
	}
	c[0].o.auth_host_name = OTHER_NQN;
	c[0].o.auth_secret = KEY_B;
	clt_open_async(&c[0]);
	CHECK(ev_appears(info_req_of_v0, NULL, "v0's information request"));
	clt_open_async(&c[1]);
	CHECK(ev_appears(negotiate_of_v1, NULL, "v1's NEGOTIATE"));
	CHECK_EQ(srv_stats().pending_evicted, 0);
	clt_open_async(&c[2]);
	CHECK_EQ(fake_wait(refused_busy, NULL, "v2 refused while v1 progresses"), 0);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK_EQ(fake_advance(STALL_MS), 0);
	CHECK_EQ(clt_open_join(&c[2]), 0);
	CHECK_EQ(srv_stats().pending_evicted, 1);
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c[0]), 0);
	CHECK_EQ(clt_open_join(&c[1]), 0);
	CHECK(env_logged("v1/a:1234: the server dropped the path"), "v1 tried again");
	CHECK(c[0].sess && io_roundtrip(&c[0], 0, 81), "IO of v0");
	CHECK(c[1].sess && io_roundtrip(&c[1], 2 * LEN, 83), "IO of v1");
	CHECK(c[2].sess && io_roundtrip(&c[2], LEN, 82), "IO of v2");
	for (int i = 0; i < 3; i++)
		clt_close(&c[i]);
	CHECK_EQ(srv_stats().auth_ok, 3);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/* The information requests of the sessions named in arg (a NULL-ended list), held. */
static bool info_req_of(const struct fake_ev *ev, void *arg)
{
	if (!match(ev, &(struct m){ .dir = TO_SRV, .msg = MSG(RTRS_MSG_INFO_REQ) }))
		return false;
	for (const char *const *n = arg; *n; n++)
		if (!strcmp(ev->sess, *n))
			return true;
	return false;
}

static const char *const held_a01[] = { "a0", "a1", NULL };

static bool info_req_a0(const struct fake_ev *ev, void *arg)
{
	return info_req_of(ev, (void *)held_a01) && !strcmp(ev->sess, "a0");
}

static bool info_req_a1(const struct fake_ev *ev, void *arg)
{
	return info_req_of(ev, (void *)held_a01) && !strcmp(ev->sess, "a1");
}

static bool logged(void *arg)
{
	return env_logged(arg);
}

static bool two_held_refusals(void *arg)
{
	return env_log_count("holds 2 paths not connected yet") >= 2;
}

/*
 * A host with a key holds paths proven but not connected: each may hold
 * many connections until connect_timeout_ms, and make a session. At most
 * max_sessions_per_peer (2 here) of one host, from whatever addresses:
 * a0 and a1 (host A, from h1 and h2) wait before their information
 * requests; another host's session (b0) opens and moves data meanwhile,
 * and holds the only chunk memory (A's paths in their handshake have
 * none). A's third and fourth paths, from addresses of their own, are
 * refused when their host proves itself (-EBUSY at their next connection
 * request, no DNR), and none of a0, a1 is cut: once they are let go a0
 * and a1 open and move data, while a2 and a3, at their host's session
 * limit then, give up. Before, A's paths were not counted once proven:
 * a2 and a3 came in too (and mapped their chunks), and so would any
 * number more.
 */
static void pending_held_per_host(void)
{
	struct rtrs_srv_opts so;
	struct clt a[4], b;
	const size_t sess_bytes = 16 * 16384;

	srv_opts_auth(&so, KEY_A);
	so.max_sessions_per_peer = 2;
	so.max_chunk_mem = 5 * sess_bytes;
	if (!srv_up(&so))
		return;
	keys_two_hosts();
	fake_hold(info_req_of, (void *)held_a01);
	static const char *const names[4] = { "a0", "a1", "a2", "a3" };
	static const char *const srcs[4] = { "h1", "h2", "h3", "h4" };

	for (int i = 0; i < 4; i++) {
		clt_init(&a[i], names[i], "a");
		clt_src(&a[i], 0, srcs[i]);
		a[i].o.auth_secret = KEY_A;
	}
	clt_init(&b, "b0", "a");
	clt_src(&b, 0, "h9");
	b.o.auth_host_name = OTHER_NQN;
	b.o.auth_secret = KEY_B;
	clt_open_async(&a[0]);
	CHECK(ev_appears(info_req_a0, NULL, "a0's information request"));
	clt_open_async(&a[1]);
	CHECK(ev_appears(info_req_a1, NULL, "a1's information request"));
	/*
	 * Another host is not held to A's share. Its open needs no timer: the
	 * test clock stays (clt_open would move it, and a0's and a1's info
	 * exchanges, held, would time out).
	 */
	clt_open_async(&b);
	CHECK_EQ(fake_wait(clt_opened, &b, "b0's open"), 0);
	CHECK_EQ(clt_open_join(&b), 0);
	CHECK(b.sess && io_roundtrip(&b, 0, 61), "IO of the other host's session");
	CHECK_EQ(srv_stats().chunk_bytes, sess_bytes);
	clt_open_async(&a[2]);
	clt_open_async(&a[3]);
	CHECK_EQ(fake_wait(two_held_refusals, NULL, "a2 and a3 refused at their host's proof"), 0);
	/*
	 * At its connection 1's request, or at its information request if
	 * that one came before the loop took the proof: busy either way.
	 */
	CHECK_EQ(fake_wait(logged, (char *)"a2/a:1234: the server refused the path (Device or "
			   "resource busy)", "a2 told busy"), 0);
	CHECK_EQ(fake_wait(logged, (char *)"a3/a:1234: the server refused the path (Device or "
			   "resource busy)", "a3 told busy"), 0);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK_EQ(srv_stats().chunk_bytes, sess_bytes);
	CHECK(io_roundtrip(&b, LEN, 62), "the other host's IO goes on");
	fake_hold(NULL, NULL);
	for (int i = 0; i < 4; i++) {
		int rc = clt_open_join(&a[i]);

		if (i < 2)
			CHECK_EQ(rc, 0);
		else
			CHECK(rc == -EBUSY || rc == -ENOSPC, "a%d: %s", i, strerror(-rc));
	}
	for (int i = 0; i < 2; i++)
		CHECK(a[i].sess && io_roundtrip(&a[i], (uint32_t)(i + 2) * LEN, (uint8_t)(63 + i)),
		      "IO of a%d", i);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK_EQ(srv_stats().chunk_bytes, 3 * sess_bytes);
	for (int i = 0; i < 4; i++)
		clt_close(&a[i]);
	clt_close(&b);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

static const char *const held_s1[] = { "s1", NULL };

static bool held_session_refused(void *arg)
{
	return env_logged("has 2 sessions already, those in their handshake counted");
}

/*
 * Sessions of one host, those in their handshake counted (two allowed):
 * s0 is connected, s1's path is proven and waits before its information
 * request (it took the host's second place). s2 is refused when its host
 * proves itself (-ENOSPC at its next connection request, no DNR: it
 * tries RTRS_OPEN_TRIES times), while another host opens. Once s1 is let
 * go it opens (its place was taken at the proof), s2 stays refused. Before,
 * s2 was named first (one named session then) and opened, and s1 was
 * refused at its information request.
 */
static void sessions_held_per_host(void)
{
	struct rtrs_srv_opts so;
	struct clt c[3], b;

	srv_opts_auth(&so, KEY_A);
	so.max_sessions_per_peer = 2;
	if (!srv_up(&so))
		return;
	keys_two_hosts();
	static const char *const names[3] = { "s0", "s1", "s2" };

	for (int i = 0; i < 3; i++) {
		clt_init(&c[i], names[i], "a");
		clt_src(&c[i], 0, i == 2 ? "h2" : "h1");
		c[i].o.auth_secret = KEY_A;
		c[i].o.reconnect_delay_ms = 0;
	}
	clt_init(&b, "b0", "a");
	clt_src(&b, 0, "h9");
	b.o.auth_host_name = OTHER_NQN;
	b.o.auth_secret = KEY_B;
	CHECK_EQ(clt_open(&c[0]), 0);
	fake_hold(info_req_of, (void *)held_s1);
	clt_open_async(&c[1]);
	CHECK(ev_appears(info_req_of, (void *)held_s1, "s1's information request"));
	clt_open_async(&c[2]);
	CHECK_EQ(fake_wait(held_session_refused, NULL, "s2 refused at its host's proof"), 0);
	CHECK_EQ(fake_wait(logged, (char *)"s2/a:1234: the server refused the path (No space left "
			   "on device)", "s2 told"), 0);
	clt_open_async(&b);
	CHECK_EQ(fake_wait(clt_opened, &b, "b0's open"), 0);
	CHECK_EQ(clt_open_join(&b), 0);
	CHECK(b.sess && io_roundtrip(&b, 0, 71), "IO of the other host's session");
	fake_hold(NULL, NULL);
	CHECK_EQ(clt_open_join(&c[1]), 0);
	CHECK_EQ(clt_open_join(&c[2]), -ENOSPC);
	CHECK_EQ(srv_stats().limit_refusals, RTRS_OPEN_TRIES);
	for (int i = 0; i < 2; i++)
		CHECK(c[i].sess && io_roundtrip(&c[i], (uint32_t)(i + 1) * LEN, (uint8_t)(72 + i)),
		      "IO of s%d", i);
	for (int i = 0; i < 3; i++)
		clt_close(&c[i]);
	clt_close(&b);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

static bool busy_or_evicted(void *arg)
{
	return refused_busy(arg) || env_logged("closed to make room for a new connection from");
}

static bool takeover_waits(void *arg)
{
	(void)arg;
	return env_logged("is still held by this host's previous session");
}

/*
 * One pending path per peer. A client restarts: its successor's path
 * ("t" again, a new session) waits at its information request for the
 * session its predecessor left, still connected, longer than a stall.
 * That wait is the server's, and the takeover polls count as steps: a
 * newcomer from the same address ("u") is refused busy, not given the
 * successor's place. Once the predecessor is gone the successor takes
 * the name over, and "u" comes in on a later try. Without the polls
 * counting, the successor was closed as stalled.
 */
static void pending_takeover_wait(void)
{
	static const char *const names[3] = { "t", "t", "u" };
	struct rtrs_srv_opts so;
	struct clt c[3];

	srv_opts(&so);
	so.max_pending_per_peer = 1;
	if (!srv_up(&so))
		return;
	for (int i = 0; i < 3; i++) {
		clt_init(&c[i], names[i], "a");
		clt_src(&c[i], 0, "h1");
	}
	CHECK_EQ(clt_open(&c[0]), 0);
	clt_open_async(&c[1]);
	CHECK_EQ(fake_wait(takeover_waits, NULL, "the successor waiting for its predecessor"), 0);
	/* Its first poll armed (the line is logged before), then past a stall. */
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(fake_advance(STALL_MS), 0);
	clt_open_async(&c[2]);
	CHECK_EQ(fake_wait(busy_or_evicted, NULL, "u's admission"), 0);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK(refused_busy(NULL), "u refused while the successor waits");
	clt_close(&c[0]);
	CHECK_EQ(clt_open_join(&c[1]), 0);
	CHECK_EQ(clt_open_join(&c[2]), 0);
	CHECK(env_logged("session t taken over after"), "the successor took the name over");
	CHECK(c[1].sess && io_roundtrip(&c[1], 0, 84), "IO of the successor");
	CHECK(c[2].sess && io_roundtrip(&c[2], LEN, 85), "IO of u");
	for (int i = 0; i < 3; i++)
		clt_close(&c[i]);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/* Holds the offload worker that answers a path's NEGOTIATE inside its send of the CHALLENGE. */
struct worker_hold {
	atomic_bool in;
	bool out;
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

static void challenge_posted(struct fake_ev *ev, void *arg)
{
	struct worker_hold *h = arg;

	atomic_store(&h->in, true);
	fake_notify();
	pthread_mutex_lock(&h->lock);
	while (!h->out)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
	fake_unclaim(ev);
}

static bool worker_held(void *arg)
{
	return atomic_load(&((struct worker_hold *)arg)->in);
}

static void worker_release(struct worker_hold *h)
{
	pthread_mutex_lock(&h->lock);
	h->out = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

/*
 * One pending path per peer, with authentication. w0's NEGOTIATE is being
 * answered (the offload worker is held in it, as by a slow DH exchange)
 * for longer than a stall: the wait is the server's, and a newcomer from
 * the same address, w1, is refused busy instead of closing w0. Both open
 * once the worker goes on. Without it, w0 was closed as stalled.
 */
static void pending_auth_busy(void)
{
	struct worker_hold h = { .lock = PTHREAD_MUTEX_INITIALIZER,
				 .cond = PTHREAD_COND_INITIALIZER };
	struct m challenge_w0 = { .dir = TO_CLT, .sess = "w0", .auth = AUTH(RTRS_AUTH_CHALLENGE) };
	struct rtrs_srv_opts so;
	struct clt c[2];

	srv_opts_auth(&so, KEY_A);
	so.max_pending_per_peer = 1;
	if (!srv_up(&so))
		return;
	for (int i = 0; i < 2; i++) {
		clt_init(&c[i], i ? "w1" : "w0", "a");
		clt_src(&c[i], 0, "h1");
		c[i].o.auth_secret = KEY_A;
	}
	fake_on_post(match, &challenge_w0, challenge_posted, &h);
	clt_open_async(&c[0]);
	CHECK_EQ(fake_wait(worker_held, &h, "w0's NEGOTIATE being answered"), 0);
	/* Not fake_advance: nothing settles while the worker is held. */
	loop_test_advance(STALL_MS);
	clt_open_async(&c[1]);
	CHECK_EQ(fake_wait(busy_or_evicted, NULL, "w1's admission"), 0);
	worker_release(&h);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK(refused_busy(NULL), "w1 refused while w0's NEGOTIATE is answered");
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK_EQ(clt_open_join(&c[0]), 0);
	CHECK_EQ(clt_open_join(&c[1]), 0);
	CHECK(c[0].sess && io_roundtrip(&c[0], 0, 86), "IO of w0");
	CHECK(c[1].sess && io_roundtrip(&c[1], LEN, 87), "IO of w1");
	for (int i = 0; i < 2; i++)
		clt_close(&c[i]);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/* Connections of a client that sends connection requests and nothing else. */
struct raw {
	struct fab *f;
	struct fab_con *fc[RTRS_MAX_PATHS + 1];
	unsigned n;
};

static void raw_nop(void *priv) {}
static void raw_connected(void *priv, const void *data, size_t len) {}
static void raw_down(void *priv, int err, const void *data, size_t len) {}
static void raw_imm(void *priv, uint32_t imm) {}
static void raw_recv(void *priv, void *buf, size_t len) {}
static void raw_done(void *priv, void *ctx) {}

static const struct fab_con_ops raw_ops = {
	.connected = raw_connected, .down = raw_down, .imm = raw_imm, .recv = raw_recv,
	.done = raw_done, .kick = raw_nop,
};

/* Connection 0 of a new path (uuid n + 1) of the session whose uuid is all 0x5a. */
static int raw_path(struct raw *r)
{
	struct fab_con_cfg cfg = { .ops = &raw_ops, .name = "raw#0", .tx_depth = 4 };
	struct rtrs_conn_req req = { .cid = 0, .cid_num = 2, .first_conn = true, .ext = true,
				     .fence = true };
	struct rtrs_msg_conn_req msg;

	memset(req.paths_uuid, 0x5a, sizeof(req.paths_uuid));
	memcpy(req.sess_uuid, &(uint32_t){ r->n + 1 }, sizeof(uint32_t));
	rtrs_conn_req_encode(&msg, &req);
	return fab_con_connect(r->f, &cfg, &msg, sizeof(msg), &r->fc[r->n++]);
}

/*
 * A session with RTRS_MAX_PATHS paths, all pending and stalled, at a
 * pending limit of as many: a newcomer path of that session is refused
 * (too many paths) without closing any of them. Admission used to close
 * the oldest to make room first, then refuse the newcomer anyway.
 */
static void pending_full_session(void)
{
	struct rtrs_srv_opts so;
	struct raw r = { 0 };
	char port[16];

	srv_opts(&so);
	so.max_pending = RTRS_MAX_PATHS;
	so.max_pending_per_peer = RTRS_MAX_PATHS;
	if (!srv_up(&so))
		return;
	snprintf(port, sizeof(port), "%d", srv.port);
	CHECK_EQ(fab_open("fake", "h1", "a", port, false, 16, &r.f), 0);
	for (unsigned i = 0; r.f && i < RTRS_MAX_PATHS; i++)
		CHECK_EQ(raw_path(&r), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().sessions, 1);
	CHECK_EQ(srv_stats().rejects, 0);
	CHECK_EQ(fake_advance(STALL_MS), 0);
	if (r.f)
		CHECK_EQ(raw_path(&r), 0);
	CHECK_EQ(fake_settle(), 0);
	CHECK(env_logged("too many paths in the session"), "the newcomer is refused");
	CHECK_EQ(srv_stats().rejects, 1);
	CHECK_EQ(srv_stats().pending_evicted, 0);
	CHECK(!env_logged("closed to make room"), "no path was closed for it");
	for (unsigned i = 0; i < r.n; i++)
		if (r.fc[i])
			fab_con_destroy(r.fc[i]);
	CHECK_EQ(fake_settle(), 0);
	fab_close(r.f);
	srv_stop();
}

static bool first_connreq_of_m1(const struct fake_ev *ev, void *arg)
{
	return ev->kind == FAKE_CONNREQ && ev->cid == 0 && !strcmp(ev->sess, "m1");
}

/*
 * Counts the attempts of m1. Each comes after the server has taken the
 * refused path of the attempt before down: the open's next try waits for
 * a timer of the test clock, which clt_open_join moves on only once
 * everything has settled. (Over a network the new request can overtake
 * the old connection's close, and the server then refuses it for that,
 * -EAGAIN, the path is still open here, instead of for the session limit.)
 */
static void after_the_last_close(struct fake_ev *ev, void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
	fake_on_post(first_connreq_of_m1, NULL, after_the_last_close, arg);
	fake_unclaim(ev);
}

/*
 * One session allowed: a second is refused with -ENOSPC, which may change,
 * so the open tries RTRS_OPEN_TRIES times (its delay set to nothing), each
 * refused.
 */
static void max_sessions(void)
{
	struct rtrs_srv_opts so;
	atomic_int attempts = 0;
	struct clt c0, c1;

	srv_opts(&so);
	so.max_sessions = 1;
	if (!srv_up(&so))
		return;
	clt_init(&c0, "m0", "a");
	CHECK_EQ(clt_open(&c0), 0);
	clt_init(&c1, "m1", "a");
	c1.o.reconnect_delay_ms = 0;
	fake_on_post(first_connreq_of_m1, NULL, after_the_last_close, &attempts);
	CHECK_EQ(clt_open(&c1), -ENOSPC);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK_EQ(atomic_load(&attempts), RTRS_OPEN_TRIES);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().limit_refusals, RTRS_OPEN_TRIES);
	CHECK(c0.sess && io_roundtrip(&c0, 0, 91), "the first session's IO goes on");
	clt_close(&c0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

/*
 * One session per peer: a second session from the same address is refused
 * (-ENOSPC, tried RTRS_OPEN_TRIES times), one from another address comes
 * in. With authentication the peer is the host name it proved: a session
 * of the same host from another address is refused.
 */
static void sessions_per_peer(bool auth)
{
	static const char *const srcs[3] = { "h1", "h1", "h2" };
	static const char *const names[3] = { "q0", "q1", "q2" };
	struct rtrs_srv_opts so;
	struct clt c[3];

	if (auth)
		srv_opts_auth(&so, KEY_A);
	else
		srv_opts(&so);
	so.max_sessions_per_peer = 1;
	if (!srv_up(&so))
		return;
	for (int i = 0; i < 3; i++) {
		clt_init(&c[i], names[i], "a");
		clt_src(&c[i], 0, auth && i == 1 ? "h3" : srcs[i]);
		c[i].o.reconnect_delay_ms = 0;
		if (auth)
			c[i].o.auth_secret = KEY_A;
	}
	CHECK_EQ(clt_open(&c[0]), 0);
	CHECK_EQ(clt_open(&c[1]), -ENOSPC);
	CHECK_EQ(srv_stats().limit_refusals, RTRS_OPEN_TRIES);
	CHECK(env_logged(auth ? "refused: host " : "refused: address h1 has 1 sessions already "
		"(max_sessions_per_peer)"), "the refusal names the peer and the limit");
	/* Another host (without authentication: address) is not held to the first's share. */
	if (!auth) {
		CHECK_EQ(clt_open(&c[2]), 0);
		CHECK(c[2].sess && io_roundtrip(&c[2], LEN, 93), "the other peer's IO");
	}
	CHECK(c[0].sess && io_roundtrip(&c[0], 0, 92), "the first session's IO goes on");
	for (int i = 0; i < 3; i++)
		clt_close(&c[i]);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

static void max_sessions_per_peer(void)
{
	sessions_per_peer(false);
}

static void max_sessions_per_host(void)
{
	sessions_per_peer(true);
}

/* More connections per path than the server allows: refused, do not retry, one request. */
static void too_many_cons(void)
{
	struct rtrs_srv_opts so;
	struct clt c;

	srv_opts(&so);
	so.max_cons_per_path = 2;
	if (!srv_up(&so))
		return;
	clt_init(&c, "s", "a");
	c.o.nr_io_cons = 2;
	CHECK_EQ(clt_open(&c), -EINVAL);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(srv_stats().rejects, 1);
	CHECK_EQ(srv_stats().sessions, 0);
	srv_stop();
}

static bool reject_at_clt(const struct fake_ev *ev, void *arg)
{
	return ev->kind == FAKE_REJECT;
}

/*
 * Every reject arrives without its private data, as over tcp when the
 * provider closes the socket right after sending it (seen in 2 of 12
 * rejects): the client learns only "refused". Counts them and stays armed.
 */
static void reason_lost(struct fake_ev *ev, void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
	CHECK_EQ(fake_rewrite(ev, NULL, 0), 0);
	fake_on_post(reject_at_clt, NULL, reason_lost, arg);
	fake_unclaim(ev);
}

/*
 * A final refusal must not depend on a reject's private data arriving.
 * The server refuses a path with more connections than it allows (-EINVAL,
 * do not retry) while every reject loses its data on the way: the verdict
 * still reaches the client, whose open fails with it (-EINVAL). Sent as a
 * plain reject, the client saw a bare refusal (-ECONNREFUSED).
 */
static void final_refusal_without_reject_data(void)
{
	struct rtrs_srv_opts so;
	atomic_int lost = 0;
	struct clt c;

	srv_opts(&so);
	so.max_cons_per_path = 2;
	if (!srv_up(&so))
		return;
	clt_init(&c, "s", "a");
	c.o.nr_io_cons = 2;
	c.o.reconnect_delay_ms = 0;
	fake_on_post(reject_at_clt, NULL, reason_lost, &lost);
	CHECK_EQ(clt_open(&c), -EINVAL);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, 1);
	CHECK_EQ(srv_stats().rejects, 1);
	CHECK_EQ(atomic_load(&lost), 0);
	CHECK_EQ(srv_stats().sessions, 0);
	srv_stop();
}

/*
 * The same on a reconnect, where a bare refusal is retried: a session is
 * up; its server is replaced by one that allows fewer connections per
 * path. The reconnect is refused (do not retry) while every reject loses
 * its data; the path closes with the verdict and asks no more however long
 * the clock runs. Sent as a plain reject, it asked again every delay.
 */
static void final_refusal_on_reconnect_without_reject_data(void)
{
	struct rtrs_srv_opts so;
	atomic_int lost = 0;
	uint64_t reqs;
	struct clt c;

	srv_opts(&so);
	if (!srv_up(&so))
		return;
	clt_init(&c, "s", "a");
	c.o.nr_io_cons = 2;
	CHECK_EQ(clt_open(&c), 0);
	if (!c.sess) {
		srv_stop();
		return;
	}
	srv_stop();
	CHECK_EQ(fake_settle(), 0);
	so.max_cons_per_path = 2;
	if (!srv_up(&so)) {
		clt_close(&c);
		return;
	}
	fake_on_post(reject_at_clt, NULL, reason_lost, &lost);
	CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	CHECK_EQ(fake_wait(path_closed, &c, "the refused reconnect"), 0);
	CHECK_EQ(fake_settle(), 0);
	reqs = srv_stats().connreqs;
	CHECK_EQ(reqs, 1);
	for (int i = 0; i < 10; i++)
		CHECK_EQ(fake_advance(RECONNECT_MS), 0);
	fake_on_post(NULL, NULL, NULL, NULL);
	CHECK_EQ(srv_stats().connreqs, reqs);
	CHECK_EQ(atomic_load(&lost), 0);
	CHECK_EQ(clt_path(&c, 0).last_error, -EINVAL);
	CHECK(clt_path_is(&c, 0, "closed"), "state %s", clt_path(&c, 0).state);
	CHECK(env_logged("not reconnecting (do not retry"), "the verdict is logged");
	CHECK_EQ(env_teardown(&c), 0);
}

/* The server's user refuses the session with -EACCES: final, one attempt (two connections). */
static void user_refuses(void)
{
	struct rtrs_srv_opts so;
	struct clt c;

	srv_opts(&so);
	if (!srv_up(&so))
		return;
	atomic_store(&srv.refuse, -EACCES);
	clt_init(&c, "s", "a");
	CHECK_EQ(clt_open(&c), -EACCES);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, 2);
	CHECK_EQ(atomic_load(&srv.link_up), 1);
	CHECK_EQ(srv_stats().sessions, 0);
	srv_stop();
}

/* A second session under a name in use: -EPERM, final. */
static void name_taken(void)
{
	struct rtrs_srv_opts so;
	struct clt c0, c1;

	srv_opts(&so);
	if (!srv_up(&so))
		return;
	clt_init(&c0, "dup", "a");
	CHECK_EQ(clt_open(&c0), 0);
	clt_init(&c1, "dup", "b");
	CHECK_EQ(clt_open(&c1), -EPERM);
	CHECK_EQ(fake_settle(), 0);
	CHECK_EQ(srv_stats().connreqs, 4);
	CHECK(env_logged("session name dup is already in use"), "logged");
	CHECK(c0.sess && io_roundtrip(&c0, 0, 93), "the first session's IO goes on");
	clt_close(&c0);
	CHECK_EQ(fake_settle(), 0);
	srv_stop();
}

static const struct scenario scenarios[] = {
	{ "auth_ok", auth_ok },
	{ "auth_success1_race", auth_success1_race },
	{ "auth_dup_negotiate", auth_dup_negotiate },
	{ "auth_dup_challenge", auth_dup_challenge },
	{ "auth_info_before_auth", auth_info_before_auth },
	{ "auth_cut_mid", auth_cut_mid },
	{ "auth_wrong_key", auth_wrong_key },
	{ "auth_no_key", auth_no_key },
	{ "auth_key_rotated", auth_key_rotated },
	{ "auth_reauth_during_info", auth_reauth_during_info },
	{ "auth_revoked_in_handshake", auth_revoked_in_handshake },
	{ "auth_rotated_in_handshake", auth_rotated_in_handshake },
	{ "auth_rotated_during_reauth", auth_rotated_during_reauth },
	{ "auth_stop_while_answering", auth_stop_while_answering },
	{ "pending_per_peer", pending_per_peer },
	{ "pending_total", pending_total },
	{ "pending_proven_host", pending_proven_host },
	{ "pending_held_per_host", pending_held_per_host },
	{ "sessions_held_per_host", sessions_held_per_host },
	{ "pending_takeover_wait", pending_takeover_wait },
	{ "pending_auth_busy", pending_auth_busy },
	{ "pending_full_session", pending_full_session },
	{ "max_sessions", max_sessions },
	{ "max_sessions_per_peer", max_sessions_per_peer },
	{ "max_sessions_per_host", max_sessions_per_host },
	{ "too_many_cons", too_many_cons },
	{ "final_refusal_without_reject_data", final_refusal_without_reject_data },
	{ "final_refusal_on_reconnect_without_reject_data",
	  final_refusal_on_reconnect_without_reject_data },
	{ "user_refuses", user_refuses },
	{ "name_taken", name_taken },
};

int main(int argc, char **argv)
{
	return fake_main(argc, argv, scenarios, ARRAY_SIZE(scenarios), "test-fake-auth");
}
