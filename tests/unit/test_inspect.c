// SPDX-License-Identifier: Apache-2.0
/* Unit tests for the migration stream inspector (proxy/px_inspect.h): hand-built multifd and
 * main-channel streams in the 7.2 and 9.x/10.x layouts, and captured QEMU main channels (the fuzz
 * seeds), fed whole, a byte at a time and through a plan/feed pump like the data path's; garbage
 * of several kinds; the progress estimate. No I/O but reading the seeds, a fake clock. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_inspect.h"
#include "px_node.h"

/* ---- a stream under construction ---- */

struct wb {
	uint8_t *d;
	size_t n, cap;
};

static void wb_need(struct wb *w, size_t n)
{
	if (w->n + n <= w->cap)
		return;
	while (w->n + n > w->cap)
		w->cap = w->cap ? 2 * w->cap : 4096;
	w->d = realloc(w->d, w->cap);
	assert_non_null(w->d);
}

static void put8(struct wb *w, uint8_t v)
{
	wb_need(w, 1);
	w->d[w->n++] = v;
}

static void put16(struct wb *w, uint16_t v)
{
	put8(w, v >> 8);
	put8(w, v);
}

static void put32(struct wb *w, uint32_t v)
{
	put16(w, v >> 16);
	put16(w, v);
}

static void put64(struct wb *w, uint64_t v)
{
	put32(w, v >> 32);
	put32(w, v);
}

static void putmem(struct wb *w, const void *p, size_t n)
{
	wb_need(w, n);
	memcpy(w->d + w->n, p, n);
	w->n += n;
}

/* n bytes of a recognisable pattern (page data that must never be parsed). */
static void putfill(struct wb *w, size_t n)
{
	wb_need(w, n);
	for (size_t i = 0; i < n; i++)
		w->d[w->n++] = (uint8_t)(0x11 * (i % 15) + 3);
}

/* ---- multifd ---- */

#define MFD_MAGIC 0x11223344u

static void mfd_init(struct wb *w, uint8_t id, uint32_t version)
{
	uint8_t uuid[16] = { 1, 2, 3, 4 };

	put32(w, MFD_MAGIC);
	put32(w, version);
	putmem(w, uuid, sizeof(uuid));
	put8(w, id);
	for (int i = 0; i < 7 + 32; i++)
		put8(w, 0);
}

struct mfd_pkt {
	uint32_t flags, pages_alloc, normal, zero;
	uint32_t size; /* next_packet_size; UINT32_MAX: normal * page size */
	const char *block;
	const uint64_t *offs; /* normal + zero offsets */
	uint32_t data;	      /* payload bytes actually written; UINT32_MAX: size */
	bool hdr_only;	      /* 9.2+ SYNC: pages_alloc written as 0, offsets still sent */
};

static void mfd_packet(struct wb *w, const struct mfd_pkt *p)
{
	uint32_t pa = p->pages_alloc ? p->pages_alloc : 128;
	uint32_t size = p->size == UINT32_MAX ? p->normal * (512 * 1024 / pa) : p->size;
	char block[256] = { 0 };
	static uint64_t packet_num;

	put32(w, MFD_MAGIC);
	put32(w, 1);
	put32(w, p->flags);
	put32(w, p->hdr_only ? 0 : pa);
	put32(w, p->normal);
	put32(w, size);
	put64(w, packet_num++);
	put32(w, p->zero);
	put32(w, 0);
	for (int i = 0; i < 3; i++)
		put64(w, 0);
	if (p->block)
		strncpy(block, p->block, sizeof(block) - 1);
	putmem(w, block, sizeof(block));
	for (uint32_t i = 0; i < pa; i++)
		put64(w, i < p->normal + p->zero && p->offs ? p->offs[i] : 0);
	putfill(w, p->data == UINT32_MAX ? size : p->data);
}

static void mfd_devstate(struct wb *w, uint32_t size)
{
	char idstr[256] = "0000:00:02.0/vfio";

	put32(w, MFD_MAGIC);
	put32(w, 1);
	put32(w, 0x40);
	putmem(w, idstr, sizeof(idstr));
	put32(w, 0);
	put32(w, size);
	putfill(w, size);
}

/* ---- main channel ---- */

#define RAM_ID 2

static void main_header(struct wb *w, const char *machine)
{
	put32(w, 0x5145564d);
	put32(w, 3);
	put8(w, 0x07);
	put32(w, strlen(machine));
	putmem(w, machine, strlen(machine));
}

static void idstr(struct wb *w, const char *s)
{
	put8(w, strlen(s));
	putmem(w, s, strlen(s));
}

static void section_start(struct wb *w, uint32_t id, const char *name, uint32_t version)
{
	put8(w, 0x01);
	put32(w, id);
	idstr(w, name);
	put32(w, 0);
	put32(w, version);
}

static void footer(struct wb *w, uint32_t id)
{
	put8(w, 0x7e);
	put32(w, id);
}

/* The setup a 7.2 source writes: commands, other sections' noise, the ram section. */
static void main_setup(struct wb *w, bool flush)
{
	/* configuration/target-page-bits-like noise, then OPEN_RETURN_PATH, then ram. */
	put8(w, 0x05);
	idstr(w, "configuration/capabilities");
	put32(w, 1);
	put32(w, 0);
	put8(w, 0x08);
	put16(w, 1);
	put16(w, 0);
	section_start(w, RAM_ID, "ram", 4);
	put64(w, (64u << 20) | 0x4);
	idstr(w, "pc.ram");
	put64(w, 64u << 20);
	idstr(w, "pc.bios");
	put64(w, 256u << 10);
	if (flush)
		put64(w, 0x200);
	put64(w, 0x10);
	footer(w, RAM_ID);
}

static void ram_rec(struct wb *w, uint64_t off, uint32_t flags, const char *block)
{
	put64(w, off | flags | (block ? 0 : 0x20));
	if (block)
		idstr(w, block);
	if (flags == 0x2)
		put8(w, 0);
	else if (flags == 0x8)
		putfill(w, 4096);
}

static void part(struct wb *w, uint8_t type, uint32_t id)
{
	put8(w, type);
	put32(w, id);
}

static void eos(struct wb *w)
{
	put64(w, 0x10);
	footer(w, RAM_ID);
}

/* ---- running the inspector ---- */

static uint64_t clock_calls;

/* Each reading is 100 ms after the last, so that durations depend only on the parse. */
static uint64_t fake_clock(void)
{
	return 1000 + 100 * clock_calls++;
}

static struct px_insp *insp_new(void)
{
	struct px_insp *in;

	clock_calls = 0;
	assert_int_equal(px_insp_new(fake_clock, &in), 0);
	return in;
}

static void run_whole(const struct wb *w, struct px_insp_stats *st)
{
	struct px_insp *in = insp_new();

	px_insp_feed(in, w->d, w->n);
	px_insp_read(in, st);
	px_insp_free(in);
}

static void run_bytewise(const struct wb *w, struct px_insp_stats *st)
{
	struct px_insp *in = insp_new();

	for (size_t i = 0; i < w->n; i++)
		px_insp_feed(in, w->d + i, 1);
	px_insp_read(in, st);
	px_insp_free(in);
}

/*
 * As the data path does it: bytes plan() lets pass go by unseen (buf NULL), the rest is shown
 * want bytes at a time. Returns how many bytes the inspector saw.
 */
static size_t run_pump(const struct wb *w, size_t cap, struct px_insp_stats *st)
{
	struct px_insp *in = insp_new();
	size_t at = 0, seen = 0;

	while (at < w->n) {
		size_t want = 0, rest = w->n - at, n;
		uint64_t pass = px_insp_plan(in, &want);

		if (pass > 0) {
			n = pass < rest ? pass : rest;
			px_insp_feed(in, NULL, n);
		} else {
			assert_true(want >= 1);
			n = want < rest ? want : rest;
			n = n < cap ? n : cap;
			px_insp_feed(in, w->d + at, n);
			seen += n;
		}
		at += n;
	}
	px_insp_read(in, st);
	px_insp_free(in);
	return seen;
}

static void assert_stats_equal(const struct px_insp_stats *a, const struct px_insp_stats *b)
{
	assert_int_equal(a->kind, b->kind);
	assert_int_equal(a->bytes_only, b->bytes_only);
	assert_string_equal(a->reason, b->reason);
	assert_int_equal(a->stream_version, b->stream_version);
	assert_string_equal(a->machine, b->machine);
	assert_int_equal(a->channel_id, b->channel_id);
	assert_int_equal(a->page_size, b->page_size);
	assert_int_equal(a->ram_total, b->ram_total);
	assert_int_equal(a->bytes, b->bytes);
	assert_int_equal(a->pages, b->pages);
	assert_int_equal(a->zero_pages, b->zero_pages);
	assert_int_equal(a->packets, b->packets);
	assert_int_equal(a->syncs, b->syncs);
	assert_int_equal(a->sync_bytes_last, b->sync_bytes_last);
	assert_int_equal(a->passes, b->passes);
	assert_int_equal(a->pass_pages_last, b->pass_pages_last);
	assert_int_equal(a->pass_ms_last, b->pass_ms_last);
	assert_int_equal(a->pass_pages_cur, b->pass_pages_cur);
	assert_int_equal(a->switchover, b->switchover);
	assert_int_equal(a->switchover_ms, b->switchover_ms);
}

/* Feeds w every way there is and checks that all agree; st gets the answer. */
static void run_all(const struct wb *w, struct px_insp_stats *st)
{
	struct px_insp_stats b;
	size_t caps[] = { 1, 7, 13, 4096, SIZE_MAX };

	run_whole(w, st);
	assert_int_equal(st->bytes, w->n);
	run_bytewise(w, &b);
	assert_stats_equal(st, &b);
	for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
		run_pump(w, caps[i], &b);
		assert_stats_equal(st, &b);
	}
}

/* ---- tests ---- */

static void test_fresh(void **state)
{
	struct px_insp *in = insp_new();
	struct px_insp_stats st;
	size_t want = 0;

	(void)state;
	px_insp_read(in, &st);
	assert_int_equal(st.kind, PX_INSP_DETECTING);
	assert_false(st.bytes_only);
	assert_string_equal(st.reason, "");
	assert_int_equal(st.channel_id, -1);
	assert_int_equal(st.page_size, 0);
	assert_int_equal(st.bytes, 0);
	assert_int_equal(px_insp_plan(in, &want), 0);
	assert_int_equal(want, 4);
	px_insp_feed(in, (const uint8_t *)"QE", 2);
	assert_int_equal(px_insp_plan(in, &want), 0);
	assert_int_equal(want, 2);
	px_insp_read(in, &st);
	assert_int_equal(st.kind, PX_INSP_DETECTING);
	assert_int_equal(st.bytes, 2);
	px_insp_free(in);
	px_insp_free(NULL);

	assert_string_equal(px_insp_kind_str(PX_INSP_DETECTING), "detecting");
	assert_string_equal(px_insp_kind_str(PX_INSP_MAIN), "main");
	assert_string_equal(px_insp_kind_str(PX_INSP_MULTIFD), "multifd");
	assert_string_equal(px_insp_kind_str(PX_INSP_OTHER), "other");
	assert_non_null(px_insp_tap_ops.plan);
	assert_non_null(px_insp_tap_ops.feed);
}

static void test_tap_ops(void **state)
{
	struct px_insp *in = insp_new();
	struct px_insp_stats st;
	uint8_t b[4] = { 0x16, 0x03, 0x01, 0x02 };
	size_t want = 0;

	(void)state;
	assert_int_equal(px_insp_tap_ops.plan(in, &want), 0);
	assert_int_equal(want, 4);
	px_insp_tap_ops.feed(in, b, sizeof(b));
	assert_int_equal(px_insp_tap_ops.plan(in, &want), UINT64_MAX);
	px_insp_read(in, &st);
	assert_int_equal(st.kind, PX_INSP_OTHER);
	px_insp_free(in);
}

static const uint64_t seq_offs[128] = {
#define O(i) ((uint64_t)(i)*4096)
	O(0), O(1), O(2), O(3), O(4), O(5), O(6), O(7), O(8), O(9), O(10), O(11), O(12), O(13),
};

static uint64_t offs_buf[512];

static const uint64_t *offs_from(uint64_t first_page, uint32_t n)
{
	static unsigned int slot;
	uint64_t *o = offs_buf + 128 * (slot++ % 4);

	for (uint32_t i = 0; i < n; i++)
		o[i] = (first_page + i) * 4096;
	return o;
}

static void test_multifd_72(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;
	struct px_insp *in;
	size_t want = 0, seen, sync1_end, sync2_end;

	(void)state;
	mfd_init(&w, 3, 1);
	/* A full packet of pc.ram pages 0..127. */
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 128,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = offs_from(0, 128),
					  .data = UINT32_MAX });
	/* 7.2 may OR SYNC into a packet that carries pages. */
	mfd_packet(&w, &(struct mfd_pkt){ .flags = 0x1,
					  .normal = 10,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = offs_from(128, 10),
					  .data = UINT32_MAX });
	sync1_end = w.n - 10 * 4096;
	/* ... and send an empty packet. */
	mfd_packet(&w, &(struct mfd_pkt){ .size = UINT32_MAX, .data = UINT32_MAX });
	/* A later block: higher ordinal, so offset 0 is not a wrap. */
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 2,
					  .size = UINT32_MAX,
					  .block = "pc.bios",
					  .offs = seq_offs,
					  .data = UINT32_MAX });
	/* pc.ram again from the start: the scan wrapped. */
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 5,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = offs_from(3, 5),
					  .data = UINT32_MAX });
	/* 7.2 leaves the last packet's next_packet_size in an empty one; no data follows. */
	mfd_packet(&w, &(struct mfd_pkt){ .flags = 0x1, .size = 5 * 4096, .data = 0 });
	sync2_end = w.n;

	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_MULTIFD);
	assert_false(st.bytes_only);
	assert_string_equal(st.reason, "");
	assert_int_equal(st.stream_version, 1);
	assert_int_equal(st.channel_id, 3);
	assert_int_equal(st.page_size, 4096);
	assert_int_equal(st.bytes, w.n);
	assert_int_equal(st.pages, 128 + 10 + 2 + 5);
	assert_int_equal(st.zero_pages, 0);
	assert_int_equal(st.packets, 6);
	assert_int_equal(st.syncs, 2);
	assert_int_equal(st.sync_bytes_last, sync2_end - sync1_end);
	assert_int_equal(st.passes, 2);
	assert_int_equal(st.pass_pages_last, 140);
	assert_int_equal(st.pass_pages_cur, 5);
	/* The clock was read at the first page and at the wrap: 100 ms apart. */
	assert_int_equal(st.pass_ms_last, 100);
	assert_false(st.switchover);

	/* The pump shows the inspector only the headers (and the init), never a page. */
	seen = run_pump(&w, SIZE_MAX, &st);
	assert_int_equal(seen, 64 + 6 * 1344);

	/* plan() while in a header asks for exactly the rest of it. */
	in = insp_new();
	px_insp_feed(in, w.d, 64 + 100);
	assert_int_equal(px_insp_plan(in, &want), 0);
	/* pages_alloc is not known yet: up to the fixed part first. */
	assert_int_equal(want, 320 - 100);
	px_insp_feed(in, w.d + 164, 300);
	assert_int_equal(px_insp_plan(in, &want), 0);
	assert_int_equal(want, 1344 - 400);
	px_insp_feed(in, w.d + 464, 944);
	assert_int_equal(px_insp_plan(in, &want), 128 * 4096);
	px_insp_feed(in, NULL, 4096);
	assert_int_equal(px_insp_plan(in, &want), 127 * 4096);
	px_insp_free(in);
	free(w.d);
}

static void test_multifd_10(void **state)
{
	/* 9.0+ zero-page detection swaps zero pages to the end: offsets out of order. */
	static const uint64_t mixed[] = { 0, 8192, 16384, 12288, 4096 };
	static const uint64_t mixed2[] = { 20480, 28672, 24576 };
	struct wb w = { 0 };
	struct px_insp_stats st;
	size_t sync_end;

	(void)state;
	mfd_init(&w, 0, 1);
	/* 9.2+ fills only the header of a SYNC packet: pages_alloc 0, the first thing sent. */
	mfd_packet(&w, &(struct mfd_pkt){ .flags = 0x1, .size = 0, .data = 0, .hdr_only = true });
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 3,
					  .zero = 2,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = mixed,
					  .data = UINT32_MAX });
	/* VFIO device state (10.0+): opaque, not pages. */
	mfd_devstate(&w, 1000);
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 2,
					  .zero = 1,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = mixed2,
					  .data = UINT32_MAX });
	/* zstd: next_packet_size is the compressed size; pages count as normal pages. */
	mfd_packet(&w, &(struct mfd_pkt){ .flags = 0x4,
					  .normal = 4,
					  .size = 777,
					  .block = "pc.ram",
					  .offs = offs_from(8, 4),
					  .data = UINT32_MAX });
	mfd_devstate(&w, 0);
	mfd_packet(&w, &(struct mfd_pkt){ .flags = 0x1, .size = 0, .data = 0, .hdr_only = true });
	sync_end = w.n;
	/* All zero pages, from the start again: a wrap judged on the packet as a whole. */
	mfd_packet(&w, &(struct mfd_pkt){ .zero = 3,
					  .size = 0,
					  .block = "pc.ram",
					  .offs = offs_from(0, 3),
					  .data = UINT32_MAX });

	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_MULTIFD);
	assert_false(st.bytes_only);
	assert_int_equal(st.channel_id, 0);
	assert_int_equal(st.pages, 3 + 2 + 4);
	assert_int_equal(st.zero_pages, 2 + 1 + 3);
	assert_int_equal(st.packets, 8);
	assert_int_equal(st.syncs, 2);
	assert_int_equal(st.sync_bytes_last, sync_end - (64 + 1344));
	assert_int_equal(st.passes, 2);
	assert_int_equal(st.pass_pages_last, 5 + 3 + 4);
	assert_int_equal(st.pass_pages_cur, 3);
	assert_int_equal(st.bytes, w.n);
	free(w.d);
}

static void test_multifd_16k_pages(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;

	(void)state;
	mfd_init(&w, 1, 1);
	mfd_packet(&w, &(struct mfd_pkt){ .pages_alloc = 32,
					  .normal = 3,
					  .size = UINT32_MAX,
					  .block = "mach-virt.ram",
					  .offs = seq_offs,
					  .data = UINT32_MAX });
	run_all(&w, &st);
	assert_false(st.bytes_only);
	assert_int_equal(st.page_size, 16384);
	assert_int_equal(st.pages, 3);
	assert_int_equal(st.bytes, 64 + 320 + 32 * 8 + 3 * 16384);
	free(w.d);
}

/* One multifd stream that goes wrong after a good packet; reason must contain want. */
static void check_multifd_bad(const struct mfd_pkt *bad, const char *want)
{
	struct wb w = { 0 };
	struct px_insp_stats st;
	struct px_insp *in;
	size_t dummy;

	mfd_init(&w, 2, 1);
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 1,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = seq_offs,
					  .data = UINT32_MAX });
	mfd_packet(&w, bad);
	putfill(&w, 5000);
	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_MULTIFD);
	assert_true(st.bytes_only);
	if (!strstr(st.reason, want))
		fail_msg("reason \"%s\" lacks \"%s\"", st.reason, want);
	assert_int_equal(st.pages, 1);
	assert_int_equal(st.packets, 1);
	assert_int_equal(st.bytes, w.n);

	in = insp_new();
	px_insp_feed(in, w.d, w.n);
	assert_int_equal(px_insp_plan(in, &dummy), UINT64_MAX);
	px_insp_feed(in, NULL, 12345);
	px_insp_read(in, &st);
	assert_int_equal(st.bytes, w.n + 12345);
	px_insp_free(in);
	free(w.d);
}

static void test_multifd_garbage(void **state)
{
	(void)state;
	check_multifd_bad(&(struct mfd_pkt){ .pages_alloc = 3, .size = 0 }, "pages_alloc 3");
	/* Only a SYNC packet may leave pages_alloc 0. */
	check_multifd_bad(&(struct mfd_pkt){ .size = 0, .hdr_only = true }, "pages_alloc 0");
	check_multifd_bad(&(struct mfd_pkt){ .pages_alloc = 2048, .size = 0 }, "pages_alloc 2048");
	check_multifd_bad(&(struct mfd_pkt){ .pages_alloc = 64, .size = 0 },
			  "pages_alloc 64 after");
	check_multifd_bad(&(struct mfd_pkt){ .normal = 129, .size = 0 }, "129 normal pages");
	check_multifd_bad(&(struct mfd_pkt){ .normal = 100, .zero = 29, .size = 100 * 4096 },
			  "29 zero");
	check_multifd_bad(&(struct mfd_pkt){ .normal = 2, .size = 4096 }, "next_packet_size 4096");
	check_multifd_bad(&(struct mfd_pkt){ .flags = 0x2, .normal = 2, .size = 65u << 20 },
			  "next_packet_size");
	check_multifd_bad(&(struct mfd_pkt){ .flags = 0x80, .size = 0 },
			  "unknown packet flags 0x80");
	check_multifd_bad(&(struct mfd_pkt){ .size = 65u << 20 },
			  "next_packet_size 68157440 for no");
}

static void test_multifd_bad_magic(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;
	char want[80];
	size_t at;

	(void)state;
	/* A packet cut short, then the next one: its magic lands where data was expected. */
	mfd_init(&w, 0, 1);
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 2,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = seq_offs,
					  .data = 4096 });
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 2,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = seq_offs + 2,
					  .data = UINT32_MAX });
	at = 64 + 1344 + 8192;
	putfill(&w, 3000);
	run_all(&w, &st);
	assert_true(st.bytes_only);
	snprintf(want, sizeof(want), "multifd: bad packet magic 0x%02x%02x%02x%02x at byte %zu",
		 w.d[at], w.d[at + 1], w.d[at + 2], w.d[at + 3], at);
	assert_string_equal(st.reason, want);
	assert_int_equal(st.pages, 2);
	assert_int_equal(st.bytes, w.n);
	free(w.d);

	/* Init with a version other than 1. */
	w = (struct wb){ 0 };
	mfd_init(&w, 0, 2);
	putfill(&w, 100);
	run_all(&w, &st);
	assert_true(st.bytes_only);
	assert_string_equal(st.reason, "multifd: init version 2, expected 1");
	assert_int_equal(st.channel_id, -1);
	free(w.d);
}

static void test_truncated(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st, b;
	struct px_insp *in;

	(void)state;
	mfd_init(&w, 5, 1);
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 3,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = seq_offs,
					  .data = UINT32_MAX });
	mfd_packet(&w, &(struct mfd_pkt){ .normal = 3,
					  .size = UINT32_MAX,
					  .block = "pc.ram",
					  .offs = seq_offs + 3,
					  .data = UINT32_MAX });
	/* Every prefix parses without harm and says as much as it can. */
	for (size_t cut = 0; cut <= w.n; cut += cut < 1500 ? 1 : 997) {
		struct wb p = { .d = w.d, .n = cut };

		run_whole(&p, &st);
		run_pump(&p, 13, &b);
		assert_stats_equal(&st, &b);
		assert_int_equal(st.bytes, cut);
		assert_false(st.bytes_only);
		assert_int_equal(st.kind, cut < 4 ? PX_INSP_DETECTING : PX_INSP_MULTIFD);
		assert_int_equal(st.channel_id, cut < 64 ? -1 : 5);
		assert_int_equal(st.pages, cut < 64 + 1344		    ? 0
					   : cut < 2 * 1344 + 64 + 3 * 4096 ? 3
									    : 6);
	}
	/* Bytes said to pass unseen where the parser needed them: it stops, and says so. */
	in = insp_new();
	px_insp_feed(in, w.d, 100);
	px_insp_feed(in, NULL, 50);
	px_insp_read(in, &st);
	assert_true(st.bytes_only);
	assert_string_equal(st.reason, "bytes passed unseen at byte 100");
	assert_int_equal(st.bytes, 150);
	px_insp_free(in);
	free(w.d);
}

static void test_other(void **state)
{
	static const uint8_t tls[] = { 0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc };
	struct wb w = { 0 };
	struct px_insp_stats st;

	(void)state;
	putmem(&w, tls, sizeof(tls));
	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_OTHER);
	assert_true(st.bytes_only);
	assert_string_equal(st.reason, "unrecognised stream start 16 03 01 02");
	assert_int_equal(st.bytes, sizeof(tls));
	assert_int_equal(st.channel_id, -1);
	free(w.d);
}

/* The main-channel stream of a 7.2 source without multifd, up to switchover and beyond. */
static void main_72(struct wb *w)
{
	main_header(w, "pc-q35-7.2");
	main_setup(w, false);
	/* Iteration 1: ZERO naming pc.ram, PAGE and ZERO continuing, PAGE naming pc.bios. */
	part(w, 0x02, RAM_ID);
	ram_rec(w, 0, 0x2, "pc.ram");
	ram_rec(w, 4096, 0x8, NULL);
	ram_rec(w, 8192, 0x2, NULL);
	ram_rec(w, 0, 0x8, "pc.bios");
	eos(w);
	/* A PING command between sections. */
	put8(w, 0x08);
	put16(w, 2);
	put16(w, 4);
	put32(w, 1);
	/* Iteration 2 starts over at pc.ram 0: the scan wrapped. XBZRLE and compressed pages. */
	part(w, 0x02, RAM_ID);
	ram_rec(w, 0, 0x8, "pc.ram");
	put64(w, 4096 | 0x40 | 0x20);
	put8(w, 1);
	put16(w, 5);
	putfill(w, 5);
	put64(w, 8192 | 0x100 | 0x20);
	put32(w, 7);
	putfill(w, 7);
	eos(w);
	/* Completion: the last pages in SECTION_END. */
	part(w, 0x03, RAM_ID);
	ram_rec(w, 12288, 0x8, NULL);
	ram_rec(w, 16384, 0x2, NULL);
	eos(w);
}

static void test_main_72(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;
	size_t at_end;

	(void)state;
	main_72(&w);
	at_end = w.n;

	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_MAIN);
	assert_false(st.bytes_only);
	assert_string_equal(st.reason, "");
	assert_string_equal(st.machine, "pc-q35-7.2");
	assert_int_equal(st.stream_version, 3);
	assert_int_equal(st.channel_id, -1);
	assert_int_equal(st.page_size, 4096);
	assert_int_equal(st.ram_total, 64u << 20);
	assert_int_equal(st.pages, 2 + 3 + 1);
	assert_int_equal(st.zero_pages, 2 + 1);
	assert_int_equal(st.packets, 0);
	/* Setup's EOS and three more. */
	assert_int_equal(st.syncs, 4);
	/* From the EOS word of iteration 2 to the last: footer, END header, PAGE, ZERO, EOS. */
	assert_int_equal(st.sync_bytes_last, 5 + 5 + 4104 + 9 + 8);
	assert_int_equal(st.passes, 2);
	assert_int_equal(st.pass_pages_last, 4);
	assert_int_equal(st.pass_pages_cur, 5);
	assert_int_equal(st.pass_ms_last, 100);
	assert_true(st.switchover);
	assert_int_equal(st.switchover_ms, 1200);

	/* Device state follows: parsing stops, as it should, and counting goes on. */
	put8(&w, 0x04);
	put32(&w, 3);
	idstr(&w, "timer");
	put32(&w, 0);
	put32(&w, 2);
	putfill(&w, 300);
	put8(&w, 0x00);
	run_all(&w, &st);
	assert_true(st.bytes_only);
	assert_string_equal(st.reason, "switchover: device state follows");
	assert_true(st.switchover);
	assert_int_equal(st.pages, 6);
	assert_int_equal(st.zero_pages, 3);
	assert_int_equal(st.bytes, w.n);
	assert_true(w.n > at_end);
	free(w.d);
}

static void test_main_pump(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;
	struct px_insp *in;
	size_t want = 0, seen;

	(void)state;
	main_72(&w);
	/*
	 * Shown a byte at a time, the inspector lets every payload pass unseen: four pages, the
	 * XBZRLE and compressed data and the PING's argument.
	 */
	seen = run_pump(&w, 1, &st);
	assert_int_equal(seen, w.n - 4 * 4096 - 5 - 7 - 4);
	assert_int_equal(st.pages, 6);

	/* Outside a payload the main channel asks for big chunks. */
	in = insp_new();
	px_insp_feed(in, w.d, 8);
	assert_int_equal(px_insp_plan(in, &want), 0);
	assert_int_equal(want, 64 * 1024);
	px_insp_free(in);
	free(w.d);
}

/* 8.1+ per-round mode, a 10.0 machine: MULTIFD_FLUSH, SWITCHOVER_START, no configuration. */
static void test_main_flush(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;

	(void)state;
	put32(&w, 0x5145564d);
	put32(&w, 3);
	/* No configuration section: the ram section start comes straight away. */
	main_setup(&w, true);
	part(&w, 0x02, RAM_ID);
	ram_rec(&w, 0, 0x2, "pc.ram");
	ram_rec(&w, 4096, 0x2, NULL);
	put64(&w, 0x200);
	eos(&w);
	part(&w, 0x02, RAM_ID);
	put64(&w, 0x200);
	eos(&w);
	/* SWITCHOVER_START: the VM stopped; the ram END still carries pages. */
	put8(&w, 0x08);
	put16(&w, 11);
	put16(&w, 0);
	part(&w, 0x03, RAM_ID);
	ram_rec(&w, 0, 0x8, "pc.ram");
	eos(&w);
	part(&w, 0x03, 9);
	putfill(&w, 100);

	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_MAIN);
	assert_string_equal(st.machine, "");
	assert_true(st.bytes_only);
	assert_string_equal(st.reason, "switchover: device state follows");
	assert_true(st.switchover);
	/* Setup FLUSH + EOS, then FLUSH + EOS twice, then EOS. */
	assert_int_equal(st.syncs, 7);
	assert_int_equal(st.zero_pages, 2);
	assert_int_equal(st.pages, 1);
	assert_int_equal(st.passes, 2);
	assert_int_equal(st.pass_pages_last, 2);
	assert_int_equal(st.pass_pages_cur, 1);
	free(w.d);
}

/* Main streams that go wrong before switchover: each stops with its reason. */
static void check_main_bad(void (*tail)(struct wb *w), const char *want)
{
	struct wb w = { 0 };
	struct px_insp_stats st;

	main_header(&w, "pc-i440fx-7.2");
	main_setup(&w, false);
	part(&w, 0x02, RAM_ID);
	ram_rec(&w, 0, 0x2, "pc.ram");
	tail(&w);
	putfill(&w, 77);
	run_all(&w, &st);
	assert_int_equal(st.kind, PX_INSP_MAIN);
	assert_true(st.bytes_only);
	assert_false(st.switchover);
	if (!strstr(st.reason, want))
		fail_msg("reason \"%s\" lacks \"%s\"", st.reason, want);
	assert_int_equal(st.zero_pages, 1);
	assert_int_equal(st.bytes, w.n);
	free(w.d);
}

static void tail_other_section(struct wb *w)
{
	eos(w);
	part(w, 0x02, 5);
}

static void tail_mem_size(struct wb *w)
{
	put64(w, 0x4);
}

static void tail_hook(struct wb *w)
{
	put64(w, 0x80 | 0x20);
}

static void tail_bad_footer(struct wb *w)
{
	put64(w, 0x10);
	footer(w, RAM_ID + 1);
}

static void tail_eof(struct wb *w)
{
	eos(w);
	put8(w, 0x00);
}

static void tail_full(struct wb *w)
{
	eos(w);
	section_start(w, 7, "dirty-bitmap", 1);
}

static void tail_unknown(struct wb *w)
{
	eos(w);
	put8(w, 0x42);
}

static void tail_eos_continue(struct wb *w)
{
	put64(w, 0x10 | 0x20);
}

static void tail_xbzrle_enc(struct wb *w)
{
	put64(w, 0x40 | 0x20);
	put8(w, 2);
	put16(w, 0);
}

static void test_main_garbage(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;

	(void)state;
	check_main_bad(tail_other_section,
		       "main: unknown section id 5 (not ram), parsing stopped at byte ");
	check_main_bad(tail_mem_size, "RAM record flags 0x4");
	check_main_bad(tail_hook, "RAM record flags 0xa0");
	check_main_bad(tail_bad_footer, "bad ram section footer");
	check_main_bad(tail_eof, "EOF record");
	check_main_bad(tail_full, "SECTION_START after ram setup");
	check_main_bad(tail_unknown, "unknown record type 0x42");
	check_main_bad(tail_eos_continue, "RAM record word 0x30");
	check_main_bad(tail_xbzrle_enc, "XBZRLE encoding 2");

	/* Version 4 of the file format. */
	put32(&w, 0x5145564d);
	put32(&w, 4);
	putfill(&w, 30);
	run_all(&w, &st);
	assert_true(st.bytes_only);
	assert_string_equal(st.reason, "main: stream version 4, expected 3");
	free(w.d);

	/* A CONTINUE record before any block was named. */
	w = (struct wb){ 0 };
	main_header(&w, "pc");
	main_setup(&w, false);
	part(&w, 0x02, RAM_ID);
	ram_rec(&w, 0, 0x2, NULL);
	run_all(&w, &st);
	assert_true(st.bytes_only);
	assert_non_null(strstr(st.reason, "continues no block"));
	free(w.d);

	/* A long machine name is cut to fit; odd bytes in it are made printable. */
	w = (struct wb){ 0 };
	main_header(&w, "pc-q35-7.2-with-a-very-long-name-\x01-that-goes-on-and-on-and-on");
	main_setup(&w, false);
	run_all(&w, &st);
	assert_false(st.bytes_only);
	assert_string_equal(st.machine, "pc-q35-7.2-with-a-very-long-name-?-that-goes-on");
	assert_int_equal(st.syncs, 1);
	free(w.d);

	/* No ram section at all within the scan limit. */
	w = (struct wb){ 0 };
	main_header(&w, "pc");
	wb_need(&w, 1100000);
	memset(w.d + w.n, 0, 1100000);
	w.n += 1100000;
	run_whole(&w, &st);
	assert_true(st.bytes_only);
	assert_non_null(strstr(st.reason, "no ram section start"));
	assert_int_equal(st.bytes, w.n);
	free(w.d);
}

static void test_block_overflow(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;
	char name[16];

	(void)state;
	main_header(&w, "pc");
	main_setup(&w, false);
	part(&w, 0x02, RAM_ID);
	for (int i = 0; i < 20; i++) {
		snprintf(name, sizeof(name), "blk%d", i);
		ram_rec(&w, 0, 0x2, name);
		ram_rec(&w, 4096, 0x2, NULL);
	}
	ram_rec(&w, 0, 0x2, "blk0");
	eos(&w);
	run_all(&w, &st);
	/* Passes stop at the 17th block; parsing goes on. */
	assert_false(st.bytes_only);
	assert_int_equal(st.zero_pages, 41);
	assert_int_equal(st.passes, 1);
	assert_int_equal(st.pass_pages_cur, 32);
	assert_int_equal(st.syncs, 2);
	free(w.d);
}

struct reader {
	struct px_insp *in;
	_Atomic int done;
	unsigned long reads;
	bool ok;
};

/* The setup's first word is not total | MEM_SIZE: the total stays unknown, parsing goes on. */
static void test_ram_total_absent(void **state)
{
	struct wb w = { 0 };
	struct px_insp_stats st;

	(void)state;
	main_header(&w, "pc-q35-7.2");
	section_start(&w, RAM_ID, "ram", 4);
	put64(&w, (64u << 20) | 0x8); /* a PAGE flag where MEM_SIZE belongs */
	idstr(&w, "pc.ram");
	put64(&w, 64u << 20);
	put64(&w, 0x10);
	footer(&w, RAM_ID);
	part(&w, 0x02, RAM_ID);
	ram_rec(&w, 0, 0x2, "pc.ram");
	eos(&w);
	run_all(&w, &st);
	assert_false(st.bytes_only);
	assert_int_equal(st.ram_total, 0);
	assert_int_equal(st.zero_pages, 1);
	free(w.d);
}

/*
 * A captured main channel (tests/fuzz/corpus/inspect, the first 64 KiB of a real QEMU
 * migration): the RAM total its setup announced, whichever way it is fed. The directory comes
 * from the environment (meson sets it); without it the case is skipped.
 */
static void check_capture(const char *name, uint64_t total, struct px_insp_stats *st)
{
	const char *dir = getenv("VMIG_INSPECT_CORPUS");
	struct wb w = { 0 };
	uint8_t buf[4096];
	char path[512];
	size_t n;
	FILE *f;

	if (!dir)
		skip();
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "rb");
	assert_non_null(f);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		putmem(&w, buf, n);
	fclose(f);
	run_all(&w, st);
	assert_int_equal(st->kind, PX_INSP_MAIN);
	assert_int_equal(st->ram_total, total);
	free(w.d);
}

/* 7.2, -m 256M, no multifd: pc.ram and the ROMs and the like of a q35 machine; the first pass's
 * pages on the main channel. */
static void test_ram_total_qemu72(void **state)
{
	struct px_insp_stats st;

	(void)state;
	check_capture("qemu72-main-prefix", (256u << 20) + 0x82000, &st);
	assert_false(st.bytes_only);
	assert_int_equal(st.passes, 1);
	assert_true(st.pages + st.zero_pages > 0);
}

/* 10.0, -m 64M, multifd: the pages went on the multifd channels; the main channel reached the
 * switchover within its first 64 KiB. */
static void test_ram_total_qemu10(void **state)
{
	struct px_insp_stats st;

	(void)state;
	check_capture("qemu10-main-prefix", (64u << 20) + 0x82000, &st);
	assert_true(st.switchover);
	assert_string_equal(st.reason, "switchover: device state follows");
}

static void estimate_is(struct px_insp_summary *sum, bool known, uint64_t remaining,
			const char *from)
{
	px_insp_estimate(sum);
	assert_int_equal(sum->remaining_known, known);
	assert_int_equal(sum->remaining, remaining);
	if (from)
		assert_string_equal(sum->remaining_from, from);
	else
		assert_null(sum->remaining_from);
}

/* The fold carries the main channel's total; the estimate says only what the stream tells. */
static void test_estimate(void **state)
{
	struct px_insp_stats main_st = { .kind = PX_INSP_MAIN, .page_size = 4096,
					 .ram_total = 1000 * 4096, .zero_pages = 300,
					 .passes = 1 };
	struct px_insp_stats mfd = { .kind = PX_INSP_MULTIFD, .page_size = 4096, .pages = 200,
				     .zero_pages = 100, .passes = 1 };
	struct px_insp_summary sum = { 0 };

	(void)state;
	/* Nothing seen: no total, nothing to say. */
	estimate_is(&sum, false, 0, NULL);
	/* The first pass: main and multifd pages, data and zero, against the total. */
	px_insp_fold(&sum, &main_st, true);
	px_insp_fold(&sum, &mfd, true);
	px_insp_fold(&sum, &mfd, false); /* an ended channel's pages count as well */
	assert_int_equal(sum.ram_total, 1000 * 4096);
	estimate_is(&sum, true, (1000 - 300 - 300 - 300) * 4096, "first-pass");
	/* The total announced, no page yet: all of it remains. */
	sum = (struct px_insp_summary){ .ram_total = 8192, .page_size = 4096 };
	estimate_is(&sum, true, 8192, "first-pass");
	/* More pages than the total (a guest that grew a block): none remains, not less. */
	sum = (struct px_insp_summary){ .ram_total = 8192, .page_size = 4096, .pages = 5,
					.passes = 1 };
	estimate_is(&sum, true, 0, "first-pass");
	/* The second pass: what the first let the guest dirty is unknown. */
	sum = (struct px_insp_summary){ .ram_total = 1 << 30, .page_size = 4096, .pages = 300000,
					.passes = 2 };
	estimate_is(&sum, false, 0, NULL);
	/* Once a dirty pass completed: its pages, at most the total. */
	sum.passes = 3;
	sum.dirty_known = true;
	sum.dirty_pages_per_pass = 2500;
	estimate_is(&sum, true, 2500 * 4096, "last-pass");
	sum.dirty_pages_per_pass = 1 << 20;
	estimate_is(&sum, true, 1 << 30, "last-pass");
	/* After switchover, or with a channel that stopped parsing: unknown. */
	sum.switchover = true;
	estimate_is(&sum, false, 0, NULL);
	sum.switchover = false;
	sum.bytes_only = 1;
	estimate_is(&sum, false, 0, NULL);
}

/* Reads while the parser writes: strings whole or absent, counters never going back. */
static void *reader_main(void *arg)
{
	struct reader *r = arg;
	struct px_insp_stats st, prev = { 0 };

	r->ok = true;
	while (!atomic_load(&r->done)) {
		px_insp_read(r->in, &st);
		r->reads++;
		if (st.bytes < prev.bytes || st.pages < prev.pages ||
		    st.zero_pages < prev.zero_pages || st.syncs < prev.syncs)
			r->ok = false;
		if (strcmp(st.machine, "") != 0 && strcmp(st.machine, "pc-q35-7.2") != 0)
			r->ok = false;
		if (st.bytes_only != (strcmp(st.reason, "switchover: device state follows") == 0))
			r->ok = false;
		if (st.switchover && st.switchover_ms != 1200)
			r->ok = false;
		prev = st;
	}
	return NULL;
}

static void test_concurrent_read(void **state)
{
	struct reader r = { 0 };
	struct wb w = { 0 };
	struct px_insp_stats st;
	pthread_t t;

	(void)state;
	main_72(&w);
	put8(&w, 0x04);
	putfill(&w, 1000);
	r.in = insp_new();
	assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
	for (size_t i = 0; i < w.n; i++)
		px_insp_feed(r.in, w.d + i, 1);
	atomic_store(&r.done, 1);
	pthread_join(t, NULL);
	assert_true(r.ok);
	px_insp_read(r.in, &st);
	assert_true(st.bytes_only);
	assert_int_equal(st.bytes, w.n);
	px_insp_free(r.in);
	free(w.d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fresh),
		cmocka_unit_test(test_tap_ops),
		cmocka_unit_test(test_multifd_72),
		cmocka_unit_test(test_multifd_10),
		cmocka_unit_test(test_multifd_16k_pages),
		cmocka_unit_test(test_multifd_garbage),
		cmocka_unit_test(test_multifd_bad_magic),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_other),
		cmocka_unit_test(test_main_72),
		cmocka_unit_test(test_main_pump),
		cmocka_unit_test(test_main_flush),
		cmocka_unit_test(test_main_garbage),
		cmocka_unit_test(test_block_overflow),
		cmocka_unit_test(test_ram_total_absent),
		cmocka_unit_test(test_ram_total_qemu72),
		cmocka_unit_test(test_ram_total_qemu10),
		cmocka_unit_test(test_estimate),
		cmocka_unit_test(test_concurrent_read),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
