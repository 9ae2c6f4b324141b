/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the nbdkit plugin's parameters
 * (nbdkit/rnbd-params.c, with the session options of lib/front/clt-opts.c
 * and the address parser of lib/rtrs/rtrs-opts.c). The input is nbdkit's command line after the
 * plugin: one key=value per line (split at the first '='), given in order.
 * Whatever they are:
 *
 *   - a refusal names its key (or says the key is unknown) and never
 *     echoes a secret;
 *   - a key other than server given again after it was accepted is
 *     refused, and a ninth server too;
 *   - what is accepted keeps the invariants the plugin relies on: paths
 *     with a host (their dst read again by rtrs_addr_parse gives the same
 *     host and port), ports 1..65535, a mode, names the wire codecs
 *     accept, numbers in their ranges;
 *   - the configuration is complete exactly when it has a server.
 *
 * Values point into one heap copy of the input, kept until the end (the
 * table keeps pointers, as nbdkit's strings live as long as the plugin).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rnbd-params.h"
#include "rnbd-proto.h"
#include "rtrs-proto.h"

static bool printable_word(const char *s)
{
	if (!s || !*s)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

static void check_cfg(const struct rnbd_plugin_cfg *c)
{
	const struct rtrs_clt_opts *o = &c->clt.opts;
	const char *why;

	FAIL_IF(o->paths_num > RNBD_PLUGIN_MAX_PATHS);
	FAIL_IF(o->paths_num && o->paths != c->clt.paths);
	for (unsigned i = 0; i < o->paths_num; i++) {
		FAIL_IF(!printable_word(o->paths[i].dst));
		FAIL_IF(strchr(o->paths[i].dst, '@') != NULL);
		FAIL_IF(o->paths[i].src && !printable_word(o->paths[i].src));
		FAIL_IF(o->paths[i].src && strlen(o->paths[i].src) > RNBD_PLUGIN_SRC_MAX);
		/* The dst a path gets is a fixed point of the parser: the library reads it so. */
		{
			struct rtrs_addr again = { .size = sizeof(again) };

			FAIL_IF(rtrs_addr_parse(o->paths[i].dst, 0, &again, NULL, 0) != 0);
			FAIL_IF(again.src[0] || strcmp(again.dst, o->paths[i].dst) ||
				strcmp(again.host, c->clt.addrs[i].host) ||
				again.port != c->clt.addrs[i].port);
		}
	}
	FAIL_IF(o->port < 1);
	FAIL_IF(c->mode != RNBD_CLT_RO && c->mode != RNBD_CLT_RW && c->mode != RNBD_CLT_MIGRATION);
	FAIL_IF(c->clt.log_level < -1 || c->clt.log_level > 3);
	FAIL_IF(o->nr_io_cons > 1024 || o->fast_io_fail_ms > 3600000 ||
		o->reconnect_delay_ms > 3600000);
	FAIL_IF(o->hb_interval_ms < 10 || o->hb_interval_ms > 600000);
	FAIL_IF(o->mp_policy != RTRS_MP_POLICY_RR && o->mp_policy != RTRS_MP_POLICY_MIN_INFLIGHT &&
		o->mp_policy != RTRS_MP_POLICY_MIN_LATENCY);
	FAIL_IF(!rtrs_name_valid(o->sessname));
	FAIL_IF(c->device && !rnbd_dev_name_valid(c->device, &why));
	FAIL_IF(c->control && (!*c->control || strlen(c->control) > 107));
	FAIL_IF(c->metrics && (!strchr(c->metrics, ':') || strlen(c->metrics) > 80));
	FAIL_IF(!printable_word(o->provider));
	FAIL_IF(o->auth_host_name && !rtrs_auth_name_valid(o->auth_host_name));
	FAIL_IF(o->auth_server_name && !rtrs_auth_name_valid(o->auth_server_name));
}

/* Keys accepted so far (each at most once, but server). */
struct seen {
	const char *keys[64];
	unsigned n;
};

static bool seen_has(const struct seen *s, const char *key)
{
	for (unsigned i = 0; i < s->n; i++)
		if (!strcmp(s->keys[i], key))
			return true;
	return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rnbd_plugin_cfg c;
	struct seen seen = { .n = 0 };
	char *text = malloc(size + 1), *p, *end, err[512];
	unsigned servers = 0;
	int rc;

	if (!text)
		abort();
	memcpy(text, data, size);
	text[size] = '\0';
	rnbd_plugin_cfg_init(&c);
	check_cfg(&c);
	for (p = text, end = text + size; p <= end;) {
		char *nl = memchr(p, '\n', (size_t)(end - p)), *eq, *key = p, *value;
		bool secret, again;

		if (nl)
			*nl = '\0';
		eq = strchr(p, '=');
		if (eq)
			*eq = '\0';
		value = eq ? eq + 1 : p + strlen(p);
		p = nl ? nl + 1 : end + 1;
		secret = !strcmp(key, "secret") || !strcmp(key, "ctrl_secret");
		again = strcmp(key, "server") && seen_has(&seen, key);
		err[0] = '\0';
		rc = rnbd_plugin_cfg_set(&c, key, value, err, sizeof(err));
		FAIL_IF(rc != 0 && rc != -EINVAL && rc != -E2BIG);
		check_cfg(&c);
		if (!rc) {
			FAIL_IF(again);
			if (!strcmp(key, "server"))
				servers++;
			else if (seen.n < 64)
				seen.keys[seen.n++] = key;
			continue;
		}
		FAIL_IF(!err[0]);
		if (rc == -E2BIG)
			FAIL_IF(strcmp(key, "server") || servers != RNBD_PLUGIN_MAX_PATHS);
		if (again) {
			char want[300];

			snprintf(want, sizeof(want), "%s= given twice", key);
			FAIL_IF(strcmp(err, want));
		}
		if (secret) {
			/* Exactly one of the messages that leave the value out. */
			char a[64], b[64], d[64];

			snprintf(a, sizeof(a), "%s=: expected DHHC-1:..., @FILE or file:FILE", key);
			snprintf(b, sizeof(b), "%s= given twice", key);
			snprintf(d, sizeof(d), "%s= needs a value", key);
			FAIL_IF(strcmp(err, a) && strcmp(err, b) && strcmp(err, d));
		} else if (strncmp(err, "unknown parameter ", 18)) {
			size_t kl = strlen(key);

			FAIL_IF(strncmp(err, key, kl) || err[kl] != '=');
		}
	}
	FAIL_IF(c.clt.opts.paths_num != servers);
	rc = rnbd_plugin_cfg_complete(&c, err, sizeof(err));
	FAIL_IF((rc == 0) != (c.clt.opts.paths_num > 0));
	free(text);
	return 0;
}
