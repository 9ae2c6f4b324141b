/* SPDX-License-Identifier: MIT */
/*
 * DH-HMAC-CHAP crypto (see rtrs-auth.h): DHHC-1 secrets, key files, the
 * NVMe key transform and responses, FFDHE key agreement. libcrypto does the
 * primitives; this file does the formats and the checks around them.
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

/* Key and key files are small; anything bigger is not one. */
#define AUTH_FILE_MAX (1u << 20)

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

/* ---- digests and HMAC ------------------------------------------------------------ */

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

/* ---- DHHC-1 secrets -------------------------------------------------------------- */

static bool key_len_valid(size_t len)
{
	return len == 32 || len == 48 || len == 64;
}

/*
 * Why a secret was refused, worded like nvme check-dhchap-key; the key file
 * parser prefixes which secret of the line it was.
 */
#define KEY_ERRORS(X)                                                \
	X(KERR_HEADER, "Invalid key header (want DHHC-1:<00..03>:)") \
	X(KERR_HMAC, "Invalid HMAC identifier")                      \
	X(KERR_COLON, "Missing the trailing ':'")                    \
	X(KERR_LENGTH, "Invalid key length")                         \
	X(KERR_BASE64, "Base64 decoding failed")                     \
	X(KERR_CRC, "CRC mismatch")

enum key_err {
	KERR_NONE = -1,
#define X(id, s) id,
	KEY_ERRORS(X)
#undef X
};

static const char *const key_why[] = {
#define X(id, s) s,
	KEY_ERRORS(X)
#undef X
};

static const char *const host_key_why[] = {
#define X(id, s) "host secret: " s,
	KEY_ERRORS(X)
#undef X
};

static const char *const ctrl_key_why[] = {
#define X(id, s) "controller secret: " s,
	KEY_ERRORS(X)
#undef X
};

static int b64_value(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/*
 * Decodes standard base64 with padding, strictly: length a multiple of 4,
 * at most two '=' and only at the end, unused bits zero (as the kernel's
 * base64_decode insists). EVP_DecodeBlock is lenient about all of these and
 * counts padding as decoded zero bytes, so the checks come first and the
 * real length is computed here. Returns the decoded length or -1.
 */
static int b64_decode(const char *s, size_t n, uint8_t *out, size_t out_max)
{
	uint8_t tmp[3 * ((RTRS_AUTH_MAX_KEY_LEN + 4 + 2) / 3)];
	size_t pad = 0;
	int got;

	if (n == 0 || n % 4 || n / 4 * 3 > sizeof(tmp))
		return -1;
	while (pad < 2 && s[n - 1 - pad] == '=')
		pad++;
	for (size_t i = 0; i < n - pad; i++)
		if (b64_value(s[i]) < 0)
			return -1;
	/* The bits the padding leaves over must be zero. */
	if (pad && (b64_value(s[n - 1 - pad]) & (pad == 1 ? 0x03 : 0x0f)))
		return -1;
	if (n / 4 * 3 - pad > out_max)
		return -1;
	got = EVP_DecodeBlock(tmp, (const unsigned char *)s, (int)n);
	if (got != (int)(n / 4 * 3)) {
		ERR_clear_error();
		OPENSSL_cleanse(tmp, sizeof(tmp));
		return -1;
	}
	got -= (int)pad;
	memcpy(out, tmp, (size_t)got);
	OPENSSL_cleanse(tmp, sizeof(tmp));
	return got;
}

/*
 * Parses s[0..n) (already trimmed). Fills the CRCs when the string got that
 * far, so a tool can report them; out is wiped on any failure.
 */
static enum key_err key_parse(const char *s, size_t n, struct rtrs_auth_key *out,
			      uint32_t *crc_stored, uint32_t *crc_computed)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN + 4];
	uint32_t stored, computed;
	size_t b64_len;
	int got;

	memset(out, 0, sizeof(*out));
	/* "DHHC-1:" hh ":" base64 ":" */
	if (n < 10 || memcmp(s, "DHHC-1:", 7) || s[9] != ':' || !isxdigit((unsigned char)s[7]) ||
	    !isxdigit((unsigned char)s[8]))
		return KERR_HEADER;
	if (s[7] != '0' || s[8] < '0' || s[8] > '3')
		return KERR_HMAC;
	if (s[n - 1] != ':' || n == 10)
		return KERR_COLON;
	b64_len = n - 11;
	/* 36, 52 or 68 bytes encode to 48, 72 or 92 characters. */
	if (b64_len != 48 && b64_len != 72 && b64_len != 92)
		return memchr(s + 10, ':', b64_len) ? KERR_BASE64 : KERR_LENGTH;
	got = b64_decode(s + 10, b64_len, raw, sizeof(raw));
	if (got < 0)
		return KERR_BASE64;
	if (!key_len_valid((size_t)got - 4)) {
		OPENSSL_cleanse(raw, sizeof(raw));
		return KERR_LENGTH;
	}
	got -= 4;
	stored = (uint32_t)raw[got] | (uint32_t)raw[got + 1] << 8 |
		 (uint32_t)raw[got + 2] << 16 | (uint32_t)raw[got + 3] << 24;
	computed = rtrs_auth_crc32(raw, (size_t)got);
	if (crc_stored)
		*crc_stored = stored;
	if (crc_computed)
		*crc_computed = computed;
	if (stored != computed) {
		OPENSSL_cleanse(raw, sizeof(raw));
		return KERR_CRC;
	}
	out->hmac = (uint8_t)(s[8] - '0');
	out->len = (uint8_t)got;
	memcpy(out->key, raw, (size_t)got);
	OPENSSL_cleanse(raw, sizeof(raw));
	return KERR_NONE;
}

static int key_err_errno(enum key_err e)
{
	if (e == KERR_NONE)
		return 0;
	return e == KERR_CRC ? -EKEYREJECTED : -EINVAL;
}

/* Trims whitespace off both ends of s[0..*n). */
static const char *trim(const char *s, size_t *n)
{
	while (*n && isspace((unsigned char)*s)) {
		s++;
		(*n)--;
	}
	while (*n && isspace((unsigned char)s[*n - 1]))
		(*n)--;
	return s;
}

int rtrs_auth_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
			uint32_t *crc_computed, const char **why)
{
	enum key_err e;
	size_t n;

	if (crc_stored)
		*crc_stored = 0;
	if (crc_computed)
		*crc_computed = 0;
	if (!s || !out)
		REJECT(-EINVAL, "no secret");
	n = strlen(s);
	s = trim(s, &n);
	e = key_parse(s, n, out, crc_stored, crc_computed);
	if (e != KERR_NONE)
		REJECT(key_err_errno(e), key_why[e]);
	return 0;
}

int rtrs_auth_key_parse(const char *s, struct rtrs_auth_key *out, const char **why)
{
	return rtrs_auth_key_check(s, out, NULL, NULL, why);
}

int rtrs_auth_key_format(const struct rtrs_auth_key *k, char *buf, size_t len)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN + 4];
	char b64[4 * ((sizeof(raw) + 2) / 3) + 1];
	uint32_t crc;
	int n;

	if (!k || !buf || k->hmac > RTRS_AUTH_HASH_SHA512 || !key_len_valid(k->len))
		return -EINVAL;
	crc = rtrs_auth_crc32(k->key, k->len);
	memcpy(raw, k->key, k->len);
	raw[k->len] = (uint8_t)crc;
	raw[k->len + 1] = (uint8_t)(crc >> 8);
	raw[k->len + 2] = (uint8_t)(crc >> 16);
	raw[k->len + 3] = (uint8_t)(crc >> 24);
	EVP_EncodeBlock((unsigned char *)b64, raw, k->len + 4);
	OPENSSL_cleanse(raw, sizeof(raw));
	n = snprintf(buf, len, "DHHC-1:%02x:%s:", k->hmac, b64);
	OPENSSL_cleanse(b64, sizeof(b64));
	if (n < 0 || (size_t)n >= len) {
		if (len)
			OPENSSL_cleanse(buf, len);
		return -ENOSPC;
	}
	return 0;
}

int rtrs_auth_key_generate(unsigned hmac_id, size_t len, const uint8_t *secret, const char *nqn,
			   struct rtrs_auth_key *out)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN];
	int rc = 0;

	if (!out || hmac_id > RTRS_AUTH_HASH_SHA512 || !key_len_valid(len))
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (secret)
		memcpy(raw, secret, len);
	else
		rc = rtrs_auth_random(raw, len);
	if (rc)
		return rc;
	if (hmac_id && nqn) {
		/* nvme-cli 2.x: the stored secret is already transformed once. */
		struct chunk c[] = { { nqn, strlen(nqn) }, { nvme_suffix, strlen(nvme_suffix) } };

		rc = hmac(hmac_id, raw, len, c, ARRAY_SIZE(c), out->key);
		out->len = (uint8_t)rtrs_auth_hash_len(hmac_id);
	} else {
		memcpy(out->key, raw, len);
		out->len = (uint8_t)len;
	}
	out->hmac = (uint8_t)hmac_id;
	OPENSSL_cleanse(raw, sizeof(raw));
	if (rc)
		rtrs_auth_wipe(out, sizeof(*out));
	return rc;
}

/* ---- key files --------------------------------------------------------------------- */

/*
 * Reads a whole small file into a NUL-terminated buffer that the caller
 * wipes and frees (free_secret). Warns when others may read it. Grows by
 * copying, not realloc, so no stale copy of a secret is left on the heap.
 * Only a regular file: a FIFO or a device would block or have effects on
 * open, so it is opened without blocking and refused before any read.
 */
static int read_secret_file(const char *path, char **out, size_t *out_len, const char **why)
{
	size_t cap = 4096, len = 0;
	char *buf = NULL;
	struct stat st;
	int fd, rc = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		rc = -errno;
		REJECT(rc, "cannot open the key file");
	}
	if (fstat(fd, &st)) {
		rc = -errno;
		close(fd);
		REJECT(rc, "cannot stat the key file");
	}
	if (S_ISDIR(st.st_mode)) {
		close(fd);
		REJECT(-EISDIR, "the key file is a directory");
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		REJECT(-EINVAL, "the key file is not a regular file");
	}
	if (st.st_mode & (S_IRGRP | S_IROTH))
		log_warn_rl("auth: key file %s is readable by group or others "
			    "(it holds secrets: chmod 600)", path);
	if (st.st_size > 0 && (uint64_t)st.st_size < AUTH_FILE_MAX)
		cap = (size_t)st.st_size + 2; /* its bytes, room to see EOF, the NUL */
	buf = malloc(cap);
	if (!buf) {
		close(fd);
		REJECT(-ENOMEM, "out of memory");
	}
	for (;;) {
		ssize_t r;

		if (len + 1 == cap) {
			char *nb;

			if (cap >= AUTH_FILE_MAX) {
				rc = -EFBIG;
				if (why)
					*why = "the key file is too large";
				break;
			}
			nb = malloc(cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				if (why)
					*why = "out of memory";
				break;
			}
			memcpy(nb, buf, len);
			OPENSSL_cleanse(buf, cap);
			free(buf);
			buf = nb;
			cap *= 2;
		}
		r = read(fd, buf + len, cap - 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			if (why)
				*why = "cannot read the key file";
			break;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	if (rc) {
		OPENSSL_cleanse(buf, cap);
		free(buf);
		return rc;
	}
	buf[len] = '\0';
	*out = buf;
	*out_len = len;
	return 0;
}

static void free_secret(char *buf, size_t len)
{
	if (buf) {
		OPENSSL_cleanse(buf, len);
		free(buf);
	}
}

/*
 * Next line of buf: *p moves past it; returns the line trimmed (length in
 * *n), or NULL at the end. Blank lines and '#' comments come back empty.
 */
static const char *next_line(const char **p, const char *end, size_t *n)
{
	const char *s = *p, *nl;

	if (s >= end)
		return NULL;
	nl = memchr(s, '\n', (size_t)(end - s));
	*n = (size_t)((nl ? nl : end) - s);
	*p = nl ? nl + 1 : end;
	s = trim(s, n);
	if (*n && *s == '#')
		*n = 0;
	return s;
}

int rtrs_auth_key_load(const char *arg, struct rtrs_auth_key *out, const char **why)
{
	const char *path = NULL, *p, *end, *l;
	char *buf = NULL;
	size_t len, n;
	int rc;

	if (!arg || !out)
		REJECT(-EINVAL, "no secret");
	memset(out, 0, sizeof(*out));
	if (arg[0] == '@')
		path = arg + 1;
	else if (!strncmp(arg, "file:", 5))
		path = arg + 5;
	if (!path)
		return rtrs_auth_key_parse(arg, out, why);
	if (!*path)
		REJECT(-EINVAL, "empty key file name");
	rc = read_secret_file(path, &buf, &len, why);
	if (rc)
		return rc;
	p = buf;
	end = buf + len;
	rc = -ENOKEY;
	if (why)
		*why = "the key file holds no secret";
	while ((l = next_line(&p, end, &n))) {
		enum key_err e;

		if (!n)
			continue;
		e = key_parse(l, n, out, NULL, NULL);
		rc = key_err_errno(e);
		if (rc && why)
			*why = key_why[e];
		break;
	}
	free_secret(buf, len);
	return rc;
}

/* Splits the next whitespace-separated field off s[0..*n). */
static const char *next_field(const char **s, const char *end, size_t *n)
{
	const char *f = *s;

	while (f < end && isspace((unsigned char)*f))
		f++;
	if (f == end)
		return NULL;
	*s = f;
	while (*s < end && !isspace((unsigned char)**s))
		(*s)++;
	*n = (size_t)(*s - f);
	return f;
}

/*
 * One non-blank line of a server key file: "<host> <host secret> [<ctrl secret>]".
 * Sets *match when it is host's line, and then fills hkey and ckey.
 */
static int keyfile_line(const char *l, size_t n, const char *host, size_t host_len,
			bool *match, const char **name, size_t *name_len,
			struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey, const char **why)
{
	const char *f[4], *p = l, *end = l + n;
	size_t fl[4];
	unsigned nf = 0;
	enum key_err e;

	while (nf < 4 && (f[nf] = next_field(&p, end, &fl[nf])))
		nf++;
	if (nf < 2)
		REJECT(-EINVAL, "missing the host secret");
	if (nf > 3)
		REJECT(-EINVAL, "too many fields");
	if (fl[0] > RTRS_AUTH_NAME_MAX)
		REJECT(-EINVAL, "host name too long");
	*match = fl[0] == host_len && !memcmp(f[0], host, host_len);
	*name = f[0];
	*name_len = fl[0];
	e = key_parse(f[1], fl[1], hkey, NULL, NULL);
	if (e != KERR_NONE)
		REJECT(-EINVAL, host_key_why[e]);
	if (nf == 3) {
		e = key_parse(f[2], fl[2], ckey, NULL, NULL);
		if (e != KERR_NONE)
			REJECT(-EINVAL, ctrl_key_why[e]);
	} else {
		memset(ckey, 0, sizeof(*ckey));
	}
	return 0;
}

/* Host names seen so far in a key file, to refuse one listed twice. */
struct name_set {
	struct { const char *s; size_t len; } *v;
	size_t n, cap;
};

static int names_add(struct name_set *set, const char *s, size_t len, const char **why)
{
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i].len == len && !memcmp(set->v[i].s, s, len))
			REJECT(-EINVAL, "host listed twice");
	if (set->n == set->cap) {
		size_t cap = set->cap ? 2 * set->cap : 16;
		void *v = realloc(set->v, cap * sizeof(*set->v));

		if (!v)
			REJECT(-ENOMEM, "out of memory");
		set->v = v;
		set->cap = cap;
	}
	set->v[set->n].s = s;
	set->v[set->n++].len = len;
	return 0;
}

int rtrs_auth_keyfile_parse(const char *buf, size_t len, const char *host,
			    struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey, unsigned *line,
			    const char **why)
{
	struct rtrs_auth_key th, tc;
	struct name_set names = { 0 };
	const char *p, *end, *l;
	size_t host_len, n;
	unsigned lineno = 0;
	bool found = false;
	int rc = 0;

	if (line)
		*line = 0;
	if (!host || !hkey)
		REJECT(-EINVAL, "no host");
	memset(hkey, 0, sizeof(*hkey));
	if (ckey)
		memset(ckey, 0, sizeof(*ckey));
	host_len = strlen(host);
	if (!host_len || host_len > RTRS_AUTH_NAME_MAX)
		REJECT(-EINVAL, "bad host name");
	p = buf;
	end = buf + len;
	/*
	 * Every line is checked, not just up to the host's: a typo anywhere is
	 * reported at once rather than when that host first connects, and a
	 * host listed twice is an error rather than a matter of line order.
	 */
	while ((l = next_line(&p, end, &n))) {
		const char *name;
		size_t name_len;
		bool match = false;

		lineno++;
		if (!n)
			continue;
		rc = keyfile_line(l, n, host, host_len, &match, &name, &name_len, &th, &tc, why);
		if (!rc)
			rc = names_add(&names, name, name_len, why);
		if (rc)
			break;
		if (match) {
			found = true;
			*hkey = th;
			if (ckey)
				*ckey = tc;
		}
	}
	rtrs_auth_wipe(&th, sizeof(th));
	rtrs_auth_wipe(&tc, sizeof(tc));
	free(names.v);
	if (!rc && !found) {
		rc = -ESRCH;
		if (why)
			*why = "host not in the key file";
	}
	if (rc) {
		if (line && rc == -EINVAL)
			*line = lineno;
		rtrs_auth_wipe(hkey, sizeof(*hkey));
		if (ckey)
			rtrs_auth_wipe(ckey, sizeof(*ckey));
	}
	return rc;
}

int rtrs_auth_keyfile_lookup(const char *path, const char *host, struct rtrs_auth_key *hkey,
			     struct rtrs_auth_key *ckey, unsigned *line, const char **why)
{
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (line)
		*line = 0;
	if (!path)
		REJECT(-EINVAL, "no key file");
	rc = read_secret_file(path, &buf, &len, why);
	if (rc)
		return rc;
	rc = rtrs_auth_keyfile_parse(buf, len, host, hkey, ckey, line, why);
	free_secret(buf, len);
	return rc;
}

/*
 * The server's key file, read on a thread of its own: a file that blocks
 * (a hung network file system) then stalls that thread only. A lookup asks
 * for a read that starts after it asked (so a key changed in the file
 * counts from the next connection) and waits for it a bounded time. The
 * reader holds a reference: if it is stuck when the owner lets go, the
 * last one to leave frees the object.
 */
struct rtrs_keyfile {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned refs;              /* the owner's and the reader's */
	bool stop;
	uint64_t asked, done;       /* read generations */
	char *buf;                  /* the last read's text (secrets) */
	size_t len;
	int err;                    /* ... or why it failed */
	const char *why;
	char path[];
};

static void keyfile_unref(struct rtrs_keyfile *kf)
{
	bool last;

	pthread_mutex_lock(&kf->lock);
	last = --kf->refs == 0;
	pthread_mutex_unlock(&kf->lock);
	if (!last)
		return;
	free_secret(kf->buf, kf->len);
	pthread_cond_destroy(&kf->cond);
	pthread_mutex_destroy(&kf->lock);
	free(kf);
}

static void *keyfile_reader(void *arg)
{
	struct rtrs_keyfile *kf = arg;

	pthread_setname_np(pthread_self(), "rtrs-keyfile");
	pthread_mutex_lock(&kf->lock);
	for (;;) {
		while (!kf->stop && kf->done == kf->asked)
			pthread_cond_wait(&kf->cond, &kf->lock);
		if (kf->stop)
			break;
		uint64_t gen = kf->asked;
		const char *why = NULL;
		char *buf = NULL;
		size_t len = 0;
		int rc;

		pthread_mutex_unlock(&kf->lock);
		rc = read_secret_file(kf->path, &buf, &len, &why);
		pthread_mutex_lock(&kf->lock);
		free_secret(kf->buf, kf->len);
		kf->buf = buf;
		kf->len = len;
		kf->err = rc;
		kf->why = why;
		kf->done = gen;
		pthread_cond_broadcast(&kf->cond);
	}
	pthread_mutex_unlock(&kf->lock);
	keyfile_unref(kf);
	return NULL;
}

int rtrs_keyfile_new(const char *path, struct rtrs_keyfile **out)
{
	size_t n = path ? strlen(path) : 0;
	struct rtrs_keyfile *kf;
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	if (!n)
		return -EINVAL;
	kf = calloc(1, sizeof(*kf) + n + 1);
	if (!kf)
		return -ENOMEM;
	memcpy(kf->path, path, n + 1);
	pthread_mutex_init(&kf->lock, NULL);
	cond_init_mono(&kf->cond);
	kf->refs = 2;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = -pthread_create(&t, &attr, keyfile_reader, kf);
	pthread_attr_destroy(&attr);
	if (rc) {
		pthread_cond_destroy(&kf->cond);
		pthread_mutex_destroy(&kf->lock);
		free(kf);
		return rc;
	}
	*out = kf;
	return 0;
}

void rtrs_keyfile_free(struct rtrs_keyfile *kf)
{
	if (!kf)
		return;
	pthread_mutex_lock(&kf->lock);
	kf->stop = true;
	pthread_cond_broadcast(&kf->cond);
	pthread_mutex_unlock(&kf->lock);
	keyfile_unref(kf);
}

const char *rtrs_keyfile_path(const struct rtrs_keyfile *kf)
{
	return kf->path;
}

int rtrs_keyfile_lookup(struct rtrs_keyfile *kf, const char *host, struct rtrs_auth_key *hkey,
			struct rtrs_auth_key *ckey, unsigned *line, const char **why)
{
	struct timespec dl = deadline_ms(RTRS_KEYFILE_WAIT_MS);
	char *copy = NULL;
	size_t len = 0;
	uint64_t want;
	int rc = 0, w = 0;

	if (line)
		*line = 0;
	pthread_mutex_lock(&kf->lock);
	want = ++kf->asked;
	pthread_cond_broadcast(&kf->cond);
	while (kf->done < want && w != ETIMEDOUT)
		w = pthread_cond_timedwait(&kf->cond, &kf->lock, &dl);
	if (kf->done < want) {
		rc = -ETIMEDOUT;
		if (why)
			*why = "reading the key file did not finish in time";
	} else if (kf->err) {
		rc = kf->err;
		if (why)
			*why = kf->why;
	} else {
		len = kf->len;
		copy = malloc(len + 1);
		if (copy)
			memcpy(copy, kf->buf, len + 1);
		else
			rc = -ENOMEM;
	}
	pthread_mutex_unlock(&kf->lock);
	if (rc)
		return rc;
	rc = rtrs_auth_keyfile_parse(copy, len, host, hkey, ckey, line, why);
	free_secret(copy, len);
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
	if (!out || !out_len || k->hmac > RTRS_AUTH_HASH_SHA512 || !key_len_valid(k->len))
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
	rc = peer_key(dh, peer, &pk);
	if (rc)
		return rc;
	rc = -ENOMEM;
	ctx = EVP_PKEY_CTX_new_from_pkey(NULL, dh->key, NULL);
	if (!ctx)
		goto out;
	rc = -EIO;
	if (EVP_PKEY_derive_init(ctx) <= 0 || EVP_PKEY_CTX_set_dh_pad(ctx, 1) <= 0)
		goto out;
	/* OpenSSL checks the peer value too, subgroup membership included. */
	rc = -EINVAL;
	if (EVP_PKEY_derive_set_peer(ctx, pk) <= 0)
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
