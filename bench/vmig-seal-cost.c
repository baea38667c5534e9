// SPDX-License-Identifier: Apache-2.0
/* What sealing the DPDK node hop's frames costs on this CPU, alone: xp_seal() and xp_open() in
 * place over GB of frames of one size, in CPU seconds per GB (the yardstick the DPDK hop's encrypted
 * path is measured against). Usage: vmig-seal-cost [FRAME_BYTES [GB [RUNS]]]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xp_seal.h"

static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	size_t frame = argc > 1 ? strtoul(argv[1], NULL, 0) : 8192;
	double gb = argc > 2 ? strtod(argv[2], NULL) : 2.0;
	int runs = argc > 3 ? atoi(argv[3]) : 5;
	uint8_t secret[XP_SEAL_SECRET] = { 1 }, hdr[40] = { 2 }, *buf;
	uint64_t frames = (uint64_t)(gb * 1e9 / frame), pn = 0;
	double seal[32], open_[32];
	enum { BATCH = 256 }; /* frames sealed, then opened, between two clock readings */
	static uint8_t tags[BATCH][XP_SEAL_TAG];

	if (!frame || frame > 65535 || runs < 1 || runs > 32 || gb <= 0) {
		fprintf(stderr,
			"usage: vmig-seal-cost [FRAME_BYTES (1-65535) [GB [RUNS (1-32)]]]\n");
		return 2;
	}
	frames = (frames + BATCH - 1) / BATCH * BATCH;
	buf = malloc(frame * BATCH);
	if (!buf)
		return 1;
	memset(buf, 0x5a, frame * BATCH);
	for (int r = 0; r < runs; r++) {
		struct xp_seal *tx, *rx;
		double t0;

		if (xp_seal_new(secret, false, 0, &tx) || xp_seal_new(secret, true, 0, &rx)) {
			fprintf(stderr, "vmig-seal-cost: xp_seal_new failed\n");
			return 1;
		}
		/* A batch is sealed in place, then opened, as frames go out and come back. */
		seal[r] = open_[r] = 0;
		pn = 0;
		for (uint64_t i = 0; i < frames; i += BATCH) {
			t0 = cpu_s();
			for (int k = 0; k < BATCH; k++)
				if (xp_seal(tx, pn + k, hdr, sizeof(hdr), buf + k * frame, frame,
					    tags[k]))
					return 1;
			seal[r] += cpu_s() - t0;
			t0 = cpu_s();
			for (int k = 0; k < BATCH; k++)
				if (xp_open(rx, pn + k, hdr, sizeof(hdr), buf + k * frame, frame,
					    tags[k])) {
					fprintf(stderr, "vmig-seal-cost: a frame did not open\n");
					return 1;
				}
			open_[r] += cpu_s() - t0;
			pn += BATCH;
		}
		xp_seal_free(tx);
		xp_seal_free(rx);
		seal[r] /= frames * frame / 1e9;
		open_[r] /= frames * frame / 1e9;
	}
	qsort(seal, runs, sizeof(double), cmp);
	qsort(open_, runs, sizeof(double), cmp);
	printf("{\"frame_bytes\": %zu, \"gb_per_run\": %.2f, \"runs\": %d, "
	       "\"seal_core_s_per_gb\": %.4f, \"open_core_s_per_gb\": %.4f, "
	       "\"seal_min\": %.4f, \"seal_max\": %.4f, \"open_min\": %.4f, \"open_max\": %.4f}\n",
	       frame, gb, runs, seal[runs / 2], open_[runs / 2], seal[0], seal[runs - 1], open_[0],
	       open_[runs - 1]);
	free(buf);
	return 0;
}
