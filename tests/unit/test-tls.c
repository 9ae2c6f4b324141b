/* SPDX-License-Identifier: MIT */
/*
 * TLS under the tcp fabric (lib/rtrs/rtrs-tls.c, docs/security.md section
 * 9): the NVMe interchange format and its refusals, keys written by
 * nvme-cli, identities, the PSK binding, key files with tls= fields, and
 * whole handshakes and records between a client and a server on a socket
 * pair: bytes through in both directions as written, a wrong key, an
 * unknown host, a derived key, a SHA-384 key; generated PSKs (secure
 * channel concatenation): refused until the server has them, bound to
 * their host and digest, the least recently used pushed out.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "rtrs-tls.h"
#include "util.h"

#define SECRET_A "DHHC-1:00:LO8u2NM6dzYMKk5cNdu/JyuHVwHasEznfJE+2d3d/R1Dlfga:"
#define TLS_A "NVMeTLSkey-1:01:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNw:"

static void test_key_format(void)
{
	struct rtrs_auth_key k, k2;
	char buf[RTRS_AUTH_KEY_STR_MAX];
	const char *why = NULL;
	uint32_t st, co;

	CHECK_EQ(rtrs_tls_key_check(TLS_A, &k, &st, &co, &why), 0);
	CHECK_EQ(k.hmac, 1);
	CHECK_EQ(k.len, 32);
	CHECK_EQ(st, co);
	CHECK_EQ(rtrs_tls_key_format(&k, buf, sizeof(buf)), 0);
	CHECK(!strcmp(buf, TLS_A), "%s", buf);
	CHECK_EQ(rtrs_tls_key_check("  " TLS_A "\n", &k2, NULL, NULL, &why), 0);
	CHECK(!memcmp(k.key, k2.key, 32));

	/* A DHHC-1 secret is not a TLS key, nor the other way round. */
	CHECK_EQ(rtrs_tls_key_check(SECRET_A, &k, NULL, NULL, &why), -EINVAL);
	CHECK(why && strstr(why, "NVMeTLSkey-1"), "%s", why);
	CHECK_EQ(rtrs_auth_key_parse(TLS_A, &k, &why), -EINVAL);
	/* 00 and 03 are DH-HMAC-CHAP's, not TLS's. */
	CHECK_EQ(rtrs_tls_key_check("NVMeTLSkey-1:00:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNw:",
				    &k, NULL, NULL, &why), -EINVAL);
	CHECK(why && !strcmp(why, "Invalid HMAC identifier"), "%s", why);
	CHECK_EQ(rtrs_tls_key_check("NVMeTLSkey-1:03:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNw:",
				    &k, NULL, NULL, &why), -EINVAL);
	/* 02 says 48 bytes: a 32-byte key under it is the wrong length. */
	CHECK_EQ(rtrs_tls_key_check("NVMeTLSkey-1:02:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNw:",
				    &k, NULL, NULL, &why), -EINVAL);
	CHECK(why && !strcmp(why, "Invalid key length"), "%s", why);
	/* One character changed: the CRC. */
	CHECK_EQ(rtrs_tls_key_check("NVMeTLSkey-1:01:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNx:",
				    &k, NULL, NULL, &why), -EKEYREJECTED);
	CHECK_EQ(rtrs_tls_key_check("NVMeTLSkey-1:01:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNw",
				    &k, NULL, NULL, &why), -EINVAL);
	CHECK(why && !strcmp(why, "Missing the trailing ':'"), "%s", why);
	k.hmac = 2;
	k.len = 32;
	CHECK_EQ(rtrs_tls_key_format(&k, buf, sizeof(buf)), -EINVAL);
}

/* Keys nvme-cli makes, of both hashes, parse and format back the same. */
static void test_nvme_cli(void)
{
	for (int h = 1; h <= 2; h++) {
		char cmd[64], line[256], buf[RTRS_AUTH_KEY_STR_MAX];
		struct rtrs_auth_key k;
		const char *why = NULL;
		FILE *p;

		snprintf(cmd, sizeof(cmd), "nvme gen-tls-key --hmac=%d 2>/dev/null", h);
		p = popen(cmd, "r");
		if (!p || !fgets(line, sizeof(line), p)) {
			if (p)
				pclose(p);
			printf("skip: nvme gen-tls-key is not here\n");
			g_skipped_parts++;
			return;
		}
		pclose(p);
		line[strcspn(line, "\n")] = '\0';
		CHECK_EQ(rtrs_tls_key_check(line, &k, NULL, NULL, &why), 0);
		CHECK_EQ(k.hmac, h);
		CHECK_EQ(k.len, h == 1 ? 32 : 48);
		CHECK_EQ(rtrs_tls_key_format(&k, buf, sizeof(buf)), 0);
		CHECK(!strcmp(buf, line), "%s vs %s", buf, line);
	}
}

static void test_identity(void)
{
	char id[RTRS_TLS_IDENTITY_MAX + 1], host[RTRS_AUTH_NAME_MAX + 1];
	char server[RTRS_AUTH_NAME_MAX + 1], long_name[300];
	char digest[RTRS_TLS_DIGEST_LEN + 1];
	const char *why = NULL;
	const char *dg = "0123456789abcdef0123456789abcdef";
	enum rtrs_tls_kind kind;
	unsigned hash;

	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_CONFIGURED, 2, "host-a", "srv", NULL, id, sizeof(id)), 0);
	CHECK(!strcmp(id, "RTRS0R02 host-a srv"), "%s", id);
	CHECK_EQ(rtrs_tls_identity_parse(id, strlen(id), &kind, &hash, host, server, digest, &why),
		 0);
	CHECK(kind == RTRS_TLS_CONFIGURED && hash == 2 && !strcmp(host, "host-a") &&
	      !strcmp(server, "srv") && !digest[0]);
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_DERIVED, 1, "h", "s", NULL, id, sizeof(id)), 0);
	CHECK(!strcmp(id, "RTRS0D01 h s"), "%s", id);
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_DERIVED, 2, "h", "s", NULL, id, sizeof(id)), -EINVAL);
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_CONFIGURED, 1, "a b", "s", NULL, id, sizeof(id)),
		 -EINVAL);
	memset(long_name, 'x', 224);
	long_name[224] = '\0';
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_CONFIGURED, 1, long_name, "s", NULL, id, sizeof(id)),
		 -EINVAL);
	/* Generated: a digest, and only there. */
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_GENERATED, 2, "h", "s", dg, id, sizeof(id)), 0);
	CHECK(!strcmp(id, "RTRS0G02 h s 0123456789abcdef0123456789abcdef"), "%s", id);
	CHECK_EQ(rtrs_tls_identity_parse(id, strlen(id), &kind, &hash, host, server, digest, &why),
		 0);
	CHECK(kind == RTRS_TLS_GENERATED && hash == 2 && !strcmp(host, "h") &&
	      !strcmp(server, "s") && !strcmp(digest, dg));
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_GENERATED, 1, "h", "s", NULL, id, sizeof(id)), -EINVAL);
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_CONFIGURED, 1, "h", "s", dg, id, sizeof(id)), -EINVAL);
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_GENERATED, 1, "h", "s", "0123", id, sizeof(id)),
		 -EINVAL);
	memset(long_name, 'x', 223);
	long_name[223] = '\0';
	CHECK_EQ(rtrs_tls_identity(RTRS_TLS_GENERATED, 2, long_name, long_name, dg, id, sizeof(id)),
		 0);
	CHECK_EQ(strlen(id), RTRS_TLS_IDENTITY_MAX);

	static const char *const bad[] = {
		"", "RTRS0R01", "RTRS0R01 host", "RTRS0X01 h s", "RTRS0R03 h s", "RTRS0D02 h s",
		"NVMe0R01 h s", "RTRS0R01 h  s", "RTRS0R01  h s", "RTRS0R01 h s\x01",
		"RTRS0G01 h s", "RTRS0G01 h s 0123456789abcdef0123456789abcde",
		"RTRS0G01 h s 0123456789abcdef0123456789abcdeF", "RTRS0R01 h s 0123",
		"RTRS0G01 h s 0123456789abcdef0123456789abcdef ",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_EQ(rtrs_tls_identity_parse(bad[i], strlen(bad[i]), &kind, &hash, host,
						 server, digest, &why), -EINVAL);
}

static void test_psk(void)
{
	struct rtrs_auth_key k, s;
	uint8_t a[48], b[48], c[48];
	size_t al, bl, cl;
	const char *why;

	CHECK_EQ(rtrs_tls_key_check(TLS_A, &k, NULL, NULL, &why), 0);
	CHECK_EQ(rtrs_auth_key_parse(SECRET_A, &s, &why), 0);
	CHECK_EQ(rtrs_tls_psk(&k, RTRS_TLS_CONFIGURED, "RTRS0R01 a srv", a, &al), 0);
	CHECK_EQ(rtrs_tls_psk(&k, RTRS_TLS_CONFIGURED, "RTRS0R01 a srv", b, &bl), 0);
	CHECK_EQ(rtrs_tls_psk(&k, RTRS_TLS_CONFIGURED, "RTRS0R01 b srv", c, &cl), 0);
	CHECK_EQ(al, 32);
	CHECK(!memcmp(a, b, 32), "the same key and identity give the same PSK");
	CHECK(memcmp(a, c, 32), "another identity, another PSK");
	CHECK(memcmp(a, k.key, 32), "the PSK is not the configured key itself");
	CHECK_EQ(rtrs_tls_psk(&s, RTRS_TLS_DERIVED, "RTRS0D01 a srv", c, &cl), 0);
	CHECK_EQ(cl, 32);
	k.len = 0;
	CHECK_EQ(rtrs_tls_psk(&k, RTRS_TLS_CONFIGURED, "RTRS0R01 a srv", a, &al), -ENOKEY);
}

/* ---- handshakes on a socket pair ------------------------------------------------------ */

static char keys_path[64];

static int write_keys(const char *text)
{
	FILE *f = fopen(keys_path, "w");

	if (!f)
		return -errno;
	fputs(text, f);
	fclose(f);
	return 0;
}

/* Both handshakes to their end: 0 each, or the first error of each side. */
static void pump(struct rtrs_tls *c, struct rtrs_tls *s, int *crc, int *src)
{
	bool ww;

	*crc = *src = -EAGAIN;
	for (int i = 0; i < 200 && (*crc == -EAGAIN || *src == -EAGAIN); i++) {
		if (*crc == -EAGAIN)
			*crc = rtrs_tls_handshake(c, &ww);
		if (*src == -EAGAIN)
			*src = rtrs_tls_handshake(s, &ww);
		if (*crc != -EAGAIN && *crc && *src == -EAGAIN) {
			/* One side failed: the other reads its alert, or the end. */
			usleep(1000);
		}
	}
}

/* n bytes of a pattern one way, in writes of odd sizes; what arrives must equal it. */
static bool transfer(struct rtrs_tls *from, struct rtrs_tls *to, size_t n, unsigned seed)
{
	uint8_t *src = malloc(n), *dst = malloc(n);
	size_t sent = 0, got = 0;
	bool ok = false;

	if (!src || !dst)
		goto out;
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(i * 131 + seed + (i >> 9));
	for (int rounds = 0; rounds < 100000 && got < n; rounds++) {
		if (sent < n) {
			size_t a = MIN(n - sent, 1 + (sent * 7 + 4093) % 20000);
			size_t b = MIN(n - sent - a, 3 + (sent % 5000));
			struct iovec iov[2] = { { src + sent, a }, { src + sent + a, b } };
			ssize_t w = rtrs_tls_writev(from, iov, b ? 2 : 1);

			if (w < 0 && errno != EAGAIN)
				goto out;
			if (w > 0)
				sent += (size_t)w;
		} else if (rtrs_tls_pending(from)) {
			int rc = rtrs_tls_push(from);

			if (rc && rc != -EAGAIN)
				goto out;
		}
		struct iovec in = { dst + got, MIN(n - got, 7000) };
		ssize_t r = rtrs_tls_readv(to, &in, 1);

		if (r < 0 && errno != EAGAIN)
			goto out;
		if (r > 0)
			got += (size_t)r;
	}
	ok = got == n && !memcmp(src, dst, n);
out:
	free(src);
	free(dst);
	return ok;
}

struct pair {
	int fd[2];
	struct rtrs_tls_ctx *cctx, *sctx;
	struct rtrs_tls *c, *s;
	int crc, src;
};

static int pair_open(struct pair *p, const char *host, const char *tls_key, const char *secret,
		     const char *server_name)
{
	struct rtrs_auth_key tk = { 0 }, hk = { 0 };
	const char *why = NULL;
	unsigned line = 0;
	int rc;

	memset(p, 0, sizeof(*p));
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p->fd))
		return -errno;
	if (tls_key)
		CHECK_EQ(rtrs_tls_key_check(tls_key, &tk, NULL, NULL, &why), 0);
	if (secret)
		CHECK_EQ(rtrs_auth_key_parse(secret, &hk, &why), 0);
	rc = rtrs_tls_ctx_client(host, server_name, &tk, &hk, true, &p->cctx);
	if (rc)
		return rc;
	rc = rtrs_tls_ctx_server("srv", keys_path, true, &p->sctx, &line, &why);
	CHECK_EQ(rc, 0);
	if (rc)
		return rc;
	CHECK_EQ(rtrs_tls_new(p->cctx, p->fd[0], false, "client", &p->c), 0);
	CHECK_EQ(rtrs_tls_new(p->sctx, p->fd[1], true, "server", &p->s), 0);
	pump(p->c, p->s, &p->crc, &p->src);
	return 0;
}

static void pair_close(struct pair *p)
{
	rtrs_tls_free(p->c);
	rtrs_tls_free(p->s);
	if (p->cctx)
		rtrs_tls_ctx_put(p->cctx);
	if (p->sctx)
		rtrs_tls_ctx_put(p->sctx);
	close(p->fd[0]);
	close(p->fd[1]);
}

/* One handshake of a generated PSK against a server context that may know it. */
static void gen_round(struct rtrs_tls_ctx *sctx, const char *host, const struct rtrs_auth_key *k,
		      const char *digest, int want, const char *why, const char *err)
{
	struct pair p;

	memset(&p, 0, sizeof(p));
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, p.fd), 0);
	CHECK_EQ(rtrs_tls_ctx_client_generated(host, "srv", k, digest, true, &p.cctx), 0);
	rtrs_tls_ctx_get(sctx);
	p.sctx = sctx;
	CHECK_EQ(rtrs_tls_new(p.cctx, p.fd[0], false, "client", &p.c), 0);
	CHECK_EQ(rtrs_tls_new(p.sctx, p.fd[1], true, "server", &p.s), 0);
	pump(p.c, p.s, &p.crc, &p.src);
	CHECK(p.crc == want && p.src == want, "%s: %d %d", why, p.crc, p.src);
	if (!want) {
		CHECK(!strcmp(rtrs_tls_peer_host(p.s), host));
		CHECK(transfer(p.c, p.s, 100000, 6), "%s", why);
	} else {
		CHECK(strstr(rtrs_tls_error(p.s), err), "%s: %s", why, rtrs_tls_error(p.s));
	}
	pair_close(&p);
}

/* Secure channel concatenation's PSKs: only what the server was given, by host and digest. */
static void test_generated(void)
{
	struct rtrs_tls_ctx *sctx = NULL;
	struct rtrs_auth_key k, k2, k384;
	char d[RTRS_TLS_DIGEST_LEN + 1], d2[RTRS_TLS_DIGEST_LEN + 1], d384[RTRS_TLS_DIGEST_LEN + 1];
	uint8_t raw[64];
	const char *why = NULL;
	unsigned line = 0;

	for (int i = 0; i < 64; i++)
		raw[i] = (uint8_t)(i * 13 + 5);
	CHECK_EQ(write_keys("host-a " SECRET_A "\n"), 0);
	CHECK_EQ(rtrs_tls_ctx_server("srv", keys_path, true, &sctx, &line, &why), 0);
	CHECK_EQ(rtrs_tls_generated(raw, 32, 1, "host-a", "srv", &k, d), 0);
	CHECK(k.hmac == 1 && k.len == 32 && strlen(d) == RTRS_TLS_DIGEST_LEN);
	CHECK_EQ(rtrs_tls_generated(raw, 48, 2, "host-a", "srv", &k384, d384), 0);
	CHECK(k384.hmac == 2 && strcmp(d, d384));
	raw[0] ^= 1;
	CHECK_EQ(rtrs_tls_generated(raw, 32, 1, "host-a", "srv", &k2, d2), 0);
	CHECK(strcmp(d, d2), "another PSK, another digest");
	CHECK_EQ(rtrs_tls_generated(raw, 16, 1, "host-a", "srv", &k2, d2), -EINVAL);
	CHECK_EQ(rtrs_tls_generated(raw, 32, 4, "host-a", "srv", &k2, d2), -EINVAL);

	gen_round(sctx, "host-a", &k, d, -EKEYREJECTED, "not given to the server yet",
		  "generated PSK this server does not have");
	CHECK_EQ(rtrs_tls_ctx_add_generated(sctx, "host-a", &k, d), 0);
	CHECK_EQ(rtrs_tls_ctx_add_generated(sctx, "host-a", &k384, d384), 0);
	gen_round(sctx, "host-a", &k, d, 0, "SHA-256, given", NULL);
	gen_round(sctx, "host-a", &k, d, 0, "used again by another connection of the path", NULL);
	gen_round(sctx, "host-a", &k384, d384, 0, "SHA-384, given", NULL);
	gen_round(sctx, "host-b", &k, d, -EKEYREJECTED, "another host presenting it",
		  "generated PSK this server does not have");
	gen_round(sctx, "host-a", &k2, d, -EKEYREJECTED, "another PSK under its digest",
		  "binder");
	CHECK_EQ(rtrs_tls_ctx_add_generated(sctx, "host-a", &k, "xyz"), -EINVAL);
	CHECK_EQ(rtrs_tls_ctx_add_generated(sctx, "a b", &k, d), -EINVAL);
	/* At most RTRS_TLS_GENERATED_PER_HOST per host: the least recently used goes. */
	for (int i = 0; i < RTRS_TLS_GENERATED_PER_HOST; i++) {
		raw[1] = (uint8_t)i;
		CHECK_EQ(rtrs_tls_generated(raw, 32, 1, "host-a", "srv", &k2, d2), 0);
		CHECK_EQ(rtrs_tls_ctx_add_generated(sctx, "host-a", &k2, d2), 0);
	}
	gen_round(sctx, "host-a", &k2, d2, 0, "the newest of many", NULL);
	gen_round(sctx, "host-a", &k, d, -EKEYREJECTED, "the oldest, pushed out",
		  "generated PSK this server does not have");
	/* A host removed from the key file loses its generated PSKs at the reload. */
	CHECK_EQ(write_keys("host-b " SECRET_A "\n"), 0);
	CHECK_EQ(rtrs_tls_ctx_reload(sctx, &line, &why), 0);
	gen_round(sctx, "host-a", &k2, d2, -EKEYREJECTED, "its host removed from the key file",
		  "generated PSK this server does not have");
	rtrs_tls_ctx_put(sctx);
}

static void test_handshakes(void)
{
	struct pair p;
	char text[1024];
	char d[96];
	char tls384[RTRS_AUTH_KEY_STR_MAX];
	struct rtrs_auth_key k384 = { .hmac = 2, .len = 48 };

	for (int i = 0; i < 48; i++)
		k384.key[i] = (uint8_t)(i * 7 + 1);
	CHECK_EQ(rtrs_tls_key_format(&k384, tls384, sizeof(tls384)), 0);
	snprintf(text, sizeof(text),
		 "# hosts\nhost-a %s tls=%s\nhost-b %s tls=%s\nhost-c %s\n", SECRET_A, TLS_A,
		 SECRET_A, tls384, SECRET_A);
	CHECK_EQ(write_keys(text), 0);

	/* A configured SHA-256 key: both ends up, bytes through both ways. */
	CHECK_EQ(pair_open(&p, "host-a", TLS_A, SECRET_A, "srv"), 0);
	CHECK_EQ(p.crc, 0);
	CHECK_EQ(p.src, 0);
	rtrs_tls_describe(p.c, d, sizeof(d));
	CHECK(strstr(d, "TLS_AES_128_GCM_SHA256") && strstr(d, "user-space"), "%s", d);
	CHECK(!rtrs_tls_ktls(p.c), "a socket pair has no kernel TLS");
	CHECK(transfer(p.c, p.s, 3 << 20, 1), "3 MiB client to server");
	CHECK(transfer(p.s, p.c, 1 << 20, 2), "1 MiB server to client");
	CHECK(transfer(p.c, p.s, 1, 3), "one byte");
	CHECK(!rtrs_tls_drained(p.s), "a read that filled its buffer may have left some");
	{
		char b[64];
		struct iovec iov = { b, sizeof(b) };

		CHECK(rtrs_tls_readv(p.s, &iov, 1) == -1 && errno == EAGAIN);
		CHECK(rtrs_tls_drained(p.s), "nothing held after a read that wanted more");
	}
	pair_close(&p);

	/* SHA-384: the other suite. */
	CHECK_EQ(pair_open(&p, "host-b", tls384, SECRET_A, "srv"), 0);
	CHECK_EQ(p.crc, 0);
	CHECK_EQ(p.src, 0);
	rtrs_tls_describe(p.s, d, sizeof(d));
	CHECK(strstr(d, "TLS_AES_256_GCM_SHA384"), "%s", d);
	CHECK(transfer(p.c, p.s, 1 << 20, 4));
	pair_close(&p);

	/* Derived from the DH-HMAC-CHAP secret (host-c has no tls=). */
	CHECK_EQ(pair_open(&p, "host-c", NULL, SECRET_A, "srv"), 0);
	CHECK_EQ(p.crc, 0);
	CHECK_EQ(p.src, 0);
	CHECK(transfer(p.s, p.c, 100000, 5));
	pair_close(&p);

	/* A wrong key: refused on both sides with a reason. */
	CHECK_EQ(pair_open(&p, "host-a", "NVMeTLSkey-1:01:FagO4pLhzIZB4L6Bii5lZ2joOQIbZQx4Fe5BDGGibeL+Y1fu:",
			   SECRET_A, "srv"), 0);
	CHECK_EQ(p.crc, -EKEYREJECTED);
	CHECK_EQ(p.src, -EKEYREJECTED);
	CHECK(strstr(rtrs_tls_error(p.s), "binder"), "%s", rtrs_tls_error(p.s));
	pair_close(&p);

	/* A host the file does not list; one without tls= asking for a configured key. */
	CHECK_EQ(pair_open(&p, "host-x", TLS_A, SECRET_A, "srv"), 0);
	CHECK_EQ(p.crc, -EKEYREJECTED);
	CHECK(strstr(rtrs_tls_error(p.s), "host host-x is not in the key file"), "%s",
	      rtrs_tls_error(p.s));
	pair_close(&p);
	CHECK_EQ(pair_open(&p, "host-c", TLS_A, SECRET_A, "srv"), 0);
	CHECK_EQ(p.crc, -EKEYREJECTED);
	CHECK(strstr(rtrs_tls_error(p.s), "has no tls= key"), "%s", rtrs_tls_error(p.s));
	pair_close(&p);
	/* The right key for another server's name. */
	CHECK_EQ(pair_open(&p, "host-a", TLS_A, SECRET_A, "other"), 0);
	CHECK_EQ(p.crc, -EKEYREJECTED);
	CHECK(strstr(rtrs_tls_error(p.s), "names server other"), "%s", rtrs_tls_error(p.s));
	pair_close(&p);

	/* No key at all. */
	{
		struct rtrs_auth_key none = { 0 };
		struct rtrs_tls_ctx *t = NULL;

		CHECK_EQ(rtrs_tls_ctx_client("h", "srv", &none, &none, true, &t), -ENOKEY);
	}

	/* Key files: two tls= fields, a bad one, the controller secret after it. */
	{
		struct rtrs_tls_ctx *t = NULL;
		const char *why = NULL;
		unsigned line = 0;

		snprintf(text, sizeof(text), "host-a %s tls=%s tls=%s\n", SECRET_A, TLS_A, TLS_A);
		CHECK_EQ(write_keys(text), 0);
		CHECK_EQ(rtrs_tls_ctx_server("srv", keys_path, true, &t, &line, &why), -EINVAL);
		CHECK(line == 1 && why && !strcmp(why, "two TLS keys"), "%u %s", line, why);
		snprintf(text, sizeof(text), "\nhost-a %s tls=NVMeTLSkey-1:01:AAAA:\n", SECRET_A);
		CHECK_EQ(write_keys(text), 0);
		CHECK_EQ(rtrs_tls_ctx_server("srv", keys_path, true, &t, &line, &why), -EINVAL);
		CHECK(line == 2 && why && !strncmp(why, "TLS key: ", 9), "%u %s", line, why);
		snprintf(text, sizeof(text), "host-a %s tls=%s %s\n", SECRET_A, TLS_A, SECRET_A);
		CHECK_EQ(write_keys(text), 0);
		CHECK_EQ(rtrs_tls_ctx_server("srv", keys_path, true, &t, &line, &why), -EINVAL);
		CHECK(why && strstr(why, "before tls="), "%s", why);
		/* The DH-HMAC-CHAP reader takes the same lines. */
		snprintf(text, sizeof(text), "host-a %s %s tls=%s\n", SECRET_A, SECRET_A, TLS_A);
		{
			struct rtrs_auth_key hk, ck;

			CHECK_EQ(rtrs_auth_keyfile_parse(text, strlen(text), "host-a", &hk, &ck,
							 &line, &why), 0);
			CHECK_EQ(ck.len, 32);
		}
	}
}

/*
 * pthread_rwlock_wrlock of this program, which the library's archive linked
 * into it calls: for the one thread slow_thread names, 20 ms late (a
 * thread that read the clock, then waited for the lock).
 */
static pthread_t slow_thread;
static atomic_bool slow_on;

int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	static int (*_Atomic real)(pthread_rwlock_t *);
	int (*fn)(pthread_rwlock_t *) = atomic_load(&real);

	if (!fn) {
		fn = (int (*)(pthread_rwlock_t *))dlsym(RTLD_NEXT, "pthread_rwlock_wrlock");
		atomic_store(&real, fn);
	}
	if (atomic_load(&slow_on) && pthread_equal(pthread_self(), slow_thread))
		usleep(20 * 1000);
	return fn(l);
}

struct gen_add {
	struct rtrs_tls_ctx *sctx;
	struct rtrs_auth_key k;
	char d[RTRS_TLS_DIGEST_LEN + 1];
};

static void *gen_add_slow(void *arg)
{
	struct gen_add *a = arg;

	slow_thread = pthread_self();
	atomic_store(&slow_on, true);
	CHECK_EQ(rtrs_tls_ctx_add_generated(a->sctx, "host-a", &a->k, a->d), 0);
	atomic_store(&slow_on, false);
	return NULL;
}

/*
 * Two concatenated paths' PSKs given to the server at once: the first
 * reads the clock, then waits for the table's lock while the second adds
 * its PSK. The first's expiry must not take the second's entry, used
 * "after" the first's clock, for one unused for ever (the host's next
 * TLS connection would then be refused as with a wrong key: final).
 */
static void test_generated_race(void)
{
	struct rtrs_tls_ctx *sctx = NULL;
	struct gen_add a = { 0 };
	struct rtrs_auth_key k2;
	char d2[RTRS_TLS_DIGEST_LEN + 1];
	uint8_t raw[32];
	const char *why = NULL;
	unsigned line = 0;
	pthread_t t;

	for (int i = 0; i < 32; i++)
		raw[i] = (uint8_t)(i * 7 + 3);
	CHECK_EQ(write_keys("host-a " SECRET_A "\nhost-b " SECRET_A "\n"), 0);
	CHECK_EQ(rtrs_tls_ctx_server("srv", keys_path, true, &sctx, &line, &why), 0);
	if (!sctx)
		return;
	CHECK_EQ(rtrs_tls_generated(raw, 32, 1, "host-a", "srv", &a.k, a.d), 0);
	raw[0] ^= 1;
	CHECK_EQ(rtrs_tls_generated(raw, 32, 1, "host-b", "srv", &k2, d2), 0);
	a.sctx = sctx;
	CHECK_EQ(pthread_create(&t, NULL, gen_add_slow, &a), 0);
	usleep(5 * 1000);
	CHECK_EQ(rtrs_tls_ctx_add_generated(sctx, "host-b", &k2, d2), 0);
	pthread_join(t, NULL);
	gen_round(sctx, "host-b", &k2, d2, 0, "added while another add waited for the lock", NULL);
	gen_round(sctx, "host-a", &a.k, a.d, 0, "the add that waited", NULL);
	rtrs_tls_ctx_put(sctx);
}

/*
 * What the client makes of a peer's answer to its ClientHello: a record
 * given raw on the socket. Only a verdict on the keys is final
 * (-EKEYREJECTED); a peer's internal error, or bytes that are TLS records
 * but not a handshake we can follow, are retried (-EIO, -EPROTO).
 */
static int client_meets(const uint8_t *rec, size_t len)
{
	struct rtrs_auth_key tk = { 0 }, hk = { 0 };
	struct rtrs_tls_ctx *cctx = NULL;
	struct rtrs_tls *c = NULL;
	const char *why = NULL;
	bool ww = false;
	char buf[4096];
	int fd[2], rc = 0;

	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd), 0);
	CHECK_EQ(rtrs_tls_key_check(TLS_A, &tk, NULL, NULL, &why), 0);
	CHECK_EQ(rtrs_tls_ctx_client("host-a", "srv", &tk, &hk, true, &cctx), 0);
	CHECK_EQ(rtrs_tls_new(cctx, fd[0], false, "client", &c), 0);
	if (!c)
		goto out;
	CHECK_EQ(rtrs_tls_handshake(c, &ww), -EAGAIN);
	CHECK(read(fd[1], buf, sizeof(buf)) > 0, "the ClientHello");
	CHECK_EQ(write(fd[1], rec, len), (ssize_t)len);
	rc = rtrs_tls_handshake(c, &ww);
out:
	rtrs_tls_free(c);
	rtrs_tls_ctx_put(cctx);
	close(fd[0]);
	close(fd[1]);
	return rc;
}

static void test_client_verdicts(void)
{
	/* Alerts: fatal (2), then the description. */
	static const uint8_t handshake_failure[] = { 0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 40 };
	static const uint8_t decrypt_error[] = { 0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 51 };
	static const uint8_t internal_error[] = { 0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 80 };
	static const uint8_t decode_error[] = { 0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 50 };
	/* A handshake record whose five bytes are no handshake message. */
	static const uint8_t garbage[] = { 0x16, 0x03, 0x03, 0x00, 0x05, 'h', 'e', 'l', 'l', 'o' };

	CHECK_EQ(client_meets(handshake_failure, sizeof(handshake_failure)), -EKEYREJECTED);
	CHECK_EQ(client_meets(decrypt_error, sizeof(decrypt_error)), -EKEYREJECTED);
	CHECK_EQ(client_meets(internal_error, sizeof(internal_error)), -EIO);
	CHECK_EQ(client_meets(decode_error, sizeof(decode_error)), -EPROTO);
	CHECK_EQ(client_meets(garbage, sizeof(garbage)), -EPROTO);
}

int main(void)
{
	int fd;

	snprintf(keys_path, sizeof(keys_path), "/tmp/test-tls-XXXXXX");
	fd = mkstemp(keys_path);
	if (fd < 0)
		return 1;
	close(fd);
	test_key_format();
	test_nvme_cli();
	test_identity();
	test_psk();
	test_handshakes();
	test_generated();
	test_generated_race();
	test_client_verdicts();
	unlink(keys_path);
	return test_done("test-tls");
}
