/* SPDX-License-Identifier: Apache-2.0 */
/* A link of any of the transport's data paths (the io_uring pool's, the DPDK hop's): each starts
 * with struct xp_link, whose ops say how to reach it. Not for creating links: each path has its own
 * attach. */
#ifndef XP_LINK_H
#define XP_LINK_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest.h"

struct xp_link;
struct xp_tls_sess;

/*
 * A quiesced resumable link, for the process it moves to (a takeover), or one whose DPDK node hop
 * failed, for the kernel path (XP_END_FALLBACK): sent, the offset of the local socket's stream
 * that went out (a quiesced link's peer acknowledged all of it); have, the offset of the other
 * direction that was delivered to the local socket; each direction's digest state
 * (vm_digest_save; dg_len 0: no digests).
 */
struct xp_link_state {
	int fd; /* the local socket, still the link's: the caller passes a copy on */
	uint64_t sent, have;
	size_t dg_len[2];
	uint8_t dg[2][VM_DIGEST_STATE_MAX];
	/*
	 * A link that left another data path with bytes unacknowledged (XP_END_FALLBACK): the
	 * kept_len bytes that end at sent, which the peer may lack. 0 for a quiesced link, which
	 * has none.
	 */
	const uint8_t *kept;
	size_t kept_len;
};

/* Why a compressing link sends compressed chunks now, or not (xp_link_zfig). */
enum xp_zwhy {
	XP_ZWHY_NONE,	  /* it decided nothing yet */
	XP_ZWHY_ALWAYS,	  /* --compress always */
	XP_ZWHY_CAPPED,	  /* its cap held it back in the last second */
	XP_ZWHY_IDLE_HOP, /* nothing waited for the node hop or a cap */
	XP_ZWHY_CPU,	  /* the worker had no time to spare (or compressing took it all) */
	XP_ZWHY_RATIO,	  /* recent chunks did not compress: it tries again later */
};

/* A link's compression figures: what went out compressed and came in so, cumulative. */
struct xp_zfig {
	uint64_t tx_plain, tx_wire, tx_ns; /* plain bytes sent as chunks, their chunks, CPU time */
	uint64_t rx_plain, rx_wire, rx_ns; /* ... and of the chunks the peer sent, decoded */
	bool on;			   /* compressing now */
	enum xp_zwhy why;		   /* the last decision's reason */
	unsigned int flips;		   /* decisions that turned it on or off */
	unsigned int idle_pct;		   /* the worker's share of waiting at that decision */
	unsigned int ratio_pct;		   /* chunk / plain of the recent chunks, in % */
};

/* Every call runs on the control thread. */
struct xp_link_ops {
	/* Asks the data path to cut the link; its done callback follows. Idempotent. */
	void (*abort)(struct xp_link *l);
	/* Live byte counters, [0]: from the local socket to the peer, [1]: back. */
	void (*bytes)(const struct xp_link *l, uint64_t out[2]);
	/* Time the local socket's bytes waited for their buckets so far, in ns. */
	uint64_t (*shaped_ns)(const struct xp_link *l);
	/* Paces what the link sends to the peer (bytes/s, 0: none); a path without pacing
	 * ignores it. */
	void (*set_pacing)(struct xp_link *l, uint64_t rate);
	/*
	 * Resumable links (xp_link_opts.resume); NULL on a path that has none. suspend: drop the
	 * node hop as if it had failed (an XP_END_SUSPENDED report follows unless the link ends
	 * first). resume: a suspended link goes on over fd (and tls, NULL in plain text: both
	 * the link's from then on) from have, the offset of what the local socket sends that the
	 * peer has; -ERANGE when that is outside what the link kept (nothing is taken then).
	 * kept: bytes held for the peer now.
	 */
	void (*suspend)(struct xp_link *l);
	int (*resume)(struct xp_link *l, int fd, struct xp_tls_sess *tls, uint64_t have);
	uint64_t (*kept)(const struct xp_link *l);
	/* The offsets a peer's have may take now: what it acknowledged, what was sent. */
	void (*range)(const struct xp_link *l, uint64_t *acked, uint64_t *sent);
	/*
	 * Moving a resumable link to another process. quiesce(true): it stops reading its local
	 * socket, sends what it holds, asks the peer to acknowledge it all and delivers what it
	 * took from the node hop; then it holds still and reports XP_END_QUIESCED (err -EBUSY: it
	 * cannot, being at its end or suspended; it goes on then). quiesce(false): it goes on.
	 * state: a quiesced link's offsets and digests. release: a quiesced link ends
	 * (XP_END_MOVED): its node hop reset, its local socket closed without a shutdown (the
	 * other process has it).
	 */
	void (*quiesce)(struct xp_link *l, bool on);
	int (*state)(const struct xp_link *l, struct xp_link_state *out);
	void (*release)(struct xp_link *l);
	/* Compression figures (all 0 on a link without, or a path with none); set_zmode: a link
	 * that compresses (enum xp_zmode but off) does so from its next chunk on in this mode. */
	void (*zfig)(const struct xp_link *l, struct xp_zfig *out);
	void (*set_zmode)(struct xp_link *l, int mode);
};

/* The head of every link: a data path embeds it first in a link of its own. */
struct xp_link {
	const struct xp_link_ops *ops;
};

static inline void xp_link_abort(struct xp_link *l)
{
	l->ops->abort(l);
}

static inline void xp_link_bytes(const struct xp_link *l, uint64_t out[2])
{
	l->ops->bytes(l, out);
}

static inline uint64_t xp_link_shaped_ns(const struct xp_link *l)
{
	return l->ops->shaped_ns(l);
}

static inline void xp_link_set_pacing(struct xp_link *l, uint64_t rate)
{
	l->ops->set_pacing(l, rate);
}

static inline void xp_link_suspend(struct xp_link *l)
{
	if (l->ops->suspend)
		l->ops->suspend(l);
}

static inline int xp_link_resume(struct xp_link *l, int fd, struct xp_tls_sess *tls,
				 uint64_t have)
{
	return l->ops->resume ? l->ops->resume(l, fd, tls, have) : -ENOTSUP;
}

static inline uint64_t xp_link_kept(const struct xp_link *l)
{
	return l->ops->kept ? l->ops->kept(l) : 0;
}

static inline void xp_link_range(const struct xp_link *l, uint64_t *acked, uint64_t *sent)
{
	*acked = *sent = 0;
	if (l->ops->range)
		l->ops->range(l, acked, sent);
}

static inline void xp_link_quiesce(struct xp_link *l, bool on)
{
	if (l->ops->quiesce)
		l->ops->quiesce(l, on);
}

static inline int xp_link_state(const struct xp_link *l, struct xp_link_state *out)
{
	return l->ops->state ? l->ops->state(l, out) : -ENOTSUP;
}

static inline void xp_link_release(struct xp_link *l)
{
	if (l->ops->release)
		l->ops->release(l);
}

static inline void xp_link_set_zmode(struct xp_link *l, int mode)
{
	if (l->ops->set_zmode)
		l->ops->set_zmode(l, mode);
}

static inline void xp_link_zfig(const struct xp_link *l, struct xp_zfig *out)
{
	*out = (struct xp_zfig){ 0 };
	if (l->ops->zfig)
		l->ops->zfig(l, out);
}

#endif
