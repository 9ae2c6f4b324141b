// SPDX-License-Identifier: MIT
/*
 * The tcp fabric's memory keys under churn: its table (lock stripes, a
 * table that doubles while other threads use it) over loopback, in ROUNDS
 * rounds on fresh fabrics, so that each starts at its smallest table.
 *
 *   - CHURNERS threads register regions on the server's fabric, up to
 *     WINDOW each, then deregister them all in a shuffled order, and again,
 *     for RUN_MS; 32-bit and 64-bit keys alternate, so the table doubles
 *     many times while the others register, deregister and look keys up;
 *   - meanwhile a client connection writes 64-byte pieces with an
 *     immediate into a region the server keeps registered all along: every
 *     write is a look-up of its key in that table by the server's group.
 *
 * Then REVOKES times, a region is deregistered while a stream of 256 KiB
 * writes into it arrives (revoke_under_write).
 *
 * Asserted: no key is handed out while a region still holds it (every
 * live key is kept in a set of the test's own, and a registration that
 * returns one already in it is a failure); every 32-bit key is below 2^32
 * and not 0, every 64-bit key is 2^32 or more; every write arrives, in order, with its bytes in place
 * when its immediate comes; the connection stays up; the churn made
 * at least MIN_REGS registrations.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "rtrs-fabric.h"
#include "util.h"

#define CHURNERS 2
#define WINDOW 3000
#define RUN_MS 2000
#define ROUNDS 10
#define REVOKES 5
#define VICTIM (4u << 20)
#define STREAM_PIECE (256u << 10)
#define MIN_REGS 20000
#define PIECE 64
#define SLOTS 256
#define SET_BITS 16

static struct fab *sfab, *cfab;
static struct fab_lst *lst;
static struct fab_con *ccon, *scon;
static atomic_bool c_up, s_up, c_down, s_down, stop, lst_stop;
static char target[SLOTS * PIECE];
static struct fab_mr target_mr;
static atomic_uint_fast64_t got, bad, regs, dups, bad_keys, churn_errs;
static uint64_t writes;
static atomic_int s_err;
static uint32_t next_imm = 1;  /* the server's group: the next immediate expected */

/* Live keys: open addressing, linear probing, deletion by backward shift. */
static pthread_mutex_t set_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t set[1u << SET_BITS];

static size_t set_slot(uint64_t key)
{
	return (size_t)((key * 0x9e3779b97f4a7c15ull) >> (64 - SET_BITS));
}

/* False when key was there already. */
static bool set_add(uint64_t key)
{
	size_t i = set_slot(key);

	for (; set[i]; i = (i + 1) & ((1u << SET_BITS) - 1))
		if (set[i] == key)
			return false;
	set[i] = key;
	return true;
}

static void set_del(uint64_t key)
{
	size_t mask = (1u << SET_BITS) - 1, i = set_slot(key), j;

	while (set[i] && set[i] != key)
		i = (i + 1) & mask;
	if (!set[i])
		return;
	set[i] = 0;
	for (j = (i + 1) & mask; set[j]; j = (j + 1) & mask) {
		size_t h = set_slot(set[j]);

		/* Moves set[j] into the hole unless its home lies cyclically in (i, j]. */
		if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
			set[i] = set[j];
			set[j] = 0;
			i = j;
		}
	}
}

static void fill(char *buf, uint32_t seq)
{
	for (unsigned i = 0; i < PIECE; i++)
		buf[i] = (char)(seq * 13 + i);
}

static void on_connected(void *priv, const void *data, size_t len)
{
	(void)data;
	(void)len;
	atomic_store(priv == &scon ? &s_up : &c_up, true);
}

static void on_down(void *priv, int err, const void *data, size_t len)
{
	(void)data;
	(void)len;
	if (priv == &scon)
		atomic_store(&s_err, err);
	atomic_store(priv == &scon ? &s_down : &c_down, true);
}

/* The server's group: the piece of write imm is in place now. */
static void on_imm(void *priv, uint32_t imm)
{
	char want[PIECE];

	(void)priv;
	fill(want, imm);
	if (imm != next_imm || memcmp(target + (imm % SLOTS) * PIECE, want, PIECE))
		atomic_fetch_add(&bad, 1);
	next_imm = imm + 1;
	atomic_fetch_add(&got, 1);
}

static void on_recv(void *priv, void *buf, size_t len)
{
	(void)priv;
	(void)buf;
	(void)len;
	atomic_fetch_add(&bad, 1);
}

static void on_done(void *priv, void *ctx)
{
	(void)priv;
	(void)ctx;
}

static void on_kick(void *priv)
{
	(void)priv;
}

static const struct fab_con_ops ops = {
	.connected = on_connected, .down = on_down, .imm = on_imm, .recv = on_recv,
	.done = on_done, .kick = on_kick,
};

static void on_req(void *priv, struct fab_connreq *req, const void *data, size_t len)
{
	struct fab_con_cfg cfg = {
		.ops = &ops, .priv = &scon, .name = "keys-srv", .tx_depth = 64, .rx_depth = 16,
		.rx_size = 64,
	};

	(void)priv;
	(void)data;
	(void)len;
	if (scon) {
		fab_reject(lst, req, NULL, 0);
		return;
	}
	CHECK_EQ(fab_con_accept(sfab, req, &cfg, NULL, 0, &scon), 0);
	atomic_store(&s_up, true);
}

static void *lst_thread(void *arg)
{
	struct pollfd pfd = { .fd = fab_lst_fd(lst), .events = POLLIN };

	(void)arg;
	while (!atomic_load(&lst_stop)) {
		if (poll(&pfd, 1, 20) > 0)
			fab_lst_process(lst, on_req, NULL);
	}
	return NULL;
}

static void *churn_thread(void *arg)
{
	static char buf[4096];
	struct fab_mr *mrs = calloc(WINDOW, sizeof(*mrs));
	unsigned seed = (unsigned)(uintptr_t)arg, round = 0;

	if (!mrs) {
		atomic_fetch_add(&churn_errs, 1);
		return NULL;
	}
	while (!atomic_load(&stop)) {
		unsigned n = 0;
		unsigned access = FAB_MR_REMOTE_WRITE | (round++ % 2 ? FAB_MR_KEY64 : 0);

		for (; n < WINDOW && !atomic_load(&stop); n++) {
			int rc = fab_mr_reg(sfab, buf, sizeof(buf), access, &mrs[n]);

			if (rc) {
				atomic_fetch_add(&churn_errs, 1);
				break;
			}
			atomic_fetch_add(&regs, 1);
			if (access & FAB_MR_KEY64 ? mrs[n].key < (1ull << 32) :
						    !mrs[n].key || mrs[n].key > 0xffffffffu)
				atomic_fetch_add(&bad_keys, 1);
			pthread_mutex_lock(&set_lock);
			if (!set_add(mrs[n].key))
				atomic_fetch_add(&dups, 1);
			pthread_mutex_unlock(&set_lock);
		}
		/* Out in a shuffled order: chains lose entries in the middle. */
		for (unsigned i = n; i > 1; i--) {
			unsigned j = (unsigned)rand_r(&seed) % i;
			struct fab_mr t = mrs[i - 1];

			mrs[i - 1] = mrs[j];
			mrs[j] = t;
		}
		for (unsigned i = 0; i < n; i++) {
			pthread_mutex_lock(&set_lock);
			set_del(mrs[i].key);
			pthread_mutex_unlock(&set_lock);
			fab_mr_dereg(&mrs[i]);
		}
	}
	free(mrs);
	return NULL;
}


static pthread_t lt;

static bool wait_flag(atomic_bool *b, unsigned ms)
{
	for (unsigned i = 0; i < ms && !atomic_load(b); i++)
		usleep(1000);
	return atomic_load(b);
}

/* A step setup cannot go on without: the test ends here, failed, when it does not hold. */
static void need(bool ok, const char *what, unsigned r)
{
	CHECK(ok, "round %u: %s", r, what);
	if (!ok)
		exit(test_done("test-tcp-keys"));
}

/* Fresh fabrics, a listener and one connection, up. */
static void setup(unsigned r)
{
	struct fab_con_cfg cfg = {
		.ops = &ops, .priv = &ccon, .name = "keys-clt", .tx_depth = 64, .rx_depth = 16,
		.rx_size = 64,
	};
	char port[16];

	scon = ccon = NULL;
	atomic_store(&c_up, false);
	atomic_store(&s_up, false);
	atomic_store(&c_down, false);
	atomic_store(&s_down, false);
	atomic_store(&stop, false);
	atomic_store(&lst_stop, false);
	atomic_store(&got, 0);
	atomic_store(&s_err, 0);
	next_imm = 1;
	need(!fab_open("tcp", NULL, "127.0.0.1", "0", true, 256, &sfab), "server fabric", r);
	need(!fab_listen(sfab, &lst), "listener", r);
	snprintf(port, sizeof(port), "%d", fab_lst_port(lst));
	need(!fab_open("tcp", NULL, "127.0.0.1", port, false, 256, &cfab), "client fabric", r);
	need(!fab_mr_reg(sfab, target, sizeof(target), FAB_MR_REMOTE_WRITE, &target_mr),
	     "target region", r);
	need(!pthread_create(&lt, NULL, lst_thread, NULL), "listener thread", r);
	need(!fab_con_connect(cfab, &cfg, "k", 1, &ccon), "connect", r);
	need(wait_flag(&c_up, 5000), "the client's connection is up", r);
	need(wait_flag(&s_up, 5000), "the server's connection is up", r);
}

static void teardown(void)
{
	fab_con_shutdown(ccon);
	fab_con_destroy(ccon);
	atomic_store(&lst_stop, true);
	pthread_join(lt, NULL);
	if (scon) {
		fab_con_shutdown(scon);
		fab_con_destroy(scon);
	}
	fab_mr_dereg(&target_mr);
	fab_lst_close(lst);
	fab_close(cfab);
	fab_close(sfab);
}

/* One round on fresh fabrics: the table starts at its smallest and doubles under use. */
static void round_run(unsigned r)
{
	pthread_t ct[CHURNERS];
	uint64_t t_end;
	uint32_t seq = 0;
	int rc;

	setup(r);
	for (uintptr_t i = 0; i < CHURNERS; i++)
		CHECK_EQ(pthread_create(&ct[i], NULL, churn_thread, (void *)(r * CHURNERS + i + 1)),
			 0);
	t_end = now_ns() + RUN_MS / ROUNDS * 1000000ull;
	while (now_ns() < t_end && !atomic_load(&c_down)) {
		char piece[PIECE];

		/* At most SLOTS / 2 writes ahead of the server: a slot is checked before it is reused. */
		if (seq - atomic_load(&got) >= SLOTS / 2) {
			sched_yield();
			continue;
		}
		fill(piece, seq + 1);
		rc = fab_write_imm_data(ccon, piece, PIECE, target_mr.base + ((seq + 1) % SLOTS) * PIECE,
					target_mr.key, seq + 1);
		if (rc == -EAGAIN) {
			sched_yield();
			continue;
		}
		if (rc) {
			CHECK_EQ(rc, 0);
			break;
		}
		seq++;
	}
	atomic_store(&stop, true);
	for (unsigned i = 0; i < CHURNERS; i++)
		pthread_join(ct[i], NULL);
	for (unsigned i = 0; i < 5000 && atomic_load(&got) < seq; i++)
		usleep(1000);
	writes += seq;
	CHECK(seq >= 100, "round %u: only %u writes went out", r, seq);
	CHECK(atomic_load(&got) == seq, "round %u: %llu of %u writes arrived", r,
	      (unsigned long long)atomic_load(&got), seq);
	CHECK(!atomic_load(&c_down) && !atomic_load(&s_down), "round %u: the connection stayed up",
	      r);
	teardown();
}

/*
 * The client's stream of large writes into the victim region, until the
 * connection ends: piece n from source n % 7 (each its own byte, 7 prime to
 * the region's 16 places), so every place keeps changing while it comes.
 */
static void *stream_thread(void *arg)
{
	const struct fab_mr *v = arg;
	static char src[7][STREAM_PIECE];
	void *desc = NULL;

	for (unsigned i = 0; i < 7; i++)
		memset(src[i], (int)(0xa1 + i), STREAM_PIECE);
	for (uint64_t n = 0; !atomic_load(&c_down) && !atomic_load(&stop); n++) {
		struct iovec iov = { src[n % 7], STREAM_PIECE };
		struct fab_rma rma = {
			.addr = v->base + (n % (VICTIM / STREAM_PIECE)) * STREAM_PIECE,
			.key = v->key, .len = STREAM_PIECE,
		};
		int rc = fab_write(ccon, &iov, &desc, 1, &rma, 1, false, 0, NULL);

		if (rc == -EAGAIN) {
			sched_yield();
			n--;
		} else if (rc) {
			break;
		}
	}
	return NULL;
}

/*
 * A region deregistered while a stream of large writes into it arrives:
 * once fab_mr_dereg returns, not one more byte lands in it (a copy taken
 * then still matches it later), and the connection that wrote into it ends
 * with -EACCES (caught half way through a payload) or -EPROTO (its next
 * frame named a key no longer registered).
 */
static void revoke_under_write(unsigned r)
{
	struct fab_mr victim;
	pthread_t st;
	char *buf = malloc(VICTIM), *snap = malloc(VICTIM);
	size_t dirty = 0;

	need(buf && snap, "victim buffers", r);
	setup(r);
	memset(buf, 0, VICTIM);
	need(!fab_mr_reg(sfab, buf, VICTIM, FAB_MR_REMOTE_WRITE, &victim), "victim region", r);
	CHECK_EQ(pthread_create(&st, NULL, stream_thread, &victim), 0);
	usleep(20000 + (r % 7) * 3000); /* writes are arriving by now */
	fab_mr_dereg(&victim);
	memcpy(snap, buf, VICTIM); /* what it holds when the deregistration returned */
	CHECK(wait_flag(&s_down, 5000), "round %u: the writing connection ended", r);
	usleep(50000);
	for (size_t i = 0; i < VICTIM; i++)
		dirty += buf[i] != snap[i];
	CHECK(dirty == 0, "round %u: %zu bytes landed after the deregistration", r, dirty);
	CHECK(atomic_load(&s_err) == -EACCES || atomic_load(&s_err) == -EPROTO,
	      "round %u: the connection ended with %d", r, atomic_load(&s_err));
	atomic_store(&stop, true);
	pthread_join(st, NULL);
	teardown();
	free(buf);
	free(snap);
}

int main(void)
{
	for (unsigned r = 0; r < ROUNDS; r++)
		round_run(r);
	for (unsigned r = 0; r < REVOKES; r++)
		revoke_under_write(r);
	printf("test-tcp-keys: %llu registrations by %u threads (windows of %u) in %u rounds "
	       "beside %llu writes into a region kept registered: %llu wrong, %llu keys handed "
	       "out twice\n",
	       (unsigned long long)atomic_load(&regs), CHURNERS, WINDOW, ROUNDS,
	       (unsigned long long)writes, (unsigned long long)atomic_load(&bad),
	       (unsigned long long)atomic_load(&dups));
	CHECK_EQ(atomic_load(&dups), 0);
	CHECK_EQ(atomic_load(&bad_keys), 0);
	CHECK_EQ(atomic_load(&churn_errs), 0);
	CHECK_EQ(atomic_load(&bad), 0);
	CHECK(atomic_load(&regs) >= MIN_REGS, "only %llu registrations",
	      (unsigned long long)atomic_load(&regs));
	return test_done("test-tcp-keys");
}
