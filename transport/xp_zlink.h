/* SPDX-License-Identifier: Apache-2.0 */
/* One link's compression, on whichever data path carries it (the pool's frames, the DPDK hop):
 * its zstd contexts, auto's decision per chunk and the figures the control thread reads. The
 * path keeps its own buffers and says how idle its thread is. Nothing outside transport/. */
#ifndef XP_ZLINK_H
#define XP_ZLINK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "xp_link.h"

struct xp_zenc;
struct xp_zdec;

struct xp_zlink {
	_Atomic int mode; /* enum xp_zmode: the control thread may change it */
	struct xp_zenc *enc;
	struct xp_zdec *dec;
	/* auto: what it saw, what it decided (the data path's thread only) */
	uint64_t throttled_ns, backoff_until, backoff_ns;
	unsigned int bad;
	unsigned int ratio; /* recent chunks' chunk / plain, of 1024 */
	bool on;
	/* for the control thread */
	_Atomic uint64_t tx_plain, tx_wire, tx_ns, rx_plain, rx_wire, rx_ns;
	_Atomic bool pub_on;
	_Atomic unsigned int why, flips, idle_pct, pub_ratio;
};

/* Contexts for sending in mode (enum xp_zmode; none for XP_Z_OFF) at zstd level, and for
 * receiving if in: 0, -EINVAL, -ENOMEM (nothing then to finish). Allocates all it will use. */
int xp_zlink_init(struct xp_zlink *z, int mode, int level, bool in);
void xp_zlink_fini(struct xp_zlink *z);
/* auto: a cap held the sending direction back now. */
void xp_zlink_note(struct xp_zlink *z, bool throttled);
/* Whether the next chunk goes compressed; idle: the share (%) of the last 100 ms that the
 * path's thread waited. The reason is published when it changes. */
bool xp_zlink_decide(struct xp_zlink *z, unsigned int idle, uint64_t now);
/* The chunk of src[0..len) (1 to XP_ZCHUNK_MAX bytes) into dst (cap bytes, at least
 * xp_zchunk_bound(len)): its length, its CPU time counted and its ratio judged (auto stops for
 * a while after chunks that did not shrink). xp_zlink_sent() counts it once it has gone. */
ssize_t xp_zlink_encode(struct xp_zlink *z, const void *src, size_t len, void *dst, size_t cap,
			uint64_t now);
void xp_zlink_sent(struct xp_zlink *z, size_t plain, size_t wire);
/* xp_zdec_chunk() of the whole chunk at rec, counted. */
ssize_t xp_zlink_decode(struct xp_zlink *z, const void *rec, size_t len, void *dst, size_t cap,
			const char **why);
/* A link that compresses goes on in mode (not XP_Z_OFF) from its next chunk. */
void xp_zlink_set_mode(struct xp_zlink *z, int mode);
void xp_zlink_fig(const struct xp_zlink *z, struct xp_zfig *out);

#endif
