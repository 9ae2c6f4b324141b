/* SPDX-License-Identifier: MIT */
/*
 * DH-HMAC-CHAP secrets and key files (docs/security.md section 2): the
 * DHHC-1 representation (checked, parsed, formatted, generated), secrets
 * read from files, the server's key file with one line per host, and its
 * reader thread, which reads the file when an authentication asks so that
 * a file that blocks stalls only that thread. The crypto is rtrs-auth.c.
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

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include "log.h"
#include "util.h"
#include "rtrs-auth.h"

/* Key and key files are small; anything bigger is not one. */
#define AUTH_FILE_MAX (1u << 20)


bool rtrs_auth_key_len_valid(size_t len)
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
	X(KERR_CRC, "CRC mismatch")                                  \
	X(KERR_TLS_HEADER, "Invalid key header (want NVMeTLSkey-1:<01|02>:)")

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

static const char *const tls_key_why[] = {
#define X(id, s) "TLS key: " s,
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
 * Parses s[0..n) (already trimmed): a DHHC-1 secret, or with tls an NVMe
 * TLS PSK in the interchange format ("NVMeTLSkey-1:<01|02>:...:", whose
 * hash id also fixes the length: 32 bytes for 01, 48 for 02). Fills the
 * CRCs when the string got that far, so a tool can report them; out is
 * wiped on any failure.
 */
static enum key_err key_parse_kind(const char *s, size_t n, bool tls, struct rtrs_auth_key *out,
				   uint32_t *crc_stored, uint32_t *crc_computed)
{
	const char *pfx = tls ? "NVMeTLSkey-1:" : "DHHC-1:";
	size_t pl = strlen(pfx);
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN + 4];
	uint32_t stored, computed;
	size_t b64_len;
	int got;

	memset(out, 0, sizeof(*out));
	/* prefix hh ":" base64 ":" */
	if (n < pl + 3 || memcmp(s, pfx, pl) || s[pl + 2] != ':' ||
	    !isxdigit((unsigned char)s[pl]) || !isxdigit((unsigned char)s[pl + 1]))
		return tls ? KERR_TLS_HEADER : KERR_HEADER;
	if (s[pl] != '0' || s[pl + 1] < (tls ? '1' : '0') || s[pl + 1] > (tls ? '2' : '3'))
		return KERR_HMAC;
	if (s[n - 1] != ':' || n == pl + 3)
		return KERR_COLON;
	b64_len = n - pl - 4;
	/* 36, 52 or 68 bytes encode to 48, 72 or 92 characters. */
	if (b64_len != 48 && b64_len != 72 && b64_len != 92)
		return memchr(s + pl + 3, ':', b64_len) ? KERR_BASE64 : KERR_LENGTH;
	got = b64_decode(s + pl + 3, b64_len, raw, sizeof(raw));
	if (got < 0)
		return KERR_BASE64;
	if (!rtrs_auth_key_len_valid((size_t)got - 4) ||
	    (tls && (size_t)got - 4 != (s[pl + 1] == '1' ? 32u : 48u))) {
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
	out->hmac = (uint8_t)(s[pl + 1] - '0');
	out->len = (uint8_t)got;
	memcpy(out->key, raw, (size_t)got);
	OPENSSL_cleanse(raw, sizeof(raw));
	return KERR_NONE;
}

static enum key_err key_parse(const char *s, size_t n, struct rtrs_auth_key *out,
			      uint32_t *crc_stored, uint32_t *crc_computed)
{
	return key_parse_kind(s, n, false, out, crc_stored, crc_computed);
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

static int key_check(const char *s, bool tls, struct rtrs_auth_key *out, uint32_t *crc_stored,
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
	e = key_parse_kind(s, n, tls, out, crc_stored, crc_computed);
	if (e != KERR_NONE)
		REJECT(key_err_errno(e), key_why[e]);
	return 0;
}

int rtrs_auth_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
			uint32_t *crc_computed, const char **why)
{
	return key_check(s, false, out, crc_stored, crc_computed, why);
}

int rtrs_auth_key_parse(const char *s, struct rtrs_auth_key *out, const char **why)
{
	return rtrs_auth_key_check(s, out, NULL, NULL, why);
}

int rtrs_tls_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
		       uint32_t *crc_computed, const char **why)
{
	return key_check(s, true, out, crc_stored, crc_computed, why);
}

/* k as PREFIX<hh>:<base64(key || crc32_le(key))>: into buf; k is checked by the caller. */
static int key_format(const struct rtrs_auth_key *k, const char *prefix, char *buf, size_t len)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN + 4];
	char b64[4 * ((sizeof(raw) + 2) / 3) + 1];
	uint32_t crc;
	int n;

	crc = rtrs_auth_crc32(k->key, k->len);
	memcpy(raw, k->key, k->len);
	raw[k->len] = (uint8_t)crc;
	raw[k->len + 1] = (uint8_t)(crc >> 8);
	raw[k->len + 2] = (uint8_t)(crc >> 16);
	raw[k->len + 3] = (uint8_t)(crc >> 24);
	EVP_EncodeBlock((unsigned char *)b64, raw, k->len + 4);
	OPENSSL_cleanse(raw, sizeof(raw));
	n = snprintf(buf, len, "%s%02x:%s:", prefix, k->hmac, b64);
	OPENSSL_cleanse(b64, sizeof(b64));
	if (n < 0 || (size_t)n >= len) {
		if (len)
			OPENSSL_cleanse(buf, len);
		return -ENOSPC;
	}
	return 0;
}

int rtrs_tls_key_format(const struct rtrs_auth_key *k, char *buf, size_t len)
{
	if (!k || !buf || !((k->hmac == 1 && k->len == 32) || (k->hmac == 2 && k->len == 48)))
		return -EINVAL;
	return key_format(k, "NVMeTLSkey-1:", buf, len);
}

int rtrs_auth_key_format(const struct rtrs_auth_key *k, char *buf, size_t len)
{
	if (!k || !buf || k->hmac > RTRS_AUTH_HASH_SHA512 || !rtrs_auth_key_len_valid(k->len))
		return -EINVAL;
	return key_format(k, "DHHC-1:", buf, len);
}

int rtrs_auth_key_generate(unsigned hmac_id, size_t len, const uint8_t *secret, const char *nqn,
			   struct rtrs_auth_key *out)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN];
	int rc = 0;

	if (!out || hmac_id > RTRS_AUTH_HASH_SHA512 || !rtrs_auth_key_len_valid(len))
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
		struct rtrs_auth_key k = { .hmac = (uint8_t)hmac_id, .len = (uint8_t)len };
		size_t out_len = 0;

		memcpy(k.key, raw, len);
		rc = rtrs_auth_transform(&k, nqn, out->key, &out_len);
		rtrs_auth_wipe(&k, sizeof(k));
		out->len = (uint8_t)out_len;
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


/*
 * Reads a whole small file into a NUL-terminated buffer that the caller
 * wipes and frees (free_secret). Warns when others may read it. Grows by
 * copying, not realloc, so no stale copy of a secret is left on the heap.
 * Only a regular file: a FIFO or a device is refused before it is opened.
 */
static int read_secret_file(const char *path, char **out, size_t *out_len, const char **why)
{
	size_t cap = 4096, len = 0;
	char *buf = NULL;
	struct stat st;
	int fd, rc = 0;

	/* Only a regular file is opened: a FIFO or a device named by mistake is not. */
	fd = open_regular(path, &st);
	if (fd == -EISDIR)
		REJECT(-EISDIR, "the key file is a directory");
	if (fd == -EINVAL)
		REJECT(-EINVAL, "the key file is not a regular file");
	if (fd < 0)
		REJECT(fd, "cannot open the key file");
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

static int key_load(const char *arg, bool tls, struct rtrs_auth_key *out, const char **why)
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
		return tls ? rtrs_tls_key_check(arg, out, NULL, NULL, why) :
			     rtrs_auth_key_parse(arg, out, why);
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
		e = key_parse_kind(l, n, tls, out, NULL, NULL);
		rc = key_err_errno(e);
		if (rc && why)
			*why = key_why[e];
		break;
	}
	free_secret(buf, len);
	return rc;
}

int rtrs_auth_key_load(const char *arg, struct rtrs_auth_key *out, const char **why)
{
	return key_load(arg, false, out, why);
}

int rtrs_tls_key_load(const char *arg, struct rtrs_auth_key *out, const char **why)
{
	return key_load(arg, true, out, why);
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
 * One non-blank line of a server key file:
 * "<host> <host secret> [<ctrl secret>] [tls=<TLS PSK>]".
 * Sets *match when it is host's line, and then fills hkey, ckey and tkey
 * (tkey may be NULL).
 */
static int keyfile_line(const char *l, size_t n, const char *host, size_t host_len,
			bool *match, const char **name, size_t *name_len,
			struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey,
			struct rtrs_auth_key *tkey, const char **why)
{
	const char *f[5], *p = l, *end = l + n;
	size_t fl[5];
	unsigned nf = 0;
	bool have_c = false, have_t = false;
	enum key_err e;

	while (nf < 5 && (f[nf] = next_field(&p, end, &fl[nf])))
		nf++;
	if (nf < 2)
		REJECT(-EINVAL, "missing the host secret");
	if (nf > 4)
		REJECT(-EINVAL, "too many fields");
	if (fl[0] > RTRS_AUTH_NAME_MAX)
		REJECT(-EINVAL, "host name too long");
	*match = fl[0] == host_len && !memcmp(f[0], host, host_len);
	*name = f[0];
	*name_len = fl[0];
	memset(ckey, 0, sizeof(*ckey));
	if (tkey)
		memset(tkey, 0, sizeof(*tkey));
	e = key_parse(f[1], fl[1], hkey, NULL, NULL);
	if (e != KERR_NONE)
		REJECT(-EINVAL, host_key_why[e]);
	for (unsigned i = 2; i < nf; i++) {
		if (fl[i] > 4 && !memcmp(f[i], "tls=", 4)) {
			struct rtrs_auth_key t;

			if (have_t)
				REJECT(-EINVAL, "two TLS keys");
			have_t = true;
			e = key_parse_kind(f[i] + 4, fl[i] - 4, true, &t, NULL, NULL);
			if (e == KERR_NONE && tkey)
				*tkey = t;
			rtrs_auth_wipe(&t, sizeof(t));
			if (e != KERR_NONE)
				REJECT(-EINVAL, tls_key_why[e]);
			continue;
		}
		if (have_c || have_t)
			REJECT(-EINVAL, have_c ? "too many fields" :
					"the controller secret comes before tls=");
		have_c = true;
		e = key_parse(f[i], fl[i], ckey, NULL, NULL);
		if (e != KERR_NONE)
			REJECT(-EINVAL, ctrl_key_why[e]);
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
	if (!hkey)
		REJECT(-EINVAL, "no key to fill");
	memset(hkey, 0, sizeof(*hkey));
	if (ckey)
		memset(ckey, 0, sizeof(*ckey));
	host_len = host ? strlen(host) : 0;
	if (host && (!host_len || host_len > RTRS_AUTH_NAME_MAX))
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
		rc = keyfile_line(l, n, host ? host : "", host_len, &match, &name, &name_len, &th,
				  &tc, NULL, why);
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
	if (!rc && !names.n) {
		rc = host ? -ESRCH : -ENOKEY;
		if (why)
			*why = "the key file lists no host";
	} else if (!rc && host && !found) {
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

int rtrs_auth_keyfile_each(const char *path,
			   int (*fn)(void *arg, const char *host, size_t host_len,
				     const struct rtrs_auth_key *hkey,
				     const struct rtrs_auth_key *tkey),
			   void *arg, unsigned *line, const char **why)
{
	struct rtrs_auth_key th, tc, tt;
	struct name_set names = { 0 };
	const char *p, *end, *l;
	unsigned lineno = 0;
	char *buf = NULL;
	size_t len = 0, n;
	int rc;

	if (line)
		*line = 0;
	if (!path || !fn)
		REJECT(-EINVAL, "no key file");
	rc = read_secret_file(path, &buf, &len, why);
	if (rc)
		return rc;
	p = buf;
	end = buf + len;
	while ((l = next_line(&p, end, &n))) {
		const char *name;
		size_t name_len;
		bool match;

		lineno++;
		if (!n)
			continue;
		rc = keyfile_line(l, n, "", 0, &match, &name, &name_len, &th, &tc, &tt, why);
		if (!rc)
			rc = names_add(&names, name, name_len, why);
		if (rc) {
			if (line && rc == -EINVAL)
				*line = lineno;
			break;
		}
		rc = fn(arg, name, name_len, &th, &tt);
		if (rc)
			break;
	}
	rtrs_auth_wipe(&th, sizeof(th));
	rtrs_auth_wipe(&tc, sizeof(tc));
	rtrs_auth_wipe(&tt, sizeof(tt));
	free(names.v);
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
