/* SPDX-License-Identifier: MIT */
/*
 * A program built against an installed librnbd (its header and pkg-config
 * file only: tests/interop/install.sh, tests/interop/deb.sh): maps device
 * argv[2] of the rnbd-server at argv[1] (HOST:PORT), writes 1 MiB of a
 * pattern at offset 64 KiB, reads it back and compares; with argv[3], a
 * file, also checks that the server's backing file holds the pattern there
 * (the server and this program on one machine). Exits 0 when every byte is
 * where it belongs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rnbd.h>

#define OFF (64u << 10)
#define LEN (1u << 20)

static int backing_holds(const char *path, const unsigned char *want)
{
	static unsigned char got[LEN];
	FILE *f = fopen(path, "rb");
	int same;

	if (!f) {
		fprintf(stderr, "installed-rnbd: %s: %s\n", path, strerror(errno));
		return 0;
	}
	same = !fseek(f, OFF, SEEK_SET) && fread(got, 1, LEN, f) == LEN && !memcmp(got, want, LEN);
	fclose(f);
	if (!same)
		fprintf(stderr, "installed-rnbd: %s does not hold the bytes written\n", path);
	return same;
}

int main(int argc, char **argv)
{
	static unsigned char out[LEN], in[LEN];
	struct rtrs_path_addr path = { .dst = argc > 1 ? argv[1] : "" };
	struct rnbd_clt_dev_info info = { .size = sizeof(info) };
	struct rnbd_clt_sess *s;
	struct rnbd_clt_dev *d;
	struct rtrs_clt_opts o;
	int rc;

	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: installed-rnbd HOST:PORT DEVICE [BACKING_FILE]\n");
		return 2;
	}
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "installed-rnbd";
	o.paths = &path;
	o.paths_num = 1;
	rc = rnbd_clt_sess_open(&o, &s);
	if (rc) {
		fprintf(stderr, "installed-rnbd: session to %s: %s\n", argv[1], strerror(-rc));
		return 1;
	}
	rc = rnbd_clt_map(s, argv[2], RNBD_CLT_RW, &d);
	if (rc) {
		fprintf(stderr, "installed-rnbd: map %s: %s\n", argv[2], strerror(-rc));
		rnbd_clt_sess_close(s);
		return 1;
	}
	rc = rnbd_clt_dev_info(d, &info);
	if (!rc && info.bytes < OFF + LEN)
		rc = -ENOSPC;
	for (size_t i = 0; i < LEN; i++)
		out[i] = (unsigned char)(i * 13 + (i >> 12) + 1);
	if (!rc)
		rc = rnbd_clt_io(d, RNBD_CLT_WRITE, RNBD_CLT_F_FUA, OFF, out, LEN);
	if (!rc)
		rc = rnbd_clt_io(d, RNBD_CLT_READ, 0, OFF, in, LEN);
	if (rnbd_clt_unmap(d, false) && !rc)
		rc = -EBUSY;
	rnbd_clt_sess_close(s);
	if (rc) {
		fprintf(stderr, "installed-rnbd: %s: %s\n", argv[2], strerror(-rc));
		return 1;
	}
	if (memcmp(in, out, LEN)) {
		fprintf(stderr, "installed-rnbd: the bytes read back differ\n");
		return 1;
	}
	if (argc == 4 && !backing_holds(argv[3], out))
		return 1;
	printf("installed-rnbd: %u bytes written to %s, read back and found in place\n", LEN, argv[2]);
	return 0;
}
