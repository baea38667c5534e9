// SPDX-License-Identifier: Apache-2.0
/* Compressed chunks for the node hop (xp_zchunk.h): zstd with static contexts, so that no chunk
 * allocates, and a decoder that takes nothing on trust from the peer. */
#define ZSTD_STATIC_LINKING_ONLY
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "xp_zchunk.h"

struct xp_zenc {
	ZSTD_CCtx *cctx;
	int level;
	void *mem;
};

struct xp_zdec {
	ZSTD_DCtx *dctx;
	void *mem;
};

static uint32_t get24(const uint8_t *p)
{
	return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}

static void put24(uint8_t *p, uint32_t v)
{
	p[0] = v >> 16;
	p[1] = v >> 8;
	p[2] = v;
}

static void put_hdr(uint8_t *p, uint8_t type, uint32_t plain, uint32_t payload)
{
	p[0] = type;
	put24(p + 1, plain);
	p[4] = 0;
	put24(p + 5, payload);
}

/* The memory a static zstd context lives in: 64-byte aligned, its size rounded up to that. */
static void *ctx_mem(size_t size)
{
	return aligned_alloc(64, (size + 63) & ~(size_t)63);
}

size_t xp_zchunk_bound(size_t len)
{
	return XP_ZCHUNK_HDR + len;
}

int xp_zchunk_parse(const uint8_t *buf, size_t len, struct xp_zchunk_hdr *h, const char **why)
{
	if (len < XP_ZCHUNK_HDR)
		return -EAGAIN;
	h->type = buf[0];
	h->plain = get24(buf + 1);
	h->payload = get24(buf + 5);
	if (h->type != XP_ZCHUNK_RAW && h->type != XP_ZCHUNK_ZSTD && h->type != XP_ZCHUNK_PASS)
		*why = "unknown chunk type";
	else if (buf[4])
		*why = "reserved byte set";
	else if (!h->plain || h->plain > XP_ZCHUNK_MAX)
		*why = "plain length out of range";
	else if (h->type != XP_ZCHUNK_ZSTD && h->payload != h->plain)
		*why = "stored chunk's payload is not its plain length";
	else if (h->type == XP_ZCHUNK_ZSTD && (!h->payload || h->payload >= h->plain))
		*why = "zstd payload not shorter than its plain length";
	else
		return 0;
	return -EBADMSG;
}

int xp_zenc_new(int level, struct xp_zenc **ret)
{
	struct xp_zenc *z;
	size_t size;

	if (level < ZSTD_minCLevel() || level > 19 || !level)
		return -EINVAL;
	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	/* What compressing XP_ZCHUNK_MAX bytes at this level needs, with its window and tables;
	 * a static context never allocates more and fails cleanly if it would. */
	size = ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(level, XP_ZCHUNK_MAX, 0));
	z->mem = ctx_mem(size);
	if (!z->mem)
		goto fail;
	z->cctx = ZSTD_initStaticCCtx(z->mem, size);
	if (!z->cctx)
		goto fail;
	z->level = level;
	*ret = z;
	return 0;
fail:
	free(z->mem);
	free(z);
	return -ENOMEM;
}

void xp_zenc_free(struct xp_zenc *z)
{
	if (!z)
		return;
	free(z->mem);
	free(z);
}

ssize_t xp_zenc_chunk(struct xp_zenc *z, const void *src, size_t len, void *dst, size_t cap)
{
	uint8_t *out = dst;
	size_t n;

	if (!len || len > XP_ZCHUNK_MAX || cap < xp_zchunk_bound(len))
		return -EINVAL;
	/* Room for one byte less than stored: zstd either saves a byte or is not used. */
	n = ZSTD_compressCCtx(z->cctx, out + XP_ZCHUNK_HDR, len - 1, src, len, z->level);
	if (!ZSTD_isError(n) && n && n < len) {
		put_hdr(out, XP_ZCHUNK_ZSTD, len, n);
		return XP_ZCHUNK_HDR + n;
	}
	put_hdr(out, XP_ZCHUNK_RAW, len, len);
	memcpy(out + XP_ZCHUNK_HDR, src, len);
	return XP_ZCHUNK_HDR + len;
}

ssize_t xp_zchunk_pass(const void *src, size_t len, void *dst, size_t cap)
{
	uint8_t *out = dst;

	if (!len || len > XP_ZCHUNK_MAX || cap < xp_zchunk_bound(len))
		return -EINVAL;
	put_hdr(out, XP_ZCHUNK_PASS, len, len);
	memcpy(out + XP_ZCHUNK_HDR, src, len);
	return XP_ZCHUNK_HDR + len;
}

int xp_zdec_new(struct xp_zdec **ret)
{
	struct xp_zdec *z;
	size_t size = ZSTD_estimateDCtxSize();

	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	z->mem = ctx_mem(size);
	if (!z->mem)
		goto fail;
	z->dctx = ZSTD_initStaticDCtx(z->mem, size);
	if (!z->dctx)
		goto fail;
	*ret = z;
	return 0;
fail:
	free(z->mem);
	free(z);
	return -ENOMEM;
}

void xp_zdec_free(struct xp_zdec *z)
{
	if (!z)
		return;
	free(z->mem);
	free(z);
}

ssize_t xp_zdec_chunk(struct xp_zdec *z, const void *rec, size_t len, void *dst, size_t cap,
		      const char **why)
{
	const uint8_t *in = rec, *payload = in + XP_ZCHUNK_HDR;
	struct xp_zchunk_hdr h;
	unsigned long long declared;
	size_t n;
	int rc;

	rc = xp_zchunk_parse(in, len, &h, why);
	if (rc == -EAGAIN) {
		*why = "chunk shorter than its header";
		return -EBADMSG;
	}
	if (rc)
		return rc;
	if (len != XP_ZCHUNK_HDR + (size_t)h.payload) {
		*why = "chunk length does not match its header";
		return -EBADMSG;
	}
	if (cap < h.plain)
		return -ENOBUFS;
	if (h.type != XP_ZCHUNK_ZSTD) {
		memcpy(dst, payload, h.plain);
		return h.plain;
	}
	/* One frame, exactly the payload, that says its size before any byte is decoded. */
	declared = ZSTD_getFrameContentSize(payload, h.payload);
	if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN) {
		*why = "zstd frame header corrupt or without its content size";
		return -EBADMSG;
	}
	if (declared != h.plain) {
		*why = "zstd frame declares another size than its chunk";
		return -EBADMSG;
	}
	n = ZSTD_findFrameCompressedSize(payload, h.payload);
	if (ZSTD_isError(n) || n != h.payload) {
		*why = "zstd frame corrupt, or not exactly the chunk's payload";
		return -EBADMSG;
	}
	/* Into h.plain bytes only: a frame that would decode to more fails here, not past dst. */
	n = ZSTD_decompressDCtx(z->dctx, dst, h.plain, payload, h.payload);
	if (ZSTD_isError(n)) {
		*why = "zstd frame corrupt";
		return -EBADMSG;
	}
	if (n != h.plain) {
		*why = "zstd frame decodes to another size than its chunk";
		return -EBADMSG;
	}
	return n;
}
