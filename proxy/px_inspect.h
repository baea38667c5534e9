/* SPDX-License-Identifier: Apache-2.0 */
/* Passive inspection of one QEMU migration connection: a streaming parser of the main channel and
 * of multifd channels (QEMU 7.2 to 10.x) that counts pages, zero pages, sync points and scan passes
 * as the bytes go by. It never changes, holds back or rejects a byte; what it does not recognise
 * it counts as bytes and says why. Runs on a data-path worker; px_insp_read() on any thread. */
#ifndef PX_INSPECT_H
#define PX_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "xp_pool.h"

struct px_insp;

enum px_insp_kind {
	PX_INSP_DETECTING, /* fewer than 4 bytes seen */
	PX_INSP_MAIN,	   /* "QEVM": the main channel */
	PX_INSP_MULTIFD,   /* 0x11223344: a multifd channel */
	PX_INSP_OTHER,	   /* anything else (TLS from QEMU, postcopy preempt): bytes only */
};

#define PX_INSP_REASON_MAX  80
#define PX_INSP_MACHINE_MAX 48

/* A consistent-enough snapshot: each counter is exact, counters may be a few bytes apart. */
struct px_insp_stats {
	enum px_insp_kind kind;
	bool bytes_only;		   /* parsing stopped; reason says why */
	char reason[PX_INSP_REASON_MAX];   /* empty while parsing */
	uint32_t stream_version;	   /* main: QEMU_VM_FILE_VERSION; multifd: MULTIFD_VERSION */
	char machine[PX_INSP_MACHINE_MAX]; /* main: machine type from the configuration section */
	int channel_id;			   /* multifd: id from MultiFDInit_t; else -1 */
	uint32_t page_size;		   /* 0 until known */
	uint64_t ram_total;		   /* main: RAM bytes the setup section announced; else 0 */
	uint64_t bytes;			   /* stream bytes seen (parsed or not) */
	uint64_t pages;			   /* pages sent with their data */
	uint64_t zero_pages;		   /* pages sent as "zero" (no data) */
	uint64_t packets;		   /* multifd: packet headers */
	uint64_t syncs;			   /* multifd SYNC flags; main: EOS and MULTIFD_FLUSH */
	uint64_t sync_bytes_last;	   /* stream bytes between the last two sync points */
	uint64_t passes;		   /* scan passes begun: 1 at the first page, +1 per wrap */
	uint64_t pass_pages_last;	   /* pages (with data or zero) of the last completed pass */
	uint64_t pass_ms_last;		   /* that pass's duration */
	uint64_t pass_pages_cur;	   /* pages of the pass in progress */
	bool switchover;		   /* main: the completion stage began (VM stopped) */
	uint64_t switchover_ms;		   /* when it was seen (the clock given to px_insp_new) */
};

/* The clock the parser stamps passes and switchover with; tests pass their own. */
typedef uint64_t (*px_insp_clock_fn)(void);

/* now_ms NULL: vm_now_ms(). -ENOMEM only. */
int px_insp_new(px_insp_clock_fn now_ms, struct px_insp **ret);
void px_insp_free(struct px_insp *in);

/*
 * The next len bytes of the stream, in order. buf NULL: bytes that passed unseen, which is
 * allowed only for len <= what px_insp_plan() returned just before. Any split of the stream into
 * calls gives the same result.
 */
void px_insp_feed(struct px_insp *in, const uint8_t *buf, size_t len);
/*
 * How many of the next bytes may pass unseen (page data, or everything once bytes-only). 0: the
 * parser needs to see the next bytes; *want is how many it would like at once (>= 1).
 */
uint64_t px_insp_plan(struct px_insp *in, size_t *want);
void px_insp_read(const struct px_insp *in, struct px_insp_stats *out);
const char *px_insp_kind_str(enum px_insp_kind k);

struct px_insp_summary; /* px_node.h */
/*
 * Adds one connection's figures to its migration's (px_inspect_fold.c). live: the connection is
 * still carried, so its pass figures count towards the dirty-rate estimate.
 */
void px_insp_fold(struct px_insp_summary *sum, const struct px_insp_stats *st, bool live);
/*
 * After the last fold: how much RAM the stream still has to carry, where the stream can tell
 * (sum->remaining_known, remaining, remaining_from; px_node.h says when).
 */
void px_insp_estimate(struct px_insp_summary *sum);

/* The tap the data path calls (ctx is a struct px_insp). */
extern const struct xp_tap_ops px_insp_tap_ops;

#endif
