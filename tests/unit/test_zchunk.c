// SPDX-License-Identifier: Apache-2.0
/* xp_zchunk, the node hop's compressed chunks: round trips of compressible, random and tiny
 * chunks at several levels, random bytes stored as they are, and every way a peer's chunk can be
 * wrong (header, lengths, a corrupt, oversized, truncated or padded zstd frame) refused with its
 * reason and nothing written past the plain length. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zstd.h>

#include "xp_zchunk.h"

#define MAXREC (XP_ZCHUNK_HDR + XP_ZCHUNK_MAX)

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;

static uint8_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return (uint8_t)rnd_state;
}

/* Text-like bytes: words from a small vocabulary, what page cache and code look like to zstd. */
static void fill_text(uint8_t *b, size_t len)
{
	static const char *words[] = { "migration ", "page ", "dirty ", "qemu ", "vmigd ", "\n" };

	for (size_t i = 0; i < len;) {
		const char *w = words[rnd() % 6];

		for (; *w && i < len; w++)
			b[i++] = (uint8_t)*w;
	}
}

static void fill_random(uint8_t *b, size_t len)
{
	for (size_t i = 0; i < len; i++)
		b[i] = rnd();
}

static void round_trip(struct xp_zenc *e, struct xp_zdec *d, const uint8_t *src, size_t len,
		       uint8_t want_type)
{
	static uint8_t rec[MAXREC], out[XP_ZCHUNK_MAX + 16];
	struct xp_zchunk_hdr h;
	const char *why = NULL;
	ssize_t n, m;

	n = xp_zenc_chunk(e, src, len, rec, sizeof(rec));
	assert_true(n > XP_ZCHUNK_HDR);
	assert_true((size_t)n <= xp_zchunk_bound(len));
	assert_int_equal(xp_zchunk_parse(rec, n, &h, &why), 0);
	assert_int_equal(h.type, want_type);
	assert_int_equal(h.plain, len);
	assert_int_equal(h.payload + XP_ZCHUNK_HDR, n);
	memset(out, 0xa5, sizeof(out));
	m = xp_zdec_chunk(d, rec, n, out, sizeof(out), &why);
	assert_int_equal(m, len);
	assert_memory_equal(out, src, len);
	assert_int_equal(out[len], 0xa5);
}

static void test_round_trips(void **state)
{
	static uint8_t src[XP_ZCHUNK_MAX];
	static const int levels[] = { -5, -1, 1, 3, 9 };
	static const size_t lens[] = { XP_ZCHUNK_MAX, 4096, 4095, 100 };
	struct xp_zenc *e;
	struct xp_zdec *d;

	(void)state;
	assert_int_equal(xp_zdec_new(&d), 0);
	for (size_t l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
		assert_int_equal(xp_zenc_new(levels[l], &e), 0);
		for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			fill_text(src, lens[i]);
			round_trip(e, d, src, lens[i], XP_ZCHUNK_ZSTD);
			memset(src, 0, lens[i]);
			round_trip(e, d, src, lens[i], XP_ZCHUNK_ZSTD);
			fill_random(src, lens[i]);
			round_trip(e, d, src, lens[i], XP_ZCHUNK_RAW);
		}
		src[0] = 'x';
		round_trip(e, d, src, 1, XP_ZCHUNK_RAW);
		xp_zenc_free(e);
	}
	/* passed as they are (a sender that decided against zstd): stored, whatever they are */
	{
		static uint8_t rec[XP_ZCHUNK_HDR + XP_ZCHUNK_MAX], out[XP_ZCHUNK_MAX];
		const char *why = NULL;

		fill_text(src, 4096);
		assert_int_equal(xp_zchunk_pass(src, 4096, rec, 4096 + XP_ZCHUNK_HDR - 1), -EINVAL);
		assert_int_equal(xp_zchunk_pass(src, 4096, rec, sizeof(rec)), XP_ZCHUNK_HDR + 4096);
		assert_int_equal(rec[0], XP_ZCHUNK_PASS);
		assert_int_equal(
			xp_zdec_chunk(d, rec, XP_ZCHUNK_HDR + 4096, out, sizeof(out), &why), 4096);
		assert_memory_equal(out, src, 4096);
		rec[7] ^= 1; /* a payload of another length than its plain one */
		assert_int_equal(
			xp_zdec_chunk(d, rec, XP_ZCHUNK_HDR + 4096, out, sizeof(out), &why),
			-EBADMSG);
	}
	xp_zdec_free(d);
}

/* Text compresses by a stated margin at level 1: the chunking costs zstd little. */
static void test_ratio(void **state)
{
	static uint8_t src[XP_ZCHUNK_MAX], rec[MAXREC];
	struct xp_zenc *e;
	ssize_t n;

	(void)state;
	assert_int_equal(xp_zenc_new(1, &e), 0);
	fill_text(src, sizeof(src));
	n = xp_zenc_chunk(e, src, sizeof(src), rec, sizeof(rec));
	assert_true(n > 0 && (size_t)n * 3 < sizeof(src));
	xp_zenc_free(e);
}

static void test_bad_args(void **state)
{
	static uint8_t src[XP_ZCHUNK_MAX + 1], rec[MAXREC + 1];
	struct xp_zenc *e;

	(void)state;
	assert_int_equal(xp_zenc_new(0, &e), -EINVAL);
	assert_int_equal(xp_zenc_new(20, &e), -EINVAL);
	assert_int_equal(xp_zenc_new(1, &e), 0);
	assert_int_equal(xp_zenc_chunk(e, src, 0, rec, sizeof(rec)), -EINVAL);
	assert_int_equal(xp_zenc_chunk(e, src, sizeof(src), rec, sizeof(rec)), -EINVAL);
	assert_int_equal(xp_zenc_chunk(e, src, 100, rec, XP_ZCHUNK_HDR + 99), -EINVAL);
	xp_zenc_free(e);
}

/* A text chunk compressed once; each case breaks a copy of it. */
struct bad {
	uint8_t rec[MAXREC + 64];
	size_t len, plain;
};

static void make_good(struct bad *b)
{
	static uint8_t src[XP_ZCHUNK_MAX];
	struct xp_zenc *e;
	ssize_t n;

	assert_int_equal(xp_zenc_new(1, &e), 0);
	fill_text(src, sizeof(src));
	n = xp_zenc_chunk(e, src, sizeof(src), b->rec, sizeof(b->rec));
	assert_true(n > XP_ZCHUNK_HDR);
	assert_int_equal(b->rec[0], XP_ZCHUNK_ZSTD);
	b->len = n;
	b->plain = sizeof(src);
	xp_zenc_free(e);
}

static void expect_refused(struct xp_zdec *d, const struct bad *b, const char *what)
{
	static uint8_t out[XP_ZCHUNK_MAX + 4096];
	const char *why = NULL;

	memset(out, 0x5a, sizeof(out));
	assert_int_equal(xp_zdec_chunk(d, b->rec, b->len, out, XP_ZCHUNK_MAX, &why), -EBADMSG);
	assert_non_null(why);
	assert_non_null(strstr(why, what));
	/* The bytes past what a chunk may hold are never touched. */
	for (size_t i = XP_ZCHUNK_MAX; i < sizeof(out); i++)
		assert_int_equal(out[i], 0x5a);
}

static void put24(uint8_t *p, uint32_t v)
{
	p[0] = v >> 16;
	p[1] = v >> 8;
	p[2] = v;
}

static void test_refused(void **state)
{
	static struct bad good, b;
	static uint8_t out[XP_ZCHUNK_MAX];
	struct xp_zchunk_hdr h;
	struct xp_zdec *d;
	const char *why;
	size_t pay;

	(void)state;
	assert_int_equal(xp_zdec_new(&d), 0);
	make_good(&good);
	pay = good.len - XP_ZCHUNK_HDR;
	assert_int_equal(xp_zdec_chunk(d, good.rec, good.len, out, sizeof(out), &why), good.plain);
	assert_int_equal(xp_zchunk_parse(good.rec, XP_ZCHUNK_HDR - 1, &h, &why), -EAGAIN);

	b = good, b.rec[0] = 3;
	expect_refused(d, &b, "unknown chunk type");
	b = good, b.rec[4] = 1;
	expect_refused(d, &b, "reserved byte");
	b = good, put24(b.rec + 1, 0);
	expect_refused(d, &b, "plain length out of range");
	b = good, put24(b.rec + 1, XP_ZCHUNK_MAX + 1);
	expect_refused(d, &b, "plain length out of range");
	b = good, put24(b.rec + 5, b.plain);
	expect_refused(d, &b, "not shorter");
	b = good, b.rec[0] = XP_ZCHUNK_RAW;
	expect_refused(d, &b, "stored chunk's payload");
	b = good, b.len = XP_ZCHUNK_HDR - 1;
	expect_refused(d, &b, "shorter than its header");
	b = good, b.len--;
	expect_refused(d, &b, "does not match");
	b = good, b.len++;
	expect_refused(d, &b, "does not match");
	/* The header agrees with the length; the frame itself is cut or padded. */
	b = good, b.len--, put24(b.rec + 5, pay - 1);
	expect_refused(d, &b, "zstd frame");
	b = good, b.rec[b.len] = 0, b.len++, put24(b.rec + 5, pay + 1);
	expect_refused(d, &b, "not exactly the chunk's payload");
	/* A chunk that says fewer plain bytes than its frame holds: it must not decode past them.
	 */
	b = good, put24(b.rec + 1, b.plain - 1);
	expect_refused(d, &b, "declares another size");
	/* Not a zstd frame at all. */
	b = good, memset(b.rec + XP_ZCHUNK_HDR, 0, 4);
	expect_refused(d, &b, "zstd frame header");
	/* Its compressed blocks damaged: zstd's own checks, or a different size, catch it. */
	for (size_t at = 16; at < pay; at += pay / 16) {
		ssize_t n;

		b = good;
		b.rec[XP_ZCHUNK_HDR + at] ^= 0xff;
		why = NULL;
		n = xp_zdec_chunk(d, b.rec, b.len, out, sizeof(out), &why);
		/* A flip inside a literal decodes to other bytes of the right size: the connection
		 * digests catch that. Everything else is refused. */
		if (n < 0)
			assert_int_equal(n, -EBADMSG), assert_non_null(why);
		else
			assert_int_equal(n, good.plain);
	}
	/* Too small an output buffer is the caller's error, not the peer's. */
	assert_int_equal(xp_zdec_chunk(d, good.rec, good.len, out, good.plain - 1, &why), -ENOBUFS);
	xp_zdec_free(d);
}

/* A frame whose content is larger than XP_ZCHUNK_MAX, wrapped in a header that claims the most:
 * refused before any byte is written past the buffer. */
static void test_oversized_frame(void **state)
{
	static uint8_t big[4 * XP_ZCHUNK_MAX];
	static struct bad b;
	size_t n;
	struct xp_zdec *d;

	(void)state;
	assert_int_equal(xp_zdec_new(&d), 0);
	memset(big, 'a', sizeof(big));
	n = ZSTD_compress(b.rec + XP_ZCHUNK_HDR, sizeof(b.rec) - XP_ZCHUNK_HDR, big, sizeof(big), 1);
	assert_false(ZSTD_isError(n));
	b.rec[0] = XP_ZCHUNK_ZSTD;
	put24(b.rec + 1, XP_ZCHUNK_MAX);
	b.rec[4] = 0;
	put24(b.rec + 5, n);
	b.len = XP_ZCHUNK_HDR + n;
	expect_refused(d, &b, "declares another size");
	xp_zdec_free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trips), cmocka_unit_test(test_ratio),
		cmocka_unit_test(test_bad_args),    cmocka_unit_test(test_refused),
		cmocka_unit_test(test_oversized_frame),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
