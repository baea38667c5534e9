// SPDX-License-Identifier: Apache-2.0
/* Rate meters: the newest sample against the oldest one that is at least a window old (or the
 * oldest there is), so a 1-s rate reads exactly one second of bytes once the meter has run. */
#include "rate.h"

/*
 * Slots older than the newest are at least spacing apart; the newest slot follows the counter
 * until the next one is due, so a reading is never older than the last sample.
 */
static void ring_put(struct vm_rate_ring *g, uint64_t t, uint64_t v, uint64_t spacing)
{
	unsigned int prev = (g->head + VM_RATE_SLOTS - 1) % VM_RATE_SLOTS;

	if (g->n >= 2 && t - g->t[prev] < spacing) {
		g->t[g->head] = t;
		g->v[g->head] = v;
		return;
	}
	g->head = g->n ? (g->head + 1) % VM_RATE_SLOTS : 0;
	g->t[g->head] = t;
	g->v[g->head] = v;
	if (g->n < VM_RATE_SLOTS)
		g->n++;
}

void vm_rate_sample(struct vm_rate *r, uint64_t now_ms, uint64_t total)
{
	ring_put(&r->fine, now_ms, total, 100);
	ring_put(&r->coarse, now_ms, total, 1000);
}

static uint64_t ring_rate(const struct vm_rate_ring *g, uint64_t window)
{
	unsigned int i = g->head, k;
	uint64_t t0 = g->t[g->head], v0 = g->v[g->head];

	if (g->n < 2)
		return 0;
	/* Walk back to the first sample at least a window old, or the oldest. */
	for (k = 1; k < g->n; k++) {
		i = (i + VM_RATE_SLOTS - 1) % VM_RATE_SLOTS;
		if (t0 - g->t[i] >= window)
			break;
	}
	if (t0 == g->t[i])
		return 0;
	return (v0 - g->v[i]) * 1000 / (t0 - g->t[i]);
}

uint64_t vm_rate_get(const struct vm_rate *r, unsigned int window_ms)
{
	return ring_rate(window_ms > 1000 ? &r->coarse : &r->fine, window_ms);
}
