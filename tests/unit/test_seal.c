// SPDX-License-Identifier: Apache-2.0
/* xp_seal, the DPDK node hop's frame sealing: round trips in place, forgeries of every part,
 * replays and frames too old for the window, the wrong key, key phases that roll (and a forged
 * frame that must not roll them), and packet numbers a sealer must never reuse. The exporter
 * that keys it is tested on real handshakes in test_tls.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "xp_seal.h"

static const uint8_t secret[XP_SEAL_SECRET] = "0123456789abcdef0123456789abcde";
static const uint8_t hdr[40] = "frame header, authenticated in clear...";

struct pair {
	struct xp_seal *tx, *rx;
};

static void pair_new(struct pair *p, unsigned int shift)
{
	assert_int_equal(xp_seal_new(secret, false, shift, &p->tx), 0);
	assert_int_equal(xp_seal_new(secret, true, shift, &p->rx), 0);
}

static void pair_free(struct pair *p)
{
	xp_seal_free(p->tx);
	xp_seal_free(p->rx);
}

static void fill(uint8_t *b, size_t len, uint64_t pn)
{
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(i * 7 + pn);
}

/* Seals a frame with pn into buf/tag; checks the payload no longer reads in clear. */
static void seal(struct pair *p, uint64_t pn, uint8_t *buf, size_t len, uint8_t *tag)
{
	uint8_t clear[2048];

	fill(buf, len, pn);
	memcpy(clear, buf, len);
	assert_int_equal(xp_seal(p->tx, pn, hdr, sizeof(hdr), buf, len, tag), 0);
	if (len >= 16)
		assert_memory_not_equal(buf, clear, len);
}

static int open_frame(struct pair *p, uint64_t pn, uint8_t *buf, size_t len, const uint8_t *tag)
{
	return xp_open(p->rx, pn, hdr, sizeof(hdr), buf, len, tag);
}

static void test_round_trip(void **state)
{
	struct pair p;
	uint8_t buf[1500], want[1500], tag[XP_SEAL_TAG], other[1500], otag[XP_SEAL_TAG];
	struct xp_seal_stats st;

	(void)state;
	pair_new(&p, 0);
	for (uint64_t pn = 0; pn < 100; pn++) {
		seal(&p, pn, buf, sizeof(buf), tag);
		assert_int_equal(open_frame(&p, pn, buf, sizeof(buf), tag), 0);
		fill(want, sizeof(want), pn);
		assert_memory_equal(buf, want, sizeof(buf));
	}
	/* The same bytes under two packet numbers seal differently: the nonce moves. */
	fill(buf, sizeof(buf), 0);
	memcpy(other, buf, sizeof(buf));
	assert_int_equal(xp_seal(p.tx, 100, hdr, sizeof(hdr), buf, sizeof(buf), tag), 0);
	assert_int_equal(xp_seal(p.tx, 101, hdr, sizeof(hdr), other, sizeof(other), otag), 0);
	assert_memory_not_equal(buf, other, sizeof(buf));
	/* An empty payload is authenticated too (a pure acknowledgement). */
	assert_int_equal(xp_seal(p.tx, 102, hdr, sizeof(hdr), buf, 0, tag), 0);
	assert_int_equal(open_frame(&p, 102, buf, 0, tag), 0);
	xp_seal_stats(p.tx, &st);
	assert_int_equal(st.sealed, 103);
	xp_seal_stats(p.rx, &st);
	assert_int_equal(st.opened, 101);
	pair_free(&p);
}

static void test_forgeries(void **state)
{
	struct pair p;
	uint8_t buf[512], keep[512], tag[XP_SEAL_TAG], t2[XP_SEAL_TAG], h2[sizeof(hdr)];
	struct xp_seal_stats st;
	struct xp_seal *stranger;
	static const uint8_t other[XP_SEAL_SECRET] = "another secret, another session";

	(void)state;
	pair_new(&p, 0);
	seal(&p, 7, buf, sizeof(buf), tag);
	memcpy(keep, buf, sizeof(buf));
	/* A payload bit, a tag bit, a header bit, the packet number: each refused. */
	buf[100] ^= 1;
	assert_int_equal(open_frame(&p, 7, buf, sizeof(buf), tag), -EBADMSG);
	memcpy(buf, keep, sizeof(buf));
	memcpy(t2, tag, sizeof(t2));
	t2[0] ^= 0x80;
	assert_int_equal(open_frame(&p, 7, buf, sizeof(buf), t2), -EBADMSG);
	memcpy(buf, keep, sizeof(buf));
	memcpy(h2, hdr, sizeof(hdr));
	h2[3] ^= 4;
	assert_int_equal(xp_open(p.rx, 7, h2, sizeof(h2), buf, sizeof(buf), tag), -EBADMSG);
	memcpy(buf, keep, sizeof(buf));
	assert_int_equal(open_frame(&p, 8, buf, sizeof(buf), tag), -EBADMSG);
	/* A truncated frame. */
	memcpy(buf, keep, sizeof(buf));
	assert_int_equal(open_frame(&p, 7, buf, sizeof(buf) - 1, tag), -EBADMSG);
	/* Another session's key. */
	assert_int_equal(xp_seal_new(other, true, 0, &stranger), 0);
	memcpy(buf, keep, sizeof(buf));
	assert_int_equal(xp_open(stranger, 7, hdr, sizeof(hdr), buf, sizeof(buf), tag), -EBADMSG);
	xp_seal_free(stranger);
	/* None of that spoiled the genuine frame, which is then taken once only. */
	memcpy(buf, keep, sizeof(buf));
	assert_int_equal(open_frame(&p, 7, buf, sizeof(buf), tag), 0);
	memcpy(buf, keep, sizeof(buf));
	assert_int_equal(open_frame(&p, 7, buf, sizeof(buf), tag), -EALREADY);
	xp_seal_stats(p.rx, &st);
	assert_int_equal(st.forged, 5);
	assert_int_equal(st.replayed, 1);
	pair_free(&p);
}

static void test_replay_window(void **state)
{
	enum { N = 3000 };
	static uint8_t bufs[N][64], tags[N][XP_SEAL_TAG];
	struct pair p;
	struct xp_seal_stats st;

	(void)state;
	pair_new(&p, 0);
	for (uint64_t pn = 0; pn < N; pn++)
		seal(&p, pn, bufs[pn], sizeof(bufs[pn]), tags[pn]);
	/* Out of order inside the window: every frame once, in a shuffled order. */
	for (uint64_t i = 0; i < 1000; i++) {
		uint64_t pn = (i * 617) % 1000;

		assert_int_equal(open_frame(&p, pn, bufs[pn], 64, tags[pn]), 0);
	}
	assert_int_equal(open_frame(&p, 2500, bufs[2500], 64, tags[2500]), 0);
	/* 2500 moved the window: 1476 is inside it, 1476 - 1 - ... 1000 is not. */
	assert_int_equal(open_frame(&p, 1477, bufs[1477], 64, tags[1477]), 0);
	assert_int_equal(open_frame(&p, 1476, bufs[1476], 64, tags[1476]), -ESTALE);
	assert_int_equal(open_frame(&p, 999, bufs[999], 64, tags[999]), -ESTALE);
	/* Replays of frames the window remembers, as it slides by less than a word and by more.
	 * (A replay is refused before any decryption, so the buffer's state does not matter.) */
	assert_int_equal(open_frame(&p, 1477, bufs[1477], 64, tags[1477]), -EALREADY);
	assert_int_equal(open_frame(&p, 2530, bufs[2530], 64, tags[2530]), 0);
	assert_int_equal(open_frame(&p, 2500, bufs[2500], 64, tags[2500]), -EALREADY);
	assert_int_equal(open_frame(&p, 2600, bufs[2600], 64, tags[2600]), 0);
	assert_int_equal(open_frame(&p, 2530, bufs[2530], 64, tags[2530]), -EALREADY);
	assert_int_equal(open_frame(&p, 2500, bufs[2500], 64, tags[2500]), -EALREADY);
	assert_int_equal(open_frame(&p, 2599, bufs[2599], 64, tags[2599]), 0);
	assert_int_equal(open_frame(&p, 2599, bufs[2599], 64, tags[2599]), -EALREADY);
	xp_seal_stats(p.rx, &st);
	assert_int_equal(st.opened, 1005);
	assert_int_equal(st.too_old, 2);
	assert_int_equal(st.replayed, 5);
	pair_free(&p);
}

static void test_phases(void **state)
{
	struct pair p;
	uint8_t buf[256], keep[256], tag[XP_SEAL_TAG], ktag[XP_SEAL_TAG];
	struct xp_seal_stats st;

	(void)state;
	/* Phases of 16 frames. */
	pair_new(&p, 4);
	for (uint64_t pn = 0; pn < 40; pn++) {
		seal(&p, pn, buf, sizeof(buf), tag);
		/* Frame 20 is held back, and arrives after phase 2 began. */
		if (pn == 20) {
			memcpy(keep, buf, sizeof(buf));
			memcpy(ktag, tag, sizeof(tag));
			continue;
		}
		assert_int_equal(open_frame(&p, pn, buf, sizeof(buf), tag), 0);
	}
	xp_seal_stats(p.rx, &st);
	assert_int_equal(st.phase, 2);
	assert_int_equal(open_frame(&p, 20, keep, sizeof(keep), ktag), 0);
	/* Each phase has its own key: a frame sealed in phase 2 does not open as phase 3. */
	seal(&p, 47, buf, sizeof(buf), tag);
	assert_int_equal(open_frame(&p, 48, buf, sizeof(buf), tag), -EBADMSG);
	/* A forged frame claiming the next phase keys it on the side, and does not move to it. */
	fill(buf, sizeof(buf), 0);
	memset(tag, 0, sizeof(tag));
	assert_int_equal(open_frame(&p, 3 * 16 + 1, buf, sizeof(buf), tag), -EBADMSG);
	xp_seal_stats(p.rx, &st);
	assert_int_equal(st.phase, 2);
	/* Two phases ahead of the opener: no sealer can be there while frames still arrive. */
	assert_int_equal(open_frame(&p, 4 * 16, buf, sizeof(buf), tag), -ESTALE);
	pair_free(&p);
}

static void test_nonce_never_reused(void **state)
{
	struct pair p;
	uint8_t buf[32], tag[XP_SEAL_TAG];

	(void)state;
	pair_new(&p, 0);
	assert_int_equal(xp_seal(p.tx, 5, hdr, sizeof(hdr), buf, sizeof(buf), tag), 0);
	assert_int_equal(xp_seal(p.tx, 5, hdr, sizeof(hdr), buf, sizeof(buf), tag), -EINVAL);
	assert_int_equal(xp_seal(p.tx, 4, hdr, sizeof(hdr), buf, sizeof(buf), tag), -EINVAL);
	assert_int_equal(xp_seal(p.tx, 1ull << 62, hdr, sizeof(hdr), buf, sizeof(buf), tag),
			 -ERANGE);
	/* The roles do not mix. */
	assert_int_equal(xp_open(p.tx, 6, hdr, sizeof(hdr), buf, sizeof(buf), tag), -ERANGE);
	assert_int_equal(xp_seal(p.rx, 6, hdr, sizeof(hdr), buf, sizeof(buf), tag), -ERANGE);
	pair_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),	   cmocka_unit_test(test_forgeries),
		cmocka_unit_test(test_replay_window),	   cmocka_unit_test(test_phases),
		cmocka_unit_test(test_nonce_never_reused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
