// SPDX-License-Identifier: Apache-2.0
/* xp_rel, the DPDK node hop's reliable stream: its frame codec, and two streams over a simulated
 * link (rel_sim.c) that is clean, lossy, duplicating, reordering, congested or read slowly. Every
 * transfer must arrive whole and in order, with the figures showing what the link did. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "rel_sim.h"
#include "xp_rel.h"

#define KIB 1024u
#define MIB (1024u * 1024u)

static struct rel_sim_cfg base(void)
{
	return (struct rel_sim_cfg){
		.mss = 1400,
		.sndbuf = 256 * KIB,
		.rcvbuf = 256 * KIB,
		.bytes_ab = 4 * MIB,
		.bytes_ba = 64 * KIB,
		.delay_us = 50,
		.bytes_per_ms = 1250 * KIB, /* about 10 Gbit/s */
		.queue_us = 2000,
		.limit_us = 60ull * 1000 * 1000,
		.seed = 1,
	};
}

static void run(const struct rel_sim_cfg *c, struct rel_sim_result *r)
{
	assert_int_equal(rel_sim_run(c, r), 0);
	if (!r->done)
		fail_msg("not done by %llu us: a sent %llu, b sent %llu, a timeouts %llu, b %llu",
			 (unsigned long long)c->limit_us, (unsigned long long)r->a.bytes_sent,
			 (unsigned long long)r->b.bytes_sent, (unsigned long long)r->a.timeouts,
			 (unsigned long long)r->b.timeouts);
	assert_true(r->intact);
	assert_int_equal(r->bad_parse, 0);
	assert_true(r->max_ahead <= c->rcvbuf);
	assert_int_equal(r->a.bytes_delivered, c->bytes_ba);
	assert_int_equal(r->b.bytes_delivered, c->bytes_ab);
	assert_int_equal(r->a.bad_acks + r->b.bad_acks + r->a.bad_frames + r->b.bad_frames, 0);
}

static void test_clean(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;

	(void)state;
	run(&c, &r);
	assert_int_equal(r.dropped, 0);
	assert_int_equal(r.a.retransmitted_frames + r.b.retransmitted_frames, 0);
	assert_int_equal(r.a.timeouts + r.b.timeouts, 0);
	/* A clean 10 Gbit/s link with 100 us of round trip is filled: 4 MiB in well under 10 ms
	 * of simulated time once the window opened. */
	assert_true(r.end_us < 10000);
	assert_true(r.a.srtt_us >= 100 && r.a.srtt_us < 1000);
	/* The window grows no further than twice what the send buffer can put in flight. */
	assert_true(r.a.cwnd <= 2 * c.sndbuf);
}

static void test_lossy(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;

	(void)state;
	for (uint32_t seed = 1; seed <= 5; seed++) {
		c.seed = seed;
		c.loss_pct = 3;
		c.dup_pct = 2;
		c.reorder_pct = 5;
		run(&c, &r);
		assert_true(r.dropped > 0);
		assert_true(r.a.retransmitted_frames > 0);
		assert_true(r.b.duplicate_frames > 0);
		assert_true(r.b.out_of_order_frames > 0);
		/* Losses are found by SACK and RACK, and a tail loss by its probe, not by waiting
		 * for the timer: at most a couple of timeouts in some 150 losses. */
		assert_true(r.a.fast_recoveries > 0);
		assert_true(r.a.timeouts + r.b.timeouts <= 2);
	}
}

static void test_heavy_loss(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;

	(void)state;
	c.bytes_ab = 512 * KIB;
	c.loss_pct = 30;
	run(&c, &r);
	assert_true(r.a.timeouts > 0);
	assert_true(r.a.retransmitted_bytes > 0);
}

static void test_congestion(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;

	(void)state;
	/* A slow link with a short queue and room for far more in flight than it holds: the
	 * congestion window must back off, and the transfer still completes at the link's rate. */
	c.bytes_per_ms = 100 * KIB;
	c.queue_us = 300;
	c.sndbuf = c.rcvbuf = 1 * MIB;
	c.bytes_ab = 2 * MIB;
	run(&c, &r);
	assert_true(r.dropped > 0);
	assert_true(r.a.fast_recoveries > 0);
	assert_true(r.a.ssthresh < 1 * MIB);
	/* 2 MiB at 100 KiB/ms is 20.5 ms; losses may cost some, not most. */
	assert_true(r.end_us < 40000);
}

static void test_slow_reader(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;

	(void)state;
	/* A reader that takes 20 KiB a millisecond from a 16 KiB window: the sender is held to
	 * the window (nothing arrives beyond it), and probes when it shuts. */
	c.rcvbuf = 16 * KIB;
	c.read_per_ms = 20 * KIB;
	c.bytes_ab = 1 * MIB;
	run(&c, &r);
	assert_int_equal(r.b.beyond_window_frames, 0);
	assert_true(r.end_us >= 1 * MIB / (20 * KIB) * 1000 - 2000);
}

static void test_empty_streams(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;

	(void)state;
	c.bytes_ab = 0;
	c.bytes_ba = 0;
	run(&c, &r);
	c.loss_pct = 50;
	c.seed = 3;
	run(&c, &r);
}

static void test_fate_bytes(void **state)
{
	struct rel_sim_cfg c = base();
	struct rel_sim_result r;
	uint8_t fate[4096];

	(void)state;
	/* The fuzzer's way of deciding: every frame's fate from a byte. */
	for (size_t i = 0; i < sizeof(fate); i++)
		fate[i] = (uint8_t)(i * 37 + (i >> 3));
	c.fate = fate;
	c.fate_len = sizeof(fate);
	c.bytes_ab = 512 * KIB;
	run(&c, &r);
	assert_true(r.dropped > 0);
}

/* What the daemon's silence rules read: a stream is waiting for its peer only while something it
 * wrote (sent or not) is unacknowledged, not when it is merely quiet. */
static void test_awaiting_ack(void **state)
{
	struct xp_rel_cfg c = { .stream = 1,
				.mss = 1400,
				.sndbuf = 64 * KIB,
				.rcvbuf = 64 * KIB,
				.peer_rcvbuf = 64 * KIB };
	struct xp_rel *a, *b;
	struct xp_rel_hdr h;
	uint8_t frame[XP_REL_MAX_HDR + 1400];
	const char *why;
	uint64_t now = 1000;
	size_t n;

	assert_int_equal(xp_rel_new(&c, now, &a), 0);
	assert_int_equal(xp_rel_new(&c, now, &b), 0);
	assert_false(xp_rel_awaiting_ack(a)); /* quiet, nothing out */
	assert_false(xp_rel_waiting(a));
	assert_int_equal(xp_rel_write(a, "hello", 5), 5);
	/* written, not sent (the port had no link, or no MAC for the peer): it waits all the same */
	assert_false(xp_rel_awaiting_ack(a));
	assert_true(xp_rel_waiting(a));
	n = xp_rel_next_frame(a, now, frame, sizeof(frame));
	assert_true(n > 0);
	assert_true(xp_rel_awaiting_ack(a));
	assert_true(xp_rel_waiting(a));
	assert_int_equal(xp_rel_parse(frame, n, &h, &why), 0);
	assert_int_equal(xp_rel_input(b, now, &h), 0);
	/* b acknowledges (after its ack delay) */
	now += 10000;
	n = xp_rel_next_frame(b, now, frame, sizeof(frame));
	assert_true(n > 0);
	assert_int_equal(xp_rel_parse(frame, n, &h, &why), 0);
	assert_int_equal(xp_rel_input(a, now, &h), 0);
	assert_false(xp_rel_awaiting_ack(a));
	assert_false(xp_rel_waiting(a));
	assert_false(xp_rel_awaiting_ack(b)); /* an acknowledgement is never waited for */
	assert_false(xp_rel_waiting(b));
	/* a FIN waits too until it is acknowledged */
	xp_rel_shutdown(a);
	assert_true(xp_rel_waiting(a));
	xp_rel_free(a);
	xp_rel_free(b);
}

/* One frame from a to b and b's acknowledgement back, at now. */
static void exchange(struct xp_rel *a, struct xp_rel *b, uint64_t *now)
{
	uint8_t frame[XP_REL_MAX_HDR + 1400];
	struct xp_rel_hdr h;
	const char *why;
	size_t n;

	while ((n = xp_rel_next_frame(a, *now, frame, sizeof(frame))) > 0) {
		assert_int_equal(xp_rel_parse(frame, n, &h, &why), 0);
		assert_int_equal(xp_rel_input(b, *now, &h), 0);
	}
	*now += 10000;
	n = xp_rel_next_frame(b, *now, frame, sizeof(frame));
	assert_true(n > 0);
	assert_int_equal(xp_rel_parse(frame, n, &h, &why), 0);
	assert_int_equal(xp_rel_input(a, *now, &h), 0);
}

/* A holding writer (compressed chunks): acknowledged bytes stay, and take room, until released,
 * and never past what was acknowledged. */
static void test_hold(void **state)
{
	struct xp_rel_cfg c = { .stream = 1,
				.mss = 1400,
				.sndbuf = 4096,
				.rcvbuf = 64 * KIB,
				.peer_rcvbuf = 64 * KIB };
	static uint8_t data[4096], got[4096];
	struct xp_rel *a, *b;
	struct iovec iov[2];
	uint64_t now = 1000, from;

	(void)state;
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7);
	assert_int_equal(xp_rel_new(&c, now, &a), 0);
	assert_int_equal(xp_rel_new(&c, now, &b), 0);
	xp_rel_hold(a);
	assert_int_equal(xp_rel_write(a, data, 3000), 3000);
	exchange(a, b, &now);
	assert_int_equal(xp_rel_acked(a), 3000);
	assert_int_equal(xp_rel_read(b, got, sizeof(got)), 3000);
	assert_memory_equal(got, data, 3000);
	/* acknowledged, not released: still held, still taking room */
	assert_int_equal(xp_rel_kept(a, &from, iov), 3000);
	assert_int_equal(from, 0);
	assert_int_equal(xp_rel_write_space(a, iov), 1096);
	/* released in part; a release past the acknowledgement stops there */
	xp_rel_release(a, 1000);
	assert_int_equal(xp_rel_kept(a, &from, iov), 2000);
	assert_int_equal(from, 1000);
	assert_memory_equal(iov[0].iov_base, data + 1000, iov[0].iov_len);
	assert_int_equal(xp_rel_write(a, data + 3000, 1096), 1096);
	assert_int_equal(xp_rel_kept(a, &from, iov), 3096);
	xp_rel_release(a, 9000);
	assert_int_equal(xp_rel_kept(a, &from, iov), 1096);
	assert_int_equal(from, 3000);
	/* the held bytes wrap the ring: two spans, in order */
	assert_int_equal(iov[0].iov_len + iov[1].iov_len, 1096);
	assert_memory_equal(iov[0].iov_base, data + 3000, iov[0].iov_len);
	assert_memory_equal(iov[1].iov_base, data + 3000 + iov[0].iov_len, iov[1].iov_len);
	exchange(a, b, &now);
	xp_rel_release(a, 4096);
	assert_int_equal(xp_rel_kept(a, &from, iov), 0);
	assert_int_equal(xp_rel_write_space(a, iov), 4096);
	xp_rel_free(a);
	xp_rel_free(b);
}

static void test_codec(void **state)
{
	struct xp_rel_hdr h = { 0 }, p;
	uint8_t buf[XP_REL_MAX_HDR + 8];
	const char *why = NULL;
	size_t n;

	(void)state;
	h.flags = XP_REL_F_DATA;
	h.len = 8;
	h.stream = 0x01020304;
	h.pn = 0x1122334455667788ull;
	h.seq = 1000;
	h.ack = 77;
	h.window = 65536;
	h.nsack = 2;
	h.sack[0] = (struct xp_rel_sack){ 100, 200 };
	h.sack[1] = (struct xp_rel_sack){ 300, 400 };
	n = xp_rel_put_hdr(&h, buf);
	assert_int_equal(n, XP_REL_HDR + 2 * XP_REL_SACK_SIZE);
	memcpy(buf + n, "payload!", 8);
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), 0);
	assert_int_equal(p.flags, h.flags);
	assert_int_equal(p.len, 8);
	assert_int_equal(p.stream, h.stream);
	assert_true(p.pn == h.pn && p.seq == h.seq && p.ack == h.ack);
	assert_int_equal(p.window, h.window);
	assert_int_equal(p.nsack, 2);
	assert_true(p.sack[1].start == 300 && p.sack[1].end == 400);
	assert_memory_equal(p.payload, "payload!", 8);

	/* Each malformed frame is refused with a reason. */
	assert_int_equal(xp_rel_parse(buf, XP_REL_HDR - 1, &p, &why), -EBADMSG);
	assert_string_equal(why, "shorter than a header");
	assert_int_equal(xp_rel_parse(buf, n + 7, &p, &why), -EBADMSG);
	assert_string_equal(why, "length does not match the header");
	buf[0] = 2;
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	assert_string_equal(why, "unknown version");
	buf[0] = XP_REL_VERSION;
	buf[1] = 0x80;
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	assert_string_equal(why, "unknown flag");
	buf[1] = 0; /* payload without the data flag */
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	buf[1] = XP_REL_F_DATA | XP_REL_F_FIN; /* a FIN with payload */
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	buf[1] = XP_REL_F_DATA;
	buf[37] = 1;
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	assert_string_equal(why, "reserved bits set");
	buf[37] = 0;
	/* A SACK block at or before ack. */
	h.sack[0] = (struct xp_rel_sack){ 77, 200 };
	n = xp_rel_put_hdr(&h, buf);
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	h.sack[0] = (struct xp_rel_sack){ 200, 200 };
	n = xp_rel_put_hdr(&h, buf);
	assert_int_equal(xp_rel_parse(buf, n + 8, &p, &why), -EBADMSG);
	h.nsack = XP_REL_MAX_SACK + 1;
	xp_rel_put_hdr(&(struct xp_rel_hdr){ .flags = XP_REL_F_DATA, .len = 1 }, buf);
	buf[36] = XP_REL_MAX_SACK + 1;
	assert_int_equal(xp_rel_parse(buf, sizeof(buf), &p, &why), -EBADMSG);
	assert_string_equal(why, "too many SACK blocks");
}

/* Streams to one peer share a packet number space: their frames' numbers, the sealing's nonces,
 * rise across all of them, and a stream without one counts its own. */
static void test_pn_space(void **state)
{
	struct xp_rel_cfg cfg = {
		.mss = 1000, .sndbuf = 1 << 16, .rcvbuf = 1 << 16, .peer_rcvbuf = 1 << 16
	};
	uint8_t buf[XP_REL_MAX_HDR + 1000], data[4000] = { 0 };
	struct xp_rel *a, *b, *own;
	struct xp_rel_hdr h;
	const char *why;
	uint64_t space = 5, last = 0;
	size_t n;
	int i;

	(void)state;
	cfg.pn_space = &space;
	cfg.stream = 1;
	assert_int_equal(xp_rel_new(&cfg, 0, &a), 0);
	cfg.stream = 2;
	assert_int_equal(xp_rel_new(&cfg, 0, &b), 0);
	cfg.pn_space = NULL;
	assert_int_equal(xp_rel_new(&cfg, 0, &own), 0);
	assert_int_equal(xp_rel_write(a, data, sizeof(data)), sizeof(data));
	assert_int_equal(xp_rel_write(b, data, sizeof(data)), sizeof(data));
	for (i = 0; i < 6; i++) {
		n = xp_rel_next_frame(i % 2 ? b : a, 1000, buf, sizeof(buf));
		assert_true(n > XP_REL_HDR);
		assert_int_equal(xp_rel_parse(buf, n, &h, &why), 0);
		assert_int_equal(h.stream, i % 2 ? 2 : 1);
		assert_true(i == 0 ? h.pn == 5 : h.pn == last + 1);
		last = h.pn;
	}
	assert_true(space == 11);
	assert_int_equal(xp_rel_write(own, data, 10), 10);
	n = xp_rel_next_frame(own, 1000, buf, sizeof(buf));
	assert_int_equal(xp_rel_parse(buf, n, &h, &why), 0);
	assert_true(h.pn == 0 && space == 11);
	xp_rel_free(a);
	xp_rel_free(b);
	xp_rel_free(own);
}

static void test_bad_input(void **state)
{
	struct xp_rel_cfg cfg = { .stream = 1, .mss = 1000, .sndbuf = 8000, .rcvbuf = 4000 };
	struct xp_rel *r;
	struct xp_rel_hdr h = { 0 };
	uint8_t buf[XP_REL_MAX_HDR + 1000], data[1000] = { 0 };
	struct xp_rel_stats st;

	(void)state;
	assert_int_equal(xp_rel_new(&(struct xp_rel_cfg){ .mss = 0 }, 0, &r), -EINVAL);
	assert_int_equal(xp_rel_new(&cfg, 0, &r), 0);
	/* An acknowledgement of bytes never sent: refused and counted. */
	h.ack = 5000;
	assert_int_equal(xp_rel_input(r, 1, &h), -EPROTO);
	/* Bytes beyond the window are not taken; a FIN before bytes held is refused. */
	h.ack = 0;
	h.flags = XP_REL_F_DATA;
	h.seq = 4000;
	h.len = 1000;
	h.payload = data;
	assert_int_equal(xp_rel_input(r, 2, &h), 0);
	h.seq = 2000;
	assert_int_equal(xp_rel_input(r, 3, &h), 0);
	h.flags = XP_REL_F_DATA | XP_REL_F_FIN;
	h.seq = 1000;
	h.len = 0;
	assert_int_equal(xp_rel_input(r, 4, &h), 0);
	xp_rel_stats(r, &st);
	assert_int_equal(st.bad_acks, 1);
	assert_int_equal(st.beyond_window_frames, 1);
	assert_int_equal(st.out_of_order_frames, 1);
	assert_int_equal(st.bad_frames, 1);
	assert_int_equal(xp_rel_read(r, data, sizeof(data)), 0);
	assert_false(xp_rel_eof(r));
	/* The answer says what is held: ack 0, one SACK block [2000, 3000). */
	{
		struct xp_rel_hdr p;
		const char *why;
		size_t n = xp_rel_next_frame(r, 5, buf, sizeof(buf));

		assert_true(n > 0);
		assert_int_equal(xp_rel_parse(buf, n, &p, &why), 0);
		assert_int_equal(p.ack, 0);
		assert_int_equal(p.nsack, 1);
		assert_true(p.sack[0].start == 2000 && p.sack[0].end == 3000);
		assert_int_equal(p.window, 4000);
	}
	xp_rel_free(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_awaiting_ack),  cmocka_unit_test(test_hold),
		cmocka_unit_test(test_codec),
		cmocka_unit_test(test_bad_input),     cmocka_unit_test(test_clean),
		cmocka_unit_test(test_lossy),	      cmocka_unit_test(test_heavy_loss),
		cmocka_unit_test(test_congestion),    cmocka_unit_test(test_slow_reader),
		cmocka_unit_test(test_empty_streams), cmocka_unit_test(test_fate_bytes),
		cmocka_unit_test(test_pn_space),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
