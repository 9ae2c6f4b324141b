/* SPDX-License-Identifier: MIT */
/*
 * A test helper: the prime of an FFDHE group straight from OpenSSL, to
 * build the peer values p - 1 and p that key agreement must refuse.
 */
#ifndef RTRS_TEST_FFDHE_PRIME_H
#define RTRS_TEST_FFDHE_PRIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>

#include "rtrs-auth.h"

static inline bool group_prime(unsigned group, uint8_t *p, size_t len)
{
	EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
	OSSL_PARAM params[2] = {
		OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
						 (char *)rtrs_auth_dhgroup_name(group), 0),
		OSSL_PARAM_construct_end(),
	};
	EVP_PKEY *key = NULL;
	BIGNUM *bn = NULL;
	bool ok;

	ok = ctx && EVP_PKEY_paramgen_init(ctx) > 0 && EVP_PKEY_CTX_set_params(ctx, params) > 0 &&
	     EVP_PKEY_generate(ctx, &key) > 0 &&
	     EVP_PKEY_get_bn_param(key, OSSL_PKEY_PARAM_FFC_P, &bn) &&
	     BN_bn2binpad(bn, p, (int)len) == (int)len;
	BN_free(bn);
	EVP_PKEY_free(key);
	EVP_PKEY_CTX_free(ctx);
	return ok;
}

#endif
