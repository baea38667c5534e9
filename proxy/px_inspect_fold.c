// SPDX-License-Identifier: Apache-2.0
/* The inspector's fold: one connection's px_insp_stats added to its migration's px_insp_summary,
 * the figures status and metrics read. The parser itself is px_inspect.c. */
#include <stdio.h>

#include "px_inspect.h"
#include "px_node.h"

/*
 * Adds one connection's inspector figures to a migration's. live: the connection is still carried,
 * so its pass figures count towards the dirty-rate estimate; ended ones only add their counters.
 */
void px_insp_fold(struct px_insp_summary *sum, const struct px_insp_stats *st, bool live)
{
	switch (st->kind) {
	case PX_INSP_MAIN:
		sum->main++;
		sum->stream_version = st->stream_version;
		if (st->machine[0])
			snprintf(sum->machine, sizeof(sum->machine), "%s", st->machine);
		break;
	case PX_INSP_MULTIFD:
		sum->multifd++;
		break;
	case PX_INSP_OTHER:
		sum->other++;
		break;
	default:
		break;
	}
	/* Parsing stops at switchover on purpose: device state has no framing to follow. */
	if (st->bytes_only && !st->switchover) {
		if (!sum->bytes_only++)
			snprintf(sum->reason, sizeof(sum->reason), "%s", st->reason);
	}
	if (st->page_size)
		sum->page_size = st->page_size;
	if (st->ram_total)
		sum->ram_total = st->ram_total;
	sum->pages += st->pages;
	sum->zero_pages += st->zero_pages;
	sum->packets += st->packets;
	sum->syncs += st->syncs;
	if (st->passes > sum->passes)
		sum->passes = st->passes;
	sum->switchover |= st->switchover;
	/* passes counts passes begun: from 3 on, the last completed one was a dirty-page pass. */
	if (live && st->passes >= 3 && st->pass_ms_last > 0) {
		uint64_t bytes = st->pass_pages_last * (st->page_size ? st->page_size : 4096);

		sum->dirty_known = true;
		sum->dirty_pages_per_pass += st->pass_pages_last;
		sum->dirty_rate += bytes * 1000 / st->pass_ms_last;
	}
}

void px_insp_estimate(struct px_insp_summary *sum)
{
	uint64_t page = sum->page_size ? sum->page_size : 4096, sent;

	sum->remaining_known = false;
	sum->remaining = 0;
	sum->remaining_from = NULL;
	/* A channel that stopped parsing no longer counts its pages: the sums fall short. */
	if (!sum->ram_total || sum->switchover || sum->bytes_only)
		return;
	if (sum->passes <= 1) {
		/* The first pass sends every page once, with its data or as a zero page. */
		sent = (sum->pages + sum->zero_pages) * page;
		sum->remaining = sent < sum->ram_total ? sum->ram_total - sent : 0;
		sum->remaining_from = "first-pass";
	} else if (sum->dirty_known) {
		sent = sum->dirty_pages_per_pass * page;
		sum->remaining = sent < sum->ram_total ? sent : sum->ram_total;
		sum->remaining_from = "last-pass";
	} else {
		/* The second pass: what the first let the guest dirty is not on the wire yet. */
		return;
	}
	sum->remaining_known = true;
}
