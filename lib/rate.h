/* SPDX-License-Identifier: Apache-2.0 */
/* A rate meter over a growing byte counter: samples every ~100 ms for the 1-second window and
 * every ~1 s for the 10-second one, in two small rings. Fixed size; no allocation. */
#ifndef VM_RATE_H
#define VM_RATE_H

#include <stdint.h>

#define VM_RATE_SLOTS 11

struct vm_rate_ring {
	uint64_t t[VM_RATE_SLOTS], v[VM_RATE_SLOTS];
	unsigned int head, n; /* head: the newest sample */
};

struct vm_rate {
	struct vm_rate_ring fine;   /* >= 100 ms apart */
	struct vm_rate_ring coarse; /* >= 1 s apart */
};

/* total: the counter's value at now_ms. Call at least every 100 ms for an exact 1-s window. */
void vm_rate_sample(struct vm_rate *r, uint64_t now_ms, uint64_t total);
/* Bytes/s over the last window_ms (1000 or 10000), or over what has been sampled if shorter. */
uint64_t vm_rate_get(const struct vm_rate *r, unsigned int window_ms);

#endif
