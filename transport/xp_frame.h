/* SPDX-License-Identifier: Apache-2.0 */
/* The frames of a resumable link's node hop (doc/interfaces.md, "Resumable streams"): each side
 * cuts what it sends into DATA frames that name their stream offset, and acknowledges what it
 * delivered to its QEMU with ACK frames; END closes a direction. A pure codec, no I/O. */
#ifndef XP_FRAME_H
#define XP_FRAME_H

#include <stdbool.h>
#include <stdint.h>

#define XP_FRAME_LEN   16
#define XP_FRAME_MAGIC 0x564d /* "VM" */
/* The longest DATA frame: a sender never holds more unsent at once (its pipe or its ring). */
#define XP_FRAME_MAX (64u << 20)

enum xp_frame_type {
	XP_FRAME_DATA = 1, /* len payload bytes follow; off: the stream offset of the first */
	XP_FRAME_ACK = 2,  /* off: bytes of the other direction the sender delivered to its QEMU */
	XP_FRAME_END = 3,  /* off: the direction's length; no DATA follows */
	/* off: what the sender delivered of the other direction before its QEMU closed its socket
	 * (the rest is dropped, and acknowledged): whatever that QEMU writes from now on is to a
	 * QEMU that is gone. */
	XP_FRAME_GONE = 4,
	/* off: what the sender sent; it waits for an ACK (what it keeps is full): one is due now */
	XP_FRAME_PING = 5,
	/* len bytes follow: one compressed chunk (xp_zchunk.h) of the stream, whose plain bytes
	 * start at off; only on a link whose peer agreed to take them (flag COMPRESS) */
	XP_FRAME_ZDATA = 6,
};

/* The longest ZDATA payload: a chunk's header and at most XP_ZCHUNK_MAX bytes stored. */
#define XP_FRAME_ZMAX (8u + 65536u)

struct xp_frame {
	enum xp_frame_type type;
	uint32_t len;
	uint64_t off;
};

void xp_frame_put(const struct xp_frame *f, uint8_t buf[XP_FRAME_LEN]);
/* 0, or -EBADMSG: a bad magic, type or pad, a DATA frame of 0 or over XP_FRAME_MAX bytes, a
 * ZDATA frame of 0 or over XP_FRAME_ZMAX, or another type with a length. */
int xp_frame_get(const uint8_t buf[XP_FRAME_LEN], struct xp_frame *ret);

#endif
