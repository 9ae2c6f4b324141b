/* SPDX-License-Identifier: MIT */
/*
 * rtrs-key: DH-HMAC-CHAP secrets for RTRS authentication.
 *
 *   rtrs-key gen [--hmac N] [--key-length L] [--secret HEX] [--nqn NQN]
 *                                  print a new DHHC-1 secret
 *   rtrs-key check KEY|@FILE       say whether a secret is usable
 *
 * The strings are NVMe's (nvme gen-dhchap-key / check-dhchap-key), so the
 * same secret can be used with the Linux NVMe host and target.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "opts.h"
#include "rtrs-auth.h"

static struct {
	uint64_t hmac, key_length;
	const char *secret, *nqn;
} g;

static const struct opt gen_options[] = {
	{ "hmac", 'm', OPT_UINT, &g.hmac, 0, 3, .arg = "N",
	  .help = "transform hash: 0 none, 1 SHA-256, 2 SHA-384, 3 SHA-512" },
	{ "key-length", 'l', OPT_UINT, &g.key_length, 0, 64, .arg = "L",
	  .help = "bytes of the key: 32, 48 or 64 (0: from --secret, or the hash's size, "
		  "or 32)" },
	{ "secret", 's', OPT_STRING, &g.secret, .arg = "HEX",
	  .help = "use this secret (64, 96 or 128 hex digits), not a random one" },
	{ "nqn", 'n', OPT_STRING, &g.nqn, .arg = "NQN",
	  .help = "with --hmac > 0: transform the secret with this name, as nvme-cli 2.x "
		  "does (no default: without it the secret is stored as it is)" },
	{ 0 },
};

static const struct opt check_options[] = {
	{ 0 },
};

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Hex to bytes; the length in bytes, or -1. */
static int parse_hex(const char *s, uint8_t *out, size_t max)
{
	size_t n = strlen(s);

	if (n % 2 || n / 2 > max)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return (int)(n / 2);
}

static bool len_valid(uint64_t len)
{
	return len == 32 || len == 48 || len == 64;
}

static int run_gen(void)
{
	uint8_t secret[RTRS_AUTH_MAX_KEY_LEN];
	char line[RTRS_AUTH_KEY_STR_MAX];
	struct rtrs_auth_key k;
	size_t hash_len = rtrs_auth_hash_len((unsigned)g.hmac);
	size_t secret_len = 0, len;
	bool transform = g.hmac && g.nqn;
	int rc;

	if (g.key_length && !len_valid(g.key_length)) {
		fprintf(stderr, "rtrs-key: --key-length %llu: must be 32, 48 or 64\n",
			(unsigned long long)g.key_length);
		return 2;
	}
	if (g.secret) {
		rc = parse_hex(g.secret, secret, sizeof(secret));
		if (rc < 0 || !len_valid((uint64_t)rc)) {
			fprintf(stderr, "rtrs-key: --secret: expected 64, 96 or 128 hex digits\n");
			rtrs_auth_wipe(secret, sizeof(secret));
			return 2;
		}
		secret_len = (size_t)rc;
	}
	/* With the transform the key is a digest: its length is the hash's. */
	if (transform) {
		if (g.key_length && g.key_length != hash_len) {
			fprintf(stderr, "rtrs-key: --key-length %llu: a key transformed with %s "
				"is %zu bytes\n", (unsigned long long)g.key_length,
				rtrs_auth_hash_name((unsigned)g.hmac), hash_len);
			rtrs_auth_wipe(secret, sizeof(secret));
			return 2;
		}
		len = secret_len ? secret_len : hash_len;
	} else {
		if (g.key_length && secret_len && g.key_length != secret_len) {
			fprintf(stderr, "rtrs-key: --key-length %llu, but --secret has %zu bytes\n",
				(unsigned long long)g.key_length, secret_len);
			rtrs_auth_wipe(secret, sizeof(secret));
			return 2;
		}
		len = g.key_length ? g.key_length : secret_len ? secret_len :
		      hash_len ? hash_len : 32;
	}
	rc = rtrs_auth_key_generate((unsigned)g.hmac, len, g.secret ? secret : NULL,
				    transform ? g.nqn : NULL, &k);
	rtrs_auth_wipe(secret, sizeof(secret));
	if (!rc)
		rc = rtrs_auth_key_format(&k, line, sizeof(line));
	rtrs_auth_wipe(&k, sizeof(k));
	if (rc) {
		fprintf(stderr, "rtrs-key: cannot make a key: %s\n", strerror(-rc));
		return 1;
	}
	printf("%s\n", line);
	rtrs_auth_wipe(line, sizeof(line));
	return fflush(stdout) ? 1 : 0;
}

static int run_check(const char *arg)
{
	uint32_t stored = 0, computed = 0;
	const char *why = "invalid";
	struct rtrs_auth_key k;
	bool file = arg[0] == '@' || !strncmp(arg, "file:", 5);
	int rc;

	if (file)
		rc = rtrs_auth_key_load(arg, &k, &why);
	else
		rc = rtrs_auth_key_check(arg, &k, &stored, &computed, &why);
	if (rc == -EKEYREJECTED && !file) {
		/* nvme check-dhchap-key's wording: what the string says, what we got. */
		fprintf(stderr, "CRC mismatch (key %08x, crc %08x)\n", stored, computed);
		return 1;
	}
	if (rc) {
		if (file && why && !strcmp(why, "cannot open the key file"))
			fprintf(stderr, "%s: %s\n", arg + (arg[0] == '@' ? 1 : 5), strerror(-rc));
		else
			fprintf(stderr, "%s\n", why);
		return 1;
	}
	printf("Key is valid (HMAC %u, length %u, CRC %08x)\n", k.hmac, k.len,
	       rtrs_auth_crc32(k.key, k.len));
	rtrs_auth_wipe(&k, sizeof(k));
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: rtrs-key gen [options]     print a new DHHC-1 secret\n"
		   "       rtrs-key check KEY|@FILE   check a secret (a string, or a file's\n"
		   "                                  first non-comment line)\n"
		   "See rtrs-key gen --help, rtrs-key check --help.\n");
}

int main(int argc, char **argv)
{
	int pos, rc;

	/* The auth code's log lines (libcrypto's reasons at debug): RTRS_LOG_LEVEL, else warn. */
	rc = opts_log_level("rtrs-key", NULL, NULL, getenv("RTRS_LOG_LEVEL"), LOG_WARN);
	if (rc < 0)
		return 2;
	g_log_level = rc;
	if (opts_version_arg(argc, argv, "rtrs-key"))
		return 0;
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "gen")) {
		rc = opts_parse(gen_options, "rtrs-key gen", "[options]", argc - 1, argv + 1, &pos);
		if (rc)
			return rc > 0 ? 0 : 2;
		if (pos != argc - 1) {
			fprintf(stderr, "rtrs-key gen: unexpected argument '%s'\n", argv[pos + 1]);
			return 2;
		}
		return run_gen();
	}
	if (!strcmp(argv[1], "check")) {
		rc = opts_parse(check_options, "rtrs-key check", "KEY|@FILE|file:FILE", argc - 1,
				argv + 1, &pos);
		if (rc)
			return rc > 0 ? 0 : 2;
		if (pos != argc - 2) {
			fprintf(stderr, "rtrs-key check: want one KEY or @FILE (see --help)\n");
			return 2;
		}
		return run_check(argv[pos + 1]);
	}
	fprintf(stderr, "rtrs-key: unknown command '%s' (gen or check; see --help)\n", argv[1]);
	return 2;
}
