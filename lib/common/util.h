/* SPDX-License-Identifier: MIT */
/*
 * Small helpers shared by every library: little-endian wire types, checked
 * arithmetic, monotonic time, scope cleanup.
 */
#ifndef RTRS_COMMON_UTIL_H
#define RTRS_COMMON_UTIL_H

#include <endian.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <pthread.h>
#include <sys/stat.h>

#include "export.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#endif

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/*
 * Wire integers are wrapped in one-member structs so that a missed byte-order
 * conversion is a compile error rather than a silent bug on big-endian hosts.
 */
struct le16 { uint16_t raw; };
struct le32 { uint32_t raw; };
struct le64 { uint64_t raw; };

static inline uint16_t le16_get(struct le16 v) { return le16toh(v.raw); }
static inline uint32_t le32_get(struct le32 v) { return le32toh(v.raw); }
static inline uint64_t le64_get(struct le64 v) { return le64toh(v.raw); }
static inline struct le16 le16_put(uint16_t v) { return (struct le16){ htole16(v) }; }
static inline struct le32 le32_put(uint32_t v) { return (struct le32){ htole32(v) }; }
static inline struct le64 le64_put(uint64_t v) { return (struct le64){ htole64(v) }; }

/* Checked arithmetic: true on overflow. */
#define add_overflow(a, b, r) __builtin_add_overflow((a), (b), (r))
#define mul_overflow(a, b, r) __builtin_mul_overflow((a), (b), (r))

/*
 * In a decoder or parser with a `const char **why` parameter: says why (if
 * asked) and returns err.
 */
#define REJECT(err, reason)          \
	do {                         \
		if (why)             \
			*why = (reason); \
		return (err);        \
	} while (0)

static inline bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* Number of bits needed to represent values 0..v (at least 1). */
static inline unsigned bits_for(uint64_t v)
{
	return v ? 64 - (unsigned)__builtin_clzll(v) : 1;
}

/*
 * Orderings that pass through the network or a device (a completion comes
 * after its post) are invisible to ThreadSanitizer: the post releases and
 * the completion acquires the same object.
 */
#if defined(__SANITIZE_THREAD__)
#define RTRS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RTRS_TSAN 1
#endif
#endif
#ifdef RTRS_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define tsan_release(p) __tsan_release(p)
#define tsan_acquire(p) __tsan_acquire(p)
#else
#define tsan_release(p) ((void)(p))
#define tsan_acquire(p) ((void)(p))
#endif

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t now_ms(void) { return now_ns() / 1000000ull; }

/* Absolute CLOCK_MONOTONIC deadline for pthread_cond_timedwait. */
static inline struct timespec deadline_ms(unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

/* A condition variable that waits on CLOCK_MONOTONIC. */
static inline void cond_init_mono(pthread_cond_t *c)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
}

static inline void cleanup_free(void *p) { free(*(void **)p); }
#define CLEANUP_FREE __attribute__((cleanup(cleanup_free)))

static inline void cleanup_unlock(pthread_mutex_t **m)
{
	if (*m)
		pthread_mutex_unlock(*m);
}
#define LOCK_SCOPE_1(m, n) \
	pthread_mutex_t *n __attribute__((cleanup(cleanup_unlock), unused)) = (m); \
	pthread_mutex_lock(n)
#define LOCK_SCOPE_0(m, c) LOCK_SCOPE_1(m, scope_lock_##c)
#define LOCK_SCOPE(m) LOCK_SCOPE_0(m, __COUNTER__)

/*
 * Runs fn(arg) on up to n threads at once and joins them (fn on the
 * caller's thread when none could start); how many ran on threads.
 */
static inline unsigned threads_run(unsigned n, void *(*fn)(void *), void *arg)
{
	pthread_t *t = calloc(n ? n : 1, sizeof(*t));
	unsigned started = 0;

	for (; t && started < n; started++)
		if (pthread_create(&t[started], NULL, fn, arg))
			break;
	for (unsigned i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	free(t);
	if (!started)
		fn(arg);
	return started;
}

/* Exported from librtrs.so for librnbd and the programs (export.h). */

/* Fill buf with random bytes from the kernel; 0 or -errno. */
COMMON_EXPORT_VIS int rand_bytes(void *buf, size_t len) COMMON_LINK_NAME(rand_bytes);
/* Uniform random number in [0, bound). */
COMMON_EXPORT_VIS uint32_t rand_below(uint32_t bound) COMMON_LINK_NAME(rand_below);

/* Parse an unsigned decimal with range check; 0 or -EINVAL/-ERANGE. */
COMMON_EXPORT_VIS int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
	COMMON_LINK_NAME(parse_u64);
/* Parse a size with optional K/M/G/T suffix (powers of 1024; KiB or KB alike). */
COMMON_EXPORT_VIS int parse_size(const char *s, uint64_t min, uint64_t max, uint64_t *out)
	COMMON_LINK_NAME(parse_size);
/*
 * Opens path for reading if it is a regular file, and only then: the name
 * is looked up first (O_PATH, which runs no driver's open), its type
 * checked, and that very file opened through /proc/self/fd, so that a
 * config or key file named by mistake as a FIFO, a terminal, a tape or a
 * watchdog is refused before anything opens it. The descriptor (O_CLOEXEC)
 * or -errno: -EISDIR for a directory, -EINVAL for another type (*st says
 * which), else the lookup's or the open's error. *st is the file's.
 */
COMMON_EXPORT_VIS int open_regular(const char *path, struct stat *st)
	COMMON_LINK_NAME(open_regular);
/* "a FIFO", "a character device" ...: what a mode that is not a regular file is. */
COMMON_EXPORT_VIS const char *file_type_name(mode_t mode) COMMON_LINK_NAME(file_type_name);

#endif
