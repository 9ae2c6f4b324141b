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
 *
 * Where the fabric has memory windows (rxe), a kernel client's chunk keys
 * move onto them at their first rotation, as the kernel's server rotates
 * with work requests: the revocation is an unbind posted on the request's
 * connection (the request waits for its completion), the new key a bind
 * posted before the response. No system call per IO, where a region
 * deregistered and registered again costs two that pin and unpin pages.
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
	if (!records && fab_attr(s->ctx->fab)->win_binds) {
		k->wins = calloc(qd, sizeof(*k->wins));
		if (!k->wins)
			return -ENOMEM;
	}
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
		rc = srv_chunk_rekey(s, k, i, NULL);
	return rc;
}

void srv_keys_release(struct rtrs_srv_sess *s, struct srv_keys *k)
{
	for (uint32_t i = 0; k->wins && i < s->queue_depth; i++)
		fab_win_free(&k->wins[i]);
	for (uint32_t i = 0; k->mrs && i < s->queue_depth; i++)
		fab_mr_dereg(&k->mrs[i]);
	free(k->wins);
	k->wins = NULL;
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

/*
 * Revokes chunk id's key: from now on a write with it is refused. 0 when
 * that holds on return; 1 when it holds once the unbind of the chunk's
 * window, posted on fc, completes (done(ctx) on fc's thread).
 */
int srv_chunk_revoke(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id,
		     struct fab_con *fc, void *ctx)
{
	struct fab_win *w = k->wins ? &k->wins[id] : NULL;

	pthread_mutex_lock(&s->key_lock);
	k->gen[id] = gen_next(k->gen[id]);
	k->key[id] = 0;
	pthread_mutex_unlock(&s->key_lock);
	fab_mr_dereg(&k->mrs[id]);
	if (!w || !w->ops)
		return 0;
	if (fc && w->binds < fab_attr(s->ctx->fab)->win_binds &&
	    !fab_win_bind(fc, w, &s->chunk_mr, s->chunk_bases[id], 0, ctx))
		return 1;
	fab_win_free(w); /* freed, its key is dead too */
	return 0;
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

/* chunk_key_set with s->key_lock held. */
static void chunk_key_set_locked(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id,
				 uint64_t key)
{
	uint64_t *h = &k->hist[(size_t)id * RTRS_KEY_HISTORY];

	memmove(h + 1, h, (RTRS_KEY_HISTORY - 1) * sizeof(*h));
	h[0] = key;
	k->gen[id] = gen_next(k->gen[id]);
	k->key[id] = key;
	if (k->msgs)
		rtrs_new_rkey_encode(&k->msgs[id], id, k->gen[id], key);
	atomic_fetch_add_explicit(&s->ctx->st.key_rotations, 1, memory_order_relaxed);
}

/* Chunk id's new key, for the client: never one of its last few. */
static void chunk_key_set(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id, uint64_t key)
{
	pthread_mutex_lock(&s->key_lock);
	chunk_key_set_locked(s, k, id, key);
	pthread_mutex_unlock(&s->key_lock);
}

/*
 * Binds chunk id's window under a new key by a work request on fc, the
 * window replaced by a new one before its keys could come back. A key
 * among the chunk's last few (a device that hands one back) is bound over
 * at once, on the same connection, before anything can use it.
 */
static int chunk_bind(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id,
		      struct fab_con *fc)
{
	struct fab_win *w = &k->wins[id];
	unsigned limit = fab_attr(s->ctx->fab)->win_binds;
	int rc;

	for (int tries = 0;; tries++) {
		if (w->ops && w->binds >= limit)
			fab_win_free(w);
		if (!w->ops) {
			rc = fab_win_alloc(s->ctx->fab, w);
			if (rc)
				return rc;
		}
		rc = fab_win_bind(fc, w, &s->chunk_mr, s->chunk_bases[id], s->chunk_size, NULL);
		if (rc) {
			if (rc != -EAGAIN)
				fab_win_free(w);
			return rc;
		}
		if (!chunk_key_recent(k, id, w->key))
			break;
		if (tries == 64) {
			log_err_rl("%s: the device keeps handing back revoked keys for chunk %u",
				   s->name, id);
			return -EKEYREVOKED;
		}
	}
	chunk_key_set(s, k, id, w->key);
	return 0;
}

/*
 * Registers chunk id's memory for the client under a key that is not one
 * of the chunk's last few: 0, or -ENOMEM (the device's -EAGAIN too),
 * -EKEYREVOKED (the device keeps handing revoked keys back), another
 * registration error.
 */
static int chunk_reg_fresh(struct rtrs_srv_sess *s, const struct srv_keys *k, uint32_t id,
			   struct fab_mr *mr)
{
	/* A kernel client's keys are 32 bits: the device's own, as verbs gives them. */
	unsigned access = FAB_MR_REMOTE_WRITE | (k->msgs ? FAB_MR_KEY64 : 0);

	for (int tries = 0;; tries++) {
		int rc = fab_mr_reg(s->ctx->fab, s->chunk_bases[id], s->chunk_size, access, mr);

		if (rc)
			return rc == -EAGAIN ? -ENOMEM : rc;
		if (!chunk_key_recent(k, id, mr->key))
			return 0;
		fab_mr_dereg(mr);
		if (tries == 63) {
			log_err_rl("%s: the device keeps handing back revoked keys for chunk %u",
				   s->name, id);
			return -EKEYREVOKED;
		}
	}
}

/*
 * Gives chunk id a key never used before and records it for the client:
 * its window bound again by a work request on fc where it has one (fc:
 * the connection the response goes on, -EAGAIN when its send queue is
 * full), else its memory region registered again.
 */
int srv_chunk_rekey(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id, struct fab_con *fc)
{
	struct fab_mr mr;
	int rc;

	if (k->wins && fc) {
		rc = chunk_bind(s, k, id, fc);
		if (!rc || rc == -EAGAIN || rc == -EKEYREVOKED)
			return rc;
		log_warn_rl("%s: chunk %u: no memory window (%s): its region is registered again",
			    s->name, id, strerror(-rc));
	}
	if (k->wins)
		fab_win_free(&k->wins[id]);
	rc = chunk_reg_fresh(s, k, id, &mr);
	if (rc)
		return rc;
	k->mrs[id] = mr;
	chunk_key_set(s, k, id, mr.key);
	return 0;
}

/*
 * Loop thread, before the key table goes to a client (a fence's ack, an
 * info response): chunks left without a key get one. An op that ends
 * without a response re-keys its chunk (op_drop); when that registration
 * fails (no memory, the memlock limit), the chunk stays revoked with key
 * 0, and a client handed 0 for it would fail the path that carries its
 * next request there. Such a chunk is free (no op holds it) and cannot be
 * written (its key is dead), so nothing else touches it meanwhile; a
 * chunk whose op is still at work is that op's to re-key. 0, or the
 * error of a chunk that still has no key: the table must not go out.
 */
/*
 * Chunk id lost its key and no op holds it: the state read before the key,
 * both under key_lock (an op sets the chunk's key before it frees the op,
 * and a request revokes a key, under the lock, only once it holds the
 * op), so a chunk between an op's revoke and its re-key is not taken for
 * one. Only a live key lets a request in, so nothing takes the chunk
 * meanwhile; gen says so again when the new key is put in.
 */
static bool chunk_keyless(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id,
			  uint32_t *gen)
{
	bool keyless;

	pthread_mutex_lock(&s->key_lock);
	keyless = op_st(atomic_load(&s->ops[id].state)) == OP_FREE && !k->key[id];
	*gen = k->gen[id];
	pthread_mutex_unlock(&s->key_lock);
	return keyless;
}

/*
 * Gives a keyless chunk (chunk_keyless) a key never used before: 1, 0 when
 * it turned out not to be keyless, or the registration's error.
 */
static int chunk_repair(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id, uint32_t gen)
{
	struct fab_mr mr;
	int rc = chunk_reg_fresh(s, k, id, &mr);

	if (rc)
		return rc;
	pthread_mutex_lock(&s->key_lock);
	if (k->gen[id] != gen || k->key[id] || op_st(atomic_load(&s->ops[id].state)) != OP_FREE) {
		pthread_mutex_unlock(&s->key_lock);
		fab_mr_dereg(&mr); /* not keyless after all */
		return 0;
	}
	k->mrs[id] = mr;
	chunk_key_set_locked(s, k, id, mr.key);
	pthread_mutex_unlock(&s->key_lock);
	return 1;
}

int srv_keys_repair(struct rtrs_srv_sess *s, struct srv_keys *k)
{
	uint32_t n = 0, gen;
	int rc;

	for (uint32_t i = 0; s->ops && i < s->queue_depth; i++) {
		if (!chunk_keyless(s, k, i, &gen))
			continue;
		rc = chunk_repair(s, k, i, gen);
		if (rc < 0) {
			log_err_rl("%s: chunk %u still has no key: %s", s->name, i, strerror(-rc));
			return rc;
		}
		n += (uint32_t)rc;
	}
	if (n)
		log_info("%s: %u chunks that had lost their keys have new ones", s->name, n);
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
