/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the DH-HMAC-CHAP transactions (lib/rtrs/rtrs-auth-sm.c).
 *
 * A host transaction and a server transaction are pumped against each other
 * in memory, the server reading a temporary key file: every hash and DH
 * group, the negotiation order, unidirectional and bidirectional
 * authentication, wrong and missing keys, key rotation; then the robustness
 * of both machines against messages in the wrong state, with a wrong
 * transaction id, truncated, with lengths that do not add up, with
 * parameters that were not offered and with degenerate DH values. All the
 * while a log sink collects every line (debug included), and at the end no
 * secret may be found in it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>

#include "check.h"
#include "ffdhe-prime.h"
#include "logcap.h"
#include "log.h"
#include "rtrs-auth-sm.h"
#include "util.h"

#define HOST "nqn.2014-08.org.nvmexpress:uuid:rtrs-test-host-1"
#define SERVER "nqn.2024-01.io.rtrs:test-server-1"

enum {
	NEG = RTRS_AUTH_NEGOTIATE,
	CHAL = RTRS_AUTH_CHALLENGE,
	REPLY = RTRS_AUTH_REPLY,
	S1 = RTRS_AUTH_SUCCESS1,
	S2 = RTRS_AUTH_SUCCESS2,
	F2 = RTRS_AUTH_FAILURE2,
	F1 = RTRS_AUTH_FAILURE1,
};

static const uint8_t all_ids[] = { NEG, CHAL, REPLY, S1, S2, F2, F1 };

/* Where the fields sit in a message as sent: the 8-byte envelope, then NVMe's. */
#define OFF_ENV_LEN 2
#define OFF_TID (8 + 4)
#define OFF_HL (8 + 6)
#define OFF_CVALID (8 + 8)     /* REPLY */
#define OFF_HASHID (8 + 8)     /* CHALLENGE */
#define OFF_DHVLEN (8 + 10)    /* CHALLENGE and REPLY */
#define OFF_DATA (8 + 16)      /* CHALLENGE and REPLY */

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static const char *msg_name(int id)
{
	switch (id) {
	case NEG: return "NEGOTIATE";
	case CHAL: return "CHALLENGE";
	case REPLY: return "REPLY";
	case S1: return "SUCCESS1";
	case S2: return "SUCCESS2";
	case F1: return "FAILURE1";
	case F2: return "FAILURE2";
	default: return "?";
	}
}

static const char *step_name(enum rtrs_auth_step s)
{
	return s == RTRS_AUTH_CONTINUE ? "continue" : s == RTRS_AUTH_DONE ? "done" :
	       s == RTRS_AUTH_FAILED ? "failed" : "?";
}

/* ---- secrets and the key file -------------------------------------------------- */

#define MAX_SECRETS 512

/* Every DHHC-1 string the test makes, to look for in the log at the end. */
static char secrets[MAX_SECRETS][RTRS_AUTH_KEY_STR_MAX];
static unsigned n_secrets;

static const char *tmpdir; /* test_tmpdir */
static char keys_path[256];
static char other_secret[RTRS_AUTH_KEY_STR_MAX];

static void die(const char *what)
{
	fprintf(stderr, "fatal: %s\n", what);
	exit(1);
}

/* A new random secret; its DHHC-1 string goes to str (if given) and the list. */
static void new_key(unsigned hmac, size_t len, struct rtrs_auth_key *k, char *str)
{
	char s[RTRS_AUTH_KEY_STR_MAX];

	if (rtrs_auth_key_generate(hmac, len, NULL, NULL, k) ||
	    rtrs_auth_key_format(k, s, sizeof(s)))
		die("cannot make a key");
	if (n_secrets == MAX_SECRETS)
		die("too many secrets");
	memcpy(secrets[n_secrets++], s, sizeof(s));
	if (str)
		memcpy(str, s, sizeof(s));
}

static void write_text(const char *path, const char *text)
{
	size_t len = strlen(text);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	if (fd < 0 || fchmod(fd, 0600) || write(fd, text, len) != (ssize_t)len || close(fd))
		die("cannot write the key file");
}

/* The key file: another host, then ours with its secret and maybe a controller secret. */
static void write_keys(const char *hsecret, const char *csecret)
{
	char text[1024];

	snprintf(text, sizeof(text),
		 "# rtrs test keys\n"
		 "nqn.2014-08.org.nvmexpress:uuid:someone-else %s\n"
		 "\n"
		 "%s %s%s%s\n",
		 other_secret, HOST, hsecret, csecret ? " " : "", csecret ? csecret : "");
	write_text(keys_path, text);
}

/* ---- the two transactions in memory ------------------------------------------- */

#define TR_MAX 12
#define MSG_CAP (RTRS_AUTH_MSG_MAX + 64)

struct msgbuf {
	uint8_t buf[MSG_CAP];
	size_t len;
	bool from_srv;
};

struct xchg {
	struct rtrs_auth_cfg hc, sc;        /* host, server */
	struct rtrs_auth_txn clt, srv;
	uint16_t tid;
	int begin_rc;
	enum rtrs_auth_step clt_res, srv_res;
	unsigned clt_steps, srv_steps;
	struct msgbuf tr[TR_MAX];          /* every message sent, in order */
	unsigned n, next;                  /* sent; next to deliver */
};

static uint16_t next_tid = 0x1230;

static void host_cfg(struct rtrs_auth_cfg *c, const char *hashes, const char *groups,
		     const struct rtrs_auth_key *hk, const struct rtrs_auth_key *ck)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "%s", HOST);
	snprintf(c->server, sizeof(c->server), "%s", SERVER);
	if (rtrs_auth_cfg_lists(c, hashes, groups, false, "test host"))
		die("host lists");
	if (hk)
		c->hkey = *hk;
	if (ck)
		c->ckey = *ck;
}

static void srv_cfg(struct rtrs_auth_cfg *c, const char *hashes, const char *groups)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "%s", SERVER);
	c->keys_file = keys_path;
	if (rtrs_auth_cfg_lists(c, hashes, groups, true, "test server"))
		die("server lists");
}

static struct xchg *xnew(void)
{
	struct xchg *x = calloc(1, sizeof(*x));

	if (!x)
		die("out of memory");
	return x;
}

/* Host begins (its NEGOTIATE is message 0), server waits. */
static void xstart(struct xchg *x)
{
	x->tid = next_tid++;
	x->n = x->next = 0;
	x->clt_steps = x->srv_steps = 0;
	x->tr[0].len = 0;
	x->begin_rc = rtrs_auth_clt_begin(&x->clt, &x->hc, "host-path", x->tid, x->tr[0].buf,
					  sizeof(x->tr[0].buf), &x->tr[0].len);
	x->clt_res = x->begin_rc ? RTRS_AUTH_FAILED : RTRS_AUTH_CONTINUE;
	if (!x->begin_rc && x->tr[0].len)
		x->n = 1;
	x->tr[0].from_srv = false;
	rtrs_auth_srv_begin(&x->srv, &x->sc, "srv-path");
	x->srv_res = RTRS_AUTH_CONTINUE;
}

static void xfree(struct xchg *x)
{
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	free(x);
}

/* One message to one side; what it answers is appended to the transcript. */
static enum rtrs_auth_step deliver(struct xchg *x, bool to_srv, const void *msg, size_t len)
{
	static uint8_t scratch[MSG_CAP];
	struct msgbuf *o = x->n < TR_MAX ? &x->tr[x->n] : NULL;
	uint8_t *out = o ? o->buf : scratch;
	size_t olen = 0xdeadbeef;
	enum rtrs_auth_step r;

	if (to_srv) {
		r = rtrs_auth_srv_step(&x->srv, msg, len, out, MSG_CAP, &olen);
		x->srv_res = r;
		x->srv_steps++;
	} else {
		r = rtrs_auth_clt_step(&x->clt, msg, len, out, MSG_CAP, &olen);
		x->clt_res = r;
		x->clt_steps++;
	}
	CHECK(olen <= MSG_CAP, "step wrote %zu bytes", olen);
	if (olen > MSG_CAP)
		olen = 0;
	CHECK(o || !olen, "transcript full");
	if (o && olen) {
		o->len = olen;
		o->from_srv = to_srv;
		x->n++;
	}
	return r;
}

/* Delivers what was sent, in order, until limit messages were delivered or nothing is left. */
static void pump(struct xchg *x, unsigned limit)
{
	while (x->next < x->n && x->next < limit) {
		struct msgbuf *m = &x->tr[x->next++];

		deliver(x, !m->from_srv, m->buf, m->len);
	}
}

static void run(struct xchg *x)
{
	pump(x, TR_MAX);
}

/* Decoded id of message i, -1 if there is none, -2 if it does not decode. */
static int msg_id(const struct xchg *x, unsigned i)
{
	struct rtrs_auth_msg m;

	if (i >= x->n)
		return -1;
	if (rtrs_auth_decode(x->tr[i].buf, x->tr[i].len, &m, NULL))
		return -2;
	return m.id;
}

static bool decode_msg(const struct xchg *x, unsigned i, struct rtrs_auth_msg *m)
{
	return i < x->n && !rtrs_auth_decode(x->tr[i].buf, x->tr[i].len, m, NULL);
}

static void tr_string(const struct xchg *x, char *s, size_t len)
{
	size_t o = 0;

	s[0] = '\0';
	for (unsigned i = 0; i < x->n && o < len; i++)
		o += (size_t)snprintf(s + o, len - o, "%s%s%s", i ? " " : "",
				      x->tr[i].from_srv ? "<" : ">", msg_name(msg_id(x, i)));
}

/* The transcript: the ids of the messages sent, in order. */
static void check_tr(int line, const char *what, const struct xchg *x, const int *ids)
{
	char got[256];
	unsigned n = 0;
	bool ok = true;

	while (ids[n] >= 0)
		n++;
	ok = x->n == n;
	for (unsigned i = 0; ok && i < n; i++)
		ok = msg_id(x, i) == ids[i];
	tr_string(x, got, sizeof(got));
	CHECK(ok, "line %d, %s: transcript %s (%u messages, want %u)", line, what, got, x->n, n);
}

#define CHECK_TR(what, x, ...) check_tr(__LINE__, what, x, (const int[]){ __VA_ARGS__, -1 })

/* How both ends finished. An err is checked only for a failed end. */
static void check_end(int line, const char *what, const struct xchg *x,
		      enum rtrs_auth_step clt_res, int clt_err, enum rtrs_auth_step srv_res,
		      int srv_err)
{
	CHECK(x->clt_res == clt_res, "line %d, %s: host %s, want %s (err %d, state %s)", line,
	      what, step_name(x->clt_res), step_name(clt_res), x->clt.err,
	      rtrs_auth_clt_state_str(x->clt.state));
	CHECK(x->srv_res == srv_res, "line %d, %s: server %s, want %s (err %d, state %s)", line,
	      what, step_name(x->srv_res), step_name(srv_res), x->srv.err,
	      rtrs_auth_srv_state_str(x->srv.state));
	if (clt_res == RTRS_AUTH_FAILED) {
		CHECK(x->clt.err == clt_err, "line %d, %s: host err %d, want %d", line, what,
		      x->clt.err, clt_err);
		CHECK(x->clt.state == AUTH_CLT_FAILED, "line %d, %s: host state %s", line, what,
		      rtrs_auth_clt_state_str(x->clt.state));
	} else if (clt_res == RTRS_AUTH_DONE) {
		CHECK(x->clt.state == AUTH_CLT_DONE && x->clt.err == 0,
		      "line %d, %s: host state %s err %d", line, what,
		      rtrs_auth_clt_state_str(x->clt.state), x->clt.err);
	}
	if (srv_res == RTRS_AUTH_FAILED) {
		CHECK(x->srv.err == srv_err, "line %d, %s: server err %d, want %d", line, what,
		      x->srv.err, srv_err);
		CHECK(x->srv.state == AUTH_SRV_FAILED, "line %d, %s: server state %s", line, what,
		      rtrs_auth_srv_state_str(x->srv.state));
	} else if (srv_res == RTRS_AUTH_DONE) {
		CHECK(x->srv.state == AUTH_SRV_DONE && x->srv.err == 0,
		      "line %d, %s: server state %s err %d", line, what,
		      rtrs_auth_srv_state_str(x->srv.state), x->srv.err);
	}
}

#define CHECK_END(what, x, cr, ce, sr, se) check_end(__LINE__, what, x, cr, ce, sr, se)
#define OK RTRS_AUTH_DONE
#define FAIL RTRS_AUTH_FAILED
#define CONT RTRS_AUTH_CONTINUE

/* Message i is a FAILURE1/2 of this transaction with this explanation. */
static void check_failure(int line, const char *what, const struct xchg *x, unsigned i, int id,
			  uint16_t tid, unsigned exp)
{
	struct rtrs_auth_msg m;

	if (!decode_msg(x, i, &m)) {
		CHECK(0, "line %d, %s: no message %u to decode", line, what, i);
		return;
	}
	CHECK(m.id == id && m.tid == tid && m.fail_exp == exp,
	      "line %d, %s: message %u is %s tid %u exp %u, want %s tid %u exp %u", line, what,
	      i, msg_name(m.id), m.tid, m.fail_exp, msg_name(id), tid, exp);
}

#define CHECK_FAIL_MSG(what, x, i, id, exp) check_failure(__LINE__, what, x, i, id, (x)->tid, exp)

/* ---- successful transactions ------------------------------------------------------ */

static const char *const hash_names[] = { NULL, "sha256", "sha384", "sha512" };

/* A successful exchange: both done, the same parameters on both sides and on the wire. */
static void check_success(int line, const char *what, const struct xchg *x, unsigned hash,
			  unsigned group, bool bidir)
{
	struct rtrs_auth_msg m;
	size_t hl = rtrs_auth_hash_len(hash), dl = rtrs_auth_dh_len(group);

	if (bidir)
		check_tr(line, what, x, (const int[]){ NEG, CHAL, REPLY, S1, S2, -1 });
	else
		check_tr(line, what, x, (const int[]){ NEG, CHAL, REPLY, S1, -1 });
	check_end(line, what, x, OK, 0, OK, 0);
	CHECK(x->clt.hash == hash && x->srv.hash == hash,
	      "line %d, %s: hash host %u server %u, want %u", line, what, x->clt.hash,
	      x->srv.hash, hash);
	CHECK(x->clt.group == group && x->srv.group == group,
	      "line %d, %s: group host %u server %u, want %u", line, what, x->clt.group,
	      x->srv.group, group);
	CHECK(x->clt.hl == hl && x->srv.hl == hl, "line %d, %s: hl", line, what);
	CHECK(x->clt.bidir == bidir && x->srv.bidir == bidir,
	      "line %d, %s: bidir host %d server %d, want %d", line, what, x->clt.bidir,
	      x->srv.bidir, bidir);
	CHECK(x->srv.host_ok, "line %d, %s: server did not mark the host ok", line, what);
	CHECK(!strcmp(x->srv.host, HOST), "line %d, %s: server saw host '%s'", line, what,
	      x->srv.host);
	if (group)
		CHECK(!memcmp(x->clt.ks, x->srv.ks, hl), "line %d, %s: session keys differ", line,
		      what);
	/* The wire says the same. */
	if (decode_msg(x, 1, &m))
		CHECK(m.hash == hash && m.group == group && m.hl == hl && m.dhvlen == dl &&
		      m.tid == x->tid && m.seq != 0,
		      "line %d, %s: CHALLENGE hash %u group %u hl %u dhvlen %u tid %u seq %u",
		      line, what, m.hash, m.group, m.hl, m.dhvlen, m.tid, m.seq);
	if (decode_msg(x, 2, &m))
		CHECK(m.hl == hl && m.dhvlen == dl && m.valid == bidir && m.tid == x->tid &&
		      m.seq != 0, "line %d, %s: REPLY hl %u dhvlen %u valid %d tid %u", line,
		      what, m.hl, m.dhvlen, m.valid, m.tid);
	if (decode_msg(x, 3, &m))
		CHECK(m.hl == hl && m.valid == bidir && m.tid == x->tid,
		      "line %d, %s: SUCCESS1 hl %u valid %d tid %u", line, what, m.hl, m.valid,
		      m.tid);
	if (bidir && decode_msg(x, 4, &m))
		CHECK(m.tid == x->tid, "line %d, %s: SUCCESS2 tid %u", line, what, m.tid);
}

#define CHECK_SUCCESS(what, x, h, g, b) check_success(__LINE__, what, x, h, g, b)

/* Every hash x every group, unidirectional and bidirectional; one side offers just that. */
static void test_matrix(void)
{
	static const size_t lens[] = { 32, 48, 64 };
	unsigned k = 0;

	for (unsigned hash = 1; hash <= 3; hash++) {
		for (unsigned group = 0; group < RTRS_AUTH_NR_DHGROUPS; group++) {
			for (unsigned mode = 0; mode < 4; mode++, k++) {
				bool bidir = mode & 1, host_restricts = mode & 2;
				char hs[RTRS_AUTH_KEY_STR_MAX], cs[RTRS_AUTH_KEY_STR_MAX];
				struct rtrs_auth_key hk, ck;
				struct xchg *x = xnew();
				char what[96];

				/* All key flavours: transform hash 0..3, 32/48/64 bytes. */
				new_key(k % 4, lens[k % 3], &hk, hs);
				new_key((k + 1) % 4, lens[(k + 1) % 3], &ck, cs);
				/* The file may list a controller secret that a one-way host ignores. */
				write_keys(hs, bidir || k % 3 == 0 ? cs : NULL);
				if (host_restricts) {
					host_cfg(&x->hc, hash_names[hash], rtrs_auth_dhgroup_name(group),
						 &hk, bidir ? &ck : NULL);
					srv_cfg(&x->sc, NULL, NULL);
				} else {
					host_cfg(&x->hc, NULL, NULL, &hk, bidir ? &ck : NULL);
					srv_cfg(&x->sc, hash_names[hash], rtrs_auth_dhgroup_name(group));
				}
				snprintf(what, sizeof(what), "%s/%s %s, %s offers only that",
					 hash_names[hash], rtrs_auth_dhgroup_name(group),
					 bidir ? "bidirectional" : "one-way",
					 host_restricts ? "host" : "server");
				xstart(x);
				CHECK_EQ(x->begin_rc, 0);
				run(x);
				CHECK_SUCCESS(what, x, hash, group, bidir);
				xfree(x);
			}
		}
	}
}

/* The server's preference order among what the host offers. */
static void test_preference(void)
{
	static const struct {
		const char *srv_hashes, *srv_groups, *host_hashes, *host_groups;
		unsigned hash, group;
	} rows[] = {
		{ "sha512,sha256", "null", "sha256,sha512", "null", 3, 0 },
		{ "sha256,sha512", "null", "sha512,sha256", "null", 1, 0 },
		{ "sha384,sha512,sha256", "null", "sha256,sha512", "null", 3, 0 },
		{ "sha512", "null", "sha256,sha384,sha512", "null", 3, 0 },
		{ "sha384,sha256", "null", NULL, "null", 2, 0 },
		{ NULL, NULL, NULL, NULL, 1, 1 },  /* the defaults: sha256, ffdhe2048 */
		{ "sha256", "ffdhe3072,null,ffdhe2048", "sha256", "null,ffdhe2048,ffdhe3072", 1, 2 },
		{ "sha256", "ffdhe4096,null", "sha256", "null,ffdhe2048", 1, 0 },
		{ "sha256", "null,ffdhe2048", "sha256", "ffdhe2048,null", 1, 0 },
		{ "sha256", "ffdhe2048,null", "sha256", "null,ffdhe2048", 1, 1 },
		{ "sha256", "ffdhe8192,ffdhe6144", "sha256", NULL, 1, 5 },
		{ "sha256", "ffdhe6144,ffdhe8192", "sha256", "ffdhe8192,ffdhe6144", 1, 4 },
		{ "sha512,sha384", "ffdhe3072,ffdhe2048", "sha384,sha512", "ffdhe2048,ffdhe3072",
		  3, 2 },
	};
	char hs[RTRS_AUTH_KEY_STR_MAX];
	struct rtrs_auth_key hk;

	new_key(1, 32, &hk, hs);
	write_keys(hs, NULL);
	for (unsigned i = 0; i < ARRAY_SIZE(rows); i++) {
		struct xchg *x = xnew();
		char what[160];

		snprintf(what, sizeof(what), "server %s/%s, host %s/%s",
			 rows[i].srv_hashes ? rows[i].srv_hashes : "default",
			 rows[i].srv_groups ? rows[i].srv_groups : "default",
			 rows[i].host_hashes ? rows[i].host_hashes : "default",
			 rows[i].host_groups ? rows[i].host_groups : "default");
		host_cfg(&x->hc, rows[i].host_hashes, rows[i].host_groups, &hk, NULL);
		srv_cfg(&x->sc, rows[i].srv_hashes, rows[i].srv_groups);
		xstart(x);
		run(x);
		CHECK_SUCCESS(what, x, rows[i].hash, rows[i].group, false);
		xfree(x);
	}
}

/* ---- refusals ------------------------------------------------------------------------ */

static void test_refusals(void)
{
	char hs[RTRS_AUTH_KEY_STR_MAX], cs[RTRS_AUTH_KEY_STR_MAX], hs2[RTRS_AUTH_KEY_STR_MAX];
	char cs2[RTRS_AUTH_KEY_STR_MAX];
	struct rtrs_auth_key hk, ck, hk2, ck2, none = { 0 };
	struct xchg *x;
	size_t mark;

	new_key(1, 32, &hk, hs);
	new_key(2, 48, &ck, cs);
	new_key(1, 32, &hk2, hs2);
	new_key(3, 64, &ck2, cs2);

	/* Bidirectional with the right keys. */
	write_keys(hs, cs);
	x = xnew();
	host_cfg(&x->hc, NULL, "ffdhe2048", &hk, &ck);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_SUCCESS("bidirectional", x, 1, 1, true);
	xfree(x);

	/* Wrong host key: the server refuses with FAILURE1, the host does not answer it. */
	for (int bidir = 0; bidir <= 1; bidir++) {
		x = xnew();
		host_cfg(&x->hc, NULL, bidir ? "ffdhe3072" : "null", &hk2, bidir ? &ck : NULL);
		srv_cfg(&x->sc, NULL, NULL);
		mark = log_len;
		xstart(x);
		run(x);
		CHECK_TR("wrong host key", x, NEG, CHAL, REPLY, F1);
		CHECK_END("wrong host key", x, FAIL, -EKEYREJECTED, FAIL, -EKEYREJECTED);
		CHECK_FAIL_MSG("wrong host key", x, 3, F1, RTRS_AUTH_FAIL_FAILED);
		CHECK(!x->srv.host_ok);
		CHECK_EQ(x->clt_steps, 2);
		CHECK(strstr(log_since(mark), "wrong key"), "no log line says why: %s",
		      log_since(mark));
		xfree(x);
	}

	/* Wrong controller secret on the host: it refuses the server after SUCCESS1. */
	x = xnew();
	host_cfg(&x->hc, NULL, "ffdhe2048", &hk, &ck2);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_TR("wrong controller secret", x, NEG, CHAL, REPLY, S1, F2);
	CHECK_END("wrong controller secret", x, FAIL, -EKEYREJECTED, FAIL, -EKEYREJECTED);
	CHECK_FAIL_MSG("wrong controller secret", x, 4, F2, RTRS_AUTH_FAIL_FAILED);
	CHECK(x->srv.host_ok, "the host's proof was right");
	CHECK_EQ(x->srv_steps, 3);
	xfree(x);

	/* Bidirectional asked, but the file has no controller secret for the host. */
	write_keys(hs, NULL);
	x = xnew();
	host_cfg(&x->hc, NULL, NULL, &hk, &ck);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_TR("no controller secret", x, NEG, CHAL, REPLY, F1);
	CHECK_END("no controller secret", x, FAIL, -EKEYREJECTED, FAIL, -ENOKEY);
	CHECK_FAIL_MSG("no controller secret", x, 3, F1, RTRS_AUTH_FAIL_FAILED);
	xfree(x);

	/* The host is not in the file. */
	{
		char text[512];

		snprintf(text, sizeof(text), "# nobody we know\nnqn.someone %s\n", other_secret);
		write_text(keys_path, text);
	}
	x = xnew();
	host_cfg(&x->hc, NULL, NULL, &hk, NULL);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_TR("host not listed", x, NEG, F1);
	CHECK_END("host not listed", x, FAIL, -EKEYREJECTED, FAIL, -EACCES);
	CHECK_FAIL_MSG("host not listed", x, 1, F1, RTRS_AUTH_FAIL_FAILED);
	xfree(x);

	/*
	 * The key file is missing (the server's own trouble): no FAILURE1,
	 * which the host would take as its key rejected and never retry; the
	 * server fails the path and the host is left to reconnect.
	 */
	{
		char saved[sizeof(keys_path)];

		memcpy(saved, keys_path, sizeof(saved));
		snprintf(keys_path, sizeof(keys_path), "%s/missing", tmpdir);
		x = xnew();
		host_cfg(&x->hc, NULL, NULL, &hk, NULL);
		srv_cfg(&x->sc, NULL, NULL);
		xstart(x);
		run(x);
		CHECK_TR("no key file", x, NEG);
		CHECK_END("no key file", x, CONT, 0, FAIL, -ENOENT);
		xfree(x);
		memcpy(keys_path, saved, sizeof(saved));
	}

	/* The host asks for another server. */
	write_keys(hs, cs);
	x = xnew();
	host_cfg(&x->hc, NULL, NULL, &hk, NULL);
	snprintf(x->hc.server, sizeof(x->hc.server), "%s", "nqn.2024-01.io.rtrs:another-server");
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_TR("server name mismatch", x, NEG, F1);
	CHECK_END("server name mismatch", x, FAIL, -EKEYREJECTED, FAIL, -EACCES);
	CHECK_FAIL_MSG("server name mismatch", x, 1, F1, RTRS_AUTH_FAIL_SERVER_NAME);
	xfree(x);

	/* Nothing in common. */
	x = xnew();
	host_cfg(&x->hc, "sha256,sha384", NULL, &hk, NULL);
	srv_cfg(&x->sc, "sha512", NULL);
	xstart(x);
	run(x);
	CHECK_TR("no common hash", x, NEG, F1);
	CHECK_END("no common hash", x, FAIL, -EKEYREJECTED, FAIL, -EPROTO);
	CHECK_FAIL_MSG("no common hash", x, 1, F1, RTRS_AUTH_FAIL_HASH_UNUSABLE);
	xfree(x);

	x = xnew();
	host_cfg(&x->hc, NULL, "null,ffdhe2048", &hk, NULL);
	srv_cfg(&x->sc, NULL, "ffdhe3072,ffdhe8192");
	xstart(x);
	run(x);
	CHECK_TR("no common group", x, NEG, F1);
	CHECK_END("no common group", x, FAIL, -EKEYREJECTED, FAIL, -EPROTO);
	CHECK_FAIL_MSG("no common group", x, 1, F1, RTRS_AUTH_FAIL_DHGROUP_UNUSABLE);
	xfree(x);

	/* A host without a secret does not even begin, with or without a controller key. */
	for (int with_ck = 0; with_ck <= 1; with_ck++) {
		x = xnew();
		host_cfg(&x->hc, NULL, NULL, &none, with_ck ? &ck : NULL);
		srv_cfg(&x->sc, NULL, NULL);
		xstart(x);
		CHECK_EQ(x->begin_rc, -ENOKEY);
		CHECK_EQ(x->clt.state, AUTH_CLT_FAILED);
		CHECK_EQ(x->clt.err, -ENOKEY);
		CHECK_EQ(x->n, 0);
		xfree(x);
	}
}

/* The server reads the file on every NEGOTIATE: a rotated key applies to the next one. */
static void test_rotation(void)
{
	char hs[RTRS_AUTH_KEY_STR_MAX], hs2[RTRS_AUTH_KEY_STR_MAX];
	char cs[RTRS_AUTH_KEY_STR_MAX], cs2[RTRS_AUTH_KEY_STR_MAX];
	struct rtrs_auth_key hk, hk2, ck, ck2;
	struct xchg *x;

	new_key(1, 32, &hk, hs);
	new_key(2, 48, &hk2, hs2);
	new_key(3, 64, &ck, cs);
	new_key(0, 32, &ck2, cs2);

	write_keys(hs, cs);
	x = xnew();
	host_cfg(&x->hc, NULL, "ffdhe2048", &hk, &ck);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_SUCCESS("before rotation", x, 1, 1, true);

	/* Host secret rotated in the file; the same configurations, a new transaction. */
	write_keys(hs2, cs);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	xstart(x);
	run(x);
	CHECK_TR("host secret rotated", x, NEG, CHAL, REPLY, F1);
	CHECK_END("host secret rotated", x, FAIL, -EKEYREJECTED, FAIL, -EKEYREJECTED);
	CHECK_FAIL_MSG("host secret rotated", x, 3, F1, RTRS_AUTH_FAIL_FAILED);

	/* The host gets the new secret: fine again. */
	x->hc.hkey = hk2;
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	xstart(x);
	run(x);
	CHECK_SUCCESS("host has the new secret", x, 1, 1, true);

	/* Controller secret rotated: now the host refuses the server. */
	write_keys(hs2, cs2);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	xstart(x);
	run(x);
	CHECK_TR("controller secret rotated", x, NEG, CHAL, REPLY, S1, F2);
	CHECK_END("controller secret rotated", x, FAIL, -EKEYREJECTED, FAIL, -EKEYREJECTED);
	CHECK_FAIL_MSG("controller secret rotated", x, 4, F2, RTRS_AUTH_FAIL_FAILED);

	x->hc.ckey = ck2;
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	xstart(x);
	run(x);
	CHECK_SUCCESS("host has the new controller secret", x, 1, 1, true);
	xfree(x);
}

/* ---- robustness ---------------------------------------------------------------------- */

static struct rtrs_auth_key rb_hk, rb_ck;

/* A structurally valid message of any id, with this tid (sha256, no DH). */
static size_t build_msg(uint8_t id, uint16_t tid, void *buf, size_t cap)
{
	static const uint8_t zeros[RTRS_AUTH_MAX_HASH_LEN] = { 0 };
	struct rtrs_auth_msg m = { .id = id, .tid = tid };
	size_t len;

	switch (id) {
	case NEG:
		m.nr_hashes = 1;
		m.hashes[0] = RTRS_AUTH_HASH_SHA256;
		m.nr_groups = 1;
		m.groups[0] = RTRS_AUTH_DH_NULL;
		snprintf(m.host, sizeof(m.host), "%s", HOST);
		snprintf(m.server, sizeof(m.server), "%s", SERVER);
		break;
	case CHAL:
		m.hl = 32;
		m.hash = RTRS_AUTH_HASH_SHA256;
		m.seq = 7;
		m.c = zeros;
		break;
	case REPLY:
		m.hl = 32;
		m.r = zeros;
		m.seq = 9;
		break;
	case S1:
		m.hl = 32;
		break;
	case F1:
	case F2:
		m.fail_exp = RTRS_AUTH_FAIL_FAILED;
		break;
	default:
		break;
	}
	len = rtrs_auth_encode(buf, cap, &m);
	if (!len)
		die("cannot encode a test message");
	return len;
}

static bool srv_legal(int state, uint8_t id)
{
	return (state == AUTH_SRV_WAIT_NEGOTIATE && id == NEG) ||
	       (state == AUTH_SRV_WAIT_REPLY && (id == REPLY || id == F2)) ||
	       (state == AUTH_SRV_WAIT_SUCCESS2 && (id == S2 || id == F2));
}

static bool clt_legal(int state, uint8_t id)
{
	return (state == AUTH_CLT_WAIT_CHALLENGE && (id == CHAL || id == F1)) ||
	       (state == AUTH_CLT_WAIT_SUCCESS1 && (id == S1 || id == F1));
}

/*
 * A fresh exchange driven to a state: "listed" false makes the host unknown
 * to the server (to reach the failed states).
 */
static struct xchg *drive(bool server, int state, bool bidir, bool listed)
{
	struct xchg *x = xnew();
	char hs[RTRS_AUTH_KEY_STR_MAX], cs[RTRS_AUTH_KEY_STR_MAX];
	unsigned deliver_n;

	rtrs_auth_key_format(&rb_hk, hs, sizeof(hs));
	rtrs_auth_key_format(&rb_ck, cs, sizeof(cs));
	if (listed) {
		write_keys(hs, cs);
	} else {
		char text[512];

		snprintf(text, sizeof(text), "nqn.someone %s\n", other_secret);
		write_text(keys_path, text);
	}
	host_cfg(&x->hc, "sha256", "null", &rb_hk, bidir ? &rb_ck : NULL);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	if (server)
		deliver_n = state == AUTH_SRV_WAIT_NEGOTIATE ? 0 :
			    state == AUTH_SRV_WAIT_REPLY || state == AUTH_SRV_FAILED ? 1 : 3;
	else
		deliver_n = state == AUTH_CLT_WAIT_CHALLENGE ? 0 :
			    state == AUTH_CLT_WAIT_SUCCESS1 || state == AUTH_CLT_FAILED ? 2 : 4;
	pump(x, deliver_n);
	return x;
}

/* Every message in every state where it is not expected: the receiving side fails. */
static void test_wrong_state(void)
{
	static const struct {
		bool server;
		int state;
		bool bidir, listed;
	} states[] = {
		{ true, AUTH_SRV_WAIT_NEGOTIATE, false, true },
		{ true, AUTH_SRV_WAIT_REPLY, false, true },
		{ true, AUTH_SRV_WAIT_SUCCESS2, true, true },
		{ true, AUTH_SRV_DONE, false, true },
		{ true, AUTH_SRV_FAILED, false, false },
		{ false, AUTH_CLT_WAIT_CHALLENGE, false, true },
		{ false, AUTH_CLT_WAIT_SUCCESS1, false, true },
		{ false, AUTH_CLT_DONE, false, true },
		{ false, AUTH_CLT_DONE, true, true },
		{ false, AUTH_CLT_FAILED, false, false },
	};
	unsigned cases = 0;

	for (unsigned si = 0; si < ARRAY_SIZE(states); si++) {
		bool server = states[si].server;
		int state = states[si].state;

		for (unsigned mi = 0; mi < ARRAY_SIZE(all_ids); mi++) {
			uint8_t id = all_ids[mi], msg[MSG_CAP];
			struct xchg *x;
			struct rtrs_auth_txn *t;
			enum rtrs_auth_step r;
			unsigned before;
			size_t len;
			char what[128];

			if (server ? srv_legal(state, id) : clt_legal(state, id))
				continue;
			x = drive(server, state, states[si].bidir, states[si].listed);
			t = server ? &x->srv : &x->clt;
			snprintf(what, sizeof(what), "%s in %s state %s%s", msg_name(id),
				 server ? "server" : "host",
				 server ? rtrs_auth_srv_state_str(state) :
					  rtrs_auth_clt_state_str(state),
				 states[si].bidir ? " (bidirectional)" : "");
			CHECK(t->state == state, "%s: reached %s instead", what,
			      server ? rtrs_auth_srv_state_str(t->state) :
				       rtrs_auth_clt_state_str(t->state));
			/* The receiver's own transaction id: only the state is wrong. */
			len = build_msg(id, t->tid, msg, sizeof(msg));
			before = x->n;
			r = deliver(x, server, msg, len);
			cases++;
			CHECK(r == RTRS_AUTH_FAILED, "%s: %s", what, step_name(r));
			CHECK(t->state == (server ? AUTH_SRV_FAILED : AUTH_CLT_FAILED),
			      "%s: state %s", what,
			      server ? rtrs_auth_srv_state_str(t->state) :
				       rtrs_auth_clt_state_str(t->state));
			CHECK(t->err == (server ? -EPROTO : -EKEYREJECTED), "%s: err %d", what,
			      t->err);
			if (id == (server ? F2 : F1)) {
				/* A failure is never answered: no FAILURE2 after FAILURE1, nor back. */
				CHECK(x->n == before, "%s: answered with %s", what,
				      msg_name(msg_id(x, before)));
			} else {
				CHECK(x->n == before + 1, "%s: no answer", what);
				if (x->n == before + 1)
					check_failure(__LINE__, what, x, before, server ? F1 : F2,
						      t->tid, RTRS_AUTH_FAIL_INCORRECT_MESSAGE);
			}
			xfree(x);
		}
	}
	CHECK_EQ(cases, 61);

	/*
	 * Two ends that both failed do not keep talking: the host got its FAILURE1
	 * twice (a duplicate), the server has failed already.
	 */
	{
		struct xchg *x = drive(false, AUTH_CLT_FAILED, false, false);
		char got[256];

		CHECK_TR("host refused", x, NEG, F1);
		x->tr[2] = x->tr[1];          /* the FAILURE1 once more */
		x->n = 3;
		x->next = 2;
		run(x);
		tr_string(x, got, sizeof(got));
		CHECK(x->n == 3, "failed ends keep exchanging failures: %s", got);
		xfree(x);
	}
}

/* A wrong transaction id: the server answers FAILURE1, the host gives up silently. */
static void test_wrong_tid(void)
{
	static const struct {
		bool server, bidir;
		unsigned delivered;  /* messages delivered before; the next one is tampered */
	} cases[] = {
		{ true, false, 2 },  /* REPLY */
		{ true, true, 4 },   /* SUCCESS2 */
		{ false, false, 1 }, /* CHALLENGE */
		{ false, false, 3 }, /* SUCCESS1 */
		{ false, true, 3 },  /* SUCCESS1 with R2 */
	};
	static const uint16_t flips[] = { 0x0001, 0x0100, 0x8000, 0xffff };

	for (unsigned i = 0; i < ARRAY_SIZE(cases); i++) {
		for (unsigned f = 0; f < ARRAY_SIZE(flips); f++) {
			struct xchg *x = drive(cases[i].server, cases[i].server ?
					       AUTH_SRV_WAIT_NEGOTIATE : AUTH_CLT_WAIT_CHALLENGE,
					       cases[i].bidir, true);
			struct msgbuf *m;
			uint16_t tid;
			char what[96];

			pump(x, cases[i].delivered);
			m = &x->tr[cases[i].delivered];
			snprintf(what, sizeof(what), "%s with tid ^ 0x%04x",
				 msg_name(msg_id(x, cases[i].delivered)), flips[f]);
			CHECK(x->n == cases[i].delivered + 1 && m->from_srv == !cases[i].server,
			      "%s: setup", what);
			tid = get_le16(m->buf + OFF_TID);
			put_le16(m->buf + OFF_TID, tid ^ flips[f]);
			pump(x, cases[i].delivered + 1);
			if (cases[i].server) {
				CHECK(x->srv_res == FAIL && x->srv.err == -EPROTO &&
				      x->srv.state == AUTH_SRV_FAILED, "%s: server %s err %d", what,
				      step_name(x->srv_res), x->srv.err);
				CHECK(x->n == cases[i].delivered + 2, "%s: server silent", what);
				/* Its FAILURE1 carries its own tid, which the host accepts. */
				CHECK_FAIL_MSG(what, x, cases[i].delivered + 1, F1,
					       RTRS_AUTH_FAIL_INCORRECT_MESSAGE);
				if (!cases[i].bidir) {
					/* The host, waiting for SUCCESS1, takes it as a refusal. */
					pump(x, cases[i].delivered + 2);
					CHECK_END(what, x, FAIL, -EKEYREJECTED, FAIL, -EPROTO);
					CHECK(x->n == cases[i].delivered + 2, "%s: host answered", what);
				}
			} else {
				CHECK(x->clt_res == FAIL && x->clt.err == -EKEYREJECTED &&
				      x->clt.state == AUTH_CLT_FAILED, "%s: host %s err %d", what,
				      step_name(x->clt_res), x->clt.err);
				CHECK(x->n == cases[i].delivered + 1, "%s: host answered", what);
			}
			xfree(x);
		}
	}

	/* A FAILURE1 for another transaction: the host fails all the same, silently. */
	{
		struct xchg *x = drive(false, AUTH_CLT_WAIT_CHALLENGE, false, true);
		uint8_t msg[MSG_CAP];
		size_t len = build_msg(F1, (uint16_t)(x->tid + 1), msg, sizeof(msg));

		deliver(x, false, msg, len);
		CHECK(x->clt_res == FAIL && x->clt.err == -EKEYREJECTED);
		CHECK_EQ(x->n, 1);
		xfree(x);
	}
}

/* Each length short of a valid message, with the envelope as sent and as if consistent. */
static void test_truncated(void)
{
	static const struct {
		const char *hashes, *groups;
		bool bidir;
	} variants[] = {
		{ "sha256", "ffdhe2048", true },
		{ "sha512", "null", false },
	};
	unsigned cases = 0;

	for (unsigned v = 0; v < ARRAY_SIZE(variants); v++) {
		struct xchg *ref = drive(false, AUTH_CLT_WAIT_CHALLENGE, variants[v].bidir, true);
		struct msgbuf chal, rep, neg;

		host_cfg(&ref->hc, variants[v].hashes, variants[v].groups, &rb_hk,
			 variants[v].bidir ? &rb_ck : NULL);
		rtrs_auth_txn_end(&ref->clt);
		rtrs_auth_txn_end(&ref->srv);
		xstart(ref);
		pump(ref, 2);
		CHECK(ref->n == 3 && msg_id(ref, 1) == CHAL && msg_id(ref, 2) == REPLY,
		      "reference exchange");
		neg = ref->tr[0];
		chal = ref->tr[1];
		rep = ref->tr[2];

		for (int consistent = 0; consistent <= 1; consistent++) {
			/* REPLY to a server waiting for it. */
			for (size_t len = 0; len < rep.len; len++) {
				struct xchg *x;
				uint8_t msg[MSG_CAP];

				if (consistent && len < 8)
					continue;
				memcpy(msg, rep.buf, len);
				if (consistent)
					put_le16(msg + OFF_ENV_LEN, (uint16_t)(len - 8));
				x = xnew();
				x->hc = ref->hc;
				srv_cfg(&x->sc, NULL, NULL);
				xstart(x);
				x->tid = ref->tid;
				deliver(x, true, neg.buf, neg.len);
				CHECK(x->srv.state == AUTH_SRV_WAIT_REPLY);
				x->next = x->n;
				deliver(x, true, msg, len);
				cases++;
				CHECK(x->srv_res == FAIL && x->srv.err == -EPROTO,
				      "REPLY cut to %zu (%s): server %s err %d", len,
				      consistent ? "consistent" : "as sent", step_name(x->srv_res),
				      x->srv.err);
				check_failure(__LINE__, "truncated REPLY", x, x->n - 1, F1, ref->tid,
					      RTRS_AUTH_FAIL_INCORRECT_PAYLOAD);
				xfree(x);
			}
			/* CHALLENGE to a host waiting for it. */
			for (size_t len = 0; len < chal.len; len++) {
				struct xchg *x;
				uint8_t msg[MSG_CAP];

				if (consistent && len < 8)
					continue;
				memcpy(msg, chal.buf, len);
				if (consistent)
					put_le16(msg + OFF_ENV_LEN, (uint16_t)(len - 8));
				x = xnew();
				x->hc = ref->hc;
				srv_cfg(&x->sc, NULL, NULL);
				next_tid = ref->tid;
				xstart(x);
				deliver(x, false, msg, len);
				cases++;
				CHECK(x->clt_res == FAIL && x->clt.err == -EPROTO,
				      "CHALLENGE cut to %zu (%s): host %s err %d", len,
				      consistent ? "consistent" : "as sent", step_name(x->clt_res),
				      x->clt.err);
				check_failure(__LINE__, "truncated CHALLENGE", x, x->n - 1, F2,
					      ref->tid, RTRS_AUTH_FAIL_INCORRECT_PAYLOAD);
				xfree(x);
			}
		}
		/* The untouched messages do pass: the cuts above are what failed. */
		{
			struct xchg *x = xnew();

			x->hc = ref->hc;
			srv_cfg(&x->sc, NULL, NULL);
			next_tid = ref->tid;
			xstart(x);
			deliver(x, false, chal.buf, chal.len);
			CHECK(x->clt_res == CONT, "whole CHALLENGE: %s err %d",
			      step_name(x->clt_res), x->clt.err);
			xfree(x);
		}
		next_tid = (uint16_t)(ref->tid + 1);
		xfree(ref);
	}
	CHECK(cases > 1000, "%u truncations", cases);
}

/* A server waiting for a REPLY of sha256 / ffdhe2048 (hl 32, dhvlen 256); the REPLY in *rep. */
static struct xchg *reply_setup(const char *groups, struct msgbuf *rep)
{
	struct xchg *x = drive(true, AUTH_SRV_WAIT_NEGOTIATE, false, true);

	host_cfg(&x->hc, "sha256", groups, &rb_hk, NULL);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	xstart(x);
	pump(x, 2);
	CHECK(x->n == 3 && msg_id(x, 2) == REPLY, "REPLY setup");
	*rep = x->tr[2];
	x->n = 2;     /* the REPLY is delivered by the caller, from *rep */
	x->next = 2;
	return x;
}

/* REPLYs whose hl and dhvlen do not fit the message or the negotiation. */
static void test_reply_lengths(void)
{
	enum { AS_SENT, SET_ENV, EXTRA };
	static const struct {
		const char *what;
		int hl, dhvlen;      /* -1: as it was */
		int env;             /* AS_SENT: envelope as sent; SET_ENV: 16 + 2 hl + dhvlen */
		int extra;           /* bytes appended (and counted in the envelope) */
		const char *groups;
	} rows[] = {
		{ "dhvlen - 1", -1, 255, AS_SENT, 0, "ffdhe2048" },
		{ "dhvlen + 1", -1, 257, AS_SENT, 0, "ffdhe2048" },
		{ "dhvlen 0", -1, 0, AS_SENT, 0, "ffdhe2048" },
		{ "dhvlen 1024", -1, 1024, AS_SENT, 0, "ffdhe2048" },
		{ "dhvlen 0xffff", -1, 0xffff, AS_SENT, 0, "ffdhe2048" },
		{ "dhvlen 0xff00", -1, 0xff00, AS_SENT, 0, "ffdhe2048" },
		{ "hl 48", 48, -1, AS_SENT, 0, "ffdhe2048" },
		{ "hl 64", 64, -1, AS_SENT, 0, "ffdhe2048" },
		{ "hl 0", 0, -1, AS_SENT, 0, "ffdhe2048" },
		{ "hl 31", 31, -1, AS_SENT, 0, "ffdhe2048" },
		{ "hl 255", 255, -1, AS_SENT, 0, "ffdhe2048" },
		{ "one byte more", -1, -1, AS_SENT, 1, "ffdhe2048" },
		{ "hl 16 + dhvlen 288 (same total)", 16, 288, AS_SENT, 0, "ffdhe2048" },
		{ "hl 48 + dhvlen 224 (same total)", 48, 224, AS_SENT, 0, "ffdhe2048" },
		/* Consistent on the wire but not what was negotiated. */
		{ "dhvlen 255, sized to fit", -1, 255, SET_ENV, 0, "ffdhe2048" },
		{ "dhvlen 384, sized to fit", -1, 384, SET_ENV, 0, "ffdhe2048" },
		{ "dhvlen 0, sized to fit", -1, 0, SET_ENV, 0, "ffdhe2048" },
		{ "hl 48, sized to fit", 48, -1, SET_ENV, 0, "ffdhe2048" },
		{ "hl 64, sized to fit", 64, -1, SET_ENV, 0, "ffdhe2048" },
		{ "null group, dhvlen 256 sized to fit", -1, 256, SET_ENV, 0, "null" },
		{ "null group, dhvlen 1, sized to fit", -1, 1, SET_ENV, 0, "null" },
		{ "null group, one byte more", -1, -1, AS_SENT, 1, "null" },
	};

	for (unsigned i = 0; i < ARRAY_SIZE(rows); i++) {
		struct msgbuf rep;
		struct xchg *x = reply_setup(rows[i].groups, &rep);
		uint8_t msg[MSG_CAP * 2];
		size_t len = rep.len;
		unsigned hl, dhvlen;

		memset(msg, 0x5a, sizeof(msg));
		memcpy(msg, rep.buf, rep.len);
		if (rows[i].hl >= 0)
			msg[OFF_HL] = (uint8_t)rows[i].hl;
		if (rows[i].dhvlen >= 0)
			put_le16(msg + OFF_DHVLEN, (uint16_t)rows[i].dhvlen);
		hl = msg[OFF_HL];
		dhvlen = get_le16(msg + OFF_DHVLEN);
		if (rows[i].env == SET_ENV)
			len = 8 + 16 + 2 * (size_t)hl + dhvlen;
		len += (size_t)rows[i].extra;
		if (len > sizeof(msg))
			die("reply row too long");
		put_le16(msg + OFF_ENV_LEN, (uint16_t)(len - 8));
		deliver(x, true, msg, len);
		CHECK(x->srv_res == FAIL && x->srv.err == -EPROTO, "REPLY %s: server %s err %d",
		      rows[i].what, step_name(x->srv_res), x->srv.err);
		CHECK(!x->srv.host_ok, "REPLY %s: host accepted", rows[i].what);
		check_failure(__LINE__, rows[i].what, x, x->n - 1, F1, x->tid,
			      RTRS_AUTH_FAIL_INCORRECT_PAYLOAD);
		/* The host takes the FAILURE1 as a refusal, silently. */
		x->next = x->n - 1;
		run(x);
		CHECK(x->clt_res == FAIL && x->clt.err == -EKEYREJECTED, "REPLY %s: host %s",
		      rows[i].what, step_name(x->clt_res));
		xfree(x);
	}

	/* The REPLY as the host sent it passes (the setup is sound). */
	{
		struct msgbuf rep;
		struct xchg *x = reply_setup("ffdhe2048", &rep);

		deliver(x, true, rep.buf, rep.len);
		CHECK(x->srv_res == OK, "untouched REPLY: %s err %d", step_name(x->srv_res),
		      x->srv.err);
		xfree(x);
	}
}

/* A CHALLENGE choosing what the host did not offer. */
static void test_challenge_unoffered(void)
{
	static const struct {
		const char *what, *host_hashes, *host_groups;
		uint8_t hash, group;
		unsigned exp;
	} rows[] = {
		{ "hash not offered", "sha256", "null", 3, 0, RTRS_AUTH_FAIL_HASH_UNUSABLE },
		{ "hash not offered (2)", "sha512,sha384", "null", 1, 0,
		  RTRS_AUTH_FAIL_HASH_UNUSABLE },
		{ "hash not offered, group neither", "sha256", "null", 2, 1,
		  RTRS_AUTH_FAIL_HASH_UNUSABLE },
		{ "group not offered", "sha256", "null", 1, 1, RTRS_AUTH_FAIL_DHGROUP_UNUSABLE },
		{ "null group not offered", "sha256", "ffdhe2048,ffdhe3072", 1, 0,
		  RTRS_AUTH_FAIL_DHGROUP_UNUSABLE },
		{ "ffdhe8192 not offered", "sha256", "ffdhe2048,null", 1, 5,
		  RTRS_AUTH_FAIL_DHGROUP_UNUSABLE },
	};

	for (unsigned i = 0; i < ARRAY_SIZE(rows); i++) {
		static uint8_t dhv[RTRS_AUTH_MAX_DH_LEN], c[RTRS_AUTH_MAX_HASH_LEN];
		struct xchg *x = xnew();
		struct rtrs_auth_msg m = { .id = CHAL };
		uint8_t msg[MSG_CAP];
		size_t len;

		host_cfg(&x->hc, rows[i].host_hashes, rows[i].host_groups, &rb_hk, NULL);
		srv_cfg(&x->sc, NULL, NULL);
		xstart(x);
		memset(dhv, 0, sizeof(dhv));
		if (rows[i].group)
			dhv[rtrs_auth_dh_len(rows[i].group) - 1] = 2;   /* the generator */
		m.tid = x->tid;
		m.hash = rows[i].hash;
		m.hl = (uint8_t)rtrs_auth_hash_len(rows[i].hash);
		m.group = rows[i].group;
		m.dhvlen = (uint16_t)rtrs_auth_dh_len(rows[i].group);
		m.dhv = m.dhvlen ? dhv : NULL;
		m.seq = 1;
		m.c = c;
		len = rtrs_auth_encode(msg, sizeof(msg), &m);
		CHECK(len > 0);
		deliver(x, false, msg, len);
		CHECK(x->clt_res == FAIL && x->clt.err == -EPROTO, "%s: host %s err %d",
		      rows[i].what, step_name(x->clt_res), x->clt.err);
		CHECK_TR(rows[i].what, x, NEG, F2);
		check_failure(__LINE__, rows[i].what, x, 1, F2, x->tid, rows[i].exp);
		xfree(x);
	}
}

/* DH public values 0, 1, p - 1 (and p) in the REPLY and in the CHALLENGE. */
static void test_bad_dh(void)
{
	for (unsigned g = RTRS_AUTH_DH_FFDHE2048; g <= RTRS_AUTH_DH_FFDHE8192; g++) {
		static uint8_t p[RTRS_AUTH_MAX_DH_LEN];
		size_t dl = rtrs_auth_dh_len(g);

		if (!group_prime(g, p, dl)) {
			CHECK(0, "no prime for %s", rtrs_auth_dhgroup_name(g));
			continue;
		}
		for (int v = 0; v < 4; v++) {
			static const char *const names[] = { "0", "1", "p - 1", "p" };
			struct xchg *x = xnew();
			uint8_t msg[MSG_CAP];
			uint8_t *dhv;
			size_t off;
			char what[64];

			snprintf(what, sizeof(what), "%s, REPLY g^x = %s", rtrs_auth_dhgroup_name(g),
				 names[v]);
			host_cfg(&x->hc, "sha384", rtrs_auth_dhgroup_name(g), &rb_hk, NULL);
			srv_cfg(&x->sc, NULL, NULL);
			{
				char hs[RTRS_AUTH_KEY_STR_MAX];

				rtrs_auth_key_format(&rb_hk, hs, sizeof(hs));
				write_keys(hs, NULL);
			}
			xstart(x);
			pump(x, 2);
			if (x->n != 3 || msg_id(x, 2) != REPLY) {
				CHECK(0, "%s: setup", what);
				xfree(x);
				continue;
			}
			/* The REPLY's g^x: after R1 and C2. */
			memcpy(msg, x->tr[2].buf, x->tr[2].len);
			off = OFF_DATA + 2 * rtrs_auth_hash_len(2);
			CHECK_EQ(x->tr[2].len, off + dl);
			dhv = msg + off;
			memset(dhv, 0, dl);
			if (v == 1)
				dhv[dl - 1] = 1;
			if (v >= 2)
				memcpy(dhv, p, dl);
			if (v == 2)
				dhv[dl - 1]--;
			memcpy(x->tr[2].buf, msg, x->tr[2].len);
			run(x);
			CHECK_TR(what, x, NEG, CHAL, REPLY, F1);
			CHECK_END(what, x, FAIL, -EKEYREJECTED, FAIL, -EPROTO);
			CHECK_FAIL_MSG(what, x, 3, F1, RTRS_AUTH_FAIL_DHGROUP_UNUSABLE);
			CHECK(!x->srv.host_ok);

			/* The same values as the server's g^y in the CHALLENGE. */
			snprintf(what, sizeof(what), "%s, CHALLENGE g^y = %s",
				 rtrs_auth_dhgroup_name(g), names[v]);
			rtrs_auth_txn_end(&x->clt);
			rtrs_auth_txn_end(&x->srv);
			xstart(x);
			pump(x, 1);
			off = OFF_DATA + rtrs_auth_hash_len(2);
			CHECK_EQ(x->tr[1].len, off + dl);
			memcpy(x->tr[1].buf + off, dhv, dl);
			run(x);
			CHECK_TR(what, x, NEG, CHAL, F2);
			CHECK_END(what, x, FAIL, -EPROTO, FAIL, -EKEYREJECTED);
			CHECK_FAIL_MSG(what, x, 2, F2, RTRS_AUTH_FAIL_DHGROUP_UNUSABLE);
			xfree(x);
		}
	}
}

/* rtrs_auth_dh_shared, wrapped: fails with dh_fail (once set) on the server's side. */
static int dh_fail;
static bool dh_fail_srv_only;
int __real_rtrs_auth_dh_shared(struct rtrs_auth_dh *dh, const uint8_t *peer, size_t peer_len,
			       uint8_t *out, size_t out_len);
int __wrap_rtrs_auth_dh_shared(struct rtrs_auth_dh *dh, const uint8_t *peer, size_t peer_len,
			       uint8_t *out, size_t out_len);
int __wrap_rtrs_auth_dh_shared(struct rtrs_auth_dh *dh, const uint8_t *peer, size_t peer_len,
			       uint8_t *out, size_t out_len)
{
	if (dh_fail && dh_fail_srv_only)
		return dh_fail;
	return __real_rtrs_auth_dh_shared(dh, peer, peer_len, out, out_len);
}

/*
 * The server cannot make the session key for a reason of its own (no
 * memory, OpenSSL failing): no FAILURE1, which the host would take as its
 * key rejected and never retry; the path just goes and the host
 * reconnects. Only a value that fails its checks (test_bad_dh) is the
 * host's doing.
 */
static void test_srv_dh_own_failure(void)
{
	static const int errs[] = { -ENOMEM, -EIO };

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		struct xchg *x = xnew();
		char what[64];

		snprintf(what, sizeof(what), "the server's DH fails with %d", errs[i]);
		host_cfg(&x->hc, "sha384", "ffdhe2048", &rb_hk, NULL);
		srv_cfg(&x->sc, NULL, NULL);
		{
			char hs[RTRS_AUTH_KEY_STR_MAX];

			rtrs_auth_key_format(&rb_hk, hs, sizeof(hs));
			write_keys(hs, NULL);
		}
		xstart(x);
		pump(x, 2); /* NEGOTIATE, CHALLENGE (the host's DH ran), REPLY */
		dh_fail = errs[i];
		dh_fail_srv_only = true;
		run(x);
		dh_fail = 0;
		dh_fail_srv_only = false;
		CHECK_TR(what, x, NEG, CHAL, REPLY);
		CHECK_END(what, x, CONT, 0, FAIL, errs[i]);
		CHECK(!x->srv.host_ok);
		xfree(x);
	}
}

/* rtrs_auth_txn_end() leaves nothing secret behind. */
static void test_txn_end(void)
{
	static const uint8_t zero[sizeof(struct rtrs_auth_key)] = { 0 };
	char hs[RTRS_AUTH_KEY_STR_MAX], cs[RTRS_AUTH_KEY_STR_MAX];
	struct xchg *x = xnew();

	rtrs_auth_key_format(&rb_hk, hs, sizeof(hs));
	rtrs_auth_key_format(&rb_ck, cs, sizeof(cs));
	write_keys(hs, cs);
	host_cfg(&x->hc, "sha512", "ffdhe2048", &rb_hk, &rb_ck);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK_SUCCESS("before txn_end", x, 3, 1, true);
	CHECK(x->srv.hkey.len && x->srv.ckey.len, "the server holds the host's keys");
	for (int s = 0; s < 2; s++) {
		struct rtrs_auth_txn *t = s ? &x->srv : &x->clt;

		rtrs_auth_txn_end(t);
		CHECK(t->dh == NULL);
		CHECK(!memcmp(t->ks, zero, sizeof(t->ks)), "%s: ks left", s ? "server" : "host");
		CHECK(!memcmp(t->c1, zero, sizeof(t->c1)));
		CHECK(!memcmp(t->c2, zero, sizeof(t->c2)));
		CHECK(!memcmp(&t->hkey, zero, sizeof(t->hkey)));
		CHECK(!memcmp(&t->ckey, zero, sizeof(t->ckey)));
	}
	/* Ending twice is harmless (xfree ends them again). */
	xfree(x);
}

/* Secure channel concatenation: both ends generate the same PSK, a new one per exchange. */
static void test_concat(void)
{
	char hs[RTRS_AUTH_KEY_STR_MAX], cs[RTRS_AUTH_KEY_STR_MAX];
	uint8_t a[RTRS_AUTH_MAX_HASH_LEN], b[RTRS_AUTH_MAX_HASH_LEN], c[RTRS_AUTH_MAX_HASH_LEN];
	size_t al = 0, bl = 0, cl = 0;
	unsigned ah = 0, bh = 0, ch = 0;
	struct rtrs_auth_msg m;
	struct xchg *x = xnew();

	rtrs_auth_key_format(&rb_hk, hs, sizeof(hs));
	rtrs_auth_key_format(&rb_ck, cs, sizeof(cs));
	write_keys(hs, cs);
	for (int bidir = 0; bidir < 2; bidir++) {
		host_cfg(&x->hc, "sha384", NULL, &rb_hk, bidir ? &rb_ck : NULL);
		x->hc.scc = RTRS_AUTH_SCC_NEWTLSPSK;
		srv_cfg(&x->sc, NULL, "null,ffdhe2048");
		xstart(x);
		x->srv.scc = RTRS_AUTH_SCC_NEWTLSPSK;
		CHECK(decode_msg(x, 0, &m) && m.scc == RTRS_AUTH_SCC_NEWTLSPSK && m.nr_groups == 5,
		      "NEGOTIATE: SC_C 1 and every group but null");
		run(x);
		CHECK(x->clt_res == RTRS_AUTH_DONE && x->srv_res == RTRS_AUTH_DONE,
		      "bidir %d: %s / %s", bidir, step_name(x->clt_res), step_name(x->srv_res));
		CHECK_EQ(x->srv.group, RTRS_AUTH_DH_FFDHE2048); /* null comes first, but not here */
		CHECK_EQ(rtrs_auth_txn_psk(&x->clt, a, &al, &ah), 0);
		CHECK_EQ(rtrs_auth_txn_psk(&x->srv, b, &bl, &bh), 0);
		CHECK(al == 48 && bl == 48 && ah == 2 && bh == 2, "%zu %zu %u %u", al, bl, ah, bh);
		CHECK(!memcmp(a, b, al), "host and server generate the same PSK");
		rtrs_auth_txn_end(&x->clt);
		rtrs_auth_txn_end(&x->srv);
		xstart(x);
		x->srv.scc = RTRS_AUTH_SCC_NEWTLSPSK;
		run(x);
		CHECK_EQ(rtrs_auth_txn_psk(&x->clt, c, &cl, &ch), 0);
		CHECK(memcmp(a, c, al), "another exchange, another PSK");
		rtrs_auth_txn_end(&x->clt);
		rtrs_auth_txn_end(&x->srv);
	}

	/* A transaction without SC_C generates nothing. */
	host_cfg(&x->hc, "sha256", "ffdhe2048", &rb_hk, NULL);
	srv_cfg(&x->sc, NULL, NULL);
	xstart(x);
	run(x);
	CHECK(x->clt_res == RTRS_AUTH_DONE);
	CHECK_EQ(rtrs_auth_txn_psk(&x->clt, a, &al, &ah), -EINVAL);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);

	/* SC_C where the server expects none, and none where it expects it: a mismatch. */
	host_cfg(&x->hc, "sha256", "ffdhe2048", &rb_hk, NULL);
	x->hc.scc = RTRS_AUTH_SCC_NEWTLSPSK;
	xstart(x);
	run(x);
	CHECK(x->srv_res == RTRS_AUTH_FAILED && x->clt_res == RTRS_AUTH_FAILED);
	CHECK(decode_msg(x, 1, &m) && m.id == RTRS_AUTH_FAILURE1 &&
	      m.fail_exp == RTRS_AUTH_FAIL_CONCAT_MISMATCH, "FAILURE1: concatenation mismatch");
	CHECK_EQ(x->clt.err, -EKEYREJECTED);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	host_cfg(&x->hc, "sha256", "ffdhe2048", &rb_hk, NULL);
	xstart(x);
	x->srv.scc = RTRS_AUTH_SCC_NEWTLSPSK;
	run(x);
	CHECK(x->srv_res == RTRS_AUTH_FAILED && x->clt_res == RTRS_AUTH_FAILED);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);

	/* No DH group to be had: the host does not even start; a server with null only refuses. */
	host_cfg(&x->hc, "sha256", "null", &rb_hk, NULL);
	x->hc.scc = RTRS_AUTH_SCC_NEWTLSPSK;
	xstart(x);
	CHECK_EQ(x->begin_rc, -EINVAL);
	rtrs_auth_txn_end(&x->clt);
	rtrs_auth_txn_end(&x->srv);
	host_cfg(&x->hc, "sha256", NULL, &rb_hk, NULL);
	x->hc.scc = RTRS_AUTH_SCC_NEWTLSPSK;
	srv_cfg(&x->sc, NULL, "null");
	xstart(x);
	x->srv.scc = RTRS_AUTH_SCC_NEWTLSPSK;
	run(x);
	CHECK(x->srv_res == RTRS_AUTH_FAILED && x->clt_res == RTRS_AUTH_FAILED);
	CHECK(decode_msg(x, 1, &m) && m.id == RTRS_AUTH_FAILURE1 &&
	      m.fail_exp == RTRS_AUTH_FAIL_DHGROUP_UNUSABLE);
	xfree(x);
}

static void test_state_names(void)
{
	for (int a = 0; a < AUTH_CLT_NR_STATES; a++) {
		const char *na = rtrs_auth_clt_state_str(a);

		CHECK(na && *na && strcmp(na, "unknown"), "host state %d unnamed", a);
		for (int b = a + 1; b < AUTH_CLT_NR_STATES; b++)
			CHECK(strcmp(na, rtrs_auth_clt_state_str(b)), "host states %d, %d", a, b);
	}
	for (int a = 0; a < AUTH_SRV_NR_STATES; a++) {
		const char *na = rtrs_auth_srv_state_str(a);

		CHECK(na && *na && strcmp(na, "unknown"), "server state %d unnamed", a);
		for (int b = a + 1; b < AUTH_SRV_NR_STATES; b++)
			CHECK(strcmp(na, rtrs_auth_srv_state_str(b)), "server states %d, %d", a, b);
	}
	CHECK(!strcmp(rtrs_auth_clt_state_str(-1), "unknown"));
	CHECK(!strcmp(rtrs_auth_clt_state_str(AUTH_CLT_NR_STATES), "unknown"));
	CHECK(!strcmp(rtrs_auth_srv_state_str(-1), "unknown"));
	CHECK(!strcmp(rtrs_auth_srv_state_str(AUTH_SRV_NR_STATES), "unknown"));
}

/* ---- no secret in the log ------------------------------------------------------------ */

static void test_log_clean(void)
{
	CHECK(log_lines > 50, "only %u log lines captured: is the sink installed?", log_lines);
	CHECK(n_secrets > 100, "only %u secrets", n_secrets);
	CHECK(!strstr(log_text(), "DHHC-1"), "a DHHC-1 string reached the log");
	for (unsigned i = 0; i < n_secrets; i++) {
		char payload[RTRS_AUTH_KEY_STR_MAX];
		char *end;

		/* "DHHC-1:xx:<base64>:" -> "<base64>" */
		snprintf(payload, sizeof(payload), "%s", secrets[i] + 10);
		end = strrchr(payload, ':');
		if (end)
			*end = '\0';
		CHECK(strlen(payload) >= 44, "secret %u: payload '%s'", i, payload);
		CHECK(!strstr(log_text(), secrets[i]), "secret %u in the log", i);
		CHECK(!strstr(log_text(), payload), "secret %u's base64 in the log", i);
	}
}

/* ---- main ------------------------------------------------------------------------------ */

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	struct rtrs_auth_key other;

	log_set_sink(log_sink, NULL);
	g_log_level = LOG_DBG;
	tmpdir = test_tmpdir(tmp && *tmp && strlen(tmp) < 40 ? tmp : "/tmp", "rtrs-auth-sm");
	if (!tmpdir)
		return 1;
	snprintf(keys_path, sizeof(keys_path), "%s/hosts", tmpdir);
	new_key(1, 32, &other, other_secret);
	new_key(2, 48, &rb_hk, NULL);
	new_key(3, 64, &rb_ck, NULL);

	test_state_names();
	test_concat();
	test_matrix();
	test_preference();
	test_refusals();
	test_rotation();
	test_wrong_state();
	test_wrong_tid();
	test_truncated();
	test_reply_lengths();
	test_challenge_unoffered();
	test_bad_dh();
	test_srv_dh_own_failure();
	test_txn_end();
	test_log_clean();

	log_set_sink(NULL, NULL);
	log_free();
	return test_done("auth-sm");
}
