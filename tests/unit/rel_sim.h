/* SPDX-License-Identifier: Apache-2.0 */
/* Two xp_rel streams joined by a simulated link (delay, rate, a bounded queue, loss, duplication,
 * reordering), for the unit test and the fuzzer: data goes both ways and arrives verified. */
#ifndef REL_SIM_H
#define REL_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xp_rel.h"

struct rel_sim_cfg {
	uint32_t mss, sndbuf, rcvbuf;
	uint64_t bytes_ab, bytes_ba; /* what each side sends */
	uint64_t delay_us;	     /* one way */
	uint64_t bytes_per_ms;	     /* the link's rate, each way */
	uint64_t queue_us;	     /* a frame that would wait longer is dropped: congestion */
	unsigned int loss_pct, dup_pct, reorder_pct; /* reordered: up to 4x the delay later */
	uint64_t read_per_ms; /* the receiving application's pace; 0: reads all at once */
	uint64_t limit_us;    /* simulated time before giving up */
	/* When set, a byte of it decides each frame's fate (drop, duplicate, delay) in turn,
	 * instead of the percentages: the fuzzer's input. */
	const uint8_t *fate;
	size_t fate_len;
	uint32_t seed;
};

struct rel_sim_result {
	bool done;	    /* both streams delivered, FINs acknowledged */
	bool intact;	    /* every byte delivered was the byte sent there */
	uint64_t end_us;    /* when it was done */
	uint64_t frames;    /* put on the link */
	uint64_t dropped;   /* by the link */
	uint64_t bad_parse; /* frames the parser refused (must be 0) */
	uint64_t max_ahead; /* the most bytes ever held beyond the reader: at most rcvbuf */
	struct xp_rel_stats a, b;
};

/* Runs to completion or limit_us; -errno when a stream could not be made. */
int rel_sim_run(const struct rel_sim_cfg *cfg, struct rel_sim_result *res);

#endif
