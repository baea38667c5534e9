/* SPDX-License-Identifier: Apache-2.0 */
/* Token buckets shared by links on any worker: a link's direction takes tokens for the bytes it
 * is about to read, from its migration's bucket and the node's, and waits when one runs dry. The
 * rates are policy and come from above; this is only the mechanism. */
#ifndef XP_BUCKET_H
#define XP_BUCKET_H

#include <stddef.h>
#include <stdint.h>

struct xp_bucket;

/* Smallest grant worth a system call; a pump waits for half a burst when it can. */
#define XP_BUCKET_QUANTUM (16 * 1024)
/* The most a bucket holds: 10 ms of its rate, at least this. */
#define XP_BUCKET_MIN_BURST (64 * 1024)

/* rate in bytes/s; 0: unlimited (takes cost one atomic load). -ENOMEM only. */
int xp_bucket_new(uint64_t rate, struct xp_bucket **ret);
void xp_bucket_free(struct xp_bucket *b);
/* Takes effect at the next take; tokens earned so far are kept up to the new burst. */
void xp_bucket_set_rate(struct xp_bucket *b, uint64_t rate);
uint64_t xp_bucket_rate(const struct xp_bucket *b);
/* The most bytes a bucket at this rate lets through at once (0 for unlimited). */
uint64_t xp_bucket_burst(uint64_t rate);

/*
 * Takes up to want bytes from every non-NULL bucket of chain[0..1] at once. Returns the grant, or
 * 0 with *wait_ns set to when enough tokens for half the smallest burst (at least
 * XP_BUCKET_QUANTUM; want, if smaller) will be there. A failed take counts as "held" on
 * chain[0], whichever bucket was short.
 */
size_t xp_bucket_take(struct xp_bucket *const chain[2], size_t want, uint64_t now_ns,
		      uint64_t *wait_ns);
/* Gives back what a grant did not use. */
void xp_bucket_refund(struct xp_bucket *const chain[2], size_t bytes);
/* How many takes found this bucket's chain short, since it was made. */
uint64_t xp_bucket_held(const struct xp_bucket *b);

#endif
