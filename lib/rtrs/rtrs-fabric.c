/* SPDX-License-Identifier: MIT */
/*
 * Which implementation of the fabric layer fab_open() uses: one registered
 * under the provider's name (fab_register), else rdma-core for RDMA
 * devices ("verbs", "rdma") and the native TCP fabric for "tcp" (the
 * default); any other name is refused. Only the unit tests register one
 * (the fake fabric).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "rtrs-fabric.h"
#include "util.h"

static struct {
	pthread_mutex_t lock;      /* registration */
	const struct fab_ops *ops[4];
	atomic_uint n;             /* published entries, read without the lock */
} reg = { .lock = PTHREAD_MUTEX_INITIALIZER };

int fab_register(const struct fab_ops *ops)
{
	bool known = false;
	unsigned n;
	int rc = 0;

	if (!ops || !ops->name || !ops->open)
		return -EINVAL;
	pthread_mutex_lock(&reg.lock);
	n = atomic_load(&reg.n);
	for (unsigned i = 0; i < n; i++) {
		if (!strcmp(reg.ops[i]->name, ops->name)) {
			known = true;
			rc = reg.ops[i] == ops ? 0 : -EEXIST; /* the same again is no error */
		}
	}
	if (!known && n == ARRAY_SIZE(reg.ops))
		rc = -ENOSPC;
	if (!known && !rc) {
		reg.ops[n] = ops;
		atomic_store(&reg.n, n + 1); /* release: the entry before the count */
	}
	pthread_mutex_unlock(&reg.lock);
	return rc;
}

bool fab_known(const char *prov)
{
	unsigned n = atomic_load(&reg.n);

	for (unsigned i = 0; prov && i < n; i++)
		if (!strcmp(reg.ops[i]->name, prov))
			return true;
	return fab_impl(prov) != NULL;
}

int fab_open(const char *prov, const char *src, const char *node, const char *service,
	     bool server, size_t queue, struct fab **out)
{
	unsigned n = atomic_load(&reg.n);

	for (unsigned i = 0; prov && i < n; i++)
		if (!strcmp(reg.ops[i]->name, prov))
			return reg.ops[i]->open(prov, src, node, service, server, queue, out);
	if (!fab_impl(prov)) {
		log_err("fabric: unknown provider %s (tcp, verbs or rdma)", prov);
		err_detail("unknown provider %s: the fabrics are tcp, and verbs or rdma for RDMA "
			   "devices", prov);
		return -EPROTONOSUPPORT;
	}
#ifdef RTRS_FAULT_INJECTION
	/* Test builds: the shipped fabric through the fault wrapper (rtrs-fabric-fault.c). */
	return fab_fault_ops.open(prov, src, node, service, server, queue, out);
#else
	return fab_impl(prov)->open(prov, src, node, service, server, queue, out);
#endif
}

const struct fab_ops *fab_impl(const char *prov)
{
	if (prov && (!strcmp(prov, "verbs") || !strcmp(prov, "rdma")))
		return &fab_rdma_ops;
	if (!prov || !strcmp(prov, "tcp"))
		return &fab_tcp_ops;
	return NULL;
}

/* A fabric without chains posts one operation through its single calls. */
static int post_one(struct fab_con *c, const struct fab_wr *w, void *ctx)
{
	const struct fab_ops *o = fab_ops_of(c);

	switch (w->kind) {
	case FAB_WR_WRITE:
		return o->write(c, w->iov, w->desc, w->iov_cnt, w->rma, w->rma_cnt, w->with_imm,
				w->imm, ctx);
	case FAB_WR_WRITE_IMM:
		return o->write_imm(c, w->buf, w->len, w->addr, w->key, w->imm, ctx);
	case FAB_WR_SEND_IMM:
		return fab_send_imm(c, w->buf, w->len, w->desc ? w->desc[0] : NULL, w->imm, ctx);
	case FAB_WR_SEND_INV:
		return fab_send_inv(c, w->rkey, ctx);
	}
	return -EINVAL;
}

int fab_post(struct fab_con *c, const struct fab_wr *wrs, size_t n, void *ctx)
{
	const struct fab_ops *o = fab_ops_of(c);

	if (o->post)
		return o->post(c, wrs, n, ctx);
	return n == 1 ? post_one(c, wrs, ctx) : -EOPNOTSUPP;
}

void fab_con_name_init(struct fab_con_name *n, const char *name)
{
	snprintf(n->made, sizeof(n->made), "%s", name);
	n->later[0] = 0;
	atomic_init(&n->renamed, false);
	atomic_init(&n->cur, n->made);
}

void fab_con_name_set(struct fab_con_name *n, const char *name)
{
	if (atomic_exchange(&n->renamed, true))
		return;
	snprintf(n->later, sizeof(n->later), "%s", name);
	atomic_store_explicit(&n->cur, n->later, memory_order_release);
}

void fab_done_init(struct fab_done *d)
{
	d->done = false;
	pthread_mutex_init(&d->lock, NULL);
	cond_init_mono(&d->cond);
}

void fab_done_signal(struct fab_done *d)
{
	pthread_mutex_lock(&d->lock);
	d->done = true;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

void fab_done_wait(struct fab_done *d)
{
	pthread_mutex_lock(&d->lock);
	while (!d->done)
		pthread_cond_wait(&d->cond, &d->lock);
	pthread_mutex_unlock(&d->lock);
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
}
