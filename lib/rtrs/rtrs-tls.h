/* SPDX-License-Identifier: MIT */
/*
 * TLS 1.3 with pre-shared keys under the tcp fabric (docs/security.md
 * section 9): the keys (NVMe's interchange format, or derived from the
 * host's DH-HMAC-CHAP secret), their identities, the OpenSSL contexts of a
 * client path and of a server, and one connection's TLS: its handshake
 * and its record layer, in user space (OpenSSL over a memory of our own,
 * so that the socket stays non-blocking and never raises SIGPIPE) or in
 * the kernel (kTLS, set up from the handshake's traffic secrets), after
 * which the socket carries plain reads and writes.
 *
 * Threads: a connection's calls are serialised inside (its own lock), so
 * the fabric may write from a posting thread while its group reads.
 */
#ifndef RTRS_TLS_H
#define RTRS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "rtrs-auth.h"

/*
 * What kind of PSK an identity names (its fifth character):
 * RTRS_TLS_CONFIGURED, a key given to both sides ("tls=", tls_key);
 * RTRS_TLS_DERIVED, one derived from the host's DH-HMAC-CHAP secret;
 * RTRS_TLS_GENERATED, one a DH-HMAC-CHAP exchange with SC_C NEWTLSPSK
 * generated for one path (secure channel concatenation,
 * rtrs_auth_txn_psk), named by its digest.
 */
enum rtrs_tls_kind {
	RTRS_TLS_CONFIGURED = 'R',
	RTRS_TLS_DERIVED = 'D',
	RTRS_TLS_GENERATED = 'G',
};

/* A generated PSK's digest in its identity: 32 hex digits. */
#define RTRS_TLS_DIGEST_LEN 32
/* A TLS connection's PSK identity: "RTRS0G0h host server digest", at most this long. */
#define RTRS_TLS_IDENTITY_MAX \
	(9 + RTRS_AUTH_NAME_MAX + 1 + RTRS_AUTH_NAME_MAX + 1 + RTRS_TLS_DIGEST_LEN)

/*
 * The identity a client presents: "RTRS0<k>0<h> <host> <server>", and for
 * a generated PSK " <digest>" after it; k is the kind, h the hash id of
 * the TLS suite (1 SHA-256, 2 SHA-384; derived ones 1). -EINVAL for names
 * that are not 1..RTRS_AUTH_NAME_MAX printable characters without blanks,
 * or a digest where the kind has none (or none where it has one).
 */
int rtrs_tls_identity(enum rtrs_tls_kind kind, unsigned hash, const char *host,
		      const char *server, const char *digest, char *buf, size_t len);
/*
 * Splits an identity into its kind, hash, names and digest
 * (NUL-terminated copies: host and server RTRS_AUTH_NAME_MAX + 1 bytes
 * each, digest RTRS_TLS_DIGEST_LEN + 1, "" for kinds without one).
 * -EINVAL (and *why) for anything else.
 */
int rtrs_tls_identity_parse(const char *id, size_t len, enum rtrs_tls_kind *kind,
			    unsigned *hash, char *host, char *server, char *digest,
			    const char **why);
/*
 * The PSK TLS uses for identity: HKDF of the key with the identity as the
 * info, so that a key opens only the identity it was made for: SHA-256
 * for a derived key, else the key's hmac (2: SHA-384). out holds 48
 * bytes; *out_len is 32 or 48.
 */
int rtrs_tls_psk(const struct rtrs_auth_key *key, enum rtrs_tls_kind kind, const char *identity,
		 uint8_t *out, size_t *out_len);
/*
 * A generated PSK (its hmac the suite's hash id, 1 or 2) as an RTRS key,
 * from an exchange's output (rtrs_auth_txn_psk: hash id 1..3, 32..64
 * bytes), and its digest: hex of the first 16 bytes of
 * HMAC-SHA256(psk, "RTRS generated PSK <host> <server>").
 */
int rtrs_tls_generated(const uint8_t *psk, size_t len, unsigned auth_hash, const char *host,
		       const char *server, struct rtrs_auth_key *out,
		       char digest[RTRS_TLS_DIGEST_LEN + 1]);

/* ---- contexts ---------------------------------------------------------------- */

struct rtrs_tls_ctx;

/*
 * A client path's context: tls_key (a configured PSK, hmac 1 or 2) or,
 * when its len is 0, the host's DH-HMAC-CHAP secret host_key (derived).
 * -ENOKEY when neither has a key. no_ktls keeps the records in user space.
 */
int rtrs_tls_ctx_client(const char *host, const char *server, const struct rtrs_auth_key *tls_key,
			const struct rtrs_auth_key *host_key, bool no_ktls,
			struct rtrs_tls_ctx **out);
/* A client path's context for a generated PSK (rtrs_tls_generated). */
int rtrs_tls_ctx_client_generated(const char *host, const char *server,
				  const struct rtrs_auth_key *psk, const char *digest,
				  bool no_ktls, struct rtrs_tls_ctx **out);
/*
 * A server's context: the PSKs of the key file at keys_path (each host's
 * "tls=" key, or its DH-HMAC-CHAP secret for derived identities), read
 * now and again at rtrs_tls_ctx_reload, never while a handshake waits.
 * -EINVAL with *line and *why for a file that does not parse.
 */
int rtrs_tls_ctx_server(const char *server, const char *keys_path, bool no_ktls,
			struct rtrs_tls_ctx **out, unsigned *line, const char **why);
/*
 * Server: a PSK an exchange generated for host (rtrs_tls_generated), for
 * the handshakes of that path's connections: kept while they use it, and
 * forgotten RTRS_TLS_GENERATED_IDLE_MS after its last handshake; at most
 * RTRS_TLS_GENERATED_PER_HOST per host (a host opening that many paths at
 * once) and RTRS_TLS_GENERATED_MAX in all (the least recently used goes
 * first; an entry is about 350 bytes).
 */
#define RTRS_TLS_GENERATED_IDLE_MS 60000
#define RTRS_TLS_GENERATED_PER_HOST 1024
#define RTRS_TLS_GENERATED_MAX 16384
int rtrs_tls_ctx_add_generated(struct rtrs_tls_ctx *t, const char *host,
			       const struct rtrs_auth_key *psk, const char *digest);
/*
 * Reads the key file again; on error the old keys stay. Generated PSKs
 * stay, but those of hosts no longer in the file.
 */
int rtrs_tls_ctx_reload(struct rtrs_tls_ctx *t, unsigned *line, const char **why);
void rtrs_tls_ctx_get(struct rtrs_tls_ctx *t);
void rtrs_tls_ctx_put(struct rtrs_tls_ctx *t);

/* ---- a connection -------------------------------------------------------------- */

struct rtrs_tls;

int rtrs_tls_new(struct rtrs_tls_ctx *t, int fd, bool server, const char *peer,
		 struct rtrs_tls **out);
void rtrs_tls_free(struct rtrs_tls *c);
/* Server: the host of the identity whose PSK the handshake used ("" before). */
const char *rtrs_tls_peer_host(const struct rtrs_tls *c);
/* The name used in log lines (a connection's new name once it has one). */
void rtrs_tls_rename(struct rtrs_tls *c, const char *name);

/*
 * One step of the handshake: 0 when it is done (the records are then in
 * the kernel if rtrs_tls_ktls says so), -EAGAIN to be called again when
 * the socket is readable (*want_write false) or writable (true), or the
 * failure: -EKEYREJECTED (a verdict on the keys: the peer refused ours,
 * or we its: its alert saying so, an unknown identity, a failed binder),
 * -ECONNRESET (the stream ended or failed), -EPROTO (not TLS, or not a
 * handshake we can follow), -EIO or -ENOMEM (the peer's internal error, or
 * our own trouble). Only -EKEYREJECTED is final for a client's path.
 * rtrs_tls_error says why.
 */
int rtrs_tls_handshake(struct rtrs_tls *c, bool *want_write);
const char *rtrs_tls_error(const struct rtrs_tls *c);
/* The records are in the kernel: the socket is read and written plainly. */
bool rtrs_tls_ktls(const struct rtrs_tls *c);
/* "TLS_AES_128_GCM_SHA256, kernel" and the like. */
void rtrs_tls_describe(const struct rtrs_tls *c, char *buf, size_t len);

/*
 * User-space records. writev encrypts what fits of iov and sends what it
 * can: the plaintext bytes taken (their buffers may be reused), or -1
 * with errno (EAGAIN: nothing taken; call again with the same bytes
 * first). pending: encrypted bytes that wait for the socket; push sends
 * them (0: all gone, -EAGAIN, -errno).
 */
ssize_t rtrs_tls_writev(struct rtrs_tls *c, const struct iovec *iov, unsigned n);
bool rtrs_tls_pending(struct rtrs_tls *c);
int rtrs_tls_push(struct rtrs_tls *c);
/*
 * Reads into iov until it is full or nothing more has come: the bytes, or
 * -1 with errno (EAGAIN: none; ECONNRESET: the stream ended; EPROTO: a bad
 * record). A short count means no whole record is left in the buffers.
 */
ssize_t rtrs_tls_readv(struct rtrs_tls *c, const struct iovec *iov, unsigned n);
/*
 * The last read stopped for want of bytes from the socket, so nothing it
 * could return waits in user space: the socket's readiness tells. False
 * before the first read, and after one that filled its buffers.
 */
bool rtrs_tls_drained(struct rtrs_tls *c);

#endif
