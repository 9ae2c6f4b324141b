/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the parsers of secrets (lib/rtrs/rtrs-auth.c): a
 * DHHC-1 string, as given on a command line or in a file, and the server's
 * key file, whose every line is checked at each read.
 *
 * Input layout: byte 0 picks the parser (its low two bits), the rest is its text.
 *   0 secret    [string]  rtrs_auth_key_parse
 *   1 key file  [host length:u8][host][file text]  rtrs_auth_keyfile_parse
 *   2 TLS PSK   [string]  rtrs_tls_key_check (NVMe's interchange format)
 *   3 TLS PSK identity [string]  rtrs_tls_identity_parse (lib/rtrs/rtrs-tls.c)
 *
 * What a parser accepts must hold together: a secret has a legal length
 * and transform, and formats to a string that parses to the same key; a
 * key file lookup that succeeds gives keys that do the same. Every refusal
 * names its reason, and a key file refusal for a malformed line names a
 * line the text has. Texts are heap copies of exactly their length (plus
 * the NUL the parsers are given), so ASan reports a read past them.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rtrs-auth.h"
#include "rtrs-tls.h"

/* A parsed key is well formed, and formatting it gives a string that parses back to it. */
static void key_round_trip(const struct rtrs_auth_key *k)
{
	struct rtrs_auth_key again;
	char text[RTRS_AUTH_MAX_KEY_LEN * 2 + 32];
	const char *why = NULL;

	FAIL_IF(k->len != 32 && k->len != 48 && k->len != 64);
	FAIL_IF(k->hmac > 3);
	FAIL_IF(rtrs_auth_key_format(k, text, sizeof(text)) != 0);
	FAIL_IF(rtrs_auth_key_parse(text, &again, &why) != 0);
	FAIL_IF(again.hmac != k->hmac || again.len != k->len ||
		memcmp(again.key, k->key, k->len));
}

static unsigned count_lines(const char *s, size_t n)
{
	unsigned lines = n ? 1 : 0;

	for (size_t i = 0; i + 1 < n; i++)
		lines += s[i] == '\n';
	return lines;
}

static void fuzz_secret(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1);
	struct rtrs_auth_key k;
	const char *why = NULL;
	int rc;

	if (!s)
		abort();
	memcpy(s, p, n);
	s[n] = '\0';
	rc = rtrs_auth_key_parse(s, &k, &why);
	CHECK_WHY(rc, why);
	FAIL_IF(rc > 0);
	if (!rc)
		key_round_trip(&k);
	free(s);
}

static void fuzz_keyfile(const uint8_t *p, size_t n)
{
	size_t host_len = take8(&p, &n);
	struct rtrs_auth_key hk, ck;
	const char *why = NULL;
	unsigned line = 0;
	char host[256], *text;
	int rc;

	if (host_len > n)
		host_len = n;
	memcpy(host, p, host_len);
	host[host_len] = '\0';
	p += host_len;
	n -= host_len;
	text = malloc(n + 1);
	if (!text)
		abort();
	memcpy(text, p, n);
	text[n] = '\0';
	rc = rtrs_auth_keyfile_parse(text, n, host, &hk, &ck, &line, &why);
	CHECK_WHY(rc, why);
	FAIL_IF(rc > 0);
	if (!rc) {
		key_round_trip(&hk);
		if (ck.len)
			key_round_trip(&ck);
		FAIL_IF(line != 0);
	} else {
		/* A malformed line is named, and it is one the text has. */
		FAIL_IF(line > count_lines(text, n));
		FAIL_IF(hk.len != 0 || ck.len != 0); /* nothing half-parsed is left */
	}
	free(text);
}

/* A TLS PSK: hash 1 with 32 bytes or 2 with 48, and it formats back to a string that parses the same. */
static void fuzz_tls_key(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1), text[RTRS_AUTH_KEY_STR_MAX];
	struct rtrs_auth_key k, again;
	const char *why = NULL;
	int rc;

	if (!s)
		abort();
	memcpy(s, p, n);
	s[n] = '\0';
	rc = rtrs_tls_key_check(s, &k, NULL, NULL, &why);
	CHECK_WHY(rc, why);
	FAIL_IF(rc > 0);
	if (!rc) {
		FAIL_IF(!((k.hmac == 1 && k.len == 32) || (k.hmac == 2 && k.len == 48)));
		FAIL_IF(rtrs_tls_key_format(&k, text, sizeof(text)) != 0);
		FAIL_IF(rtrs_tls_key_check(text, &again, NULL, NULL, &why) != 0);
		FAIL_IF(again.hmac != k.hmac || again.len != k.len || memcmp(again.key, k.key, k.len));
		/* Neither kind of key passes for the other. */
		FAIL_IF(rtrs_auth_key_parse(text, &again, &why) == 0);
	}
	free(s);
}

/* An identity that parses is the one rtrs_tls_identity makes of its parts. */
static void fuzz_tls_identity(const uint8_t *p, size_t n)
{
	char host[RTRS_AUTH_NAME_MAX + 1], server[RTRS_AUTH_NAME_MAX + 1];
	char again[RTRS_TLS_IDENTITY_MAX + 1], digest[RTRS_TLS_DIGEST_LEN + 1];
	const char *why = NULL;
	enum rtrs_tls_kind kind;
	unsigned hash;
	int rc;

	rc = rtrs_tls_identity_parse((const char *)p, n, &kind, &hash, host, server, digest, &why);
	CHECK_WHY(rc, why);
	FAIL_IF(rc > 0);
	if (rc)
		return;
	FAIL_IF(rtrs_tls_identity(kind, hash, host, server,
				  kind == RTRS_TLS_GENERATED ? digest : NULL, again,
				  sizeof(again)) != 0);
	FAIL_IF(strlen(again) != n || memcmp(again, p, n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t which = take8(&data, &size);
	uint8_t *copy = dup_exact(data, size);

	if ((which & 3) == 3)
		fuzz_tls_identity(copy, size);
	else if ((which & 3) == 2)
		fuzz_tls_key(copy, size);
	else if (which & 1)
		fuzz_keyfile(copy, size);
	else
		fuzz_secret(copy, size);
	free(copy);
	return 0;
}
