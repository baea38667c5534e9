// SPDX-License-Identifier: Apache-2.0
/* The simulated link of rel_sim.h: an event loop over simulated microseconds. Each direction is a
 * queue served at the link's rate; frames wait in a heap ordered by arrival time. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rel_sim.h"

struct frame {
	uint64_t at, order;
	int to; /* 0: a, 1: b */
	size_t len;
	uint8_t *buf;
};

struct sim {
	const struct rel_sim_cfg *cfg;
	struct rel_sim_result *res;
	struct xp_rel *ep[2];
	struct frame *heap;
	size_t n, cap, frame_size;
	uint64_t order, link_free[2];
	uint32_t rng;
	size_t fate_at;
	uint64_t written[2], read[2]; /* per sender: written by it, read from it by the peer */
	bool shut[2];
};

static uint32_t rnd(struct sim *s)
{
	s->rng ^= s->rng << 13;
	s->rng ^= s->rng >> 17;
	s->rng ^= s->rng << 5;
	return s->rng;
}

/* The byte at offset off of what side `from` sends. */
static uint8_t pattern(int from, uint64_t off)
{
	uint64_t x = (off + 1) * 0x9e3779b97f4a7c15ull + (uint64_t)from * 0x632be59bd9b4e5ull;

	return (uint8_t)(x >> 56 ^ x >> 23);
}

static bool earlier(const struct frame *a, const struct frame *b)
{
	return a->at < b->at || (a->at == b->at && a->order < b->order);
}

static void heap_swap(struct frame *a, struct frame *b)
{
	struct frame t = *a;

	*a = *b;
	*b = t;
}

static void push(struct sim *s, int to, uint64_t at, const uint8_t *buf, size_t len)
{
	size_t i;

	if (s->n == s->cap) {
		s->res->dropped++; /* the link's memory is full: a drop like any other */
		return;
	}
	i = s->n++;
	s->heap[i].at = at;
	s->heap[i].order = s->order++;
	s->heap[i].to = to;
	s->heap[i].len = len;
	memcpy(s->heap[i].buf, buf, len);
	while (i && earlier(&s->heap[i], &s->heap[(i - 1) / 2])) {
		heap_swap(&s->heap[i], &s->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
}

static void pop(struct sim *s)
{
	size_t i = 0;

	heap_swap(&s->heap[0], &s->heap[--s->n]);
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;

		if (l < s->n && earlier(&s->heap[l], &s->heap[m]))
			m = l;
		if (r < s->n && earlier(&s->heap[r], &s->heap[m]))
			m = r;
		if (m == i)
			break;
		heap_swap(&s->heap[i], &s->heap[m]);
		i = m;
	}
}

/* A frame from side `from` enters the link at now: queued, dropped, duplicated or delayed. */
static void transmit(struct sim *s, int from, uint64_t now, const uint8_t *buf, size_t len)
{
	const struct rel_sim_cfg *c = s->cfg;
	uint64_t start = s->link_free[from] > now ? s->link_free[from] : now;
	uint64_t ser = c->bytes_per_ms ? len * 1000 / c->bytes_per_ms : 0, at;
	bool drop, dup, late;

	s->res->frames++;
	if (c->queue_us && start - now > c->queue_us) {
		s->res->dropped++;
		return;
	}
	s->link_free[from] = start + ser;
	at = start + ser + c->delay_us;
	if (c->fate) {
		uint8_t f = s->fate_at < c->fate_len ? c->fate[s->fate_at++] : 0;

		drop = (f & 0x7) == 1;
		dup = (f & 0x7) == 2;
		late = (f & 0x7) == 3;
		at += late ? (uint64_t)(f >> 3) * (c->delay_us + 1) / 8 : 0;
	} else {
		drop = rnd(s) % 100 < c->loss_pct;
		dup = rnd(s) % 100 < c->dup_pct;
		late = rnd(s) % 100 < c->reorder_pct;
		at += late ? rnd(s) % (4 * c->delay_us + 1) : 0;
	}
	if (drop) {
		s->res->dropped++;
		return;
	}
	push(s, !from, at, buf, len);
	if (dup)
		push(s, !from, at + 1 + c->delay_us / 2, buf, len);
}

static uint64_t total(const struct sim *s, int from)
{
	return from ? s->cfg->bytes_ba : s->cfg->bytes_ab;
}

/* The applications: write what fits, shut down at the end, read (at the reader's pace). */
static void apps(struct sim *s, uint64_t now, uint64_t *allowance)
{
	uint8_t buf[4096];

	for (int i = 0; i < 2; i++) {
		while (s->written[i] < total(s, i)) {
			uint64_t want = total(s, i) - s->written[i];
			size_t n = want < sizeof(buf) ? want : sizeof(buf), put;

			for (size_t k = 0; k < n; k++)
				buf[k] = pattern(i, s->written[i] + k);
			put = xp_rel_write(s->ep[i], buf, n);
			s->written[i] += put;
			if (put < n)
				break;
		}
		if (s->written[i] == total(s, i) && !s->shut[i]) {
			xp_rel_shutdown(s->ep[i]);
			s->shut[i] = true;
		}
	}
	for (int i = 0; i < 2; i++) { /* side i reads what !i sent */
		for (;;) {
			size_t want = sizeof(buf), n;

			if (s->cfg->read_per_ms && allowance[i] < want)
				want = allowance[i];
			if (!want)
				break;
			n = xp_rel_read(s->ep[i], buf, want);
			if (!n)
				break;
			for (size_t k = 0; k < n; k++)
				if (buf[k] != pattern(!i, s->read[!i] + k))
					s->res->intact = false;
			s->read[!i] += n;
			if (s->cfg->read_per_ms)
				allowance[i] -= n;
		}
	}
	(void)now;
}

static bool finished(const struct sim *s)
{
	return xp_rel_send_done(s->ep[0]) && xp_rel_send_done(s->ep[1]) && xp_rel_eof(s->ep[0]) &&
	       xp_rel_eof(s->ep[1]);
}

int rel_sim_run(const struct rel_sim_cfg *cfg, struct rel_sim_result *res)
{
	struct xp_rel_cfg rc = { .mss = cfg->mss, .sndbuf = cfg->sndbuf, .rcvbuf = cfg->rcvbuf };
	struct sim s = { .cfg = cfg, .res = res, .rng = cfg->seed * 2 + 1 };
	uint64_t now = 0, allowance[2] = { 0, 0 }, next_tick = 0;
	uint8_t *out;
	int r;

	memset(res, 0, sizeof(*res));
	res->intact = true;
	s.frame_size = XP_REL_MAX_HDR + cfg->mss;
	s.cap = 4096;
	s.heap = calloc(s.cap, sizeof(*s.heap));
	out = malloc(s.frame_size);
	r = s.heap && out ? 0 : -ENOMEM;
	for (size_t i = 0; !r && i < s.cap; i++) {
		s.heap[i].buf = malloc(s.frame_size);
		r = s.heap[i].buf ? 0 : -ENOMEM;
	}
	for (int i = 0; !r && i < 2; i++) {
		rc.stream = 7 + i;
		r = xp_rel_new(&rc, 0, &s.ep[i]);
	}
	if (r)
		goto out;
	while (now <= cfg->limit_us) {
		uint64_t next = UINT64_MAX;

		if (cfg->read_per_ms && now >= next_tick) {
			for (int i = 0; i < 2; i++)
				allowance[i] += cfg->read_per_ms;
			next_tick = now + 1000;
		}
		apps(&s, now, allowance);
		for (int i = 0; i < 2; i++) {
			struct xp_rel_stats st;

			xp_rel_stats(s.ep[i], &st);
			if (st.held > res->max_ahead)
				res->max_ahead = st.held;
		}
		if (finished(&s)) {
			res->done = true;
			res->end_us = now;
			break;
		}
		for (int i = 0; i < 2; i++) {
			size_t n;

			while ((n = xp_rel_next_frame(s.ep[i], now, out, s.frame_size)))
				transmit(&s, i, now, out, n);
		}
		/* The next event: an arrival, a stream's timer, the reader's next millisecond. */
		if (s.n)
			next = s.heap[0].at;
		for (int i = 0; i < 2; i++) {
			uint64_t d = xp_rel_deadline(s.ep[i]);

			if (d < next)
				next = d;
		}
		if (cfg->read_per_ms && next_tick < next)
			next = next_tick;
		if (next == UINT64_MAX)
			break; /* nothing will ever happen again: stuck */
		now = next > now ? next : now;
		while (s.n && s.heap[0].at <= now) {
			struct xp_rel_hdr h;
			const char *why;

			if (xp_rel_parse(s.heap[0].buf, s.heap[0].len, &h, &why))
				res->bad_parse++;
			else
				xp_rel_input(s.ep[s.heap[0].to], now, &h);
			pop(&s);
		}
	}
	xp_rel_stats(s.ep[0], &res->a);
	xp_rel_stats(s.ep[1], &res->b);
	res->intact = res->intact &&
		      (!res->done || (s.read[0] == cfg->bytes_ab && s.read[1] == cfg->bytes_ba));
out:
	for (int i = 0; i < 2; i++)
		xp_rel_free(s.ep[i]);
	for (size_t i = 0; s.heap && i < s.cap; i++)
		free(s.heap[i].buf);
	free(s.heap);
	free(out);
	return r;
}
