/* SPDX-License-Identifier: MIT */
/*
 * Test hooks of librnbd: not in rnbd.h, for tests that link the library's
 * archive. Each is called at one fixed point of the library so that a test
 * can hold a race window open for as long as it takes to provoke the race;
 * unset (the default) each costs one atomic load where it is called.
 */
#ifndef RNBD_HOOKS_H
#define RNBD_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Client: fn(priv, dev_name) runs on the thread that sent an OPEN (a map, a
 * remap, the reconnect's pass) once the answer is in, before the library
 * takes it. NULL removes it.
 */
void rnbd_clt_set_open_hook(void (*fn)(void *priv, const char *dev_name), void *priv);

struct rnbd_breq;

/*
 * Backing stores: fn(priv, r) runs for every request that passed a store's
 * checks, on the submitting thread, before anything is done with it; true
 * holds it, as a backing file that hangs would (it counts as in flight: the
 * store does not close), until rnbd_store_resume(r) runs it as usual. NULL
 * removes it.
 */
void rnbd_store_set_hold_hook(bool (*fn)(void *priv, struct rnbd_breq *r), void *priv);
void rnbd_store_resume(struct rnbd_breq *r);
/*
 * fn(priv, fd) runs in place of every fdatasync of a store's descriptor fd
 * (a flusher's, a pool thread's), and returns what it would (0 or -errno):
 * a test holds one store's syncs there, as a hung file system would. NULL
 * removes it.
 */
void rnbd_store_set_sync_hook(int (*fn)(void *priv, int fd), void *priv);

/*
 * io_uring features (IORING_FEAT_*) the next engines' rings act as if the
 * kernel lacked: a test runs the paths of older kernels (IORING_FEAT_EXT_ARG,
 * before Linux 5.11). 0 (the default) masks none.
 */
void rnbd_engine_set_features_mask(uint32_t features);

#endif
