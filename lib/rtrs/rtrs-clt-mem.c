/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: registered memory for writes (rtrs_clt_mem_register). The
 * session keeps the regions; each path registers all of them on its own
 * fabric when it connects (a path's fabric is its device's, and is opened
 * again at each reconnect) and when a region is added while it is up. A
 * write whose vectors all lie in regions takes their descriptors instead
 * of registering its own (req_map in rtrs-clt-io.c).
 */
#include <errno.h>
#include <string.h>

#include "rtrs-clt-pri.h"

static struct clt_path *sess_path(struct rtrs_clt_sess *s, size_t i)
{
	return &s->paths[i];
}

/*
 * Every slot of the session's path array, not just the published ones
 * (paths_num): a path being added registers the regions when its fabric is
 * up (clt_path_mem_setup, mem_ready), before rtrs_clt_add_path publishes
 * it, and a region added or removed meanwhile must reach it too. A slot
 * that holds no path has mem_ready false and no registrations; slots are
 * cleared only under mem_lock (rtrs_clt_add_path).
 */
#define for_each_slot(s, i) for (size_t i = 0; (s)->paths && i < RTRS_MAX_PATHS; i++)

/* With mem_lock held for writing. */
static void path_mem_dereg(struct clt_path *p)
{
	for (unsigned i = 0; i < RTRS_CLT_MEM_MAX; i++)
		fab_mr_dereg(&p->mem_mrs[i]);
	p->mem_ready = false;
}

/* Registers every region on p's fabric; with mem_lock held for writing. */
static int path_mem_reg(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;

	for (unsigned i = 0; i < RTRS_CLT_MEM_MAX; i++) {
		int rc;

		if (!s->mem[i].len || p->mem_mrs[i].ops)
			continue;
		rc = fab_mr_reg(p->fab, s->mem[i].buf, s->mem[i].len, FAB_MR_LOCAL,
				&p->mem_mrs[i]);
		if (rc) {
			log_err("%s: registering %zu bytes of memory failed: %s", p->name,
				s->mem[i].len, strerror(-rc));
			return rc;
		}
	}
	return 0;
}

/* The path's fabric is up (connect): the regions are registered on it. */
int clt_path_mem_setup(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	int rc;

	pthread_rwlock_wrlock(&s->mem_lock);
	rc = path_mem_reg(p);
	if (rc)
		path_mem_dereg(p);
	else
		p->mem_ready = true;
	pthread_rwlock_unlock(&s->mem_lock);
	return rc;
}

/* Before the path's fabric closes. */
void clt_path_mem_release(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;

	pthread_rwlock_wrlock(&s->mem_lock);
	path_mem_dereg(p);
	pthread_rwlock_unlock(&s->mem_lock);
}

RTRS_EXPORT
int rtrs_clt_mem_register(struct rtrs_clt_sess *s, void *buf, size_t len)
{
	const char *b = buf;
	unsigned slot = RTRS_CLT_MEM_MAX;
	int rc = 0;

	if (!s || !buf || !len)
		return -EINVAL;
	pthread_rwlock_wrlock(&s->mem_lock);
	for (unsigned i = 0; i < RTRS_CLT_MEM_MAX; i++) {
		if (!s->mem[i].len) {
			slot = MIN(slot, i);
			continue;
		}
		if (b < s->mem[i].buf + s->mem[i].len && s->mem[i].buf < b + len) {
			rc = -EEXIST;
			goto out;
		}
	}
	if (slot == RTRS_CLT_MEM_MAX) {
		rc = -ENOSPC;
		goto out;
	}
	s->mem[slot].buf = buf;
	s->mem[slot].len = len;
	for_each_slot(s, i) {
		struct clt_path *p = sess_path(s, i);

		if (!rc && p->mem_ready)
			rc = fab_mr_reg(p->fab, buf, len, FAB_MR_LOCAL, &p->mem_mrs[slot]);
	}
	if (rc) {
		log_err("%s: registering %zu bytes of memory failed: %s", s->name, len,
			strerror(-rc));
		for_each_slot(s, i)
			fab_mr_dereg(&sess_path(s, i)->mem_mrs[slot]);
		s->mem[slot].len = 0;
		goto out;
	}
	atomic_fetch_add(&s->nr_mem, 1);
out:
	pthread_rwlock_unlock(&s->mem_lock);
	return rc;
}

RTRS_EXPORT
int rtrs_clt_mem_unregister(struct rtrs_clt_sess *s, void *buf)
{
	int rc = -ENOENT;

	if (!s || !buf)
		return -EINVAL;
	pthread_rwlock_wrlock(&s->mem_lock);
	for (unsigned i = 0; i < RTRS_CLT_MEM_MAX; i++) {
		if (!s->mem[i].len || s->mem[i].buf != buf)
			continue;
		for_each_slot(s, j)
			fab_mr_dereg(&sess_path(s, j)->mem_mrs[i]);
		s->mem[i].len = 0;
		atomic_fetch_sub(&s->nr_mem, 1);
		rc = 0;
		break;
	}
	pthread_rwlock_unlock(&s->mem_lock);
	return rc;
}

/*
 * A write from registered memory: req->mrs get the regions' descriptors,
 * as copies that own nothing (clt_req_release_mrs leaves them be). false
 * when some vector lies outside every region, or p has no registrations.
 */
bool clt_req_map_mem(struct clt_req *req, struct clt_path *p)
{
	struct rtrs_clt_sess *s = req->sess;
	bool all = true;

	pthread_rwlock_rdlock(&s->mem_lock);
	if (!p->mem_ready)
		all = false;
	for (size_t v = 0; all && v < req->data_cnt; v++) {
		const char *b = req->data[v].iov_base;
		size_t len = req->data[v].iov_len;
		unsigned i;

		for (i = 0; i < RTRS_CLT_MEM_MAX; i++)
			/* Its start inside the region (not past its end), then its length. */
			if (s->mem[i].len && b >= s->mem[i].buf &&
			    (size_t)(b - s->mem[i].buf) < s->mem[i].len &&
			    len <= s->mem[i].len - (size_t)(b - s->mem[i].buf))
				break;
		if (i == RTRS_CLT_MEM_MAX)
			all = false;
		else
			req->mrs[v] = (struct fab_mr){ .buf = (void *)b, .len = len,
						       .desc = p->mem_mrs[i].desc };
	}
	pthread_rwlock_unlock(&s->mem_lock);
	if (all)
		req->nr_mrs = (unsigned)req->data_cnt;
	return all;
}
