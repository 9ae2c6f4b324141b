/* SPDX-License-Identifier: MIT */
/*
 * The DH-HMAC-CHAP transaction of one path, host side and server side, as
 * state machines driven by received messages (docs/security.md has the
 * tables). They know nothing of connections: a step takes a received
 * message and gives back the message to send, if any. Crypto is
 * rtrs-auth.c; the wire is rtrs-proto.h.
 */
#ifndef RTRS_AUTH_SM_H
#define RTRS_AUTH_SM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rtrs-auth.h"
#include "rtrs-proto.h"
#include "rtrs-tls.h"

/* What both sides are configured with. */
struct rtrs_auth_cfg {
	char name[RTRS_AUTH_NAME_MAX + 1];  /* host: our host name; server: its name */
	uint8_t hashes[RTRS_AUTH_NR_HASHES];
	unsigned nr_hashes;
	uint8_t groups[RTRS_AUTH_NR_DHGROUPS];
	unsigned nr_groups;
	/* host only */
	char server[RTRS_AUTH_NAME_MAX + 1]; /* the server we expect */
	struct rtrs_auth_key hkey;           /* len 0: none */
	struct rtrs_auth_key ckey;           /* len 0: not bidirectional */
	uint8_t scc;                         /* RTRS_AUTH_SCC_*: NEGOTIATE's SC_C */
	/* server only: the key file, by path or (a server) read on its own thread */
	const char *keys_file;
	struct rtrs_keyfile *keyfile;
};

/* Outcome of a step. */
enum rtrs_auth_step {
	RTRS_AUTH_CONTINUE,   /* send the output (if any), wait for the next message */
	RTRS_AUTH_DONE,       /* send the output (if any): authenticated */
	RTRS_AUTH_FAILED,     /* send the output (if any: FAILURE1/2), then give up */
};

enum rtrs_auth_clt_state {
	AUTH_CLT_START,
	AUTH_CLT_WAIT_CHALLENGE,
	AUTH_CLT_WAIT_SUCCESS1,
	AUTH_CLT_DONE,
	AUTH_CLT_FAILED,
	AUTH_CLT_NR_STATES,
};

enum rtrs_auth_srv_state {
	AUTH_SRV_WAIT_NEGOTIATE,
	AUTH_SRV_WAIT_REPLY,
	AUTH_SRV_WAIT_SUCCESS2,
	AUTH_SRV_DONE,
	AUTH_SRV_FAILED,
	AUTH_SRV_NR_STATES,
};

/* One transaction. Wiped by rtrs_auth_txn_end(). */
struct rtrs_auth_txn {
	const struct rtrs_auth_cfg *cfg;
	const char *log_name;       /* the path, for logs */
	int state;                  /* enum rtrs_auth_clt_state / rtrs_auth_srv_state */
	int err;                    /* failed: the errno the path reports */
	uint16_t tid;
	uint8_t hash, group;
	size_t hl;
	uint32_t s1, s2;
	uint8_t c1[RTRS_AUTH_MAX_HASH_LEN];
	uint8_t c2[RTRS_AUTH_MAX_HASH_LEN];
	bool bidir;                 /* C2 was sent (host) or received (server) */
	uint8_t ks[RTRS_AUTH_MAX_HASH_LEN]; /* session key H(g^xy), with a DH group */
	struct rtrs_auth_dh *dh;
	/* server: the host being authenticated, and its keys from the file */
	char host[RTRS_AUTH_WIRE_NAME];
	struct rtrs_auth_key hkey, ckey;
	bool host_ok;               /* server: R1 checked (the host is who it says) */
	/* SC_C of this transaction; the server's caller sets the one it expects (0 by default). */
	uint8_t scc;
};

/* Host: starts a transaction; out gets the NEGOTIATE. */
int rtrs_auth_clt_begin(struct rtrs_auth_txn *t, const struct rtrs_auth_cfg *cfg,
			const char *log_name, uint16_t tid, void *out, size_t cap,
			size_t *out_len);
/* Server: starts a transaction waiting for NEGOTIATE. */
void rtrs_auth_srv_begin(struct rtrs_auth_txn *t, const struct rtrs_auth_cfg *cfg,
			 const char *log_name);
/*
 * One received message (an RTRS_MSG_AUTH as it arrived). The answer to send
 * goes to out (*out_len 0: nothing). On RTRS_AUTH_FAILED t->err says why:
 * -EKEYREJECTED (the peer refused us, or its proof was wrong), -ENOKEY
 * (no key where one is needed), -EPROTO (a malformed or unexpected
 * message), -EACCES (server: the host may not connect).
 */
enum rtrs_auth_step rtrs_auth_clt_step(struct rtrs_auth_txn *t, const void *msg, size_t len,
				       void *out, size_t cap, size_t *out_len);
enum rtrs_auth_step rtrs_auth_srv_step(struct rtrs_auth_txn *t, const void *msg, size_t len,
				       void *out, size_t cap, size_t *out_len);
/*
 * Secure channel concatenation: the PSK a completed transaction with SC_C
 * NEWTLSPSK generated, HMAC_H(Ks, C1 || C2) (C2 zeros when the exchange
 * was not bidirectional), H the negotiated hash: hash_len bytes into out
 * (RTRS_AUTH_MAX_HASH_LEN), *hash the hash id. Before rtrs_auth_txn_end.
 * -EINVAL for a transaction not done, without SC_C or without a DH group.
 */
int rtrs_auth_txn_psk(const struct rtrs_auth_txn *t, uint8_t *out, size_t *out_len,
		      unsigned *hash);
/* The same as a TLS key for host at server, and its digest (rtrs_tls_generated). */
int rtrs_auth_txn_tls_psk(const struct rtrs_auth_txn *t, const char *host, const char *server,
			  struct rtrs_auth_key *out, char digest[RTRS_TLS_DIGEST_LEN + 1]);
/* Frees and wipes what the transaction holds. */
void rtrs_auth_txn_end(struct rtrs_auth_txn *t);

const char *rtrs_auth_clt_state_str(int state);
const char *rtrs_auth_srv_state_str(int state);

/*
 * Fills cfg's lists from comma-separated names (NULL: the defaults). -EINVAL
 * with a log line naming the bad entry.
 */
int rtrs_auth_cfg_lists(struct rtrs_auth_cfg *cfg, const char *hashes, const char *groups,
			bool server, const char *who);

#endif
