// SPDX-License-Identifier: Apache-2.0
/* A resumable link moved to another process at a takeover (xp_link_quiesce): here it quiesces
 * until nothing is held or unacknowledged, then holds still for its description; there (or here,
 * from the DPDK node hop) it starts suspended from those offsets, digest states and kept bytes. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "xp_pool_priv.h"

/* Nothing held, nothing unacknowledged, nothing taken and not delivered. */
static bool still(const struct pool_link *l)
{
	const struct xp_pump *o = &l->p[0], *in = &l->p[1];

	return o->held == 0 && !xp_frame_unsent(o) && !o->fout.len && !o->fout.left &&
	       o->acked == o->sent && in->held == 0;
}

static void quiesce_report(struct xp_worker *w, struct pool_link *l, int err)
{
	l->res.end = XP_END_QUIESCED;
	l->res.err = err;
	xp_outbox_post(w, l->idx | OUTBOX_QUIESCED);
}

void xp_frame_quiesce(struct xp_worker *w, struct pool_link *l, bool on)
{
	struct xp_pump *o = &l->p[0], *in = &l->p[1];

	if (!l->live || l->closing)
		return;
	if (!on) {
		bool held = l->quiescing || l->freezing || l->quiesced;

		/* a freezing link's cancelled polls come back as ordinary completions */
		l->quiescing = l->freezing = l->quiesced = false;
		for (int d = 0; held && d < 2; d++)
			if (!l->p[d].done && !l->p[d].armed)
				ready_push(w, &l->p[d]);
		return;
	}
	if (l->quiescing || l->freezing || l->quiesced)
		return;
	/* a direction at its end, or a link without its node hop, stays where it is */
	if (!framed(l) || l->suspending || l->suspended || l->hop_closing || o->eof || o->done ||
	    o->peer_gone || in->eof || in->done || in->fin.end || in->fin.discard) {
		quiesce_report(w, l, -EBUSY);
		return;
	}
	l->quiescing = true;
	/* direction 0 sends what it holds and asks for the ACK of it all (it parks); one waiting
	 * on a quiet local socket asks now, or what it sent last might never be acknowledged */
	for (int d = 0; d < 2; d++)
		if (!l->p[d].armed)
			ready_push(w, &l->p[d]);
	if (o->armed && o->acked < o->sent)
		xp_frame_park(w, o);
	xp_frame_quiesce_check(w, l);
}

void xp_frame_quiesce_check(struct xp_worker *w, struct pool_link *l)
{
	if (!l->quiescing || l->freezing || l->closing || l->suspending || l->suspended ||
	    !still(l))
		return;
	l->quiescing = false;
	l->freezing = true;
	if (xp_link_cancel_polls(w, l))
		xp_frame_frozen(w, l);
}

void xp_frame_frozen(struct xp_worker *w, struct pool_link *l)
{
	struct xp_pump *o = &l->p[0], *in = &l->p[1];

	xp_ready_unlink(w, l);
	l->freezing = false;
	l->quiesced = true;
	l->res.have = xp_frame_in_done(in);
	l->res.kept_from = l->res.kept_to = o->sent;
	for (int d = 0; d < 2; d++)
		l->res.bytes[d] = atomic_load_explicit(&l->p[d].bytes, memory_order_relaxed);
	atomic_store_explicit(&l->pub_have, l->res.have, memory_order_relaxed);
	atomic_store_explicit(&l->pub_acked, o->acked, memory_order_relaxed);
	atomic_store_explicit(&l->pub_sent, o->sent, memory_order_relaxed);
	quiesce_report(w, l, 0);
}

/*
 * A link from the DPDK node hop: what the peer may still lack becomes what direction 0 kept of
 * what it sent, in the pipe chain or behind the ring's head, to be sent again from the peer's
 * offset at the resumption. -ENOBUFS where it holds more than this link may keep.
 */
static int adopt_kept(struct xp_pump *o, const uint8_t *kept, size_t len)
{
	struct keep_chain *kc = &o->kc;

	if (len > o->keep_cap)
		return -ENOBUFS;
	if (o->ring) {
		memcpy(o->buf, kept, len);
		o->head = len % o->ring;
		return 0;
	}
	while (len > 0) {
		ssize_t k = write(kc->fd[kc->tail][1], kept, len);

		if (k > 0) {
			kc->cnt[kc->tail] += (size_t)k;
			kept += k;
			len -= (size_t)k;
			continue;
		}
		if (k < 0 && errno != EAGAIN)
			return -errno;
		/* this pipe is full: the next, which is empty at the start */
		if ((kc->tail + 1) % kc->n == kc->head)
			return -ENOBUFS;
		kc->tail = (kc->tail + 1) % kc->n;
	}
	return 0;
}

int xp_frame_adopt(struct xp_worker *w, struct pool_link *l)
{
	const struct xp_link_state *st = l->opts.adopt;
	struct xp_pump *o = &l->p[0], *in = &l->p[1];

	for (int d = 0; d < 2; d++) {
		struct xp_pump *p = &l->p[d];
		int r;

		/* digests on both sides or on neither: a half-digested stream cannot be checked */
		if (!p->dg != !st->dg_len[d])
			return -EPROTO;
		r = p->dg ? vm_digest_load(p->dg, st->dg[d], st->dg_len[d]) : 0;
		if (r < 0)
			return r;
	}
	if (st->kept_len > st->sent)
		return -EINVAL;
	if (st->kept_len) {
		int r = adopt_kept(o, st->kept, st->kept_len);

		if (r < 0)
			return r;
	}
	o->sent = o->teed = st->sent;
	o->acked = st->sent - st->kept_len;
	atomic_store_explicit(&o->bytes, st->sent, memory_order_relaxed);
	atomic_store_explicit(&in->bytes, st->have, memory_order_relaxed);
	l->suspended = true;
	l->res.end = XP_END_SUSPENDED;
	l->res.err = 0;
	l->res.asked = true;
	l->res.have = st->have;
	l->res.kept_from = o->acked;
	l->res.kept_to = st->sent;
	l->res.bytes[0] = st->sent;
	l->res.bytes[1] = st->have;
	atomic_store_explicit(&l->pub_have, st->have, memory_order_relaxed);
	atomic_store_explicit(&l->pub_acked, o->acked, memory_order_relaxed);
	atomic_store_explicit(&l->pub_sent, st->sent, memory_order_relaxed);
	xp_frame_publish_kept(l);
	xp_outbox_post(w, l->idx | OUTBOX_SUSPENDED);
	return 0;
}
