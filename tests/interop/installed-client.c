/* SPDX-License-Identifier: MIT */
/*
 * A program built against an installed librtrs (its header and pkg-config
 * file only, tests/interop/install.sh): opens a session to an
 * rtrs-test-server at argv[1], writes 64 KiB, reads them back and compares.
 * Exits 0 when every byte came back.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rtrs.h>

#include "test-proto-hdr.h"

#define LEN 65536

struct done {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int err;
	int finished;
};

static void conf(void *priv, int err)
{
	struct done *d = priv;

	pthread_mutex_lock(&d->lock);
	d->err = err;
	d->finished = 1;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

static int io(struct rtrs_clt_sess *s, enum rtrs_dir dir, void *buf)
{
	struct done d = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	struct test_hdr h = { .magic = TEST_MAGIC, .op = TEST_OP_IO, .offset = 4096, .len = LEN };
	struct rtrs_clt_req_ops ops = { .priv = &d, .conf = conf };
	struct iovec usr = { &h, sizeof(h) }, data = { buf, LEN };
	struct rtrs_permit *p = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	int rc;

	if (!p)
		return -ECONNABORTED;
	rc = rtrs_clt_request(s, dir, &ops, p, &usr, 1, &data, 1);
	if (!rc) {
		pthread_mutex_lock(&d.lock);
		while (!d.finished)
			pthread_cond_wait(&d.cond, &d.lock);
		pthread_mutex_unlock(&d.lock);
		rc = d.err;
	}
	rtrs_clt_put_permit(s, p);
	return rc;
}

int main(int argc, char **argv)
{
	static unsigned char out[LEN], in[LEN];
	struct rtrs_path_addr path = { .dst = argc > 1 ? argv[1] : "" };
	struct rtrs_clt_sess *s;
	struct rtrs_clt_opts o;
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: installed-client HOST:PORT\n");
		return 2;
	}
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "installed-client";
	o.paths = &path;
	o.paths_num = 1;
	rc = rtrs_clt_open(&o, &s);
	if (rc) {
		fprintf(stderr, "installed-client: open %s: %s\n", argv[1], strerror(-rc));
		return 1;
	}
	for (size_t i = 0; i < LEN; i++)
		out[i] = (unsigned char)(i * 7 + 3);
	rc = io(s, RTRS_WRITE, out);
	if (!rc)
		rc = io(s, RTRS_READ, in);
	rtrs_clt_close(s);
	if (rc) {
		fprintf(stderr, "installed-client: IO: %s\n", strerror(-rc));
		return 1;
	}
	if (memcmp(in, out, LEN)) {
		fprintf(stderr, "installed-client: the bytes read back differ\n");
		return 1;
	}
	printf("installed-client: %d bytes written and read back\n", LEN);
	return 0;
}
