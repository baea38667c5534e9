// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for xp_rel, the DPDK node hop's reliable stream: the input is parsed as a
 * frame (what parses re-encodes to the same bytes, and a stream that takes it stays within its
 * buffers), offered to xp_open() as a sealed frame (which must refuse it: nobody forges a tag),
 * then decides the fate of each frame of a transfer over the simulated link (dropped,
 * duplicated, delayed), which must still arrive whole and in order. */
#include <string.h>

#include "fuzz.h"
#include "rel_sim.h"
#include "util.h"
#include "xp_rel.h"
#include "xp_seal.h"

static void one_frame(const uint8_t *data, size_t size)
{
	struct xp_rel_cfg cfg = { .stream = 1, .mss = 1024, .sndbuf = 4096, .rcvbuf = 4096 };
	uint8_t *copy = malloc(size ? size : 1), out[XP_REL_MAX_HDR + 1024];
	struct xp_rel_hdr h, back;
	struct xp_rel_stats st;
	struct xp_rel *r;
	const char *why;
	size_t n;

	FUZZ_CHECK(copy != NULL);
	memcpy(copy, data, size);
	if (xp_rel_parse(copy, size, &h, &why)) {
		FUZZ_CHECK(why != NULL);
		free(copy);
		return;
	}
	n = xp_rel_put_hdr(&h, out);
	FUZZ_CHECK(n + h.len == size);
	FUZZ_CHECK(memcmp(out, copy, n) == 0);
	FUZZ_CHECK(xp_rel_new(&cfg, 0, &r) == 0);
	FUZZ_CHECK(xp_rel_write(r, "0123456789", 10) == 10);
	xp_rel_input(r, 1, &h);
	xp_rel_input(r, 2, &h); /* the same frame again: a duplicate */
	xp_rel_stats(r, &st);
	FUZZ_CHECK(st.held <= cfg.rcvbuf);
	while ((n = xp_rel_next_frame(r, 3, out, sizeof(out))) > 0) {
		FUZZ_CHECK(xp_rel_parse(out, n, &back, &why) == 0);
		FUZZ_CHECK(back.ack <= h.seq + h.len + 1 || back.ack == 0);
	}
	xp_rel_free(r);
	free(copy);
}

/* The input as pn (8 bytes), tag (16), header (40), payload: a forged sealed frame. */
static void forged(const uint8_t *data, size_t size)
{
	static const uint8_t secret[XP_SEAL_SECRET] = "the fuzzer never learns this key";
	static struct xp_seal *rx;
	uint64_t pn;
	uint8_t *copy;

	if (size < 8 + XP_SEAL_TAG + XP_REL_HDR)
		return;
	if (!rx)
		FUZZ_CHECK(xp_seal_new(secret, true, 4, &rx) == 0);
	pn = vm_get_be64(data);
	copy = malloc(size);
	FUZZ_CHECK(copy != NULL);
	memcpy(copy, data, size);
	FUZZ_CHECK(xp_open(rx, pn % (1ull << 40), copy + 8 + XP_SEAL_TAG, XP_REL_HDR,
			   copy + 8 + XP_SEAL_TAG + XP_REL_HDR, size - 8 - XP_SEAL_TAG - XP_REL_HDR,
			   copy + 8) != 0);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rel_sim_cfg c = {
		.mss = 512,
		.sndbuf = 8192,
		.rcvbuf = 8192,
		.bytes_ab = 48 * 1024,
		.bytes_ba = 4096,
		.delay_us = 40,
		.bytes_per_ms = 100 * 1024,
		.queue_us = 1000,
		.limit_us = 4ull * 3600 * 1000 * 1000,
		.fate = data,
		.fate_len = size,
	};
	struct rel_sim_result res;

	one_frame(data, size);
	forged(data, size);
	FUZZ_CHECK(rel_sim_run(&c, &res) == 0);
	FUZZ_CHECK(res.done);
	FUZZ_CHECK(res.intact);
	FUZZ_CHECK(res.bad_parse == 0);
	FUZZ_CHECK(res.max_ahead <= c.rcvbuf);
	FUZZ_CHECK(res.a.bad_acks + res.b.bad_acks + res.a.bad_frames + res.b.bad_frames == 0);
	return 0;
}
