// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for the migration stream inspector: the input is a stream, fed whole, in
 * pieces cut where a hash of the input says, through a plan/feed pump like the data path's, and
 * a byte at a time. All must agree, and the counters must stay within what the bytes allow. */
#include <string.h>

#include "fuzz.h"
#include "px_inspect.h"

static uint64_t clock_calls;

/* A clock that depends only on how often it is read, so every split reads the same times. */
static uint64_t fake_clock(void)
{
	return 5000 + 7 * clock_calls++;
}

struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return r->s;
}

/* Piece lengths: mostly short, so that items straddle calls; sometimes long. */
static size_t rng_len(struct rng *r)
{
	uint64_t v = rng_next(r);

	switch (v & 3) {
	case 0:
		return 1;
	case 1:
		return 1 + (v >> 8) % 16;
	case 2:
		return 1 + (v >> 8) % 1400;
	default:
		return 1 + (v >> 8) % 70000;
	}
}

static struct px_insp *insp_new(void)
{
	struct px_insp *in = NULL;

	clock_calls = 0;
	FUZZ_CHECK(px_insp_new(fake_clock, &in) == 0 && in != NULL);
	return in;
}

static void finish(struct px_insp *in, struct px_insp_stats *st)
{
	size_t want = 0;
	uint64_t pass = px_insp_plan(in, &want);

	px_insp_read(in, st);
	/* Once bytes-only, everything may pass; while parsing, plan() says something useful. */
	FUZZ_CHECK(st->bytes_only == (pass == UINT64_MAX));
	if (pass == 0)
		FUZZ_CHECK(want >= 1);
	px_insp_free(in);
}

static void run_split(const uint8_t *data, size_t size, struct rng *r, struct px_insp_stats *st)
{
	struct px_insp *in = insp_new();
	size_t at = 0;

	while (at < size) {
		size_t n = rng_len(r);

		n = n < size - at ? n : size - at;
		px_insp_feed(in, data + at, n);
		at += n;
	}
	finish(in, st);
}

/* The data path: what plan() allows passes unseen, the rest is shown up to want at a time. */
static void run_pump(const uint8_t *data, size_t size, struct rng *r, struct px_insp_stats *st)
{
	struct px_insp *in = insp_new();
	size_t at = 0;

	while (at < size) {
		size_t want = 0, rest = size - at, cap = rng_len(r), n;
		uint64_t pass = px_insp_plan(in, &want);

		if (pass > 0) {
			n = pass < rest ? (size_t)pass : rest;
			n = n < cap ? n : cap;
			px_insp_feed(in, NULL, n);
		} else {
			FUZZ_CHECK(want >= 1);
			n = want < rest ? want : rest;
			n = n < cap ? n : cap;
			px_insp_feed(in, data + at, n);
		}
		at += n;
	}
	finish(in, st);
}

static void check_equal(const struct px_insp_stats *a, const struct px_insp_stats *b)
{
	FUZZ_CHECK(a->kind == b->kind);
	FUZZ_CHECK(a->bytes_only == b->bytes_only);
	FUZZ_CHECK(strcmp(a->reason, b->reason) == 0);
	FUZZ_CHECK(a->stream_version == b->stream_version);
	FUZZ_CHECK(strcmp(a->machine, b->machine) == 0);
	FUZZ_CHECK(a->channel_id == b->channel_id);
	FUZZ_CHECK(a->page_size == b->page_size);
	FUZZ_CHECK(a->ram_total == b->ram_total);
	FUZZ_CHECK(a->bytes == b->bytes);
	FUZZ_CHECK(a->pages == b->pages);
	FUZZ_CHECK(a->zero_pages == b->zero_pages);
	FUZZ_CHECK(a->packets == b->packets);
	FUZZ_CHECK(a->syncs == b->syncs);
	FUZZ_CHECK(a->sync_bytes_last == b->sync_bytes_last);
	FUZZ_CHECK(a->passes == b->passes);
	FUZZ_CHECK(a->pass_pages_last == b->pass_pages_last);
	FUZZ_CHECK(a->pass_ms_last == b->pass_ms_last);
	FUZZ_CHECK(a->pass_pages_cur == b->pass_pages_cur);
	FUZZ_CHECK(a->switchover == b->switchover);
	FUZZ_CHECK(a->switchover_ms == b->switchover_ms);
}

static void check_sane(const struct px_insp_stats *st, const uint8_t *data, size_t size)
{
	uint64_t all = st->pages + st->zero_pages;

	FUZZ_CHECK(st->bytes == size);
	FUZZ_CHECK(strnlen(st->reason, sizeof(st->reason)) < sizeof(st->reason));
	FUZZ_CHECK(strnlen(st->machine, sizeof(st->machine)) < sizeof(st->machine));
	FUZZ_CHECK(st->bytes_only == (st->reason[0] != '\0'));
	/* Every page costs at least its 8-byte offset or record word. */
	FUZZ_CHECK(all * 8 <= size);
	FUZZ_CHECK(st->syncs * 8 <= size);
	FUZZ_CHECK(st->sync_bytes_last <= size);
	FUZZ_CHECK(st->passes <= all);
	FUZZ_CHECK(st->pass_pages_cur <= all && st->pass_pages_last <= all);
	FUZZ_CHECK(st->pass_pages_cur + st->pass_pages_last <= all);
	FUZZ_CHECK(st->passes == 0 || st->pass_pages_cur >= 1);
	FUZZ_CHECK(st->page_size == 0 || (st->page_size >= 512 && st->page_size <= 512 * 1024 &&
					  (st->page_size & (st->page_size - 1)) == 0));
	switch (st->kind) {
	case PX_INSP_DETECTING:
		FUZZ_CHECK(size < 4 && !st->bytes_only);
		break;
	case PX_INSP_MAIN:
		FUZZ_CHECK(memcmp(data, "QEVM", 4) == 0);
		FUZZ_CHECK(st->packets == 0 && st->channel_id == -1);
		/* A RAM total is whole pages, and needs its 8-byte word after the header. */
		FUZZ_CHECK((st->ram_total & 4095) == 0);
		FUZZ_CHECK(st->ram_total == 0 || size >= 8 + 17 + 8);
		break;
	case PX_INSP_MULTIFD:
		FUZZ_CHECK(memcmp(data, "\x11\x22\x33\x44", 4) == 0);
		FUZZ_CHECK(st->packets * 276 <= size);
		FUZZ_CHECK(!st->switchover && st->machine[0] == '\0' && st->ram_total == 0);
		FUZZ_CHECK(st->channel_id == -1 || (size >= 64 && st->channel_id == data[24]));
		break;
	case PX_INSP_OTHER:
		FUZZ_CHECK(st->bytes_only && all == 0 && st->syncs == 0);
		break;
	default:
		FUZZ_CHECK(!"kind out of range");
	}
	FUZZ_CHECK(strcmp(px_insp_kind_str(st->kind), "unknown") != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct px_insp_stats whole, other;
	struct px_insp *in;
	struct rng r = { .s = 0x9e3779b97f4a7c15ull };

	/* The cut positions come from the input itself (FNV-1a), so a crash replays exactly. */
	for (size_t i = 0; i < size; i++)
		r.s = (r.s ^ data[i]) * 0x100000001b3ull;
	r.s |= 1;

	in = insp_new();
	px_insp_feed(in, data, size);
	finish(in, &whole);
	check_sane(&whole, data, size);

	for (int i = 0; i < 2; i++) {
		run_split(data, size, &r, &other);
		check_equal(&whole, &other);
		run_pump(data, size, &r, &other);
		check_equal(&whole, &other);
	}
	if (size <= 4096) {
		in = insp_new();
		for (size_t i = 0; i < size; i++)
			px_insp_feed(in, data + i, 1);
		finish(in, &other);
		check_equal(&whole, &other);
	}
	return 0;
}
