/* SPDX-License-Identifier: MIT */
/*
 * DH-HMAC-CHAP transactions (NVMe Base 2.0 8.13.5) as transition tables:
 * a received message is looked up by (state, message id); anything not in
 * the table is an unexpected message. Secrets never reach a log line.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"
#include "rtrs-auth-sm.h"
#include "util.h"

struct auth_out {
	void *buf;
	size_t cap;
	size_t *len;
};

typedef enum rtrs_auth_step (*auth_fn)(struct rtrs_auth_txn *t, const struct rtrs_auth_msg *m,
				       struct auth_out *o);

struct auth_transition {
	int state;
	uint8_t msg;
	auth_fn fn;
};

static const char *const clt_state_names[AUTH_CLT_NR_STATES] = {
	[AUTH_CLT_START] = "start",
	[AUTH_CLT_WAIT_CHALLENGE] = "wait-challenge",
	[AUTH_CLT_WAIT_SUCCESS1] = "wait-success1",
	[AUTH_CLT_DONE] = "done",
	[AUTH_CLT_FAILED] = "failed",
};

static const char *const srv_state_names[AUTH_SRV_NR_STATES] = {
	[AUTH_SRV_WAIT_NEGOTIATE] = "wait-negotiate",
	[AUTH_SRV_WAIT_REPLY] = "wait-reply",
	[AUTH_SRV_WAIT_SUCCESS2] = "wait-success2",
	[AUTH_SRV_DONE] = "done",
	[AUTH_SRV_FAILED] = "failed",
};

const char *rtrs_auth_clt_state_str(int s)
{
	return (unsigned)s < AUTH_CLT_NR_STATES ? clt_state_names[s] : "unknown";
}

const char *rtrs_auth_srv_state_str(int s)
{
	return (unsigned)s < AUTH_SRV_NR_STATES ? srv_state_names[s] : "unknown";
}

static const char *fail_exp_str(unsigned e)
{
	static const char *const names[] = {
		[RTRS_AUTH_FAIL_FAILED] = "authentication failed",
		[RTRS_AUTH_FAIL_NOT_USABLE] = "protocol not usable",
		[RTRS_AUTH_FAIL_CONCAT_MISMATCH] = "secure channel concatenation mismatch",
		[RTRS_AUTH_FAIL_HASH_UNUSABLE] = "no hash in common",
		[RTRS_AUTH_FAIL_DHGROUP_UNUSABLE] = "no DH group in common",
		[RTRS_AUTH_FAIL_INCORRECT_PAYLOAD] = "incorrect payload",
		[RTRS_AUTH_FAIL_INCORRECT_MESSAGE] = "incorrect message",
	};

	if (e == RTRS_AUTH_FAIL_SERVER_NAME)
		return "it has another name";

	return e < ARRAY_SIZE(names) && names[e] ? names[e] : "unknown reason";
}

/* Ends the transaction with err, answering with a FAILURE1/2 when fail_id is set. */
static enum rtrs_auth_step auth_fail(struct rtrs_auth_txn *t, struct auth_out *o, int err,
				     uint8_t fail_id, uint8_t exp, bool server)
{
	t->err = err;
	t->state = server ? AUTH_SRV_FAILED : AUTH_CLT_FAILED;
	if (fail_id) {
		struct rtrs_auth_msg f = { .id = fail_id, .tid = t->tid, .fail_exp = exp };

		*o->len = rtrs_auth_encode(o->buf, o->cap, &f);
	}
	return RTRS_AUTH_FAILED;
}

static bool id_in(uint8_t id, const uint8_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/* Ks from our key pair and the peer's public value; t->group != 0. */
static int auth_session_key(struct rtrs_auth_txn *t, const uint8_t *peer, size_t len)
{
	uint8_t gxy[RTRS_AUTH_MAX_DH_LEN];
	size_t dl = rtrs_auth_dh_len(t->group);
	int rc;

	rc = rtrs_auth_dh_shared(t->dh, peer, len, gxy, dl);
	if (!rc)
		rc = rtrs_auth_session_key(t->hash, gxy, dl, t->ks);
	rtrs_auth_wipe(gxy, sizeof(gxy));
	return rc;
}

/* R1 (host) or R2 (controller) of this transaction into out. */
static int auth_response(struct rtrs_auth_txn *t, const struct rtrs_auth_key *k, bool host,
			 const char *hostname, const char *server, uint8_t *out)
{
	uint8_t tk[RTRS_AUTH_MAX_HASH_LEN];
	size_t tk_len = sizeof(tk);
	int rc;

	/* The host key is transformed with the host name, the controller key with the server's. */
	rc = rtrs_auth_transform(k, host ? hostname : server, tk, &tk_len);
	if (!rc)
		rc = rtrs_auth_response(t->hash, tk, tk_len, host ? t->c1 : t->c2,
					t->group ? t->ks : NULL, host ? t->s1 : t->s2, t->tid, t->scc,
					host, host ? hostname : server, host ? server : hostname,
					out);
	rtrs_auth_wipe(tk, sizeof(tk));
	return rc;
}

/* ---- host -------------------------------------------------------------------- */

static enum rtrs_auth_step clt_on_failure1(struct rtrs_auth_txn *t,
					   const struct rtrs_auth_msg *m, struct auth_out *o)
{
	if (m->fail_exp == RTRS_AUTH_FAIL_SERVER_NAME) {
		log_err("%s: the server is not named %s: set this client's server name to the "
			"server's (rnbd-server --auth-name, default rtrs-server)", t->log_name,
			t->cfg->server);
		err_detail("the server is not named %s (authentication names the server: set "
			   "the client's server name to the server's --auth-name, default "
			   "rtrs-server)", t->cfg->server);
	} else {
		log_err("%s: server refused authentication: %s", t->log_name,
			fail_exp_str(m->fail_exp));
		err_detail("the server refused authentication: %s (host %s: its secret, or not "
			   "in the server's key file)", fail_exp_str(m->fail_exp), t->cfg->name);
	}
	/* Never answer a FAILURE1 (NVMe: no FAILURE2 after it). */
	return auth_fail(t, o, -EKEYREJECTED, 0, 0, false);
}

static enum rtrs_auth_step clt_on_challenge(struct rtrs_auth_txn *t,
					    const struct rtrs_auth_msg *m, struct auth_out *o)
{
	const struct rtrs_auth_cfg *cfg = t->cfg;
	uint8_t r1[RTRS_AUTH_MAX_HASH_LEN], pub[RTRS_AUTH_MAX_DH_LEN];
	struct rtrs_auth_msg rep = { .id = RTRS_AUTH_REPLY, .tid = t->tid };
	int rc;

	if (!id_in(m->hash, cfg->hashes, cfg->nr_hashes)) {
		log_err("%s: server chose hash %u, which was not offered", t->log_name, m->hash);
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE2, RTRS_AUTH_FAIL_HASH_UNUSABLE,
				 false);
	}
	if (!id_in(m->group, cfg->groups, cfg->nr_groups)) {
		log_err("%s: server chose DH group %u, which was not offered", t->log_name,
			m->group);
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE2,
				 RTRS_AUTH_FAIL_DHGROUP_UNUSABLE, false);
	}
	if (t->scc && m->group == RTRS_AUTH_DH_NULL) {
		log_err("%s: server chose no DH group for a secure channel concatenation",
			t->log_name);
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE2,
				 RTRS_AUTH_FAIL_CONCAT_MISMATCH, false);
	}
	t->hash = m->hash;
	t->group = m->group;
	t->hl = m->hl;
	t->s1 = m->seq;
	memcpy(t->c1, m->c, t->hl);
	if (t->group) {
		rc = rtrs_auth_dh_new(t->group, &t->dh);
		if (!rc)
			rc = rtrs_auth_dh_public(t->dh, pub, rtrs_auth_dh_len(t->group));
		if (!rc)
			rc = auth_session_key(t, m->dhv, m->dhvlen);
		if (rc) {
			log_err("%s: DH key agreement (%s) failed: %s", t->log_name,
				rtrs_auth_dhgroup_name(t->group), strerror(-rc));
			return auth_fail(t, o, rc == -EINVAL ? -EPROTO : rc, RTRS_AUTH_FAILURE2,
					 RTRS_AUTH_FAIL_DHGROUP_UNUSABLE, false);
		}
		rep.dhv = pub;
		rep.dhvlen = (uint16_t)rtrs_auth_dh_len(t->group);
	}
	rc = auth_response(t, &cfg->hkey, true, cfg->name, cfg->server, r1);
	if (rc)
		return auth_fail(t, o, rc, RTRS_AUTH_FAILURE2, RTRS_AUTH_FAIL_FAILED, false);
	t->s2 = rtrs_auth_seqnum();
	if (cfg->ckey.len) {
		t->bidir = true;
		rc = rtrs_auth_random(t->c2, t->hl);
		if (rc)
			return auth_fail(t, o, rc, RTRS_AUTH_FAILURE2, RTRS_AUTH_FAIL_FAILED, false);
	}
	rep.hl = (uint8_t)t->hl;
	rep.r = r1;
	rep.valid = t->bidir;
	rep.c = t->bidir ? t->c2 : NULL;
	rep.seq = t->s2;
	*o->len = rtrs_auth_encode(o->buf, o->cap, &rep);
	rtrs_auth_wipe(r1, sizeof(r1));
	if (!*o->len)
		return auth_fail(t, o, -EMSGSIZE, 0, 0, false);
	t->state = AUTH_CLT_WAIT_SUCCESS1;
	return RTRS_AUTH_CONTINUE;
}

static enum rtrs_auth_step clt_on_success1(struct rtrs_auth_txn *t,
					   const struct rtrs_auth_msg *m, struct auth_out *o)
{
	const struct rtrs_auth_cfg *cfg = t->cfg;
	uint8_t r2[RTRS_AUTH_MAX_HASH_LEN];
	struct rtrs_auth_msg s2 = { .id = RTRS_AUTH_SUCCESS2, .tid = t->tid };
	bool same;
	int rc;

	if (m->hl != t->hl)
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE2,
				 RTRS_AUTH_FAIL_INCORRECT_PAYLOAD, false);
	if (!t->bidir) {
		t->state = AUTH_CLT_DONE;
		return RTRS_AUTH_DONE;
	}
	if (!m->valid) {
		log_err("%s: server %s did not prove its identity (no controller response)",
			t->log_name, cfg->server);
		err_detail("server %s did not prove its identity (it has no controller secret "
			   "for this host)", cfg->server);
		return auth_fail(t, o, -EKEYREJECTED, RTRS_AUTH_FAILURE2, RTRS_AUTH_FAIL_FAILED,
				 false);
	}
	rc = auth_response(t, &cfg->ckey, false, cfg->name, cfg->server, r2);
	if (rc)
		return auth_fail(t, o, rc, RTRS_AUTH_FAILURE2, RTRS_AUTH_FAIL_FAILED, false);
	same = rtrs_auth_equal(r2, m->r, t->hl);
	rtrs_auth_wipe(r2, sizeof(r2));
	if (!same) {
		log_err("%s: server %s failed authentication: its response does not match the "
			"controller secret", t->log_name, cfg->server);
		err_detail("server %s failed authentication: its response does not match the "
			   "controller secret", cfg->server);
		return auth_fail(t, o, -EKEYREJECTED, RTRS_AUTH_FAILURE2, RTRS_AUTH_FAIL_FAILED,
				 false);
	}
	*o->len = rtrs_auth_encode(o->buf, o->cap, &s2);
	t->state = AUTH_CLT_DONE;
	return RTRS_AUTH_DONE;
}

static const struct auth_transition clt_table[] = {
	{ AUTH_CLT_WAIT_CHALLENGE, RTRS_AUTH_CHALLENGE, clt_on_challenge },
	{ AUTH_CLT_WAIT_CHALLENGE, RTRS_AUTH_FAILURE1, clt_on_failure1 },
	{ AUTH_CLT_WAIT_SUCCESS1, RTRS_AUTH_SUCCESS1, clt_on_success1 },
	{ AUTH_CLT_WAIT_SUCCESS1, RTRS_AUTH_FAILURE1, clt_on_failure1 },
};

int rtrs_auth_clt_begin(struct rtrs_auth_txn *t, const struct rtrs_auth_cfg *cfg,
			const char *log_name, uint16_t tid, void *out, size_t cap,
			size_t *out_len)
{
	struct rtrs_auth_msg neg = {
		.id = RTRS_AUTH_NEGOTIATE, .tid = tid,
		.nr_hashes = (uint8_t)cfg->nr_hashes,
	};

	memset(t, 0, sizeof(*t));
	t->cfg = cfg;
	t->log_name = log_name;
	t->tid = tid;
	t->state = AUTH_CLT_START;
	if (!cfg->hkey.len) {
		t->state = AUTH_CLT_FAILED;
		t->err = -ENOKEY;
		return -ENOKEY;
	}
	memcpy(neg.hashes, cfg->hashes, cfg->nr_hashes);
	t->scc = cfg->scc;
	neg.scc = cfg->scc;
	/* A PSK from the exchange needs a DH group: null is not offered then. */
	for (unsigned i = 0; i < cfg->nr_groups; i++)
		if (!cfg->scc || cfg->groups[i] != RTRS_AUTH_DH_NULL)
			neg.groups[neg.nr_groups++] = cfg->groups[i];
	if (!neg.nr_groups) {
		log_err("%s: secure channel concatenation needs a DH group, and only null is "
			"allowed", log_name);
		err_detail("secure channel concatenation needs a DH group (ffdhe2048 or "
			   "larger), and only null is allowed");
		t->state = AUTH_CLT_FAILED;
		t->err = -EINVAL;
		return -EINVAL;
	}
	snprintf(neg.host, sizeof(neg.host), "%s", cfg->name);
	snprintf(neg.server, sizeof(neg.server), "%s", cfg->server);
	*out_len = rtrs_auth_encode(out, cap, &neg);
	if (!*out_len)
		return -EINVAL;
	t->state = AUTH_CLT_WAIT_CHALLENGE;
	return 0;
}

/* Looks (state, message) up in a table; unexpected messages fail the transaction. */
static enum rtrs_auth_step auth_dispatch(struct rtrs_auth_txn *t, const struct auth_transition *tab,
					 size_t n, bool server, const void *msg, size_t len,
					 void *out, size_t cap, size_t *out_len)
{
	struct auth_out o = { .buf = out, .cap = cap, .len = out_len };
	uint8_t fail_id = server ? RTRS_AUTH_FAILURE1 : RTRS_AUTH_FAILURE2;
	struct rtrs_auth_msg m;
	const char *why = NULL;

	*out_len = 0;
	if (rtrs_auth_decode(msg, len, &m, &why)) {
		log_err("%s: invalid authentication message: %s", t->log_name, why);
		return auth_fail(t, &o, -EPROTO, fail_id, RTRS_AUTH_FAIL_INCORRECT_PAYLOAD, server);
	}
	/* The peer's own failure is never answered, or two failed ends would ping-pong. */
	if (m.id == (server ? RTRS_AUTH_FAILURE2 : RTRS_AUTH_FAILURE1))
		fail_id = 0;
	/* Our own transaction id comes back in every message after NEGOTIATE. */
	if (!(server && m.id == RTRS_AUTH_NEGOTIATE) && m.tid != t->tid) {
		log_err("%s: authentication message for transaction %u, not %u", t->log_name,
			m.tid, t->tid);
		return auth_fail(t, &o, server ? -EPROTO : -EKEYREJECTED, server ? fail_id : 0,
				 RTRS_AUTH_FAIL_INCORRECT_MESSAGE, server);
	}
	for (size_t i = 0; i < n; i++)
		if (tab[i].state == t->state && tab[i].msg == m.id)
			return tab[i].fn(t, &m, &o);
	log_err("%s: authentication message 0x%02x unexpected in state %s", t->log_name, m.id,
		server ? rtrs_auth_srv_state_str(t->state) : rtrs_auth_clt_state_str(t->state));
	/* NVMe: a host treats a wrong message as a refusal (-EKEYREJECTED). */
	return auth_fail(t, &o, server ? -EPROTO : -EKEYREJECTED, fail_id,
			 RTRS_AUTH_FAIL_INCORRECT_MESSAGE, server);
}

enum rtrs_auth_step rtrs_auth_clt_step(struct rtrs_auth_txn *t, const void *msg, size_t len,
				       void *out, size_t cap, size_t *out_len)
{
	return auth_dispatch(t, clt_table, ARRAY_SIZE(clt_table), false, msg, len, out, cap,
			     out_len);
}

/* ---- server ------------------------------------------------------------------ */

/* The first of our choices (in our order) that the host offered. */
static int pick(const uint8_t *ours, unsigned n_ours, const uint8_t *theirs, unsigned n_theirs)
{
	for (unsigned i = 0; i < n_ours; i++)
		if (id_in(ours[i], theirs, n_theirs))
			return ours[i];
	return -1;
}

static enum rtrs_auth_step srv_on_negotiate(struct rtrs_auth_txn *t,
					    const struct rtrs_auth_msg *m, struct auth_out *o)
{
	const struct rtrs_auth_cfg *cfg = t->cfg;
	uint8_t pub[RTRS_AUTH_MAX_DH_LEN];
	struct rtrs_auth_msg ch = { .id = RTRS_AUTH_CHALLENGE };
	const char *why = NULL;
	unsigned line = 0;
	int hash, group, rc;

	t->tid = m->tid;
	snprintf(t->host, sizeof(t->host), "%s", m->host);
	if (m->scc != t->scc) {
		log_err("%s: host %s asks for %s, this connection is for %s", t->log_name,
			t->host, m->scc ? "secure channel concatenation" : "no concatenation",
			t->scc ? "secure channel concatenation" : "authentication alone");
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE1,
				 RTRS_AUTH_FAIL_CONCAT_MISMATCH, true);
	}
	if (strcmp(m->server, cfg->name)) {
		log_err("%s: host %s asks for server %s, this is %s", t->log_name, t->host,
			m->server, cfg->name);
		return auth_fail(t, o, -EACCES, RTRS_AUTH_FAILURE1, RTRS_AUTH_FAIL_SERVER_NAME,
				 true);
	}
	hash = pick(cfg->hashes, cfg->nr_hashes, m->hashes, m->nr_hashes);
	if (hash < 0) {
		log_err("%s: host %s offers no hash this server accepts", t->log_name, t->host);
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE1, RTRS_AUTH_FAIL_HASH_UNUSABLE,
				 true);
	}
	{
		/* A PSK from the exchange needs a DH group: with SC_C, null is not picked. */
		uint8_t ours[RTRS_AUTH_NR_DHGROUPS];
		unsigned n = 0;

		for (unsigned i = 0; i < cfg->nr_groups; i++)
			if (!t->scc || cfg->groups[i] != RTRS_AUTH_DH_NULL)
				ours[n++] = cfg->groups[i];
		group = pick(ours, n, m->groups, m->nr_groups);
	}
	if (group < 0) {
		log_err("%s: host %s offers no DH group this server accepts", t->log_name,
			t->host);
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE1,
				 RTRS_AUTH_FAIL_DHGROUP_UNUSABLE, true);
	}
	/* Read now, every time: a key changed in the file applies to the next connect. */
	rc = cfg->keyfile ?
	     rtrs_keyfile_lookup(cfg->keyfile, t->host, &t->hkey, &t->ckey, &line, &why) :
	     rtrs_auth_keyfile_lookup(cfg->keys_file, t->host, &t->hkey, &t->ckey, &line, &why);
	if (rc == -ESRCH) {
		log_err("%s: host %s is not in %s", t->log_name, t->host, cfg->keys_file);
		return auth_fail(t, o, -EACCES, RTRS_AUTH_FAILURE1, RTRS_AUTH_FAIL_FAILED, true);
	}
	/*
	 * From here on a failure is the server's own (a key file that cannot
	 * be read or does not parse right now, no memory, DH or randomness
	 * failing): no FAILURE1, which the host would take as its key
	 * rejected and never retry; the path just goes, and the host
	 * reconnects as after any connection error.
	 */
	if (rc) {
		if (line)
			log_err("%s: %s line %u: %s", t->log_name, cfg->keys_file, line,
				why ? why : strerror(-rc));
		else
			log_err("%s: cannot read %s: %s", t->log_name, cfg->keys_file,
				why ? why : strerror(-rc));
		return auth_fail(t, o, rc, 0, 0, true);
	}
	t->hash = (uint8_t)hash;
	t->group = (uint8_t)group;
	t->hl = rtrs_auth_hash_len(t->hash);
	t->s1 = rtrs_auth_seqnum();
	rc = rtrs_auth_random(t->c1, t->hl);
	if (!rc && t->group) {
		rc = rtrs_auth_dh_new(t->group, &t->dh);
		if (!rc)
			rc = rtrs_auth_dh_public(t->dh, pub, rtrs_auth_dh_len(t->group));
		ch.dhv = pub;
		ch.dhvlen = (uint16_t)rtrs_auth_dh_len(t->group);
	}
	if (rc)
		return auth_fail(t, o, rc, 0, 0, true);
	ch.tid = t->tid;
	ch.hl = (uint8_t)t->hl;
	ch.hash = t->hash;
	ch.group = t->group;
	ch.seq = t->s1;
	ch.c = t->c1;
	*o->len = rtrs_auth_encode(o->buf, o->cap, &ch);
	if (!*o->len)
		return auth_fail(t, o, -EMSGSIZE, 0, 0, true);
	log_dbg("%s: authenticating host %s with %s / %s", t->log_name, t->host,
		rtrs_auth_hash_name(t->hash), rtrs_auth_dhgroup_name(t->group));
	t->state = AUTH_SRV_WAIT_REPLY;
	return RTRS_AUTH_CONTINUE;
}

static enum rtrs_auth_step srv_on_reply(struct rtrs_auth_txn *t, const struct rtrs_auth_msg *m,
					struct auth_out *o)
{
	const struct rtrs_auth_cfg *cfg = t->cfg;
	uint8_t r[RTRS_AUTH_MAX_HASH_LEN];
	struct rtrs_auth_msg s1 = { .id = RTRS_AUTH_SUCCESS1, .tid = t->tid };
	bool same;
	int rc;

	if (m->hl != t->hl || m->dhvlen != rtrs_auth_dh_len(t->group))
		return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE1,
				 RTRS_AUTH_FAIL_INCORRECT_PAYLOAD, true);
	if (t->group) {
		rc = auth_session_key(t, m->dhv, m->dhvlen);
		if (rc == -EINVAL) {
			/* The value failed its range or subgroup check: the host's doing. */
			log_err("%s: host %s sent an unusable DH value", t->log_name, t->host);
			return auth_fail(t, o, -EPROTO, RTRS_AUTH_FAILURE1,
					 RTRS_AUTH_FAIL_DHGROUP_UNUSABLE, true);
		}
		if (rc) {
			/* No memory, OpenSSL failing: the server's own (see srv_on_negotiate). */
			log_err("%s: host %s: the session key could not be made: %s", t->log_name,
				t->host, strerror(-rc));
			return auth_fail(t, o, rc, 0, 0, true);
		}
	}
	rc = auth_response(t, &t->hkey, true, t->host, cfg->name, r);
	if (rc) /* the server's own failure: no FAILURE1 (see srv_on_negotiate) */
		return auth_fail(t, o, rc, 0, 0, true);
	same = rtrs_auth_equal(r, m->r, t->hl);
	rtrs_auth_wipe(r, sizeof(r));
	if (!same) {
		log_err("%s: host %s failed authentication: wrong key", t->log_name, t->host);
		return auth_fail(t, o, -EKEYREJECTED, RTRS_AUTH_FAILURE1, RTRS_AUTH_FAIL_FAILED,
				 true);
	}
	t->host_ok = true;
	s1.hl = (uint8_t)t->hl;
	if (m->valid) {
		if (!t->ckey.len) {
			log_err("%s: host %s asks the server to authenticate, but %s has no "
				"controller secret for it", t->log_name, t->host, cfg->keys_file);
			return auth_fail(t, o, -ENOKEY, RTRS_AUTH_FAILURE1, RTRS_AUTH_FAIL_FAILED,
					 true);
		}
		t->bidir = true;
		t->s2 = m->seq;
		memcpy(t->c2, m->c, t->hl);
		rc = auth_response(t, &t->ckey, false, t->host, cfg->name, r);
		if (rc)
			return auth_fail(t, o, rc, 0, 0, true);
		s1.valid = true;
		s1.r = r;
	}
	*o->len = rtrs_auth_encode(o->buf, o->cap, &s1);
	rtrs_auth_wipe(r, sizeof(r));
	if (!*o->len)
		return auth_fail(t, o, -EMSGSIZE, 0, 0, true);
	t->state = t->bidir ? AUTH_SRV_WAIT_SUCCESS2 : AUTH_SRV_DONE;
	return t->bidir ? RTRS_AUTH_CONTINUE : RTRS_AUTH_DONE;
}

static enum rtrs_auth_step srv_on_success2(struct rtrs_auth_txn *t,
					   const struct rtrs_auth_msg *m, struct auth_out *o)
{
	t->state = AUTH_SRV_DONE;
	return RTRS_AUTH_DONE;
}

static enum rtrs_auth_step srv_on_failure2(struct rtrs_auth_txn *t,
					   const struct rtrs_auth_msg *m, struct auth_out *o)
{
	log_err("%s: host %s refused this server: %s", t->log_name,
		t->host[0] ? t->host : "(unnamed)", fail_exp_str(m->fail_exp));
	return auth_fail(t, o, -EKEYREJECTED, 0, 0, true);
}

static const struct auth_transition srv_table[] = {
	{ AUTH_SRV_WAIT_NEGOTIATE, RTRS_AUTH_NEGOTIATE, srv_on_negotiate },
	{ AUTH_SRV_WAIT_REPLY, RTRS_AUTH_REPLY, srv_on_reply },
	{ AUTH_SRV_WAIT_REPLY, RTRS_AUTH_FAILURE2, srv_on_failure2 },
	{ AUTH_SRV_WAIT_SUCCESS2, RTRS_AUTH_SUCCESS2, srv_on_success2 },
	{ AUTH_SRV_WAIT_SUCCESS2, RTRS_AUTH_FAILURE2, srv_on_failure2 },
};

void rtrs_auth_srv_begin(struct rtrs_auth_txn *t, const struct rtrs_auth_cfg *cfg,
			 const char *log_name)
{
	memset(t, 0, sizeof(*t));
	t->cfg = cfg;
	t->log_name = log_name;
	t->state = AUTH_SRV_WAIT_NEGOTIATE;
}

enum rtrs_auth_step rtrs_auth_srv_step(struct rtrs_auth_txn *t, const void *msg, size_t len,
				       void *out, size_t cap, size_t *out_len)
{
	return auth_dispatch(t, srv_table, ARRAY_SIZE(srv_table), true, msg, len, out, cap,
			     out_len);
}

int rtrs_auth_txn_psk(const struct rtrs_auth_txn *t, uint8_t *out, size_t *out_len,
		      unsigned *hash)
{
	static const uint8_t zeros[RTRS_AUTH_MAX_HASH_LEN];
	uint8_t cc[2 * RTRS_AUTH_MAX_HASH_LEN];
	int rc;

	if (t->scc != RTRS_AUTH_SCC_NEWTLSPSK || !t->group || !t->hl ||
	    (t->state != AUTH_CLT_DONE && t->state != AUTH_SRV_DONE) ||
	    t->hl > RTRS_AUTH_MAX_HASH_LEN)
		return -EINVAL;
	memcpy(cc, t->c1, t->hl);
	memcpy(cc + t->hl, t->bidir ? t->c2 : zeros, t->hl);
	rc = rtrs_auth_hmac(t->hash, t->ks, t->hl, cc, 2 * t->hl, out);
	rtrs_auth_wipe(cc, sizeof(cc));
	if (rc)
		return rc;
	*out_len = t->hl;
	*hash = t->hash;
	return 0;
}

int rtrs_auth_txn_tls_psk(const struct rtrs_auth_txn *t, const char *host, const char *server,
			  struct rtrs_auth_key *out, char digest[RTRS_TLS_DIGEST_LEN + 1])
{
	uint8_t psk[RTRS_AUTH_MAX_HASH_LEN];
	size_t len = 0;
	unsigned hash = 0;
	int rc = rtrs_auth_txn_psk(t, psk, &len, &hash);

	if (!rc)
		rc = rtrs_tls_generated(psk, len, hash, host, server, out, digest);
	rtrs_auth_wipe(psk, sizeof(psk));
	return rc;
}

void rtrs_auth_txn_end(struct rtrs_auth_txn *t)
{
	rtrs_auth_dh_free(t->dh);
	t->dh = NULL;
	rtrs_auth_wipe(t->ks, sizeof(t->ks));
	rtrs_auth_wipe(&t->hkey, sizeof(t->hkey));
	rtrs_auth_wipe(&t->ckey, sizeof(t->ckey));
	rtrs_auth_wipe(t->c1, sizeof(t->c1));
	rtrs_auth_wipe(t->c2, sizeof(t->c2));
}

int rtrs_auth_cfg_lists(struct rtrs_auth_cfg *cfg, const char *hashes, const char *groups,
			bool server, const char *who)
{
	const char *why = NULL;
	int n;

	n = rtrs_auth_hash_list(hashes ? hashes : "sha256,sha384,sha512", cfg->hashes,
				ARRAY_SIZE(cfg->hashes), &why);
	if (n <= 0) {
		log_err("%s: authentication hashes \"%s\": %s", who, hashes,
			why ? why : "empty list");
		return -EINVAL;
	}
	cfg->nr_hashes = (unsigned)n;
	if (!groups)
		groups = server ? "ffdhe2048,ffdhe3072,ffdhe4096,ffdhe6144,ffdhe8192,null" :
				  "null,ffdhe2048,ffdhe3072,ffdhe4096,ffdhe6144,ffdhe8192";
	n = rtrs_auth_dhgroup_list(groups, cfg->groups, ARRAY_SIZE(cfg->groups), &why);
	if (n <= 0) {
		log_err("%s: authentication DH groups \"%s\": %s", who, groups,
			why ? why : "empty list");
		return -EINVAL;
	}
	cfg->nr_groups = (unsigned)n;
	return 0;
}
