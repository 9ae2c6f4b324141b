/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: always_invalidate's key rotation. Each chunk has a memory
 * region of its own whose key is revoked when an IO arrives in the chunk
 * and replaced by a new one, never used before, when the IO is answered
 * or dropped (docs/security.md section 6). A client of this project gets
 * the session's keys, 64 bits with a generation, in a record with each
 * response; a kernel client gets its path's, 32 bits, in an RKEY_RSP sent
 * with each response, as the kernel's server does (a key per chunk and
 * path: a rotation on one path leaves the other paths' keys as they are).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rtrs-srv-pri.h"

/* The next generation of a chunk's key; never 0, which a client reads as "none yet". */
static uint32_t gen_next(uint32_t gen)
{
	return gen + 1 ? gen + 1 : 1;
}

int srv_keys_setup(struct rtrs_srv_sess *s, struct srv_keys *k, bool records)
{
	uint32_t qd = s->queue_depth;
	int rc = 0;

	k->mrs = calloc(qd, sizeof(*k->mrs));
	k->key = calloc(qd, sizeof(*k->key));
	k->hist = calloc((size_t)qd * RTRS_KEY_HISTORY, sizeof(*k->hist));
	k->gen = calloc(qd, sizeof(*k->gen));
	if (records)
		k->msgs = aligned_alloc(64, ((size_t)qd * RTRS_RKEY_SLOT + 63) & ~(size_t)63);
	if (!k->mrs || !k->key || !k->hist || !k->gen || (records && !k->msgs))
		return -ENOMEM;
	if (records)
		rc = fab_mr_reg(s->ctx->fab, k->msgs, (size_t)qd * RTRS_RKEY_SLOT, FAB_MR_LOCAL,
				&k->msgs_mr);
	for (uint32_t i = 0; !rc && i < qd; i++)
		rc = srv_chunk_rekey(s, k, i);
	return rc;
}

void srv_keys_release(struct rtrs_srv_sess *s, struct srv_keys *k)
{
	for (uint32_t i = 0; k->mrs && i < s->queue_depth; i++)
		fab_mr_dereg(&k->mrs[i]);
	fab_mr_dereg(&k->msgs_mr);
	free(k->mrs);
	free(k->key);
	free(k->hist);
	free(k->gen);
	free(k->msgs);
	k->mrs = NULL;
	k->key = NULL;
	k->hist = NULL;
	k->gen = NULL;
	k->msgs = NULL;
}

/* Revokes chunk id's key: from now on a write with it is refused. */
void srv_chunk_revoke(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id)
{
	pthread_mutex_lock(&s->key_lock);
	k->gen[id] = gen_next(k->gen[id]);
	k->key[id] = 0;
	pthread_mutex_unlock(&s->key_lock);
	fab_mr_dereg(&k->mrs[id]);
}

/*
 * Whether key was one of the chunk's last RTRS_KEY_HISTORY keys. A device
 * that picks keys itself (verbs: an index and a key byte) can hand back
 * one just revoked; that one is not taken.
 */
static bool chunk_key_recent(const struct srv_keys *k, uint32_t id, uint64_t key)
{
	const uint64_t *h = &k->hist[(size_t)id * RTRS_KEY_HISTORY];

	for (unsigned i = 0; i < RTRS_KEY_HISTORY; i++)
		if (h[i] == key)
			return true;
	return false;
}

/* Registers chunk id again under a key never used before; records it for the client. */
int srv_chunk_rekey(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id)
{
	uint64_t *h = &k->hist[(size_t)id * RTRS_KEY_HISTORY];
	/* A kernel client's keys are 32 bits: the device's own, as verbs gives them. */
	unsigned access = FAB_MR_REMOTE_WRITE | (k->msgs ? FAB_MR_KEY64 : 0);
	struct fab_mr mr;
	int rc, tries = 0;

	for (;;) {
		rc = fab_mr_reg(s->ctx->fab, s->chunk_bases[id], s->chunk_size, access, &mr);
		if (rc)
			return rc;
		if (!chunk_key_recent(k, id, mr.key))
			break;
		fab_mr_dereg(&mr);
		if (++tries == 64) {
			log_err_rl("%s: the device keeps handing back revoked keys for chunk %u",
				   s->name, id);
			return -EKEYREVOKED;
		}
	}
	memmove(h + 1, h, (RTRS_KEY_HISTORY - 1) * sizeof(*h));
	h[0] = mr.key;
	pthread_mutex_lock(&s->key_lock);
	k->mrs[id] = mr;
	k->gen[id] = gen_next(k->gen[id]);
	k->key[id] = mr.key;
	if (k->msgs)
		rtrs_new_rkey_encode(&k->msgs[id], id, k->gen[id], mr.key);
	pthread_mutex_unlock(&s->key_lock);
	atomic_fetch_add_explicit(&s->ctx->st.key_rotations, 1, memory_order_relaxed);
	return 0;
}

/* The key table as one record per chunk, for an info response or a fence. */
void srv_chunk_keys_snapshot(struct rtrs_srv_sess *s, const struct srv_keys *k,
			     struct rtrs_msg_new_rkey *out)
{
	pthread_mutex_lock(&s->key_lock);
	for (uint32_t i = 0; i < s->queue_depth; i++)
		rtrs_new_rkey_encode(&out[i], i, k->gen[i], k->key[i]);
	pthread_mutex_unlock(&s->key_lock);
}

/* The key of chunk id now (0 while revoked). */
uint64_t srv_chunk_key(struct rtrs_srv_sess *s, const struct srv_keys *k, uint32_t id)
{
	uint64_t key;

	pthread_mutex_lock(&s->key_lock);
	key = k->key[id];
	pthread_mutex_unlock(&s->key_lock);
	return key;
}
