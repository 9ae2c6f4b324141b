/* SPDX-License-Identifier: MIT */
/*
 * The management methods of a client process (nbdkit with the rnbd plugin,
 * the client daemon): its RNBD sessions, their RTRS paths, the devices
 * mapped through them, over JSON-RPC (lib/rpc; docs/management.md lists
 * the methods). The program registers its sessions here and says how to
 * list its devices. The methods may run on several threads at once (an
 * rpc server with RPC_SERVER_THREADED).
 *
 * A method holds the session it uses (clt_ctl_get) while it uses it,
 * unlocked, through calls that may block (adding a path connects it);
 * clt_ctl_del makes the session unfindable and waits until nobody holds
 * it, so that the program may close it afterwards.
 */
#ifndef RTRS_FRONT_CLT_CTL_H
#define RTRS_FRONT_CLT_CTL_H

#include <pthread.h>

#include "rnbd.h"
#include "rpc.h"

#define CLT_CTL_SESS_MAX 64

struct clt_ctl {
	pthread_mutex_t lock;
	pthread_cond_t cond;      /* a held session let go */
	/* Reading, changing and writing back a session's settings (client.reconnect), one at a time. */
	pthread_mutex_t tune_lock;
	struct {
		char name[256];
		struct rnbd_clt_sess *sess;
		unsigned refs;    /* methods using it */
		unsigned adding;  /* client.path.add calls connecting a path */
		bool leaving;     /* clt_ctl_del waits for refs to drop */
	} sess[CLT_CTL_SESS_MAX];
	unsigned nr_sess;
	/*
	 * The paths (not removed) a session may have: client.path.add past it
	 * fails with -E2BIG. 0: librtrs's limit. A program that opens sessions
	 * from a list of paths sets its list's limit, so that a session it
	 * writes down (rnbd-clientd's client.save) can be opened again.
	 */
	unsigned max_paths;
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
/* Unregisters sess once no method holds it (it waits for them). */
void clt_ctl_del(struct clt_ctl *c, struct rnbd_clt_sess *sess);
/* The session registered as name, held until clt_ctl_put; or NULL. */
struct rnbd_clt_sess *clt_ctl_get(struct clt_ctl *c, const char *name);
void clt_ctl_put(struct clt_ctl *c, struct rnbd_clt_sess *sess);

/* The client.* methods; their priv is the struct clt_ctl. */
extern const struct rpc_method clt_ctl_methods[];
extern const size_t clt_ctl_nr_methods;

/* Every counter in Prometheus's text format (metrics_fn: priv is the clt_ctl). */
char *clt_ctl_metrics(void *priv);

/* The name of a multipath policy, or NULL; and back (-1: unknown). */
const char *clt_ctl_policy_name(unsigned policy);
int clt_ctl_policy_of(const char *name);

#endif
