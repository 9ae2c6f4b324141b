/* SPDX-License-Identifier: MIT */
/*
 * DH-HMAC-CHAP crypto for RTRS sessions, as NVMe over Fabrics defines it
 * (NVMe Base 2.0 section 8.13.5, TP 8006): DHHC-1 secrets, the key
 * transform, the augmented challenge, the host (R1) and controller (R2)
 * responses, and ephemeral FFDHE key agreement. OpenSSL (libcrypto) does
 * the hashing, HMAC, DH and randomness; nothing here touches the network.
 *
 * Secrets never reach a log: functions that fail on a secret say why in
 * *why (a constant string) and never quote it. Buffers that held secret
 * material are wiped with rtrs_auth_wipe() (OPENSSL_cleanse).
 *
 * All functions return 0 or a negative errno.
 */
#ifndef RTRS_AUTH_H
#define RTRS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Hash ids, as in NVMe (and as the DHHC-1 "hmac" field, where 0 = none). */
enum rtrs_auth_hash {
	RTRS_AUTH_HASH_NONE = 0,   /* DHHC-1 only: the secret is used as is */
	RTRS_AUTH_HASH_SHA256 = 1,
	RTRS_AUTH_HASH_SHA384 = 2,
	RTRS_AUTH_HASH_SHA512 = 3,
};

/* DH group ids, as in NVMe; the FFDHE groups are RFC 7919's. */
enum rtrs_auth_dhgroup {
	RTRS_AUTH_DH_NULL = 0,
	RTRS_AUTH_DH_FFDHE2048 = 1,
	RTRS_AUTH_DH_FFDHE3072 = 2,
	RTRS_AUTH_DH_FFDHE4096 = 3,
	RTRS_AUTH_DH_FFDHE6144 = 4,
	RTRS_AUTH_DH_FFDHE8192 = 5,
};

#define RTRS_AUTH_NR_HASHES 3        /* SHA-256, -384, -512 */
#define RTRS_AUTH_NR_DHGROUPS 6      /* null and five FFDHE groups */
#define RTRS_AUTH_MAX_HASH_LEN 64
#define RTRS_AUTH_MAX_KEY_LEN 64     /* DHHC-1 secrets are 32, 48 or 64 bytes */
#define RTRS_AUTH_MAX_DH_LEN 1024    /* ffdhe8192 public value */
/* "DHHC-1:xx:" + base64 of 64 + 4 bytes (92) + ":" + NUL */
#define RTRS_AUTH_KEY_STR_MAX 104
/* Host and server names: NQN-like, as NVMe (223 bytes) */
#define RTRS_AUTH_NAME_MAX 223

/* A DHHC-1 secret, decoded and checked. */
struct rtrs_auth_key {
	uint8_t hmac;                      /* 0..3: transform hash from the prefix */
	uint8_t len;                       /* 32, 48 or 64 */
	uint8_t key[RTRS_AUTH_MAX_KEY_LEN];
};

/* ---- ids and names ---------------------------------------------------------- */

/* Digest size of a hash id (1..3), 0 for anything else. */
size_t rtrs_auth_hash_len(unsigned hash);
/* "sha256", "sha384", "sha512"; NULL for an unknown id. */
const char *rtrs_auth_hash_name(unsigned hash);
/* Accepts "sha256", "sha-256", "hmac(sha256)", case-insensitive; id or -EINVAL. */
int rtrs_auth_hash_from_name(const char *name);
/* "null", "ffdhe2048", ... "ffdhe8192"; NULL for an unknown id. */
const char *rtrs_auth_dhgroup_name(unsigned group);
/* Accepts the names above, case-insensitive; id or -EINVAL. */
int rtrs_auth_dhgroup_from_name(const char *name);
/* Bytes of a group's public value (its modulus size); 0 for null or unknown. */
size_t rtrs_auth_dh_len(unsigned group);
/*
 * Parses a comma-separated list of hash (or DH group) names into ids in
 * the order given, no duplicates: at most max ids. Count or -EINVAL
 * (*why names the problem).
 */
int rtrs_auth_hash_list(const char *list, uint8_t *ids, size_t max, const char **why);
int rtrs_auth_dhgroup_list(const char *list, uint8_t *ids, size_t max, const char **why);

/* ---- DHHC-1 secrets --------------------------------------------------------- */

/*
 * Parses "DHHC-1:<hh>:<base64(key || crc32_le(key))>:" exactly as the Linux
 * kernel and nvme-cli accept it: hh is two hex digits 00..03; the base64
 * (RFC 4648, with padding) decodes to 36, 52 or 68 bytes, whatever hh is;
 * the CRC-32 (zlib/IEEE) of the key must match the little-endian trailer.
 * Leading/trailing whitespace (a trailing newline from a file) is ignored.
 * -EINVAL for a malformed string, -EKEYREJECTED for a CRC mismatch.
 */
int rtrs_auth_key_parse(const char *s, struct rtrs_auth_key *out, const char **why);
/*
 * rtrs_auth_key_parse() for tools that report on a key (rtrs-key check):
 * also gives the CRC-32 stored in the string and the one computed over the
 * decoded key, mismatch or not (0 when the string did not get that far).
 */
int rtrs_auth_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
			uint32_t *crc_computed, const char **why);

/* Formats k as "DHHC-1:%02x:<base64>:"; buf holds RTRS_AUTH_KEY_STR_MAX. */
int rtrs_auth_key_format(const struct rtrs_auth_key *k, char *buf, size_t len);

/*
 * NVMe TLS PSKs in the interchange format, as `nvme gen-tls-key` writes
 * them: "NVMeTLSkey-1:<hh>:<base64(psk || crc32_le(psk))>:", hh 01
 * (SHA-256, a 32-byte PSK) or 02 (SHA-384, 48 bytes). The same rules and
 * errors as rtrs_auth_key_check; out->hmac is the hash id (1 or 2).
 */
int rtrs_tls_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
		       uint32_t *crc_computed, const char **why);
/* Formats k (hmac 1 and 32 bytes, or 2 and 48) as "NVMeTLSkey-1:%02x:<base64>:". */
int rtrs_tls_key_format(const struct rtrs_auth_key *k, char *buf, size_t len);
/* rtrs_auth_key_load for a TLS PSK: the string, or "@PATH" / "file:PATH". */
int rtrs_tls_key_load(const char *arg, struct rtrs_auth_key *out, const char **why);

/*
 * Makes a secret: len (32/48/64) bytes from secret (NULL: random). With
 * hmac > 0 and nqn non-NULL the bytes are first transformed as nvme-cli 2.x
 * (Debian's) does: HMAC_hmac(secret, nqn || "NVMe-over-Fabrics"), whose
 * digest size then is the length; so `nvme gen-dhchap-key -s HEX -m N -n NQN`
 * and this give the same string. hmac > 0 without nqn stores the bytes
 * as they are (the newest nvme-cli's behaviour).
 */
int rtrs_auth_key_generate(unsigned hmac, size_t len, const uint8_t *secret, const char *nqn,
			   struct rtrs_auth_key *out);

/*
 * A secret given on a command line or in a config: "DHHC-1:..." itself, or
 * "@PATH" / "file:PATH" naming a file whose first non-comment line holds it.
 * Warns (without the secret) when the file is readable by group or others.
 */
int rtrs_auth_key_load(const char *arg, struct rtrs_auth_key *out, const char **why);

/*
 * Server key file: one host per line, "#" comments, blank lines ignored:
 *     <host name> <host secret> [<controller secret>]
 * Looks host up; -ESRCH when the file does not list it, -EINVAL (with
 * *line and *why set) for a malformed line, -errno when the file cannot
 * be read (-ENOENT: it does not exist). ctrl->len is 0 when the line has no controller secret.
 * host NULL checks the file only: 0 when every line parses and it lists a
 * host (hkey and ckey are left zeroed), -ENOKEY when it lists none.
 */
int rtrs_auth_keyfile_lookup(const char *path, const char *host, struct rtrs_auth_key *hkey,
			     struct rtrs_auth_key *ckey, unsigned *line, const char **why);

/* The same on a key file's text (len bytes, NUL-terminated): the parser alone. */
int rtrs_auth_keyfile_parse(const char *buf, size_t len, const char *host,
			    struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey, unsigned *line,
			    const char **why);

/*
 * Reads the key file at path and calls fn for each host line, in order,
 * with its host secret and its TLS PSK (tkey->len 0 when the line has no
 * "tls=" field). Stops at the first line that does not parse (-EINVAL,
 * *line, *why) or the first non-zero return of fn, which it returns.
 */
int rtrs_auth_keyfile_each(const char *path,
			   int (*fn)(void *arg, const char *host, size_t host_len,
				     const struct rtrs_auth_key *hkey,
				     const struct rtrs_auth_key *tkey),
			   void *arg, unsigned *line, const char **why);

/*
 * The same lookup on a key file read by a thread of its own, so that a
 * file that blocks (a hung network file system) never stalls the caller
 * for longer than RTRS_KEYFILE_WAIT_MS: then -ETIMEDOUT. Each lookup reads
 * the file afresh. Free with rtrs_keyfile_free (a reader stuck in the
 * file goes when the read returns).
 */
#define RTRS_KEYFILE_WAIT_MS 1000
struct rtrs_keyfile;
int rtrs_keyfile_new(const char *path, struct rtrs_keyfile **out);
void rtrs_keyfile_free(struct rtrs_keyfile *kf);
const char *rtrs_keyfile_path(const struct rtrs_keyfile *kf);
int rtrs_keyfile_lookup(struct rtrs_keyfile *kf, const char *host, struct rtrs_auth_key *hkey,
			struct rtrs_auth_key *ckey, unsigned *line, const char **why);

/* ---- the exchange ----------------------------------------------------------- */

/*
 * Transformed key K' (section 2.5): K itself for hmac 0, else HMAC(K, nqn || "NVMe-over-Fabrics").
 * out holds RTRS_AUTH_MAX_KEY_LEN bytes; *out_len is set. -ENOKEY when k has no key (len 0).
 */
int rtrs_auth_transform(const struct rtrs_auth_key *k, const char *nqn, uint8_t *out,
			size_t *out_len);

/* HMAC_H(key, data), H a hash id (1..3): hash_len bytes into out. */
int rtrs_auth_hmac(unsigned hash, const uint8_t *key, size_t key_len, const uint8_t *data,
		   size_t len, uint8_t *out);
/* Ks = H(g^xy), H the negotiated hash; out holds hash_len bytes. */
int rtrs_auth_session_key(unsigned hash, const uint8_t *gxy, size_t gxy_len, uint8_t *out);

/*
 * A response (R1 with host = true, R2 with host = false), hash_len bytes:
 *   HMAC_H(K', Ca || le32(seq) || le16(tid) || scc || "HostHost" | "Controller"
 *              || name1 || 0x00 || name2)
 * where Ca = HMAC_H(ks, chal) when ks is non-NULL (a DH group is in use),
 * else chal; name1/name2 are host/server for R1 and server/host for R2.
 */
int rtrs_auth_response(unsigned hash, const uint8_t *tkey, size_t tkey_len,
		       const uint8_t *chal, const uint8_t *ks, uint32_t seq, uint16_t tid,
		       uint8_t scc, bool host, const char *name1, const char *name2,
		       uint8_t *out);

/* Ephemeral DH key pair of an FFDHE group. */
struct rtrs_auth_dh;
int rtrs_auth_dh_new(unsigned group, struct rtrs_auth_dh **out);
/* Public value, big-endian, zero-padded to rtrs_auth_dh_len(group) bytes. */
int rtrs_auth_dh_public(const struct rtrs_auth_dh *dh, uint8_t *buf, size_t len);
/*
 * Shared secret g^xy from the peer's public value (which must be exactly
 * rtrs_auth_dh_len bytes and 1 < y < p-1: -EINVAL otherwise), big-endian,
 * zero-padded to rtrs_auth_dh_len bytes.
 */
int rtrs_auth_dh_shared(struct rtrs_auth_dh *dh, const uint8_t *peer, size_t peer_len,
			uint8_t *out, size_t out_len);
void rtrs_auth_dh_free(struct rtrs_auth_dh *dh);

/* ---- helpers ---------------------------------------------------------------- */

int rtrs_auth_random(void *buf, size_t len);
/* Sequence numbers: start random, count up, never 0 (NVMe reserves 0). */
uint32_t rtrs_auth_seqnum(void);
/* Constant-time comparison: true when equal. */
bool rtrs_auth_equal(const void *a, const void *b, size_t len);
void rtrs_auth_wipe(void *buf, size_t len);
/* CRC-32 (zlib / IEEE 802.3), as in the DHHC-1 trailer. */
uint32_t rtrs_auth_crc32(const uint8_t *buf, size_t len);

/* Shared by rtrs-auth.c and rtrs-auth-keys.c: a secret's length is one DHHC-1 allows (32, 48 or 64 bytes). */
bool rtrs_auth_key_len_valid(size_t len);

#endif
