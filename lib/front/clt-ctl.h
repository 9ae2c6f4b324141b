/* SPDX-License-Identifier: MIT */
/*
 * The management methods of a client process (nbdkit with the rnbd plugin,
 * the client daemon): its RNBD sessions, their RTRS paths, the devices
 * mapped through them, over JSON-RPC (lib/rpc; docs/management.md lists
 * the methods). The program registers its sessions here and says how to
 * list its devices; the methods run on the rpc server's thread.
 *
 * Sessions are added and removed by the program only where no method can
 * run at the same time (before the rpc server starts, after it stops, or
 * from a method on its thread): a method looks a session up under the
 * lock and then uses it unlocked, through calls that may block (adding a
 * path connects it).
 */
#ifndef RTRS_FRONT_CLT_CTL_H
#define RTRS_FRONT_CLT_CTL_H

#include <pthread.h>

#include "rnbd.h"
#include "rpc.h"

#define CLT_CTL_SESS_MAX 64

struct clt_ctl {
	pthread_mutex_t lock;
	struct {
		char name[256];
		struct rnbd_clt_sess *sess;
	} sess[CLT_CTL_SESS_MAX];
	unsigned nr_sess;
	/*
	 * The program's devices, for client.devices: appends an object per
	 * device to arr ("session", "device" and what else it knows); 0 or a
	 * negative errno.
	 */
	int (*devices)(void *priv, struct json_object *arr);
	void *priv;
};

void clt_ctl_init(struct clt_ctl *c, int (*devices)(void *priv, struct json_object *arr),
		  void *priv);
/* -EEXIST: a session of that name is registered; -ENOSPC: past CLT_CTL_SESS_MAX. */
int clt_ctl_add(struct clt_ctl *c, const char *name, struct rnbd_clt_sess *sess);
void clt_ctl_del(struct clt_ctl *c, struct rnbd_clt_sess *sess);
/* The session registered as name, or NULL. */
struct rnbd_clt_sess *clt_ctl_find(struct clt_ctl *c, const char *name);

/* The client.* methods; their priv is the struct clt_ctl. */
extern const struct rpc_method clt_ctl_methods[];
extern const size_t clt_ctl_nr_methods;

/* Every counter in Prometheus's text format (metrics_fn: priv is the clt_ctl). */
char *clt_ctl_metrics(void *priv);

/* The name of a multipath policy, or NULL; and back (-1: unknown). */
const char *clt_ctl_policy_name(unsigned policy);
int clt_ctl_policy_of(const char *name);

#endif
