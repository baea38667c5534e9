// SPDX-License-Identifier: Apache-2.0
/* xp_hop, the node hop's sessions, over an in-memory datagram link (the port's ops table faked):
 * several streams to one peer, sealed or plain, with frames dropped; and what must be refused
 * and counted, never delivered: a replayed frame, an altered one, another key, a stream nobody
 * opened, an address that is no peer's. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xp_hop.h"

#define SLOTS	  512
#define SLOT_SIZE 2048
#define MSS	  1400
#define IP_A	  0x0a000001u
#define IP_B	  0x0a000002u

/* One node's end of the link: what is queued for it, and what it may lose on the way in. */
struct end {
	uint8_t data[SLOTS][SLOT_SIZE];
	size_t len[SLOTS];
	uint32_t from[SLOTS];
	unsigned int head, count;
	uint32_t ip;
	struct end *peer;
	unsigned int loss_pct; /* of frames queued for this end */
	uint32_t rng;
	/* a copy of the last frame queued here, for the replay test */
	uint8_t last[SLOT_SIZE];
	size_t last_len;
	/* zero copy (the sending end's): the buffer lent, frames sent from it, flushes */
	uint8_t lent[SLOT_SIZE];
	uint32_t lent_to;
	bool lent_out;
	uint64_t lent_sent, flushes, sealed_sent;
	size_t lend_cap; /* 0: the whole slot */
};

static int fake_send(void *port, uint32_t ip, uint16_t udp_port, const void *data, size_t len,
		     uint64_t now_us)
{
	struct end *self = port, *to = self->peer;
	unsigned int slot;

	(void)udp_port;
	(void)now_us;
	assert_int_equal(ip, to->ip);
	assert_true(len <= SLOT_SIZE);
	if (to->count == SLOTS)
		return -EAGAIN;
	to->rng = to->rng * 1103515245 + 12345;
	memcpy(to->last, data, len);
	to->last_len = len;
	if (to->loss_pct && (to->rng >> 16) % 100 < to->loss_pct)
		return 0; /* sent, and lost on the way */
	slot = (to->head + to->count++) % SLOTS;
	memcpy(to->data[slot], data, len);
	to->len[slot] = len;
	to->from[slot] = self->ip;
	return 0;
}

static int fake_poll(void *port, xp_hop_rx_fn fn, void *arg)
{
	struct end *self = port;
	int n = 0;

	while (self->count) {
		unsigned int slot = self->head;

		self->head = (self->head + 1) % SLOTS;
		self->count--;
		fn(arg, self->from[slot], 4790, self->data[slot], self->len[slot]);
		n++;
	}
	return n;
}

static const struct xp_hop_port_ops fake_ops = { .send = fake_send, .poll = fake_poll };

/* The same link lending its buffers, as xp_dpdk does: the frame is built in e->lent. */
static int fake_frame(void *port, uint32_t ip, uint64_t now_us, uint8_t **buf, size_t *cap)
{
	struct end *e = port;

	(void)now_us;
	e->lent_to = ip;
	e->lent_out = true;
	*buf = e->lent;
	*cap = e->lend_cap ? e->lend_cap : SLOT_SIZE;
	return 0;
}

static int fake_frame_send(void *port, uint16_t udp_port, size_t len, bool sealed)
{
	struct end *e = port;

	assert_true(e->lent_out);
	e->lent_out = false;
	e->lent_sent++;
	e->sealed_sent += sealed;
	return fake_send(port, e->lent_to, udp_port, e->lent, len, 0);
}

static int fake_flush(void *port)
{
	((struct end *)port)->flushes++;
	return 0;
}

static const struct xp_hop_port_ops lend_ops = { .send = fake_send,
						 .poll = fake_poll,
						 .frame = fake_frame,
						 .frame_send = fake_frame_send,
						 .flush = fake_flush };

/* Injects a datagram at an end, as if it came from ip. */
static void inject(struct end *e, uint32_t from, const void *data, size_t len)
{
	unsigned int slot = (e->head + e->count++) % SLOTS;

	memcpy(e->data[slot], data, len);
	e->len[slot] = len;
	e->from[slot] = from;
}

struct pair {
	struct end *a, *b;
	struct xp_hop *ha, *hb;
	struct xp_hop_peer *pa, *pb; /* a's view of b, b's of a */
};

static const uint8_t secret_ab[XP_SEAL_SECRET] = { 1, 2, 3 };
static const uint8_t secret_ba[XP_SEAL_SECRET] = { 4, 5, 6 };

static void pair_new_ops(struct pair *p, bool sealed, const uint8_t *b_rx_secret,
			 const struct xp_hop_port_ops *ops)
{
	struct xp_hop_conf c = { .ops = ops, .mss = MSS, .max_peers = 2, .max_streams = 4 };
	struct xp_hop_peer_conf pc = { .udp_port = 4790, .budget = 4 << 20 };

	p->a = calloc(1, sizeof(*p->a));
	p->b = calloc(1, sizeof(*p->b));
	assert_non_null(p->a);
	assert_non_null(p->b);
	p->a->ip = IP_A;
	p->b->ip = IP_B;
	p->a->peer = p->b;
	p->b->peer = p->a;
	p->a->rng = p->b->rng = 7;
	c.port = p->a;
	assert_int_equal(xp_hop_new(&c, &p->ha), 0);
	c.port = p->b;
	assert_int_equal(xp_hop_new(&c, &p->hb), 0);
	pc.ip = IP_B;
	pc.tx_secret = sealed ? secret_ab : NULL;
	pc.rx_secret = sealed ? secret_ba : NULL;
	assert_int_equal(xp_hop_peer_add(p->ha, &pc, &p->pa), 0);
	pc.ip = IP_A;
	pc.tx_secret = sealed ? secret_ba : NULL;
	pc.rx_secret = sealed ? b_rx_secret : NULL;
	assert_int_equal(xp_hop_peer_add(p->hb, &pc, &p->pb), 0);
}

static void pair_new(struct pair *p, bool sealed, const uint8_t *b_rx_secret)
{
	pair_new_ops(p, sealed, b_rx_secret, &fake_ops);
}

static void pair_free(struct pair *p)
{
	xp_hop_free(p->ha);
	xp_hop_free(p->hb);
	free(p->a);
	free(p->b);
}

static uint8_t pattern(uint32_t stream, uint64_t off)
{
	return (uint8_t)((off * 0x9e3779b97f4a7c15ull + stream * 977) >> 56);
}

/*
 * a sends size[i] bytes on stream i + 1 to b; runs steps with a simulated clock (1 us per step,
 * 1 ms when both are idle) until b has every byte and both FINs are through. Returns the bytes b
 * read; each byte is checked against the pattern.
 */
static uint64_t transfer(struct pair *p, const uint64_t *size, unsigned int n, uint64_t limit_us)
{
	struct xp_rel *ra[4], *rb[4];
	uint64_t written[4] = { 0 }, got[4] = { 0 }, now = 1, total = 0;
	uint8_t buf[16384];
	unsigned int i;

	for (i = 0; i < n; i++) {
		assert_int_equal(xp_hop_stream_open(p->pa, i + 1, now, &ra[i]), 0);
		assert_int_equal(xp_hop_stream_open(p->pb, i + 1, now, &rb[i]), 0);
		xp_rel_shutdown(rb[i]); /* b sends nothing back but acknowledgements */
	}
	for (; now < limit_us;) {
		bool done = true;
		int moved;

		for (i = 0; i < n; i++) {
			size_t k;

			while (written[i] < size[i]) {
				size_t want = size[i] - written[i] < sizeof(buf)
						      ? size[i] - written[i]
						      : sizeof(buf);

				for (k = 0; k < want; k++)
					buf[k] = pattern(i + 1, written[i] + k);
				k = xp_rel_write(ra[i], buf, want);
				written[i] += k;
				if (k < want)
					break;
			}
			if (written[i] == size[i])
				xp_rel_shutdown(ra[i]);
			while ((k = xp_rel_read(rb[i], buf, sizeof(buf))) > 0) {
				for (size_t j = 0; j < k; j++)
					if (buf[j] != pattern(i + 1, got[i] + j))
						fail_msg("stream %u: byte %llu differs", i + 1,
							 (unsigned long long)(got[i] + j));
				got[i] += k;
			}
			if (!xp_rel_eof(rb[i]) || !xp_rel_send_done(ra[i]))
				done = false;
		}
		if (done)
			break;
		moved = xp_hop_step(p->ha, now) + xp_hop_step(p->hb, now);
		now += moved ? 1 : 1000;
	}
	for (i = 0; i < n; i++) {
		assert_int_equal(got[i], size[i]);
		total += got[i];
	}
	return total;
}

static void test_sealed_streams(void **state)
{
	static const uint64_t size[3] = { 3 << 20, 1 << 20, 12345 };
	struct xp_hop_peer_stats sa, sb;
	struct pair p;

	(void)state;
	pair_new(&p, true, secret_ab);
	assert_int_equal(transfer(&p, size, 3, 60000000), size[0] + size[1] + size[2]);
	xp_hop_peer_stats(p.pa, &sa);
	xp_hop_peer_stats(p.pb, &sb);
	assert_true(sa.frames_out > (size[0] + size[1]) / MSS);
	assert_int_equal(sb.forged + sb.replayed + sb.too_old + sb.malformed + sb.unknown_stream,
			 0);
	assert_int_equal(sa.forged + sa.replayed + sa.too_old + sa.malformed + sa.unknown_stream,
			 0);
	assert_int_equal(sa.retransmitted_frames, 0);
	pair_free(&p);
}

/* Frames built and sealed in the port's own buffers: the same bytes arrive, every frame goes
 * out of a lent buffer, marked sealed, and each step flushes. */
static void test_zero_copy(void **state)
{
	static const uint64_t size[2] = { 2 << 20, 777 };
	struct xp_hop_peer_stats sa;
	struct pair p;

	(void)state;
	pair_new_ops(&p, true, secret_ab, &lend_ops);
	p.b->loss_pct = 1;
	assert_int_equal(transfer(&p, size, 2, 60000000), size[0] + size[1]);
	xp_hop_peer_stats(p.pa, &sa);
	assert_int_equal(p.a->lent_sent, sa.frames_out);
	assert_int_equal(p.a->sealed_sent, sa.frames_out);
	assert_true(p.a->flushes > 0);
	assert_true(sa.retransmitted_frames > 0);
	pair_free(&p);

	/* a port lending less than a whole frame: the hop builds in its own buffer and copies */
	pair_new_ops(&p, false, NULL, &lend_ops);
	p.a->lend_cap = p.b->lend_cap = 1000;
	assert_int_equal(transfer(&p, size, 2, 60000000), size[0] + size[1]);
	assert_int_equal(p.a->lent_sent, 0);
	pair_free(&p);
}

static void test_plain_lossy(void **state)
{
	static const uint64_t size[4] = { 1 << 20, 1 << 20, 512 << 10, 1 };
	struct xp_hop_peer_stats sa, sb;
	struct pair p;

	(void)state;
	pair_new(&p, false, NULL);
	p.b->loss_pct = 3;
	p.a->loss_pct = 3;
	assert_int_equal(transfer(&p, size, 4, 600000000), size[0] + size[1] + size[2] + size[3]);
	xp_hop_peer_stats(p.pa, &sa);
	xp_hop_peer_stats(p.pb, &sb);
	assert_true(sa.retransmitted_frames > 0);
	assert_int_equal(sb.malformed + sb.unknown_stream, 0);
	pair_free(&p);
}

/* Each refused frame is counted by its reason, and the stream reads nothing from it. */
static void test_refusals(void **state)
{
	struct xp_hop_peer_stats sb;
	struct xp_rel *ra, *rb, *stray;
	uint8_t frame[SLOT_SIZE], out[64];
	size_t len;
	struct pair p;

	(void)state;
	pair_new(&p, true, secret_ab);
	assert_int_equal(xp_hop_stream_open(p.pa, 1, 1, &ra), 0);
	assert_int_equal(xp_hop_stream_open(p.pb, 1, 1, &rb), 0);
	assert_int_equal(xp_rel_write(ra, "hello", 5), 5);
	xp_hop_step(p.ha, 10); /* the frame is queued at b */
	assert_int_equal(p.b->count, 1);
	len = p.b->last_len;
	memcpy(frame, p.b->last, len);
	xp_hop_step(p.hb, 20);
	assert_int_equal(xp_rel_read(rb, out, sizeof(out)), 5);
	assert_memory_equal(out, "hello", 5);

	inject(p.b, IP_A, frame, len); /* the same frame again */
	xp_hop_step(p.hb, 30);
	assert_int_equal(xp_rel_write(ra, "world", 5), 5);
	xp_hop_step(p.ha, 35);
	assert_int_equal(p.b->count, 1);
	p.b->data[p.b->head][p.b->len[p.b->head] - 1] ^= 1; /* a new frame, its tag altered */
	xp_hop_step(p.hb, 40);
	inject(p.b, IP_A, frame, 10);	      /* too short for a header */
	inject(p.b, 0x0a0000ffu, frame, len); /* from an address that is no peer's */
	xp_hop_step(p.hb, 50);
	xp_hop_peer_stats(p.pb, &sb);
	assert_int_equal(sb.replayed, 1);
	assert_int_equal(sb.forged, 1);
	assert_int_equal(sb.malformed, 1);
	assert_int_equal(xp_hop_unknown_peer(p.hb), 1);
	assert_int_equal(xp_rel_read(rb, out, sizeof(out)), 0);

	/* a stream b never opened: refused until it opens, then the sender's retransmission lands
	 */
	assert_int_equal(xp_hop_stream_open(p.pa, 3, 60, &stray), 0);
	assert_int_equal(xp_rel_write(stray, "late", 4), 4);
	xp_hop_step(p.ha, 70);
	xp_hop_step(p.hb, 80);
	xp_hop_peer_stats(p.pb, &sb);
	assert_int_equal(sb.unknown_stream, 1);
	assert_null(xp_hop_stream(p.pb, 3));
	assert_int_equal(xp_hop_stream_open(p.pb, 3, 90, &rb), 0);
	for (uint64_t t = 1000; t < 2000000 && !xp_rel_read(rb, out, sizeof(out)); t += 1000) {
		xp_hop_step(p.ha, t);
		xp_hop_step(p.hb, t);
	}
	assert_memory_equal(out, "late", 4);
	pair_free(&p);

	/* b opens with another key: every frame is forged to it, nothing is read */
	pair_new(&p, true, secret_ba);
	assert_int_equal(xp_hop_stream_open(p.pa, 1, 1, &ra), 0);
	assert_int_equal(xp_hop_stream_open(p.pb, 1, 1, &rb), 0);
	assert_int_equal(xp_rel_write(ra, "secret", 6), 6);
	for (uint64_t t = 10; t < 3000000; t += 1000) {
		xp_hop_step(p.ha, t);
		xp_hop_step(p.hb, t);
	}
	xp_hop_peer_stats(p.pb, &sb);
	assert_true(sb.forged >= 2); /* the first frame and its retransmissions */
	assert_int_equal(xp_rel_read(rb, out, sizeof(out)), 0);
	pair_free(&p);
}

/*
 * The daemon's way: one peer per QEMU connection, several at the same address, each keyed from its
 * own TLS session and holding one stream id. Both carry their bytes at once, each opens only its
 * own frames, and the ids pick the peer: a frame moved to the other id is refused there.
 */
static void test_peer_per_stream(void **state)
{
	static const uint8_t k[4][XP_SEAL_SECRET] = { { 11 }, { 12 }, { 13 }, { 14 } };
	struct xp_hop_conf c = { .ops = &fake_ops, .mss = MSS, .max_peers = 4, .max_streams = 1 };
	struct xp_hop_peer_conf pc = { .udp_port = 4790, .budget = 1 << 20 };
	struct end *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	struct xp_hop *ha, *hb;
	struct xp_hop_peer *pa[2], *pb[2], *x;
	struct xp_hop_peer_stats st;
	struct xp_rel *ra[2], *rb[2], *r;
	static const uint32_t id[2] = { 5, 0x80000005u };
	uint64_t sent[2] = { 0 }, got[2] = { 0 }, now = 1;
	const uint64_t size = 300000;
	uint8_t buf[8192];

	assert_non_null(a);
	assert_non_null(b);
	a->ip = IP_A;
	b->ip = IP_B;
	a->peer = b;
	b->peer = a;
	c.port = a;
	assert_int_equal(xp_hop_new(&c, &ha), 0);
	c.port = b;
	assert_int_equal(xp_hop_new(&c, &hb), 0);
	for (int i = 0; i < 2; i++) {
		pc.first_stream = id[i];
		pc.ip = IP_B;
		pc.tx_secret = k[2 * i];
		pc.rx_secret = k[2 * i + 1];
		assert_int_equal(xp_hop_peer_add(ha, &pc, &pa[i]), 0);
		pc.ip = IP_A;
		pc.tx_secret = k[2 * i + 1];
		pc.rx_secret = k[2 * i];
		assert_int_equal(xp_hop_peer_add(hb, &pc, &pb[i]), 0);
		assert_int_equal(xp_hop_stream_open(pa[i], id[i], now, &ra[i]), 0);
		assert_int_equal(xp_hop_stream_open(pb[i], id[i], now, &rb[i]), 0);
		xp_rel_shutdown(rb[i]);
	}
	/* the same id at the same address again, a second stream, one outside the range */
	pc.first_stream = id[0];
	assert_int_equal(xp_hop_peer_add(hb, &pc, &x), -EEXIST);
	assert_int_equal(xp_hop_stream_open(pa[0], id[0] + 1, now, &r), -EINVAL);
	assert_int_equal(xp_hop_stream_open(pa[0], id[0], now, &r), -EEXIST);

	while (now < 20000000 && (!xp_rel_eof(rb[0]) || !xp_rel_eof(rb[1]) ||
				  !xp_rel_send_done(ra[0]) || !xp_rel_send_done(ra[1]))) {
		for (int i = 0; i < 2; i++) {
			size_t n;

			memset(buf, 'a' + i, sizeof(buf));
			if (sent[i] < size) {
				n = size - sent[i] < sizeof(buf) ? size - sent[i] : sizeof(buf);
				sent[i] += xp_rel_write(ra[i], buf, n);
			} else {
				xp_rel_shutdown(ra[i]);
			}
			while ((n = xp_rel_read(rb[i], buf, sizeof(buf))) > 0) {
				for (size_t j = 0; j < n; j++)
					assert_int_equal(buf[j], 'a' + i);
				got[i] += n;
			}
		}
		now += xp_hop_step(ha, now) + xp_hop_step(hb, now) ? 1 : 1000;
	}
	assert_int_equal(got[0], size);
	assert_int_equal(got[1], size);
	xp_hop_peer_stats(pb[0], &st);
	assert_int_equal(st.forged + st.replayed + st.unknown_stream, 0);

	/* the last frame b took, its id moved to the other stream's: that peer's keys refuse it */
	{
		uint32_t was = (uint32_t)b->last[4] << 24 | (uint32_t)b->last[5] << 16 |
			       (uint32_t)b->last[6] << 8 | b->last[7];
		int other = was == id[0] ? 1 : 0;

		assert_true(was == id[0] || was == id[1]);
		memcpy(buf, b->last, b->last_len);
		buf[4] = (uint8_t)(id[other] >> 24);
		buf[5] = (uint8_t)(id[other] >> 16);
		buf[6] = (uint8_t)(id[other] >> 8);
		buf[7] = (uint8_t)id[other];
		inject(b, IP_A, buf, b->last_len);
		xp_hop_step(hb, now);
		xp_hop_peer_stats(pb[other], &st);
		/* by the tag, or before it by the replay window (the packet number spaces of the
		 * two peers overlap) */
		assert_int_equal(st.forged + st.replayed + st.too_old, 1);
		assert_int_equal(xp_rel_read(rb[other], buf, sizeof(buf)), 0);
	}
	/* an id no peer at that address holds: no peer's */
	buf[7] = 99;
	inject(b, IP_A, buf, b->last_len);
	xp_hop_step(hb, now);
	assert_true(xp_hop_unknown_peer(hb) >= 1);
	xp_hop_free(ha);
	xp_hop_free(hb);
	free(a);
	free(b);
}

static void test_table(void **state)
{
	struct xp_hop_conf c = { .ops = &fake_ops, .mss = MSS, .max_peers = 1, .max_streams = 2 };
	struct xp_hop_peer_conf pc = { .ip = IP_B, .udp_port = 4790, .budget = 1 << 20 };
	struct xp_hop_peer *p, *q;
	struct xp_rel *r;
	struct xp_hop *h;
	struct end e = { .ip = IP_A };

	(void)state;
	c.port = &e;
	assert_int_equal(xp_hop_new(&c, &h), 0);
	assert_int_equal(xp_hop_deadline(h), UINT64_MAX);
	pc.tx_secret = secret_ab; /* one secret without the other */
	assert_int_equal(xp_hop_peer_add(h, &pc, &p), -EINVAL);
	pc.tx_secret = NULL;
	pc.budget = 2 * MSS; /* less than two frames a stream */
	assert_int_equal(xp_hop_peer_add(h, &pc, &p), -EINVAL);
	pc.budget = 1 << 20;
	assert_int_equal(xp_hop_peer_add(h, &pc, &p), 0);
	assert_int_equal(xp_hop_peer_add(h, &pc, &q), -EEXIST);
	pc.ip = IP_A;
	assert_int_equal(xp_hop_peer_add(h, &pc, &q), -ENOSPC);
	assert_int_equal(xp_hop_stream_open(p, 0, 0, &r), -EINVAL);
	assert_int_equal(xp_hop_stream_open(p, 1, 0, &r), 0);
	assert_ptr_equal(xp_hop_stream(p, 1), r);
	assert_int_equal(xp_hop_stream_open(p, 1, 0, &r), -EEXIST);
	assert_int_equal(xp_hop_stream_open(p, 2, 0, &r), 0);
	assert_int_equal(xp_hop_stream_open(p, 3, 0, &r), -ENOSPC);
	xp_hop_peer_remove(h, p);
	assert_int_equal(xp_hop_peer_add(h, &pc, &q), 0); /* the slot is free again */
	xp_hop_free(h);
	c.mss = 10;
	assert_int_equal(xp_hop_new(&c, &h), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),	    cmocka_unit_test(test_sealed_streams),
		cmocka_unit_test(test_plain_lossy), cmocka_unit_test(test_zero_copy),
		cmocka_unit_test(test_refusals),    cmocka_unit_test(test_peer_per_stream),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
