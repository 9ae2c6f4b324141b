/* SPDX-License-Identifier: MIT */
/*
 * DH-HMAC-CHAP crypto (see rtrs-auth.h): hash and group names, HMAC, the
 * NVMe key transform and responses, FFDHE key agreement. libcrypto does the
 * primitives; this file does the formats and the checks around them. The
 * secrets and key files are rtrs-auth-keys.c.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/dh.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "log.h"
#include "util.h"
#include "rtrs-auth.h"
#include "rtrs-proto.h"

/* NVMe's suffix of the key transform: 17 ASCII bytes, no NUL. */
static const char nvme_suffix[] = "NVMe-over-Fabrics";

/* ---- ids and names ------------------------------------------------------------ */

static const struct {
	const char *name;   /* ours, and the NVMe/kernel spelling without "hmac()" */
	const char *dash;   /* "sha-256" */
	const char *ossl;   /* OpenSSL digest name */
} hashes[RTRS_AUTH_NR_HASHES + 1] = {
	[RTRS_AUTH_HASH_SHA256] = { "sha256", "sha-256", "SHA256" },
	[RTRS_AUTH_HASH_SHA384] = { "sha384", "sha-384", "SHA384" },
	[RTRS_AUTH_HASH_SHA512] = { "sha512", "sha-512", "SHA512" },
};

/* Sizes (digests, moduli) are the wire's: rtrs_auth_wire_hash_len/_dh_len. */
static const char *const dhgroups[RTRS_AUTH_NR_DHGROUPS] = {
	[RTRS_AUTH_DH_NULL] = "null",
	[RTRS_AUTH_DH_FFDHE2048] = "ffdhe2048",
	[RTRS_AUTH_DH_FFDHE3072] = "ffdhe3072",
	[RTRS_AUTH_DH_FFDHE4096] = "ffdhe4096",
	[RTRS_AUTH_DH_FFDHE6144] = "ffdhe6144",
	[RTRS_AUTH_DH_FFDHE8192] = "ffdhe8192",
};

static bool hash_valid(unsigned hash)
{
	return hash >= RTRS_AUTH_HASH_SHA256 && hash <= RTRS_AUTH_HASH_SHA512;
}

size_t rtrs_auth_hash_len(unsigned hash)
{
	return hash_valid(hash) ? rtrs_auth_wire_hash_len(hash) : 0;
}

const char *rtrs_auth_hash_name(unsigned hash)
{
	return hash_valid(hash) ? hashes[hash].name : NULL;
}

/* Matches s[0..n) against a NUL-terminated name, ignoring case. */
static bool name_eq(const char *s, size_t n, const char *name)
{
	return strlen(name) == n && !strncasecmp(s, name, n);
}

static int hash_from(const char *s, size_t n)
{
	/* The kernel's configfs and sysfs spell it "hmac(sha256)". */
	if (n > 6 && !strncasecmp(s, "hmac(", 5) && s[n - 1] == ')') {
		s += 5;
		n -= 6;
	}
	for (unsigned i = RTRS_AUTH_HASH_SHA256; i <= RTRS_AUTH_HASH_SHA512; i++)
		if (name_eq(s, n, hashes[i].name) || name_eq(s, n, hashes[i].dash))
			return (int)i;
	return -EINVAL;
}

int rtrs_auth_hash_from_name(const char *name)
{
	return name ? hash_from(name, strlen(name)) : -EINVAL;
}

const char *rtrs_auth_dhgroup_name(unsigned group)
{
	return group < RTRS_AUTH_NR_DHGROUPS ? dhgroups[group] : NULL;
}

static int dhgroup_from(const char *s, size_t n)
{
	for (unsigned i = 0; i < RTRS_AUTH_NR_DHGROUPS; i++)
		if (name_eq(s, n, dhgroups[i]))
			return (int)i;
	return -EINVAL;
}

int rtrs_auth_dhgroup_from_name(const char *name)
{
	return name ? dhgroup_from(name, strlen(name)) : -EINVAL;
}

size_t rtrs_auth_dh_len(unsigned group)
{
	return group < RTRS_AUTH_NR_DHGROUPS ? rtrs_auth_wire_dh_len(group) : 0;
}

static int id_list(const char *list, uint8_t *ids, size_t max, const char **why,
		   int (*from)(const char *, size_t), const char *unknown)
{
	size_t n = 0;
	const char *p = list;

	if (!list || !ids)
		REJECT(-EINVAL, "no list");
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		int id;

		/* Spaces after commas are common in config files. */
		while (len && isspace((unsigned char)*p)) {
			p++;
			len--;
		}
		while (len && isspace((unsigned char)p[len - 1]))
			len--;
		if (!len)
			REJECT(-EINVAL, "empty name in list");
		id = from(p, len);
		if (id < 0)
			REJECT(-EINVAL, unknown);
		for (size_t i = 0; i < n; i++)
			if (ids[i] == id)
				REJECT(-EINVAL, "name listed twice");
		if (n == max)
			REJECT(-EINVAL, "too many names in list");
		ids[n++] = (uint8_t)id;
		if (!end)
			break;
		p = end + 1;
	}
	return (int)n;
}

int rtrs_auth_hash_list(const char *list, uint8_t *ids, size_t max, const char **why)
{
	return id_list(list, ids, max, why, hash_from, "unknown hash name");
}

int rtrs_auth_dhgroup_list(const char *list, uint8_t *ids, size_t max, const char **why)
{
	return id_list(list, ids, max, why, dhgroup_from, "unknown DH group name");
}

/* ---- helpers ------------------------------------------------------------------- */

int rtrs_auth_random(void *buf, size_t len)
{
	if (len > INT_MAX)
		return -EINVAL;
	if (RAND_bytes(buf, (int)len) != 1) {
		ERR_clear_error();
		return -EIO;
	}
	return 0;
}

static pthread_once_t seq_once = PTHREAD_ONCE_INIT;
static _Atomic uint32_t seq_next;

static void seq_init(void)
{
	uint32_t v;

	/* A random start keeps a restarted peer from replaying old numbers. */
	if (rtrs_auth_random(&v, sizeof(v)) && rand_bytes(&v, sizeof(v))) {
		log_warn("auth: no random sequence number start; using the clock");
		v = (uint32_t)(now_ns() ^ (now_ns() >> 32));
	}
	atomic_store(&seq_next, v);
}

uint32_t rtrs_auth_seqnum(void)
{
	uint32_t v;

	pthread_once(&seq_once, seq_init);
	/* Every caller gets its own value; whoever draws 0 draws again. */
	do
		v = atomic_fetch_add(&seq_next, 1);
	while (v == 0);
	return v;
}

bool rtrs_auth_equal(const void *a, const void *b, size_t len)
{
	return CRYPTO_memcmp(a, b, len) == 0;
}

void rtrs_auth_wipe(void *buf, size_t len)
{
	if (buf && len)
		OPENSSL_cleanse(buf, len);
}

uint32_t rtrs_auth_crc32(const uint8_t *buf, size_t len)
{
	uint32_t crc = 0xffffffffu;

	/* Bitwise: keys are at most 64 bytes, a table is not worth it. */
	for (size_t i = 0; i < len; i++) {
		crc ^= buf[i];
		for (int b = 0; b < 8; b++)
			crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
	}
	return ~crc;
}

struct chunk {
	const void *p;
	size_t len;
};

/* out = HMAC_hash(key, chunks...), hash_len bytes. */
static int hmac(unsigned hash, const uint8_t *key, size_t key_len, const struct chunk *c,
		unsigned n, uint8_t *out)
{
	EVP_MAC *mac = NULL;
	EVP_MAC_CTX *ctx = NULL;
	OSSL_PARAM params[2];
	size_t out_len = 0;
	int rc = -EIO;

	if (!hash_valid(hash))
		return -EINVAL;
	/* No key is "no key", as in the kernel; never an HMAC with an empty key. */
	if (!key || !key_len)
		return -ENOKEY;
	mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	if (!mac)
		goto out;
	ctx = EVP_MAC_CTX_new(mac);
	if (!ctx) {
		rc = -ENOMEM;
		goto out;
	}
	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
						     (char *)hashes[hash].ossl, 0);
	params[1] = OSSL_PARAM_construct_end();
	if (!EVP_MAC_init(ctx, key, key_len, params))
		goto out;
	for (unsigned i = 0; i < n; i++)
		if (c[i].len && !EVP_MAC_update(ctx, c[i].p, c[i].len))
			goto out;
	if (!EVP_MAC_final(ctx, out, &out_len, rtrs_auth_hash_len(hash)) || out_len != rtrs_auth_hash_len(hash))
		goto out;
	rc = 0;
out:
	if (rc)
		ERR_clear_error();
	/* The context holds a copy of the key. */
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
	return rc;
}

int rtrs_auth_hmac(unsigned hash, const uint8_t *key, size_t key_len, const uint8_t *data,
		   size_t len, uint8_t *out)
{
	struct chunk c = { data, len };

	return hmac(hash, key, key_len, &c, 1, out);
}

static int digest(unsigned hash, const void *buf, size_t len, uint8_t *out)
{
	EVP_MD *md;
	unsigned out_len = 0;
	int rc = 0;

	if (!hash_valid(hash))
		return -EINVAL;
	md = EVP_MD_fetch(NULL, hashes[hash].ossl, NULL);
	if (!md || !EVP_Digest(buf, len, out, &out_len, md, NULL) ||
	    out_len != rtrs_auth_hash_len(hash)) {
		ERR_clear_error();
		rc = -EIO;
	}
	EVP_MD_free(md);
	return rc;
}

/* ---- the exchange ------------------------------------------------------------------- */

int rtrs_auth_transform(const struct rtrs_auth_key *k, const char *nqn, uint8_t *out,
			size_t *out_len)
{
	struct chunk c[2];
	int rc;

	/* As the kernel: no key (say, no controller secret) is -ENOKEY. */
	if (!k || !k->len)
		return -ENOKEY;
	if (!out || !out_len || k->hmac > RTRS_AUTH_HASH_SHA512 || !rtrs_auth_key_len_valid(k->len))
		return -EINVAL;
	if (k->hmac == RTRS_AUTH_HASH_NONE) {
		memcpy(out, k->key, k->len);
		*out_len = k->len;
		return 0;
	}
	if (!nqn)
		return -EINVAL;
	c[0] = (struct chunk){ nqn, strlen(nqn) };
	c[1] = (struct chunk){ nvme_suffix, strlen(nvme_suffix) };
	rc = hmac(k->hmac, k->key, k->len, c, ARRAY_SIZE(c), out);
	if (rc)
		return rc;
	*out_len = rtrs_auth_hash_len(k->hmac);
	return 0;
}

int rtrs_auth_session_key(unsigned hash, const uint8_t *gxy, size_t gxy_len, uint8_t *out)
{
	if (!gxy || !gxy_len || !out)
		return -EINVAL;
	return digest(hash, gxy, gxy_len, out);
}

int rtrs_auth_response(unsigned hash, const uint8_t *tkey, size_t tkey_len,
		       const uint8_t *chal, const uint8_t *ks, uint32_t seq, uint16_t tid,
		       uint8_t scc, bool host, const char *name1, const char *name2,
		       uint8_t *out)
{
	static const uint8_t zero;
	uint8_t ca[RTRS_AUTH_MAX_HASH_LEN];
	uint8_t seq_le[4] = { (uint8_t)seq, (uint8_t)(seq >> 8), (uint8_t)(seq >> 16),
			      (uint8_t)(seq >> 24) };
	uint8_t tid_le[2] = { (uint8_t)tid, (uint8_t)(tid >> 8) };
	const char *role = host ? "HostHost" : "Controller";
	size_t hl = rtrs_auth_hash_len(hash), n1, n2;
	int rc;

	if (!hl || !chal || !name1 || !name2 || !out)
		return -EINVAL;
	if (!tkey || !tkey_len)
		return -ENOKEY;
	n1 = strnlen(name1, RTRS_AUTH_NAME_MAX + 1);
	n2 = strnlen(name2, RTRS_AUTH_NAME_MAX + 1);
	if (n1 > RTRS_AUTH_NAME_MAX || n2 > RTRS_AUTH_NAME_MAX)
		return -EINVAL;
	/* The augmented challenge binds the response to this DH exchange. */
	if (ks) {
		struct chunk cc = { chal, hl };

		rc = hmac(hash, ks, hl, &cc, 1, ca);
		if (rc)
			return rc;
	} else {
		memcpy(ca, chal, hl);
	}
	struct chunk c[] = {
		{ ca, hl }, { seq_le, 4 }, { tid_le, 2 }, { &scc, 1 }, { role, strlen(role) },
		{ name1, n1 }, { &zero, 1 }, { name2, n2 },
	};

	rc = hmac(hash, tkey, tkey_len, c, ARRAY_SIZE(c), out);
	OPENSSL_cleanse(ca, sizeof(ca));
	return rc;
}

/* ---- FFDHE --------------------------------------------------------------------------- */

struct rtrs_auth_dh {
	unsigned group;
	size_t len;
	EVP_PKEY *key;
	uint8_t pm1[RTRS_AUTH_MAX_DH_LEN];   /* p - 1, big-endian, len bytes */
};

static int ossl_err(int rc)
{
	unsigned long e = ERR_peek_last_error();

	if (e)
		log_dbg("auth: libcrypto: %s", ERR_reason_error_string(e));
	ERR_clear_error();
	return rc;
}

int rtrs_auth_dh_new(unsigned group, struct rtrs_auth_dh **out)
{
	struct rtrs_auth_dh *dh;
	EVP_PKEY_CTX *pctx = NULL;
	BIGNUM *p = NULL;
	OSSL_PARAM params[2];
	int rc = -EIO;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (group == RTRS_AUTH_DH_NULL || group >= RTRS_AUTH_NR_DHGROUPS)
		return -EINVAL;
	dh = calloc(1, sizeof(*dh));
	if (!dh)
		return -ENOMEM;
	dh->group = group;
	dh->len = rtrs_auth_dh_len(group);
	pctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
	if (!pctx) {
		rc = -ENOMEM;
		goto err;
	}
	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
						     (char *)dhgroups[group], 0);
	params[1] = OSSL_PARAM_construct_end();
	if (EVP_PKEY_keygen_init(pctx) <= 0 || EVP_PKEY_CTX_set_params(pctx, params) <= 0 ||
	    EVP_PKEY_generate(pctx, &dh->key) <= 0)
		goto err;
	if (!EVP_PKEY_get_bn_param(dh->key, OSSL_PKEY_PARAM_FFC_P, &p) ||
	    (size_t)BN_num_bytes(p) != dh->len ||
	    BN_bn2binpad(p, dh->pm1, (int)dh->len) != (int)dh->len)
		goto err;
	/* p is odd, so p - 1 only changes the last byte. */
	dh->pm1[dh->len - 1]--;
	BN_free(p);
	EVP_PKEY_CTX_free(pctx);
	*out = dh;
	return 0;
err:
	BN_free(p);
	EVP_PKEY_CTX_free(pctx);
	rtrs_auth_dh_free(dh);
	return ossl_err(rc);
}

int rtrs_auth_dh_public(const struct rtrs_auth_dh *dh, uint8_t *buf, size_t len)
{
	BIGNUM *y = NULL;
	int rc = 0;

	if (!dh || !buf)
		return -EINVAL;
	if (len < dh->len)
		return -ENOSPC;
	if (!EVP_PKEY_get_bn_param(dh->key, OSSL_PKEY_PARAM_PUB_KEY, &y) ||
	    BN_bn2binpad(y, buf, (int)dh->len) != (int)dh->len)
		rc = ossl_err(-EIO);
	BN_free(y);
	return rc;
}

/* An EVP_PKEY of the group holding the peer's public value. */
static int peer_key(const struct rtrs_auth_dh *dh, const uint8_t *peer, EVP_PKEY **out)
{
	OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
	OSSL_PARAM *params = NULL;
	EVP_PKEY_CTX *ctx = NULL;
	BIGNUM *y = BN_bin2bn(peer, (int)dh->len, NULL);
	int rc = -ENOMEM;

	if (!bld || !y)
		goto out;
	if (!OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME,
					     dhgroups[dh->group], 0) ||
	    !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PUB_KEY, y))
		goto out;
	params = OSSL_PARAM_BLD_to_param(bld);
	ctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
	if (!params || !ctx)
		goto out;
	rc = -EINVAL;
	if (EVP_PKEY_fromdata_init(ctx) <= 0 ||
	    EVP_PKEY_fromdata(ctx, out, EVP_PKEY_PUBLIC_KEY, params) <= 0)
		goto out;
	rc = 0;
out:
	EVP_PKEY_CTX_free(ctx);
	OSSL_PARAM_free(params);
	OSSL_PARAM_BLD_free(bld);
	BN_free(y);
	return rc ? ossl_err(rc) : 0;
}

/*
 * Whether the peer's value y is in the group's prime-order subgroup:
 * y^q = 1 (mod p), q = (p - 1) / 2 (the FFDHE primes are safe primes).
 * 0 when it is, -EINVAL when not (the peer's doing), -ENOMEM when the
 * arithmetic could not be done (ours). Done here rather than left to
 * OpenSSL's check in EVP_PKEY_derive_set_peer, whose failure does not
 * tell a bad value from a failing allocation: a host must not be told
 * its value was refused, which it takes as final, for the server's own
 * trouble.
 */
static int peer_in_subgroup(const struct rtrs_auth_dh *dh, const uint8_t *peer)
{
	BN_CTX *bc = BN_CTX_new();
	BIGNUM *y = BN_bin2bn(peer, (int)dh->len, NULL);
	BIGNUM *pm1 = BN_bin2bn(dh->pm1, (int)dh->len, NULL);
	BIGNUM *p = BN_new(), *q = BN_new(), *r = BN_new();
	int rc = -ENOMEM;

	if (bc && y && pm1 && p && q && r && BN_copy(p, pm1) && BN_add_word(p, 1) &&
	    BN_rshift1(q, pm1) && BN_mod_exp(r, y, q, p, bc))
		rc = BN_is_one(r) ? 0 : -EINVAL;
	BN_free(r);
	BN_free(q);
	BN_free(p);
	BN_free(pm1);
	BN_free(y);
	BN_CTX_free(bc);
	return rc == -ENOMEM ? ossl_err(rc) : rc;
}

int rtrs_auth_dh_shared(struct rtrs_auth_dh *dh, const uint8_t *peer, size_t peer_len,
			uint8_t *out, size_t out_len)
{
	EVP_PKEY_CTX *ctx = NULL;
	EVP_PKEY *pk = NULL;
	size_t n = out_len;
	bool above_one = false;
	int rc;

	if (!dh || !peer || !out || peer_len != dh->len)
		return -EINVAL;
	if (out_len < dh->len)
		return -ENOSPC;
	/* 1 < y < p - 1: 0, 1 and p - 1 would force a known shared secret. */
	for (size_t i = 0; i + 1 < dh->len && !above_one; i++)
		above_one = peer[i] != 0;
	if (!above_one && peer[dh->len - 1] <= 1)
		return -EINVAL;
	if (memcmp(peer, dh->pm1, dh->len) >= 0)
		return -EINVAL;
	rc = peer_in_subgroup(dh, peer);
	if (rc)
		return rc;
	/* The value is checked: whatever fails from here on is ours, not the peer's. */
	rc = peer_key(dh, peer, &pk);
	if (rc)
		return rc == -EINVAL ? -EIO : rc;
	rc = -ENOMEM;
	ctx = EVP_PKEY_CTX_new_from_pkey(NULL, dh->key, NULL);
	if (!ctx)
		goto out;
	rc = -EIO;
	if (EVP_PKEY_derive_init(ctx) <= 0 || EVP_PKEY_CTX_set_dh_pad(ctx, 1) <= 0 ||
	    EVP_PKEY_derive_set_peer_ex(ctx, pk, 0) <= 0)
		goto out;
	rc = -EIO;
	if (EVP_PKEY_derive(ctx, out, &n) <= 0 || n > dh->len)
		goto out;
	/* Padding was asked for; in case it was not done, do it here. */
	if (n < dh->len) {
		memmove(out + (dh->len - n), out, n);
		memset(out, 0, dh->len - n);
	}
	rc = 0;
out:
	if (rc) {
		ossl_err(rc);
		OPENSSL_cleanse(out, out_len);
	}
	EVP_PKEY_CTX_free(ctx);
	EVP_PKEY_free(pk);
	return rc;
}

void rtrs_auth_dh_free(struct rtrs_auth_dh *dh)
{
	if (!dh)
		return;
	EVP_PKEY_free(dh->key);   /* frees the private key with cleansing */
	free(dh);
}
