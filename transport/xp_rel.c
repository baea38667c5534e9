// SPDX-License-Identifier: Apache-2.0
/* The reliable stream of xp_rel.h: a send buffer and its scoreboard of frames in flight (SACK loss
 * recovery as RFC 6675, NewReno's congestion window, RFC 6298 timers), and a receive buffer that
 * holds out-of-order bytes in place until the hole before them fills. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "xp_rel.h"

struct seg {
	uint64_t seq;
	uint64_t sent_us;
	uint32_t len; /* payload bytes; 0 for the FIN, which counts as one */
	bool fin, sacked, lost, retrans, in_pipe;
};

struct xp_rel {
	struct xp_rel_cfg cfg;
	/* sending: offset o of the stream is at sbuf[o % sndbuf] while unacknowledged */
	uint8_t *sbuf;
	uint64_t snd_una, snd_nxt, snd_end; /* oldest unacknowledged, next new, end written */
	bool hold;	   /* xp_rel_hold(): acknowledged bytes stay until released */
	uint64_t snd_keep; /* with hold, the oldest byte kept (at most snd_una) */
	bool shut, fin_sent, fin_acked;
	struct seg *segs; /* frames in flight, oldest first, a ring */
	uint32_t seg_cap, seg_head, nsegs;
	uint32_t nlost; /* lost, not selectively acknowledged, not yet sent again */
	uint64_t pn;
	uint64_t cwnd, ssthresh, pipe, ca_acked;
	uint64_t peer_right; /* ack + window last heard: no new byte at or past it */
	uint64_t last_ack;
	bool in_recovery; /* fast recovery: the window is held */
	uint64_t recover; /* the last cut's snd_nxt: its losses do not cut again */
	bool have_rtt;
	uint64_t srtt, rttvar, rto, rto_at, min_rtt;
	/* RACK-TLP (RFC 8985): the latest-sent frame delivered, its end and RTT; the reordering
	 * timer; the tail loss probe's timer, and whether one is out */
	uint64_t rack_xmit, rack_end, rack_rtt, rack_at, pto_at;
	bool tlp_out;
	uint32_t backoff;
	bool probe_due;
	/* receiving: offset o is at rbuf[o % rcvbuf] from rd (next read) to rd + rcvbuf */
	uint8_t *rbuf;
	uint64_t rd, rcv_nxt, fin_at; /* rcv_nxt counts the FIN once it is in order */
	struct xp_rel_sack ranges[XP_REL_MAX_RANGES]; /* held past rcv_nxt, ascending */
	uint32_t nranges;
	uint64_t last_arrival; /* an offset inside the latest out-of-order range */
	uint32_t unacked;
	bool ack_now;
	uint64_t ack_at, adv_right;
	struct xp_rel_stats st;
};

#define NONE UINT64_MAX

int xp_rel_parse(const uint8_t *buf, size_t len, struct xp_rel_hdr *h, const char **why)
{
	size_t need;

	memset(h, 0, sizeof(*h));
	if (len < XP_REL_HDR) {
		*why = "shorter than a header";
		return -EBADMSG;
	}
	if (buf[0] != XP_REL_VERSION) {
		*why = "unknown version";
		return -EBADMSG;
	}
	h->flags = buf[1];
	h->len = vm_get_be16(buf + 2);
	h->stream = vm_get_be32(buf + 4);
	h->pn = vm_get_be64(buf + 8);
	h->seq = vm_get_be64(buf + 16);
	h->ack = vm_get_be64(buf + 24);
	h->window = vm_get_be32(buf + 32);
	h->nsack = buf[36];
	if (h->flags & ~XP_REL_F_ALL) {
		*why = "unknown flag";
		return -EBADMSG;
	}
	if (buf[37] || vm_get_be16(buf + 38)) {
		*why = "reserved bits set";
		return -EBADMSG;
	}
	if (h->nsack > XP_REL_MAX_SACK) {
		*why = "too many SACK blocks";
		return -EBADMSG;
	}
	need = XP_REL_HDR + (size_t)h->nsack * XP_REL_SACK_SIZE + h->len;
	if (len != need) {
		*why = "length does not match the header";
		return -EBADMSG;
	}
	if (h->len && !(h->flags & XP_REL_F_DATA)) {
		*why = "payload without the data flag";
		return -EBADMSG;
	}
	if ((h->flags & XP_REL_F_FIN) && (h->len || !(h->flags & XP_REL_F_DATA))) {
		*why = "a FIN with payload or without the data flag";
		return -EBADMSG;
	}
	if ((h->flags & XP_REL_F_DATA) && !(h->flags & XP_REL_F_FIN) && !h->len) {
		*why = "a data frame without payload";
		return -EBADMSG;
	}
	if (h->seq > UINT64_MAX / 2 || h->ack > UINT64_MAX / 2) {
		*why = "offset out of range";
		return -EBADMSG;
	}
	for (unsigned int i = 0; i < h->nsack; i++) {
		const uint8_t *p = buf + XP_REL_HDR + i * XP_REL_SACK_SIZE;

		h->sack[i].start = vm_get_be64(p);
		h->sack[i].end = vm_get_be64(p + 8);
		if (h->sack[i].start <= h->ack || h->sack[i].end <= h->sack[i].start ||
		    h->sack[i].end > UINT64_MAX / 2) {
			*why = "a SACK block that is empty, inverted or at or before ack";
			return -EBADMSG;
		}
	}
	h->payload = buf + XP_REL_HDR + (size_t)h->nsack * XP_REL_SACK_SIZE;
	return 0;
}

size_t xp_rel_put_hdr(const struct xp_rel_hdr *h, uint8_t *buf)
{
	buf[0] = XP_REL_VERSION;
	buf[1] = h->flags;
	vm_put_be16(buf + 2, h->len);
	vm_put_be32(buf + 4, h->stream);
	vm_put_be64(buf + 8, h->pn);
	vm_put_be64(buf + 16, h->seq);
	vm_put_be64(buf + 24, h->ack);
	vm_put_be32(buf + 32, h->window);
	buf[36] = h->nsack;
	buf[37] = 0;
	vm_put_be16(buf + 38, 0);
	for (unsigned int i = 0; i < h->nsack; i++) {
		vm_put_be64(buf + XP_REL_HDR + i * XP_REL_SACK_SIZE, h->sack[i].start);
		vm_put_be64(buf + XP_REL_HDR + i * XP_REL_SACK_SIZE + 8, h->sack[i].end);
	}
	return XP_REL_HDR + (size_t)h->nsack * XP_REL_SACK_SIZE;
}

int xp_rel_peek(const uint8_t *buf, size_t len, uint64_t *pn, size_t *hdr_len)
{
	if (len < XP_REL_HDR)
		return -EBADMSG;
	*hdr_len = XP_REL_HDR + (size_t)buf[36] * XP_REL_SACK_SIZE;
	*pn = vm_get_be64(buf + 8);
	return *hdr_len <= len ? 0 : -EBADMSG;
}

int xp_rel_new(const struct xp_rel_cfg *cfg, uint64_t now_us, struct xp_rel **ret)
{
	struct xp_rel *r;

	if (!cfg->mss || cfg->mss > 65535 || cfg->sndbuf < cfg->mss || cfg->rcvbuf < cfg->mss)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->cfg = *cfg;
	if (!r->cfg.min_rto_us)
		r->cfg.min_rto_us = XP_REL_MIN_RTO_US;
	if (!r->cfg.ack_delay_us)
		r->cfg.ack_delay_us = XP_REL_ACK_DELAY_US;
	/* Frames shorter than mss only come from short writes; twice the full ones bounds them. */
	r->seg_cap = 2 * (cfg->sndbuf / cfg->mss) + 8;
	r->sbuf = malloc(cfg->sndbuf);
	r->rbuf = malloc(cfg->rcvbuf);
	r->segs = calloc(r->seg_cap, sizeof(*r->segs));
	if (!r->sbuf || !r->rbuf || !r->segs)
		goto fail;
	r->cwnd = 10ull * cfg->mss; /* RFC 6928's initial window */
	r->ssthresh = UINT64_MAX / 4;
	r->rto = XP_REL_INITIAL_RTO_US;
	r->rto_at = NONE;
	r->rack_at = NONE;
	r->pto_at = NONE;
	r->min_rtt = NONE;
	r->ack_at = NONE;
	r->fin_at = NONE;
	/* Until the peer says otherwise, what the handshake said it holds (else one frame). */
	r->peer_right = cfg->peer_rcvbuf ? cfg->peer_rcvbuf : cfg->mss;
	r->adv_right = cfg->rcvbuf;
	(void)now_us;
	*ret = r;
	return 0;
fail:
	xp_rel_free(r);
	return -ENOMEM;
}

void xp_rel_free(struct xp_rel *r)
{
	if (!r)
		return;
	free(r->sbuf);
	free(r->rbuf);
	free(r->segs);
	free(r);
}

static struct seg *seg_at(const struct xp_rel *r, uint32_t i)
{
	return &r->segs[(r->seg_head + i) % r->seg_cap];
}

static uint64_t seg_size(const struct seg *s)
{
	return s->fin ? 1 : s->len;
}

/* Copies len bytes between a ring of size cap at offset off and flat memory. */
static void ring_copy(uint8_t *ring, uint64_t cap, uint64_t off, void *flat, size_t len, bool in)
{
	size_t at = off % cap, first = len < cap - at ? len : cap - at;

	if (in) {
		memcpy(ring + at, flat, first);
		memcpy(ring, (uint8_t *)flat + first, len - first);
	} else {
		memcpy(flat, ring + at, first);
		memcpy((uint8_t *)flat + first, ring, len - first);
	}
}

/* The oldest byte the send buffer still holds. */
static uint64_t snd_base(const struct xp_rel *r)
{
	return r->hold ? r->snd_keep : r->snd_una;
}

size_t xp_rel_write(struct xp_rel *r, const void *buf, size_t len)
{
	uint64_t room = r->cfg.sndbuf - (r->snd_end - snd_base(r));

	if (r->shut)
		return 0;
	if (len > room)
		len = room;
	ring_copy(r->sbuf, r->cfg.sndbuf, r->snd_end, (void *)buf, len, true);
	r->snd_end += len;
	return len;
}

/* The bytes of a ring of size cap from offset off, len of them, as up to two spans. */
static size_t ring_spans(uint8_t *ring, uint64_t cap, uint64_t off, size_t len, struct iovec iov[2])
{
	size_t at = off % cap, first = len < cap - at ? len : cap - at;

	iov[0] = (struct iovec){ ring + at, first };
	iov[1] = (struct iovec){ ring, len - first };
	return len;
}

size_t xp_rel_write_space(struct xp_rel *r, struct iovec iov[2])
{
	uint64_t room = r->shut ? 0 : r->cfg.sndbuf - (r->snd_end - snd_base(r));

	return ring_spans(r->sbuf, r->cfg.sndbuf, r->snd_end, room, iov);
}

void xp_rel_write_commit(struct xp_rel *r, size_t n)
{
	r->snd_end += n;
}

size_t xp_rel_unacked(struct xp_rel *r, struct iovec iov[2])
{
	return ring_spans(r->sbuf, r->cfg.sndbuf, r->snd_una, (size_t)(r->snd_end - r->snd_una),
			  iov);
}

void xp_rel_hold(struct xp_rel *r)
{
	if (!r->hold)
		r->snd_keep = r->snd_una;
	r->hold = true;
}

uint64_t xp_rel_acked(const struct xp_rel *r)
{
	return r->snd_una;
}

size_t xp_rel_kept(struct xp_rel *r, uint64_t *from, struct iovec iov[2])
{
	uint64_t base = snd_base(r);

	*from = base;
	return ring_spans(r->sbuf, r->cfg.sndbuf, base, (size_t)(r->snd_end - base), iov);
}

void xp_rel_release(struct xp_rel *r, uint64_t upto)
{
	if (upto > r->snd_una)
		upto = r->snd_una;
	if (upto > r->snd_end)
		upto = r->snd_end; /* the FIN's one byte is no byte of the buffer */
	if (r->hold && upto > r->snd_keep)
		r->snd_keep = upto;
}

void xp_rel_shutdown(struct xp_rel *r)
{
	r->shut = true;
}

bool xp_rel_send_done(const struct xp_rel *r)
{
	return r->fin_acked;
}

bool xp_rel_awaiting_ack(const struct xp_rel *r)
{
	return r->nsegs > 0;
}

bool xp_rel_waiting(const struct xp_rel *r)
{
	return r->snd_una < r->snd_end || (r->shut && !r->fin_acked);
}

/* In-order bytes end at the FIN, which rcv_nxt counts once it is in order. */
static uint64_t data_end(const struct xp_rel *r)
{
	return r->fin_at != NONE && r->rcv_nxt > r->fin_at ? r->fin_at : r->rcv_nxt;
}

static uint64_t window(const struct xp_rel *r)
{
	uint64_t right = r->rd + r->cfg.rcvbuf;

	return right > r->rcv_nxt ? right - r->rcv_nxt : 0;
}

size_t xp_rel_read(struct xp_rel *r, void *buf, size_t len)
{
	uint64_t avail = data_end(r) - r->rd;

	if (len > avail)
		len = avail;
	ring_copy(r->rbuf, r->cfg.rcvbuf, r->rd, buf, len, false);
	xp_rel_read_commit(r, len);
	return len;
}

size_t xp_rel_read_space(struct xp_rel *r, struct iovec iov[2])
{
	return ring_spans(r->rbuf, r->cfg.rcvbuf, r->rd, data_end(r) - r->rd, iov);
}

void xp_rel_read_commit(struct xp_rel *r, size_t n)
{
	uint64_t before = window(r);

	r->rd += n;
	r->st.bytes_delivered += n;
	/* A window that opened from under a frame, or by half the buffer, is told at once. */
	if (n && ((before < r->cfg.mss && window(r) >= r->cfg.mss) ||
		  r->rd + r->cfg.rcvbuf >= r->adv_right + r->cfg.rcvbuf / 2))
		r->ack_now = true;
}

bool xp_rel_eof(const struct xp_rel *r)
{
	return r->fin_at != NONE && r->rcv_nxt > r->fin_at && r->rd == r->fin_at;
}

/* The tail loss probe's timer: two RTTs and the peer's ack delay after the last frame sent. */
static void arm_pto(struct xp_rel *r, uint64_t now_us)
{
	r->pto_at = NONE;
	if (r->nsegs && r->have_rtt && !r->tlp_out)
		r->pto_at = now_us + 2 * r->srtt + r->cfg.ack_delay_us;
}

static void arm_rto(struct xp_rel *r, uint64_t now_us)
{
	uint64_t t = r->rto << (r->backoff < 16 ? r->backoff : 16);

	r->rto_at = now_us + (t < XP_REL_MAX_RTO_US ? t : XP_REL_MAX_RTO_US);
}

static void rtt_sample(struct xp_rel *r, uint64_t rtt)
{
	uint64_t var;

	if (rtt < r->min_rtt)
		r->min_rtt = rtt;
	if (!r->have_rtt) {
		r->srtt = rtt;
		r->rttvar = rtt / 2;
		r->have_rtt = true;
	} else {
		uint64_t d = r->srtt > rtt ? r->srtt - rtt : rtt - r->srtt;

		r->rttvar = (3 * r->rttvar + d) / 4;
		r->srtt = (7 * r->srtt + rtt) / 8;
	}
	var = 4 * r->rttvar > 1 ? 4 * r->rttvar : 1;
	r->rto = r->srtt + var;
	if (r->rto < r->cfg.min_rto_us)
		r->rto = r->cfg.min_rto_us;
	if (r->rto > XP_REL_MAX_RTO_US)
		r->rto = XP_REL_MAX_RTO_US;
}

/* Takes a frame out of the pipe (acknowledged, or counted lost). */
static void leave_pipe(struct xp_rel *r, struct seg *s)
{
	if (s->in_pipe) {
		r->pipe -= seg_size(s);
		s->in_pipe = false;
	}
}

static void enter_recovery(struct xp_rel *r)
{
	uint64_t half = r->cwnd / 2, floor = 2ull * r->cfg.mss;

	r->ssthresh = half > floor ? half : floor;
	r->cwnd = r->ssthresh;
	r->in_recovery = true;
	r->recover = r->snd_nxt + (r->fin_sent ? 1 : 0);
	r->ca_acked = 0;
}

/* A frame was delivered (acknowledged or held): RACK's newest delivered send time. A frame sent
 * again less than an RTT ago was delivered by its first copy: it says nothing. */
static void rack_delivered(struct xp_rel *r, const struct seg *s, uint64_t now_us)
{
	uint64_t end = s->seq + seg_size(s);

	if (s->retrans && r->min_rtt != NONE && now_us - s->sent_us < r->min_rtt)
		return;
	if (s->sent_us > r->rack_xmit || (s->sent_us == r->rack_xmit && end > r->rack_end)) {
		r->rack_xmit = s->sent_us;
		r->rack_end = end;
		r->rack_rtt = now_us - s->sent_us;
	}
}

static void cut_once(struct xp_rel *r)
{
	/* Once per window: losses among what was in flight at the last cut are that cut's. */
	if (!r->in_recovery && r->snd_una >= r->recover) {
		enter_recovery(r);
		r->st.fast_recoveries++;
	}
}

static void mark_lost(struct xp_rel *r, struct seg *s)
{
	s->lost = true;
	leave_pipe(r, s);
	r->nlost++;
}

/* RACK: a frame sent before one that was delivered is lost once an RTT and a quarter of the
 * smallest RTT (the reordering window) passed since it was sent; until then, a timer. */
static void rack_detect(struct xp_rel *r, uint64_t now_us)
{
	uint64_t reo = r->min_rtt == NONE ? 0 : r->min_rtt / 4;
	bool newly = false;

	r->rack_at = NONE;
	if (!r->rack_xmit)
		return;
	for (uint32_t i = 0; i < r->nsegs; i++) {
		struct seg *s = seg_at(r, i);
		uint64_t due;

		if (s->sacked || (s->lost && !s->in_pipe))
			continue;
		if (s->sent_us > r->rack_xmit ||
		    (s->sent_us == r->rack_xmit && s->seq + seg_size(s) >= r->rack_end))
			continue; /* sent after the newest delivered frame */
		due = s->sent_us + r->rack_rtt + reo;
		if (due <= now_us) {
			mark_lost(r, s);
			newly = true;
		} else if (due < r->rack_at) {
			r->rack_at = due;
		}
	}
	if (newly)
		cut_once(r);
}

/* RFC 6675's IsLost: a frame with DupThresh frames' worth of bytes selectively acknowledged
 * above it. Walks down from the newest frame, summing what was acknowledged. */
static void detect_loss(struct xp_rel *r)
{
	uint64_t above = 0, thresh = (uint64_t)XP_REL_DUPTHRESH * r->cfg.mss;
	bool newly = false;

	for (uint32_t i = r->nsegs; i-- > 0;) {
		struct seg *s = seg_at(r, i);

		if (s->sacked) {
			above += seg_size(s);
			continue;
		}
		if (above < thresh || s->lost || s->retrans)
			continue;
		mark_lost(r, s);
		newly = true;
	}
	if (newly)
		cut_once(r);
}

/* Marks the frames inside [start, end) as held by the receiver; true if any was new. */
static bool take_sack(struct xp_rel *r, uint64_t now_us, uint64_t start, uint64_t end)
{
	uint32_t lo = 0, hi = r->nsegs;
	bool any = false;

	while (lo < hi) { /* the first frame at or after start */
		uint32_t mid = lo + (hi - lo) / 2;

		if (seg_at(r, mid)->seq < start)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (uint32_t i = lo; i < r->nsegs; i++) {
		struct seg *s = seg_at(r, i);

		if (s->seq + seg_size(s) > end)
			break;
		if (s->sacked)
			continue;
		if (s->lost && !s->in_pipe)
			r->nlost--;
		leave_pipe(r, s);
		s->sacked = true;
		rack_delivered(r, s, now_us);
		any = true;
	}
	return any;
}

static void grow_cwnd(struct xp_rel *r, uint64_t acked)
{
	if (r->in_recovery || !acked)
		return;
	if (r->cwnd < r->ssthresh) {
		/* Slow start, at most two frames per acknowledgement (RFC 3465). */
		r->cwnd += acked < 2ull * r->cfg.mss ? acked : 2ull * r->cfg.mss;
		return;
	}
	r->ca_acked += acked;
	if (r->ca_acked >= r->cwnd) {
		r->ca_acked -= r->cwnd;
		r->cwnd += r->cfg.mss;
	}
}

/* A window larger than anything that can be in flight only says the sender was not limited by
 * it (RFC 7661): held at twice the send buffer. */
static void clamp_cwnd(struct xp_rel *r)
{
	if (r->cwnd > 2ull * r->cfg.sndbuf)
		r->cwnd = 2ull * r->cfg.sndbuf;
}

static int take_ack(struct xp_rel *r, uint64_t now_us, const struct xp_rel_hdr *h)
{
	uint64_t max_ack = r->snd_nxt + (r->fin_sent ? 1 : 0), acked = 0, rtt = NONE;
	bool sacked = false;

	if (h->ack > max_ack || h->ack < r->last_ack) {
		r->st.bad_acks += h->ack > max_ack;
		return h->ack > max_ack ? -EPROTO : 0; /* late or reordered: nothing new */
	}
	while (r->nsegs) {
		struct seg *s = seg_at(r, 0);

		if (s->seq + seg_size(s) > h->ack)
			break;
		if (s->lost && !s->in_pipe && !s->sacked)
			r->nlost--;
		leave_pipe(r, s);
		/* Karn: never from a frame sent twice, or counted lost (this acknowledgement may
		 * have come from an earlier frame's retransmission), or held before. */
		if (!s->retrans && !s->sacked && !s->lost)
			rtt = now_us - s->sent_us;
		if (!s->sacked)
			rack_delivered(r, s, now_us);
		if (s->fin)
			r->fin_acked = true;
		acked += seg_size(s);
		r->seg_head = (r->seg_head + 1) % r->seg_cap;
		r->nsegs--;
	}
	if (h->ack > r->last_ack) {
		r->last_ack = h->ack;
		r->backoff = 0;
	}
	r->snd_una = r->nsegs ? seg_at(r, 0)->seq : r->snd_nxt;
	r->peer_right = h->ack + h->window;
	for (unsigned int i = 0; i < h->nsack; i++)
		if (h->sack[i].end <= max_ack)
			sacked |= take_sack(r, now_us, h->sack[i].start, h->sack[i].end);
	if (rtt != NONE)
		rtt_sample(r, rtt);
	grow_cwnd(r, acked);
	clamp_cwnd(r);
	if (r->in_recovery && r->snd_una >= r->recover)
		r->in_recovery = false;
	if (sacked)
		detect_loss(r);
	if (sacked || acked) {
		rack_detect(r, now_us);
		r->tlp_out = false;
		arm_pto(r, now_us);
	}
	if (!r->nsegs)
		r->rto_at = NONE; /* next_frame() arms the probe timer if data waits */
	else if (acked)
		arm_rto(r, now_us);
	return 0;
}

/* Inserts [start, end) into the out-of-order ranges, merging; false when there is no room. */
static bool add_range(struct xp_rel *r, uint64_t start, uint64_t end)
{
	uint32_t i = 0, j;

	while (i < r->nranges && r->ranges[i].end < start)
		i++;
	j = i;
	while (j < r->nranges && r->ranges[j].start <= end) {
		start = start < r->ranges[j].start ? start : r->ranges[j].start;
		end = end > r->ranges[j].end ? end : r->ranges[j].end;
		j++;
	}
	if (j == i) { /* touches none: a new range at i */
		if (r->nranges == XP_REL_MAX_RANGES)
			return false;
		memmove(&r->ranges[i + 1], &r->ranges[i], (r->nranges - i) * sizeof(r->ranges[0]));
		r->nranges++;
	} else if (j > i + 1) { /* merged several into the one at i */
		memmove(&r->ranges[i + 1], &r->ranges[j], (r->nranges - j) * sizeof(r->ranges[0]));
		r->nranges -= j - i - 1;
	}
	r->ranges[i].start = start;
	r->ranges[i].end = end;
	return true;
}

/* rcv_nxt moved: swallow the ranges it reached, and the FIN once everything before it is in. */
static void advance(struct xp_rel *r)
{
	while (r->nranges && r->ranges[0].start <= r->rcv_nxt) {
		if (r->ranges[0].end > r->rcv_nxt)
			r->rcv_nxt = r->ranges[0].end;
		memmove(&r->ranges[0], &r->ranges[1], (r->nranges - 1) * sizeof(r->ranges[0]));
		r->nranges--;
	}
	if (r->rcv_nxt == r->fin_at)
		r->rcv_nxt++;
}

static void take_fin(struct xp_rel *r, const struct xp_rel_hdr *h)
{
	uint64_t held = r->nranges ? r->ranges[r->nranges - 1].end : r->rcv_nxt;

	r->ack_now = true;
	if (r->fin_at != NONE) {
		r->st.duplicate_frames++;
		return;
	}
	/* A FIN before bytes that arrived would cut the stream: refused, as bytes past it are. */
	if (h->seq < held || h->seq < data_end(r)) {
		r->st.bad_frames++;
		return;
	}
	r->fin_at = h->seq;
	advance(r);
}

static void take_data(struct xp_rel *r, uint64_t now_us, const struct xp_rel_hdr *h)
{
	uint64_t right = r->rd + r->cfg.rcvbuf, start = h->seq, end = h->seq + h->len;
	bool in_order;

	if (end <= r->rcv_nxt) {
		r->st.duplicate_frames++;
		r->ack_now = true;
		return;
	}
	if (r->fin_at != NONE && end > r->fin_at) {
		r->st.beyond_window_frames++; /* past the FIN: not this stream's bytes */
		r->ack_now = true;
		return;
	}
	if (start >= right) {
		r->st.beyond_window_frames++;
		r->ack_now = true;
		return;
	}
	if (start < r->rcv_nxt)
		start = r->rcv_nxt;
	if (end > right)
		end = right;
	for (uint32_t i = 0; i < r->nranges; i++) {
		if (r->ranges[i].start <= start && end <= r->ranges[i].end) {
			r->st.duplicate_frames++;
			r->ack_now = true;
			return;
		}
	}
	in_order = start == r->rcv_nxt;
	if (!in_order && !add_range(r, start, end)) {
		r->st.dropped_no_range++;
		r->ack_now = true;
		return;
	}
	ring_copy(r->rbuf, r->cfg.rcvbuf, start, (void *)(h->payload + (start - h->seq)),
		  end - start, true);
	if (in_order) {
		bool filled = r->nranges && r->ranges[0].start <= end;

		r->rcv_nxt = end;
		advance(r);
		/* Every second frame, a hole filled, or after the delay. */
		if (filled || ++r->unacked >= 2)
			r->ack_now = true;
		else if (r->ack_at == NONE)
			r->ack_at = now_us + r->cfg.ack_delay_us;
	} else {
		r->st.out_of_order_frames++;
		r->last_arrival = start;
		r->ack_now = true;
	}
}

int xp_rel_input(struct xp_rel *r, uint64_t now_us, const struct xp_rel_hdr *h)
{
	int ret;

	r->st.frames_received++;
	ret = take_ack(r, now_us, h);
	if (h->flags & XP_REL_F_FIN)
		take_fin(r, h);
	else if (h->flags & XP_REL_F_DATA)
		take_data(r, now_us, h);
	if (h->flags & XP_REL_F_PROBE)
		r->ack_now = true;
	return ret;
}

/* The RTO fired: everything in flight and not held by the receiver is lost. */
static void on_timeout(struct xp_rel *r, uint64_t now_us)
{
	uint64_t flight = r->snd_nxt - r->snd_una, floor = 2ull * r->cfg.mss;

	r->rto_at = NONE;
	if (!r->nsegs) {
		/* Nothing in flight: the peer's window is shut and data waits. Probe it. */
		if (r->snd_end > r->snd_nxt) {
			r->probe_due = true;
			r->backoff++;
			arm_rto(r, now_us);
		}
		return;
	}
	r->st.timeouts++;
	r->pto_at = NONE;
	r->rack_at = NONE;
	r->ssthresh = flight / 2 > floor ? flight / 2 : floor;
	r->cwnd = r->cfg.mss;
	r->ca_acked = 0;
	for (uint32_t i = 0; i < r->nsegs; i++) {
		struct seg *s = seg_at(r, i);

		if (s->sacked || (s->lost && !s->in_pipe))
			continue;
		leave_pipe(r, s);
		s->lost = true;
		r->nlost++;
	}
	/* Slow start from one frame (RFC 5681); no fast recovery for this window's losses. */
	r->in_recovery = false;
	r->recover = r->snd_nxt + (r->fin_sent ? 1 : 0);
	r->backoff++;
	arm_rto(r, now_us);
}

static size_t build(struct xp_rel *r, uint8_t *buf, uint8_t flags, uint64_t seq, uint32_t len)
{
	struct xp_rel_hdr h = { 0 };
	size_t off;
	uint32_t n = 0;

	h.flags = flags;
	h.len = (uint16_t)len;
	h.stream = r->cfg.stream;
	h.pn = r->cfg.pn_space ? (*r->cfg.pn_space)++ : r->pn++;
	h.seq = seq;
	h.ack = r->rcv_nxt;
	h.window = (uint32_t)window(r);
	/* The range the latest arrival joined first (RFC 2018), then the rest, lowest first. */
	for (uint32_t i = 0; i < r->nranges && n < XP_REL_MAX_SACK; i++)
		if (r->ranges[i].start <= r->last_arrival && r->last_arrival < r->ranges[i].end)
			h.sack[n++] = r->ranges[i];
	for (uint32_t i = 0; i < r->nranges && n < XP_REL_MAX_SACK; i++)
		if (!(r->ranges[i].start <= r->last_arrival && r->last_arrival < r->ranges[i].end))
			h.sack[n++] = r->ranges[i];
	h.nsack = (uint8_t)n;
	off = xp_rel_put_hdr(&h, buf);
	if (len)
		ring_copy(r->sbuf, r->cfg.sndbuf, seq, buf + off, len, false);
	r->ack_now = false;
	r->ack_at = NONE;
	r->unacked = 0;
	r->adv_right = r->rcv_nxt + h.window;
	r->st.frames_sent++;
	return off + len;
}

static size_t send_seg(struct xp_rel *r, uint64_t now_us, struct seg *s, uint8_t *buf)
{
	uint8_t flags = XP_REL_F_DATA | (s->fin ? XP_REL_F_FIN : 0);

	s->sent_us = now_us;
	s->in_pipe = true;
	r->pipe += seg_size(s);
	r->st.bytes_sent += s->len;
	if (r->rto_at == NONE)
		arm_rto(r, now_us);
	arm_pto(r, now_us);
	return build(r, buf, flags, s->seq, s->len);
}

static bool cwnd_allows(const struct xp_rel *r, uint64_t size)
{
	return !r->pipe || r->pipe + size <= r->cwnd;
}

/* Sends s again: out of the lost count and the pipe, if it was in either. */
static size_t resend(struct xp_rel *r, uint64_t now_us, struct seg *s, uint8_t *buf)
{
	if (s->lost && !s->in_pipe)
		r->nlost--;
	leave_pipe(r, s);
	s->retrans = true;
	r->st.retransmitted_frames++;
	r->st.retransmitted_bytes += s->len;
	return send_seg(r, now_us, s, buf);
}

static size_t resend_lost(struct xp_rel *r, uint64_t now_us, uint8_t *buf)
{
	for (uint32_t i = 0; i < r->nsegs; i++) {
		struct seg *s = seg_at(r, i);

		if (!s->lost || s->sacked || s->in_pipe)
			continue;
		if (!cwnd_allows(r, seg_size(s)))
			return 0;
		return resend(r, now_us, s, buf);
	}
	return 0;
}

static size_t send_new(struct xp_rel *r, uint64_t now_us, uint8_t *buf)
{
	uint64_t len = r->snd_end - r->snd_nxt;
	struct seg *s;

	if (r->nsegs == r->seg_cap)
		return 0;
	if (len) {
		if (r->peer_right <= r->snd_nxt)
			return 0;
		if (len > r->cfg.mss)
			len = r->cfg.mss;
		if (len > r->peer_right - r->snd_nxt)
			len = r->peer_right - r->snd_nxt;
	} else if (!r->shut || r->fin_sent) {
		return 0;
	}
	if (!cwnd_allows(r, len ? len : 1))
		return 0;
	s = seg_at(r, r->nsegs++);
	memset(s, 0, sizeof(*s));
	s->seq = r->snd_nxt;
	s->len = (uint32_t)len;
	s->fin = !len;
	if (s->fin)
		r->fin_sent = true;
	else
		r->snd_nxt += len;
	return send_seg(r, now_us, s, buf);
}

/* Nothing heard for two RTTs with frames in flight: send the newest again (or new data, if the
 * windows allow), whatever the congestion window says, so that a loss at the tail of a burst
 * is found by the acknowledgement it draws instead of by the timeout. */
static size_t tail_probe(struct xp_rel *r, uint64_t now_us, uint8_t *buf)
{
	size_t n = 0;

	r->pto_at = NONE;
	if (!r->nsegs || r->tlp_out)
		return 0;
	r->tlp_out = true;
	r->st.tail_probes++;
	if (r->snd_end > r->snd_nxt && r->peer_right > r->snd_nxt) {
		uint64_t cwnd = r->cwnd;

		r->cwnd = NONE / 4; /* this one frame only */
		n = send_new(r, now_us, buf);
		r->cwnd = cwnd;
	}
	for (uint32_t i = r->nsegs; !n && i-- > 0;)
		if (!seg_at(r, i)->sacked)
			n = resend(r, now_us, seg_at(r, i), buf);
	arm_rto(r, now_us);
	return n;
}

size_t xp_rel_next_frame(struct xp_rel *r, uint64_t now_us, uint8_t *buf, size_t cap)
{
	size_t n;

	if (cap < XP_REL_MAX_HDR + r->cfg.mss)
		return 0;
	if (r->rto_at <= now_us)
		on_timeout(r, now_us);
	if (r->rack_at <= now_us)
		rack_detect(r, now_us);
	if (r->pto_at <= now_us && (n = tail_probe(r, now_us, buf)))
		return n;
	n = r->nlost ? resend_lost(r, now_us, buf) : 0;
	if (!n)
		n = send_new(r, now_us, buf);
	if (n)
		return n;
	if (r->probe_due) {
		r->probe_due = false;
		r->st.probes_sent++;
		return build(r, buf, XP_REL_F_PROBE, r->snd_nxt, 0);
	}
	if (r->ack_now || r->ack_at <= now_us)
		return build(r, buf, 0, r->snd_nxt, 0);
	/* Data waits on a shut window with nothing in flight: the probe timer. */
	if (!r->nsegs && r->rto_at == NONE && r->snd_end > r->snd_nxt)
		arm_rto(r, now_us);
	return 0;
}

uint64_t xp_rel_deadline(const struct xp_rel *r)
{
	uint64_t t = r->rto_at;

	if (r->ack_now || r->probe_due)
		return 0;
	t = r->ack_at < t ? r->ack_at : t;
	t = r->rack_at < t ? r->rack_at : t;
	return r->pto_at < t ? r->pto_at : t;
}

void xp_rel_stats(const struct xp_rel *r, struct xp_rel_stats *st)
{
	*st = r->st;
	st->cwnd = r->cwnd;
	st->ssthresh = r->ssthresh;
	st->pipe = r->pipe;
	st->srtt_us = r->srtt;
	st->rto_us = r->rto;
	st->peer_window = r->peer_right > r->snd_nxt ? r->peer_right - r->snd_nxt : 0;
	st->held = (r->nranges ? r->ranges[r->nranges - 1].end : data_end(r)) - r->rd;
}
