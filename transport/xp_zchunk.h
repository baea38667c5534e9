/* SPDX-License-Identifier: Apache-2.0 */
/* Compressed chunks for the node hop: up to XP_ZCHUNK_MAX bytes of the plain QEMU stream as one
 * zstd frame (or stored as they are when that does not pay) behind an 8-byte header, so that the
 * receiver decodes them one by one into a buffer of a fixed size. Contexts are allocated once. */
#ifndef XP_ZCHUNK_H
#define XP_ZCHUNK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * The header, big-endian: type (1 byte: XP_ZCHUNK_RAW, XP_ZCHUNK_ZSTD or XP_ZCHUNK_PASS), the plain
 * length (3 bytes, 1 to XP_ZCHUNK_MAX), a zero byte, the payload length (3 bytes). A stored chunk's
 * payload is its plain bytes; a zstd chunk's is exactly one zstd frame that declares the plain
 * length as its content size.
 */
#define XP_ZCHUNK_HDR  8
#define XP_ZCHUNK_MAX  (64 * 1024)
#define XP_ZCHUNK_RAW  0
#define XP_ZCHUNK_ZSTD 1
/* Stored, not offered to zstd: what a sender that decided against compressing sends where its
 * stream is chunks only (the DPDK hop); no compression figure counts it. */
#define XP_ZCHUNK_PASS 2

struct xp_zenc;
struct xp_zdec;

/* What one chunk's header says; filled by xp_zchunk_parse(). */
struct xp_zchunk_hdr {
	uint8_t type;
	uint32_t plain, payload;
};

/* The most bytes a chunk of len plain bytes takes on the wire, header included: XP_ZCHUNK_HDR +
 * len, since a zstd payload is used only where it is shorter than the plain bytes. */
size_t xp_zchunk_bound(size_t len);

/*
 * Reads the header at buf (len bytes there): 0 with *h filled, -EAGAIN if len < XP_ZCHUNK_HDR,
 * -EBADMSG with *why set for a header no sender writes (unknown type, a plain length of 0 or over
 * XP_ZCHUNK_MAX, the zero byte set, a stored or passed payload of another length than the plain
 * one, a zstd payload not shorter than it).
 */
int xp_zchunk_parse(const uint8_t *buf, size_t len, struct xp_zchunk_hdr *h, const char **why);

/* A compressing context at zstd level (1 to 19, or negative for zstd's fast levels), its memory
 * allocated here: compressing never allocates. -EINVAL for a level out of range, -ENOMEM. */
int xp_zenc_new(int level, struct xp_zenc **ret);
void xp_zenc_free(struct xp_zenc *z);

/*
 * One chunk of src[0..len) (1 to XP_ZCHUNK_MAX bytes) into dst, which has room for cap bytes
 * (at least xp_zchunk_bound(len)): the bytes written, header included. Stored as they are where
 * zstd does not make them smaller. -EINVAL for a bad len or cap.
 */
ssize_t xp_zenc_chunk(struct xp_zenc *z, const void *src, size_t len, void *dst, size_t cap);

/* The same, passed as they are without trying zstd (XP_ZCHUNK_PASS: a sender that decided
 * against compressing, in a stream made of chunks only). */
ssize_t xp_zchunk_pass(const void *src, size_t len, void *dst, size_t cap);

/* A decoding context, its memory allocated here. -ENOMEM. */
int xp_zdec_new(struct xp_zdec **ret);
void xp_zdec_free(struct xp_zdec *z);

/*
 * Decodes the whole chunk at rec (len bytes: its header and exactly its payload) into dst, which
 * has room for cap bytes (at least the plain length): the plain length. -EBADMSG with *why set
 * when the chunk is not what a sender writes: a bad header, a length that does not match, a zstd
 * frame that is corrupt, declares another size, decodes to another size or is followed by more
 * bytes. -ENOBUFS if cap is too small. Nothing is written past the plain length.
 */
ssize_t xp_zdec_chunk(struct xp_zdec *z, const void *rec, size_t len, void *dst, size_t cap,
		      const char **why);

#endif
