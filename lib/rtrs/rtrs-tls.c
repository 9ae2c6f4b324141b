/* SPDX-License-Identifier: MIT */
/*
 * TLS 1.3 with pre-shared keys for the tcp fabric (rtrs-tls.h,
 * docs/security.md section 9).
 *
 * OpenSSL does the handshake and, where the kernel cannot, the records. It
 * never touches the socket itself: its BIO (tls_bio_*) reads with recv()
 * and writes into a buffer of ciphertext that rtrs_tls_push sends with
 * MSG_NOSIGNAL, so a peer that goes away cannot raise SIGPIPE in a program
 * that did not ask for it, and the fabric keeps its non-blocking model.
 *
 * Kernel TLS. Once the handshake is done, and before a byte of application
 * data has moved either way (the server issues no tickets and OpenSSL reads
 * the handshake record by record, so nothing past the client's Finished
 * sits in its buffers), the traffic secrets of the key log give the record
 * keys (RFC 8446 section 7.3) and the socket gets TLS_TX and TLS_RX with
 * sequence number 0. From then on the fabric reads and writes the socket
 * as it does without TLS. Where the kernel has no TLS (this project's build
 * host), the ULP cannot be set and the records stay in user space.
 */
#include <errno.h>
#include <linux/tls.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

#include "log.h"
#include "util.h"
#include "rtrs-tls.h"

#ifndef SOL_TLS
#define SOL_TLS 282
#endif
#ifndef TCP_ULP
#define TCP_ULP 31
#endif

#define TLS_REC (16 * 1024)            /* plaintext a record carries at most */
#define TLS_OUT_MAX (64 * 1024)        /* ciphertext waiting for the socket */
#define TLS_REC_ROOM (TLS_REC + 256)   /* one record's ciphertext, at most */
#define TLS_SUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384"

/* A generated PSK (rtrs_tls_ctx_add_generated). */
struct tls_gen_ent {
	char host[RTRS_AUTH_NAME_MAX + 1];
	char digest[RTRS_TLS_DIGEST_LEN + 1];
	struct rtrs_auth_key psk;
	uint64_t used_ms;
};

struct tls_psk_ent {
	char *host;
	struct rtrs_auth_key hkey;   /* the DH-HMAC-CHAP secret: derived identities */
	struct rtrs_auth_key tkey;   /* the "tls=" key: configured identities; len 0 if none */
};

struct rtrs_tls_ctx {
	atomic_uint refs;
	SSL_CTX *ssl;
	bool server, no_ktls;
	/* client */
	char identity[RTRS_TLS_IDENTITY_MAX + 1];
	uint8_t psk[48];
	size_t psk_len;
	unsigned hash;
	/* server */
	struct tls_gen_ent *gen;     /* generated PSKs (lock), gen_n of them in gen_cap */
	size_t gen_n, gen_cap;
	char server_name[RTRS_AUTH_NAME_MAX + 1];
	char *keys_path;
	pthread_rwlock_t lock;       /* ents */
	struct tls_psk_ent *ents;
	size_t n;
};

struct rtrs_tls {
	pthread_mutex_t lock;
	struct rtrs_tls_ctx *t;
	SSL *ssl;
	int fd;
	bool server, done, ktls_tx, ktls_rx;
	char name[64];
	char err[200];
	/* The traffic secrets, from the key log, until kTLS has them. */
	uint8_t sec_c[48], sec_s[48];
	size_t sec_c_len, sec_s_len;
	/* Ciphertext for the socket: out[out_off .. out_len); out and stage are allocated on demand. */
	unsigned char *out;
	size_t out_off, out_len;
	unsigned char *stage;
	size_t wpend;                /* SSL_write holds a record of this many bytes: retried first */
	int sock_err;
	bool rblocked;               /* the last read wanted the socket: no whole record is held */
	char peer_host[RTRS_AUTH_NAME_MAX + 1]; /* server: the identity's host, its key found */
};

/* ---- keys and identities ------------------------------------------------------ */

static bool name_ok(const char *s, size_t n)
{
	if (!n || n > RTRS_AUTH_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
			return false;
	return true;
}

static bool kind_ok(int k)
{
	return k == RTRS_TLS_CONFIGURED || k == RTRS_TLS_DERIVED || k == RTRS_TLS_GENERATED;
}

static bool digest_ok(const char *d, size_t n)
{
	if (n != RTRS_TLS_DIGEST_LEN)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f')))
			return false;
	return true;
}

int rtrs_tls_identity(enum rtrs_tls_kind kind, unsigned hash, const char *host,
		      const char *server, const char *digest, char *buf, size_t len)
{
	bool gen = kind == RTRS_TLS_GENERATED;
	int n;

	if (!kind_ok(kind) || !host || !server || (hash != 1 && hash != 2) ||
	    (kind == RTRS_TLS_DERIVED && hash != 1) || !name_ok(host, strlen(host)) ||
	    !name_ok(server, strlen(server)) || gen != (digest != NULL) ||
	    (gen && !digest_ok(digest, strlen(digest))))
		return -EINVAL;
	n = snprintf(buf, len, "RTRS0%c0%u %s %s%s%s", (char)kind, hash, host, server,
		     gen ? " " : "", gen ? digest : "");
	return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

int rtrs_tls_identity_parse(const char *id, size_t len, enum rtrs_tls_kind *kind,
			    unsigned *hash, char *host, char *server, char *digest,
			    const char **why)
{
	const char *h, *sp, *s, *end = id + len, *send;

	if (len < 9 || len > RTRS_TLS_IDENTITY_MAX || memcmp(id, "RTRS0", 5) ||
	    !kind_ok(id[5]) || id[6] != '0' || (id[7] != '1' && id[7] != '2') || id[8] != ' ')
		REJECT(-EINVAL, "not an RTRS PSK identity");
	*kind = (enum rtrs_tls_kind)id[5];
	*hash = (unsigned)(id[7] - '0');
	if (*kind == RTRS_TLS_DERIVED && *hash != 1)
		REJECT(-EINVAL, "a derived identity is SHA-256");
	h = id + 9;
	sp = memchr(h, ' ', len - 9);
	if (!sp)
		REJECT(-EINVAL, "identity without a server name");
	s = sp + 1;
	send = memchr(s, ' ', (size_t)(end - s));
	if ((*kind == RTRS_TLS_GENERATED) != (send != NULL))
		REJECT(-EINVAL, *kind == RTRS_TLS_GENERATED ? "generated identity without a digest"
							    : "identity with a field too many");
	if (!send)
		send = end;
	if (!name_ok(h, (size_t)(sp - h)) || !name_ok(s, (size_t)(send - s)))
		REJECT(-EINVAL, "bad name in the identity");
	if (send != end && !digest_ok(send + 1, (size_t)(end - send - 1)))
		REJECT(-EINVAL, "bad digest in the identity");
	memcpy(host, h, (size_t)(sp - h));
	host[sp - h] = '\0';
	memcpy(server, s, (size_t)(send - s));
	server[send - s] = '\0';
	digest[0] = '\0';
	if (send != end) {
		memcpy(digest, send + 1, RTRS_TLS_DIGEST_LEN);
		digest[RTRS_TLS_DIGEST_LEN] = '\0';
	}
	return 0;
}

static int hkdf(const EVP_MD *md, int mode, const uint8_t *salt, size_t salt_len,
		const uint8_t *key, size_t key_len, const uint8_t *info, size_t info_len,
		uint8_t *out, size_t out_len)
{
	EVP_PKEY_CTX *p = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
	size_t ol = out_len;
	int ok;

	if (!p)
		return -ENOMEM;
	ok = EVP_PKEY_derive_init(p) > 0 && EVP_PKEY_CTX_set_hkdf_md(p, md) > 0 &&
	     EVP_PKEY_CTX_set_hkdf_mode(p, mode) > 0 &&
	     (!salt_len || EVP_PKEY_CTX_set1_hkdf_salt(p, salt, (int)salt_len) > 0) &&
	     EVP_PKEY_CTX_set1_hkdf_key(p, key, (int)key_len) > 0 &&
	     (!info_len || EVP_PKEY_CTX_add1_hkdf_info(p, info, (int)info_len) > 0) &&
	     EVP_PKEY_derive(p, out, &ol) > 0 && ol == out_len;
	EVP_PKEY_CTX_free(p);
	if (!ok) {
		ERR_clear_error();
		return -EIO;
	}
	return 0;
}

int rtrs_tls_psk(const struct rtrs_auth_key *key, enum rtrs_tls_kind kind, const char *identity,
		 uint8_t *out, size_t *out_len)
{
	static const uint8_t salt[] = "RTRS TLS PSK 1";
	const EVP_MD *md;

	if (!key || !key->len || !identity)
		return -ENOKEY;
	md = kind != RTRS_TLS_DERIVED && key->hmac == 2 ? EVP_sha384() : EVP_sha256();
	*out_len = (size_t)EVP_MD_get_size(md);
	return hkdf(md, EVP_PKEY_HKDEF_MODE_EXTRACT_AND_EXPAND, salt, sizeof(salt) - 1, key->key,
		    key->len, (const uint8_t *)identity, strlen(identity), out, *out_len);
}

int rtrs_tls_generated(const uint8_t *psk, size_t len, unsigned auth_hash, const char *host,
		       const char *server, struct rtrs_auth_key *out,
		       char digest[RTRS_TLS_DIGEST_LEN + 1])
{
	char label[32 + 2 * RTRS_AUTH_NAME_MAX];
	uint8_t mac[32];
	int n, rc;

	if (!psk || len < 32 || len > sizeof(out->key) || auth_hash < 1 || auth_hash > 3 ||
	    !host || !server)
		return -EINVAL;
	n = snprintf(label, sizeof(label), "RTRS generated PSK %s %s", host, server);
	if (n < 0 || (size_t)n >= sizeof(label))
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	out->hmac = auth_hash == RTRS_AUTH_HASH_SHA256 ? 1 : 2;
	out->len = (uint8_t)len;
	memcpy(out->key, psk, len);
	rc = rtrs_auth_hmac(RTRS_AUTH_HASH_SHA256, psk, len, (const uint8_t *)label, (size_t)n, mac);
	if (rc)
		return rc;
	for (int i = 0; i < RTRS_TLS_DIGEST_LEN / 2; i++)
		snprintf(digest + 2 * i, 3, "%02x", mac[i]);
	OPENSSL_cleanse(mac, sizeof(mac));
	return 0;
}

/* RFC 8446 section 7.1, with an empty context. */
static int expand_label(const EVP_MD *md, const uint8_t *secret, size_t secret_len,
			const char *label, uint8_t *out, size_t out_len)
{
	uint8_t info[2 + 1 + 6 + 16 + 1];
	size_t ll = strlen(label), n = 0;

	info[n++] = (uint8_t)(out_len >> 8);
	info[n++] = (uint8_t)out_len;
	info[n++] = (uint8_t)(6 + ll);
	memcpy(info + n, "tls13 ", 6);
	n += 6;
	memcpy(info + n, label, ll);
	n += ll;
	info[n++] = 0;
	return hkdf(md, EVP_PKEY_HKDEF_MODE_EXPAND_ONLY, NULL, 0, secret, secret_len, info, n,
		    out, out_len);
}

static SSL_SESSION *psk_session(SSL *ssl, unsigned hash, const uint8_t *psk, size_t len)
{
	static const unsigned char aes128[2] = { 0x13, 0x01 }, aes256[2] = { 0x13, 0x02 };
	const SSL_CIPHER *ci = SSL_CIPHER_find(ssl, hash == 2 ? aes256 : aes128);
	SSL_SESSION *s;

	if (!ci)
		return NULL;
	s = SSL_SESSION_new();
	if (!s)
		return NULL;
	if (!SSL_SESSION_set1_master_key(s, psk, len) || !SSL_SESSION_set_cipher(s, ci) ||
	    !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
		SSL_SESSION_free(s);
		return NULL;
	}
	return s;
}

/* ---- the BIO: recv() in, a buffer of ours out --------------------------------------- */

static BIO_METHOD *bio_meth;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int out_room(struct rtrs_tls *c)
{
	if (!c->out) {
		c->out = malloc(TLS_OUT_MAX);
		if (!c->out)
			return -ENOMEM;
		c->out_off = c->out_len = 0;
	}
	if (c->out_off && c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	if (c->out_off && TLS_OUT_MAX - c->out_len < TLS_REC_ROOM) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
	}
	return (int)(TLS_OUT_MAX - c->out_len);
}

static int tls_bio_write(BIO *b, const char *buf, int len)
{
	struct rtrs_tls *c = BIO_get_data(b);
	int room = out_room(c);

	BIO_clear_retry_flags(b);
	if (room < 0)
		return -1;
	if (!room) {
		BIO_set_retry_write(b);
		return -1;
	}
	if (len > room)
		len = room;
	memcpy(c->out + c->out_len, buf, (size_t)len);
	c->out_len += (size_t)len;
	return len;
}

static int tls_bio_read(BIO *b, char *buf, int len)
{
	struct rtrs_tls *c = BIO_get_data(b);
	ssize_t r;

	BIO_clear_retry_flags(b);
	do
		r = recv(c->fd, buf, (size_t)len, MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r >= 0)
		return (int)r;
	if (errno == EAGAIN || errno == EWOULDBLOCK) {
		BIO_set_retry_read(b);
		return -1;
	}
	c->sock_err = errno;
	return -1;
}

static long tls_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int tls_bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

static void bio_meth_make(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "rtrs-tls");

	if (m && BIO_meth_set_write(m, tls_bio_write) && BIO_meth_set_read(m, tls_bio_read) &&
	    BIO_meth_set_ctrl(m, tls_bio_ctrl) && BIO_meth_set_create(m, tls_bio_create))
		bio_meth = m;
	else
		BIO_meth_free(m);
}

/* ---- contexts -------------------------------------------------------------------- */

static void set_err(struct rtrs_tls *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct rtrs_tls *c, const char *fmt, ...)
{
	va_list ap;

	if (c->err[0])
		return;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
}

/* Key log: the two application traffic secrets, for kernel TLS. */
static void keylog(const SSL *ssl, const char *line)
{
	struct rtrs_tls *c = SSL_get_app_data(ssl);
	const char *sp;
	uint8_t *dst;
	size_t *dlen, n = 0;

	if (!c)
		return;
	if (!strncmp(line, "CLIENT_TRAFFIC_SECRET_0 ", 24)) {
		dst = c->sec_c;
		dlen = &c->sec_c_len;
	} else if (!strncmp(line, "SERVER_TRAFFIC_SECRET_0 ", 24)) {
		dst = c->sec_s;
		dlen = &c->sec_s_len;
	} else {
		return;
	}
	sp = strchr(line + 24, ' ');
	if (!sp)
		return;
	for (sp++; sp[0] && sp[1] && n < 48; sp += 2) {
		unsigned v;

		if (sscanf(sp, "%2x", &v) != 1)
			return;
		dst[n++] = (uint8_t)v;
	}
	*dlen = n;
}

static int clt_use_session(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
			   SSL_SESSION **sess)
{
	struct rtrs_tls_ctx *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	const EVP_MD *want = t->hash == 2 ? EVP_sha384() : EVP_sha256();

	*sess = NULL;
	*id = NULL;
	*idlen = 0;
	if (md && EVP_MD_get_type(md) != EVP_MD_get_type(want))
		return 1;
	*sess = psk_session(ssl, t->hash, t->psk, t->psk_len);
	if (!*sess)
		return 0;
	*id = (const unsigned char *)t->identity;
	*idlen = strlen(t->identity);
	return 1;
}

/* Under t->lock (write): entries [n, gen_n) were copied down or dropped: wiped. */
static void gen_compacted_locked(struct rtrs_tls_ctx *t, size_t n)
{
	if (n < t->gen_n)
		OPENSSL_cleanse(t->gen + n, (t->gen_n - n) * sizeof(*t->gen));
	t->gen_n = n;
}

/* Under t->lock (write): the generated PSKs not used for too long go. */
static void gen_expire_locked(struct rtrs_tls_ctx *t, uint64_t now)
{
	size_t j = 0;

	for (size_t i = 0; i < t->gen_n; i++) {
		/* now is read under the lock: no entry is newer (the test is exact anyway). */
		if (t->gen[i].used_ms <= now && now - t->gen[i].used_ms >= RTRS_TLS_GENERATED_IDLE_MS) {
			OPENSSL_cleanse(&t->gen[i].psk, sizeof(t->gen[i].psk));
			continue;
		}
		t->gen[j++] = t->gen[i];
	}
	gen_compacted_locked(t, j);
}

static int srv_find_session(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess)
{
	struct rtrs_tls *c = SSL_get_app_data(ssl);
	struct rtrs_tls_ctx *t = c->t;
	char host[RTRS_AUTH_NAME_MAX + 1], server[RTRS_AUTH_NAME_MAX + 1];
	char ident[RTRS_TLS_IDENTITY_MAX + 1], digest[RTRS_TLS_DIGEST_LEN + 1];
	const char *why = NULL;
	struct rtrs_auth_key key;
	bool found = false;
	enum rtrs_tls_kind kind;
	uint8_t psk[48];
	size_t psk_len = 0;
	unsigned hash;
	int rc = -ENOKEY;

	*sess = NULL;
	if (rtrs_tls_identity_parse((const char *)id, idlen, &kind, &hash, host, server, digest,
				    &why)) {
		set_err(c, "TLS identity refused: %s", why);
		return 1;
	}
	if (strcmp(server, t->server_name)) {
		set_err(c, "TLS identity of host %s names server %s, not %s", host, server,
			t->server_name);
		return 1;
	}
	memcpy(ident, id, idlen);
	ident[idlen] = '\0';
	memset(&key, 0, sizeof(key));
	if (kind == RTRS_TLS_GENERATED) {
		pthread_rwlock_wrlock(&t->lock);
		gen_expire_locked(t, now_ms());
		for (size_t i = 0; i < t->gen_n && !found; i++) {
			if (strcmp(t->gen[i].host, host) || strcmp(t->gen[i].digest, digest))
				continue;
			key = t->gen[i].psk;
			t->gen[i].used_ms = now_ms();
			found = true;
		}
		pthread_rwlock_unlock(&t->lock);
		if (!found)
			set_err(c, "host %s presents a generated PSK this server does not have "
				"(not made here, or forgotten after %d s unused)", host,
				RTRS_TLS_GENERATED_IDLE_MS / 1000);
	} else {
		pthread_rwlock_rdlock(&t->lock);
		for (size_t i = 0; i < t->n; i++) {
			if (strcmp(t->ents[i].host, host))
				continue;
			key = kind == RTRS_TLS_DERIVED ? t->ents[i].hkey : t->ents[i].tkey;
			found = true;
			break;
		}
		pthread_rwlock_unlock(&t->lock);
		if (!found)
			set_err(c, "host %s is not in the key file", host);
		else if (!key.len)
			set_err(c, "host %s has no tls= key in the key file", host);
	}
	if (!found || !key.len)
		;
	else if (kind != RTRS_TLS_DERIVED && key.hmac != hash)
		set_err(c, "host %s presents a SHA-%s identity, its key is SHA-%s", host,
			hash == 2 ? "384" : "256", key.hmac == 2 ? "384" : "256");
	else if ((rc = rtrs_tls_psk(&key, kind, ident, psk, &psk_len)))
		set_err(c, "host %s: the PSK could not be made: %s", host, strerror(-rc));
	OPENSSL_cleanse(&key, sizeof(key));
	if (!rc) {
		*sess = psk_session(ssl, kind == RTRS_TLS_DERIVED ? 1 : hash, psk, psk_len);
		if (!*sess) {
			set_err(c, "cannot make the TLS session");
			rc = -ENOMEM;
		} else {
			snprintf(c->peer_host, sizeof(c->peer_host), "%s", host);
		}
	}
	OPENSSL_cleanse(psk, sizeof(psk));
	/*
	 * No key for the identity is a verdict: the handshake goes on without
	 * a PSK and fails (handshake_failure: final for the host). Our own
	 * failure to make the PSK or its session is not: 0 ends the handshake
	 * with internal_error, and the host tries again.
	 */
	return rc && rc != -ENOKEY ? 0 : 1;
}

int rtrs_tls_ctx_add_generated(struct rtrs_tls_ctx *t, const char *host,
			       const struct rtrs_auth_key *psk, const char *digest)
{
	size_t mine = 0, lru = SIZE_MAX, lru_mine = SIZE_MAX;
	uint64_t now;

	if (!t || !t->server || !host || !name_ok(host, strlen(host)) || !psk || !psk->len ||
	    (psk->hmac != 1 && psk->hmac != 2) || !digest || !digest_ok(digest, strlen(digest)))
		return -EINVAL;
	pthread_rwlock_wrlock(&t->lock);
	/* After the lock: an entry another thread used meanwhile is not "newer than now". */
	now = now_ms();
	gen_expire_locked(t, now);
	for (size_t i = 0; i < t->gen_n; i++) {
		if (lru == SIZE_MAX || t->gen[i].used_ms < t->gen[lru].used_ms)
			lru = i;
		if (strcmp(t->gen[i].host, host))
			continue;
		mine++;
		if (lru_mine == SIZE_MAX || t->gen[i].used_ms < t->gen[lru_mine].used_ms)
			lru_mine = i;
	}
	size_t slot = t->gen_n;

	if (mine >= RTRS_TLS_GENERATED_PER_HOST)
		slot = lru_mine;
	else if (t->gen_n >= RTRS_TLS_GENERATED_MAX)
		slot = lru;
	if (slot == t->gen_n) {
		if (t->gen_n == t->gen_cap) {
			/* Not realloc: the old block holds PSKs, wiped before it is freed. */
			size_t cap = t->gen_cap ? 2 * t->gen_cap : 8;
			struct tls_gen_ent *g = calloc(cap, sizeof(*g));

			if (!g) {
				pthread_rwlock_unlock(&t->lock);
				return -ENOMEM;
			}
			if (t->gen) {
				memcpy(g, t->gen, t->gen_n * sizeof(*g));
				OPENSSL_cleanse(t->gen, t->gen_cap * sizeof(*g));
				free(t->gen);
			}
			t->gen = g;
			t->gen_cap = cap;
		}
		t->gen_n++;
	}
	OPENSSL_cleanse(&t->gen[slot].psk, sizeof(t->gen[slot].psk));
	snprintf(t->gen[slot].host, sizeof(t->gen[slot].host), "%s", host);
	snprintf(t->gen[slot].digest, sizeof(t->gen[slot].digest), "%s", digest);
	t->gen[slot].psk = *psk;
	t->gen[slot].used_ms = now;
	pthread_rwlock_unlock(&t->lock);
	return 0;
}

static SSL_CTX *ctx_common(bool server)
{
	SSL_CTX *s = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());

	if (!s)
		return NULL;
	if (!SSL_CTX_set_min_proto_version(s, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(s, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(s, TLS_SUITES)) {
		SSL_CTX_free(s);
		return NULL;
	}
	SSL_CTX_set_options(s, SSL_OP_NO_TICKET);
	SSL_CTX_set_num_tickets(s, 0);
	SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_mode(s, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
	/* No certificates: a peer that offers one instead of the PSK fails. */
	SSL_CTX_set_verify(s, server ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_keylog_callback(s, keylog);
	return s;
}

static struct rtrs_tls_ctx *ctx_new(bool server, bool no_ktls)
{
	struct rtrs_tls_ctx *t;

	pthread_once(&bio_once, bio_meth_make);
	if (!bio_meth)
		return NULL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	atomic_init(&t->refs, 1);
	t->server = server;
	t->no_ktls = no_ktls;
	pthread_rwlock_init(&t->lock, NULL);
	t->ssl = ctx_common(server);
	if (!t->ssl) {
		ERR_clear_error();
		pthread_rwlock_destroy(&t->lock);
		free(t);
		return NULL;
	}
	SSL_CTX_set_app_data(t->ssl, t);
	return t;
}

static int ctx_client(enum rtrs_tls_kind kind, const char *host, const char *server,
		      const struct rtrs_auth_key *k, const char *digest, bool no_ktls,
		      struct rtrs_tls_ctx **out)
{
	struct rtrs_tls_ctx *t;
	int rc;

	if (!k || !k->len)
		return -ENOKEY;
	t = ctx_new(false, no_ktls);
	if (!t)
		return -ENOMEM;
	t->hash = kind == RTRS_TLS_DERIVED ? 1 : k->hmac;
	/*
	 * The one suite of the PSK's hash: a server picks a suite before it
	 * looks at the PSK, and skips a PSK whose hash is not the suite's.
	 */
	if (!SSL_CTX_set_ciphersuites(t->ssl, t->hash == 2 ? "TLS_AES_256_GCM_SHA384" :
					      "TLS_AES_128_GCM_SHA256")) {
		ERR_clear_error();
		rtrs_tls_ctx_put(t);
		return -EINVAL;
	}
	rc = rtrs_tls_identity(kind, t->hash, host, server, digest, t->identity,
			       sizeof(t->identity));
	if (!rc)
		rc = rtrs_tls_psk(k, kind, t->identity, t->psk, &t->psk_len);
	if (rc) {
		rtrs_tls_ctx_put(t);
		return rc;
	}
	SSL_CTX_set_psk_use_session_callback(t->ssl, clt_use_session);
	*out = t;
	return 0;
}

int rtrs_tls_ctx_client(const char *host, const char *server, const struct rtrs_auth_key *tls_key,
			const struct rtrs_auth_key *host_key, bool no_ktls,
			struct rtrs_tls_ctx **out)
{
	bool derived = !tls_key || !tls_key->len;

	return ctx_client(derived ? RTRS_TLS_DERIVED : RTRS_TLS_CONFIGURED, host, server,
			  derived ? host_key : tls_key, NULL, no_ktls, out);
}

int rtrs_tls_ctx_client_generated(const char *host, const char *server,
				  const struct rtrs_auth_key *psk, const char *digest,
				  bool no_ktls, struct rtrs_tls_ctx **out)
{
	if (!digest)
		return -EINVAL;
	return ctx_client(RTRS_TLS_GENERATED, host, server, psk, digest, no_ktls, out);
}

struct ents_build {
	struct tls_psk_ent *v;
	size_t n, cap;
};

static int ents_add(void *arg, const char *host, size_t host_len, const struct rtrs_auth_key *hkey,
		    const struct rtrs_auth_key *tkey)
{
	struct ents_build *b = arg;

	if (b->n == b->cap) {
		/* Not realloc: the old block holds every host's keys, wiped before it is freed. */
		size_t cap = b->cap ? 2 * b->cap : 16;
		struct tls_psk_ent *v = calloc(cap, sizeof(*v));

		if (!v)
			return -ENOMEM;
		if (b->v) {
			memcpy(v, b->v, b->n * sizeof(*v));
			OPENSSL_cleanse(b->v, b->cap * sizeof(*v));
			free(b->v);
		}
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n].host = strndup(host, host_len);
	if (!b->v[b->n].host)
		return -ENOMEM;
	b->v[b->n].hkey = *hkey;
	b->v[b->n].tkey = *tkey;
	b->n++;
	return 0;
}

static void ents_free(struct tls_psk_ent *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].host);
		OPENSSL_cleanse(&v[i].hkey, sizeof(v[i].hkey));
		OPENSSL_cleanse(&v[i].tkey, sizeof(v[i].tkey));
	}
	free(v);
}

int rtrs_tls_ctx_reload(struct rtrs_tls_ctx *t, unsigned *line, const char **why)
{
	struct ents_build b = { 0 };
	struct tls_psk_ent *old;
	size_t old_n;
	int rc;

	if (!t || !t->server || !t->keys_path)
		return -EINVAL;
	rc = rtrs_auth_keyfile_each(t->keys_path, ents_add, &b, line, why);
	if (rc) {
		ents_free(b.v, b.n);
		return rc;
	}
	pthread_rwlock_wrlock(&t->lock);
	old = t->ents;
	old_n = t->n;
	t->ents = b.v;
	t->n = b.n;
	/* A host no longer in the file keeps no generated PSK either. */
	size_t j = 0;

	for (size_t i = 0; i < t->gen_n; i++) {
		bool listed = false;

		for (size_t e = 0; e < t->n && !listed; e++)
			listed = !strcmp(t->ents[e].host, t->gen[i].host);
		if (!listed) {
			OPENSSL_cleanse(&t->gen[i].psk, sizeof(t->gen[i].psk));
			continue;
		}
		t->gen[j++] = t->gen[i];
	}
	gen_compacted_locked(t, j);
	pthread_rwlock_unlock(&t->lock);
	ents_free(old, old_n);
	return 0;
}

int rtrs_tls_ctx_server(const char *server, const char *keys_path, bool no_ktls,
			struct rtrs_tls_ctx **out, unsigned *line, const char **why)
{
	struct rtrs_tls_ctx *t;
	int rc;

	if (!server || !name_ok(server, strlen(server)) || !keys_path)
		REJECT(-EINVAL, "TLS needs the server's name and a key file");
	t = ctx_new(true, no_ktls);
	if (!t)
		REJECT(-ENOMEM, "cannot make the TLS context");
	snprintf(t->server_name, sizeof(t->server_name), "%s", server);
	t->keys_path = strdup(keys_path);
	rc = t->keys_path ? rtrs_tls_ctx_reload(t, line, why) : -ENOMEM;
	if (rc) {
		rtrs_tls_ctx_put(t);
		return rc;
	}
	SSL_CTX_set_psk_find_session_callback(t->ssl, srv_find_session);
	*out = t;
	return 0;
}

void rtrs_tls_ctx_get(struct rtrs_tls_ctx *t)
{
	atomic_fetch_add(&t->refs, 1);
}

void rtrs_tls_ctx_put(struct rtrs_tls_ctx *t)
{
	if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	SSL_CTX_free(t->ssl);
	ents_free(t->ents, t->n);
	if (t->gen)
		OPENSSL_cleanse(t->gen, t->gen_cap * sizeof(*t->gen));
	free(t->gen);
	free(t->keys_path);
	OPENSSL_cleanse(t->psk, sizeof(t->psk));
	pthread_rwlock_destroy(&t->lock);
	free(t);
}

/* ---- a connection ------------------------------------------------------------------ */

int rtrs_tls_new(struct rtrs_tls_ctx *t, int fd, bool server, const char *peer,
		 struct rtrs_tls **out)
{
	struct rtrs_tls *c = calloc(1, sizeof(*c));
	BIO *b;

	if (!c)
		return -ENOMEM;
	c->fd = fd;
	c->server = server;
	c->t = t;
	snprintf(c->name, sizeof(c->name), "%s", peer ? peer : "tls");
	c->ssl = SSL_new(t->ssl);
	b = BIO_new(bio_meth);
	if (!c->ssl || !b) {
		BIO_free(b);
		SSL_free(c->ssl);
		ERR_clear_error();
		free(c);
		return -ENOMEM;
	}
	BIO_set_data(b, c);
	SSL_set_bio(c->ssl, b, b);
	SSL_set_app_data(c->ssl, c);
	/* Record by record during the handshake: nothing past it may be read ahead (kTLS). */
	SSL_set_read_ahead(c->ssl, 0);
	if (server)
		SSL_set_accept_state(c->ssl);
	else
		SSL_set_connect_state(c->ssl);
	rtrs_tls_ctx_get(t);
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

void rtrs_tls_free(struct rtrs_tls *c)
{
	if (!c)
		return;
	SSL_free(c->ssl);
	rtrs_tls_ctx_put(c->t);
	free(c->out);
	free(c->stage);
	OPENSSL_cleanse(c->sec_c, sizeof(c->sec_c));
	OPENSSL_cleanse(c->sec_s, sizeof(c->sec_s));
	pthread_mutex_destroy(&c->lock);
	free(c);
}

const char *rtrs_tls_peer_host(const struct rtrs_tls *c)
{
	/* Set during the handshake, read after it (the listener's thread, then the group's). */
	return c->done ? c->peer_host : "";
}

void rtrs_tls_rename(struct rtrs_tls *c, const char *name)
{
	pthread_mutex_lock(&c->lock);
	snprintf(c->name, sizeof(c->name), "%s", name);
	pthread_mutex_unlock(&c->lock);
}

const char *rtrs_tls_error(const struct rtrs_tls *c)
{
	return c->err[0] ? c->err : "TLS failed";
}

bool rtrs_tls_drained(struct rtrs_tls *c)
{
	bool d;

	pthread_mutex_lock(&c->lock);
	d = c->rblocked;
	pthread_mutex_unlock(&c->lock);
	return d;
}

bool rtrs_tls_ktls(const struct rtrs_tls *c)
{
	return c->ktls_tx && c->ktls_rx;
}

void rtrs_tls_describe(const struct rtrs_tls *c, char *buf, size_t len)
{
	const SSL_CIPHER *ci = SSL_get_current_cipher(c->ssl);

	snprintf(buf, len, "%s, %s", ci ? SSL_CIPHER_get_name(ci) : "?",
		 rtrs_tls_ktls(c) ? "kernel TLS" : c->ktls_tx ? "kernel TLS sends" :
		 "user-space TLS");
}

/* Sends the ciphertext waiting. Under c->lock. */
static int push_locked(struct rtrs_tls *c)
{
	while (c->out && c->out_off < c->out_len) {
		ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
		c->out_off += (size_t)w;
	}
	if (c->out) {
		free(c->out);
		c->out = NULL;
		c->out_off = c->out_len = 0;
	}
	return 0;
}

int rtrs_tls_push(struct rtrs_tls *c)
{
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = push_locked(c);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

bool rtrs_tls_pending(struct rtrs_tls *c)
{
	bool p;

	pthread_mutex_lock(&c->lock);
	p = (c->out && c->out_off < c->out_len) || c->wpend;
	pthread_mutex_unlock(&c->lock);
	return p;
}

/* One direction into the kernel: 0, or -errno. */
static int ktls_set(struct rtrs_tls *c, bool tx, const EVP_MD *md, bool aes256)
{
	const uint8_t *sec = tx == c->server ? c->sec_s : c->sec_c;
	size_t sec_len = tx == c->server ? c->sec_s_len : c->sec_c_len;
	uint8_t key[32], iv[12];
	size_t kl = aes256 ? 32 : 16;
	int rc;

	if (sec_len != (size_t)EVP_MD_get_size(md))
		return -ENOKEY;
	rc = expand_label(md, sec, sec_len, "key", key, kl);
	if (!rc)
		rc = expand_label(md, sec, sec_len, "iv", iv, sizeof(iv));
	if (!rc && aes256) {
		struct tls12_crypto_info_aes_gcm_256 ci = { 0 };

		ci.info.version = TLS_1_3_VERSION;
		ci.info.cipher_type = TLS_CIPHER_AES_GCM_256;
		memcpy(ci.key, key, 32);
		memcpy(ci.salt, iv, 4);
		memcpy(ci.iv, iv + 4, 8);
		if (setsockopt(c->fd, SOL_TLS, tx ? TLS_TX : TLS_RX, &ci, sizeof(ci)))
			rc = -errno;
		OPENSSL_cleanse(&ci, sizeof(ci));
	} else if (!rc) {
		struct tls12_crypto_info_aes_gcm_128 ci = { 0 };

		ci.info.version = TLS_1_3_VERSION;
		ci.info.cipher_type = TLS_CIPHER_AES_GCM_128;
		memcpy(ci.key, key, 16);
		memcpy(ci.salt, iv, 4);
		memcpy(ci.iv, iv + 4, 8);
		if (setsockopt(c->fd, SOL_TLS, tx ? TLS_TX : TLS_RX, &ci, sizeof(ci)))
			rc = -errno;
		OPENSSL_cleanse(&ci, sizeof(ci));
	}
	OPENSSL_cleanse(key, sizeof(key));
	OPENSSL_cleanse(iv, sizeof(iv));
	return rc;
}

/* The handshake is done: the records into the kernel if it can take them. Under c->lock. */
static void ktls_try(struct rtrs_tls *c)
{
	const SSL_CIPHER *ci = SSL_get_current_cipher(c->ssl);
	uint16_t id = ci ? SSL_CIPHER_get_protocol_id(ci) : 0;
	bool aes256 = id == 0x1302;
	const EVP_MD *md = aes256 ? EVP_sha384() : EVP_sha256();
	int rc;

	if (c->t->no_ktls || (id != 0x1301 && id != 0x1302) || c->out)
		goto done;
	if (setsockopt(c->fd, SOL_TCP, TCP_ULP, "tls", sizeof("tls"))) {
		log_dbg("%s: no kernel TLS (%s): records in user space", c->name, strerror(errno));
		goto done;
	}
	rc = ktls_set(c, true, md, aes256);
	if (!rc) {
		c->ktls_tx = true;
		rc = ktls_set(c, false, md, aes256);
		if (!rc)
			c->ktls_rx = true;
	}
	if (rc)
		log_warn("%s: kernel TLS %s refused (%s): %s in user space", c->name,
			 c->ktls_tx ? "receive" : "send", strerror(-rc),
			 c->ktls_tx ? "receiving" : "records");
done:
	OPENSSL_cleanse(c->sec_c, sizeof(c->sec_c));
	OPENSSL_cleanse(c->sec_s, sizeof(c->sec_s));
	c->sec_c_len = c->sec_s_len = 0;
	/* User-space records from now on: read as much as has come. */
	if (!c->ktls_rx)
		SSL_set_read_ahead(c->ssl, 1);
}

/*
 * An OpenSSL error as an errno of the classes a client's reconnect tells
 * apart. -EKEYREJECTED (final: the client never tries again) only for a
 * verdict on the keys: the peer's alert saying so (handshake_failure,
 * decrypt_error, unknown_psk_identity, access_denied, a certificate's;
 * illegal_parameter too, which OpenSSL sends for a binder that does not
 * verify: a wrong key),
 * a binder that does not verify, a handshake left without the PSK (no
 * cipher or signature to fall back on). Our own trouble (no memory, a PSK
 * session we could not make, an internal error) and the peer's
 * internal_error alert are transient (-ENOMEM, -EIO); anything else is a
 * stream that does not speak our TLS (-EPROTO), also retried.
 */
static int ssl_reason_errno(unsigned long le)
{
	int r = ERR_GET_REASON(le);

	if (ERR_GET_LIB(le) == ERR_LIB_SSL && r >= SSL_AD_REASON_OFFSET) {
		switch (r - SSL_AD_REASON_OFFSET) {
		case SSL_AD_HANDSHAKE_FAILURE:
		case SSL_AD_ILLEGAL_PARAMETER:
		case SSL_AD_DECRYPT_ERROR:
		case SSL_AD_UNKNOWN_PSK_IDENTITY:
		case SSL_AD_ACCESS_DENIED:
		case SSL_AD_BAD_CERTIFICATE:
		case SSL_AD_UNSUPPORTED_CERTIFICATE:
		case SSL_AD_CERTIFICATE_REVOKED:
		case SSL_AD_CERTIFICATE_EXPIRED:
		case SSL_AD_CERTIFICATE_UNKNOWN:
		case SSL_AD_UNKNOWN_CA:
		case SSL_AD_CERTIFICATE_REQUIRED:
			return -EKEYREJECTED;
		case SSL_AD_INTERNAL_ERROR:
			return -EIO;
		default:
			return -EPROTO;
		}
	}
	if (r == ERR_R_MALLOC_FAILURE)
		return -ENOMEM;
	if (r == ERR_R_INTERNAL_ERROR || (ERR_GET_LIB(le) == ERR_LIB_SSL && r == SSL_R_BAD_PSK))
		return -EIO;
	if (ERR_GET_LIB(le) == ERR_LIB_SSL) {
		switch (r) {
		case SSL_R_BINDER_DOES_NOT_VERIFY:
		case SSL_R_NO_SHARED_CIPHER:
		case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM:
		case SSL_R_CERTIFICATE_VERIFY_FAILED:
		case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
			return -EKEYREJECTED;
		default:
			break;
		}
	}
	return -EPROTO;
}

/* Why an SSL call failed, as an errno; the reason into c->err. Under c->lock. */
static int ssl_fail(struct rtrs_tls *c, int r, const char *what)
{
	int e = SSL_get_error(c->ssl, r);
	unsigned long le = ERR_peek_last_error();
	int rc;

	if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && !le)) {
		set_err(c, "%s: %s", what, c->sock_err ? strerror(c->sock_err) :
			"the peer closed the connection");
		rc = -ECONNRESET;
	} else if (le && (ERR_GET_REASON(le) == SSL_R_WRONG_VERSION_NUMBER ||
			  ERR_GET_REASON(le) == SSL_R_PACKET_LENGTH_TOO_LONG)) {
		set_err(c, "%s: the peer does not speak TLS (%s)", what,
			ERR_reason_error_string(le));
		rc = -EPROTO;
	} else {
		set_err(c, "%s: %s", what, le ? ERR_reason_error_string(le) : "failed");
		rc = le ? ssl_reason_errno(le) : -EPROTO;
	}
	ERR_clear_error();
	return rc;
}

/* The handshake finished while its last flight waited for the socket: kTLS now. */
static void ktls_late(struct rtrs_tls *c)
{
	if (c->done && (c->sec_c_len || c->sec_s_len) && !c->out)
		ktls_try(c);
}

int rtrs_tls_handshake(struct rtrs_tls *c, bool *want_write)
{
	int r, prc, rc;

	*want_write = false;
	pthread_mutex_lock(&c->lock);
	if (c->done) {
		prc = push_locked(c);
		if (!prc)
			ktls_late(c);
		pthread_mutex_unlock(&c->lock);
		if (prc == -EAGAIN)
			*want_write = true;
		return prc == -EAGAIN ? -EAGAIN : prc ? -ECONNRESET : 0;
	}
	ERR_clear_error();
	r = SSL_do_handshake(c->ssl);
	prc = push_locked(c);
	if (r == 1) {
		if (!SSL_session_reused(c->ssl)) {
			set_err(c, "TLS handshake without the PSK");
			rc = -EKEYREJECTED;
		} else if (prc && prc != -EAGAIN) {
			set_err(c, "TLS handshake: %s", strerror(-prc));
			rc = -ECONNRESET;
		} else {
			c->done = true;
			/* The last flight is on its way; kTLS wants nothing of ours left in user space. */
			if (!prc)
				ktls_try(c);
			rc = prc;
			*want_write = prc == -EAGAIN;
		}
		pthread_mutex_unlock(&c->lock);
		return rc;
	}
	switch (SSL_get_error(c->ssl, r)) {
	case SSL_ERROR_WANT_READ:
		rc = -EAGAIN;
		*want_write = prc == -EAGAIN;
		break;
	case SSL_ERROR_WANT_WRITE:
		rc = -EAGAIN;
		*want_write = true;
		break;
	default:
		rc = ssl_fail(c, r, "TLS handshake");
		break;
	}
	if (prc && prc != -EAGAIN && rc == -EAGAIN) {
		set_err(c, "TLS handshake: %s", strerror(-prc));
		rc = -ECONNRESET;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

ssize_t rtrs_tls_writev(struct rtrs_tls *c, const struct iovec *iov, unsigned n)
{
	size_t total = 0;
	unsigned i = 0;
	size_t ioff = 0;   /* within iov[i] */
	int err = 0;

	if (c->ktls_tx) {
		/* The kernel makes the records (its receive side stayed with us). */
		struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = n };

		return sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	pthread_mutex_lock(&c->lock);
	for (;;) {
		size_t len, got = 0;
		const void *src;
		size_t w;

		if (c->out && c->out_len - c->out_off > TLS_OUT_MAX - TLS_REC_ROOM) {
			int prc = push_locked(c);

			if (prc && prc != -EAGAIN) {
				err = -prc;
				break;
			}
			if (c->out && c->out_len - c->out_off > TLS_OUT_MAX - TLS_REC_ROOM)
				break;
		}
		while (i < n && ioff == iov[i].iov_len) {
			i++;
			ioff = 0;
		}
		if (i == n)
			break;
		len = c->wpend ? c->wpend : TLS_REC;
		if (iov[i].iov_len - ioff >= len) {
			src = (const char *)iov[i].iov_base + ioff;
			got = len;
		} else {
			if (!c->stage && !(c->stage = malloc(TLS_REC))) {
				err = ENOMEM;
				break;
			}
			for (unsigned j = i; j < n && got < len; j++) {
				size_t o = j == i ? ioff : 0;
				size_t take = MIN(len - got, iov[j].iov_len - o);

				memcpy(c->stage + got, (const char *)iov[j].iov_base + o, take);
				got += take;
			}
			src = c->stage;
		}
		if (c->wpend && got != c->wpend) {
			/* The bytes SSL_write holds must come again, all of them. */
			err = EIO;
			break;
		}
		ERR_clear_error();
		if (SSL_write_ex(c->ssl, src, got, &w)) {
			c->wpend = 0;
			total += got;
			/* Advance over got bytes. */
			while (got) {
				size_t take = MIN(got, iov[i].iov_len - ioff);

				ioff += take;
				got -= take;
				if (ioff == iov[i].iov_len && got) {
					i++;
					ioff = 0;
				}
			}
			continue;
		}
		if (SSL_get_error(c->ssl, 0) == SSL_ERROR_WANT_WRITE) {
			c->wpend = got;
			ERR_clear_error();
			break;
		}
		err = ssl_fail(c, 0, "TLS send") == -ECONNRESET ? EPIPE : EPROTO;
		break;
	}
	if (!err) {
		int prc = push_locked(c);

		if (prc && prc != -EAGAIN)
			err = -prc;
	}
	ktls_late(c);
	pthread_mutex_unlock(&c->lock);
	if (err && !total) {
		errno = err;
		return -1;
	}
	if (!total) {
		errno = EAGAIN;
		return -1;
	}
	return (ssize_t)total;
}

ssize_t rtrs_tls_readv(struct rtrs_tls *c, const struct iovec *iov, unsigned n)
{
	size_t total = 0;
	int err = 0;
	bool blocked = false;

	pthread_mutex_lock(&c->lock);
	for (unsigned i = 0; i < n && !blocked && !err; i++) {
		size_t off = 0;

		while (off < iov[i].iov_len) {
			size_t got;
			int r;

			ERR_clear_error();
			r = SSL_read_ex(c->ssl, (char *)iov[i].iov_base + off, iov[i].iov_len - off,
					&got);
			if (r) {
				off += got;
				total += got;
				continue;
			}
			switch (SSL_get_error(c->ssl, r)) {
			case SSL_ERROR_WANT_READ:
			case SSL_ERROR_WANT_WRITE:
				ERR_clear_error();
				blocked = true;
				break;
			default:
				err = ssl_fail(c, r, "TLS receive") == -ECONNRESET ? ECONNRESET :
										   EPROTO;
				break;
			}
			break;
		}
	}
	c->rblocked = blocked;
	/* Whatever reading made OpenSSL say (an alert, a key update's answer). */
	if (c->out && c->out_off < c->out_len)
		push_locked(c);
	pthread_mutex_unlock(&c->lock);
	if (total)
		return (ssize_t)total;
	errno = err ? err : EAGAIN;
	return -1;
}
