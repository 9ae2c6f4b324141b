/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "util.h"

int rand_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = getrandom(p, len, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

uint32_t rand_below(uint32_t bound)
{
	uint32_t r, limit;

	if (bound <= 1)
		return 0;
	/* Reject the top partial range so the result is uniform. */
	limit = UINT32_MAX - UINT32_MAX % bound;
	do {
		if (rand_bytes(&r, sizeof(r)))
			r = (uint32_t)random();
	} while (r >= limit);
	return r % bound;
}

int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	unsigned long long v;
	char *end;

	/* strtoull would skip blanks and accept a sign: insist on a digit. */
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (end == s || *end)
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int parse_size(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	/* strtoull would skip blanks and accept a sign: insist on a digit. */
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (end == s)
		return -EINVAL;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': shift = 10; break;
	case 'm': case 'M': shift = 20; break;
	case 'g': case 'G': shift = 30; break;
	case 't': case 'T': shift = 40; break;
	default: return -EINVAL;
	}
	if (*end && end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B"))
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	v <<= shift;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

const char *file_type_name(mode_t mode)
{
	return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" :
	       S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device" :
	       S_ISSOCK(mode) ? "a socket" : S_ISLNK(mode) ? "a symbolic link" :
	       S_ISREG(mode) ? "a regular file" : "not a file";
}

int open_regular(const char *path, struct stat *st)
{
	char self[64];
	struct stat got;
	int look, fd, rc;

	look = open(path, O_PATH | O_CLOEXEC);
	if (look < 0)
		return -errno;
	if (fstat(look, st)) {
		rc = -errno;
		close(look);
		return rc;
	}
	if (!S_ISREG(st->st_mode)) {
		close(look);
		return S_ISDIR(st->st_mode) ? -EISDIR : -EINVAL;
	}
	snprintf(self, sizeof(self), "/proc/self/fd/%d", look);
	fd = open(self, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0 && errno == ENOENT)
		/* No /proc: by name, without blocking; the check below still holds. */
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	rc = fd < 0 ? -errno : 0;
	close(look);
	if (rc)
		return rc;
	/* The file looked at is the file opened, whatever was renamed meanwhile. */
	if (fstat(fd, &got) || got.st_dev != st->st_dev || got.st_ino != st->st_ino ||
	    !S_ISREG(got.st_mode)) {
		close(fd);
		return -ESTALE;
	}
	*st = got;
	return fd;
}
