/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: always_invalidate's key rotation. Each chunk has a memory
 * region of its own whose key is revoked when an IO arrives in the chunk
 * and replaced by a new one, never used before, when the IO is answered
 * or dropped; the new key and its generation travel to the client in the
 * response (docs/security.md section 6).
 */
#include <errno.h>
#include <string.h>

#include "rtrs-srv-pri.h"

/* The next generation of a chunk's key; never 0, which a client reads as "none yet". */
static uint32_t gen_next(uint32_t gen)
{
	return gen + 1 ? gen + 1 : 1;
}

/* Revokes chunk id's key: from now on a write with it is refused. */
void srv_chunk_revoke(struct rtrs_srv_sess *s, uint32_t id)
{
	pthread_mutex_lock(&s->key_lock);
	s->chunk_gen[id] = gen_next(s->chunk_gen[id]);
	s->chunk_key[id] = 0;
	pthread_mutex_unlock(&s->key_lock);
	fab_mr_dereg(&s->chunk_mrs[id]);
}

/*
 * Whether key was one of the chunk's last RTRS_KEY_HISTORY keys. A provider
 * that picks keys itself (verbs: an index and a random byte) can hand back
 * one just revoked; that one is not taken.
 */
static bool chunk_key_recent(const struct rtrs_srv_sess *s, uint32_t id, uint64_t key)
{
	const uint64_t *h = &s->chunk_key_hist[(size_t)id * RTRS_KEY_HISTORY];

	for (unsigned i = 0; i < RTRS_KEY_HISTORY; i++)
		if (h[i] == key)
			return true;
	return false;
}

/* Registers chunk id again under a key never used before; records it for the client. */
int srv_chunk_rekey(struct rtrs_srv_sess *s, uint32_t id)
{
	uint64_t *h = &s->chunk_key_hist[(size_t)id * RTRS_KEY_HISTORY];
	struct fab_mr mr;
	int rc, tries = 0;

	for (;;) {
		rc = fab_mr_reg(s->ctx->fab, s->chunk_bases[id], s->chunk_size,
				FAB_MR_REMOTE_WRITE | FAB_MR_KEY64, &mr);
		if (rc)
			return rc;
		if (!chunk_key_recent(s, id, mr.key))
			break;
		fab_mr_dereg(&mr);
		if (++tries == 64) {
			log_err_rl("%s: the provider keeps handing back revoked keys for chunk %u",
				   s->name, id);
			return -EKEYREVOKED;
		}
	}
	memmove(h + 1, h, (RTRS_KEY_HISTORY - 1) * sizeof(*h));
	h[0] = mr.key;
	pthread_mutex_lock(&s->key_lock);
	s->chunk_mrs[id] = mr;
	s->chunk_gen[id] = gen_next(s->chunk_gen[id]);
	s->chunk_key[id] = mr.key;
	rtrs_new_rkey_encode(&s->rkey_msgs[id], id, s->chunk_gen[id], mr.key);
	pthread_mutex_unlock(&s->key_lock);
	atomic_fetch_add_explicit(&s->ctx->st.key_rotations, 1, memory_order_relaxed);
	return 0;
}

/* The key table as one record per chunk, for an info response or a fence. */
void srv_chunk_keys_snapshot(struct rtrs_srv_sess *s, struct rtrs_msg_new_rkey *out)
{
	pthread_mutex_lock(&s->key_lock);
	for (uint32_t i = 0; i < s->queue_depth; i++)
		rtrs_new_rkey_encode(&out[i], i, s->chunk_gen[i], s->chunk_key[i]);
	pthread_mutex_unlock(&s->key_lock);
}
