// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for xp_zchunk, the node hop's compressed chunks: the input is decoded as a
 * peer's chunk, which is refused with a reason or decodes to exactly its header's plain length,
 * never past it; then it is compressed as plain bytes (in pieces of at most XP_ZCHUNK_MAX), and
 * each chunk must decode back to the same bytes. */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "xp_zchunk.h"

#define GUARD 64

static struct xp_zenc *enc;
static struct xp_zdec *dec;
static uint8_t out[XP_ZCHUNK_MAX + GUARD], rec[XP_ZCHUNK_HDR + XP_ZCHUNK_MAX];

static void as_peer_chunk(const uint8_t *data, size_t size)
{
	struct xp_zchunk_hdr h;
	const char *why = NULL;
	ssize_t n;

	memset(out, 0xa5, sizeof(out));
	n = xp_zdec_chunk(dec, data, size, out, XP_ZCHUNK_MAX, &why);
	if (n < 0) {
		FUZZ_CHECK(n == -EBADMSG);
		FUZZ_CHECK(why != NULL);
	} else {
		FUZZ_CHECK(xp_zchunk_parse(data, size, &h, &why) == 0);
		FUZZ_CHECK((size_t)n == h.plain);
		FUZZ_CHECK(size == XP_ZCHUNK_HDR + (size_t)h.payload);
		if (h.type != XP_ZCHUNK_ZSTD)
			FUZZ_CHECK(memcmp(out, data + XP_ZCHUNK_HDR, n) == 0);
	}
	for (size_t i = XP_ZCHUNK_MAX; i < sizeof(out); i++)
		FUZZ_CHECK(out[i] == 0xa5);
}

static void as_plain_bytes(const uint8_t *data, size_t size)
{
	while (size) {
		size_t len = size < XP_ZCHUNK_MAX ? size : XP_ZCHUNK_MAX;
		const char *why = NULL;
		ssize_t n, m;

		n = xp_zenc_chunk(enc, data, len, rec, sizeof(rec));
		FUZZ_CHECK(n > XP_ZCHUNK_HDR && (size_t)n <= xp_zchunk_bound(len));
		m = xp_zdec_chunk(dec, rec, n, out, XP_ZCHUNK_MAX, &why);
		FUZZ_CHECK(m == (ssize_t)len);
		FUZZ_CHECK(memcmp(out, data, len) == 0);
		/* passed as they are (the DPDK hop's chunks when auto decides against zstd) */
		n = xp_zchunk_pass(data, len, rec, sizeof(rec));
		FUZZ_CHECK(n == (ssize_t)xp_zchunk_bound(len));
		m = xp_zdec_chunk(dec, rec, n, out, XP_ZCHUNK_MAX, &why);
		FUZZ_CHECK(m == (ssize_t)len);
		FUZZ_CHECK(memcmp(out, data, len) == 0);
		data += len;
		size -= len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!enc) {
		FUZZ_CHECK(xp_zenc_new(1, &enc) == 0);
		FUZZ_CHECK(xp_zdec_new(&dec) == 0);
	}
	as_peer_chunk(data, size);
	as_plain_bytes(data, size);
	return 0;
}
